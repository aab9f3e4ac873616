"""Placement and the resource ledger: which worker can hold a trial now.

Why a ledger: Dask's scheduler holds an actor's ``resources=`` only while the actor is
being created, so two ``GPU=1`` actors could land on one ``GPU=1`` worker. dasktune
therefore accounts for the resources of its live attempts itself (here) and pins each
actor to the worker :meth:`ResourceLedger.place` chose. Pure bookkeeping: the worker
list comes from a function the executor passes in, so nothing here speaks Dask.

Gangs (a trial's several worker slots, all or none) are placed here too
(:meth:`ResourceLedger.place_gang`, the strategies in :mod:`.gang_placement`) and
counted under the gang's id like an attempt under its trial's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dasktune.execution.gang_placement import most_free, place_group, shortfall
from dasktune.resources import GPUAllocator, format_resources, worker_capacity, worker_devices

__all__ = ["ResourceLedger"]

# A fetch time that is always out of date, however young the monotonic clock.
_STALE = float("-inf")
_REFRESH_S = 0.5  # the worker list is fetched at most this often
_SUSPECT_S = 5.0  # a worker we just lost contact with is not chosen for this long


class ResourceLedger:
    """What each worker offers, what our attempts use there, and where a request fits.

    Args:
        fetch_workers: returns the live workers by address (entries of Dask's
            ``scheduler_info()["workers"]``: ``resources``, ``nthreads``, ``host``, ...).
    """

    def __init__(self, fetch_workers: Callable[[], dict[str, dict[str, Any]]]):
        self._fetch = fetch_workers
        self._workers: dict[str, dict[str, Any]] = {}
        self._workers_at = _STALE
        self._used: dict[str, dict[str, float]] = {}
        self._gpus: dict[str, GPUAllocator] = {}
        self.retiring: set[str] = set()  # closing: no new attempts
        self.gone: set[str] = set()  # left the cluster
        self.excluded: set[str] = set()  # never placed on (e.g. cannot see the storage)
        self._suspect: dict[str, float] = {}  # address -> not chosen until then

    # ------------------------------------------------------------ workers
    def workers(self, refresh: bool = False) -> dict[str, dict[str, Any]]:
        """Live workers and their info (refreshed at most every 0.5 s)."""
        now = time.monotonic()
        if refresh or now - self._workers_at > _REFRESH_S:
            self._workers = dict(self._fetch())
            self._workers_at = now
        return self._workers

    def mark_stale(self) -> None:
        """The worker list changed: fetch it again at the next look."""
        self._workers_at = _STALE

    def suspect(self, addr: str) -> None:
        """We lost contact with ``addr``: do not choose it for a few seconds, while the
        scheduler decides whether it is gone."""
        self._suspect[addr] = time.monotonic() + _SUSPECT_S

    def capacities(self) -> dict[str, dict[str, float]]:
        return {addr: worker_capacity(w) for addr, w in self.workers().items()}

    def free(self, addr: str) -> dict[str, float]:
        info = self.workers().get(addr)
        if info is None:  # it left between two lookups (the list refreshes every 0.5 s)
            return {}
        cap = worker_capacity(info)
        used = self._used.get(addr, {})
        return {k: v - used.get(k, 0.0) for k, v in cap.items()}

    def can_ever_fit(self, resources: dict[str, float]) -> str | None:
        """None if some worker could hold ``resources`` when idle, else why not."""
        caps = self.capacities()
        if not caps:
            return None  # no workers yet: an elastic cluster may add some
        for cap in caps.values():
            if all(cap.get(k, 0.0) >= v for k, v in resources.items() if v > 0):
                return None
        offers = "; ".join(f"{addr}: {format_resources(c)}" for addr, c in sorted(caps.items()))
        missing = sorted({k for k, v in resources.items() if v > 0
                          and all(c.get(k, 0.0) < v for c in caps.values())})
        return (f"no worker offers {format_resources(resources)} "
                f"(short of {', '.join(missing)}); workers offer: {offers}")

    def _eligible(self) -> list[str]:
        """The workers new work may go to now (sorted)."""
        now = time.monotonic()
        return [addr for addr in sorted(self.workers())
                if addr not in self.retiring and addr not in self.gone and
                addr not in self.excluded and self._suspect.get(addr, 0.0) <= now]

    def _gpus_fit(self, addr: str, resources: Mapping[str, float]) -> bool:
        gpus = resources.get("GPU", 0.0)
        if not gpus:
            return True
        alloc = self._gpu_alloc(addr)
        if alloc.allocate("__probe__", gpus, self._devices(addr)) is None:
            return False
        alloc.release("__probe__")
        return True

    def place(self, resources: dict[str, float]) -> str | None:
        """The worker with the most free CPU that fits ``resources`` now, or None."""
        free = {addr: self.free(addr) for addr in self._eligible()}
        return most_free(free, resources, self._gpus_fit)

    # ------------------------------------------------------------ gangs
    def place_gang(self, bundles: Sequence[Mapping[str, float]], strategy: str = "PACK",
                   head: Mapping[str, float] | None = None,
                   head_worker: str | None = None) -> list[str] | None:
        """A distinct worker per bundle that fits it now, by ``strategy``, or None: all
        or none. With ``head`` (the trial's own request), the first address is a worker
        that holds the head too -- ``head_worker`` if given (where the trial runs)."""
        eligible = self._eligible()
        free = {addr: self.free(addr) for addr in eligible}
        hosts = {addr: str(self.workers().get(addr, {}).get("host", addr)) for addr in eligible}
        if head_worker is not None and head_worker not in free:
            return None
        return place_group(bundles, strategy, free, hosts, head, head_worker, self._gpus_fit)

    def gang_shortfall(self, bundles: Sequence[Mapping[str, float]], strategy: str = "PACK",
                       head: Mapping[str, float] | None = None,
                       head_worker: str | None = None) -> tuple[int, list[str]]:
        """How many more workers the group of :meth:`place_gang` lacks now, and which of
        the workers here it would use (:func:`.gang_placement.shortfall`: a new worker is
        taken to be like the largest here)."""
        eligible = self._eligible()
        free = {addr: self.free(addr) for addr in eligible}
        hosts = {addr: str(self.workers().get(addr, {}).get("host", addr)) for addr in eligible}
        return shortfall(bundles, strategy, free, hosts, head, head_worker, self._gpus_fit,
                         self.capacities().values())

    def can_ever_fit_gang(self, bundles: Sequence[Mapping[str, float]], strategy: str = "PACK",
                          head: Mapping[str, float] | None = None) -> str | None:
        """None if the live workers, idle, could hold ``bundles`` (and ``head``) by
        ``strategy``; else why not, naming what the workers offer."""
        caps = {addr: cap for addr, cap in self.capacities().items()
                if addr not in self.gone and addr not in self.excluded}
        if not caps:
            return None  # no workers yet: an elastic cluster may add some
        hosts = {addr: str(self.workers()[addr].get("host", addr)) for addr in caps}
        if place_group(bundles, strategy, caps, hosts, head, None, None) is not None:
            return None
        offers = "; ".join(f"{addr}: {format_resources(c)}" for addr, c in sorted(caps.items()))
        each = sorted({format_resources(b) for b in bundles})
        spread = " on distinct hosts" if strategy == "STRICT_SPREAD" else \
            " on one host" if strategy == "STRICT_PACK" else ""
        with_head = f" beside the trial's own {format_resources(head)}" if head else ""
        return (f"no {len(bundles)} distinct workers{spread} offer {' / '.join(each)} "
                f"each{with_head} ({strategy}); workers offer: {offers}")

    def take_gang(self, gang_id: str, workers: Sequence[str],
                  bundles: Sequence[Mapping[str, float]]) -> list[list[str]]:
        """Count each bundle on its worker under ``gang_id``; the GPU ids of each."""
        return [self.take(addr, gang_id, dict(b)) for addr, b in zip(workers, bundles)]

    def give_back_gang(self, gang_id: str, workers: Sequence[str],
                       bundles: Sequence[Mapping[str, float]]) -> None:
        """Undo :meth:`take_gang`."""
        for addr, b in zip(workers, bundles):
            self.give_back(addr, gang_id, dict(b))

    # ------------------------------------------------------------ accounting
    def take(self, addr: str, trial_id: str, resources: dict[str, float]) -> list[str]:
        """Count ``resources`` as used on ``addr`` by ``trial_id``; its GPU devices."""
        self.add(addr, resources)
        gpus = resources.get("GPU", 0.0)
        if not gpus:
            return []
        return self._gpu_alloc(addr).allocate(trial_id, gpus, self._devices(addr)) or []

    def add(self, addr: str, resources: dict[str, float]) -> None:
        """Count ``resources`` as used on ``addr`` (devices are not allocated)."""
        used = self._used.setdefault(addr, {})
        for k, v in resources.items():
            used[k] = used.get(k, 0.0) + v

    def give_back(self, addr: str, trial_id: str, resources: dict[str, float]) -> None:
        """Undo :meth:`take`."""
        used = self._used.get(addr, {})
        for k, v in resources.items():
            used[k] = used.get(k, 0.0) - v
        if addr in self._gpus:
            self._gpus[addr].release(trial_id)

    def _gpu_alloc(self, addr: str) -> GPUAllocator:
        return self._gpus.setdefault(addr, GPUAllocator())

    def _devices(self, addr: str) -> list[str]:
        info = self.workers().get(addr, {})
        return worker_devices(worker_capacity(info).get("GPU", 0.0))

