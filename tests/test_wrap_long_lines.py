"""scripts/wrap_long_lines.py: long lines of every kind come back within 110 characters, the program the
same."""

from __future__ import annotations

import ast

from scripts.wrap_long_lines import LIMIT, too_long, wrap

WORDS = " ".join(f"word{i}" for i in range(30))
KWARGS = ", ".join(f"k{i}={i}" for i in range(20))
SOURCE = f'''"""Module docstring: {WORDS}
second line of the same paragraph."""


def f(alpha, beta):
    """One-line docstring: {WORDS}."""
    # a comment on its own line: {WORDS}
    x = compute(alpha, beta, {KWARGS})  # and a trailing comment here
    message = f"{{alpha}} is not {{beta}}: {WORDS}"
    return x if alpha and beta and x is not None and message and len(message) > 100000 else None and alpha
'''


def test_every_kind_of_long_line_is_wrapped_to_the_same_program():
    """Comments, docstrings, calls, f-strings and a bare ternary all end within the limit; the code's
    syntax tree is the same, the strings' values too (docstrings only rewrapped)."""
    assert too_long(SOURCE)
    new, left = wrap(SOURCE)
    assert left == [] and too_long(new) == [] and all(len(line) <= LIMIT for line in new.splitlines())
    f_old, f_new = (ast.parse(s).body[1] for s in (SOURCE, new))
    # after the docstring
    assert [ast.dump(n) for n in f_old.body[1:]] == [ast.dump(n) for n in f_new.body[1:]]
    assert ast.get_docstring(f_new).split() == ast.get_docstring(f_old).split()
    assert wrap(new) == (new, [])  # a second run changes nothing


def test_a_line_it_cannot_shorten_is_reported_not_mangled():
    """A long word in a string has no place to break: the line stays and its number comes back."""
    src = "x = 1\ny = '" + "a" * 130 + "'\n"
    assert wrap(src) == (src, [2])
