"""The simulated executor's workers: their resources, who runs where, and placement.

:class:`SimPool` is the resource ledger of :class:`~dasktune.execution.simulated.
SimulatedExecutor`: each worker's capacity and free resources, the attempts it holds,
and the workers lost or retiring. Placement picks the worker with the most free CPU that
fits a request (ties: the lowest address, as the Dask executor's ledger does) from a heap,
so it costs O(log W) over thousands of simulated workers. No clock and no trials: the
executor decides when things happen.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dasktune.execution.gang_placement import place_group, shortfall

__all__ = ["SimPool", "SimWorker"]


@dataclass
class SimWorker:
    """One simulated worker: what it offers, what is free, the trials it runs."""

    capacity: dict[str, float]
    free: dict[str, float] = field(default_factory=dict)
    running: set[str] = field(default_factory=set)


class SimPool:
    """The simulated workers by address, and placement over them."""

    def __init__(self) -> None:
        self.workers: dict[str, SimWorker] = {}
        # What the driver reads (``Executor.workers``): live workers only, the same dict
        # each time.
        self.info: dict[str, dict[str, Any]] = {}
        self.gone: set[str] = set()
        self.retiring: set[str] = set()
        # Most free CPU first (ties: lowest address); lazy: an entry whose free CPU is
        # no longer the worker's is stale and skipped.
        self._by_free: list[tuple[float, str]] = []

    def add(self, addr: str, capacity: Mapping[str, float]) -> None:
        """A worker offering ``capacity`` (e.g. ``{"CPU": 4}``) joins."""
        cap = {str(k): float(v) for k, v in capacity.items()}
        self.workers[addr] = SimWorker(capacity=cap, free=dict(cap))
        host = addr.split("://", 1)[-1]
        self.info[addr] = {"host": host, "resources": cap, "nthreads": int(cap.get("CPU", 1))}
        self.gone.discard(addr)
        heapq.heappush(self._by_free, (-cap.get("CPU", 0.0), addr))

    def is_live(self, addr: str) -> bool:
        return addr in self.workers and addr not in self.gone

    def host(self, addr: str) -> str:
        return self.info.get(addr, {}).get("host", "")

    def remove(self, addr: str) -> None:
        """``addr`` left the cluster (lost, or retired once free)."""
        self.gone.add(addr)
        self.info.pop(addr, None)
        self.retiring.discard(addr)

    def running_on(self, addr: str) -> list[str]:
        w = self.workers.get(addr)
        return sorted(w.running) if w is not None else []

    # ------------------------------------------------------------ placement
    def can_ever_fit(self, resources: dict[str, float]) -> str | None:
        if not self.workers:
            return None
        for w in self.workers.values():
            if all(w.capacity.get(k, 0.0) >= v for k, v in resources.items() if v > 0):
                return None
        return f"no simulated worker offers {resources}"

    @staticmethod
    def _fits(w: SimWorker, resources: dict[str, float]) -> bool:
        free = w.free
        return all(free.get(k, 0.0) >= v - 1e-9 for k, v in resources.items() if v > 0)

    def place(self, resources: dict[str, float]) -> str | None:
        """The worker with the most free CPU that fits ``resources``, or None (O(log W))."""
        heap = self._by_free
        skipped: list[tuple[float, str]] = []
        found = None
        while heap:
            neg, addr = heap[0]
            w = self.workers.get(addr)
            if w is None or addr in self.gone or -neg != w.free.get("CPU", 0.0):
                heapq.heappop(heap)  # stale: its free CPU changed since it was pushed
                continue
            if addr not in self.retiring and self._fits(w, resources):
                found = addr
                break
            if resources.get("CPU", 0.0) <= w.free.get("CPU", 0.0) and len(skipped) < 64:
                # Fits on CPU but not on another resource: look further down.
                skipped.append(heapq.heappop(heap))
                continue
            break  # the most free CPU is too little: nothing fits
        for entry in skipped:
            heapq.heappush(heap, entry)
        return found

    # ------------------------------------------------------------ gangs
    def _free_map(self, idle: bool = False) -> dict[str, dict[str, float]]:
        return {a: dict(w.capacity if idle else w.free) for a, w in self.workers.items()
                if a not in self.gone and (idle or a not in self.retiring)}

    def _hosts(self, addrs: Mapping[str, Any]) -> dict[str, str]:
        return {a: self.host(a) or a for a in addrs}

    def can_ever_fit_gang(self, bundles: list[dict[str, float]], strategy: str = "PACK",
                          head: dict[str, float] | None = None) -> str | None:
        """None if idle workers could hold the gang (a worker per bundle), else why not."""
        idle = self._free_map(idle=True)
        if not idle or place_group(bundles, strategy, idle, self._hosts(idle), head, None,
                                   None) is not None:
            return None
        return f"no {len(bundles)} distinct simulated workers offer {bundles} ({strategy})"

    def place_gang(self, bundles: list[dict[str, float]], strategy: str = "PACK",
                   head: dict[str, float] | None = None,
                   head_worker: str | None = None) -> list[str] | None:
        """A worker per bundle that can hold it now, all or none."""
        free = self._free_map()
        return place_group(bundles, strategy, free, self._hosts(free), head, head_worker, None)

    def gang_shortfall(self, bundles: list[dict[str, float]], strategy: str = "PACK",
                       head: dict[str, float] | None = None,
                       head_worker: str | None = None) -> tuple[int, list[str]]:
        """How many more workers the gang lacks now, and which of these it would use
        (:func:`.gang_placement.shortfall`, as the Dask executor's ledger)."""
        free = self._free_map()
        return shortfall(bundles, strategy, free, self._hosts(free), head, head_worker,
                         None, [w.capacity for w in self.workers.values()])

    def count(self, addr: str, resources: dict[str, float], sign: float = 1.0) -> None:
        """Count ``resources`` as used on ``addr`` (``sign=-1``: free again), without
        naming a trial that runs there (a gang's slot)."""
        self._take(addr, resources, sign)

    def hold(self, addr: str, trial_id: str, resources: dict[str, float]) -> None:
        """``trial_id`` runs on ``addr`` and holds ``resources`` there."""
        self.workers[addr].running.add(trial_id)
        self._take(addr, resources, 1.0)

    def free(self, addr: str, trial_id: str, resources: dict[str, float]) -> None:
        """``trial_id`` ended on ``addr``: its ``resources`` are free again."""
        w = self.workers.get(addr)
        if w is not None:
            w.running.discard(trial_id)
        self._take(addr, resources, -1.0)

    def _take(self, addr: str, resources: dict[str, float], sign: float) -> None:
        w = self.workers.get(addr)
        if w is None:
            return
        for k, v in resources.items():
            w.free[k] = w.free.get(k, 0.0) - sign * v
        heapq.heappush(self._by_free, (-w.free.get("CPU", 0.0), addr))
        if len(self._by_free) > 4 * len(self.workers) + 64:
            # Stale entries of full workers never reach the top: rebuild, or the heap
            # would grow with every start.
            self._by_free = [(-x.free.get("CPU", 0.0), a) for a, x in self.workers.items()
                             if a not in self.gone]
            heapq.heapify(self._by_free)
