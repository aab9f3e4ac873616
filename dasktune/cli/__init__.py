"""The ``dasktune`` command: a click group; each submodule adds its commands."""

from __future__ import annotations

import click

from dasktune import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="dasktune")
@click.option("--verbose", is_flag=True, help="Show full tracebacks on errors.")
@click.pass_context
def main(ctx: click.Context, verbose: bool) -> None:
    """dasktune: distributed hyperparameter tuning on Dask."""
    ctx.ensure_object(dict)
    ctx.obj["verbose"] = verbose


# Subcommand modules register themselves on ``main`` when imported.
from dasktune.cli import cluster, experiments, worker  # noqa: E402,F401
