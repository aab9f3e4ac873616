"""Lost, frozen and retiring workers (issue 4, tests 1-4), on real ``dask worker`` processes.

Each trainable keeps a side record in its trial folder: one ``attempts.jsonl`` line
per attempt (attempt number, pid, the checkpoint it restored, the first iteration it
runs) and one ``executed.jsonl`` line per iteration it executes. The tests wait on
those files ("trial X has executed iteration >= k"), never on sleeps, and assert the
numbers the issue promises against them and against ``result.json``.
"""

from __future__ import annotations

import asyncio
import glob
import json
import os
import random
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import DaskProcesses, committed_manifests, read_jsonl, wait_for

import dasktune as tune
from dasktune import runtime
from dasktune.trial import ERROR, TERMINATED

pytestmark = pytest.mark.slow


# ----------------------------------------------------------------------- records
def _append(trial_dir: str, name: str, record: dict[str, Any]) -> None:
    # One short write per line on O_APPEND: lines from concurrent writers never interleave.
    with open(os.path.join(trial_dir, name), "a") as f:
        f.write(json.dumps(record) + "\n")


def trial_dirs(exp_dir: str) -> list[str]:
    return sorted(d for d in glob.glob(os.path.join(exp_dir, "*")) if os.path.isdir(d))


def checkpointed(config: dict[str, Any]) -> None:
    """Counts to ``iters``, checkpointing every ``k`` iterations; records what it runs."""
    ctx = tune.get_context()
    trial_dir, attempt, pid = ctx.get_trial_dir(), ctx.get_attempt(), os.getpid()
    restored = 0
    ckpt = tune.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d, open(os.path.join(d, "state.json")) as f:
            restored = json.load(f)["i"]
    _append(trial_dir, "attempts.jsonl", {"attempt": attempt, "pid": pid, "t": time.time(),
                                          "restored": restored, "start": restored + 1})
    for i in range(restored + 1, config["iters"] + 1):
        time.sleep(config["sleep"])
        _append(trial_dir, "executed.jsonl", {"attempt": attempt, "pid": pid, "it": i,
                                              "t": time.time()})
        checkpoint = None
        tmp = None
        if i % config["k"] == 0:
            tmp = tempfile.mkdtemp(prefix="faults-ckpt-")
            with open(os.path.join(tmp, "state.json"), "w") as f:
                json.dump({"i": i}, f)
            checkpoint = tune.Checkpoint.from_directory(tmp)
        tune.report({"i": i, "attempt": attempt}, checkpoint=checkpoint)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
            _append(trial_dir, "committed.jsonl", {"attempt": attempt, "it": i})


class Counter(tune.Trainable):
    """The class API: checkpointable on demand (a graceful move loses nothing)."""

    def setup(self, config: dict[str, Any]) -> None:
        self.i = 0
        self.sleep = config["sleep"]
        ctx = tune.get_context()
        self.dir, self.attempt, self.pid = ctx.get_trial_dir(), ctx.get_attempt(), os.getpid()
        self.restored: int | None = None

    def step(self) -> dict[str, Any]:
        if self.restored is None:  # first step of this attempt: restore (if any) is done
            self.restored = self.i
            _append(self.dir, "attempts.jsonl", {"attempt": self.attempt, "pid": self.pid,
                                                 "restored": self.i, "start": self.i + 1})
        time.sleep(self.sleep)
        self.i += 1
        _append(self.dir, "executed.jsonl", {"attempt": self.attempt, "pid": self.pid,
                                             "it": self.i, "t": time.time()})
        return {"i": self.i, "attempt": self.attempt, "done": self.i >= self.config["iters"]}

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        with open(os.path.join(checkpoint_dir, "state.json"), "w") as f:
            json.dump({"i": self.i}, f)

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        with open(os.path.join(checkpoint_dir, "state.json")) as f:
            self.i = json.load(f)["i"]


# ----------------------------------------------------------------------- harness
class Timeline(tune.Callback):
    """Driver-side record of when each trial was recovered and restarted."""

    def __init__(self) -> None:
        self.recovered: dict[str, list[float]] = {}
        self.started: dict[str, list[float]] = {}
        self.results: dict[str, list[dict[str, Any]]] = {}

    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.recovered.setdefault(trial.trial_id, []).append(time.time())

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.started.setdefault(trial.trial_id, []).append(time.time())

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict,
                        **info: Any) -> None:
        self.results.setdefault(trial.trial_id, []).append(
            {"training_iteration": result["training_iteration"], "attempt": result["attempt"]})


def no_nanny_workers(procs: DaskProcesses, n: int, resources: str) -> list:
    """``n`` more workers without a nanny: the PID we signal is the worker itself."""
    new = [procs.add_worker("--no-nanny", resources=resources) for _ in range(n)]
    return new


@pytest.fixture
def cluster(dask_processes, monkeypatch) -> Iterator[Any]:
    """Factory for a real cluster of no-nanny workers with dasktune connected to it."""
    from distributed import Client

    made: list[DaskProcesses] = []
    clients: list[Any] = []
    wait = DaskProcesses.wait_workers
    # The fixture's own workers have a nanny; ours are added after it starts with none.
    monkeypatch.setattr(DaskProcesses, "wait_workers",
                        lambda self, n, timeout=60.0: wait(self, n, timeout) if n else None)

    def make(n: int, resources: str = "CPU=1", env: dict[str, str] | None = None,
             nanny: bool = False) -> DaskProcesses:
        procs = dask_processes(n_workers=0, env=env)
        if nanny:  # `dask worker` as deployed: the PID we signal is the nanny's
            for _ in range(n):
                procs.add_worker(resources=resources)
        else:
            no_nanny_workers(procs, n, resources)
        procs.wait_workers(n)
        # Swapped in for this test only: an embedded cluster that another test module
        # started (the session's local_client) stays as it was.
        client = Client(procs.address, set_as_default=False)
        clients.append(client)
        monkeypatch.setattr(runtime, "_client", client)
        monkeypatch.setattr(runtime, "_cluster", None)
        made.append(procs)
        return procs

    yield make
    for client in clients:
        client.close()


def run_in_thread(fn) -> tuple[threading.Thread, dict[str, Any]]:
    """Run ``fn`` (a ``Tuner.fit``) in a thread; its result or exception lands in the dict."""
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["result"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised by the test
            out["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, out


def join(thread: threading.Thread, out: dict[str, Any], timeout: float = 120.0) -> Any:
    thread.join(timeout)
    assert not thread.is_alive(), f"fit() did not finish within {timeout}s"
    if "error" in out:
        raise out["error"]
    return out["result"]


def live_attempt(trial_dir: str) -> dict[str, Any] | None:
    attempts = read_jsonl(os.path.join(trial_dir, "attempts.jsonl"))
    return attempts[-1] if attempts else None


def executed_by(trial_dir: str, attempt: int) -> int:
    """Highest iteration ``attempt`` of the trial has executed (0 if none)."""
    its = [r["it"] for r in read_jsonl(os.path.join(trial_dir, "executed.jsonl"))
           if r["attempt"] == attempt]
    return max(its, default=0)


def result_rows(trial_dir: str) -> list[dict[str, Any]]:
    return read_jsonl(os.path.join(trial_dir, "result.json"))


def assert_one_lineage(trial_dir: str, iters: int) -> list[dict[str, Any]]:
    """result.json holds iterations 1..iters, each once, in order, continuing across attempts."""
    rows = result_rows(trial_dir)
    its = [r["training_iteration"] for r in rows]
    assert its == list(range(1, iters + 1)), f"{trial_dir}: {its}"
    assert all(r["i"] == r["training_iteration"] for r in rows)
    return rows


def commits_before(trial_dir: str, t: float) -> list[int]:
    """The iterations of the checkpoints whose commit manifest was written before ``t``."""
    return sorted(int(m["training_iteration"]) for m in committed_manifests(trial_dir)
                  if m["committed_at"] < t)


def committed_before(trial_dir: str, t: float) -> int:
    """The newest checkpoint's iteration whose commit manifest was written before ``t``."""
    return max(commits_before(trial_dir, t), default=0)


def sigkill(proc) -> float:
    t = time.time()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    return t


# ----------------------------------------------------------------------- 1. chaos
def test_chaos_sigkill_workers_running_trials(cluster, tmp_path):
    """12 trials x 20 iterations on 3 workers; 3 workers SIGKILLed at seeded moments."""
    rng = random.Random(4)
    iters, k, n_kills = 20, 4, 3
    procs = cluster(3, resources="CPU=4")
    exp = tmp_path / "results" / "chaos"
    tuner = tune.Tuner(
        checkpointed,
        param_space={"x": tune.grid_search(list(range(12))), "iters": iters, "k": k,
                     "sleep": 0.1},
        run_config=tune.RunConfig(name="chaos", storage_path=str(tmp_path / "results"),
                                  verbose=0))
    thread, out = run_in_thread(tuner.fit)
    killed: dict[int, float] = {}  # pid -> time of the kill
    try:
        for _ in range(n_kills):
            threshold = rng.randint(3, iters - 6)

            def victim(threshold: int = threshold) -> Any:
                # A live worker of ours whose current attempt has passed the threshold.
                for d in trial_dirs(str(exp)):
                    a = live_attempt(d)
                    if a is None or a["pid"] in killed or executed_by(d, a["attempt"]) >= iters:
                        continue
                    if executed_by(d, a["attempt"]) >= threshold:
                        for p in procs.workers:
                            if p.pid == a["pid"] and p.poll() is None:
                                return p
                return None

            proc = wait_for(victim, timeout=60, what=f"a trial past iteration {threshold}")
            killed[proc.pid] = sigkill(proc)
            procs.add_worker("--no-nanny", resources="CPU=4")  # capacity stays
        results = join(thread, out)
    finally:
        thread.join(0)

    assert len(results) == 12 and results.num_terminated == 12 and not results.errors
    dirs = trial_dirs(str(exp))
    assert len(dirs) == 12
    moved = held_back = 0
    for d in dirs:
        attempts = read_jsonl(os.path.join(d, "attempts.jsonl"))
        executed = read_jsonl(os.path.join(d, "executed.jsonl"))
        committed = read_jsonl(os.path.join(d, "committed.jsonl"))
        rows = assert_one_lineage(d, iters)
        # Every attempt but the last was on a killed worker; the last one finished.
        assert all(a["pid"] in killed for a in attempts[:-1]), attempts
        assert attempts[-1]["pid"] not in killed
        assert executed_by(d, attempts[-1]["attempt"]) == iters
        if len(attempts) == 1:
            assert attempts[0]["start"] == 1
            continue
        moved += 1
        for prev, cur in zip(attempts, attempts[1:]):
            # The checkpoints committed (manifest written) before the kill, by storage's own
            # record; committed.jsonl may miss one committed just before the SIGKILL.
            commits = commits_before(d, killed[prev["pid"]])
            newest = max(commits, default=0)
            assert newest >= max((c["it"] for c in committed
                                  if c["attempt"] < cur["attempt"]), default=0)
            # Killed at most k iterations past its newest commit (report blocks on commit)...
            # (an attempt killed before its first iteration, seen on a loaded machine,
            # reached the checkpoint it restored)
            reached = max((r["it"] for r in executed if r["attempt"] == prev["attempt"]),
                          default=prev["restored"])
            assert reached - newest <= k, (d, reached, newest)
            # ...and resumed right after the newest checkpoint committed before the kill
            # (storage is the truth: the driver adopts one it never heard of), unless rows
            # between the last one the driver logged and that checkpoint died with the
            # worker: then from the newest it logged, so result.json keeps no hole (the
            # driver's documented rule; seen 1 run in 4: logged 5, committed 8, resumed 4).
            logged = max([r["i"] for r in rows if r["attempt"] <= prev["attempt"]]
                         + [prev["restored"]])
            expected = newest if newest <= logged + 1 else max(
                [c for c in commits if c <= logged], default=0)
            assert cur["restored"] == expected, (d, attempts, commits, logged)
            held_back += expected != newest
            assert cur["start"] == cur["restored"] + 1
    assert moved >= n_kills  # each kill hit at least one running trial
    by_id = {t.trial_id: t for t in results._trials}
    assert all(t.status == TERMINATED for t in by_id.values())
    # Every resumed attempt is one counted restart (an actor lost before its trainable
    # started counts too, so >=).
    resumed = sum(len(read_jsonl(os.path.join(d, "attempts.jsonl"))) - 1 for d in dirs)
    assert sum(t.num_restarts for t in by_id.values()) >= resumed >= moved
    print(f"\nchaos: {n_kills} kills, {moved} trials moved, {resumed} resumed attempts, "
          f"{held_back} resumed behind the newest commit (rows lost with the worker)")
    assert all(t.num_failures == 0 for t in by_id.values())
    assert not any(t.status == ERROR for t in by_id.values())


# ------------------------------------------------------- 2. beyond allowed-failures
def test_host_killed_more_often_than_allowed_failures(cluster, tmp_path):
    """Dask gives up on a task after ``allowed-failures`` lost workers; a trial never does."""
    procs = cluster(2, env={"DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "1"})
    exp = tmp_path / "results" / "allowed"
    iters, k, kills = 12, 2, 3
    tuner = tune.Tuner(
        checkpointed, param_space={"iters": iters, "k": k, "sleep": 0.1},
        run_config=tune.RunConfig(name="allowed", storage_path=str(tmp_path / "results"),
                                  verbose=0))
    thread, out = run_in_thread(tuner.fit)
    killed_at = []
    for n in range(kills):
        def running(n: int = n) -> Any:
            # The (n+1)-th attempt that ran the trainable, past iteration 3(n+1).
            dirs = trial_dirs(str(exp))
            attempts = read_jsonl(os.path.join(dirs[0], "attempts.jsonl")) if dirs else []
            if len(attempts) != n + 1:
                return None
            a = attempts[-1]
            if executed_by(dirs[0], a["attempt"]) < 3 * (n + 1):
                return None
            return next(p for p in procs.workers if p.pid == a["pid"])
        proc = wait_for(running, timeout=60, what=f"attempt {n + 1} past iteration {3 * (n + 1)}")
        killed_at.append(sigkill(proc))
        procs.add_worker("--no-nanny")
    results = join(thread, out)
    (trial,) = results._trials
    assert trial.status == TERMINATED and trial.num_restarts >= kills
    assert trial.num_failures == 0
    assert trial.last_result["training_iteration"] == iters
    d = trial_dirs(str(exp))[0]
    assert_one_lineage(d, iters)
    attempts = read_jsonl(os.path.join(d, "attempts.jsonl"))
    assert len(attempts) == kills + 1
    # Each resumed attempt starts right after the newest checkpoint (every k=2) committed
    # before its kill (an iteration executed but not yet committed when the worker died
    # is re-run, never skipped).
    want = [1] + [committed_before(d, t) + 1 for t in killed_at]
    assert [a["start"] for a in attempts] == want
    assert all(b > a for a, b in zip(want, want[1:]))


# ------------------------------------------------------------- 3. frozen worker
def _kill_and_measure(procs: DaskProcesses, tmp_path, how: str) -> tuple[float, list, str]:
    """Run one trial, stop its host with ``how``; seconds from signal to recovery."""
    timeline = Timeline()
    name = f"frozen-{how}"
    exp = tmp_path / "results" / name
    iters = 30
    tuner = tune.Tuner(
        checkpointed, param_space={"iters": iters, "k": 3, "sleep": 0.1},
        run_config=tune.RunConfig(name=name, storage_path=str(tmp_path / "results"),
                                  verbose=0, callbacks=[timeline]))
    thread, out = run_in_thread(tuner.fit)
    d = wait_for(lambda: (trial_dirs(str(exp)) or [None])[0], what="the trial folder")
    wait_for(lambda: executed_by(d, 1) >= 4, what="iteration 4 of attempt 1")
    first = live_attempt(d)
    proc = next(p for p in procs.workers if p.pid == first["pid"])
    t0 = time.time()
    os.kill(proc.pid, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
    at_signal = executed_by(d, 1)
    try:
        wait_for(lambda: timeline.recovered, timeout=40, what="the driver noticing the loss")
        detect = min(min(v) for v in timeline.recovered.values()) - t0
        # The next attempt that runs (its number may skip one: see the report on re-placing
        # a trial on the worker it was just lost from).
        second = wait_for(lambda: (read_jsonl(os.path.join(d, "attempts.jsonl"))[1:] or
                                   [None])[0], what="a second attempt running")
        wait_for(lambda: executed_by(d, second["attempt"]) >= 1, what="it running")
        if how == "stop":
            frozen_at = executed_by(d, 1)
            os.kill(proc.pid, signal.SIGCONT)
            # The zombie thaws and runs on (or its worker shuts itself down).
            wait_for(lambda: executed_by(d, 1) > frozen_at or proc.poll() is not None,
                     timeout=20, what="the zombie thawing")
        results = join(thread, out)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
    (trial,) = results._trials
    assert trial.status == TERMINATED and trial.num_restarts >= 1 and trial.num_failures == 0
    rows = assert_one_lineage(d, iters)
    attempts = read_jsonl(os.path.join(d, "attempts.jsonl"))
    assert len(attempts) == 2 and attempts[0]["attempt"] == 1
    # One lineage: what attempt 1 did before the signal, then attempt 2 only; attempt 2
    # resumed after the newest checkpoint (every 3) and did not log re-executed iterations.
    by_attempt = [r["attempt"] for r in rows]
    assert by_attempt == sorted(by_attempt) and by_attempt[-1] == attempts[1]["attempt"]
    n1 = by_attempt.count(1)
    restored = attempts[1]["start"] - 1
    # From a checkpoint (every 3) no newer than the freeze, and no older than the newest
    # the driver had logged (it registers each checkpoint with its result row).
    assert n1 <= at_signal and restored % 3 == 0 and 3 * (n1 // 3) <= restored <= at_signal
    assert [r["attempt"] for r in timeline.results[trial.trial_id]] == by_attempt
    return detect, n1, d


def test_sigstop_past_worker_ttl_then_sigcont(cluster, tmp_path):
    procs = cluster(2, env={"DASK_DISTRIBUTED__SCHEDULER__WORKER_TTL": "3s"})
    kill_s, _, _ = _kill_and_measure(procs, tmp_path, "kill")
    procs.add_worker("--no-nanny")
    procs.wait_workers(2)
    stop_s, n1, d = _kill_and_measure(procs, tmp_path, "stop")
    # The zombie ran on after the thaw; none of its iterations reached result.json.
    zombie = max(r["it"] for r in read_jsonl(os.path.join(d, "executed.jsonl"))
                 if r["attempt"] == 1)
    print(f"\ndetection: SIGKILL {kill_s:.3f}s, SIGSTOP with worker-ttl=3s {stop_s:.3f}s; "
          f"zombie ran to iteration {zombie}, {n1} of attempt 1 logged")
    assert zombie > n1
    assert kill_s < 5.0
    assert 2.5 < stop_s < 20.0  # only the ttl can notice a frozen process


def test_sigstop_is_noticed_by_the_unresponsive_timeout(cluster, tmp_path):
    """With Dask's default worker-ttl (5 minutes) the scheduler keeps a frozen worker; the
    driver's own dasktune.executor.unresponsive-timeout gives its trial up and restarts
    it on the other worker, and the thawed attempt reaches no result file."""
    import dask

    procs = cluster(2)
    with dask.config.set({"dasktune.executor.unresponsive-timeout": "3s"}):
        stop_s, n1, d = _kill_and_measure(procs, tmp_path, "stop")
    print(f"\ndetection: SIGSTOP with unresponsive-timeout=3s {stop_s:.3f}s")
    assert 2.5 < stop_s < 20.0


# ------------------------------------------------------- 4. graceful retirement
def _retire_mid_trial(cluster, tmp_path, how: str) -> tuple[Any, Any, str]:
    """Run one class trial; retire its worker at iteration 5 (``how``); wait for the end.

    Returns the results, the ``dask worker`` process retired, and the trial folder."""
    procs = cluster(2, nanny=how == "sigterm")
    exp = tmp_path / "results" / "retire"
    tuner = tune.Tuner(
        Counter, param_space={"iters": 15, "sleep": 0.3},  # slow enough to retire mid-run
        run_config=tune.RunConfig(name="retire", storage_path=str(tmp_path / "results"),
                                  verbose=0))
    thread, out = run_in_thread(tuner.fit)
    d = wait_for(lambda: (trial_dirs(str(exp)) or [None])[0], what="the trial folder")
    wait_for(lambda: executed_by(d, 1) >= 5, what="iteration 5 of attempt 1")
    first = live_attempt(d)
    if how == "sigterm":  # what a spot interruption notice sends, to the `dask worker` CLI
        import psutil

        nanny_pid = psutil.Process(first["pid"]).ppid()
        proc = next(p for p in procs.workers if p.pid == nanny_pid)
        os.kill(proc.pid, signal.SIGTERM)
    else:
        proc = next(p for p in procs.workers if p.pid == first["pid"])
        from distributed import Client

        with Client(procs.address, set_as_default=False) as other:
            addr = next(a for a, pid in other.run(os.getpid).items() if pid == proc.pid)
            other.retire_workers([addr], close_workers=True)  # refused: it holds an actor
    return join(thread, out), proc, d


@pytest.mark.parametrize("how", ["retire_workers", "sigterm"])
def test_graceful_retirement_loses_nothing(cluster, tmp_path, how):
    results, proc, d = _retire_mid_trial(cluster, tmp_path, how)
    (trial,) = results._trials
    assert trial.status == TERMINATED
    assert trial.num_failures == 0
    assert_one_lineage(d, 15)
    attempts = read_jsonl(os.path.join(d, "attempts.jsonl"))
    executed = read_jsonl(os.path.join(d, "executed.jsonl"))
    assert len(attempts) == 2 and attempts[1]["pid"] != attempts[0]["pid"]
    assert trial.num_restarts == 0  # a move, not a loss
    reached = max(r["it"] for r in executed if r["attempt"] == attempts[0]["attempt"])
    assert attempts[1]["start"] == reached + 1  # zero iterations lost
    assert len(executed) == 15  # and none executed twice


def test_retired_worker_leaves_once_its_trials_moved(cluster, tmp_path):
    _results, proc, _d = _retire_mid_trial(cluster, tmp_path, "retire_workers")
    wait_for(lambda: proc.poll() is not None, timeout=15, what="the retired worker leaving")


def test_retired_worker_with_only_an_idle_actor_leaves(cluster, tmp_path):
    """A finished trial's actor kept for reuse must not keep a retiring worker alive."""
    procs = cluster(2)
    exp = tmp_path / "results" / "idle"
    tuner = tune.Tuner(
        Counter, param_space={"iters": tune.grid_search([2, 60]), "sleep": 0.2},
        run_config=tune.RunConfig(name="idle", storage_path=str(tmp_path / "results"),
                                  verbose=0))
    thread, out = run_in_thread(tuner.fit)
    dirs = wait_for(lambda: len(glob.glob(str(exp / "*" / "params.json"))) == 2
                    and trial_dirs(str(exp)), what="both trials' params.json")

    def iters(d: str) -> int:
        with open(os.path.join(d, "params.json")) as f:
            return json.load(f)["iters"]

    short, long_ = sorted(dirs, key=iters)
    wait_for(lambda: result_rows(short) and result_rows(short)[-1].get("done"),
             what="the short trial ending")
    wait_for(lambda: executed_by(long_, 1) >= 1, what="the long trial running")
    pid = live_attempt(short)["pid"]
    assert pid != live_attempt(long_)["pid"]  # on the other worker, now idle
    proc = next(p for p in procs.workers if p.pid == pid)
    from distributed import Client

    with Client(procs.address, set_as_default=False) as other:
        addr = next(a for a, p in other.run(os.getpid).items() if p == pid)
        other.retire_workers([addr], close_workers=True)  # refused: the pooled actor
    wait_for(lambda: proc.poll() is not None, timeout=15, what="the retired worker leaving")
    assert executed_by(long_, 1) < 60  # it left while the experiment still ran
    results = join(thread, out)
    assert all(t.status == TERMINATED for t in results._trials)



def test_worker_at_its_lifetime_moves_its_trial_quietly(cluster, tmp_path):
    """A worker that Dask itself closes at its ``--lifetime`` while it holds a trial (with
    ``--lifetime-restart``, which dasktune's walltime plugin leaves to Dask; without it the
    plugin retires the worker first, the next test): the trial moves (a class trainable
    checkpoints on demand, nothing run twice, no failure) and the worker says nothing worse
    than Dask says without dasktune.

    Dask refuses the worker's own retirement (it holds an actor) and sends its old status
    back; landing after the close began, that ran the close twice, the second time on a
    closed connection pool (``ConnectionPool is closed``, with two tracebacks)."""
    procs = cluster(0, nanny=True)
    first = procs.add_worker("--lifetime", "12s", "--lifetime-stagger", "0s",
                             "--lifetime-restart")
    procs.wait_workers(1)
    moved = str(tmp_path / "moved")  # a file, not an Event: the experiment is saved
    exp = tmp_path / "results" / "lifetime"
    tuner = tune.Tuner(
        Counter, param_space={"iters": 10_000, "sleep": 0.2},
        run_config=tune.RunConfig(name="lifetime", storage_path=str(tmp_path / "results"),
                                  verbose=0, stop=lambda _tid, _result: os.path.exists(moved)))
    thread, out = run_in_thread(tuner.fit)
    d = wait_for(lambda: (trial_dirs(str(exp)) or [None])[0], what="the trial folder")
    wait_for(lambda: executed_by(d, 1) >= 1, timeout=60, what="the trial running")
    import psutil

    assert psutil.Process(live_attempt(d)["pid"]).ppid() == first.pid  # on the nanny's child
    log_path = os.path.join(procs.logdir, "worker-0.log")
    procs.add_worker()  # where the trial moves to

    def worker_log() -> str:
        with open(log_path, errors="replace") as f:
            return f.read()

    wait_for(lambda: "worker-lifetime-reached" in worker_log(), timeout=60,
             what="the worker's lifetime end")
    wait_for(lambda: executed_by(d, 2) >= 3, timeout=60, what="the moved trial running")
    open(moved, "w").close()
    results = join(thread, out)
    (trial,) = results._trials
    assert trial.status == TERMINATED and trial.num_failures == 0 and trial.num_restarts == 0
    rows = assert_one_lineage(d, len(result_rows(d)))
    executed = [r["it"] for r in read_jsonl(os.path.join(d, "executed.jsonl"))]
    assert len(executed) == len(set(executed))  # none run twice (the last may be unlogged)
    assert set(executed) >= {r["training_iteration"] for r in rows}
    assert [a["attempt"] for a in read_jsonl(os.path.join(d, "attempts.jsonl"))] == [1, 2]
    log = worker_log()
    assert "Closing worker gracefully" in log and "worker-lifetime-reached" in log
    errors = {line.split(" - ERROR - ", 1)[1] for line in log.splitlines()
              if " - ERROR - " in line}
    # Dask's nanny logs this at a lifetime end on its own (its stop queue closes under it).
    assert errors <= {"Worker process died unexpectedly"}, log
    assert "ConnectionPool is closed" not in log

def test_worker_retires_before_its_lifetime_and_a_function_trial_loses_nothing(
        cluster, tmp_path):
    """A function trainable moves only at its next reported checkpoint: on a worker that
    Dask closes at its ``--lifetime`` it gets ``executor.evacuate-timeout`` (1 s here) to
    reach one and loses the iterations since its last. dasktune's walltime plugin retires
    the worker before its lifetime instead (``cluster.walltime.margin``, 8 s here, a
    quarter of the lifetime at most), on a plain ``dask worker`` outside any batch job: the
    trial moves at its next checkpoint (every 4 s), the worker is gone before its lifetime
    ends, and every iteration runs once."""
    import dask
    import psutil

    lifetime = 40.0
    procs = cluster(0, nanny=True)
    first = procs.add_worker("--lifetime", f"{lifetime:.0f}s", "--lifetime-stagger", "0s",
                             env={"DASK_DASKTUNE__EXECUTOR__EVACUATE_TIMEOUT": "1s"})
    procs.wait_workers(1)
    moved = str(tmp_path / "moved")
    exp = tmp_path / "results" / "lifetime"
    tuner = tune.Tuner(
        checkpointed, param_space={"iters": 10_000, "sleep": 0.5, "k": 8},
        run_config=tune.RunConfig(name="lifetime", storage_path=str(tmp_path / "results"),
                                  verbose=0, stop=lambda _tid, _result: os.path.exists(moved)))
    with dask.config.set({"dasktune.cluster.walltime.margin": "8s"}):  # read by the driver
        thread, out = run_in_thread(tuner.fit)
        d = wait_for(lambda: (trial_dirs(str(exp)) or [None])[0], what="the trial folder")
        wait_for(lambda: executed_by(d, 1) >= 1, timeout=60, what="the trial running")
        child = psutil.Process(live_attempt(d)["pid"])
        assert child.ppid() == first.pid  # on the nanny's child, whose lifetime runs
        # Dask starts the lifetime when it builds the Worker, after its process started.
        ends = child.create_time() + lifetime
        procs.add_worker()  # where the trial moves to
        wait_for(lambda: first.poll() is not None, timeout=lifetime + 30,
                 what="the worker leaving")
        gone = time.time()
        wait_for(lambda: executed_by(d, 2) >= 3, timeout=60, what="the moved trial running")
        open(moved, "w").close()
        results = join(thread, out)
    (trial,) = results._trials
    assert trial.status == TERMINATED and trial.num_failures == 0
    rows = assert_one_lineage(d, len(result_rows(d)))
    executed = [r["it"] for r in read_jsonl(os.path.join(d, "executed.jsonl"))]
    assert len(executed) == len(set(executed)), "iterations ran twice: lost at the move"
    assert set(executed) >= {r["training_iteration"] for r in rows}
    attempts = read_jsonl(os.path.join(d, "attempts.jsonl"))
    assert [a["attempt"] for a in attempts] == [1, 2]
    assert attempts[1]["restored"] == executed_by(d, 1)  # it left at its checkpoint
    assert gone < ends, f"the worker left {gone - ends:.1f}s after its lifetime's end"
    with open(os.path.join(procs.logdir, "worker-0.log"), errors="replace") as f:
        log = f.read()
    assert f"its lifetime ({lifetime:.0f}s) ends in" in log and "retiring gracefully" in log
    errors = {line.split(" - ERROR - ", 1)[1] for line in log.splitlines()
              if " - ERROR - " in line}
    assert errors <= {"Worker process died unexpectedly"}, log

# ------------------------------------- 6. a call cancelled under the driver, not by it
def test_call_cancelled_under_the_driver_restarts_the_attempt(local_client, tmp_path,
                                                              monkeypatch):
    """An await inside the executor that raises CancelledError although the executor did
    not cancel it must end in a restart, not in an attempt the driver waits on for ever.

    Seen with distributed's Client, which shares one gather among concurrent awaits of
    futures: a lost worker's trial, cancelled while its actor was being fetched, took
    the other trials' actor creations down with it and fit() hung. The executor no
    longer fetches actors; this pins the guard behind that, with the cancellation
    injected at the one await where it was seen (Dask cannot be made to race on cue).
    """
    from dasktune.execution import dask_polling as executor

    real = executor.settled
    hits: list[str] = []

    async def cancelled_once(future):
        await real(future)
        if not hits:
            hits.append(future.key)
            raise asyncio.CancelledError  # as a shared, cancelled gather raises it

    monkeypatch.setattr(executor, "settled", cancelled_once)
    tuner = tune.Tuner(
        tiny, param_space={"x": tune.grid_search([1, 2, 3, 4])},
        run_config=tune.RunConfig(name="cancelled", storage_path=str(tmp_path), verbose=0))
    thread, out = run_in_thread(tuner.fit)
    results = join(thread, out, timeout=60.0)
    assert hits, "the injected cancellation never ran"
    assert results.num_terminated == 4 and not results.errors
    assert all(r.metrics["training_iteration"] == 3 for r in results)
    hit = [t for t in results._trials if t.num_restarts]
    assert len(hit) == 1 and hit[0].num_failures == 0


def tiny(config: dict[str, Any]) -> None:
    for i in range(3):
        time.sleep(0.01)
        tune.report({"loss": config["x"] / (i + 1)})
