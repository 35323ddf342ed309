#!/usr/bin/env bash
# Run the whole test suite on a fresh machine: sets up .venv (scripts/setup.sh --test), then pytest.
# Extra arguments go to pytest, e.g. scripts/test.sh -k runtime -x
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
# The typed seam between the agent and the runtime (files and settings in pyproject.toml [tool.mypy]).
.venv/bin/python -m mypy
exec .venv/bin/python -m pytest "$@"
