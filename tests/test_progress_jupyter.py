"""The progress table in a real Jupyter kernel: one output that updates in place
(``display_data`` once, then ``update_display_data`` with the same id), no stream
of reprinted tables."""

from __future__ import annotations

import sys

import pytest

CODE = r"""
from dasktune.progress import ProgressReporter
from dasktune.trial import Trial
trials = [Trial(f"t{i}", {"lr": i}) for i in range(3)]
rep = ProgressReporter(verbose=2, metric="loss", mode="min", period=0)
for step in range(1, 4):
    for i, t in enumerate(trials):
        t.set_status("RUNNING")
        t.update_last_result({"training_iteration": step, "loss": (i + 1) / step})
    rep.maybe_report(trials)
for t in trials:
    t.set_status("TERMINATED")
rep.final(trials)
"""


def test_table_updates_in_place_in_a_kernel():
    manager = pytest.importorskip("jupyter_client.manager")
    pytest.importorskip("ipykernel")
    km, kc = manager.start_new_kernel(kernel_name="python3", extra_arguments=[],
                                      startup_timeout=60)
    try:
        kc.execute_interactive(f"import sys; assert sys.executable == {sys.executable!r}",
                               timeout=60)
        msgs = []
        reply = kc.execute_interactive(CODE, timeout=60, output_hook=msgs.append)
        assert reply["content"]["status"] == "ok", reply["content"]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    kinds = [m["msg_type"] for m in msgs if m["msg_type"] not in ("status", "execute_input")]
    assert kinds == ["display_data"] + ["update_display_data"] * 3, kinds
    shown = [m for m in msgs if m["msg_type"] in ("display_data", "update_display_data")]
    assert len({m["content"]["transient"]["display_id"] for m in shown}) == 1
    last = shown[-1]["content"]["data"]["text/plain"]
    assert "3 TERMINATED" in last and "t0" in last
