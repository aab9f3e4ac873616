"""Gang placement in the resource ledger: all or none, a distinct worker per bundle,
Ray's four strategies (pure: a fake worker list, no Dask)."""

from __future__ import annotations

from typing import Any

import pytest

from dasktune.execution.gang_placement import assign
from dasktune.execution.ledger import ResourceLedger

ONE = {"CPU": 1.0}


def ledger(spec: dict[str, tuple[str, dict[str, float]]]) -> ResourceLedger:
    """A ledger over workers ``addr -> (host, resources)``."""
    workers: dict[str, dict[str, Any]] = {
        addr: {"host": host, "resources": res, "nthreads": int(res.get("CPU", 1))}
        for addr, (host, res) in spec.items()}
    return ResourceLedger(lambda: workers)


def two_hosts() -> ResourceLedger:
    # host a: 3 single-CPU workers; host b: 2.
    return ledger({"tcp://a:1": ("a", ONE), "tcp://a:2": ("a", ONE), "tcp://a:3": ("a", ONE),
                   "tcp://b:1": ("b", ONE), "tcp://b:2": ("b", ONE)})


def hosts_of(addrs: list[str]) -> list[str]:
    return [a.split("//")[1].split(":")[0] for a in addrs]


def test_each_bundle_gets_a_distinct_worker_even_where_one_worker_could_hold_all():
    led = ledger({"tcp://a:1": ("a", {"CPU": 8.0}), "tcp://a:2": ("a", {"CPU": 8.0})})
    got = led.place_gang([ONE, ONE], "PACK")
    assert got is not None and len(set(got)) == 2
    assert led.place_gang([ONE] * 3, "PACK") is None  # two processes: never three ranks


def test_pack_prefers_one_host_and_strict_pack_insists():
    led = two_hosts()
    assert set(hosts_of(led.place_gang([ONE] * 3, "PACK"))) == {"a"}
    assert set(hosts_of(led.place_gang([ONE] * 2, "STRICT_PACK"))) in ({"a"}, {"b"})
    assert led.place_gang([ONE] * 4, "STRICT_PACK") is None
    four = led.place_gang([ONE] * 4, "PACK")
    assert four is not None and hosts_of(four).count("a") == 3


def test_spread_prefers_distinct_hosts_and_strict_spread_insists():
    led = two_hosts()
    assert sorted(hosts_of(led.place_gang([ONE] * 2, "SPREAD"))) == ["a", "b"]
    assert sorted(hosts_of(led.place_gang([ONE] * 2, "STRICT_SPREAD"))) == ["a", "b"]
    assert led.place_gang([ONE] * 3, "STRICT_SPREAD") is None
    three = led.place_gang([ONE] * 3, "SPREAD")
    assert three is not None and len(set(three)) == 3


def test_all_or_none_and_take_counts_every_slot():
    led = two_hosts()
    first = led.place_gang([ONE] * 3, "PACK")
    led.take_gang("g1", first, [ONE] * 3)
    assert all(led.free(a)["CPU"] == 0.0 for a in first)
    # Two slots left: a gang of three is not placed at all, a gang of two is.
    assert led.place_gang([ONE] * 3, "PACK") is None
    assert all(led.free(a)["CPU"] == 1.0 for a in led.workers() if a not in first)
    second = led.place_gang([ONE] * 2, "PACK")
    assert second is not None and not set(second) & set(first)
    led.give_back_gang("g1", first, [ONE] * 3)
    assert all(led.free(a)["CPU"] == 1.0 for a in led.workers())


def test_head_with_the_gang():
    led = two_hosts()
    group = led.place_gang([ONE] * 2, "PACK", head=ONE)
    assert group is not None and len(set(group)) == 3  # single-CPU workers: three of them
    # The head where its trial runs: it must fit there too.
    led.take("tcp://b:1", "t1", ONE)
    assert led.place_gang([ONE] * 2, "PACK", head=ONE, head_worker="tcp://b:1") is None
    led.give_back("tcp://b:1", "t1", ONE)
    fixed = led.place_gang([ONE] * 2, "PACK", head=ONE, head_worker="tcp://b:1")
    assert fixed is not None and fixed[0] == "tcp://b:1" and "tcp://b:1" not in fixed[1:]
    # Four workers' worth for head + 4 ranks on five workers, not for head + 5.
    assert led.place_gang([ONE] * 4, "PACK", head=ONE) is not None
    assert led.place_gang([ONE] * 5, "PACK", head=ONE) is None


def test_the_head_may_share_a_worker_with_a_rank_when_it_has_room():
    led = ledger({"tcp://a:1": ("a", {"CPU": 2.0}), "tcp://a:2": ("a", ONE)})
    group = led.place_gang([ONE] * 2, "PACK", head=ONE)
    assert group is not None and sorted(group[1:]) == ["tcp://a:1", "tcp://a:2"]
    assert group[0] == "tcp://a:1"


def test_can_ever_fit_gang_says_why_not():
    led = two_hosts()
    assert led.can_ever_fit_gang([ONE] * 5, "PACK") is None
    why = led.can_ever_fit_gang([ONE] * 6, "PACK")
    assert why is not None and "no 6 distinct workers" in why and "tcp://a:1: CPU=1" in why
    why = led.can_ever_fit_gang([ONE] * 3, "STRICT_SPREAD")
    assert why is not None and "distinct hosts" in why
    why = led.can_ever_fit_gang([ONE] * 5, "PACK", head=ONE)
    assert why is not None and "beside the trial's own CPU=1" in why
    # Busy slots do not matter: an idle cluster could.
    led.take_gang("g", ["tcp://a:1", "tcp://a:2"], [ONE, ONE])
    assert led.can_ever_fit_gang([ONE] * 5, "PACK") is None


def test_gpus_per_bundle_are_devices_of_their_worker():
    gpu = {"CPU": 4.0, "GPU": 2.0}
    led = ledger({"tcp://a:1": ("a", gpu), "tcp://b:1": ("b", gpu)})
    bundle = {"CPU": 1.0, "GPU": 1.0}
    got = led.place_gang([bundle] * 2, "SPREAD")
    devices = led.take_gang("g", got, [bundle] * 2)
    assert devices == [["0"], ["0"]]
    other = led.place_gang([bundle] * 2, "SPREAD")
    assert led.take_gang("h", other, [bundle] * 2) == [["1"], ["1"]]
    assert led.place_gang([bundle], "PACK") is None


def test_larger_bundles_are_placed_first():
    free = {"w1": {"CPU": 4.0}, "w2": {"CPU": 1.0}}
    hosts = {"w1": "h", "w2": "h"}
    # Bundle order (rank order) is kept in the answer whatever order they were placed in.
    assert assign([ONE, {"CPU": 4.0}], "PACK", free, hosts) == ["w2", "w1"]


def test_unknown_strategy_is_an_error():
    with pytest.raises(ValueError, match="STRICT_SPREAD"):
        two_hosts().place_gang([ONE], "SIDEWAYS")


# ---------------------------------------------------------------- what a cluster lacks
HEAD0 = {"CPU": 0.0}


def test_the_shortfall_counts_the_new_workers_a_gang_lacks():
    # No workers: a new one holds a rank and the {"CPU": 0} head; the other rank another.
    assert ledger({}).gang_shortfall([ONE, ONE], "PACK", HEAD0) == (2, [])
    # A 1-CPU head needs a worker of its own beside the ranks.
    assert ledger({}).gang_shortfall([ONE, ONE], "PACK", ONE) == (3, [])
    one = ledger({"tcp://a:1": ("a", ONE)})
    assert one.gang_shortfall([ONE, ONE], "PACK", HEAD0) == (1, ["tcp://a:1"])
    # Busy workers count for nothing; it fits now: nothing lacks.
    one.take("tcp://a:1", "t", ONE)
    assert one.gang_shortfall([ONE, ONE], "PACK", HEAD0) == (2, [])
    assert two_hosts().gang_shortfall([ONE, ONE], "PACK", HEAD0)[0] == 0


def test_the_shortfall_follows_the_strategy_and_the_running_head():
    # Two hosts, five workers: STRICT_SPREAD over three hosts lacks one (a new host).
    lacks, keep = two_hosts().gang_shortfall([ONE] * 3, "STRICT_SPREAD")
    assert lacks == 1 and sorted({a.split(":")[1] for a in keep}) == ["//a", "//b"]
    # A running trial's head stays where it runs (its slot lent back while it waits).
    one = ledger({"tcp://a:1": ("a", ONE)})
    assert one.gang_shortfall([ONE, ONE], "PACK", ONE, head_worker="tcp://a:1") == \
        (2, ["tcp://a:1"])
    # Bundles like no worker here: a new worker is taken to hold one (GPU=1 each); the
    # {"CPU": 0} head goes where single-trial placement puts it, the worker here.
    gpu = {"CPU": 1.0, "GPU": 1.0}
    assert one.gang_shortfall([gpu, gpu], "PACK", HEAD0) == (2, ["tcp://a:1"])
