"""Ray Tune's example scripts, rewritten for dasktune, run as a user runs them.

Each ``examples/*.py`` runs with ``--smoke-test`` in its own process (cwd: the repo root),
against one real ``dask scheduler`` + 2 ``dask worker`` processes shared by this module
(``--address``), plus one run on the embedded cluster. A test checks the exit status and
what the script printed about its run.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import DaskProcesses, free_port

ROOT = Path(__file__).resolve().parent.parent
SCRIPT_TIMEOUT = 90  # seconds per smoke run, start-up included

pytestmark = pytest.mark.slow


def _needs_torch() -> pytest.MarkDecorator:
    """Skip without torch, except in CI where its absence is a failure."""
    missing = importlib.util.find_spec("torch") is None
    return pytest.mark.skipif(missing and os.environ.get("CI") != "true",
                              reason="torch is not installed (pip install torch)")


@pytest.fixture(scope="module")
def dask_address(tmp_path_factory) -> Iterator[str]:
    """A scheduler and two one-thread workers as separate processes, killed by PID."""
    port = free_port()
    logdir = tmp_path_factory.mktemp("dask-logs")
    env = {**os.environ, "DASK_DISTRIBUTED__SCHEDULER__WORK_STEALING": "False"}
    sched = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
         "--port", str(port), "--dashboard-address", "127.0.0.1:0"],
        env=env, stdout=open(logdir / "scheduler.log", "wb"), stderr=subprocess.STDOUT,
        start_new_session=True)
    procs = DaskProcesses(address=f"tcp://127.0.0.1:{port}", scheduler=sched, env=env,
                          logdir=str(logdir))
    try:
        for _ in range(2):
            procs.add_worker(nthreads=1)
        procs.wait_workers(2)
        yield procs.address
    finally:
        procs.kill_all()


def run_example(script: str, storage: Path, address: str | None) -> str:
    """Run ``examples/<script>.py --smoke-test``; return its stdout, failing on exit != 0."""
    cmd = [sys.executable, str(ROOT / "examples" / f"{script}.py"), "--smoke-test",
           "--storage-path", str(storage)]
    if address:
        cmd += ["--address", address]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                          timeout=SCRIPT_TIMEOUT)
    assert proc.returncode == 0, (
        f"{script} exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}"
        f"\n--- stderr\n{proc.stderr[-4000:]}")
    return proc.stdout


def printed(out: str, label: str) -> str:
    """The rest of the line that starts with ``label``."""
    match = re.search(rf"^{re.escape(label)}\s*(.*)$", out, re.MULTILINE)
    assert match, f"no line starting with {label!r} in:\n{out[-3000:]}"
    return match.group(1)


def printed_value(out: str, label: str) -> object:
    return ast.literal_eval(printed(out, label))


BEST = "Best hyperparameters found were:"


def check_basic(out: str, storage: Path) -> None:
    best = printed_value(out, BEST)
    assert best["activation"] in ("relu", "tanh") and 0 <= best["width"] <= 20


def check_async_hyperband(out: str, storage: Path) -> None:
    iters = printed_value(out, "Iterations per trial:")
    assert len(iters) == 6 and max(iters) == 12
    # Seeded: the third trial is worse at rung 2 than both trials before it (two slots).
    assert min(iters) < 12, "ASHA stopped no trial early"
    assert set(printed_value(out, BEST)) >= {"width", "height"}


def check_hyperband(out: str, storage: Path) -> None:
    assert max(printed_value(out, "Iterations per trial:")) <= 10
    assert printed_value(out, "Trials paused and resumed from a checkpoint:") >= 1
    assert "checkpoint_" in printed(out, "Best checkpoint:")


def check_optuna(out: str, storage: Path) -> None:
    assert printed_value(out, BEST)["activation"] in ("relu", "tanh")


def check_define_by_run(out: str, storage: Path) -> None:
    best = printed_value(out, BEST)
    assert best["steps"] == 8  # the constant the define-by-run function returned
    assert ("mult" in best) == (best["activation"] == "relu")  # the conditional branch


def check_multiobjective(out: str, storage: Path) -> None:
    for objective in ("loss", "gain"):
        best = printed_value(out, f"Best hyperparameters for {objective} found were:")
        assert set(best) >= {"width", "height", "activation"}


def check_pbt_class(out: str, storage: Path) -> None:
    lrs = printed_value(out, "Final lr per trial:")
    assert len(lrs) == 4 and any(lr != 0.0001 for lr in lrs), "PBT explored no lr"
    assert "lr" in printed_value(out, BEST)


def check_pbt_function(out: str, storage: Path) -> None:
    """The printed best is the trial whose last result (in its result.json) scores
    highest, with that trial's final config; every trial ran to the stop at 16."""
    import json

    last = []
    for path in sorted((storage / "pbt_function_api_example").glob("*/result.json")):
        lines = path.read_text().splitlines()
        last.append(json.loads(lines[-1]))
    assert len(last) == 4 and all(r["training_iteration"] == 16 for r in last), last
    top = max(last, key=lambda r: r["mean_accuracy"])
    assert float(printed(out, "Best mean_accuracy:")) == round(top["mean_accuracy"], 3)
    assert printed_value(out, BEST) == top["config"]


def check_custom_logger(out: str, storage: Path) -> None:
    assert out.count("[custom] started") == 2 and out.count("[custom] ended") == 2
    summaries = list(storage.rglob("custom_summary.json"))
    assert len(summaries) == 2
    assert '"num_results": 3' in summaries[0].read_text()
    assert printed_value(out, BEST)["lr"] == 0.01


def check_callback_checkpointing(out: str, storage: Path) -> None:
    counts = printed_value(out, "Checkpoints committed per trial:")
    assert len(counts) == 2 and all(1 <= c <= 8 for c in counts)
    state = printed_value(out, "Best checkpoint state:")
    assert set(state) == {"x", "best"}


def check_digits(out: str, storage: Path) -> None:
    assert set(printed_value(out, BEST)) == {"lr", "momentum"}
    assert float(printed(out, "Best validation accuracy:")) > 0.5
    assert "checkpoint_" in printed(out, "Best checkpoint:")


HYPERBAND_PAUSE_BUG = (
    "dasktune bug: session.TrialSession.report calls self._should_stop() without "
    "had_checkpoint, so a function trainable never honours stop(checkpoint=True): "
    "HyperBand/PBT PAUSE never pauses it and it runs on to its stop criterion")
PBT_RETENTION_BUG = (
    "dasktune bug (timing-dependent, so not strict): an Exploit keeps the donor's checkpoint "
    "path; while the cloned trial waits for a worker the donor commits more checkpoints and "
    "controller._enforce_retention (num_to_keep) deletes that one, so load_checkpoint fails "
    "with FileNotFoundError")

EXAMPLES: list = [
    pytest.param("tune_basic_example", check_basic, id="tune_basic_example"),
    pytest.param("async_hyperband_example", check_async_hyperband,
                 id="async_hyperband_example"),
    pytest.param("hyperband_function_example", check_hyperband,
                 id="hyperband_function_example"),
    pytest.param("optuna_example", check_optuna, id="optuna_example"),
    pytest.param("optuna_define_by_run_example", check_define_by_run,
                 id="optuna_define_by_run_example"),
    pytest.param("optuna_multiobjective_example", check_multiobjective,
                 id="optuna_multiobjective_example"),
    pytest.param("pbt_example", check_pbt_class, id="pbt_example"),
    pytest.param("pbt_function", check_pbt_function, id="pbt_function"),
    pytest.param("custom_logger_callback", check_custom_logger, id="custom_logger_callback"),
    pytest.param("callback_checkpointing", check_callback_checkpointing,
                 id="callback_checkpointing"),
    pytest.param("digits_pytorch_trainable", check_digits, id="digits_pytorch_trainable",
                 marks=_needs_torch()),
]


@pytest.mark.timeout(SCRIPT_TIMEOUT + 30)
@pytest.mark.parametrize(("script", "check"), EXAMPLES)
def test_example_on_dask_cluster(script: str, check: Callable[[str, Path], None],
                                 dask_address: str, tmp_path: Path) -> None:
    storage = tmp_path / "results"
    check(run_example(script, storage, dask_address), storage)


@pytest.mark.timeout(SCRIPT_TIMEOUT + 30)
def test_example_on_embedded_cluster(tmp_path: Path) -> None:
    """No ``--address``: the script starts (and closes) its own local cluster."""
    storage = tmp_path / "results"
    out = run_example("tune_basic_example", storage, None)
    check_basic(out, storage)
    assert (storage / "tune_basic_example" / "experiment_state.json").exists()
