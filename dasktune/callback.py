"""``tune.Callback``: hooks the driver loop calls, with Ray Tune's names and arguments.

Every hook is a documented no-op, takes keyword arguments, and accepts ``**info`` so
later versions can pass more without breaking user callbacks. Hooks run in the
driver's thread, between events: keep them quick (loggers batch their writes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dasktune.trial import Trial


class Callback:
    """Base class for experiment callbacks (``RunConfig(callbacks=[...])``)."""

    def setup(self, stop: Any = None, num_samples: int | None = None,
              total_num_samples: int | None = None, **info: Any) -> None:
        """Called once before the first trial starts."""

    def on_step_begin(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        """Called at the start of each pass of the driver loop."""

    def on_step_end(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        """Called at the end of each pass of the driver loop."""

    def on_trial_start(self, iteration: int, trials: list[Trial], trial: Trial,
                       **info: Any) -> None:
        """Called when a trial (or a new attempt of it) starts on a worker."""

    def on_trial_restore(self, iteration: int, trials: list[Trial], trial: Trial,
                         **info: Any) -> None:
        """Called when a trial restarts from a checkpoint."""

    def on_trial_save(self, iteration: int, trials: list[Trial], trial: Trial,
                      **info: Any) -> None:
        """Called when a checkpoint of the trial is committed to storage."""

    def on_trial_result(self, iteration: int, trials: list[Trial], trial: Trial,
                        result: dict[str, Any], **info: Any) -> None:
        """Called for every reported result, in report order."""

    def on_trial_restore_results(self, iteration: int, trials: list[Trial], trial: Trial,
                                 results: list[dict[str, Any]], **info: Any) -> None:
        """(dasktune) A restored trial's logged results are ``results``, in order, as its
        record (``result.json``) holds them: what a killed driver left in other files
        may lack rows or hold more, so loggers rewrite their files to these. Results no
        driver logged come after, through :meth:`on_trial_result`."""

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial,
                          **info: Any) -> None:
        """Called when a trial ends TERMINATED (done, stopped or early-stopped)."""

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial,
                       **info: Any) -> None:
        """Called when a trial ends in ERROR (its failure budget is spent)."""

    def on_trial_recover(self, iteration: int, trials: list[Trial], trial: Trial,
                         **info: Any) -> None:
        """Called when a failed or lost trial is scheduled to run again."""

    def on_checkpoint(self, iteration: int, trials: list[Trial], trial: Trial,
                      checkpoint: Any, **info: Any) -> None:
        """Called with the committed :class:`~dasktune.Checkpoint` of a trial."""

    def on_trial_exploit(self, iteration: int, trials: list[Trial], trial: Trial,
                         exploit: Any, **info: Any) -> None:
        """(dasktune) A scheduler decided ``trial`` restarts from another trial's
        checkpoint (an :class:`~dasktune.schedulers.Exploit` with a policy-log line)."""

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        """Called once after the last trial ended (also on interrupt)."""


class CallbackList(Callback):
    """Calls each hook on every callback, in order."""

    def __init__(self, callbacks: list[Callback]):
        self.callbacks = list(callbacks)

    def __getattribute__(self, name: str) -> Any:
        if name.startswith(("on_", "setup")) and name in Callback.__dict__:
            callbacks = object.__getattribute__(self, "callbacks")

            def call(*args: Any, **kwargs: Any) -> None:
                for cb in callbacks:
                    getattr(cb, name)(*args, **kwargs)

            return call
        return object.__getattribute__(self, name)
