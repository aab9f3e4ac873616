"""Ray Tune's own example scripts, changed only in their import lines, run on dasktune.

The issue's bar: a Ray Tune user changes ``from ray import tune`` to ``import dasktune
as tune`` (and ``import ray`` to dasktune, for ``ray.init``) and the script runs. The
scripts come from Ray's wheel (``scripts/test.sh`` unpacks them into ``.ray-examples/``
without installing Ray; ``DASKTUNE_RAY_EXAMPLES`` points here) or from an installed Ray.
Each runs with ``--smoke-test`` in its own process on the embedded cluster, as a user runs
it; a test checks the exit status, that nothing was printed as a traceback, and what the
script printed about its best trial.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT_TIMEOUT = 240  # seconds; the optuna ones sleep 0.1 s per step by design
PARALLEL = 3  # scripts at once: most of their time is sleep or start-up

# Ray's example -> a line it prints once its experiment has run (the list:
# basic random + grid, async hyperband, hyperband with function checkpointing, optuna
# plain / define-by-run with ConcurrencyLimiter and AsyncHyperBand / multi-objective, PBT
# with a class and with a function trainable, a custom LoggerCallback, callback-driven
# checkpointing; and the two other checkpointing and HyperBand examples).
SCRIPTS = {
    "tune_basic_example": "Best hyperparameters found were:",
    "async_hyperband_example": "Best hyperparameters found:",
    "hyperband_example": "Best hyperparameters found were:",
    "hyperband_function_example": "Best hyperparameters found were:",
    "optuna_example": "Best hyperparameters found were:",
    "optuna_define_by_run_example": "Best hyperparameters found were:",
    "optuna_multiobjective_example": "Best hyperparameters for gain found were:",
    "pbt_example": "Best hyperparameters found were:",
    "pbt_function": "Best hyperparameters found were:",
    "logging_example": "Best hyperparameters:",
    "custom_checkpointing_with_callback": "Best hyperparameters:",
    "custom_func_checkpointing": "Best checkpoint:",
    "pb2_example": "Best hyperparameters found were:",
    # the integrations: XGBoost and LightGBM callbacks, MLflow logging
    "xgboost_example": "Best model total accuracy:",
    "lightgbm_example": "Best hyperparameters found were:",
    # prints nothing of its own with --smoke-test: its two experiments' last status lines
    "mlflow_example": "5 trials (5 TERMINATED)",
    # the library searchers (and BOHB's scheduler)
    "hyperopt_conditional_search_space_example": "Best hyperparameters found were:",
    "ax_example": "Best hyperparameters found were:",
    "bayesopt_example": "Best hyperparameters found were:",
    "bohb_example": "Best hyperparameters found were:",
    "nevergrad_example": "Best hyperparameters found were:",
    # ResourceChangingScheduler over ASHA, with ray.init(num_cpus=8). It has no smoke-test
    # mode (Ray's CI runs it whole, as a "large" test): 8 trials of 2,000-tree XGBoost
    # rounds, 60-70 rounds in all, 2-3 CPU-seconds each.
    "xgboost_dynamic_resources_example": "Best model total accuracy:",
}

# Beyond that line, what shows the script did what it is for (a regular expression over
# its output): a trial restored from its checkpoint with more CPUs, which it read from
# get_trial_resources() (the script prints them as XGBoost's nthread).
SCRIPT_SHOWS = {
    "xgboost_dynamic_resources_example": r"nthreads: [2-8] xgb_model: <xgboost",
}

# The longest first, so that they overlap the others (seconds alone on 2 idle cores).
SLOW_FIRST = ("xgboost_dynamic_resources_example", "ax_example")
# ax_example fits a GP in the driver for each of its last 5 trials (about 20 s each on 2
# idle cores): 155-200 s alone, 320 s alone beside two CPU hogs, over 540 s beside them
# and the dynamic-resources example it starts with. The bound is for a hang, not a pace.
SCRIPT_TIMEOUTS = {"xgboost_dynamic_resources_example": 600, "ax_example": 900}

# What a script's environment needs beyond HOME: Ray's MLflow example tracks into a
# folder, which MLflow 3 refuses unless this says the file store is wanted.
SCRIPT_ENV = {
    "mlflow_example": {"MLFLOW_ALLOW_FILE_STORE": "true"},
}

# Scripts that need an optional library (a dasktune extra): skipped where it is missing.
REQUIRES = {
    "hyperopt_conditional_search_space_example": "hyperopt",
    "ax_example": "ax",
    "bayesopt_example": "bayes_opt",
    "bohb_example": "hpbandster",
    "nevergrad_example": "nevergrad",
    "xgboost_example": "xgboost",
    "lightgbm_example": "lightgbm",
    "mlflow_example": "mlflow",
    "xgboost_dynamic_resources_example": "xgboost",
}

# The import change, and only that: each rule rewrites whole import lines.
IMPORT_CHANGE = [
    (re.compile(r"^from ray import tune$"), "import dasktune as tune"),
    (re.compile(r"^import ray$"), "import dasktune as ray"),  # ray.init / ray.shutdown
    (re.compile(r"^from ray\.tune import "), "from dasktune import "),
    # Another of Ray's examples (pb2_example uses pbt_function's trainable): its import-changed
    # copy, written next to the script, as a user copies both.
    (re.compile(r"^from ray\.tune\.examples\.(\w+) import "), r"from \1 import "),
    # Indented too: xgboost_dynamic_resources_example imports under ``if TYPE_CHECKING:``.
    (re.compile(r"^(\s*)from ray\.tune\.([\w.]+) import "), r"\1from dasktune.\2 import "),
    # Ray's ray.air.integrations.X (MLflow, W&B, Keras): dasktune.air.integrations.X
    (re.compile(r"^(\s*)from ray\.air\.integrations\.(\w+) import "),
     r"\1from dasktune.air.integrations.\2 import "),
]


def ray_examples() -> Path | None:
    env = os.environ.get("DASKTUNE_RAY_EXAMPLES")
    if env:
        return Path(env)
    spec = importlib.util.find_spec("ray")  # an installed Ray, found without importing it
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations))) / "tune" / "examples"
    return None


EXAMPLES = ray_examples()
if EXAMPLES is None or not EXAMPLES.is_dir():
    if os.environ.get("CI") == "true":
        raise RuntimeError("Ray's example scripts are missing: scripts/test.sh unpacks them "
                           "into .ray-examples/ and sets DASKTUNE_RAY_EXAMPLES")
    pytestmark = [pytestmark, pytest.mark.skip(
        reason="Ray's example scripts are not here (bash scripts/test.sh fetches them, or "
               "set DASKTUNE_RAY_EXAMPLES to a ray/tune/examples folder)")]


def import_change(source: str) -> str:
    """``source`` with its Ray imports pointed at dasktune; fails if more is needed."""
    out = []
    for line in source.splitlines(keepends=True):
        text = line.rstrip("\n")
        for pattern, repl in IMPORT_CHANGE:
            text = pattern.sub(repl, text)
        assert not re.match(r"\s*(from|import)\s+ray\b", text), \
            f"needs more than the import change: {line!r}"
        out.append(text + ("\n" if line.endswith("\n") else ""))
    return "".join(out)


def run_script(name: str, folder: Path) -> subprocess.CompletedProcess[str]:
    folder = folder / name  # its own folder: the examples it imports are copied next to it
    folder.mkdir()
    script = folder / f"{name}.py"
    source = (EXAMPLES / f"{name}.py").read_text()
    script.write_text(import_change(source))
    for other in re.findall(r"^from ray\.tune\.examples\.(\w+) import ", source, re.M):
        (folder / f"{other}.py").write_text(import_change((EXAMPLES / f"{other}.py").read_text()))
    home = folder / f"{name}-home"  # Ray's default storage path is under ~: keep it here
    home.mkdir()
    # TMPDIR too: scripts that write under tempfile.gettempdir() (the MLflow example's
    # mlruns/) keep it in their own folder.
    env = {**os.environ, "HOME": str(home), "TMPDIR": str(home),
           "PYTHONDONTWRITEBYTECODE": "1", **SCRIPT_ENV.get(name, {})}
    env.pop("DASK_SCHEDULER_ADDRESS", None)  # the embedded cluster, as on a laptop
    return subprocess.run([sys.executable, str(script), "--smoke-test"], cwd=folder,
                          env=env, capture_output=True, text=True,
                          timeout=SCRIPT_TIMEOUTS.get(name, SCRIPT_TIMEOUT))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Iterator[dict[str, Future]]:
    """Every script, a few at a time from the start; each test waits for its own."""
    folder = tmp_path_factory.mktemp("ray-examples")
    with ThreadPoolExecutor(PARALLEL) as pool:
        order = sorted(SCRIPTS, key=lambda name: name not in SLOW_FIRST)
        futures = {name: pool.submit(run_script, name, folder) for name in order
                   if name not in REQUIRES or importlib.util.find_spec(REQUIRES[name])}
        yield futures
        for f in futures.values():
            f.cancel()


@pytest.mark.parametrize("name", [
    # pytest-timeout's 300 s is the bound otherwise: the script's own must fit inside it
    pytest.param(name, marks=pytest.mark.timeout(SCRIPT_TIMEOUTS[name] + 60))
    if name in SCRIPT_TIMEOUTS else name for name in SCRIPTS])
def test_ray_example_runs_after_the_import_change(runs, name):
    if name in REQUIRES:
        pytest.importorskip(REQUIRES[name])
    proc = runs[name].result()
    report = f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, f"{name} exited {proc.returncode}\n{report}"
    assert "Traceback" not in proc.stdout + proc.stderr, report
    assert SCRIPTS[name] in proc.stdout, report
    if name in SCRIPT_SHOWS:
        assert re.search(SCRIPT_SHOWS[name], proc.stdout), report
