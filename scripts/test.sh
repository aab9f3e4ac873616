#!/usr/bin/env bash
# Sets up everything the test suite needs on a fresh machine, then runs it.
#   bash scripts/test.sh [pytest args]
# Creates .venv (Python >= 3.10), installs the CPU build of torch and dasktune with its
# test, docs, release and all extras (every optional library; HEBO without its numpy
# pin); as root, starts a local Slurm and a local Grid Engine and installs Debian's chromium for the dashboard's
# browser test; unpacks Ray Tune's example scripts (not Ray) for the test that runs
# them on dasktune, and runs pytest (with no arguments: the whole suite, the batch-system
# tests beside the rest).
set -euo pipefail
cd "$(dirname "$0")/.."

# A single-node Slurm and Grid Engine for the batch-system tests (root only; elsewhere
# those tests skip, and in CI they fail instead).
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  bash scripts/slurm-local.sh || echo "warning: could not start the local Slurm"
  bash scripts/sge-local.sh || echo "warning: could not start the local Grid Engine"
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
# CPU torch first, so nothing later pulls a multi-GB CUDA build.
.venv/bin/python -m pip install -q "torch==2.13.0" || echo "warning: torch not installed; its tests skip"
.venv/bin/python -m pip install -q -e ".[test,s3,docs,release,all]"
# HEBO's release pins numpy<1.25 but runs on numpy 2: it goes in without its pins, its
# other requirements beside it (pip's resolver would otherwise downgrade numpy and pandas).
.venv/bin/python -m pip install -q --no-deps "HEBO>=0.3.6" GPy paramz disjoint-set \
  && .venv/bin/python -m pip install -q catboost gpytorch pymoo \
  || echo "warning: HEBO not installed; its tests skip"

if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    # apt's and dpkg's progress ("Setting up ...", hundreds of lines) to /dev/null; their
    # warnings and errors go to stderr and stay visible.
    (apt-get update -qq >/dev/null \
      && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
      || echo "warning: could not install chromium"
  fi
fi

# Ray Tune's own example scripts, for tests/test_ray_examples.py: only those files are
# unpacked from Ray's wheel (Ray itself is not installed).
RAY_VERSION=2.60.0
RAY_EXAMPLES=.ray-examples/ray-$RAY_VERSION
if [ ! -d "$RAY_EXAMPLES/ray/tune/examples" ]; then
  wheels=$(mktemp -d)
  if .venv/bin/python -m pip download -q --no-deps "ray==$RAY_VERSION" -d "$wheels"; then
    .venv/bin/python - "$wheels" "$RAY_EXAMPLES" <<'PY'
import glob, os, sys, zipfile
wheel = glob.glob(os.path.join(sys.argv[1], "ray-*.whl"))[0]
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith("ray/tune/examples/") and name.count("/") == 3 \
                and name.endswith(".py"):
            z.extract(name, sys.argv[2])
PY
  else
    echo "warning: could not download ray==$RAY_VERSION; tests/test_ray_examples.py cannot run"
  fi
  rm -rf "$wheels"
fi
export DASKTUNE_RAY_EXAMPLES="$PWD/$RAY_EXAMPLES/ray/tune/examples"

export PYTHONDONTWRITEBYTECODE=1
# The whole suite (no arguments): the batch-system tests spend minutes waiting on their
# job queues' clocks (1-minute walltimes) with the CPU idle, so they run beside the rest
# in a second pytest, their output printed after the first's.
BATCH_TESTS=(tests/test_slurm.py tests/test_sge.py)
batch_pid=
if [ "$#" = 0 ]; then
  batch_dir=$(mktemp -d)
  .venv/bin/python -m pytest -q -ra -p no:cacheprovider --basetemp="$batch_dir/tmp" \
    "${BATCH_TESTS[@]}" > "$batch_dir/log" 2>&1 &
  batch_pid=$!
  set -- "${BATCH_TESTS[@]/#/--ignore=}"
fi
set +e
.venv/bin/python -m pytest -q -ra --durations=15 "$@"
rc=$?
if [ -n "$batch_pid" ]; then
  wait "$batch_pid"
  batch_rc=$?
  echo "== the batch-system tests (${BATCH_TESTS[*]}), run beside the others:"
  cat "$batch_dir/log"
  rm -rf "$batch_dir"
  # Either run's failure fails the suite; "nothing collected" (5) only if both say it.
  if [ "$batch_rc" != "5" ] && { [ "$rc" = "0" ] || [ "$rc" = "5" ]; }; then
    rc=$batch_rc
  fi
fi
set -e
if [ "$rc" = "5" ]; then
  echo "no tests were collected" >&2
  exit 1
fi
exit "$rc"
