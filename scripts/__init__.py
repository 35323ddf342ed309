"""Maintenance and benchmark scripts (run them as files: ``python scripts/NAME.py``).

A package only so that tests and benchmarks import the generators the one ordinary way
(``from scripts.make_tiny_models import make_tiny_models``) with the checkout's root on ``sys.path``
(pytest puts it there; the benchmarks insert it). Not part of the installed distribution.
"""
