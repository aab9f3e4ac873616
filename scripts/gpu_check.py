#!/usr/bin/env python
"""GPU isolation check for a real GPU host, through ``dasktune.Tuner``.

Starts dasktune's embedded cluster as one worker process that holds every detected GPU
(so concurrent trials share a worker process, the hard case), then runs one experiment:

* two GPU trials, ``tune.with_resources(trainable, {"gpu": 1})`` (``0.5`` on a one-GPU
  host, where they must share the device), that meet at a barrier so they surely run at
  once; each allocates a tensor on CUDA and reports ``torch.cuda.current_device()``, its
  ``CUDA_VISIBLE_DEVICES``, the device count and the PCI bus id;
* one CPU-only trial, which must see no CUDA device.

Then, on a host with two GPUs or more, a 2-GPU DDP trial: ``dasktune.train.torch.TorchTrainer``
with ``ScalingConfig(num_workers=2, use_gpu=True)`` on an embedded cluster of two worker
processes (one GPU each): both ranks must use nccl, see one distinct device each, and
``all_reduce`` and a DDP backward step must work across them (skipped with fewer GPUs).

Prints a JSON summary; exits 1 if a check failed, 0 if they held or when there is no GPU
or no torch here (skipped). Usage: ``python scripts/gpu_check.py [--timeout SECONDS]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Run from a checkout without installing dasktune (here, in the workers and their trials).
_REPO = str(Path(__file__).resolve().parents[1])
sys.path.insert(0, _REPO)
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [_REPO, os.environ.get("PYTHONPATH")]))

import dasktune as tune  # noqa: E402
from dasktune.resources import GPUInfo, detect_gpus, detect_resources, format_resources  # noqa: E402


def probe(config: dict[str, Any]) -> None:
    """The trial: what its own process sees of CUDA (GPU trials first wait for each other)."""
    start = time.time()
    gpu = _gpus(config)
    if gpu:
        mark = os.path.join(config["dir"], f"arrived-{config['label']}")
        open(mark, "w").close()
        deadline = time.monotonic() + config["timeout"]
        while len(glob.glob(os.path.join(config["dir"], "arrived-*"))) < 2:
            if time.monotonic() > deadline:
                raise TimeoutError("the other GPU trial never started: they did not overlap")
            time.sleep(0.05)
    import torch

    out: dict[str, Any] = {
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "available": torch.cuda.is_available(),
        "device_count": torch.cuda.device_count(),
        "trial_pid": os.getpid(),
    }
    if gpu:
        x = torch.ones(1 << 20, device="cuda")
        torch.cuda.synchronize()
        dev = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(dev)
        ids = [getattr(props, a, None) for a in ("pci_domain_id", "pci_bus_id", "pci_device_id")]
        out.update(
            current_device=dev,
            tensor_device=str(x.device),
            name=props.name,
            uuid=str(getattr(props, "uuid", "") or ""),
            pci_bus_id=None if None in ids else f"{ids[0]:08X}:{ids[1]:02X}:{ids[2]:02X}.0",
        )
        # Hold the device until the other GPU trial has its tensor too.
        open(os.path.join(config["dir"], f"allocated-{config['label']}"), "w").close()
        deadline = time.monotonic() + config["timeout"]
        while len(glob.glob(os.path.join(config["dir"], "allocated-*"))) < 2:
            if time.monotonic() > deadline:
                raise TimeoutError("the other GPU trial never allocated its tensor")
            time.sleep(0.05)
    tune.report({"probe": json.dumps(out), "start": start, "end": time.time()})


def _gpus(config: dict[str, Any]) -> float:
    return 0 if config["label"] == "cpu" else config["per_trial"]


def _request(config: dict[str, Any]) -> dict[str, float]:
    return {"gpu": _gpus(config), "cpu": 1} if _gpus(config) else {"cpu": 1}


def run_trials(per_trial: float, timeout: float) -> list[dict[str, Any]]:
    """Run the three trials; one dict per trial in the shape :func:`check` reads."""
    with tempfile.TemporaryDirectory(prefix="dasktune-gpu-check-") as tmp:
        labels = ["gpu-0", "gpu-1", "cpu"]
        space = {"label": tune.grid_search(labels), "dir": tmp, "timeout": timeout,
                 "per_trial": per_trial}
        tuner = tune.Tuner(
            tune.with_resources(probe, _request), param_space=space,
            tune_config=tune.TuneConfig(max_concurrent_trials=3),
            run_config=tune.RunConfig(name="gpu_check", storage_path=os.path.join(tmp, "res"),
                                      verbose=0),
        )
        grid = tuner.fit()
        out = []
        for res in grid:
            config = res.config
            if config is None:  # failed before its first report: read what it was given
                with open(os.path.join(res.path, "params.json")) as f:
                    config = json.load(f)
            label = config["label"]
            if res.error is not None:
                out.append({"label": label, "error": str(res.error)[-2000:]})
                continue
            p = json.loads(res.metrics["probe"])
            allocated = [t for t in (p["cuda_visible_devices"] or "").split(",") if t]
            out.append({"label": label, "allocated": allocated, "start": res.metrics["start"],
                        "end": res.metrics["end"], "worker": res.metrics["worker"],
                        "probe": p})
        return out


def ddp_loop(config: dict[str, Any]) -> None:
    """A rank of the 2-GPU DDP trial: rank 0 reports what every rank saw."""
    import torch
    import torch.distributed as dist

    from dasktune import train
    from dasktune.train.torch import get_device, prepare_model

    device = get_device()
    model = prepare_model(torch.nn.Linear(8, 1))
    model(torch.ones(4, 8, device=device)).sum().backward()  # DDP's gradient all-reduce
    total = torch.tensor([dist.get_rank() + 1.0], device=device)
    dist.all_reduce(total)
    seen = {"rank": dist.get_rank(), "backend": dist.get_backend(),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "device_count": torch.cuda.device_count(), "device": str(device),
            "pci_bus_id": torch.cuda.get_device_properties(device).pci_bus_id
            if hasattr(torch.cuda.get_device_properties(device), "pci_bus_id") else None,
            "wrapped": type(model).__name__, "sum": total.item()}
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, seen)
    train.report({"ranks": json.dumps(everyone)})


def run_ddp(gpus: list[GPUInfo]) -> dict[str, Any]:
    """The 2-GPU DDP trial; ``{"skipped": why}`` with fewer than two GPUs, else
    ``{"failures": [...], "ranks": [...]}``."""
    if len(gpus) < 2:
        return {"skipped": f"the 2-GPU DDP trial needs 2 GPUs, this host has {len(gpus)}"}
    from dasktune import train
    from dasktune.train.torch import TorchTrainer

    tune.init(num_cpus=2, dashboard_address="127.0.0.1:0")  # two workers, a GPU each
    try:
        with tempfile.TemporaryDirectory(prefix="dasktune-gpu-ddp-") as tmp:
            result = TorchTrainer(
                ddp_loop, scaling_config=train.ScalingConfig(num_workers=2, use_gpu=True),
                run_config=train.RunConfig(name="gpu_ddp", storage_path=tmp)).fit()
            ranks = json.loads(result.metrics["ranks"])
    except Exception as exc:  # noqa: BLE001 - reported as the check's failure
        return {"failures": [f"the DDP trial failed: {exc}"[-2000:]], "ranks": []}
    finally:
        tune.shutdown()
    failures = []
    if sorted(r["rank"] for r in ranks) != [0, 1]:
        failures.append(f"expected ranks 0 and 1, got {ranks}")
    for r in ranks:
        if r["backend"] != "nccl":
            failures.append(f"rank {r['rank']} used {r['backend']}, not nccl")
        if r["device_count"] != 1:
            failures.append(f"rank {r['rank']} sees {r['device_count']} devices, not 1")
        if r["sum"] != 3.0 or r["wrapped"] != "DistributedDataParallel":
            failures.append(f"rank {r['rank']}: all_reduce {r['sum']} (3 expected), model "
                            f"{r['wrapped']}")
    if len({r["cuda_visible_devices"] for r in ranks}) != len(ranks):
        failures.append(f"the ranks share a device: {ranks}")
    buses = [r["pci_bus_id"] for r in ranks if r["pci_bus_id"]]
    if len(set(buses)) != len(buses):
        failures.append(f"the ranks run on the same PCI device: {buses}")
    return {"failures": failures, "ranks": ranks}


def _expected_gpu(token: str, gpus: list[GPUInfo]) -> GPUInfo | None:
    for g in gpus:
        if (token.isdigit() and g.index == int(token)) or (g.uuid and g.uuid.startswith(token)):
            return g
    return None


def _same_bus(a: str, b: str) -> bool:
    # NVML writes "00000000:19:00.0"; compare domain/bus/device numerically.
    def parts(s: str) -> list[int]:
        return [int(p, 16) for p in s.replace(".", ":").split(":")]

    return parts(a) == parts(b)


def check(results: list[dict], gpus: list[GPUInfo], shared: bool = False) -> list[str]:
    """Isolation failures found in the trial results (empty: isolation held).

    ``shared``: the two GPU trials asked for half a GPU each and must share one device;
    otherwise they must have distinct devices.
    """
    failures = [f"{r['label']}: {r['error'].strip().splitlines()[-1]}"  # full text: "tasks"
                for r in results if "error" in r]
    ok = [r for r in results if "error" not in r]
    for r in ok:
        p, label = r["probe"], r["label"]
        if label == "cpu":
            if p["available"] or p["device_count"] != 0:
                failures.append(f"cpu: sees {p['device_count']} CUDA device(s)")
            continue
        if len(r["allocated"]) != 1 or p["device_count"] != 1:
            failures.append(f"{label}: allocated {r['allocated']}, sees {p['device_count']}")
        if p.get("current_device") != 0 or p.get("tensor_device") != "cuda:0":
            failures.append(f"{label}: current device {p.get('current_device')}")
        want = _expected_gpu(r["allocated"][0], gpus) if r["allocated"] else None
        if want is not None and want.pci_bus_id and p.get("pci_bus_id"):
            if not _same_bus(want.pci_bus_id, p["pci_bus_id"]):
                failures.append(f"{label}: on {p['pci_bus_id']}, expected {want.pci_bus_id}")
        if want is not None and want.uuid and p.get("uuid") and p["uuid"] not in want.uuid:
            failures.append(f"{label}: uuid {p['uuid']}, expected {want.uuid}")
    on_gpu = [r for r in ok if r["label"] != "cpu"]
    if len(on_gpu) == 2:
        a, b = on_gpu
        overlapped = a["start"] < b["end"] and b["start"] < a["end"]
        if not overlapped:
            failures.append("the two GPU trials did not run at the same time")
        if shared and a["allocated"] != b["allocated"]:
            failures.append(f"half-GPU trials got {a['allocated']} and {b['allocated']}")
        if not shared and set(a["allocated"]) & set(b["allocated"]):
            failures.append(f"concurrent GPU trials shared device(s) {a['allocated']}")
        if a["probe"]["trial_pid"] == b["probe"]["trial_pid"]:
            failures.append("the two GPU trials ran in one process")
    return failures


def main(argv: list[str] | None = None) -> int:
    """Run the check; the exit status (0 ok or skipped, 1 failed)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeout", type=float, default=300, help="seconds a trial waits for its peer")
    args = parser.parse_args(argv)

    try:
        import torch
    except ImportError:
        print("SKIP: torch is not installed")
        return 0
    # Index tokens in CUDA_VISIBLE_DEVICES then mean what NVML / nvidia-smi index means.
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    gpus = detect_gpus()
    host = detect_resources(gpus)
    if not gpus:
        if torch.cuda.is_available():
            print(json.dumps({"ok": False, "failures": ["torch sees CUDA, detection found none"]}))
            return 1
        print("SKIP: no GPU on this host")
        print(f"SKIP: {run_ddp(gpus)['skipped']}")
        return 0

    print(f"host resources: {format_resources(host)}", file=sys.stderr)
    # Two whole GPUs per trial pair when there are two; one shared GPU otherwise.
    per_trial = 1 if len(gpus) >= 2 else 0.5
    # One worker process with every GPU and room for all three trials at once.
    tune.init(num_cpus=1, threads_per_worker=3, dashboard_address="127.0.0.1:0")
    try:
        results = run_trials(per_trial, args.timeout)
    finally:
        tune.shutdown()
    failures = check(results, gpus, shared=per_trial < 1)
    ddp = run_ddp(gpus)
    failures += ddp.get("failures", [])
    summary = {
        "ok": not failures,
        "failures": failures,
        "resources": host,
        "gpu_per_trial": per_trial,
        "gpus": [dataclasses.asdict(g) for g in gpus],
        "tasks": results,
        "ddp": ddp,
    }
    print(json.dumps(summary, indent=2, default=str))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
