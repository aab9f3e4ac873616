"""``dasktune worker``: ``dask worker`` with the host's CPUs, GPUs and memory as resources.

Trials ask for ``{"cpu": .., "gpu": ..}``; Dask only places tasks with resource
restrictions on workers that advertise those tags, so every worker of a tuning cluster
must advertise ``CPU``, ``GPU`` and ``memory``. This command detects them, adds
``--resources`` and hands over to ``distributed.cli.dask_worker`` (exec: same PID, same
signals). ``--one-worker-per-gpu`` instead supervises one ``dask worker`` per GPU, each
seeing only its device.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence

import click

from dasktune import resources as _res
from dasktune.cli import main

logger = logging.getLogger(__name__)

_DASK_WORKER = [sys.executable, "-m", "distributed.cli.dask_worker"]

_EPILOG = """\b
Examples:
  dasktune worker tcp://10.0.0.5:8786
  dasktune worker tcp://10.0.0.5:8786 --resources "GPU=2,ssd=1" --memory-limit 32GB
  dasktune worker --scheduler-file sched.json --one-worker-per-gpu
  dasktune worker tcp://10.0.0.5:8786 --dry-run

\b
Every option not listed above goes to `dask worker` unchanged (see `dask worker --help`).
"""


@dataclasses.dataclass(frozen=True)
class Launch:
    """One ``dask worker`` process to start: its argv and environment overrides."""

    argv: list[str]
    env: dict[str, str] = dataclasses.field(default_factory=dict)

    def shell(self) -> str:
        """The launch as a copy-pasteable shell line."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        return f"{env} {shlex.join(self.argv)}" if env else shlex.join(self.argv)


def parse_resources_option(text: str | None) -> dict[str, float]:
    """``"GPU=2,ssd=1"`` or ``"GPU=2 ssd=1"`` -> ``{"GPU": 2.0, "ssd": 1.0}`` (Ray names mapped)."""
    out: dict[str, float] = {}
    if not text:
        return out
    for pair in text.replace(",", " ").split():
        key, sep, value = pair.partition("=")
        try:
            if not sep:
                raise ValueError("expected NAME=AMOUNT")
            tag = _res.canonical_key(key)
            amount = float(value)
            if not math.isfinite(amount) or amount < 0:
                raise ValueError("amount must be a finite number >= 0")
        except ValueError as e:
            raise click.BadParameter(f"{pair!r}: {e}", param_hint="--resources") from None
        out[tag] = amount
    return out


def _resources_arg(resources: Mapping[str, float]) -> str:
    """The ``--resources`` value ``dask worker`` parses (``k=v`` pairs, commas)."""
    return ",".join(
        f"{k}={int(v) if float(v).is_integer() else repr(float(v))}" for k, v in resources.items()
    )


def _memory_per_process(memory_limit: str | None, nthreads: int, total_cores: int) -> float:
    """What ``dask worker`` will use as ``memory_limit`` for a process of ``nthreads``."""
    from distributed.system import MEMORY_LIMIT
    from distributed.worker_memory import parse_memory_limit

    try:
        limit = parse_memory_limit(
            memory_limit or "auto", nthreads, total_cores=total_cores, logger=logger
        )
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--memory-limit") from None
    # No limit (0) still leaves the host's memory as the capacity trials may reserve.
    return float(limit or MEMORY_LIMIT)


def _resolve_nworkers(nworkers: str | None, cpus: int) -> tuple[int, int | None]:
    """``--nworkers`` as ``dask worker`` reads it -> (processes, threads if 'auto' chose them)."""
    if nworkers is None:
        return 1, None
    if nworkers == "auto":
        from distributed.deploy.utils import nprocesses_nthreads

        return nprocesses_nthreads(cpus)
    try:
        n = int(nworkers)
    except ValueError:
        raise click.BadParameter(
            f"expected an integer or 'auto', got {nworkers!r}", param_hint="--nworkers"
        ) from None
    n = cpus + 1 + n if n < 0 else n
    if n <= 0:
        raise click.BadParameter(f"{nworkers} leaves no worker process", param_hint="--nworkers")
    return n, None


def _accelerator_tags(gpus: Sequence[_res.GPUInfo]) -> dict[str, float]:
    return {f"accelerator_type:{_res.accelerator_type(g.name)}": 1.0 for g in gpus}


def plan_launches(
    passthrough: Sequence[str],
    *,
    resources: str | None = None,
    nthreads: int | None = None,
    nworkers: str | None = None,
    memory_limit: str | None = None,
    name: str | None = None,
    one_worker_per_gpu: bool = False,
    gpus: Sequence[_res.GPUInfo] | None = None,
) -> list[Launch]:
    """The ``dask worker`` processes ``dasktune worker`` starts, without starting them.

    User ``--resources`` values win over detected ones. ``--nthreads`` defaults to the
    ``CPU`` resource (detected cores, split across processes), and ``CPU`` to ``--nthreads``,
    so the two always agree. ``gpus`` overrides GPU detection.
    """
    if gpus is None:
        gpus = _res.detect_gpus()
    host = _res.detect_resources(gpus)
    cpus = int(host["CPU"])
    user = parse_resources_option(resources)
    if nthreads is not None and nthreads < 1:
        raise click.BadParameter("must be at least 1", param_hint="--nthreads")

    if one_worker_per_gpu:
        if nworkers is not None:
            raise click.UsageError(
                "--one-worker-per-gpu starts one process per GPU; drop --nworkers"
            )
        if not gpus:
            raise click.UsageError("--one-worker-per-gpu: no GPUs detected on this host")
        groups: list[tuple[list[_res.GPUInfo], dict[str, str]]] = [
            ([g], {"CUDA_VISIBLE_DEVICES": g.device_id}) for g in gpus
        ]
        n_procs, auto_threads = len(gpus), None
    else:
        n_procs, auto_threads = _resolve_nworkers(nworkers, cpus)
        if n_procs > 1 and gpus and "GPU" not in user:
            # Every process would see (and claim) every GPU.
            raise click.UsageError(
                "--nworkers > 1 on a GPU host would give each process all GPUs; "
                "use --one-worker-per-gpu, or set GPU in --resources yourself"
            )
        groups = [(list(gpus), {})]

    if nthreads is None:
        if "CPU" in user and user["CPU"] >= 1:
            nthreads = int(user["CPU"])
        else:
            nthreads = auto_threads or max(1, cpus // n_procs)

    launches = []
    for i, (group, env) in enumerate(groups):
        res: dict[str, float] = {
            "CPU": float(nthreads),
            "GPU": float(len(group)),
            "memory": _memory_per_process(memory_limit, nthreads, cpus),
            **_accelerator_tags(group),
        }
        res.update(user)
        if res.get("GPU", 0) <= 0:
            res = {k: v for k, v in res.items() if not k.startswith("accelerator_type:")}
            res.pop("GPU", None)
        argv = [*_DASK_WORKER, *passthrough, "--nthreads", str(nthreads)]
        if nworkers is not None:
            argv += ["--nworkers", str(n_procs)]
        if memory_limit is not None:
            argv += ["--memory-limit", memory_limit]
        if name is not None:
            # Workers need unique names; dask appends "-<i>" itself for --nworkers.
            argv += ["--name", f"{name}-gpu{i}" if one_worker_per_gpu else name]
        argv += ["--resources", _resources_arg(res)]
        if "dasktune.actor" not in passthrough:
            # The trial actor's module is imported as the worker starts, not inside the
            # first trial placed on it.
            argv += ["--preload", "dasktune.actor"]
        launches.append(Launch(argv, env))
    return launches


def _set_parent_death_signal() -> None:
    """In a child (Linux): get SIGTERM if the supervising parent dies, so none is orphaned."""
    if sys.platform != "linux":
        return
    import ctypes

    pr_set_pdeathsig = 1
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    except OSError:  # no glibc: orphans are still bounded by dask's --death-timeout
        return


def supervise(launches: Sequence[Launch]) -> int:
    """Run each launch as a child, forward SIGINT/SIGTERM/SIGHUP, return when all exited.

    Children get their own session so a terminal's Ctrl-C reaches them once (forwarded),
    not twice. Returns the first non-zero exit status (128+N for signal N), else 0.
    """
    procs: list[subprocess.Popen[bytes]] = []

    def forward(signum: int, _frame: object) -> None:
        sig = signal.SIGTERM if signum == signal.SIGHUP else signum
        for p in procs:
            if p.poll() is None:
                p.send_signal(sig)

    previous = {
        s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    }
    try:
        for launch in launches:
            procs.append(
                subprocess.Popen(
                    launch.argv,
                    env={**os.environ, **launch.env},
                    start_new_session=True,
                    preexec_fn=_set_parent_death_signal,  # noqa: PLW1509 - no threads yet here
                )
            )
            click.echo(f"dasktune worker: started PID {procs[-1].pid}: {launch.shell()}", err=True)
        codes = [p.wait() for p in procs]
    finally:
        forward(signal.SIGTERM, None)  # if we are leaving early (e.g. a failed Popen)
        for s, handler in previous.items():
            signal.signal(s, handler)
    failed = [c if c > 0 else 128 - c for c in codes if c != 0]
    return failed[0] if failed else 0


@main.command(
    "worker",
    epilog=_EPILOG,
    context_settings={
        "ignore_unknown_options": True,
        "allow_extra_args": True,
        "help_option_names": ["-h", "--help"],
    },
)
@click.argument(
    "dask_worker_args",
    nargs=-1,
    type=click.UNPROCESSED,
    metavar="SCHEDULER_ADDRESS [DASK WORKER OPTIONS]...",
)
@click.option(
    "--resources",
    default=None,
    help='Extra or overriding resources, like "GPU=2,ssd=1"; they win over detected ones.',
)
@click.option(
    "--nthreads", type=int, default=None, help="Threads per process [default: CPU resource]."
)
@click.option("--nworkers", default=None, help="Worker processes, as for `dask worker`.")
@click.option("--memory-limit", default=None, help="As for `dask worker` [default: auto].")
@click.option("--name", default=None, help="Worker name (suffixed -gpu<i> per GPU).")
@click.option(
    "--one-worker-per-gpu",
    is_flag=True,
    help="Start one dask worker per GPU, each with CUDA_VISIBLE_DEVICES=<that GPU>, GPU=1.",
)
@click.option("--dry-run", is_flag=True, help="Print the command(s) instead of running them.")
def worker(
    dask_worker_args: tuple[str, ...],
    resources: str | None,
    nthreads: int | None,
    nworkers: str | None,
    memory_limit: str | None,
    name: str | None,
    one_worker_per_gpu: bool,
    dry_run: bool,
) -> None:
    """Start a Dask worker that advertises this host's CPU, GPU and memory resources."""
    launches = plan_launches(
        dask_worker_args,
        resources=resources,
        nthreads=nthreads,
        nworkers=nworkers,
        memory_limit=memory_limit,
        name=name,
        one_worker_per_gpu=one_worker_per_gpu,
    )
    if dry_run:
        for launch in launches:
            click.echo(launch.shell())
        return
    if one_worker_per_gpu:
        sys.exit(supervise(launches))
    (launch,) = launches
    click.echo(f"dasktune worker: {launch.shell()}", err=True)
    sys.stdout.flush()
    sys.stderr.flush()
    # Replace ourselves: the caller keeps one PID and its signals reach dask directly.
    os.execvp(launch.argv[0], launch.argv)
