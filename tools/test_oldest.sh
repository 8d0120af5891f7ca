#!/usr/bin/env bash
# The test suite on the oldest releases pyproject.toml admits (tools/oldest_dependencies.txt), in .venv-oldest, with
# the oldest Python it admits: `PYTHON=python3.10 tools/test_oldest.sh [pytest arguments]`. torch comes from PyPI,
# a CUDA build of several GB (the tests run on the CPU); uv resolves the pins with the test references in seconds,
# where pip backtracks for many minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.10}
VENV=.venv-oldest
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet uv
"$VENV/bin/python" -m uv pip install --python "$VENV/bin/python" --quiet -c tools/oldest_dependencies.txt -e ".[dev]"
"$VENV/bin/python" -m pytest -n 2 --dist loadfile "$@"
