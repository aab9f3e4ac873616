"""ResourceChangingScheduler: live trials are resized between steps, re-placed, and see it.

The allocation functions against a context with known workers; then a real ``dask
scheduler`` + ``dask worker`` (4 CPUs): the top trial gets the free CPUs after a
checkpoint-restore and reads them from ``tune.get_context().get_trial_resources()``.
"""

from __future__ import annotations

import importlib
import json
import os
import tempfile
import time

import pytest

import dasktune as tune
from dasktune.execution.placement_groups import PlacementGroupFactory
from dasktune.schedulers import (
    ASHAScheduler,
    FIFOScheduler,
    Reconfigure,
    ResourceChangingScheduler,
    create_scheduler,
)
from dasktune.schedulers.resource_changing_scheduler import (
    DistributeResources,
    DistributeResourcesToTopJob,
)
from dasktune.schedulers.testing import SimpleContext
from dasktune.trial import RUNNING, Trial


class Cluster(SimpleContext):
    """A scheduler context over trials and workers of known sizes."""

    def __init__(self, trials, workers):
        super().__init__(trials)
        self.workers = workers

    def worker_resources(self):
        return {f"w{i}": dict(w) for i, w in enumerate(self.workers)}


def trials_on(n, scores=None):
    out = []
    for i in range(n):
        t = Trial(trial_id=f"t{i}", config={"i": i})
        t.status = RUNNING
        t.resources = {"CPU": 1.0}
        if scores is not None:
            t.last_result = {"training_iteration": 1, "acc": scores[i]}
        out.append(t)
    return out


def allocate(fn, ctx, trial):
    """The decision of a scheduler whose trials all started with 1 CPU."""
    sched = ResourceChangingScheduler(FIFOScheduler(), fn)
    sched.on_trial_add(ctx, trials_on(1)[0])  # the base: 1 CPU
    return sched.on_trial_result(ctx, trial, {"training_iteration": 1, "acc": 0.0})


def test_distribute_resources_shares_the_free_cpus_evenly():
    trials = trials_on(3)
    ctx = Cluster(trials, [{"CPU": 8}])
    # 8 CPUs, 3 trials of 1: 5 spare units, so at most ceil(5 / 3) = 2 more each.
    d = allocate(DistributeResources(), ctx, trials[0])
    assert d == Reconfigure(resources={"CPU": 3.0})
    trials[0].resources = {"CPU": 3.0}
    trials[1].resources = {"CPU": 3.0}
    assert allocate(DistributeResources(), ctx, trials[2]) == Reconfigure(resources={"CPU": 2.0})
    # Over-committed (a worker left): it gives back, but never below the base.
    ctx.workers = [{"CPU": 4}]
    assert allocate(DistributeResources(), ctx, trials[0]) == \
        Reconfigure(resources={"CPU": 1.0})
    # A result before the first iteration changes nothing.
    sched = ResourceChangingScheduler(FIFOScheduler(), DistributeResources())
    sched.on_trial_add(ctx, trials_on(1)[0])
    assert sched.on_trial_result(ctx, trials[2], {"training_iteration": 0}) == "CONTINUE"


def test_top_job_gets_all_free_cpus_up_to_one_worker():
    trials = trials_on(3, scores=[0.2, 0.9, 0.5])
    ctx = Cluster(trials, [{"CPU": 4}, {"CPU": 4}])
    top = DistributeResourcesToTopJob(metric="acc", mode="max")
    assert allocate(top, ctx, trials[0]) == "CONTINUE"  # not the top job: unchanged
    # 8 CPUs, 3 used: the top takes 5 more, but one worker has only 4.
    assert allocate(top, ctx, trials[1]) == Reconfigure(resources={"CPU": 4.0})
    assert allocate(DistributeResourcesToTopJob(metric="acc", mode="min"), ctx,
                    trials[0]) == Reconfigure(resources={"CPU": 4.0})
    limited = DistributeResourcesToTopJob(increase_by={"CPU": 1}, increase_by_times=2,
                                          metric="acc", mode="max")
    assert allocate(limited, ctx, trials[1]) == Reconfigure(resources={"CPU": 3.0})
    # Metric and mode come from the wrapped scheduler when the function has none.
    sched = ResourceChangingScheduler(ASHAScheduler(metric="acc", mode="max", max_t=10),
                                      DistributeResourcesToTopJob())
    for t in trials:
        sched.on_trial_add(ctx, t)  # all still at their base
    assert sched.on_trial_result(ctx, trials[1], {"training_iteration": 1, "acc": 0.9}) == \
        Reconfigure(resources={"CPU": 4.0})


def test_a_custom_function_rays_context_and_errors():
    trials = trials_on(2)
    ctx = Cluster(trials, [{"CPU": 3}])

    def half_of_the_cluster(tune_controller, trial, result, scheduler):
        assert scheduler.base_trial_resources.required_resources == {"CPU": 1.0}
        return PlacementGroupFactory([{"CPU": 1.5}])

    assert allocate(half_of_the_cluster, ctx, trials[0]) == Reconfigure(resources={"CPU": 1.5})
    # A trial runs on one worker: a request beyond the largest one is cut down to it.
    assert allocate(lambda *a: {"CPU": 8}, Cluster(trials, [{"CPU": 2}, {"CPU": 3}]),
                    trials[0]) == Reconfigure(resources={"CPU": 3.0})
    assert allocate(lambda *a: {"CPU": 2, "GPU": 1}, Cluster(trials, [{"CPU": 3}]),
                    trials[0]) == "CONTINUE"  # no worker has a GPU: left as it is
    assert allocate(lambda *a: None, ctx, trials[0]) == "CONTINUE"
    odd = Trial(trial_id="odd", config={})
    odd.resources = {"CPU": 2.0}
    sched = ResourceChangingScheduler()
    sched.on_trial_add(ctx, trials[0])
    with pytest.raises(RuntimeError, match="same resources"):
        sched.on_trial_add(ctx, odd)
    with pytest.raises(ValueError, match="needs a metric and a mode"):
        allocate(DistributeResourcesToTopJob(), ctx, trials[0])
    with pytest.warns(UserWarning, match="resources_allocation_function is None"):
        ResourceChangingScheduler(resources_allocation_function=None)
    assert isinstance(create_scheduler("resource_changing"), ResourceChangingScheduler)
    assert importlib.import_module("dasktune.execution.placement_groups") \
        .PlacementGroupFactory is tune.PlacementGroupFactory


def test_reuse_actors_is_refused_before_anything_runs_and_trials_have_rays_pgf(tmp_path):
    # Ray: "ResourceChangingScheduler cannot be used with `reuse_actors=True`" (Ray says
    # so in fit(); here at Tuner(), so nothing is written).
    with pytest.raises(ValueError, match="cannot be used with `reuse_actors=True`"):
        tune.Tuner(lambda config: None, tune_config=tune.TuneConfig(
            scheduler=ResourceChangingScheduler(), reuse_actors=True),
            run_config=tune.RunConfig(storage_path=str(tmp_path), name="refused"))
    assert not (tmp_path / "refused").exists()
    tune.Tuner(lambda config: None, tune_config=tune.TuneConfig(
        scheduler=ASHAScheduler(metric="a", mode="max"), reuse_actors=True),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="asha"))
    # Ray's Trial.placement_group_factory: what an allocation function compares against.
    t = trials_on(1)[0]
    t.resources = {"CPU": 3.0, "GPU": 1.0}
    assert t.placement_group_factory == PlacementGroupFactory([{"CPU": 3.0, "GPU": 1.0}])
    assert t.placement_group_factory.required_resources == {"CPU": 3.0, "GPU": 1.0}


def train(config):
    """Checkpoints every step and resumes from it; reports the CPUs it was given. The
    "other" trial starts reporting only after the "top" one has reported once, so the top
    trial is the best from the first ranking on."""
    step = 0
    ckpt = tune.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d, open(os.path.join(d, "state.json")) as f:
            step = json.load(f)["step"]
    marker = config["marker"]
    if config["role"] == "other":
        deadline = time.monotonic() + 60
        while not os.path.exists(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
    while step < config["steps"]:
        step += 1
        time.sleep(0.1)
        resources = tune.get_context().get_trial_resources()
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "state.json"), "w") as f:
                json.dump({"step": step}, f)
            tune.report({"acc": step * (2.0 if config["role"] == "top" else 1.0),
                         "cpus": resources.head_cpus, "cpu_key": resources["CPU"],
                         "step": step, "wall": time.time()},
                        checkpoint=tune.Checkpoint.from_directory(d))
        if config["role"] == "top":
            open(marker, "w").close()


@pytest.mark.slow
def test_the_top_trial_gets_the_free_cpus_and_sees_them(dask_processes, connect, tmp_path):
    procs = dask_processes(n_workers=1, nthreads=4, resources="CPU=4")
    connect(procs.address)
    scheduler = ResourceChangingScheduler(
        base_scheduler=FIFOScheduler(),
        resources_allocation_function=DistributeResourcesToTopJob(metric="acc", mode="max"))
    grid = tune.Tuner(
        tune.with_resources(train, PlacementGroupFactory([{"CPU": 1}])),
        param_space={"role": tune.grid_search(["top", "other"]), "steps": 12,
                     "marker": str(tmp_path / "top-reported")},
        tune_config=tune.TuneConfig(scheduler=scheduler),
        run_config=tune.RunConfig(storage_path=str(tmp_path / "results"), verbose=0),
    ).fit()
    assert not grid.errors, grid.errors
    rows = {r.config["role"]: r.metrics_dataframe.sort_values("step") for r in grid}
    top, other = rows["top"], rows["other"]
    # Every step ran once, in order, across the restore (it resumed from its checkpoint).
    assert list(top["step"]) == list(range(1, 13)) and list(other["step"]) == \
        list(range(1, 13))
    # The top trial started with its 1 CPU and, restored after its first step, had the
    # 3 the other trial left free; the trial itself saw it (head_cpus and ["CPU"]).
    assert top["cpus"].iloc[0] == 1.0
    assert set(top["cpus"].iloc[1:]) == {3.0}
    assert list(top["cpu_key"]) == list(top["cpus"])
    # The other trial kept its 1 CPU while the top one was running.
    # (by the trials' own clock: Ray's "timestamp" is whole seconds, too coarse here)
    top_end = top["wall"].max()
    assert set(other[other["wall"] < top_end]["cpus"]) == {1.0}


def test_state_round_trips_with_the_wrapped_schedulers(tmp_path):
    trials = trials_on(2, scores=[0.1, 0.9])
    ctx = Cluster(trials, [{"CPU": 4}])
    sched = ResourceChangingScheduler(
        ASHAScheduler(metric="acc", mode="max", max_t=10),
        DistributeResourcesToTopJob())
    for t in trials:
        sched.on_trial_add(ctx, t)
    assert sched.on_trial_result(ctx, trials[1], {"training_iteration": 1, "acc": 0.9}) == \
        Reconfigure(resources={"CPU": 3.0})
    sched.save(str(tmp_path / "rcs.pkl"))
    fresh = ResourceChangingScheduler(ASHAScheduler(metric="acc", mode="max", max_t=10),
                                      DistributeResourcesToTopJob())
    fresh.restore(str(tmp_path / "rcs.pkl"))
    mine, theirs = fresh.get_state(), sched.get_state()
    assert mine.pop("_base")["_trial_bracket"] == theirs.pop("_base")["_trial_bracket"]
    assert mine == theirs and mine["_reallocated_trial_ids"] == {"t1"}
    assert fresh.base_trial_resources.required_resources == {"CPU": 1.0}
    trials[1].resources = {"CPU": 3.0}  # as the driver left it; a restore re-adds it
    fresh.on_trial_add(ctx, trials[1])
