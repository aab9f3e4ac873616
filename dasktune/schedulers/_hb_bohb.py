"""``HyperBandForBOHB``: HyperBand that tells BOHB the budget each trial reached (Ray's).

It is :class:`~dasktune.schedulers.HyperBandScheduler` with the brackets of each band filled
from the largest (the most halvings, the smallest budget) down, as BOHB expects, and with
``result["hyperband_info"]["budget"]`` set on the result a trial reports at a milestone.
The driver hands the scheduler a result before the searcher, so :class:`TuneBOHB` reads the
budget from the same result (the trial is then paused, and TuneBOHB counts it so).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dasktune.schedulers._base import result_value
from dasktune.schedulers._hyperband import HyperBandScheduler

if TYPE_CHECKING:
    from dasktune.schedulers._base import SchedulerContext
    from dasktune.trial import Trial

__all__ = ["HyperBandForBOHB"]

HYPERBAND_INFO = "hyperband_info"


class HyperBandForBOHB(HyperBandScheduler):
    """HyperBand for BOHB (Ray's ``ray.tune.schedulers.hb_bohb.HyperBandForBOHB``).

    Same arguments and the same brackets as :class:`HyperBandScheduler`; use it with
    ``TuneBOHB`` as the search algorithm.
    """

    def _bracket_halvings(self, position: int) -> int:
        return self._s_max_1 - 1 - position  # the largest bracket first

    def on_trial_result(self, tune_controller: SchedulerContext, trial: Trial,
                        result: dict[str, Any]) -> str:
        t = result_value(result, self._time_attr, trial, type(self).__name__)
        budget = self._milestone(trial.trial_id, t)
        result[HYPERBAND_INFO] = {} if budget is None else {"budget": budget}
        return super().on_trial_result(tune_controller, trial, result)
