#!/usr/bin/env python
"""GPU isolation check for a real GPU host.

Starts a ``LocalCluster`` whose worker advertises the host's resources
(``dasktune.resources.detect_resources``), then runs on it:

* two tasks with ``resources={"GPU": 1}``: each takes a device from a per-worker
  ``GPUAllocator``, sets ``CUDA_VISIBLE_DEVICES`` to it and, in a fresh subprocess,
  allocates a tensor on CUDA and reports ``torch.cuda.current_device()``, the visible
  devices and the PCI bus id;
* one CPU-only task, whose subprocess must see no CUDA device.

Prints a JSON summary; exits 1 if isolation failed, 0 if it held or when there is no GPU
or no torch here (skipped). Usage: ``python scripts/gpu_check.py [--timeout SECONDS]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

# Run from a checkout without installing dasktune (here, in the workers and their tasks).
_REPO = str(Path(__file__).resolve().parents[1])
sys.path.insert(0, _REPO)
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [_REPO, os.environ.get("PYTHONPATH")]))

from dasktune.resources import (  # noqa: E402
    GPUAllocator,
    GPUInfo,
    detect_gpus,
    detect_resources,
    format_resources,
    worker_devices,
)

# Runs in the trial's fresh process: only what CUDA_VISIBLE_DEVICES lets it see.
_PROBE = r"""
import json, os, sys
import torch
out = {
    "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "available": torch.cuda.is_available(),
    "device_count": torch.cuda.device_count(),
}
if sys.argv[1] == "gpu":
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
        pci_bus_id="%08X:%02X:%02X.0" % tuple(ids) if None not in ids else None,
    )
print(json.dumps(out))
"""

_ALLOCATOR_ATTR = "_dasktune_gpu_check_allocator"


def _allocator(worker: object) -> GPUAllocator:
    # One ledger per worker process, shared by its task threads (dict.setdefault is atomic).
    return worker.__dict__.setdefault(_ALLOCATOR_ATTR, GPUAllocator())


def run_probe(label: str, gpus: float, timeout: float) -> dict:
    """A task: take ``gpus`` devices, run the probe in a subprocess that sees only them."""
    from distributed import get_worker

    worker = get_worker()
    key = str(worker.get_current_task())
    devices = worker_devices(
        worker.state.total_resources.get("GPU", 0), os.environ.get("CUDA_VISIBLE_DEVICES")
    )
    start = time.time()
    got = _allocator(worker).allocate(key, gpus, devices)
    if got is None:
        return {"label": label, "error": f"allocator refused {gpus} GPU of {devices}"}
    try:
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(got)}
        proc = subprocess.run(
            [sys.executable, "-c", _PROBE, "gpu" if gpus else "cpu"],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    finally:
        _allocator(worker).release(key)
    result = {"label": label, "allocated": got, "start": start, "end": time.time()}
    if proc.returncode != 0:
        result["error"] = f"probe exited {proc.returncode}: {proc.stderr.strip()[-2000:]}"
    else:
        result["probe"] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


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


def check(results: list[dict], gpus: list[GPUInfo]) -> list[str]:
    """Isolation failures found in the task results (empty: isolation held)."""
    failures = [f"{r['label']}: {r['error']}" for r in results if "error" in r]
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
        if overlapped and set(a["allocated"]) & set(b["allocated"]):
            failures.append(f"concurrent GPU tasks shared device(s) {a['allocated']}")
    return failures


def main(argv: list[str] | None = None) -> int:
    """Run the check; the exit status (0 ok or skipped, 1 failed)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeout", type=float, default=300, help="seconds per task")
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
        return 0

    from distributed import Client, LocalCluster

    print(f"host resources: {format_resources(host)}", file=sys.stderr)
    with (
        LocalCluster(
            n_workers=1,
            threads_per_worker=3,  # both GPU tasks and the CPU task may run at once
            processes=True,
            resources=host,
            dashboard_address=None,
        ) as cluster,
        Client(cluster) as client,
    ):
        futures = [
            client.submit(run_probe, f"gpu-{i}", 1, args.timeout, resources={"GPU": 1}, pure=False)
            for i in range(2)
        ]
        futures.append(
            client.submit(run_probe, "cpu", 0, args.timeout, resources={"CPU": 1}, pure=False)
        )
        results = client.gather(futures)
        leftover = client.run(
            lambda dask_worker: _allocator(dask_worker).in_use()  # nothing may stay allocated
        )
    failures = check(results, gpus)
    failures += [f"{w}: devices still allocated {u}" for w, u in leftover.items() if u]
    summary = {
        "ok": not failures,
        "failures": failures,
        "resources": host,
        "gpus": [dataclasses.asdict(g) for g in gpus],
        "tasks": results,
    }
    print(json.dumps(summary, indent=2, default=str))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
