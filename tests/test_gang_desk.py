"""The trial's side of gang reservations (``dasktune.gang_desk``, ``session.reserve_workers``):
the notes it hands the driver and how it answers the trial, with no cluster."""

from __future__ import annotations

import threading
import time

import pytest

from dasktune.execution import GangRequest, WorkerGang
from dasktune.gang_desk import LOST, RETIRING, GangDesk, GangStopped
from dasktune.session import StopTrial, TrialSession, TrialSpec, reserve_workers

TWO = [{"CPU": 1.0}, {"CPU": 1.0}]


def gang(gang_id: str = "g1") -> WorkerGang:
    return WorkerGang(gang_id, ["tcp://a:1", "tcp://a:2"], ["a", "a"], [[], []], TWO, "PACK")


def desk(reserved: WorkerGang | None = None) -> tuple[GangDesk, threading.Event, list[int]]:
    woken: list[int] = []
    stopped = threading.Event()
    return GangDesk(lambda: woken.append(1), stopped.is_set, reserved), stopped, woken


def answer_when_asked(d: GangDesk, answer) -> threading.Thread:
    """Play the actor: wait for the request note, then answer it."""
    def run() -> None:
        while True:
            notes = d.take_notes()
            if notes:
                answer(notes[0][1])
                return
            time.sleep(0.005)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_request_travels_as_a_note_and_returns_the_grant():
    d, _, woken = desk()
    answer_when_asked(d, lambda req: d.grant(req.request_id, gang()))
    got = d.reserve([{"cpu": 1}, {"CPU": 1}], "PACK")  # Ray's lower-case keys too
    assert got == gang() and woken


def test_a_refusal_is_a_value_error_with_the_drivers_reason():
    d, _, _ = desk()
    answer_when_asked(d, lambda req: d.refuse(req.request_id, "no 5 distinct workers ..."))
    with pytest.raises(ValueError, match="no 5 distinct workers"):
        d.reserve(TWO)


def test_a_timeout_withdraws_the_request_and_a_late_grant_is_refused():
    d, _, _ = desk()
    t = time.monotonic()
    with pytest.raises(TimeoutError):
        d.reserve(TWO, timeout=0.3)
    assert 0.3 <= time.monotonic() - t < 2.0
    (want, request), (withdraw, same) = d.take_notes()
    assert (want, withdraw) == ("want", "withdraw") and same == request
    assert isinstance(request, GangRequest) and request.bundles == TWO
    assert d.grant(request.request_id, gang()) is False  # the executor takes the slots back


def test_a_stopped_attempt_stops_waiting():
    d, stopped, _ = desk()
    threading.Timer(0.2, stopped.set).start()
    with pytest.raises(GangStopped):
        d.reserve(TWO)


def test_a_gang_reserved_at_start_is_handed_over_once_without_a_note():
    reserved = gang("pre")
    d, _, woken = desk(reserved)
    assert d.reserve(TWO, "PACK") is reserved
    assert d.take_notes() == [] and not woken
    with pytest.raises(TimeoutError):  # the second call asks the driver
        d.reserve(TWO, "PACK", timeout=0.05)


def test_release_once_and_loss_are_told():
    d, _, _ = desk()
    answer_when_asked(d, lambda req: d.grant(req.request_id, gang()))
    got = d.reserve(TWO)
    assert d.lost(got) == [] and d.wait_lost(got, timeout=0.05) == []
    threading.Timer(0.1, d.mark_lost, args=("g1", ["tcp://a:2"])).start()
    assert d.wait_lost(got, timeout=10) == ["tcp://a:2"]
    d.release(got)  # a lost gang's slots are back already: nothing to say
    d.release(got)
    assert d.take_notes() == []


def test_a_retiring_worker_is_news_apart_from_a_loss_and_the_gang_stays_held():
    d, _, _ = desk()
    answer_when_asked(d, lambda req: d.grant(req.request_id, gang()))
    got = d.reserve(TWO)
    assert d.retiring(got) == []
    d.mark(RETIRING, "g1", ["tcp://a:2"])
    d.mark(RETIRING, "g1", ["tcp://a:2"])  # told twice (re-asked retirements): once
    d.mark(RETIRING, "other", ["tcp://a:1"])
    assert d.retiring(got) == ["tcp://a:2"]
    assert d.lost(got) == [] and d.wait_lost(got, timeout=0.05) == []
    d.mark(LOST, "g1", ["tcp://a:2"])  # then it is gone: still retiring, now lost too
    assert d.retiring(got) == d.lost(got) == ["tcp://a:2"]
    with pytest.raises(ValueError, match="'gone' is not one of"):
        d.mark("gone", "g1", ["tcp://a:2"])


def test_release_is_a_note_once():
    d, _, _ = desk()
    answer_when_asked(d, lambda req: d.grant(req.request_id, gang()))
    got = d.reserve(TWO)
    d.release(got)
    d.release(got)
    assert d.take_notes() == [("release", "g1")]


def test_bad_requests_are_errors_before_anything_travels():
    d, _, _ = desk()
    for bad in ([], {"CPU": 1}, [1]):
        with pytest.raises(ValueError, match="reserve_workers"):
            d.reserve(bad)
    with pytest.raises(ValueError, match="STRICT_SPREAD"):
        d.reserve(TWO, "EVERYWHERE")
    assert d.take_notes() == []


def test_outside_a_trial_it_is_a_runtime_error():
    with pytest.raises(RuntimeError, match="outside of a dasktune trial"):
        reserve_workers(TWO)
    spec = TrialSpec("t", "t", "e", {}, None, None, "")  # type: ignore[arg-type]
    session = TrialSession(spec, lambda *a: None, lambda *a: False)
    with pytest.raises(RuntimeError, match="started by dasktune's executor"):
        session.reserve_workers(TWO)


def test_the_session_turns_a_stop_into_stop_trial():
    d, stopped, _ = desk()
    stopped.set()
    spec = TrialSpec("t", "t", "e", {}, None, None, "")  # type: ignore[arg-type]
    session = TrialSession(spec, lambda *a: None, lambda *a: False, gangs=d)
    with pytest.raises(StopTrial):
        session.reserve_workers(TWO)


def test_an_isolated_trials_requests_are_relayed_both_ways():
    """The child process's desk talks to the actor's desk (here: directly, as the
    isolation relay does over its socket)."""
    parent, _, _ = desk()
    child: GangDesk = GangDesk(lambda: parent.relay_notes(child.take_notes()),
                               threading.Event().is_set)

    def actor_and_driver() -> None:
        while True:
            notes = parent.take_notes()
            if notes:
                assert parent.grant(notes[0][1].request_id, gang())
                child.apply_answers(parent.take_answers())
                return
            time.sleep(0.005)

    threading.Thread(target=actor_and_driver, daemon=True).start()
    assert child.reserve(TWO) == gang()
    parent.mark(RETIRING, "g1", ["tcp://a:2"])
    child.apply_answers(parent.take_answers())
    assert child.retiring(gang()) == ["tcp://a:2"] and child.lost(gang()) == []
    parent.mark_lost("g1", ["tcp://a:1"])
    child.apply_answers(parent.take_answers())
    assert child.lost(gang()) == ["tcp://a:1"]
    # A grant that comes after the child gave up goes back as a release.
    with pytest.raises(TimeoutError):
        child.reserve(TWO, timeout=0.05)
    late = [n for n in parent.take_notes() if n[0] == "want"][-1][1]
    assert parent.grant(late.request_id, gang("late")) is False  # withdrawn first
    child.apply_answers([("grant", late.request_id, gang("late"))])
    assert ("release", "late") in parent.take_notes()


def test_a_gang_reserved_at_start_is_given_back_when_the_trial_asks_another_shape():
    d, _, _ = desk(gang("pre"))
    with pytest.raises(TimeoutError):
        d.reserve([{"CPU": 1}] * 3, timeout=0.05)
    notes = d.take_notes()
    assert notes[0] == ("release", "pre") and [n[0] for n in notes[1:]] == ["want", "withdraw"]
