"""Which GPUs of one node a multi-GPU request gets: NVLink-connected first, then one NUMA domain.

One rule, used by the allocation pass (``placement.Node.choose``) and by advance reservations
(``reserve.reserve``): among the candidates (all free for the whole window, so the choice never
changes a start), take the set with the most NVLink connections inside it (a fully connected set
where one exists), then the fewest NUMA domains, then the one whose members come first in the
caller's order of preference (coolest, idlest, lowest id). Without topology that is the caller's
own first ``count`` candidates.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import combinations
from math import comb

# Exact search over at most this many subsets (8 GPUs: at most C(8, 4) = 70); greedy beyond.
SUBSETS_MAX = 512


def best_set(
    order: Sequence[int],
    count: int,
    links: Mapping[int, frozenset[int] | set[int] | tuple[int, ...]],
    numa: Mapping[int, int | None],
) -> tuple[int, ...]:
    """``count`` of the candidates ``order`` (ids, most preferred first), by the rule above.

    ``links`` maps an id to the ids it has an NVLink to (one side reporting a link is enough);
    ``numa`` maps an id to its NUMA node (None: unknown, counted as a domain of its own).
    The result keeps the order of ``order``.
    """
    if count >= len(order):
        return tuple(order)
    if count <= 0:
        return ()
    adjacency = _adjacency(order, links)
    domains = [numa.get(key) for key in order]
    if comb(len(order), count) <= SUBSETS_MAX:
        positions = _exact(len(order), count, adjacency, domains)
    else:
        positions = _greedy(len(order), count, adjacency, domains)
    return tuple(order[i] for i in positions)


def set_quality(
    members: Sequence[int],
    links: Mapping[int, frozenset[int] | set[int] | tuple[int, ...]],
    numa: Mapping[int, int | None],
) -> tuple[int, int]:
    """(-NVLink connections inside the set, NUMA domains it spans): lower is better."""
    adjacency = _adjacency(members, links)
    full = (1 << len(members)) - 1
    domains = [numa.get(key) for key in members]
    return _score(full, adjacency, domains)


def describe(
    members: Sequence[int],
    links: Mapping[int, frozenset[int] | set[int] | tuple[int, ...]],
    numa: Mapping[int, int | None],
) -> str:
    """How a set of GPUs is connected, for people: "4 GPUs, fully NVLink-connected",
    "4 GPUs, 2 NVLink groups, NUMA 0+1", "2 GPUs, PCIe, NUMA 0" ("" for one GPU)."""
    if len(members) < 2:
        return ""
    adjacency = _adjacency(members, links)
    groups = _components(len(members), adjacency)
    pairs = len(members) * (len(members) - 1) // 2
    edges = -_score((1 << len(members)) - 1, adjacency, [None] * len(members))[0]
    if edges == pairs:
        how = "fully NVLink-connected"
    elif edges == 0:
        how = "PCIe"
    elif groups == 1:
        how = "NVLink-connected (not all pairs)"
    else:
        how = f"{groups} NVLink groups"
    known = sorted({numa[m] for m in members if numa.get(m) is not None})
    where = f", NUMA {'+'.join(map(str, known))}" if known else ""
    return f"{len(members)} GPUs, {how}{where}"


def _adjacency(order: Sequence[int], links: Mapping) -> list[int]:
    """Per position, the bitmask of positions it is linked to (made symmetric)."""
    position = {key: i for i, key in enumerate(order)}
    adjacency = [0] * len(order)
    for i, key in enumerate(order):
        for peer in links.get(key, ()):
            j = position.get(peer)
            if j is not None and j != i:
                adjacency[i] |= 1 << j
                adjacency[j] |= 1 << i
    return adjacency


def _score(members: int, adjacency: list[int], domains: list[int | None]) -> tuple[int, int]:
    edges, seen, unknown = 0, set(), 0
    mask = members
    while mask:
        low = mask & -mask
        i = low.bit_length() - 1
        mask ^= low
        edges += (adjacency[i] & members).bit_count()
        if domains[i] is None:
            unknown += 1
        else:
            seen.add(domains[i])
    return -(edges // 2), len(seen) + unknown


def _exact(n: int, count: int, adjacency: list[int], domains: list[int | None]) -> list[int]:
    # combinations() yields position tuples in lexicographic order, so the first set with the
    # best score is the one the caller's preference order puts first.
    best, best_score = None, None
    perfect = (-(count * (count - 1) // 2), 1)
    for combo in combinations(range(n), count):
        members = 0
        for i in combo:
            members |= 1 << i
        score = _score(members, adjacency, domains)
        if best_score is None or score < best_score:
            best, best_score = combo, score
            if score == perfect:
                break
    return list(best)


def _greedy(n: int, count: int, adjacency: list[int], domains: list[int | None]) -> list[int]:
    """Grow a set from every seed (most links into the set, same NUMA node as the seed, most
    preferred) and keep the best; for nodes too large to search exactly."""
    best, best_score = None, None
    for seed in range(n):
        members, chosen = 1 << seed, [seed]
        while len(chosen) < count:
            pick = min(
                (i for i in range(n) if not members >> i & 1),
                key=lambda i: (
                    -(adjacency[i] & members).bit_count(),
                    domains[i] != domains[seed],
                    i,
                ),
            )
            members |= 1 << pick
            chosen.append(pick)
        score = (_score(members, adjacency, domains), sorted(chosen))
        if best_score is None or score < best_score:
            best, best_score = sorted(chosen), score
    return best


def _components(n: int, adjacency: list[int]) -> int:
    left, groups = (1 << n) - 1, 0
    while left:
        frontier = left & -left
        group = 0
        while frontier:
            group |= frontier
            low = frontier & -frontier
            frontier ^= low
            frontier |= adjacency[low.bit_length() - 1] & ~group & left
        left &= ~group
        groups += 1
    return groups
