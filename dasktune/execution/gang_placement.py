"""Where a gang's bundles go: one distinct worker per bundle, by Ray's four strategies.

A gang is a trial's request for several worker slots at once (its training ranks): all
or none, each bundle on a worker *process* of its own, since ranks need distinct
processes. On top of that rule, Ray's placement-group strategies decide the hosts:

- ``PACK``: as few hosts as possible (hosts that can take the most bundles first);
- ``STRICT_PACK``: every bundle on one host, or no placement;
- ``SPREAD``: a host of its own per bundle where there are enough, else any free worker;
- ``STRICT_SPREAD``: a host of its own per bundle, or no placement.

Pure functions over what each worker has free (the resource ledger passes it in): no
Dask, no accounting. The search is greedy -- bundles largest first, each on the best
worker left -- which is exact for the usual gang of equal bundles.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

__all__ = ["STRATEGIES", "assign", "check_strategy", "fits_free", "most_free", "place_group",
           "shortfall"]

#: Ray's placement-group strategies.
STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")

#: ``fits(worker, bundle)``: whether ``worker`` can hold ``bundle`` beside what it has.
Fits = Callable[[str, Mapping[str, float]], bool]


def check_strategy(strategy: str) -> str:
    """``strategy``, if it is one of Ray's; else a ValueError naming them."""
    if strategy not in STRATEGIES:
        raise ValueError(f"placement strategy must be one of {', '.join(STRATEGIES)}, "
                         f"got {strategy!r}")
    return strategy


def fits_free(free: Mapping[str, float], bundle: Mapping[str, float]) -> bool:
    """Whether ``bundle`` fits in ``free`` (zero amounts ask for nothing)."""
    return all(free.get(k, 0.0) >= v - 1e-9 for k, v in bundle.items() if v > 0)


def assign(bundles: Sequence[Mapping[str, float]], strategy: str,
           free: Mapping[str, Mapping[str, float]], hosts: Mapping[str, str],
           fits: Fits | None = None) -> list[str] | None:
    """A distinct worker of ``free`` for each bundle, in bundle order, or None.

    Args:
        bundles: what each rank needs.
        strategy: one of :data:`STRATEGIES`.
        free: the candidate workers and what each has free now.
        hosts: each worker's host.
        fits: an extra check (a GPU allocator's); by default the free amounts decide.
    """
    check_strategy(strategy)
    if not bundles:
        return []

    def ok(addr: str, bundle: Mapping[str, float]) -> bool:
        return fits_free(free[addr], bundle) and (fits is None or fits(addr, bundle))

    # Most free CPU first (ties: lowest address), as single-worker placement chooses.
    order = sorted(free, key=lambda a: (-free[a].get("CPU", 0.0), a))
    # Largest bundles first: a small one must not take the only worker a large one fits.
    ranks = sorted(range(len(bundles)), key=lambda i: (-bundles[i].get("GPU", 0.0),
                                                       -bundles[i].get("CPU", 0.0), i))
    if strategy in ("STRICT_SPREAD", "SPREAD"):
        return _spread(bundles, ranks, order, hosts, ok, strict=strategy == "STRICT_SPREAD")
    by_host: dict[str, list[str]] = {}
    for addr in order:
        by_host.setdefault(hosts.get(addr, addr), []).append(addr)
    # Hosts that can take the most of this gang first: the fewest hosts in all.
    room = {h: len(_fill(bundles, ranks, addrs, ok, partial=True)) for h, addrs in by_host.items()}
    host_order = sorted(by_host, key=lambda h: (-room[h], h))
    if strategy == "STRICT_PACK":
        for host in host_order:
            got = _fill(bundles, ranks, by_host[host], ok)
            if got:
                return _in_order(got, len(bundles))
        return None
    got = _fill(bundles, ranks, [a for h in host_order for a in by_host[h]], ok)
    return _in_order(got, len(bundles)) if got else None


def _fill(bundles: Sequence[Mapping[str, float]], ranks: list[int], addrs: list[str],
          ok: Callable[[str, Mapping[str, float]], bool],
          partial: bool = False) -> dict[int, str]:
    """Bundle index -> worker, each on the first unused worker of ``addrs`` it fits;
    {} if one does not fit (unless ``partial``: then those that do)."""
    used: set[str] = set()
    got: dict[int, str] = {}
    for i in ranks:
        addr = next((a for a in addrs if a not in used and ok(a, bundles[i])), None)
        if addr is None:
            if partial:
                continue
            return {}
        used.add(addr)
        got[i] = addr
    return got


def _spread(bundles: Sequence[Mapping[str, float]], ranks: list[int], order: list[str],
            hosts: Mapping[str, str], ok: Callable[[str, Mapping[str, float]], bool],
            strict: bool) -> list[str] | None:
    used: set[str] = set()
    used_hosts: set[str] = set()
    got: dict[int, str] = {}
    for i in ranks:
        fresh = [a for a in order if a not in used and hosts.get(a, a) not in used_hosts]
        addr = next((a for a in fresh if ok(a, bundles[i])), None)
        if addr is None and not strict:
            addr = next((a for a in order if a not in used and ok(a, bundles[i])), None)
        if addr is None:
            return None
        used.add(addr)
        used_hosts.add(hosts.get(addr, addr))
        got[i] = addr
    return _in_order(got, len(bundles))


def _in_order(got: dict[int, str], n: int) -> list[str]:
    return [got[i] for i in range(n)]


def most_free(free: Mapping[str, Mapping[str, float]], resources: Mapping[str, float],
               fits: Callable[[str, Mapping[str, float]], bool] | None) -> str | None:
    """The worker of ``free`` with the most CPU left after ``resources`` that fits them."""
    best, best_cpu = None, -1.0
    for addr in sorted(free):
        if fits_free(free[addr], resources) and (fits is None or fits(addr, resources)):
            cpu = free[addr].get("CPU", 0.0) - resources.get("CPU", 0.0)
            if cpu > best_cpu:
                best, best_cpu = addr, cpu
    return best


def _minus(free: Mapping[str, Mapping[str, float]], addr: str,
           resources: Mapping[str, float]) -> dict[str, dict[str, float]]:
    out = {a: dict(f) for a, f in free.items()}
    for k, v in resources.items():
        out[addr][k] = out[addr].get(k, 0.0) - v
    return out


def place_group(bundles: Sequence[Mapping[str, float]], strategy: str,
                 free: Mapping[str, Mapping[str, float]], hosts: Mapping[str, str],
                 head: Mapping[str, float] | None, head_worker: str | None,
                 fits: Callable[[str, Mapping[str, float]], bool] | None) -> list[str] | None:
    """Each bundle's worker, or None; with ``head`` (a trial's own request), the head's
    worker first (``head_worker``: it must fit there), which may also hold a bundle."""
    if head is None:
        return assign(bundles, strategy, free, hosts, fits)
    if head_worker is not None:
        if head_worker not in free or not fits_free(free[head_worker], head):
            return None
        got = assign(bundles, strategy, _minus(free, head_worker, head), hosts, fits)
        return None if got is None else [head_worker, *got]
    # The head anywhere: the bundles first, the head in what is left; else the head
    # first (where single-trial placement would put it) and the bundles around it.
    got = assign(bundles, strategy, free, hosts, fits)
    if got is not None:
        left = dict(free)
        for addr, b in zip(got, bundles):
            left = _minus(left, addr, b)
        where = most_free(left, head, fits)
        if where is not None:
            return [where, *got]
    where = most_free(free, head, fits)
    if where is None:
        return None
    got = assign(bundles, strategy, _minus(free, where, head), hosts, fits)
    return None if got is None else [where, *got]


def shortfall(bundles: Sequence[Mapping[str, float]], strategy: str,
              free: Mapping[str, Mapping[str, float]], hosts: Mapping[str, str],
              head: Mapping[str, float] | None, head_worker: str | None,
              fits: Callable[[str, Mapping[str, float]], bool] | None,
              capacities: Iterable[Mapping[str, float]]) -> tuple[int, list[str]]:
    """How many new workers the group lacks beyond ``free``, and which of ``free`` it
    would use then: ``(0, [...])`` if it fits now, ``(0, [])`` if no number of new
    workers would do (they are never the host of ``head_worker``; under ``STRICT_PACK``
    all on one new host, else each on its own).

    A new worker is taken to be like the largest of ``capacities`` (the workers' whole
    resources) and to hold any one bundle, and the head: an elastic cluster adds workers
    of the kind it has, and a gang's bundles need a worker each anyway. The same rule as
    :func:`place_group`, over the workers here and ``k`` new ones, for the least ``k``:
    what an elastic cluster must add for the group."""
    fresh: dict[str, float] = {}
    for amounts in [*capacities, *bundles, head or {}]:
        for key, v in amounts.items():
            fresh[key] = max(fresh.get(key, 0.0), float(v))
    for k in range(len(bundles) + 2):
        new = [f"\0new-{i}" for i in range(k)]  # no address looks like this
        more = {**free, **{a: dict(fresh) for a in new}}
        more_hosts = {**hosts, **{a: "\0new" if strategy == "STRICT_PACK" else a for a in new}}

        def ok(addr: str, bundle: Mapping[str, float], new: list[str] = new) -> bool:
            return addr in new or fits is None or fits(addr, bundle)

        got = place_group(bundles, strategy, more, more_hosts, head, head_worker, ok)
        if got is not None:
            return k, sorted({a for a in got if a in free})
    return 0, []
