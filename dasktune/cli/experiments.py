"""``dasktune ls`` and ``dasktune dashboard PATH``: the experiments and trials under a
results folder or URI."""

from __future__ import annotations

import posixpath
import sys
import time
from typing import Any

import click

from dasktune import _dask_config
from dasktune.cli import main


def _fail(ctx: click.Context, exc: BaseException) -> None:
    if isinstance(exc, BrokenPipeError) or (ctx.obj and ctx.obj.get("verbose")):
        raise exc
    click.echo(f"error: {exc}", err=True)
    sys.exit(1)


def _experiments_under(path: str) -> list[tuple[Any, dict[str, Any]]]:
    """(storage, state) for the experiment at ``path`` or each one directly under it."""
    from dasktune.experiment import read_state
    from dasktune.storage import STATE_FILE, ExperimentStorage

    found = []
    here = ExperimentStorage.from_experiment_path(path)
    if here.exists(here.path(STATE_FILE)):
        return [(here, read_state(here))]
    root = ExperimentStorage(path, "")
    fs = root.fs
    try:
        entries = fs.ls(root.storage_root, detail=True)
    except FileNotFoundError:
        raise click.ClickException(f"no such folder: {path}") from None
    for entry in sorted(entries, key=lambda e: e["name"]):
        if entry.get("type") != "directory":
            continue
        name = posixpath.basename(entry["name"].rstrip("/"))
        storage = ExperimentStorage(path, name)
        if storage.exists(storage.path(STATE_FILE)):
            try:
                found.append((storage, read_state(storage)))
            except Exception:  # noqa: BLE001 - a broken state: list it as such
                found.append((storage, {"name": name, "trials": [], "broken": True}))
    return found


@main.command("ls")
@click.argument("path", required=False)
@click.option("--trials/--no-trials", default=True, help="List each experiment's trials.")
@click.pass_context
def ls(ctx: click.Context, path: str, trials: bool) -> None:
    """List the experiments (and their trials) under a results folder or URI.

    PATH defaults to the ``dasktune.storage-path`` setting (``~/dasktune_results``).

    Example: dasktune ls ~/dasktune_results   |   dasktune ls s3://bucket/runs/exp
    """
    if path is None:
        path = str(_dask_config.get("storage-path"))
    try:
        experiments = _experiments_under(path)
    except click.ClickException as exc:  # one "error: ..." line, as every command prints
        _fail(ctx, RuntimeError(exc.message))
        return
    except Exception as exc:  # noqa: BLE001
        _fail(ctx, exc)
        return
    if not experiments:
        click.echo(f"no experiments under {path}")
        return
    for storage, state in experiments:
        counts: dict[str, int] = {}
        for t in state.get("trials", []):
            counts[t["status"]] = counts.get(t["status"], 0) + 1
        summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no trials"
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(state.get("start_time", 0)))
        metric = state.get("metric")
        click.echo(f"{state.get('name', storage.name)}  [{when}]  {summary}"
                   + (f"  metric={metric} ({state.get('mode')})" if metric else "")
                   + f"  {storage.uri}")
        if not trials:
            continue
        for t in state.get("trials", []):
            last = t.get("last_result") or {}
            value = last.get(metric) if isinstance(metric, str) else None
            shown = f"  {metric}={value:.6g}" if isinstance(value, (int, float)) else ""
            click.echo(f"  {t['trial_id']:<16} {t['status']:<10} "
                       f"iter={last.get('training_iteration', 0):<6}{shown}")


def serve_experiments(path: str, port: int = 0, open_browser: bool = False,
                      block: bool = True) -> Any:
    """``dasktune dashboard PATH_OR_URI``: serve the dasktune page for the experiment at
    ``path`` (or every experiment directly under it), read from storage: no cluster needed.

    Blocks until interrupted when ``block``; otherwise returns the running server.
    """
    from dasktune.dashboard import serve_static

    try:
        found = _experiments_under(path)
    except click.ClickException as exc:
        raise FileNotFoundError(exc.message) from None
    if not found:
        raise FileNotFoundError(f"no experiments under {path}")
    server, url = serve_static([storage.uri for storage, _state in found], port)
    click.echo(f"serving {len(found)} experiment(s) from {path} at {url}  (Ctrl-C stops)")
    sys.stdout.flush()
    if open_browser:
        import webbrowser

        webbrowser.open(url)
    if not block:
        return server
    try:
        server.join()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return None
