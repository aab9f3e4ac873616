#!/usr/bin/env bash
# The minimum-versions job: a fresh venv with the LOWEST versions pyproject.toml allows for
# dasktune's core dependencies (read from pyproject.toml: each "name>=X" becomes "name==X"),
# then a small fast subset of the tests against it.
#   bash scripts/min_versions.sh            # venv in ${MIN_VENV:-/tmp/dasktune-min-venv}
# Transitive dependencies resolve to what pip picks for those pins. The test tools (pytest,
# pytest-timeout, scikit-learn for the examples) come at their latest versions.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
VENV=${MIN_VENV:-/tmp/dasktune-min-venv}
TESTS=(tests/test_space.py tests/test_search.py tests/test_schedulers.py
       tests/test_optuna_search.py tests/test_dashboard_state.py tests/test_facade.py)

rm -rf "$VENV"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip packaging
pins=$("$VENV/bin/python" - "$ROOT/pyproject.toml" <<'PY'
import sys, tomllib
from packaging.requirements import Requirement
with open(sys.argv[1], "rb") as f:
    deps = tomllib.load(f)["project"]["dependencies"]
for dep in deps:
    req = Requirement(dep)
    lows = [s.version for s in req.specifier if s.operator in (">=", "==", "~=")]
    if not lows:
        sys.exit(f"{dep}: no lower bound in pyproject.toml; give it one")
    print(f"{req.name}=={lows[0]}")
PY
)
echo "minimum pins:" $pins
# shellcheck disable=SC2086
"$VENV/bin/python" -m pip install -q $pins pytest pytest-timeout
# Confirm pip kept every pin (a conflict would have failed the install instead).
# shellcheck disable=SC2086
"$VENV/bin/python" - $pins <<'PY'
import sys
from importlib.metadata import version
from packaging.version import Version
pins = [p.split("==") for p in sys.argv[1:]]
bad = [f"{name}: {version(name)}" for name, want in pins if Version(version(name)) != Version(want)]
if bad:
    sys.exit(f"not installed at the minimum: {bad}")
PY
cd "$ROOT"
PYTHONPATH="$ROOT" "$VENV/bin/python" -m pytest -q -p no:cacheprovider "${TESTS[@]}" "$@"
