"""Resource detection, request normalisation, GPU assignment and ``dasktune worker``.

No GPU exists here: NVML is a fake module object put in ``sys.modules`` and
``nvidia-smi`` a shell script on PATH printing canned CSV; everything else is real,
including a ``dask scheduler`` process and a ``dasktune worker`` process.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest

from dasktune import resources as res
from dasktune.resources import GPUAllocator, GPUInfo

REPO = Path(__file__).resolve().parents[1]

SMI_CSV = """\
0, NVIDIA H100 80GB HBM3, GPU-aaaa-1111, 81559, 00000000:19:00.0
1, NVIDIA H100 80GB HBM3, GPU-bbbb-2222, 81559, 00000000:3B:00.0
"""


# ---------------------------------------------------------------------------------------------
# Fakes for what cannot run here


@pytest.fixture
def no_nvml(monkeypatch):
    """``import pynvml`` raises ImportError."""
    monkeypatch.setitem(sys.modules, "pynvml", None)


@pytest.fixture
def empty_path(tmp_path, monkeypatch):
    """A PATH with no ``nvidia-smi`` on it."""
    d = tmp_path / "empty-bin"
    d.mkdir()
    monkeypatch.setenv("PATH", str(d))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def _write_smi(bin_dir: Path, body: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + body)
    smi.chmod(0o755)


@pytest.fixture
def fake_smi(tmp_path, monkeypatch):
    """``nvidia-smi`` printing two H100s, and only for the query dasktune makes."""
    bin_dir = tmp_path / "smi-bin"
    _write_smi(
        bin_dir,
        textwrap.dedent(
            f"""\
            [ "$1" = "--query-gpu=index,name,uuid,memory.total,pci.bus_id" ] || exit 7
            [ "$2" = "--format=csv,noheader,nounits" ] || exit 8
            cat <<'EOF'
            {SMI_CSV}EOF
            """
        ),
    )
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return bin_dir


def _fake_pynvml(names, *, init_error=None):
    """A module object with the slice of the NVML API dasktune calls."""
    mod = types.ModuleType("pynvml")
    mod.calls = []

    def nvmlInit():
        mod.calls.append("init")
        if init_error is not None:
            raise init_error

    def nvmlShutdown():
        mod.calls.append("shutdown")

    mod.nvmlInit = nvmlInit
    mod.nvmlShutdown = nvmlShutdown
    mod.nvmlDeviceGetCount = lambda: len(names)
    mod.nvmlDeviceGetHandleByIndex = lambda i: i
    # Old releases return bytes, new ones str: give one of each.
    mod.nvmlDeviceGetName = lambda h: names[h].encode() if h == 0 else names[h]
    mod.nvmlDeviceGetUUID = lambda h: f"GPU-nvml-{h}"
    mod.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=(h + 1) * 2**30)
    mod.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=f"00000000:{h:02X}:00.0")
    return mod


# ---------------------------------------------------------------------------------------------
# Detection


def test_no_nvml_no_smi_means_no_gpus(no_nvml, empty_path):
    assert res.detect_gpus() == []
    host = res.detect_resources()
    assert host["GPU"] == 0
    assert host["CPU"] >= 1
    assert host["memory"] > 0
    assert not any(k.startswith("accelerator_type:") for k in host)


def test_nvml_present(monkeypatch, empty_path):
    fake = _fake_pynvml(["NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB"])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    gpus = res.detect_gpus()
    assert gpus == [
        GPUInfo(0, "NVIDIA A100-SXM4-80GB", "GPU-nvml-0", 2**30, "00000000:00:00.0"),
        GPUInfo(1, "NVIDIA A100-SXM4-80GB", "GPU-nvml-1", 2**31, "00000000:01:00.0"),
    ]
    assert fake.calls == ["init", "shutdown"]
    host = res.detect_resources()
    assert host["GPU"] == 2
    assert host["accelerator_type:A100"] == 1


def test_nvml_respects_cuda_visible_devices(monkeypatch, empty_path):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(["NVIDIA H200"] * 3))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    assert [g.index for g in res.detect_gpus()] == [2, 0]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-nvml-1")  # UUIDs work too
    assert [g.index for g in res.detect_gpus()] == [1]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,7,0")  # CUDA stops at an invalid entry
    assert [g.index for g in res.detect_gpus()] == [1]
    for hidden in ("", "-1"):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", hidden)
        assert res.detect_gpus() == []
        assert res.detect_resources()["GPU"] == 0


def test_nvml_init_failure_falls_back_to_nvidia_smi(monkeypatch, fake_smi):
    fake = _fake_pynvml([], init_error=RuntimeError("NVML Shared Library Not Found"))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert [g.uuid for g in res.detect_gpus()] == ["GPU-aaaa-1111", "GPU-bbbb-2222"]


def test_nvidia_smi_parsing(no_nvml, fake_smi, monkeypatch):
    gpus = res.detect_gpus()
    assert gpus == [
        GPUInfo(0, "NVIDIA H100 80GB HBM3", "GPU-aaaa-1111", 81559 * 2**20, "00000000:19:00.0"),
        GPUInfo(1, "NVIDIA H100 80GB HBM3", "GPU-bbbb-2222", 81559 * 2**20, "00000000:3B:00.0"),
    ]
    assert gpus[0].device_id == "GPU-aaaa-1111"
    host = res.detect_resources()
    assert host["GPU"] == 2
    assert host["accelerator_type:H100"] == 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert [g.pci_bus_id for g in res.detect_gpus()] == ["00000000:3B:00.0"]


def test_nvidia_smi_failure_means_no_gpus(no_nvml, tmp_path, monkeypatch):
    _write_smi(tmp_path / "bin", "echo 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert res.detect_gpus() == []


def test_nvidia_smi_garbage_lines_are_skipped(no_nvml, tmp_path, monkeypatch):
    _write_smi(tmp_path / "bin", "echo 'No devices were found'\necho '0, T4, GPU-x, 15360, 0:1'\n")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert [g.name for g in res.detect_gpus()] == ["T4"]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("NVIDIA H200", "H200"),
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("Tesla V100-SXM2-16GB", "V100"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA GeForce RTX 3090", "RTX_3090"),
        ("NVIDIA RTX A6000", "RTX_A6000"),
        ("NVIDIA", "GPU"),
    ],
)
def test_accelerator_type(name, expected):
    assert res.accelerator_type(name) == expected


# ---------------------------------------------------------------------------------------------
# Requests, capacity, formatting


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        (None, {"CPU": 1.0}),
        ({}, {"CPU": 1.0}),
        ({"cpu": 2, "gpu": 1}, {"CPU": 2.0, "GPU": 1.0}),
        ({"GPU": 0.25}, {"CPU": 1.0, "GPU": 0.25}),
        ({"gpu": 4}, {"CPU": 1.0, "GPU": 4.0}),
        ({"gpu": 2.0}, {"CPU": 1.0, "GPU": 2.0}),
        ({"cpu": 0, "gpu": 0}, {"CPU": 0.0}),
        ({"memory": 4e9, "cpu": 0.5}, {"CPU": 0.5, "memory": 4e9}),
        ({"accelerator_type:H100": 0.01, "ssd": 0}, {"CPU": 1.0, "accelerator_type:H100": 0.01}),
    ],
)
def test_normalize_request(request_, expected):
    out = res.normalize_request(request_)
    assert out == expected
    assert list(out)[0] == "CPU"


@pytest.mark.parametrize(
    ("request_", "needle"),
    [
        ({"cpu": -1}, "'cpu'"),
        ({"gpu": "1"}, "'gpu'"),
        ({"gpu": True}, "'gpu'"),
        ({"memory": float("nan")}, "'memory'"),
        ({"gpu": 1.5}, "'GPU'"),
        ({"cpu": 1, "CPU": 2}, "'CPU'"),
        ({"": 1}, "''"),
        ({3: 1}, "3"),
    ],
)
def test_normalize_request_errors(request_, needle):
    with pytest.raises(ValueError, match=needle):
        res.normalize_request(request_)


def test_normalize_request_rejects_non_mapping():
    with pytest.raises(TypeError, match="list"):
        res.normalize_request([("cpu", 1)])


def test_worker_capacity():
    info = {"nthreads": 4, "memory_limit": 8e9, "resources": {"GPU": 2}}
    assert res.worker_capacity(info) == {"GPU": 2.0, "CPU": 4.0, "memory": 8e9}
    advertised = {"nthreads": 4, "memory_limit": 8e9, "resources": {"CPU": 16, "memory": 1e9}}
    assert res.worker_capacity(advertised) == {"CPU": 16.0, "memory": 1e9}
    assert res.worker_capacity({"nthreads": 1, "memory_limit": 0, "resources": {}}) == {"CPU": 1}


def test_format_resources():
    assert res.format_resources({"CPU": 2.0, "GPU": 1.0}) == "CPU=2, GPU=1"
    assert res.format_resources({"GPU": 0.5, "memory": 2**31}) == "GPU=0.5, memory=2.00 GiB"
    assert res.format_resources({}) == ""


# ---------------------------------------------------------------------------------------------
# GPUAllocator


def test_worker_devices():
    assert res.worker_devices(2) == ["0", "1"]
    assert res.worker_devices(2, "") == ["0", "1"]
    assert res.worker_devices(1, "3") == ["3"]
    assert res.worker_devices(2, "GPU-a, GPU-b") == ["GPU-a", "GPU-b"]
    assert res.worker_devices(0) == []


def test_allocator_whole_gpus_get_distinct_devices():
    alloc = GPUAllocator()
    devices = ["0", "1", "2"]
    assert alloc.allocate("a", 2, devices) == ["0", "1"]
    assert alloc.allocate("b", 1, devices) == ["2"]
    assert alloc.allocate("c", 1, devices) is None  # refused, and nothing held
    assert alloc.holdings("c") == []
    alloc.release("a")
    assert alloc.allocate("c", 2, devices) == ["0", "1"]
    assert alloc.in_use() == {"0": 1.0, "1": 1.0, "2": 1.0}


def test_allocator_fractional_packs_one_device():
    alloc = GPUAllocator()
    devices = ["0", "1"]
    got = [alloc.allocate(f"t{i}", 0.1, devices) for i in range(10)]
    assert got == [["0"]] * 10  # float slack: ten tenths fit
    assert alloc.allocate("t10", 0.1, devices) == ["1"]
    assert alloc.allocate("whole", 1, devices) is None  # device 1 is partly used
    assert alloc.allocate("half", 0.5, devices) == ["1"]  # fullest fitting device
    assert alloc.allocate("big", 0.5, devices) is None


def test_allocator_fraction_does_not_take_a_busy_device():
    alloc = GPUAllocator()
    assert alloc.allocate("whole", 1, ["0", "1"]) == ["0"]
    assert alloc.allocate("a", 0.75, ["0", "1"]) == ["1"]
    assert alloc.allocate("b", 0.5, ["0", "1"]) is None
    assert alloc.allocate("c", 0.25, ["0", "1"]) == ["1"]


def test_allocator_release():
    alloc = GPUAllocator()
    assert alloc.allocate("a", 0.5, ["0"]) == ["0"]
    assert alloc.allocate("b", 0.5, ["0"]) == ["0"]
    alloc.release("a")
    assert alloc.in_use() == {"0": 0.5}
    alloc.release("a")  # idempotent
    alloc.release("never-allocated")
    alloc.release("b")
    assert alloc.in_use() == {}
    assert alloc.allocate("c", 1, ["0"]) == ["0"]


def test_allocator_zero_and_errors():
    alloc = GPUAllocator()
    assert alloc.allocate("cpu-only", 0, ["0"]) == []
    assert alloc.in_use() == {}
    with pytest.raises(ValueError, match="already holds"):
        alloc.allocate("cpu-only", 1, ["0"])
    with pytest.raises(ValueError, match="GPU"):
        alloc.allocate("x", 1.5, ["0", "1"])
    with pytest.raises(ValueError, match="GPU"):
        alloc.allocate("y", -1, ["0"])
    assert alloc.allocate("z", 1, []) is None


def test_allocator_devices_from_advertised_count():
    alloc = GPUAllocator()
    devices = res.worker_devices(2)  # GPU=2 advertised, none detectable
    assert alloc.allocate("a", 1, devices) == ["0"]
    assert alloc.allocate("b", 1, devices) == ["1"]
    assert alloc.allocate("c", 1, devices) is None


# ---------------------------------------------------------------------------------------------
# dasktune worker --dry-run


def _invoke(*args):
    from click.testing import CliRunner

    from dasktune.cli import main

    return CliRunner().invoke(main, ["worker", *args], catch_exceptions=False)


def _parse_dry_run(output):
    """Each printed line -> (env overrides, dask worker args after the module name)."""
    runs = []
    for line in output.strip().splitlines():
        words = shlex.split(line)
        env = {}
        while "=" in words[0] and not words[0].startswith("/"):
            k, _, v = words.pop(0).partition("=")
            env[k] = v
        assert words[:3] == [sys.executable, "-m", "distributed.cli.dask_worker"]
        runs.append((env, words[3:]))
    return runs


def _resources_of(args):
    value = args[args.index("--resources") + 1]
    return {k: float(v) for k, v in (p.split("=") for p in value.split(","))}


def test_dry_run_cpu_host(no_nvml, empty_path):
    result = _invoke(
        "tcp://127.0.0.1:8786", "--local-directory", "/tmp/x", "--no-nanny",
        "--resources", "gpu=2,ssd=1", "--dry-run",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    [(env, args)] = _parse_dry_run(result.output)
    assert env == {}
    # Unknown options pass through unchanged and in order.
    assert args[:4] == ["tcp://127.0.0.1:8786", "--local-directory", "/tmp/x", "--no-nanny"]
    cpus = int(res.detect_resources([])["CPU"])
    assert args[args.index("--nthreads") + 1] == str(cpus)
    got = _resources_of(args)
    assert got["CPU"] == cpus
    assert got["GPU"] == 2  # the user's value, under Dask's tag
    assert got["ssd"] == 1
    assert got["memory"] > 0


def test_dry_run_user_values_win_and_nthreads_follow_cpu(no_nvml, empty_path):
    result = _invoke("tcp://h:1", "--resources", "CPU=3 memory=1e9", "--dry-run")
    assert result.exit_code == 0, result.output
    [(_, args)] = _parse_dry_run(result.output)
    assert args[args.index("--nthreads") + 1] == "3"
    assert _resources_of(args) == {"CPU": 3, "memory": 1e9}
    result = _invoke("tcp://h:1", "--nthreads", "2", "--memory-limit", "2GB", "--dry-run")
    [(_, args)] = _parse_dry_run(result.output)
    assert _resources_of(args) == {"CPU": 2, "memory": 2e9}
    assert args[args.index("--memory-limit") + 1] == "2GB"


def test_dry_run_gpu_host_single_worker(no_nvml, fake_smi):
    result = _invoke("tcp://h:1", "--dry-run")
    assert result.exit_code == 0, result.output
    [(env, args)] = _parse_dry_run(result.output)
    assert env == {}
    got = _resources_of(args)
    assert got["GPU"] == 2
    assert got["accelerator_type:H100"] == 1


def test_dry_run_one_worker_per_gpu(no_nvml, fake_smi):
    result = _invoke("tcp://h:1", "--one-worker-per-gpu", "--name", "w", "--dry-run")
    assert result.exit_code == 0, result.output
    runs = _parse_dry_run(result.output)
    assert [env for env, _ in runs] == [
        {"CUDA_VISIBLE_DEVICES": "GPU-aaaa-1111"},
        {"CUDA_VISIBLE_DEVICES": "GPU-bbbb-2222"},
    ]
    cpus = int(res.detect_resources([])["CPU"])
    for i, (_, args) in enumerate(runs):
        assert args[args.index("--name") + 1] == f"w-gpu{i}"
        got = _resources_of(args)
        assert got["GPU"] == 1
        assert got["CPU"] == max(1, cpus // 2)
        assert got["accelerator_type:H100"] == 1


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--nworkers", "2"], "--one-worker-per-gpu"),
        (["--one-worker-per-gpu", "--nworkers", "2"], "drop --nworkers"),
        (["--resources", "GPU"], "NAME=AMOUNT"),
        (["--resources", "GPU=-1"], ">= 0"),
        (["--nworkers", "many"], "'auto'"),
    ],
)
def test_worker_usage_errors(no_nvml, fake_smi, args, needle):
    result = _invoke("tcp://h:1", *args, "--dry-run")
    assert result.exit_code == 2
    assert needle in result.output


def test_one_worker_per_gpu_needs_gpus(no_nvml, empty_path):
    result = _invoke("tcp://h:1", "--one-worker-per-gpu", "--dry-run")
    assert result.exit_code == 2
    assert "no GPUs detected" in result.output


def test_worker_help_shows_example():
    result = _invoke("--help")
    assert result.exit_code == 0
    assert "dasktune worker tcp://" in result.output
    assert "--one-worker-per-gpu" in result.output


# ---------------------------------------------------------------------------------------------
# Real processes


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def _wait_for(predicate, timeout, what, procs=()):
    deadline = time.monotonic() + timeout
    while not predicate():
        for p in procs:
            if p.poll() is not None:
                raise AssertionError(f"{what}: process {p.args!r} exited with {p.returncode}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def started():
    """Processes a test starts; each is stopped by its own PID afterwards."""
    procs: list[subprocess.Popen] = []
    yield procs
    # Last started first: workers leave before their scheduler goes.
    for p in reversed(procs):
        if p.poll() is None:
            p.terminate()
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)


_CLI = "import sys; from dasktune.cli import main; sys.exit(main(prog_name='dasktune'))"


@pytest.mark.timeout(90)
def test_real_worker_advertises_resources(tmp_path, started):
    from distributed import Client

    sched_file = tmp_path / "scheduler.json"
    started.append(
        subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
             "--port", "0", "--no-dashboard", "--scheduler-file", str(sched_file)],
            env=_env(),
        )
    )  # fmt: skip
    _wait_for(sched_file.exists, 60, "the scheduler file", started)
    _wait_for(lambda: sched_file.read_text().strip().endswith("}"), 10, "a complete file")
    address = json.loads(sched_file.read_text())["address"]

    worker = subprocess.Popen(
        [sys.executable, "-c", _CLI, "worker", address, "--no-nanny", "--no-dashboard",
         "--host", "127.0.0.1", "--resources", "GPU=2", "--name", "dt-test"],
        env=_env(),
    )  # fmt: skip
    started.append(worker)

    with Client(address, timeout=30) as client:
        client.wait_for_workers(1, timeout=60)
        [(addr, info)] = client.scheduler_info()["workers"].items()
        # exec: the PID we started is the dask worker itself.
        assert info["name"] == "dt-test"
        assert client.run(os.getpid)[addr] == worker.pid
        resources = info["resources"]
        assert resources["GPU"] == 2
        assert resources["CPU"] == info["nthreads"] >= 1
        assert resources["memory"] == info["memory_limit"] > 0
        assert res.worker_capacity(info) == {k: float(v) for k, v in resources.items()}
        # A task asking for one GPU runs there.
        fut = client.submit(lambda: "ran", resources={"GPU": 1}, pure=False)
        assert fut.result(timeout=30) == "ran"


_CHILD = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
with open(sys.argv[1], "a") as f:
    f.write(f"{os.getpid()} {os.environ['CUDA_VISIBLE_DEVICES']} {os.getsid(0)}\\n")
while True:
    time.sleep(0.05)
"""

_SUPERVISOR = """
import sys
from dasktune.cli.worker import Launch, supervise
child = [sys.executable, "-c", sys.argv[1]]
if sys.argv[3] == "fail":
    launches = [Launch([sys.executable, "-c", "raise SystemExit(3)"], {"CUDA_VISIBLE_DEVICES": "0"}),
                Launch([sys.executable, "-c", "pass"], {"CUDA_VISIBLE_DEVICES": "1"})]
else:
    launches = [Launch([*child, sys.argv[2]], {"CUDA_VISIBLE_DEVICES": d}) for d in ("0", "1")]
sys.exit(supervise(launches))
"""


@pytest.mark.timeout(60)
def test_supervise_forwards_signals_and_exits_with_children(tmp_path, started):
    ready = tmp_path / "ready.txt"
    ready.touch()
    sup = subprocess.Popen(
        [sys.executable, "-c", _SUPERVISOR, _CHILD, str(ready), "run"], env=_env()
    )
    started.append(sup)
    _wait_for(lambda: len(ready.read_text().splitlines()) == 2, 30, "both children", [sup])
    rows = [line.split() for line in ready.read_text().splitlines()]
    assert sorted(r[1] for r in rows) == ["0", "1"]  # one device each
    pids = [int(r[0]) for r in rows]
    assert all(int(r[2]) == pid for r, pid in zip(rows, pids, strict=True))  # own sessions
    sup.send_signal(signal.SIGTERM)
    assert sup.wait(timeout=20) == 0

    def gone(pid):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    _wait_for(lambda: all(gone(pid) for pid in pids), 10, "children to exit")


@pytest.mark.timeout(60)
def test_supervise_returns_first_failure(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", _SUPERVISOR, "", "", "fail"], env=_env(), timeout=30
    )
    assert proc.returncode == 3
