"""Checkpoint save/restore throughput against raw fsspec transfers, and driver memory.

For each target (local disk, S3 on moto's server over HTTP on 127.0.0.1) and each
checkpoint shape (1 MiB x 100 files, 256 MiB x 2 files), measures in the same run:

- save: ``ExperimentStorage.commit_checkpoint`` (upload + manifest) vs raw ``fs.put``
  of the same files;
- restore: ``Checkpoint.to_directory`` vs raw ``fs.get`` of the same files;
- the peak growth of this process's RSS while saving and restoring, which must not
  grow with the checkpoint's size (transfers stream from and to disk).

Each target and shape runs in a fresh process whose memory is measured on dasktune's
first save and restore, before any raw transfer, and moto runs in another process, so
no one else's allocations count as ours. Timings then alternate dasktune and raw.

    python benchmarks/storage.py            # full sizes
    python benchmarks/storage.py --small    # 1 MiB x 20 and 16 MiB x 2

``--s3-paths`` compares, on S3 only, the two ways dasktune could move checkpoint files:
its own requests (``put_files``/``get_files``, which drive s3fs's ``_call_s3``) and
s3fs's public ``put``/``get`` with the same bounds (:func:`dasktune.transfer.transfer_kwargs`:
``batch_size`` files, ``chunksize`` parts, ``max_concurrency``). Each path runs in a
fresh process (memory first, then the best of ``--reps`` timings):

    python benchmarks/storage.py --s3-paths --small
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil

from dasktune.checkpoint import Checkpoint
from dasktune.storage import ExperimentStorage

MiB = 2**20


@dataclass
class Row:
    target: str
    shape: str
    op: str
    mib: float
    dasktune_s: float
    raw_s: float
    peak_rss_mib: float
    rss_mib: float

    @property
    def ratio(self) -> float:
        return self.raw_s / self.dasktune_s  # throughput ratio (1.0 = as fast as raw)


class PeakRss:
    """Samples this process's RSS in a thread; ``peak`` is the growth over the start."""

    def __init__(self) -> None:
        self.proc = psutil.Process()
        self.base = self.proc.memory_info().rss
        self.peak = 0
        self.peak_abs = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            rss = self.proc.memory_info().rss
            self.peak, self.peak_abs = max(self.peak, rss - self.base), max(self.peak_abs, rss)
            time.sleep(0.01)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.proc.memory_info().rss - self.base)


def make_files(root: str, n: int, size: int) -> str:
    src = os.path.join(root, f"src-{n}x{size}")
    os.makedirs(src)
    block = os.urandom(MiB)
    for i in range(n):
        with open(os.path.join(src, f"part-{i:04d}.bin"), "wb") as f:
            for _ in range(size // MiB):
                f.write(block)
            f.write(block[: size % MiB])
    return src


def best_of_interleaved(reps: int, ours: Callable[[], object], raw: Callable[[], object],
                        between: Callable[[], object]) -> tuple[float, float]:
    """Best times of ``ours`` and ``raw``, run alternately (page cache, disk writeback and
    the endpoint's warm-up then favour neither side)."""
    times: dict[str, list[float]] = {"ours": [], "raw": []}
    for _ in range(reps):
        for key, fn in (("ours", ours), ("raw", raw)):
            between()
            t0 = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - t0)
    return min(times["ours"]), min(times["raw"])


def start_moto() -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("moto server did not start")


def bench_shape(name: str, storage: ExperimentStorage, n: int, size: int, work: str,
                reps: int) -> list[Row]:
    """Save and restore one checkpoint shape, with dasktune and raw fsspec."""
    fs = storage.fs
    src = make_files(work, n, size)
    names = sorted(os.listdir(src))
    lpaths = [os.path.join(src, x) for x in names]
    mib = n * size / MiB
    shape = f"{size // MiB} MiB x {n}"
    trial = storage.trial_path(f"bench_{n}x{size}")
    raw_dir = f"{trial}/raw"
    out = os.path.join(work, "out")
    counter = [0]

    def save() -> None:
        counter[0] += 1
        storage.commit_checkpoint(src, trial, counter[0], {})

    def raw_put() -> None:
        fs.makedirs(raw_dir, exist_ok=True)  # a no-op on object stores
        fs.put(lpaths, [f"{raw_dir}/{x}" for x in names])

    def clean() -> None:
        storage.delete(trial)

    def wipe() -> None:
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)

    # Memory first, in a fresh process (see main), before any raw transfer: what raw
    # transfers allocate and free could hide, or inflate, dasktune's growth.
    clean()
    with PeakRss() as rss_save:
        ckpt = Checkpoint(storage.commit_checkpoint(src, trial, 0, {}), fs)
    wipe()
    with PeakRss() as rss_restore:
        ckpt.to_directory(out)
    # Then timings, dasktune and raw alternately, of the same files.
    t_save, t_put = best_of_interleaved(reps, save, raw_put, clean)
    clean()
    ckpt = Checkpoint(storage.commit_checkpoint(src, trial, 0, {}), fs)
    raw_put()
    t_restore, t_get = best_of_interleaved(
        reps, lambda: ckpt.to_directory(out),
        lambda: fs.get([f"{raw_dir}/{x}" for x in names], [os.path.join(out, x) for x in names]),
        wipe)
    wipe()
    clean()
    shutil.rmtree(src)
    return [Row(name, shape, "save", mib, t_save, t_put, rss_save.peak / MiB,
                rss_save.peak_abs / MiB),
            Row(name, shape, "restore", mib, t_restore, t_get, rss_restore.peak / MiB,
                rss_restore.peak_abs / MiB)]


def bench_paths(storage: ExperimentStorage, n: int, size: int, work: str, reps: int,
                path: str) -> list[dict[str, float | str]]:
    """Upload and download one shape through ``path`` ("dasktune": put_files/get_files,
    or "public": s3fs's fs.put/fs.get with transfer_kwargs); RSS growth, then best time."""
    from dasktune.transfer import get_files, put_files, transfer_kwargs

    fs = storage.fs
    src = make_files(work, n, size)
    names = sorted(os.listdir(src))
    lpaths = [os.path.join(src, x) for x in names]
    rdir = storage.trial_path(f"paths_{n}x{size}")
    rpaths = [f"{rdir}/{x}" for x in names]
    out = os.path.join(work, "out")
    lout = [os.path.join(out, x) for x in names]
    if path == "dasktune":
        def up() -> None:
            put_files(fs, lpaths, rpaths)

        def down() -> None:
            get_files(fs, rpaths, lout)
    else:
        def up() -> None:
            fs.put(lpaths, rpaths, **transfer_kwargs(fs, "put"))

        def down() -> None:
            fs.get(rpaths, lout, **transfer_kwargs(fs, "get"))

    def wipe() -> None:
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)

    with PeakRss() as rss_up:
        up()
    wipe()
    with PeakRss() as rss_down:
        down()
    assert sorted(os.path.getsize(p) for p in lout) == [size] * n
    t_up = t_down = float("inf")
    for _ in range(reps):
        storage.delete(rdir)
        t0 = time.perf_counter()
        up()
        t_up = min(t_up, time.perf_counter() - t0)
        wipe()
        t0 = time.perf_counter()
        down()
        t_down = min(t_down, time.perf_counter() - t0)
    storage.delete(rdir)
    mib = n * size / MiB
    shape = f"{size // MiB} MiB x {n}"
    return [{"shape": shape, "path": path, "op": op, "mib_s": mib / t, "peak_rss_mib": r / MiB}
            for op, t, r in (("upload", t_up, rss_up.peak), ("download", t_down, rss_down.peak))]


def make_storage(target: str, endpoint: str | None, work: str) -> ExperimentStorage:
    if target == "local":
        return ExperimentStorage(os.path.join(work, "results"), "bench")
    import s3fs

    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint})
    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    fs.mkdir(bucket)
    return ExperimentStorage(f"s3://{bucket}/runs", "bench", filesystem=fs)


def run_one(target: str, n: int, size: int, endpoint: str | None, reps: int,
            path: str | None = None) -> list[Any]:
    """One target and shape (and, with ``path``, one S3 transfer path), in this (fresh)
    process."""
    work = tempfile.mkdtemp(prefix="dasktune-bench-")
    try:
        storage = make_storage(target, endpoint, work)
        # warm up (imports, sessions, connection pools) so RSS growth is the transfers' own
        warm = make_files(work, 2, MiB)
        storage.commit_checkpoint(warm, storage.trial_path("warmup"), 0, {})
        Checkpoint(storage.trial_path("warmup/checkpoint_000000"), storage.fs).to_directory(
            warm + "-out")
        storage.delete(storage.trial_path("warmup"))
        if path is not None:
            return bench_paths(storage, n, size, work, reps, path)
        return bench_shape("s3-moto" if target == "s3" else target, storage, n, size, work,
                           reps)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", action="store_true", help="1 MiB x 20 and 16 MiB x 2")
    parser.add_argument("--reps", type=int, default=3, help="repetitions (best is kept)")
    parser.add_argument("--targets", default="local,s3", help="comma-separated: local,s3")
    parser.add_argument("--s3-paths", action="store_true",
                        help="S3 only: dasktune's own requests vs s3fs's public put/get")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # child: "target:n:size[:path]"
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    if args.one:
        target, n, size, *path = args.one.split(":")
        rows = run_one(target, int(n), int(size), args.endpoint, args.reps,
                       path[0] if path else None)
        print(json.dumps([r if isinstance(r, dict) else r.__dict__ for r in rows]))
        return
    shapes = [(20, MiB), (2, 16 * MiB)] if args.small else [(100, MiB), (2, 256 * MiB)]
    if args.s3_paths:
        compare_s3_paths(shapes, args.reps)
        return
    targets = args.targets.split(",")
    for t in targets:
        if t not in ("local", "s3"):
            raise ValueError(f"--targets: unknown target {t!r} (use local, s3)")
    rows: list[Row] = []
    moto, endpoint = start_moto() if "s3" in targets else (None, None)
    try:
        for target in targets:
            for n, size in shapes:
                cmd = [sys.executable, __file__, "--one", f"{target}:{n}:{size}",
                       "--reps", str(args.reps)] + (["--endpoint", endpoint] if endpoint else [])
                out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                rows += [Row(**r) for r in json.loads(out.strip().splitlines()[-1])]
    finally:
        if moto is not None:
            moto.kill()
            moto.wait()
    print(f"{'target':<8} {'checkpoint':<13} {'op':<8} {'dasktune MiB/s':>14} "
          f"{'raw MiB/s':>10} {'ratio':>6} {'peak RSS +MiB':>14} {'peak RSS MiB':>13}")
    for r in rows:
        print(f"{r.target:<8} {r.shape:<13} {r.op:<8} {r.mib / r.dasktune_s:>14.1f} "
              f"{r.mib / r.raw_s:>10.1f} {r.ratio:>6.2f} {r.peak_rss_mib:>14.1f} {r.rss_mib:>13.0f}")


def compare_s3_paths(shapes: list[tuple[int, int]], reps: int) -> None:
    """Each shape through each S3 path, each in a fresh process; one table."""
    moto, endpoint = start_moto()
    rows: list[dict[str, Any]] = []
    try:
        for n, size in shapes:
            for path in ("dasktune", "public"):
                cmd = [sys.executable, __file__, "--one", f"s3:{n}:{size}:{path}",
                       "--reps", str(reps), "--endpoint", endpoint]
                out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                rows += json.loads(out.strip().splitlines()[-1])
    finally:
        moto.kill()
        moto.wait()
    print(f"{'checkpoint':<13} {'op':<9} {'path':<9} {'MiB/s':>8} {'peak RSS +MiB':>14}")
    for r in rows:
        print(f"{r['shape']:<13} {r['op']:<9} {r['path']:<9} {r['mib_s']:>8.1f} "
              f"{r['peak_rss_mib']:>14.1f}")


if __name__ == "__main__":
    main()
