#!/usr/bin/env bash
# Release readiness: build the sdist and the wheel, check them, install the wheel (not
# editable) into a fresh venv OUTSIDE the source tree, and run against that install:
# `dasktune --version` (must equal dasktune.__version__), `dasktune --help`, the quickstart
# (copied out of the tree), and the dashboard page tests (package data: dasktune.yaml; the
# page itself uses distributed's template). pip's cache keeps repeated runs quick.
#   bash scripts/release_check.sh           # work folder: ${RELEASE_WORK:-/tmp/dasktune-release}
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-$ROOT/.venv/bin/python}
WORK=${RELEASE_WORK:-/tmp/dasktune-release}
case "$WORK" in "$ROOT"*) echo "RELEASE_WORK must be outside the source tree" >&2; exit 2;; esac
rm -rf "$WORK" && mkdir -p "$WORK/dist" "$WORK/run/tests"

echo "== build"
# Without build isolation when this Python has the build backend (no download per run).
iso=--no-isolation
"$PY" -c 'import setuptools, sys; sys.exit(int(setuptools.__version__.split(".")[0]) < 77)' \
  2>/dev/null || iso=
"$PY" -m build $iso --outdir "$WORK/dist" "$ROOT" > "$WORK/build.log" 2>&1 \
  || { tail -40 "$WORK/build.log"; exit 1; }
"$PY" -m twine check --strict "$WORK"/dist/*
wheel=$(ls "$WORK"/dist/dasktune-*.whl)

echo "== package data in the wheel"
"$PY" - "$wheel" "$ROOT" <<'PY'
import pathlib, sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
root = pathlib.Path(sys.argv[2])
# Every file of the package that is not Python source is package data the wheel must carry.
data = [p.relative_to(root).as_posix() for p in (root / "dasktune").rglob("*")
        if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts]
missing = [n for n in data if n not in names]
if "dasktune/dasktune.yaml" not in data or missing:
    sys.exit(f"missing from the wheel: {missing or ['dasktune/dasktune.yaml']}")
print(f"{len(names)} files; package data in: {', '.join(data)}")
PY

echo "== install the wheel into a fresh venv"
python3 -m venv "$WORK/venv"
V="$WORK/venv/bin"
"$V/python" -m pip install -q --upgrade pip
"$V/python" -m pip install -q "$wheel" scikit-learn pytest pytest-timeout requests
if [ -x /usr/bin/chromium ]; then "$V/python" -m pip install -q playwright; fi

cd "$WORK/run"   # nothing of the source tree is importable from here
"$V/python" - "$ROOT" <<'PY'
import sys, dasktune
assert "site-packages" in dasktune.__file__ and not dasktune.__file__.startswith(sys.argv[1]), dasktune.__file__
print("dasktune", dasktune.__version__, "from", dasktune.__file__)
PY

echo "== the command"
want=$("$V/python" -c "import dasktune; print(dasktune.__version__)")
got=$("$V/dasktune" --version)
[ "$got" = "dasktune, version $want" ] || { echo "dasktune --version said: $got" >&2; exit 1; }
"$V/dasktune" --help > /dev/null
"$V/dasktune" ls --help > /dev/null

echo "== the quickstart"
cp "$ROOT/examples/quickstart.py" "$WORK/run/"
HOME="$WORK/run" "$V/python" quickstart.py --smoke-test 2>&1 | tail -3

echo "== the dashboard page tests"
cp "$ROOT"/tests/conftest.py "$ROOT"/tests/test_dashboard_static.py \
   "$ROOT"/tests/test_dashboard_browser.py "$WORK/run/tests/"
"$V/python" -m pytest -q -p no:cacheprovider --rootdir "$WORK/run" \
  tests/test_dashboard_static.py tests/test_dashboard_browser.py -k "static"
echo "release check passed: $(basename "$wheel")"
