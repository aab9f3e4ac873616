"""Where a trial's ranks run: a gang of distinct worker processes for its bundles.

Until the executor's gang reservation (``dasktune.session.reserve_workers``) is in, the
gang is picked from the scheduler's live workers: distinct worker processes, packed
onto or spread over hosts per the strategy, without any reservation.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

from distributed import Client

__all__ = ["Gang", "lost_workers", "reserve"]

_WAIT_S = 60.0


@dataclass
class Gang:
    """Workers for a trial's ranks (``workers[i]`` runs rank ``i``)."""

    gang_id: str
    workers: list[str]
    hosts: list[str]
    devices: list[list[str]] = field(default_factory=list)


def _host(address: str) -> str:
    return address.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")


def reserve(client: Client, bundles: list[dict[str, float]], strategy: str,
            gang_id: str) -> Gang:
    """A gang for ``bundles`` (one distinct worker process each)."""
    deadline = time.monotonic() + _WAIT_S
    while True:
        workers = list(client.scheduler_info(n_workers=-1)["workers"])
        if len(workers) >= len(bundles):
            break
        if time.monotonic() > deadline:
            raise ValueError(f"a trial needs {len(bundles)} distinct workers, the cluster "
                             f"has {len(workers)}")
        time.sleep(0.2)
    random.shuffle(workers)
    by_host: dict[str, list[str]] = {}
    for w in workers:
        by_host.setdefault(_host(w), []).append(w)
    chosen: list[str] = []
    if strategy.endswith("SPREAD"):
        while len(chosen) < len(bundles):
            for ws in by_host.values():
                if ws and len(chosen) < len(bundles):
                    chosen.append(ws.pop())
    else:
        for ws in sorted(by_host.values(), key=len, reverse=True):
            chosen.extend(ws[:len(bundles) - len(chosen)])
    devices = [["0"] if b.get("GPU") else [] for b in bundles]
    return Gang(gang_id, chosen, [_host(w) for w in chosen], devices)


def lost_workers(client: Client, gang: Gang) -> list[str]:
    """The gang's workers that left the cluster."""
    live = client.scheduler_info(n_workers=-1)["workers"]
    return [w for w in gang.workers if w not in live]


def release(gang: Gang) -> None:
    """Give the gang's workers back (nothing to do without a reservation)."""
