"""The repository's ``models/`` folder, installed as the package ``edge_agent.models`` (see pyproject.toml).

It carries data only: ``catalog.json``, read by :func:`edge_agent.modelfiles.catalog.load_catalog`. No code
here.
"""
