"""Server-side assignors of KIP-848 consumer groups: "uniform" (the default) and "range".

An assignor maps the members' subscriptions to a target assignment. Inputs: each member's
subscribed topic ids, every subscribed topic's (name, partition count), and the previous target
(stickiness). Topics are ordered by name and members by id, so the result is deterministic.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping

Assignment = dict[uuid.UUID, frozenset[int]]
Topics = Mapping[uuid.UUID, tuple[str, int]]  # topic id -> (name, partitions)
Assignor = Callable[[Mapping[str, frozenset[uuid.UUID]], Topics, Mapping[str, Assignment]], dict[str, Assignment]]


def _pack(owned: dict[str, dict[uuid.UUID, set[int]]]) -> dict[str, Assignment]:
    return {m: {t: frozenset(ps) for t, ps in by_topic.items() if ps} for m, by_topic in owned.items()}


def uniform(subscriptions: Mapping[str, frozenset[uuid.UUID]], topics: Topics, previous: Mapping[str, Assignment]) -> dict[str, Assignment]:
    """Balanced and sticky: partitions with the fewest eligible members go first; a partition stays
    with its previous owner while that owner holds no more than the least loaded eligible member,
    otherwise it goes to the least loaded eligible member. Counts of members with the same
    subscription therefore never differ by more than one, and a partition moves only to restore
    that balance."""
    owner = {(t, p): m for m, a in previous.items() if m in subscriptions for t, ps in a.items() for p in ps}
    eligible = {t: sorted(m for m, subs in subscriptions.items() if t in subs) for t in topics}
    partitions = [(t, p) for t in sorted(topics, key=lambda t: topics[t][0]) for p in range(topics[t][1]) if eligible[t]]
    partitions.sort(key=lambda tp: len(eligible[tp[0]]))  # stable: name and partition order within
    load = dict.fromkeys(subscriptions, 0)
    out: dict[str, dict[uuid.UUID, set[int]]] = {m: {} for m in subscriptions}
    for t, p in partitions:
        candidates = eligible[t]
        least = min(candidates, key=lambda m: (load[m], m))
        prev = owner.get((t, p))
        chosen = prev if prev in candidates and load[prev] <= load[least] else least
        out[chosen].setdefault(t, set()).add(p)
        load[chosen] += 1
    return _pack(out)


def range_(subscriptions: Mapping[str, frozenset[uuid.UUID]], topics: Topics, previous: Mapping[str, Assignment]) -> dict[str, Assignment]:
    """Per topic, its subscribers sorted by member id get contiguous ranges; the first
    (partitions % members) get one partition more. Not sticky."""
    out: dict[str, dict[uuid.UUID, set[int]]] = {m: {} for m in subscriptions}
    for t, (_, count) in sorted(topics.items(), key=lambda kv: kv[1][0]):
        members = sorted(m for m, subs in subscriptions.items() if t in subs)
        if not members:
            continue
        share, extra = divmod(count, len(members))
        start = 0
        for i, m in enumerate(members):
            n = share + (1 if i < extra else 0)
            out[m].setdefault(t, set()).update(range(start, start + n))
            start += n
    return _pack(out)


ASSIGNORS: dict[str, Assignor] = {"uniform": uniform, "range": range_}
DEFAULT = "uniform"
