"""``MyTrainableClass``: the stand-in trainable of Ray Tune's examples (``ray.tune.utils``).

Its curve is ``height * tanh(timestep / width)``, reported as ``episode_reward_mean``, so a
script like Ray's ``hyperband_example.py`` runs after only the import change. Config keys, as
in Ray: ``width`` and ``height`` (default 1), ``sleep`` (seconds per step), ``mock_error``
(fail after the first step unless restored) and ``persistent_error`` (fail even when restored).
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

from dasktune.registry import register_trainable
from dasktune.trainable import Trainable

__all__ = ["MOCK_ERROR_KEY", "MOCK_TRAINABLE_NAME", "MyTrainableClass",
           "register_mock_trainable"]

MOCK_TRAINABLE_NAME = "mock_trainable"
MOCK_ERROR_KEY = "mock_error"
_STATE_FILE = "checkpoint"


class MyTrainableClass(Trainable):
    """A learning curve that rises as ``tanh`` to ``height``, at a speed set by ``width``."""

    def setup(self, config: dict[str, Any]) -> None:
        self.timestep = 0
        self.restored = False

    def step(self) -> dict[str, float]:
        fail = self.config.get(MOCK_ERROR_KEY, False) and self.timestep > 0
        if fail and (self.config.get("persistent_error", False) or not self.restored):
            raise RuntimeError(f"failing on purpose at timestep {self.timestep}")
        if self.config.get("sleep", 0) > 0:
            time.sleep(self.config["sleep"])
        self.timestep += 1
        width, height = self.config.get("width", 1), self.config.get("height", 1)
        return {"episode_reward_mean": height * math.tanh(self.timestep / width)}

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        with open(os.path.join(checkpoint_dir, _STATE_FILE), "w") as f:
            json.dump({"timestep": self.timestep}, f)

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        with open(os.path.join(checkpoint_dir, _STATE_FILE)) as f:
            self.timestep = json.load(f)["timestep"]
        self.restored = True


def register_mock_trainable() -> None:
    """Register :class:`MyTrainableClass` as ``"mock_trainable"`` for ``Tuner("mock_trainable")``."""
    register_trainable(MOCK_TRAINABLE_NAME, MyTrainableClass)
