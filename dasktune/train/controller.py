"""The controller of a multi-worker trial: runs its worker group inside the trial's
driver function, commits and forwards its reports, restarts it after a fault.

:meth:`TrainController.run` runs in the thread of a Tune trial (the driver function).
Each try reserves a gang of workers through the trial's session (all or none, one
worker process per rank: ``TrialSession.reserve_workers``), runs one
:class:`~dasktune.train.worker_group.WorkerGroup` on it and gives the gang back. A
report all ranks made is committed through the trial's own session (one checkpoint,
the trial's folder, Ray's layout, the retention rules of every trial) and -- when the
trainer's ``RunConfig.callbacks`` hold a ``TuneReportCallback``, as in Ray V2 --
forwarded as the trial's result. A group that fails restarts from the newest
committed checkpoint on a fresh gang, up to the trainer's ``FailureConfig(max_failures)``
times; then :class:`~dasktune.train.config.TrainingFailedError` ends ``fit()`` and the
Tune trial's own ``FailureConfig`` applies.

A gang worker that retires gracefully is news from the executor
(``session.gang_retiring``), as a lost one is (``session.gang_lost``); its retirement
waits for the gang. The ranks get a preemption notice (``train.get_preemption_info``);
the group stops at the first checkpoint committed after that, or once
``dasktune.executor.evacuate-timeout`` passed without one, and restarts on a fresh gang
from the newest checkpoint -- not a failure, as Ray counts preemptions apart.
"""

from __future__ import annotations

import logging
import time
import warnings
from typing import TYPE_CHECKING, Any

from distributed import get_client

from dasktune import _dask_config
from dasktune.checkpoint import Checkpoint
from dasktune.results import Result
from dasktune.session import StopTrial, TrialSession, node_ip
from dasktune.shipping import dumps_trainable
from dasktune.train import forkserver
from dasktune.train.config import ScalingConfig, TrainingFailedError
from dasktune.train.context import PreemptionInfo, RankInfo
from dasktune.train.worker_group import GroupFailure, GroupSpec, WorkerGroup

if TYPE_CHECKING:
    from dasktune.config import RunConfig
    from dasktune.execution import WorkerGang

__all__ = ["TrainController"]

logger = logging.getLogger(__name__)
_WARNED_NO_CALLBACK: set[str] = set()


class TrainController:
    """Runs ``loop`` on ``scaling.num_workers`` ranks for the trial of ``session``.

    Args:
        forward: send rank 0's reports to the trial as its results (a
            ``TuneReportCallback`` is configured, or ``fit()`` runs outside Tune).
        backend: the ``torch.distributed`` backend (None: nccl with GPUs, else gloo).
        timeout_s: the process group's timeout.
    """

    def __init__(self, loop: Any, loop_config: dict[str, Any] | None, scaling: ScalingConfig,
                 run_config: RunConfig, session: TrialSession, forward: bool,
                 backend: str | None = None, timeout_s: float = 1800.0):
        self.loop_blob = dumps_trainable(loop)
        self.loop_config = loop_config
        self.scaling = scaling
        self.run_config = run_config
        self.session = session
        self.forward = forward
        self.backend = backend or ("nccl" if scaling.uses_gpu else "gloo")
        self.timeout_s = timeout_s
        self.last_metrics: dict[str, Any] = {}
        self.runs = 0  # groups started, restarts included
        self._gang: WorkerGang | None = None
        self._retiring_since: float | None = None  # when the gang's retirement was heard
        self._evacuate_s = _dask_config.get_seconds("executor.evacuate-timeout")
        self.report_interval_s = _dask_config.get_seconds("train.report-interval")
        if self.report_interval_s < 0:
            raise ValueError(f"dasktune.train.report-interval must be >= 0, got "
                             f"{self.report_interval_s:g}s")
        if not forward and session.spec.trial_id not in _WARNED_NO_CALLBACK:
            _WARNED_NO_CALLBACK.add(session.spec.trial_id)
            warnings.warn(
                "TorchTrainer.fit() runs inside a Tune trial without "
                "dasktune.integration.ray_train.TuneReportCallback in its RunConfig.callbacks:"
                " the workers' checkpoints are committed to the trial's folder, but no "
                "metrics reach Tune (as in Ray Train V2)", stacklevel=3)

    @property
    def max_failures(self) -> int:
        fc = self.run_config.failure_config
        return fc.max_failures if fc is not None else 0

    def run(self) -> Result:
        """Train to the end; the trial's :class:`~dasktune.Result` (rank 0's last metrics,
        the newest committed checkpoint). Raises ``TrainingFailedError``."""
        client = get_client()
        # The ranks' imports, while the gang is reserved.
        forkserver.warm_cluster(client, gpus=self.scaling.uses_gpu)
        failures = 0
        spec = self.session.spec
        while True:
            self.runs += 1
            group_id = f"a{spec.attempt}r{self.runs}"
            gang = self.session.reserve_workers(self.scaling.worker_bundles(),
                                                self.scaling.placement_strategy)
            try:
                self._run_group(client, gang, group_id)
                break
            except GroupFailure as exc:
                if exc.lost and set(exc.lost) <= set(self.session.gang_retiring(gang)):
                    # A retirement (a spot notice), not a failure: Ray counts preemptions
                    # apart from max_failures, without limit by default.
                    logger.warning("trial %s: the worker group's worker(s) %s retired; "
                                   "restarting it from %s", spec.trial_id, exc.lost,
                                   self._checkpoint_path() or "scratch")
                    continue
                failures += 1
                if self.max_failures != -1 and failures > self.max_failures:
                    raise TrainingFailedError(
                        f"Training failed after {failures} failure(s) of the worker group "
                        f"(FailureConfig(max_failures={self.max_failures})): {exc}") from None
                logger.warning("trial %s: the worker group failed (%s); restarting it from %s "
                               "(failure %d of %s)", spec.trial_id, exc,
                               self._checkpoint_path() or "scratch", failures,
                               "unlimited" if self.max_failures == -1 else self.max_failures)
            finally:
                self.session.release_workers(gang)
        latest = self.session.latest_checkpoint
        return Result(metrics=dict(self.last_metrics), checkpoint=latest, error=None,
                      path=spec.trial_path, filesystem=spec.storage.fs)

    def _checkpoint_path(self) -> str | None:
        latest: Checkpoint | None = self.session.latest_checkpoint
        return latest.path if latest is not None else None

    def _run_group(self, client: Any, gang: WorkerGang, group_id: str) -> None:
        spec = self.session.spec
        info = RankInfo(world_rank=0, world_size=len(gang.workers), local_rank=0,
                        local_world_size=1, node_rank=0, trial_id=spec.trial_id,
                        trial_name=spec.trial_name, experiment_name=spec.experiment_name,
                        storage=spec.storage, trial_path=spec.trial_path, group=group_id,
                        checkpoint_path=self._checkpoint_path(),
                        use_gpu=self.scaling.uses_gpu, backend=self.backend,
                        timeout_s=self.timeout_s, report_interval_s=self.report_interval_s)
        group_spec = GroupSpec(loop=self.loop_blob, loop_config=self.loop_config, info=info,
                               listen_host=node_ip(self.session.worker_address),
                               cpus=self.scaling.worker_resources.get("CPU", 1.0))
        self._gang, self._retiring_since = gang, None
        group = WorkerGroup(client, gang.workers, gang.hosts, gang.devices, group_spec,
                            self._on_report, lost=lambda: self.session.gang_lost(gang),
                            interrupt=self._interrupt, notice=self._preemption)
        group.run()

    def _retiring(self) -> list[str]:
        """The gang's retiring workers (noting when the first was heard of)."""
        retiring = self.session.gang_retiring(self._gang) if self._gang is not None else []
        if retiring and self._retiring_since is None:
            self._retiring_since = time.monotonic()
        return retiring

    def _interrupt(self) -> None:
        if self.session.must_stop():
            raise StopTrial()  # Tune stopped the trial: the group is stopped on the way out
        retiring = self._retiring()
        if retiring and self._retiring_since is not None and \
                time.monotonic() - self._retiring_since > self._evacuate_s:
            raise GroupFailure(
                f"worker(s) {retiring} of the group retire and no checkpoint came within "
                f"dasktune.executor.evacuate-timeout ({self._evacuate_s:g}s)", lost=retiring)

    def _on_report(self, index: int, metrics: dict[str, Any], staged: str | None) -> str | None:
        """All ranks reported ``index``: commit its checkpoint once, forward rank 0's
        metrics; the committed checkpoint's path."""
        self.last_metrics = metrics
        path = None
        if self.forward:
            before = self.session.latest_checkpoint
            # Raises StopTrial when Tune stops the trial: the group is stopped on the way out.
            self.session.report(dict(metrics), staged=staged)
            if staged is not None and self.session.latest_checkpoint is not before:
                path = self._checkpoint_path()
        elif staged is not None:
            path = self.session.commit_staged(staged, dict(metrics))
        retiring = self._retiring()
        if retiring and path is not None:
            # Nothing is lost past this checkpoint: let the workers go.
            raise GroupFailure(f"worker(s) {retiring} of the group retire; it stopped at "
                               f"its checkpoint {path}", lost=retiring)
        return path

    def _preemption(self) -> PreemptionInfo | None:
        """The notice for the ranks: the head's worker retires (the trial is being moved)
        or some ranks' workers do; checkpoint now."""
        ranks: dict[str, list[int]] = {}
        if self.session.stop_pending():
            ranks[self.session.worker_address] = list(range(self.scaling.num_workers))
        if self._gang is not None:
            for worker in self._retiring():
                ranks.setdefault(worker, []).append(self._gang.workers.index(worker))
        return PreemptionInfo(deadline_ms=None, preempted_node_to_ranks=ranks) if ranks else None
