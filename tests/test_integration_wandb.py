"""Weights & Biases in offline mode (no network): ``WandbLoggerCallback`` on the driver
and ``setup_wandb`` in trials, checked in the run files W&B writes.

W&B keeps an offline run in ``wandb/offline-run-<time>-<id>/run-<id>.wandb``: a
LevelDB-style log of W&B's protobuf ``Record`` messages (the format ``wandb sync``
uploads). :func:`read_run` reads it back with W&B's own protobuf classes.
"""

from __future__ import annotations

import glob
import json
import os
import struct

import pytest

import dasktune as tune

pytestmark = pytest.mark.slow
wandb = pytest.importorskip("wandb")
from wandb.proto import wandb_internal_pb2  # noqa: E402

from dasktune.integration.wandb import WandbLoggerCallback  # noqa: E402

_BLOCK, _HEADER = 32768, 7  # LevelDB log blocks; W&B's header: ":W&B", magic, version


def read_run(folder: str, run_id: str) -> dict:
    """What W&B recorded for run ``run_id`` under ``folder``."""
    (path,) = glob.glob(os.path.join(folder, "wandb", f"offline-run-*-{run_id}",
                                     f"run-{run_id}.wandb"))
    data = open(path, "rb").read()
    assert data[:4] == b":W&B"
    pos, pending, records = _HEADER, b"", []
    while pos + 7 <= len(data):
        if _BLOCK - pos % _BLOCK < 7:  # a block's tail too short for a header: padding
            pos += _BLOCK - pos % _BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:
            break
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    out: dict = {"config": {}, "history": [], "exit": None, "artifacts": []}
    for rec in records:
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            out.update(id=rec.run.run_id, name=rec.run.display_name, project=rec.run.project,
                       group=rec.run.run_group)
            out["config"].update({i.key: json.loads(i.value_json) for i in rec.run.config.update})
        elif kind == "config":
            out["config"].update({i.key: json.loads(i.value_json) for i in rec.config.update})
        elif kind == "history":
            out["history"].append({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                                   for i in rec.history.item})
        elif kind == "exit":
            out["exit"] = rec.exit.exit_code
        elif kind == "artifact":
            out["artifacts"].append(rec.artifact.name)
    return out


def train(config):
    for step in range(3):
        tune.report({"loss": config["x"] / (step + 1), "secret": 1, "nested": {"acc": step},
                     "note": "text"}, **({"checkpoint": _checkpoint(step)} if step == 2 else {}))
    if config["fail"]:
        raise RuntimeError("this trial fails")


def _checkpoint(step):
    import tempfile

    folder = tempfile.mkdtemp()
    with open(os.path.join(folder, "state.txt"), "w") as f:
        f.write(str(step))
    return tune.Checkpoint.from_directory(folder)


def test_logger_callback_writes_one_offline_run_per_trial(local_client, storage_path,
                                                          monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    grid = tune.Tuner(
        train, param_space={"x": tune.grid_search([1.0, 2.0]), "fail": tune.grid_search(
            [False, True])},
        run_config=tune.RunConfig(storage_path=storage_path, name="wb", callbacks=[
            WandbLoggerCallback(project="proj", excludes=["secret"], upload_checkpoints=True)]),
    ).fit()
    assert len(grid) == 4 and grid.num_errors == 2
    for result in grid:
        trial_id = result.metrics["trial_id"]
        run = read_run(result.path, trial_id)
        assert (run["id"], run["project"], run["group"]) == (trial_id, "proj", "wb")
        assert run["name"].startswith(f"trial_{trial_id}")
        assert run["config"]["x"] == result.config["x"]
        assert run["config"]["trial_id"] == trial_id  # Ray's AUTO_CONFIG_KEYS: config
        assert [h["loss"] for h in run["history"]] == \
            [result.config["x"] / (s + 1) for s in range(3)]
        assert [h["_step"] for h in run["history"]] == [1, 2, 3]  # training_iteration
        assert [h["nested/acc"] for h in run["history"]] == [0, 1, 2]
        for h in run["history"]:
            assert not {"secret", "done", "note", "config/x", "trial_id"} & set(h), h
        assert run["exit"] == (1 if result.config["fail"] else 0)
        assert run["artifacts"] == [f"checkpoint_{run['name']}".replace("=", "_")
                                    .replace(",", "_")]


def train_with_setup(config):
    from dasktune.integration.wandb import setup_wandb

    run = setup_wandb(config, project="own", mode="offline",
                      dir=tune.get_context().get_trial_dir())
    for step in range(3):
        run.log({"metric": config["x"] * step})
        tune.report({"loss": config["x"]})


def test_setup_wandb_in_trials_runs_offline_and_ends_with_the_trial(local_client,
                                                                    storage_path):
    grid = tune.Tuner(train_with_setup, param_space={"x": tune.grid_search([1, 2])},
                      run_config=tune.RunConfig(storage_path=storage_path,
                                                name="wb-setup")).fit()
    assert grid.num_errors == 0, grid.errors
    for result in grid:
        trial_id = result.metrics["trial_id"]
        run = read_run(result.path, trial_id)
        assert (run["id"], run["project"], run["group"]) == (trial_id, "own", "wb-setup")
        assert run["config"]["x"] == result.config["x"]
        assert [h["metric"] for h in run["history"]] == [result.config["x"] * s
                                                         for s in range(3)]
        assert run["exit"] == 0  # finished when the trial ended


def test_logger_callback_needs_a_project(local_client, storage_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_PROJECT_NAME", raising=False)
    with pytest.raises(ValueError, match="project"):
        tune.Tuner(train, param_space={"x": 1.0, "fail": False}, run_config=tune.RunConfig(
            storage_path=storage_path, name="nop", callbacks=[WandbLoggerCallback()])).fit()
