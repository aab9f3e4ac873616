"""TensorBoard event files read back with TensorBoard's own readers (issue 8).

Scalars of every numeric metric at their ``training_iteration``, and the trial's
hyperparameters in the HParams plugin's records, so the HParams tab compares trials.
"""

from __future__ import annotations

import os

import pytest

import dasktune as tune


def train(config):
    for i in range(1, 4):
        tune.report({"loss": config["lr"] * i, "acc": 1.0 / i, "note": "text is skipped"})


def test_scalars_and_hparams_read_back(local_client, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer
    from tensorboard.plugins.hparams import metadata

    results = tune.Tuner(
        train, param_space={"lr": tune.grid_search([0.1, 0.2]), "arch": "mlp",
                            "opt": {"name": "sgd"}},
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=tune.RunConfig(name="tb", storage_path=str(tmp_path), verbose=0),
    ).fit()
    assert results.num_terminated == 2

    for r in results:
        acc = EventAccumulator(r.path)
        acc.Reload()
        assert {"ray/tune/loss", "ray/tune/acc"} <= set(acc.Tags()["scalars"])
        assert not any("note" in tag for tag in acc.Tags()["scalars"])
        loss = acc.Scalars("ray/tune/loss")
        assert [e.step for e in loss] == [1, 2, 3]
        assert [e.value for e in loss] == pytest.approx([r.config["lr"] * i for i in (1, 2, 3)])

    # The HParams plugin's view of the whole experiment folder: one session per trial,
    # with that trial's hyperparameters (nested keys flattened as Ray does).
    mux = EventMultiplexer()
    mux.AddRunsFromDirectory(results.experiment_path)
    mux.Reload()
    runs = mux.PluginRunToTagToContent(metadata.PLUGIN_NAME)
    sessions = {}
    for run, tags in runs.items():
        if metadata.SESSION_START_INFO_TAG in tags:
            info = metadata.parse_session_start_info_plugin_data(
                tags[metadata.SESSION_START_INFO_TAG])
            sessions[os.path.basename(run)] = {
                k: (v.number_value if v.HasField("number_value") else v.string_value)
                for k, v in info.hparams.items()}
    assert len(sessions) == 2, runs
    by_dir = {os.path.basename(r.path): r for r in results}
    for run, hp in sessions.items():
        r = by_dir[run]
        assert hp["lr"] == pytest.approx(r.config["lr"])
        assert hp["arch"] == "mlp" and hp["opt/name"] == "sgd"
