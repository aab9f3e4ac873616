"""``dasktune exec --port-forward``: TensorBoard started on the head through ``exec`` answers
on the forwarded local port, relayed over the scheduler's Dask comms; Ctrl-C ends both."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil
import pytest

from tests.conftest import free_port, http_get, wait_for

pytest.importorskip("tensorboard")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTER = """\
cluster_name: {name}
provider: {{type: local}}
min_workers: 0
max_workers: 0
available_node_types:
  head_node: {{node_config: {{}}}}
  worker_nodes: {{node_config: {{}}, resources: {{CPU: 1}}}}
head_node_type: head_node
"""


def test_tensorboard_through_exec_port_forward(tmp_path):
    cluster_file = tmp_path / "c.yaml"
    cluster_file.write_text(CLUSTER.format(name=f"tunnel-{os.getpid()}"))
    env = {**os.environ, "PYTHONPATH": ROOT, "XDG_CONFIG_HOME": str(tmp_path / "config")}
    cli = [sys.executable, "-c", "from dasktune.cli import main; main()"]
    up = subprocess.run([*cli, "up", str(cluster_file), "-y"], env=env, capture_output=True,
                        text=True, timeout=120)
    assert up.returncode == 0, up.stderr
    head_port, local_port = free_port(), free_port()
    tb = (f"{sys.executable} -m tensorboard.main --logdir {tmp_path} --host 127.0.0.1 "
          f"--port {head_port}")
    proc = subprocess.Popen([*cli, "exec", str(cluster_file), tb, "--port-forward",
                             f"{local_port}:{head_port}"], env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    children: list[psutil.Process] = []
    try:
        page = wait_for(lambda: http_get(f"http://127.0.0.1:{local_port}/"), timeout=120,
                        interval=0.5, what="TensorBoard on the forwarded port")
        assert "tensorboard" in str(page).lower() and len(str(page)) > 100_000  # its bundle
        assert http_get(f"http://127.0.0.1:{local_port}/data/environment") is not None
        children = psutil.Process(proc.pid).children(recursive=True)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in the terminal that ran exec
        out, _ = proc.communicate(timeout=60)
        assert f"forwarding localhost:{local_port} -> port {head_port}" in out
        assert "Traceback" not in out, out
        assert http_get(f"http://127.0.0.1:{local_port}/") is None
        wait_for(lambda: not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE
                                 for c in children), timeout=30, what="TensorBoard to end")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        down = subprocess.run([*cli, "down", str(cluster_file), "-y"], env=env,
                              capture_output=True, text=True, timeout=120)
    assert down.returncode == 0, down.stderr
