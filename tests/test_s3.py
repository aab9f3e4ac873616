"""Tuner runs on object stores over HTTP on 127.0.0.1 (S3: moto's server; gs://: the GCS
emulator, ``gcp-storage-emulator``, through gcsfs), with trials in the embedded
cluster's worker processes: Ray's layout in the bucket, retention, best checkpoint read
back, restore from the ``s3://`` URI, results read by a fresh process, a trial resumed
on another worker, outages shorter and longer than the retry budget, and credentials
that never reach a file or an error message."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import test_s3_support
from conftest import wait_for
from test_s3_support import (
    AWS_ENV,
    GcsStore,
    S3Store,
    TcpProxy,
    s3_fs,
    s3_options,
    set_worker_config,
    set_worker_env,
)

import dasktune as tune
from dasktune.storage import MANIFEST
from dasktune.trial import TERMINATED

pytestmark = pytest.mark.timeout(120)

moto_s3 = test_s3_support.moto_s3  # the fixtures, shared with other S3 tests
gcs_emulator = test_s3_support.gcs_emulator


@pytest.fixture
def cluster(local_client):
    """The embedded cluster with AWS credentials in its workers' environment."""
    local_client.wait_for_workers(2, timeout=60)  # client.run reaches only live workers
    set_worker_env(local_client, AWS_ENV)
    yield local_client
    local_client.wait_for_workers(2, timeout=60)  # a test may have killed one


@pytest.fixture(params=["s3", "gs"])
def store(request, cluster):
    """Each case runs on S3 and on gs://, its endpoint known to the driver and workers."""
    if request.param == "s3":
        st = S3Store(request.getfixturevalue("moto_s3"))
    else:
        st = GcsStore(request.getfixturevalue("gcs_emulator"))
    os.environ.update(st.env)
    set_worker_env(cluster, st.env)
    return st


def counting(config):
    """Checkpoints every iteration; resumes from the newest checkpoint."""
    start = 0
    ckpt = tune.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            with open(os.path.join(d, "state.json")) as f:
                start = json.load(f)["i"] + 1
    ctx = tune.get_context()
    for i in range(start, config["iters"]):
        d = os.path.join(ctx.get_trial_dir(), f"ckpt_{i}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "state.json"), "w") as f:
            json.dump({"i": i, "attempt": ctx.get_attempt()}, f)
        with open(os.path.join(d, "weights.bin"), "wb") as f:
            f.write(os.urandom(config.get("size", 1000)))
        if config.get("sleep"):
            time.sleep(config["sleep"])
        if i == config.get("die_at") and ctx.get_attempt() == 1:
            if config.get("how") == "kill":
                os.kill(os.getpid(), signal.SIGKILL)  # the worker process dies
            raise RuntimeError("first attempt fails")
        tune.report({"score": i * config["lr"], "i": i, "trial_dir": ctx.get_trial_dir()},
                    checkpoint=tune.Checkpoint.from_directory(d))


def bucket_files(fs, root):
    return sorted(p[len(root) + 1:] for p in fs.find(root))


def result_lines(fs, trial_path):
    return [json.loads(x) for x in fs.cat_file(f"{trial_path}/result.json").splitlines()]


def test_layout_retention_readback_and_restore(cluster, store, tmp_path):
    bucket = store.new_bucket()
    fs = store.fs()
    rc = tune.RunConfig(
        name="exp", storage_path=f"{store.scheme}://{bucket}/p", storage_filesystem=fs,
        verbose=0,
        checkpoint_config=tune.CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="score"))
    tuner = tune.Tuner(counting, param_space={"lr": tune.grid_search([1.0, -1.0]), "iters": 4},
                       tune_config=tune.TuneConfig(metric="score", mode="max"), run_config=rc)
    results = tuner.fit()
    assert results.num_terminated == 2 and not results.errors
    assert {r.metrics["pid"] for r in results} <= set(cluster.run(os.getpid).values())

    root = f"{bucket}/p/exp"
    files = bucket_files(fs, root)
    for name in ("experiment_state.json", "tuner.pkl", "searcher-state.pkl"):
        assert name in files
    for r in results:
        rel = r.path[len(root) + 1:]
        assert r.path.startswith(root + "/")
        for name in ("params.json", "params.pkl", "result.json", "progress.csv"):
            assert f"{rel}/{name}" in files
        assert any(f.startswith(f"{rel}/events.out.tfevents.") for f in files)
        ckpts = sorted({f.split("/")[1] for f in files
                        if f.startswith(rel + "/checkpoint_")})
        assert len(ckpts) == 2, ckpts  # num_to_keep
        for c in ckpts:
            assert f"{rel}/{c}/{MANIFEST}" in files and f"{rel}/{c}/state.json" in files
        assert [x["training_iteration"] for x in result_lines(fs, r.path)] == [1, 2, 3, 4]
    # with lr=-1 the best-scoring checkpoints are the first ones: retention kept those
    neg = next(r for r in results if r.config["lr"] == -1.0)
    kept = sorted(json.loads(fs.cat_file(f"{c.path}/state.json"))["i"]
                  for c, _ in neg.best_checkpoints)
    assert kept == [0, 3]  # the best (i=0) and the newest (never deleted)

    best = results.get_best_result()
    assert best.config["lr"] == 1.0
    out = best.checkpoint.to_directory(str(tmp_path / "best"))
    assert json.load(open(os.path.join(out, "state.json")))["i"] == 3
    with best.checkpoint.as_directory() as d:
        assert os.path.getsize(os.path.join(d, "weights.bin")) == 1000
    assert not os.path.exists(d)

    uri = f"{store.scheme}://{root}"
    assert tune.Tuner.can_restore(uri, storage_filesystem=fs)
    restored = tune.Tuner.restore(uri, trainable=counting, storage_filesystem=fs)
    grid = restored.get_results()
    assert grid.get_best_result().metrics["score"] == 3.0
    again = restored.fit()  # nothing left to run: finished trials are not rerun
    assert again.num_terminated == 2
    assert [x["training_iteration"] for x in result_lines(fs, best.path)] == [1, 2, 3, 4]

    # A process that did not run the experiment reads it (the cluster may be gone); as
    # in Ray, restore is given a trainable of the original's name.
    script = f"""
import json, dasktune as tune
{store.fs_code()}
def counting(config):
    pass
grid = tune.Tuner.restore({uri!r}, trainable=counting, storage_filesystem=fs).get_results()
best = grid.get_best_result()
with best.checkpoint.as_directory() as d:
    state = json.load(open(d + "/state.json"))
print(json.dumps({{"n": len(grid), "score": best.metrics["score"], "i": state["i"],
                  "rows": len(best.metrics_dataframe), "ckpts": len(best.best_checkpoints)}}))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **store.env})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {
        "n": 2, "score": 3.0, "i": 3, "rows": 4, "ckpts": 2}


@pytest.mark.parametrize("how", ["raise", "kill"])
def test_trial_resumes_from_stored_checkpoint(cluster, store, how):
    """A failed attempt (user error, or its worker process killed) continues from the
    checkpoint in the store in a new attempt, on another worker when its own died."""
    bucket = store.new_bucket()
    rc = tune.RunConfig(
        name="exp", storage_path=f"{store.scheme}://{bucket}/p", verbose=0,
        storage_options=store.options(store.endpoint),
        failure_config=tune.FailureConfig(max_failures=1))
    results = tune.Tuner(counting, param_space={"lr": 1.0, "iters": 5, "die_at": 2, "how": how},
                         run_config=rc).fit()
    r = results[0]
    assert not results.errors and r.metrics["training_iteration"] == 5
    fs = store.fs()
    lines = result_lines(fs, r.path)
    assert [x["i"] for x in lines] == [0, 1, 2, 3, 4]  # resumed after i=1, nothing redone
    # the later results come from a restored attempt (a killed worker may take the
    # result of i=1 with it, which the resumed attempt then reports again)
    assert all(x["iterations_since_restore"] < x["training_iteration"] for x in lines[2:])
    assert json.loads(fs.cat_file(f"{r.checkpoint.path}/state.json"))["attempt"] == 2
    state = json.loads(fs.cat_file(f"{bucket}/p/exp/experiment_state.json"))
    placements = state["trials"][0]["placements"]
    assert len(placements) == 2
    if how == "kill":
        assert placements[0]["worker"] != placements[1]["worker"]
    # With storage in an object store, the trial's own folder is local scratch, inside the Dask worker's
    # local directory: when the worker was killed, Dask removes it as a new worker starts.
    first, last = lines[0]["trial_dir"], lines[-1]["trial_dir"]
    assert first != last
    bases = cluster.run(lambda dask_worker: os.path.dirname(dask_worker.local_directory))
    assert os.path.dirname(os.path.dirname(first)) in bases.values()
    wait_for(lambda: not os.path.exists(first), timeout=30)


class Outage:
    """Takes the proxy down once ``after`` checkpoints are committed, for ``secs``."""

    def __init__(self, proxy: TcpProxy, fs, root: str, after: int, secs: float):
        self.proxy, self.fs, self.root, self.after, self.secs = proxy, fs, root, after, secs
        self.started = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _progress(self) -> int:
        """How many checkpoints the trials have committed (workers write them directly)."""
        self.fs.invalidate_cache()
        return len(self.fs.glob(f"{self.root}/*/checkpoint_*/{MANIFEST}"))

    def _run(self) -> None:
        deadline = time.monotonic() + 60
        while self._progress() < self.after and time.monotonic() < deadline:
            time.sleep(0.05)
        self.proxy.down()
        self.started.set()
        time.sleep(self.secs)
        self.proxy.back()


@pytest.fixture
def proxy(store):
    p = TcpProxy(store.port)
    yield p
    p.close()


@pytest.fixture
def worker_config(cluster, store):
    changed = []

    def set_(settings):
        changed.append(set_worker_config(cluster, settings))

    old_retries = store.set_retries(cluster, 1)
    yield set_
    for old in changed:
        set_worker_config(cluster, old)
    store.set_retries(cluster, old_retries)


def _s3_only(store):
    if store.scheme != "s3":
        pytest.skip("gcsfs retries each call 6 times with backoff (~30 s) by itself, fixed "
                    "at import: an outage past dasktune's budget is an S3 case")


def test_short_outage_loses_nothing(cluster, store, proxy, worker_config):
    # budget of the workers and the driver: 0.2 + 0.4 + ... + 6.4 s, well over the outage
    worker_config({"dasktune.storage.retries": 6, "dasktune.storage.retry-backoff": "0.2s",
                   "dasktune.storage.sync-period": "0.2s"})
    bucket = store.new_bucket()
    direct = store.fs()
    outage = Outage(proxy, direct, f"{bucket}/p/exp", after=2, secs=2.0)
    rc = tune.RunConfig(name="exp", storage_path=f"{store.scheme}://{bucket}/p", verbose=0,
                        storage_options=store.options(proxy.endpoint))
    results = tune.Tuner(counting, param_space={"lr": 1.0, "iters": 12, "sleep": 0.2},
                         run_config=rc).fit()
    assert outage.started.is_set() and proxy.refused > 0  # the outage really happened
    direct.invalidate_cache()
    assert not results.errors and results[0].metrics["training_iteration"] == 12
    lines = result_lines(direct, results[0].path)
    assert [x["training_iteration"] for x in lines] == list(range(1, 13))
    csv = direct.cat_file(f"{results[0].path}/progress.csv").decode().splitlines()
    assert len(csv) == 13
    assert results[0].checkpoint.get_metadata()["training_iteration"] == 12


def test_long_outage_errors_trial_naming_uri_then_resumes(cluster, store, moto_s3, proxy,
                                                          worker_config):
    _s3_only(store)
    planted = "PLANTEDsecretVALUE0123456789"
    set_worker_env(cluster, {"AWS_SECRET_ACCESS_KEY": planted})
    os.environ["AWS_SECRET_ACCESS_KEY"] = planted
    try:
        # workers give up after ~0.3 s; the driver waits (0.2 + ... + 12.8 s) for storage
        # (its error.txt write is not spooled; see the next test for a short driver budget)
        worker_config({"dasktune.storage.retries": 1,
                       "dasktune.storage.retry-backoff": "0.2s",
                       "dasktune.storage.sync-period": "0.2s"})
        import dask.config

        with dask.config.set({"dasktune.storage.retries": 7}):
            bucket = moto_s3.new_bucket()
            direct = s3_fs(moto_s3.endpoint)
            outage = Outage(proxy, direct, f"{bucket}/p/exp", after=2, secs=3.0)
            rc = tune.RunConfig(name="exp", storage_path=f"s3://{bucket}/p", verbose=0,
                                storage_options=s3_options(proxy.endpoint),
                                failure_config=tune.FailureConfig(max_failures=-1))
            results = tune.Tuner(counting, param_space={"lr": 1.0, "iters": 8, "sleep": 0.2},
                                 run_config=rc).fit()
    finally:
        set_worker_env(cluster, {"AWS_SECRET_ACCESS_KEY": AWS_ENV["AWS_SECRET_ACCESS_KEY"]})
        os.environ["AWS_SECRET_ACCESS_KEY"] = AWS_ENV["AWS_SECRET_ACCESS_KEY"]
    assert outage.started.is_set()
    direct.invalidate_cache()  # the outage thread listed the bucket while trials ran
    r = results[0]
    assert r.metrics["training_iteration"] == 8 and not results.errors
    state = json.loads(direct.cat_file(f"{bucket}/p/exp/experiment_state.json"))
    trial = state["trials"][0]
    assert trial["status"] == TERMINATED and trial["num_failures"] >= 1
    error = direct.cat_file(f"{r.path}/error.txt").decode()
    assert f"s3://{bucket}/p/exp/" in error and "storage unreachable" in error
    lines = result_lines(direct, r.path)
    assert [x["i"] for x in lines] == list(range(8))  # resumed from its last checkpoint
    assert len(direct.cat_file(f"{r.path}/progress.csv").splitlines()) == 9  # header + 8
    # the planted secret is in no file of the experiment and in no error text
    for path in direct.find(f"{bucket}/p/exp"):
        assert planted.encode() not in direct.cat_file(path), path
    assert planted not in (trial.get("error_msg") or "") + error



def test_outage_past_the_drivers_retry_budget_keeps_every_result(cluster, store, moto_s3,
                                                                 proxy, worker_config):
    """The driver's retry budget is as short as the workers' (~0.6 s) and the endpoint
    is away for 4 s: its result uploads are put off, fit() does not fail, and once the
    endpoint is back every result is in result.json and progress.csv."""
    _s3_only(store)
    settings = {"dasktune.storage.retries": 1, "dasktune.storage.retry-backoff": "0.2s",
                "dasktune.storage.sync-period": "0.2s"}
    worker_config(settings)
    import dask.config

    with dask.config.set(settings):
        bucket = moto_s3.new_bucket()
        direct = s3_fs(moto_s3.endpoint)
        outage = Outage(proxy, direct, f"{bucket}/p/exp", after=2, secs=4.0)
        rc = tune.RunConfig(name="exp", storage_path=f"s3://{bucket}/p", verbose=0,
                            storage_options=s3_options(proxy.endpoint),
                            failure_config=tune.FailureConfig(max_failures=-1))
        results = tune.Tuner(counting, param_space={"lr": 1.0, "iters": 8, "sleep": 0.2},
                             run_config=rc).fit()
    assert outage.started.is_set() and proxy.refused > 0
    direct.invalidate_cache()
    r = results[0]
    assert not results.errors and r.metrics["training_iteration"] == 8
    assert [x["i"] for x in result_lines(direct, r.path)] == list(range(8))
    assert len(direct.cat_file(f"{r.path}/progress.csv").splitlines()) == 9  # header + 8
    assert json.loads(direct.cat_file(f"{r.path}/params.json"))["iters"] == 8

def test_credentials_in_storage_options_reach_no_file(cluster, moto_s3):
    planted = "PLANTEDoptionSECRET987654321"
    bucket = moto_s3.new_bucket()
    opts = s3_options(moto_s3.endpoint, key="AKIAPLANTEDKEY000000", secret=planted)
    rc = tune.RunConfig(name="exp", storage_path=f"s3://{bucket}/p", verbose=0,
                        storage_options=opts)
    tune.Tuner(counting, param_space={"lr": 1.0, "iters": 2}, run_config=rc).fit()
    direct = s3_fs(moto_s3.endpoint)
    leaked = [p for p in direct.find(f"{bucket}/p/exp") if planted.encode() in direct.cat_file(p)]
    assert not leaked


def test_restore_with_storage_options_only(cluster, store):
    """``Tuner.restore``/``can_restore`` reach the store with ``storage_options`` alone (no
    filesystem object): the errored trial resumes from its stored checkpoint."""
    bucket = store.new_bucket()
    opts = store.options(store.endpoint)
    rc = tune.RunConfig(name="exp", storage_path=f"{store.scheme}://{bucket}/p", verbose=0,
                        storage_options=opts)
    first = tune.Tuner(counting, param_space={"lr": 1.0, "iters": 5, "die_at": 2},
                       run_config=rc).fit()
    assert len(first.errors) == 1
    uri = f"{store.scheme}://{bucket}/p/exp"
    assert tune.Tuner.can_restore(uri, storage_options=opts)
    assert not tune.Tuner.can_restore(f"{store.scheme}://{bucket}/p/nothing",
                                      storage_options=opts)
    again = tune.Tuner.restore(uri, trainable=counting, resume_errored=True,
                               storage_options=opts).fit()
    assert not again.errors and again[0].metrics["i"] == 4
    direct = store.fs()
    assert [x["i"] for x in result_lines(direct, again[0].path)] == list(range(5))


def test_tune_run_on_s3_and_analysis_read_back(cluster, moto_s3, tmp_path):
    """``tune.run`` with an ``s3://`` storage_path returns an ExperimentAnalysis of the
    bucket; ``ExperimentAnalysis("s3://...")`` reads it back, checkpoints included."""
    bucket = moto_s3.new_bucket()
    fs = s3_fs(moto_s3.endpoint)
    analysis = tune.run(counting, config={"lr": tune.grid_search([1.0, 2.0]), "iters": 3},
                        metric="score", mode="max", storage_path=f"s3://{bucket}/p",
                        storage_filesystem=fs, name="legacy", verbose=0)
    uri = f"s3://{bucket}/p/legacy"
    assert analysis.experiment_path == uri
    assert analysis.best_config["lr"] == 2.0 and analysis.best_result["score"] == 4.0
    read = tune.ExperimentAnalysis(uri, storage_filesystem=fs)
    assert read.best_config["lr"] == 2.0  # metric and mode as the run saved them
    assert sorted(len(df) for df in read.trial_dataframes.values()) == [3, 3]
    out = read.best_checkpoint.to_directory(str(tmp_path / "best"))
    assert json.load(open(os.path.join(out, "state.json")))["i"] == 2


def test_analysis_of_a_local_experiment_uploaded_to_s3(local_client, moto_s3, tmp_path):
    """An experiment run on local disk, then copied to a bucket: read from the bucket
    (storage_options alone), its trials' files and checkpoints are found where they are now."""
    local = tmp_path / "results"
    tune.run(counting, config={"lr": tune.grid_search([1.0, -1.0]), "iters": 3},
             storage_path=str(local), name="moved", verbose=0)
    bucket = moto_s3.new_bucket()
    s3_fs(moto_s3.endpoint).put(str(local / "moved"), f"{bucket}/copied/moved",
                                recursive=True)
    import shutil

    shutil.rmtree(local)  # only the bucket has it now
    read = tune.ExperimentAnalysis(f"s3://{bucket}/copied/moved",
                                   storage_options=s3_options(moto_s3.endpoint),
                                   default_metric="score", default_mode="min")
    assert read.best_config["lr"] == -1.0
    assert all(t.path.startswith(f"{bucket}/copied/moved/") for t in read.trials)
    assert sorted(len(df) for df in read.trial_dataframes.values()) == [3, 3]
    best = read.get_best_checkpoint(read.best_trial, "score", "min")  # i=2 scores -2
    out = best.to_directory(str(tmp_path / "best"))
    assert json.load(open(os.path.join(out, "state.json")))["i"] == 2
