"""The console table in non-TTY mode, golden-tested against fixed trials."""

from __future__ import annotations

import io

from dasktune.progress import ProgressReporter
from dasktune.trial import ERROR, PENDING, RUNNING, TERMINATED, Placement, Trial


def _trials(n: int) -> list[Trial]:
    out = []
    statuses = [TERMINATED, RUNNING, PENDING, ERROR]
    for i in range(n):
        t = Trial(trial_id=f"abc_{i:05d}", config={"lr": 0.1 * (i + 1), "layers": 2})
        t.status = statuses[i % 4]
        if t.status != PENDING:
            t.update_last_result({"training_iteration": i + 1, "loss": 10.0 - i})
            t.placements.append(Placement(attempt=1, worker="tcp://w", host="node1", start=0))
        out.append(t)
    return out


GOLDEN = """\
== dasktune: 6 trials (2 RUNNING, 1 PENDING, 2 TERMINATED, 1 ERROR) | 0s elapsed | best loss=5 (abc_00005)
[######--------------] 3/10 trials, ETA 0s
trial        status      iter  loss  worker
* abc_00005  RUNNING     6     5     node1
  abc_00004  TERMINATED  5     6     node1
  abc_00003  ERROR       4     7     node1
  +3 more"""


def test_table_golden_non_tty():
    out = io.StringIO()
    rep = ProgressReporter(verbose=2, metric="loss", mode="min", max_rows=3, out=out, period=0)
    rep.total = 10
    text = rep.render(_trials(6))
    lines = text.splitlines()
    # elapsed/ETA are time-dependent: compare the rest exactly
    assert lines[0].replace(lines[0].split("|")[1], " 0s elapsed ") == GOLDEN.splitlines()[0]
    assert lines[1].startswith("[######--------------] 3/10 trials")
    assert lines[2:] == GOLDEN.splitlines()[2:]
    assert "\x1b" not in text  # no control characters when not a terminal


def test_rate_limited_and_quiet():
    out = io.StringIO()
    rep = ProgressReporter(verbose=1, metric="loss", mode="min", out=out, period=3600)
    rep.maybe_report(_trials(2))
    rep.maybe_report(_trials(2))
    assert out.getvalue().count("== dasktune") == 1
    silent = io.StringIO()
    ProgressReporter(verbose=0, out=silent, period=0).final(_trials(2))
    assert silent.getvalue() == ""


def test_hundred_trials_stay_compact():
    rep = ProgressReporter(verbose=2, metric="loss", mode="min", max_rows=20,
                           out=io.StringIO(), period=0)
    text = rep.render(_trials(100))
    assert len(text.splitlines()) <= 24 and "+80 more" in text


def test_table_shows_each_trials_hyperparameters_as_rays_does():
    """A column per sampled hyperparameter (nested ones as ``a/b``), values cut at 20
    characters; constants of the config stay out, as in Ray's default table."""
    trials = _trials(2)
    for i, t in enumerate(trials):
        t.evaluated_params = {"lr": 0.1 * (i + 1), "net": {"act": "relu" * (6 if i else 1)}}
    rep = ProgressReporter(verbose=2, metric="loss", mode="min", out=io.StringIO(), period=0)
    lines = rep.render(trials).splitlines()
    assert lines[1:] == [
        "trial        status      lr   net/act               iter  loss  worker",
        "* abc_00001  RUNNING     0.2  relurelurelurelur...  2     9     node1",
        "  abc_00000  TERMINATED  0.1  relu                  1     10    node1",
    ]
