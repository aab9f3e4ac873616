"""Every code snippet in README.md and docs/ runs, so no page drifts from the code.

Fenced ``python`` blocks run, each in a fresh interpreter with ``$HOME`` in a temporary
folder (results land in ``~/dasktune_results`` there) and a timeout. They share one running
cluster (the tests' embedded one, given as ``DASK_SCHEDULER_ADDRESS``, which a script without
an address connects to), so each does not pay for starting its own. A block that cannot
run here (it needs a cluster, a GPU or a cloud account) is preceded by the line
``<!-- snippet: skip (REASON) -->``, and the test reports it as skipped with that reason.
Fenced ``bash`` blocks are checked where that is safe: each ``dasktune ...`` line must parse
against the real command (subcommand, options and arguments; nothing is run), each
``python some/script.py`` must name a script of the checkout, and each
``DASK_DASKTUNE__...`` variable must name an existing setting. Keep snippets small (tiny
``num_samples``, few iterations): the whole file runs in about a minute.
"""

from __future__ import annotations

import os
import pathlib
import re
import shlex
import subprocess
import sys

import click
import dask.config
import pytest

import dasktune  # noqa: F401  (registers the dasktune: settings)
from dasktune.cli import main as cli_main

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^(?:<!-- snippet: skip \((?P<skip>[^)]*)\) -->\n)?```(?P<lang>\w+)\n(?P<code>.*?)^```$",
                   re.M | re.S)
TIMEOUT_S = 120


def _blocks(lang: str) -> list:
    params = []
    for page in PAGES:
        text = page.read_text()
        for m in FENCE.finditer(text):
            if m.group("lang") != lang:
                continue
            line = text.count("\n", 0, m.start("code")) + 1
            where = f"{page.relative_to(ROOT)}:{line}"
            marks = [pytest.mark.skip(reason=m.group("skip"))] if m.group("skip") else []
            params.append(pytest.param(m.group("code"), id=where, marks=marks))
    return params


def test_pages_have_snippets():
    assert len(_blocks("python")) >= 5 and len(_blocks("bash")) >= 3


@pytest.mark.parametrize("code", _blocks("python"))
def test_python_snippet_runs(code, tmp_path, local_client):
    env = {**os.environ, "HOME": str(tmp_path), "PYTHONPATH": str(ROOT),
           "DASKTUNE_RESULTS_DIR": str(tmp_path / "dasktune_results"),
           "DASK_SCHEDULER_ADDRESS": local_client.scheduler.address}
    script = tmp_path / "snippet.py"
    script.write_text(code)
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]


def _commands(code: str) -> list[str]:
    """The block's command lines, continuation lines joined, comments dropped."""
    joined = code.replace("\\\n", " ")
    return [line.split(" #", 1)[0].strip() for line in joined.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def _check_dasktune_line(args: list[str]) -> None:
    """Parse ``args`` against the click command tree without invoking anything."""
    command: click.Command = cli_main
    ctx = None
    while True:
        ctx = command.make_context(command.name or "dasktune", list(args), parent=ctx,
                                   resilient_parsing=False)
        if not isinstance(command, click.Group) or not ctx.protected_args:
            return
        name, *args = [*ctx.protected_args, *ctx.args]
        sub = command.get_command(ctx, name)
        assert sub is not None, f"no command {name!r}"
        command = sub


@pytest.mark.parametrize("code", _blocks("bash"))
def test_bash_snippet_commands_exist(code, monkeypatch):
    monkeypatch.chdir(ROOT)  # paths in the commands are relative to the checkout
    for line in _commands(code):
        for part in re.split(r"&&|\|\||;|&$", line):
            words = shlex.split(part.strip())
            if not words:
                continue
            if words[0] == "export":
                for assignment in words[1:]:
                    name = assignment.split("=", 1)[0]
                    if name.startswith("DASK_DASKTUNE__"):
                        key = name[len("DASK_"):].lower().replace("__", ".").replace("_", "-")
                        sentinel = object()
                        assert dask.config.get(key, sentinel) is not sentinel, f"{name}: no such setting"
            elif words[0].endswith(("python", "python3")) and len(words) > 1 \
                    and words[1].endswith(".py"):
                assert (ROOT / words[1]).is_file(), f"{part.strip()!r}: no such script"
            elif words[0] == "dasktune":
                try:
                    _check_dasktune_line(words[1:])
                except click.exceptions.Exit:
                    pass
                except click.UsageError as e:
                    pytest.fail(f"{part.strip()!r}: {e}")
