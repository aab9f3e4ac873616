"""More of the Ray Tune facade a migrating script relies on: checkpoint metadata,
``SyncConfig``, ``PlacementGroupFactory`` and the progress reporters (``CLIReporter``,
``JupyterNotebookReporter``, a user's own ``ProgressReporter``)."""

from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
import uuid
import warnings

import cloudpickle
import fsspec
import pytest

import dasktune as tune
from dasktune import config as config_module
from dasktune.storage import ExperimentStorage
from dasktune.trial import ERROR, PENDING, RUNNING, TERMINATED, Trial


def fit(trainable, storage_path, param_space=None, tc=None, name="exp", **rc):
    rc.setdefault("verbose", 0)
    run_config = tune.RunConfig(name=name, storage_path=storage_path, **rc)
    return tune.Tuner(trainable, param_space=param_space or {},
                      tune_config=tune.TuneConfig(**(tc or {})), run_config=run_config).fit()


# ------------------------------------------------------------------ checkpoint metadata
def _check_metadata_roundtrip(ckpt: tune.Checkpoint, read_file, dest: str) -> None:
    assert ckpt.get_metadata() == {}
    ckpt.set_metadata({"epoch": 3, "note": "first"})
    assert ckpt.get_metadata() == {"epoch": 3, "note": "first"}
    assert json.loads(read_file(".metadata.json")) == {"epoch": 3, "note": "first"}  # Ray's file
    ckpt.update_metadata({"note": "second", "best": 0.5})
    assert ckpt.get_metadata() == {"epoch": 3, "note": "second", "best": 0.5}
    ckpt.set_metadata({"only": True})  # set replaces
    assert ckpt.get_metadata() == {"only": True}
    with pytest.raises(TypeError):
        ckpt.set_metadata({"bad": object()})  # not JSON: nothing is written
    with pytest.raises(TypeError, match="must be a dict"):
        ckpt.update_metadata([("a", 1)])  # type: ignore[arg-type]
    assert ckpt.get_metadata() == {"only": True}
    # the metadata travels with the files, as in Ray
    copy = ckpt.to_directory(dest)
    assert tune.Checkpoint.from_directory(copy).get_metadata() == {"only": True}
    assert open(os.path.join(copy, "model.txt")).read() == "weights"


def test_checkpoint_metadata_in_a_local_folder(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "model.txt").write_text("weights")
    ckpt = tune.Checkpoint.from_directory(str(folder))
    _check_metadata_roundtrip(ckpt, lambda name: (folder / name).read_text(),
                              str(tmp_path / "copy"))
    assert sorted(os.listdir(folder)) == [".metadata.json", "model.txt"]  # no temp files left


def test_checkpoint_metadata_in_an_fsspec_store(tmp_path):
    root = f"memory://h4-{uuid.uuid4().hex[:8]}/ckpt"
    fs, path = fsspec.core.url_to_fs(root)
    fs.pipe_file(f"{path}/model.txt", b"weights")
    ckpt = tune.Checkpoint(root)
    _check_metadata_roundtrip(ckpt, lambda name: fs.cat_file(f"{path}/{name}").decode(),
                              str(tmp_path / "copy"))
    again = tune.Checkpoint(root)  # another handle (another process) reads the same
    assert again.get_metadata() == {"only": True}


@pytest.mark.parametrize("where", ["local", "memory"])
def test_metadata_of_a_committed_checkpoint(tmp_path, where):
    root = str(tmp_path / "results") if where == "local" else \
        f"memory://h4-{uuid.uuid4().hex[:8]}/results"
    store = ExperimentStorage(root, "exp")
    src = tmp_path / "src"
    src.mkdir()
    (src / "model.txt").write_text("weights")
    tune.Checkpoint.from_directory(str(src)).set_metadata({"step": 1})
    path = store.commit_checkpoint(str(src), store.trial_path("t_0"), 0,
                                   {"training_iteration": 1})
    ckpt = tune.Checkpoint(path, store.fs)
    assert ckpt.get_metadata() == {**ckpt.get_metadata(), "step": 1, "training_iteration": 1}
    ckpt.update_metadata({"tag": "a much longer value than before"})
    assert store.is_committed(path)  # the manifest knows the metadata file's new size
    assert ckpt.get_metadata()["tag"] == "a much longer value than before"
    assert json.loads(store.fs.cat_file(f"{path}/.metadata.json")) == \
        {"step": 1, "tag": "a much longer value than before"}


def _train_with_metadata(config):
    start = 0
    ckpt = tune.get_checkpoint()
    if ckpt is not None:
        start = ckpt.get_metadata()["step"]
    for step in range(start + 1, start + 3):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "w.txt"), "w") as f:
                f.write(str(step))
            out = tune.Checkpoint.from_directory(d)
            out.set_metadata({"step": step, "lr": config["lr"]})
            tune.report({"loss": 1.0 / step}, checkpoint=out)


def test_metadata_set_in_a_trial_comes_back_with_the_result(local_client, storage_path):
    results = fit(_train_with_metadata, storage_path, param_space={"lr": 0.1})
    assert not results.errors
    ckpt = results[0].checkpoint
    meta = ckpt.get_metadata()
    assert meta["step"] == 2 and meta["lr"] == 0.1
    assert meta["training_iteration"] == 2  # what dasktune records at commit is there too
    # changing the metadata of a committed checkpoint keeps it valid for restore
    ckpt.update_metadata({"tag": "best"})
    store = ExperimentStorage(storage_path, "exp")
    assert store.is_committed(ckpt.path)
    assert tune.Checkpoint(ckpt.path).get_metadata()["tag"] == "best"


# ------------------------------------------------------------------ SyncConfig
@pytest.fixture
def fresh_sync_warnings(monkeypatch):
    monkeypatch.setattr(config_module, "_SYNC_WARNED", set())


def test_sync_config_is_accepted_and_changes_nothing(local_client, storage_path,
                                                     fresh_sync_warnings):
    def train(config):
        tune.report({"loss": config["x"]})

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the options that change nothing stay quiet
        sync = tune.SyncConfig(sync_period=1, sync_timeout=10, sync_artifacts_on_checkpoint=False)
        results = fit(train, storage_path, param_space={"x": 2.0}, sync_config=sync)
    assert not results.errors and results[0].metrics["loss"] == 2.0
    assert tune.RunConfig().sync_config == tune.SyncConfig()
    with pytest.raises(TypeError, match="sync_config must be a tune.SyncConfig"):
        tune.RunConfig(sync_config={"sync_period": 1})
    with pytest.raises(ValueError, match="sync_period"):
        tune.SyncConfig(sync_period=-1)


def test_sync_options_that_would_change_behaviour_warn_once(fresh_sync_warnings):
    with pytest.warns(UserWarning, match="sync_artifacts=True\\) has no effect"):
        tune.RunConfig(sync_config=tune.SyncConfig(sync_artifacts=True))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        tune.SyncConfig(sync_artifacts=True)
    assert seen == []
    with pytest.warns(UserWarning, match="upload_dir=...\\) is ignored"):
        tune.SyncConfig(upload_dir="s3://bucket/x")


# ------------------------------------------------------------------ PlacementGroupFactory
def test_placement_group_factory_sums_its_bundles():
    pgf = tune.PlacementGroupFactory([{"CPU": 2, "GPU": 1}, {"CPU": 1}])
    assert pgf.required_resources == {"CPU": 3.0, "GPU": 1.0}
    assert dict(pgf) == {"CPU": 3.0, "GPU": 1.0}
    assert pgf.bundles == [{"CPU": 2, "GPU": 1}, {"CPU": 1}] and pgf.strategy == "PACK"
    assert pgf == tune.PlacementGroupFactory([{"CPU": 2, "GPU": 1}, {"CPU": 1}])
    assert tune.PlacementGroupFactory([{"CPU": 0}, {"CPU": 1}]).head_bundle_is_empty
    for bad in ([], {"CPU": 1}, [{"CPU": -1}], [{"CPU": "two"}], ["CPU"]):
        with pytest.raises(ValueError, match="PlacementGroupFactory"):
            tune.PlacementGroupFactory(bad)
    with pytest.raises(ValueError, match="strategy"):
        tune.PlacementGroupFactory([{"CPU": 1}], strategy="ANYWHERE")


class _PGFTrainable(tune.Trainable):
    @classmethod
    def default_resource_request(cls, config):
        return tune.PlacementGroupFactory([{"CPU": 0.25}, {"CPU": 0.25}])

    def step(self):
        return {"cpu": tune.get_context().get_trial_resources()["CPU"], "done": True}


def test_with_resources_takes_a_placement_group_factory(local_client, storage_path):
    def train(config):
        tune.report({"cpu": tune.get_context().get_trial_resources()["CPU"]})

    pgf = tune.PlacementGroupFactory([{"CPU": 0.5}, {"CPU": 0.5}])
    results = fit(tune.with_resources(train, pgf), storage_path)
    assert not results.errors
    assert results[0].metrics["cpu"] == 1.0  # both bundles, not the first only
    per_config = fit(tune.with_resources(
        train, lambda config: tune.PlacementGroupFactory([{"CPU": 0.5}] * config["n"])),
        storage_path, name="exp2", param_space={"n": 1})
    assert per_config[0].metrics["cpu"] == 0.5
    cls_results = fit(_PGFTrainable, storage_path, name="exp3")
    assert cls_results[0].metrics["cpu"] == 0.5


# ------------------------------------------------------------------ progress reporters
def _trials() -> list[Trial]:
    out = []
    for i, (status, loss) in enumerate([(TERMINATED, 3.0), (RUNNING, 1.0), (ERROR, 2.0),
                                        (PENDING, None)]):
        t = Trial(trial_id=f"t_{i}", config={"lr": 0.1 * (i + 1), "model": {"depth": i}})
        t.status = status
        if loss is not None:
            t.update_last_result({"training_iteration": i + 1, "loss": loss, "acc": 1 - loss / 4})
        out.append(t)
    return out


def _table(text: str) -> list[list[str]]:
    """The table's rows, header first (after the summary and progress-bar lines)."""
    lines = text.strip().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("trial "))
    return [line.split() for line in lines[start:]]


def test_cli_reporter_columns_rows_and_sorting():
    rep = tune.CLIReporter(metric_columns={"loss": "Loss", "acc": "Accuracy"},
                           parameter_columns=["lr", "model/depth"], max_progress_rows=3,
                           metric="loss", mode="min", sort_by_metric=True,
                           max_report_frequency=0)
    rep.out = io.StringIO()
    rep.final(_trials())
    rows = _table(rep.out.getvalue())
    assert rows[0] == ["trial", "status", "lr", "model/depth", "iter", "Loss", "Accuracy",
                       "worker"]
    assert [r[1] if r[0] == "*" else r[0] for r in rows[1:4]] == ["t_1", "t_2", "t_0"]  # best first
    assert rows[1][:4] == ["*", "t_1", "RUNNING", "0.2"] and rows[1][-2:] == ["1", "0.75"]
    assert rows[-1] == ["+1", "more"]  # max_progress_rows
    assert "best loss=1" in rep.out.getvalue() and "finished" in rep.out.getvalue()

    by_status = tune.CLIReporter(metric_columns=["loss"], metric="loss", mode="min",
                                 max_report_frequency=0)  # sort_by_metric=False: Ray's default
    by_status.out = io.StringIO()
    by_status.final(_trials())
    ids = [next(c for c in r if c.startswith("t_")) for r in _table(by_status.out.getvalue())[1:]]
    assert ids == ["t_1", "t_3", "t_0", "t_2"]  # RUNNING, PENDING, TERMINATED, ERROR
    by_status.add_metric_column("acc", "A")
    by_status.add_parameter_column("lr")
    assert _table(by_status._table.render(_trials()))[0][2:6] == ["lr", "iter", "loss", "A"]
    with pytest.raises(ValueError, match="already"):
        by_status.add_metric_column("acc")


def test_cli_reporter_rate_limit_and_argument_checks():
    rep = tune.CLIReporter(max_report_frequency=3600)
    rep.out = io.StringIO()
    for _ in range(3):
        rep.maybe_report(_trials())
    assert rep.out.getvalue().count("== dasktune") == 1  # max_report_frequency
    rep.final(_trials())  # the end is always shown
    assert rep.out.getvalue().count("== dasktune") == 2
    with pytest.raises(ValueError, match="mode"):
        tune.CLIReporter(mode="best")
    with pytest.raises(ValueError, match="max_progress_rows"):
        tune.CLIReporter(max_progress_rows=0)
    with pytest.raises(TypeError, match="metric_columns"):
        tune.CLIReporter(metric_columns="loss")
    with pytest.raises(TypeError, match="progress_reporter must be"):
        tune.RunConfig(progress_reporter=object())
    # outside a notebook the Jupyter reporter prints the same table
    jup = tune.JupyterNotebookReporter(overwrite=False, parameter_columns=["lr"],
                                       max_report_frequency=0)
    jup.out = io.StringIO()
    jup.final(_trials())
    assert _table(jup.out.getvalue())[0][:3] == ["trial", "status", "lr"]


def _train_steps(config):
    for step in range(1, 4):
        tune.report({"loss": config["lr"] * step, "acc": step / 3})


def test_cli_reporter_in_a_run(local_client, storage_path, capsys):
    rep = tune.CLIReporter(metric_columns={"loss": "Loss"}, parameter_columns={"lr": "LR"},
                           max_report_frequency=0, metric="loss", mode="min")
    results = fit(_train_steps, storage_path, param_space={"lr": tune.grid_search([0.1, 0.2])},
                  progress_reporter=rep, verbose=None)
    assert not results.errors
    text = capsys.readouterr().out
    last = text[text.rindex("== dasktune"):]
    assert "2 TERMINATED" in last and "finished" in last and "best loss=0.3" in last
    rows = _table(last)
    assert rows[0] == ["trial", "status", "LR", "iter", "Loss", "worker"]
    cells = {tuple(r[r.index("TERMINATED") + 1:r.index("TERMINATED") + 4]) for r in rows[1:]}
    assert cells == {("0.1", "3", "0.3"), ("0.2", "3", "0.6")}  # LR, iter, Loss
    # the reporter is kept in tuner.pkl: it must survive pickling for restore
    with open(os.path.join(storage_path, "exp", "tuner.pkl"), "rb") as f:
        kept = cloudpickle.load(f)["run_config"].progress_reporter
    assert isinstance(kept, tune.CLIReporter) and kept.metric == "loss"


def test_verbose_zero_silences_a_given_reporter(local_client, storage_path, capsys):
    rep = tune.CLIReporter(max_report_frequency=0)
    results = fit(_train_steps, storage_path, param_space={"lr": 0.1}, progress_reporter=rep,
                  verbose=0)
    assert not results.errors
    assert "== dasktune" not in capsys.readouterr().out


class _Recorder(tune.ProgressReporter):
    """A Ray user's own reporter: only should_report and report."""

    def __init__(self):
        self.calls: list[tuple[bool, list[str]]] = []

    def should_report(self, trials, done=False):
        return True

    def report(self, trials, done, *sys_info):
        self.calls.append((done, sorted(t.status for t in trials)))


def test_a_users_own_progress_reporter(local_client, storage_path):
    rep = _Recorder()
    results = fit(_train_steps, storage_path, param_space={"lr": tune.grid_search([1, 2])},
                  progress_reporter=rep, verbose=None)
    assert not results.errors and rep.calls
    assert rep.calls[-1] == (True, [TERMINATED, TERMINATED])  # the last report says done
    assert all(not done for done, _ in rep.calls[:-1])


JUPYTER_CODE = r"""
import dasktune as tune
from dasktune.trial import Trial
trials = [Trial(f"t{i}", {"lr": i}) for i in range(2)]
rep = tune.JupyterNotebookReporter(overwrite=OVERWRITE, parameter_columns=["lr"],
                                   max_report_frequency=0)
for step in range(1, 3):
    for t in trials:
        t.set_status("RUNNING")
        t.update_last_result({"training_iteration": step, "loss": 1 / step})
    rep.maybe_report(trials)
rep.final(trials)
"""


def test_jupyter_reporter_updates_one_output_or_adds_new_ones():
    manager = pytest.importorskip("jupyter_client.manager")
    pytest.importorskip("ipykernel")
    km, kc = manager.start_new_kernel(kernel_name="python3", extra_arguments=[],
                                      startup_timeout=60)
    kinds: dict[bool, list[str]] = {}
    try:
        for overwrite in (True, False):
            msgs: list[dict] = []
            reply = kc.execute_interactive(JUPYTER_CODE.replace("OVERWRITE", str(overwrite)),
                                           timeout=60, output_hook=msgs.append)
            assert reply["content"]["status"] == "ok", reply["content"]
            kinds[overwrite] = [m["msg_type"] for m in msgs
                                if m["msg_type"] not in ("status", "execute_input")]
            shown = [m["content"]["data"]["text/plain"] for m in msgs
                     if m["msg_type"] in ("display_data", "update_display_data")]
            assert shown and "lr" in shown[-1] and "finished" in shown[-1]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    assert kinds[True] == ["display_data"] + ["update_display_data"] * 2
    assert kinds[False] == ["display_data"] * 3


def test_checkpoint_folders_the_caller_keeps_are_not_scratch(tmp_path, monkeypatch):
    """On a worker, dasktune's own temporary folders go in the worker's local directory
    (Dask removes it when the worker dies). A folder from ``to_directory()`` is the
    caller's to keep, so it never goes there, even where workers are threads of the
    driver; ``as_directory()``'s copy of a remote checkpoint does, and is removed on exit."""
    from dasktune import scratch

    worker_dir = tmp_path / "worker-local-dir"
    worker_dir.mkdir()
    monkeypatch.setattr(scratch, "_root", str(worker_dir))
    fs, path = fsspec.filesystem("memory"), f"/ckpt-{uuid.uuid4().hex}"
    fs.pipe(f"{path}/model.txt", b"weights")
    remote = tune.Checkpoint(path, fs)
    kept = remote.to_directory()
    try:
        assert not kept.startswith(str(worker_dir))
        assert open(os.path.join(kept, "model.txt")).read() == "weights"
    finally:
        shutil.rmtree(kept)
    with remote.as_directory() as local:
        assert local.startswith(str(worker_dir))
        assert open(os.path.join(local, "model.txt")).read() == "weights"
    assert not os.listdir(worker_dir)


def test_auto_result_keys_name_every_field_dasktune_fills():
    """One AUTO_RESULT_KEYS: a standalone Trainable.train() result holds the user's metric
    plus only keys listed there, and fill_auto_fields keeps a step's own timing."""
    import dasktune as tune
    from dasktune.result import AUTO_RESULT_KEYS, fill_auto_fields

    class T(tune.Trainable):
        def step(self):
            return {"score": 1.0, "time_this_iter_s": 7.0}

    result = T({"a": 1}).train()
    assert set(result) - set(AUTO_RESULT_KEYS) == {"score"}
    assert result["time_this_iter_s"] == 7.0 and result["training_iteration"] == 1
    filled = fill_auto_fields({"x": 1}, training_iteration=2, iterations_since_restore=1,
                              time_this_iter_s=0.5, time_total_s=1.5, time_since_restore=0.5,
                              timestamp=1e9, trial_id="t1", pid=1, hostname="h",
                              node_ip="10.0.0.1", config={}, experiment_tag="1_a=1",
                              worker="tcp://10.0.0.1:1")
    assert set(filled) - set(AUTO_RESULT_KEYS) == {"x"}
    assert filled["done"] is False and filled["time_this_iter_s"] == 0.5
    assert filled["timestamp"] == 1_000_000_000


# ------------------------------------------------------------------ metric/mode in one place
def test_metric_on_scheduler_and_in_tune_config_is_refused_before_any_trial(tmp_path):
    """Ray 2.60 (tune.run): a scheduler built with a metric or mode, and TuneConfig naming
    one too, is a ValueError, even when they agree; nothing runs, nothing is written."""
    from dasktune.schedulers import ASHAScheduler

    ran = []

    def trainable(config):
        ran.append(1)
        tune.report({"loss": 1.0})

    for tc in (dict(metric="loss", mode="min"), dict(metric="loss"), dict(mode="min")):
        with pytest.raises(ValueError, match=r"AsyncHyperBandScheduler.*already instantiated "
                                             r"with its own `metric` and `mode`"):
            fit(trainable, str(tmp_path), tc=dict(tc, scheduler=ASHAScheduler(
                metric="loss", mode="min")))
    assert ran == [] and not os.path.exists(tmp_path / "exp")
    # One place only is fine: on the scheduler, or in TuneConfig.
    from dasktune.tuner_build import make_scheduler

    sched = make_scheduler(tune.TuneConfig(scheduler=ASHAScheduler(metric="loss", mode="min")))
    assert (sched.metric, sched.mode) == ("loss", "min")
    sched = make_scheduler(tune.TuneConfig(metric="loss", mode="min", scheduler=ASHAScheduler()))
    assert (sched.metric, sched.mode) == ("loss", "min")


def test_searcher_metric_may_repeat_tune_config_but_not_contradict_it():
    """Ray's own optuna_define_by_run_example sets the same metric on OptunaSearch and in
    TuneConfig: accepted. A different one is refused (Ray would silently keep one)."""
    pytest.importorskip("optuna")
    from dasktune.search.optuna import OptunaSearch
    from dasktune.tuner_build import make_search_alg

    space = {"x": tune.uniform(0, 1)}
    same = tune.TuneConfig(metric="loss", mode="min",
                           search_alg=OptunaSearch(metric="loss", mode="min"))
    assert make_search_alg(same, space, "abcdef01").searcher.metric == "loss"
    other = tune.TuneConfig(metric="acc", mode="min",
                            search_alg=OptunaSearch(metric="loss", mode="min"))
    with pytest.raises(ValueError, match=r"contradicts the searcher's own metric='loss', "
                                         r"mode='min' \(OptunaSearch\)"):
        make_search_alg(other, space, "abcdef01")
