"""What a newcomer meets in the first hour: a second cluster's dashboard, and a trial's
error at the default verbosity, each in a process of its own."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import textwrap
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env(tmp_path):
    return {**os.environ, "PYTHONPATH": ROOT, "XDG_CONFIG_HOME": str(tmp_path / "config")}


INIT = textwrap.dedent("""
    import dasktune
    dasktune.init(num_cpus=1)
    dasktune.shutdown()
""")


@pytest.mark.slow
def test_a_second_cluster_gets_another_dashboard_port_without_a_warning(tmp_path):
    """Port 8787 taken (another Dask cluster): the embedded one takes a free port, says
    nothing of the clash, and prints the link it got, once."""
    with socket.socket() as other:
        # As servers do: a closed connection of an earlier test's dashboard (TIME_WAIT)
        # must not make the port look taken when nothing listens on it.
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            other.bind(("127.0.0.1", 8787))
            other.listen()
        except OSError:
            pass  # taken already: by another cluster, which is the case under test
        r = subprocess.run([sys.executable, "-c", INIT], capture_output=True, text=True,
                           env=_env(tmp_path), timeout=120)
    assert r.returncode == 0, r.stderr
    assert "already in use" not in r.stderr
    links = re.findall(r"Dask dashboard: http://127\.0\.0\.1:(\d+)/status", r.stderr)
    assert len(links) == 1 and links[0] != "8787", r.stderr


SCRIPT = textwrap.dedent("""
    import sys
    import dasktune as tune

    def helper(x):
        raise ValueError(f"bad x: {x}")

    def train(config):
        tune.report({"loss": 1.0, "acc": 0.5})
        helper(config["x"])

    def quiet(config):
        tune.report({"loss": 1.0, "acc": 0.5})

    if __name__ == "__main__":
        tune.init(num_cpus=1)
        grid = tune.Tuner(train, param_space={"x": 7},
                          run_config=tune.RunConfig(name="bad", storage_path=sys.argv[1])).fit()
        print("RESULT.ERROR", repr(str(grid[0].error)))
        grid = tune.Tuner(quiet, tune_config=tune.TuneConfig(metric="los", mode="min"),
                          run_config=tune.RunConfig(name="typo", storage_path=sys.argv[1])).fit()
        print("RESULT.ERROR", repr(str(grid[0].error)))
        try:
            grid.get_best_result()
        except Exception as exc:
            print("BEST", repr(str(exc)))
""")


@pytest.mark.slow
def test_a_trials_error_is_shown_and_points_to_the_users_code(tmp_path):
    """At the default verbosity: the failing trial's last error line and its error.txt;
    the traceback (error.txt, Result.error) names the script's file, line and source, not
    cloudpickle's ``<dynamic-code>``; a metric typo lists the trainable's keys first."""
    script = tmp_path / "my_script.py"
    script.write_text(SCRIPT)
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "results")],
                       capture_output=True, text=True, env=_env(tmp_path), timeout=180)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    m = re.search(r"Trial \S+ errored after 1 iterations at .*\n  ValueError: bad x: 7\n"
                  r"  Error file: (\S+/error\.txt)\n", out)
    assert m, out
    error_txt = open(m.group(1)).read()
    where = f'File "{script}", line 6, in helper\n    raise ValueError(f"bad x: {{x}}")'
    called = f'File "{script}", line 10, in train\n    helper(config["x"])'
    for text in (error_txt, out.split("RESULT.ERROR ")[1].splitlines()[0]
                 .encode().decode("unicode_escape")):
        assert where in text and called in text and "<dynamic-code>" not in text, text
    typo = "without the metric 'los' set in TuneConfig (reported keys: ['acc', 'loss'], and " \
           "the automatic"
    assert typo in out.split("RESULT.ERROR ")[2]
    best = out.split("BEST ")[1]
    assert "reported keys: []" not in best and "['acc', 'loss']" in best, best


def test_shipped_code_keeps_its_file_and_source_where_the_file_is_absent(tmp_path):
    """What a worker on another host sees: the script is not there, its lines still are."""
    from dasktune.shipping import dumps_trainable

    mod = tmp_path / "gone_tomorrow.py"
    mod.write_text("def f(config):\n    return 1 / config['zero']\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import cloudpickle
        import gone_tomorrow

        cloudpickle.register_pickle_by_value(gone_tomorrow)
        blob = dumps_trainable(gone_tomorrow.f)
        cloudpickle.unregister_pickle_by_value(gone_tomorrow)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("gone_tomorrow", None)
    mod.unlink()
    (tmp_path / "blob").write_bytes(blob)
    load = ("import cloudpickle, sys, traceback\n"
            "f = cloudpickle.loads(open(sys.argv[1], 'rb').read())\n"
            "try:\n    f({'zero': 0})\nexcept ZeroDivisionError:\n    traceback.print_exc()\n")
    r = subprocess.run([sys.executable, "-c", load, str(tmp_path / "blob")],
                       capture_output=True, text=True, env=_env(tmp_path), timeout=60)
    assert f'File "{mod}", line 2, in f\n    return 1 / config[\'zero\']' in r.stderr, r.stderr


DRIVER = textwrap.dedent("""
    import sys, time
    import dasktune as tune

    def train(config):
        while True:
            tune.report({"loss": 1.0})
            time.sleep(0.1)

    if __name__ == "__main__":
        tune.init(num_cpus=1)
        tune.Tuner(train, run_config=tune.RunConfig(storage_path=sys.argv[1], verbose=0)).fit()
""")


@pytest.mark.slow
def test_the_embedded_clusters_workers_leave_quietly_with_a_killed_driver(tmp_path):
    """SIGKILL to the driver alone (as the OOM killer sends it): its nanny, worker and the
    worker's helpers are gone within a second or two, and nothing more is printed."""
    import psutil

    from tests.conftest import wait_for

    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    results = tmp_path / "results"
    driver = subprocess.Popen([sys.executable, str(script), str(results)], env=_env(tmp_path),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)
    procs: list[psutil.Process] = []
    try:
        wait_for(lambda: list(results.glob("*/*/progress.csv")), timeout=120,
                 what="the trial's first report")
        procs = psutil.Process(driver.pid).children(recursive=True)
        assert len(procs) >= 2  # the nanny and its worker at least
        driver.kill()
        killed = time.monotonic()

        def gone():
            return not [p for p in procs if p.is_running()
                        and p.status() != psutil.STATUS_ZOMBIE]
        wait_for(gone, timeout=10, what="the workers to leave")
        assert time.monotonic() - killed < 3.0
        err = driver.communicate(timeout=10)[1]
        after = err.split("(trials: /dasktune)\n", 1)[-1]  # the one line init prints
        assert after == "", after
    finally:
        for p in procs:  # only what this test started
            with contextlib.suppress(psutil.Error):
                p.kill()
        if driver.poll() is None:
            driver.kill()
