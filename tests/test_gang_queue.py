"""The driver's gang decisions (``dasktune.driver.gang_queue``) on the simulated executor:
first come first served, refusals, the learnt shape and the up-front split."""

from __future__ import annotations

from dasktune.config import PlacementGroupFactory
from dasktune.driver.gang_queue import GangQueue, GangShape, split_gang_request
from dasktune.execution import GangRequest
from dasktune.execution.simulated import SimulatedExecutor
from dasktune.trial import Placement, Trial

ONE = {"CPU": 1.0}


class Recording(SimulatedExecutor):
    """The simulated executor, noting what the driver grants and refuses."""

    def __init__(self, n: int):
        super().__init__(n, trial_model=lambda config, trial_id: [])
        self.granted: list[tuple[str, str]] = []
        self.refused: list[tuple[str, str]] = []

    def grant_workers(self, trial_id, bundles, strategy, workers, request_id=""):
        self.granted.append((trial_id, request_id))
        return super().grant_workers(trial_id, bundles, strategy, workers, request_id)

    def refuse_workers(self, trial_id, request_id, why):
        self.refused.append((trial_id, why))


def waiting_trial(trial_id: str) -> Trial:
    trial = Trial(trial_id, {})
    trial.placements.append(Placement(1, "sim://worker-0000", "", 0.0))
    trial.resources = {"CPU": 0.0}  # its own slot is lent while it waits
    return trial


def test_a_big_gang_is_not_overtaken_by_smaller_ones():
    executor = Recording(4)
    queue = GangQueue(executor)
    big, small = waiting_trial("big"), waiting_trial("small")
    taken = executor.grant_workers("other", [ONE, ONE], "PACK", executor.place_gang([ONE, ONE]))
    assert queue.want(big, GangRequest("r1", [ONE] * 3)) is True  # the shape, learnt
    assert queue.want(small, GangRequest("r2", [ONE])) is False
    assert queue.shape == GangShape([ONE] * 3, "PACK")
    # Two workers free: the small request would fit, but the big one came first.
    assert queue.grant_waiting() is True
    assert [t for t, _ in executor.granted] == ["other"] and queue.waiting == 2
    executor.release_gang(taken.gang_id)
    assert queue.grant_waiting() is False
    assert [r for _, r in executor.granted[1:]] == ["r1", "r2"]


def test_a_request_that_can_never_fit_is_refused_and_does_not_block_the_rest():
    executor = Recording(3)
    queue = GangQueue(executor)
    never, fine = waiting_trial("never"), waiting_trial("fine")
    queue.want(never, GangRequest("r1", [ONE] * 5))
    queue.want(fine, GangRequest("r2", [ONE] * 2))
    assert queue.grant_waiting() is False
    assert [t for t, _ in executor.refused] == ["never"]
    assert "can never be placed" in executor.refused[0][1]
    assert executor.granted == [("fine", "r2")]


def test_withdrawn_requests_and_ended_attempts_leave_the_queue():
    executor = Recording(1)
    queue = GangQueue(executor)
    a, b = waiting_trial("a"), waiting_trial("b")
    queue.want(a, GangRequest("r1", [ONE] * 2))
    queue.want(b, GangRequest("r2", [ONE] * 2))
    queue.withdraw("a", "r1")
    queue.withdraw("b")
    assert queue.waiting == 0


def test_on_an_elastic_cluster_the_first_waiting_gang_is_shown_as_demand():
    executor = Recording(2)
    queue = GangQueue(executor, can_scale=True)
    big, small = waiting_trial("big"), waiting_trial("small")
    queue.want(big, GangRequest("r1", [ONE] * 3))  # more than the workers here
    queue.want(small, GangRequest("r2", [ONE]))
    assert queue.grant_waiting() is True
    # Not refused: the cluster may grow by the one worker it lacks; the later request
    # waits its turn and shows nothing.
    assert executor.refused == [] and executor.demanded == {"big": 1}
    executor.add_worker("sim://worker-0002", ONE)
    # Granted (its demand withdrawn); now the next one waits, and is shown.
    assert queue.grant_waiting() is True
    assert executor.granted == [("big", "r1")] and executor.demanded == {"small": 1}
    queue.withdraw("small", "r2")  # its request timed out: its demand goes with it
    assert queue.waiting == 0 and executor.demanded == {}


def test_scaling_configs_split_into_the_trials_own_bundle_and_its_gang():
    class Scaling:
        def as_placement_group_factory(self):
            return PlacementGroupFactory([{"CPU": 1}, {"gpu": 1}, {"gpu": 1}], "SPREAD")

    head, shape = split_gang_request(Scaling())
    assert head == {"CPU": 1}
    assert shape == GangShape([{"CPU": 1.0, "GPU": 1.0}] * 2, "SPREAD")
    # A plain PlacementGroupFactory keeps its meaning: summed on one worker, no gang.
    pgf = PlacementGroupFactory([{"CPU": 1}, {"CPU": 2}])
    assert split_gang_request(pgf) == (pgf, None)
    assert split_gang_request({"CPU": 2}) == ({"CPU": 2}, None)
