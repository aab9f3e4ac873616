"""The rank fork server (``dasktune.train.forkserver``) on its own: real server and rank
processes, each checked by PID; no Dask."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

import dask.config
import pytest
from conftest import pid_alive, wait_for

from dasktune.train import forkserver
from dasktune.train.forkserver import ForkServer

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the fork server runs on Linux only")

ENTRY = "test_forkserver:child"


def child(out: str, mode: str) -> None:
    """What a forked process runs: record what it sees, then exit as ``mode`` says."""
    with open(out, "w") as f:
        json.dump({"pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd(),
                   "env": os.environ.get("FORKED_VALUE"),
                   "home": os.environ.get("HOME"),
                   "preloaded": "json.tool" in sys.modules}, f)
    if mode == "sleep":
        time.sleep(300)
    elif mode == "exit3":
        sys.exit(3)
    elif mode == "raise":
        raise ValueError("boom")


def _record(path: Any) -> dict[str, Any]:
    return wait_for(lambda: json.loads(path.read_text()) if path.exists() and
                    path.read_text() else None, timeout=60, what=f"{path} written")


@pytest.fixture
def server():
    # A preload of a module nothing here imports, to see that the child inherits it.
    s = ForkServer(["json.tool", "no_such_module_anywhere"])
    yield s
    s.close()
    assert not pid_alive(s.pid)


def test_a_forked_process_gets_its_own_environment_and_exit_code(server, tmp_path,
                                                                  monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "rec.json"
    proc = server.start(ENTRY, [str(out), "exit3"], {"FORKED_VALUE": "42"})
    assert proc.wait(60) == 3
    rec = json.loads(out.read_text())
    assert rec["pid"] == proc.pid and rec["ppid"] == server.pid
    assert rec["cwd"] == str(tmp_path)
    assert rec["env"] == "42" and rec["home"] is None  # exactly the given environment
    assert rec["preloaded"]  # imported once by the server, before the fork
    out2 = tmp_path / "ok.json"
    assert server.start(ENTRY, [str(out2), "return"], {}).wait(60) == 0
    out3 = tmp_path / "raise.json"
    assert server.start(ENTRY, [str(out3), "raise"], {}).wait(60) == 1


def test_kill_and_a_closed_connection_end_the_process(server, tmp_path):
    a = server.start(ENTRY, [str(tmp_path / "a.json"), "sleep"], {})
    pid_a = _record(tmp_path / "a.json")["pid"]
    assert a.poll() is None
    a.kill()
    assert a.wait(30) == -signal.SIGKILL
    assert not pid_alive(pid_a)
    # The launcher holding the handle (its connection) goes away: the server kills the
    # process.
    b = server.start(ENTRY, [str(tmp_path / "b.json"), "sleep"], {})
    pid_b = _record(tmp_path / "b.json")["pid"]
    del b  # its connection closes with it
    wait_for(lambda: not pid_alive(pid_b), timeout=30, what="the orphaned process killed")


def test_processes_die_with_the_server_and_with_its_worker(tmp_path):
    # SIGKILL of the server: the kernel kills its children (PR_SET_PDEATHSIG).
    s = ForkServer([])
    proc = s.start(ENTRY, [str(tmp_path / "c.json"), "sleep"], {})
    pid = _record(tmp_path / "c.json")["pid"]
    os.kill(s.pid, signal.SIGKILL)
    assert proc.wait(30) == -signal.SIGKILL
    wait_for(lambda: not pid_alive(pid), timeout=30, what="the server's child killed")
    s.close()
    # The worker closes its end of the lifeline (as its death does): the server kills
    # its children and exits.
    s = ForkServer([])
    proc = s.start(ENTRY, [str(tmp_path / "d.json"), "sleep"], {})  # held: see above
    pid = _record(tmp_path / "d.json")["pid"]
    s.close()
    assert not pid_alive(s.pid)
    wait_for(lambda: not pid_alive(pid), timeout=30, what="the child of the closed server")
    assert proc.wait(30) == -signal.SIGKILL


def test_a_preload_that_raises_leaves_the_server_serving(tmp_path, monkeypatch):
    (tmp_path / "broken_on_import.py").write_text("raise RuntimeError('broken')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    s = ForkServer(["broken_on_import"])
    try:
        out = tmp_path / "e.json"
        assert s.start(ENTRY, [str(out), "return"], {}).wait(60) == 0
        assert json.loads(out.read_text())["ppid"] == s.pid
    finally:
        s.close()


def test_one_server_per_process_restarted_if_it_died_and_off_by_config():
    with dask.config.set({"dasktune.train.forkserver": False}):
        assert forkserver.for_this_process() is None
    first = forkserver.for_this_process()
    assert first is not None and forkserver.for_this_process() is first
    os.kill(first.pid, signal.SIGKILL)
    wait_for(lambda: not first.alive(), timeout=30, what="the server dead")
    second = forkserver.for_this_process()
    assert second is not None and second is not first and second.alive()
    second.close()
