"""Running trials: the :class:`Executor` contract and its implementations.

The driver loop imports only this package's contract (:mod:`.protocol`); the
implementations are imported by whoever builds an experiment:

- :mod:`.dask_executor` -- :class:`DaskExecutor`, trial attempts as actors on a Dask
  cluster, placed by the resource ledger of :mod:`.ledger`;
- :mod:`.recovery` -- the scheduler and worker plugins that report lost and retiring
  workers and fence attempts no driver collects;
- :mod:`.simulated` -- :class:`SimulatedExecutor`, trials as timed events on a virtual
  clock.
"""

from dasktune.execution.protocol import (
    EventKind,
    ExecEvent,
    Executor,
    GangRequest,
    Report,
    WorkerGang,
)

__all__ = ["EventKind", "ExecEvent", "Executor", "GangRequest", "Report", "WorkerGang"]
