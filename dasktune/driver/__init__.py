"""The driver: the loop that moves events between the deciders and one executor.

- :mod:`.controller` -- :class:`TuneController`, the loop and the starting of trials;
- :mod:`.trial_events` -- what the executor's events do to trials;
- :mod:`.decisions` -- typed verdicts (scheduler decisions) and why an attempt winds down;
- :mod:`.checkpoint_book` -- checkpoints: register, retention, lineage, unreported ones;
- :mod:`.failure_policy` -- failure budgets, retries and ``error.txt``;
- :mod:`.queue_ahead` -- successors queued on busy actors;
- :mod:`.trial_index` -- trials by id and the waiting ones in order;
- :mod:`.state_saves` -- when the experiment state is saved;
- :mod:`.restore` -- what restore reads in storage, and what the restored driver does first;
- :mod:`.plan` -- :class:`ExperimentPlan`, what the facade hands the driver.

The driver imports the executor contract (:mod:`dasktune.execution`), never an
executor, and nothing of the facade (``tuner``, ``tuner_build``).
"""

from dasktune.driver.controller import TuneController
from dasktune.driver.plan import ExperimentPlan

__all__ = ["ExperimentPlan", "TuneController"]
