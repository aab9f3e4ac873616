"""``TuneConfig(reuse_actors=True)``: a class Trainable's instance takes the next trial
through ``reset_config`` (Ray's semantics); ``False`` from it, or reuse off, builds a
fresh instance (``setup`` again, ``cleanup`` of the old one)."""

from __future__ import annotations

import uuid

import dasktune as tune


class Tracked(tune.Trainable):
    """Tags each instance it builds, to tell reused instances from fresh ones."""

    def setup(self, config):
        self.uid = uuid.uuid4().hex  # one per instance built
        self.value = config["x"]

    def step(self):
        return {"x": self.value, "uid": self.uid, "it": self.iteration,
                "trial": self.trial_id}

    def reset_config(self, new_config):
        self.value = new_config["x"]
        return self.config.get("reusable", True)


def _fit(storage_path, reuse, reusable=True, n=6):
    return tune.Tuner(
        Tracked, param_space={"x": tune.grid_search(list(range(n))), "reusable": reusable},
        tune_config=tune.TuneConfig(reuse_actors=reuse, max_concurrent_trials=2),
        run_config=tune.RunConfig(storage_path=storage_path, verbose=0,
                                  stop={"training_iteration": 3}),
    ).fit()


def test_instances_are_reused_through_reset_config(local_client, storage_path):
    results = _fit(storage_path, reuse=True)
    assert results.num_terminated == 6 and not results.errors
    uids = {r.metrics["uid"] for r in results}
    assert len(uids) < 6, "no instance was reused"
    for r in results:
        # A reused instance got this trial's config, id and fresh counters.
        assert r.metrics["x"] == r.config["x"]
        assert r.metrics["trial"] == r.metrics["trial_id"]
        assert r.metrics["it"] == 2 and r.metrics["training_iteration"] == 3


def test_reset_config_false_or_reuse_off_builds_fresh_instances(local_client, storage_path):
    for results in (_fit(storage_path, reuse=True, reusable=False, n=4),
                    _fit(storage_path, reuse=False, n=4)):
        assert results.num_terminated == 4
        assert len({r.metrics["uid"] for r in results}) == 4
        assert all(r.metrics["x"] == r.config["x"] for r in results)
