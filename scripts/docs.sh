#!/usr/bin/env bash
# Builds the documentation with warnings as errors (broken references, bad markup, a
# listed module whose import fails), from this checkout's dasktune.
#   bash scripts/docs.sh            # HTML in docs/_build/html
# Needs the docs extra: pip install -e ".[docs]".
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
rm -rf docs/_build docs/api
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m sphinx -W --keep-going -q -b html docs docs/_build/html
echo "docs built: docs/_build/html/index.html"
