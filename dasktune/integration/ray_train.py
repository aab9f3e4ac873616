"""``TuneReportCallback``: a ``TorchTrainer`` run inside a Tune trial reports to that
trial (Ray's ``ray.tune.integration.ray_train``).

As in Ray Train V2, a trainer's reports reach the enclosing Tune trial only with this
callback in the trainer's ``RunConfig(callbacks=[...])``: rank 0's metrics become the
trial's results, and the checkpoint the ranks reported -- committed once into the
trial's folder -- is the trial's checkpoint (``tune.get_checkpoint()`` after a restart).
Without it the checkpoints are still committed to the trial's folder, and ``fit()``
warns once that nothing reaches Tune.
"""

from __future__ import annotations

from typing import Any

from dasktune.session import current_session

__all__ = ["CHECKPOINT_PATH_KEY", "TuneReportCallback"]

#: Ray's key for the checkpoint's path in forwarded metrics; here the checkpoint is the
#: trial's own (``Result.checkpoint``), so rows carry ``checkpoint_dir_name`` instead.
CHECKPOINT_PATH_KEY = "checkpoint_path"


class TuneReportCallback:
    """Forward a trainer's reports (rank 0's metrics, the committed checkpoint) to the
    Tune trial it runs in. Raises ``RuntimeError`` when built outside a Tune trial."""

    def __init__(self) -> None:
        if current_session() is None:
            raise RuntimeError("TuneReportCallback must be used in a Tune session (inside "
                               "the trainable that calls TorchTrainer.fit()).")

    def __repr__(self) -> str:
        return "TuneReportCallback()"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuilt, ())


def _rebuilt() -> TuneReportCallback:
    """Unpickled without the in-a-trial check (a trainer travels to its driver)."""
    return TuneReportCallback.__new__(TuneReportCallback)
