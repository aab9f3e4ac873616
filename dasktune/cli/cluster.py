"""Cluster commands: ``dasktune up / down / submit / exec / status / dashboard / logs /
kill-random-worker / rsync-up / rsync-down CLUSTER.yaml``. Thin over :mod:`dasktune.cluster`."""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import click

from dasktune.cli import main

_NAME = click.option("-n", "--name", default=None,
                     help="Cluster name (overrides cluster_name; runs several from one file).")
_YES = click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
_CLUSTER = click.argument("cluster_file", metavar="CLUSTER.yaml",
                          type=click.Path(dir_okay=False))


def _echo(msg: str) -> None:
    click.echo(msg, err=True)


def _fails_cleanly(fn: Callable[..., Any]) -> Callable[..., Any]:
    """One ``error: ...`` line instead of a traceback, unless ``dasktune --verbose``."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        try:
            return fn(*args, **kwargs)
        except (click.ClickException, click.exceptions.Exit, click.Abort, BrokenPipeError):
            raise  # click ends a closed pipe (`status | head`) quietly
        except Exception as e:  # noqa: BLE001 - the CLI boundary
            if ctx.find_root().obj and ctx.find_root().obj.get("verbose"):
                raise
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            click.echo(f"error: {msg}", err=True)
            sys.exit(1)

    return wrapper


def _provider(cluster_file: str, name: str | None) -> Any:
    from dasktune.cluster import get_provider, load_cluster_config

    return get_provider(load_cluster_config(cluster_file), name)


@main.command("up", epilog="\b\nExamples:\n  dasktune up cluster/local.yaml -y\n"
              "  dasktune up cluster/aws-spot.yaml -n exp2 --restart-only")
@_CLUSTER
@_YES
@_NAME
@click.option("--restart-only", is_flag=True,
              help="Restart the Dask processes without running setup_commands.")
@click.option("--timeout", default=300.0, show_default=True,
              help="Seconds to wait for the scheduler and min_workers workers.")
@_fails_cleanly
def up(cluster_file: str, yes: bool, name: str | None, restart_only: bool,
       timeout: float) -> None:
    """Start (or update) the cluster in CLUSTER.yaml; it keeps running after the command."""
    p = _provider(cluster_file, name)
    if not yes and p.kind != "local":
        click.confirm(f"Start cluster {p.name!r} on {p.kind} (this costs money)?", abort=True)
    start = time.monotonic()
    state = p.up(restart_only=restart_only, timeout=timeout, progress=_echo)
    p.state.update(config_path=os.path.abspath(cluster_file))
    click.echo(f"cluster {p.name!r} is up ({time.monotonic() - start:.1f}s): "
               f"{state['scheduler_address']}")
    if state.get("dashboard_url"):
        click.echo(f"dashboard: {state['dashboard_url']}")


@main.command("down", epilog="\b\nExample:\n  dasktune down cluster/local.yaml -y")
@_CLUSTER
@_YES
@_NAME
@_fails_cleanly
def down(cluster_file: str, yes: bool, name: str | None) -> None:
    """Tear the cluster down: stop every process / terminate every instance it started."""
    p = _provider(cluster_file, name)
    if not yes and p.kind != "local":
        click.confirm(f"Terminate cluster {p.name!r}?", abort=True)
    p.down(progress=_echo)
    click.echo(f"cluster {p.name!r} is down")


@main.command("submit", context_settings={"ignore_unknown_options": True},
              epilog="\b\nExamples:\n  dasktune submit cluster/local.yaml examples/tune.py"
              " -- --num-samples 8\n  dasktune submit cluster/aws-spot.yaml train.py --start"
              " --stop --detach")
@_CLUSTER
@click.argument("script", type=click.Path(dir_okay=False))
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@_NAME
@click.option("--start", is_flag=True, help="Bring the cluster up first.")
@click.option("--stop", is_flag=True, help="Tear the cluster down when the script ends.")
@click.option("--detach", is_flag=True,
              help="Keep the script running after this terminal goes; read it with `logs`.")
@_fails_cleanly
def submit(cluster_file: str, script: str, script_args: tuple[str, ...], name: str | None,
           start: bool, stop: bool, detach: bool) -> None:
    """Run SCRIPT as the driver on the cluster, with `--address <scheduler>` appended."""
    p = _provider(cluster_file, name)
    if start:
        p.up(progress=_echo)
    if p.state.exists():  # a detached `--stop` runs `dasktune down` on this file later
        p.state.update(config_path=os.path.abspath(cluster_file))
    code, job = p.submit(script, list(script_args), detach=detach, then_down=stop)
    if job:
        click.echo(f"submitted {job}; read its output with: "
                   f"dasktune logs {cluster_file}{' -n ' + name if name else ''} {job}")
        return
    if stop:
        p.down(progress=_echo)
    sys.exit(code)


@main.command("logs", epilog="\b\nExample:\n  dasktune logs cluster/local.yaml --follow")
@_CLUSTER
@click.argument("job", required=False)
@_NAME
@click.option("-f", "--follow", is_flag=True, help="Keep printing until the job ends.")
@_fails_cleanly
def logs(cluster_file: str, job: str | None, name: str | None, follow: bool) -> None:
    """Print the output of a detached job (the latest one by default)."""
    p = _provider(cluster_file, name)
    if follow and hasattr(p, "follow"):  # a cloud head streams by offset
        p.follow(job)
        return
    shown = 0
    while True:
        text, running = p.logs(job)
        click.echo(text[shown:], nl=False)
        shown = len(text)
        if not (follow and running):
            return
        time.sleep(0.5)


@main.command("exec", epilog="\b\nExamples:\n  dasktune exec cluster/local.yaml \"nvidia-smi\"\n"
              "  dasktune exec cluster/aws-spot.yaml \"tensorboard --logdir ~/dasktune_results"
              " --port 6006\" --port-forward 6006")
@_CLUSTER
@click.argument("command")
@_NAME
@click.option("--port-forward", "forwards", multiple=True, metavar="PORT|LOCAL:REMOTE",
              help="Make the command's port on the head reachable at localhost (through "
                   "the scheduler's connection, no SSH); repeatable.")
@_fails_cleanly
def exec_(cluster_file: str, command: str, name: str | None, forwards: tuple[str, ...]) -> None:
    """Run a shell command on the head node (here, for a local cluster)."""
    from dasktune.cluster.tunnel import PortForward, TunnelPlugin, parse_forward

    p = _provider(cluster_file, name)
    pairs = [parse_forward(f) for f in forwards]
    if getattr(p, "head_is_here", False):
        # The head is this machine: a port forwarded to itself is already here.
        pairs = [(a, b) for a, b in pairs if a != b]
    forward = None
    if pairs:
        with p.connect() as client:
            client.register_plugin(TunnelPlugin())
        forward = PortForward(p.address, pairs, security=p.security())
        forward.start()
        for local, remote in pairs:
            _echo(f"forwarding localhost:{local} -> port {remote} on the head")
    try:
        code = p.exec(command)
    finally:
        if forward is not None:
            forward.stop()
    sys.exit(code)


def _fmt_resources(res: dict[str, Any]) -> str:
    return " ".join(f"{k}={v:g}" for k, v in sorted(res.items()) if k != "memory") or "-"


def _experiments_on_scheduler(dask_scheduler: Any = None) -> list[dict[str, Any]]:
    """On the scheduler: summaries of the experiments that published to the dashboard topic.

    The dashboard plugin's state when it is installed (it holds every experiment, however
    old its first message); else the scheduler's bounded event log, folded the same way.
    """
    from dasktune.dashboard import TOPIC, DashboardState
    from dasktune.dashboard._plugin import PLUGIN_NAME

    state = getattr(dask_scheduler.plugins.get(PLUGIN_NAME), "state", None)
    if state is None:
        state = DashboardState()
        for _, msg in dask_scheduler.get_events(TOPIC):
            try:
                state.apply(msg)
            except ValueError:  # a malformed message: the plugin logs those, skip it here
                pass
    return state.experiments()


@main.command("status", epilog="\b\nExample:\n  dasktune status cluster/local.yaml")
@_CLUSTER
@_NAME
@_fails_cleanly
def status(cluster_file: str, name: str | None) -> None:
    """Address, dashboard URL, workers with their resources, detached jobs, experiments."""
    p = _provider(cluster_file, name)
    workers = p.workers()
    click.echo(f"cluster:   {p.name} ({p.kind})")
    click.echo(f"address:   {p.address}")
    click.echo(f"dashboard: {p.dashboard_url() or '-'}")
    click.echo(f"workers:   {len(workers)}")
    for w in workers:
        mem = w["memory_limit"]
        mem_s = f"{mem / 2**30:.1f} GiB" if mem else "-"
        click.echo(f"  {w['name']:<28} {w['address']:<26} threads={w['nthreads']} "
                   f"mem={mem_s} {_fmt_resources(w['resources'])}")
    if hasattr(p, "batch_jobs"):
        batch = p.batch_jobs()
        click.echo(f"{p.kind} jobs: {len(batch)}")
        for j in batch:
            left = j["time_left"]
            left_s = "-" if left is None else time.strftime("%H:%M:%S", time.gmtime(left))
            click.echo(f"  {j['job_id']:<10} {j['name']:<20} {j['state'].lower():<10} "
                       f"time left {left_s}")
    jobs = p.jobs() if hasattr(p, "jobs") else []
    if jobs:
        click.echo("jobs:")
        for job, running in jobs:
            click.echo(f"  {job} {'running' if running else 'finished'}")
    with p.connect() as client:
        experiments = client.run_on_scheduler(_experiments_on_scheduler)
    click.echo(f"experiments: {len(experiments)}")
    # Running ones first; within each group, newest first (the order the summaries come in).
    for e in sorted(experiments, key=lambda e: e.get("status") != "RUNNING"):
        trials = " ".join(f"{k}={v}" for k, v in (e.get("trials_by_status") or {}).items())
        click.echo(f"  {e.get('name')} {str(e.get('status') or '?').lower()} "
                   f"trials: {trials or '-'} storage: {e.get('storage') or '-'}")


@main.command("dashboard", epilog="\b\nExamples:\n  dasktune dashboard cluster/local.yaml"
              " --open\n  dasktune dashboard ~/dasktune_results/my_exp")
@click.argument("target", metavar="CLUSTER.yaml|PATH_OR_URI")
@_NAME
@click.option("--open", "open_", is_flag=True, help="Open it in a browser.")
@click.option("--port", default=0, help="For an experiment path: port to serve on.")
@click.pass_context
@_fails_cleanly
def dashboard(ctx: click.Context, target: str, name: str | None, open_: bool,
              port: int) -> None:
    """Print (and optionally open) a cluster's dashboard URL, or serve an experiment's page."""
    if not (target.endswith((".yaml", ".yml")) and os.path.isfile(target)):
        from dasktune.cli.experiments import serve_experiments

        serve_experiments(target, port=port, open_browser=open_)
        return
    url = _provider(target, name).dashboard_url()
    if not url:
        raise ValueError("this cluster records no dashboard URL")
    click.echo(url)
    if open_:
        import webbrowser

        webbrowser.open(url)


@main.command("kill-random-worker",
              epilog="\b\nExamples:\n  dasktune kill-random-worker cluster/local.yaml --hard\n"
              "  dasktune kill-random-worker cluster/aws-spot.yaml   # graceful retire")
@_CLUSTER
@_NAME
@click.option("--hard", is_flag=True,
              help="Kill the process / terminate the instance instead of retiring gracefully.")
@_fails_cleanly
def kill_random_worker(cluster_file: str, name: str | None, hard: bool) -> None:
    """Chaos for fault-tolerance checks: take one random worker away."""
    p = _provider(cluster_file, name)
    if hard:
        click.echo(f"killed {p.kill_worker_hard()}")
    else:
        click.echo(f"retired {p.retire_random_worker()}")


@main.command("rsync-up", epilog="\b\nExample:\n  dasktune rsync-up cluster/local.yaml ./src")
@_CLUSTER
@click.argument("src")
@click.argument("dst", required=False)
@_NAME
@_fails_cleanly
def rsync_up(cluster_file: str, src: str, dst: str | None, name: str | None) -> None:
    """Send a file or folder to every worker, including ones that join later."""
    where = _provider(cluster_file, name).rsync_up(src, dst)
    click.echo(f"uploaded {src} to {where}")


@main.command("rsync-down", epilog="\b\nExample:\n  dasktune rsync-down cluster/aws-spot.yaml"
              " s3://bucket/runs/exp ./results")
@_CLUSTER
@click.argument("src")
@click.argument("dst")
@_NAME
@_fails_cleanly
def rsync_down(cluster_file: str, src: str, dst: str, name: str | None) -> None:
    """Copy results from storage (a folder or fsspec URI like s3://...) to a local folder."""
    from dasktune.cluster import load_cluster_config

    load_cluster_config(cluster_file)
    from dasktune.cluster._base import ClusterProvider

    click.echo(f"copied to {ClusterProvider.rsync_down(src, dst)}")
