#!/usr/bin/env bash
# Sets up everything the test suite needs on a fresh machine, then runs it.
#   bash scripts/test.sh [pytest args]
# Creates .venv (Python >= 3.10), installs dasktune with its test extras and the CPU
# build of torch, installs Debian's chromium for the dashboard's browser test when
# running as root, and runs pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
# CPU torch first, so nothing later pulls a multi-GB CUDA build.
.venv/bin/python -m pip install -q "torch==2.13.0" || echo "warning: torch not installed; its tests skip"
.venv/bin/python -m pip install -q -e ".[test,s3]"

if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) \
      || echo "warning: could not install chromium"
  fi
fi

export PYTHONDONTWRITEBYTECODE=1
set +e
.venv/bin/python -m pytest -q -ra --durations=15 "$@"
rc=$?
set -e
if [ "$rc" = "5" ]; then
  echo "no tests were collected" >&2
  exit 1
fi
exit "$rc"
