"""Dependency cycles among ok ops, as Elle finds them: write-write (ww) edges between consecutive
writers of a key in offset order, write-read (wr) edges from a value's writer to each op that polled
it; a cycle of ww edges alone is G0, one with a wr edge G1c. One concrete cycle per strongly
connected component (Tarjan), found by a breadth-first search inside it.

Kafka does not promise to forbid G0: two transactional producers sending to the same keys
concurrently interleave their records, which makes a ww cycle without any fault. `ww_deps=False`
leaves ww edges out (as Jepsen's --no-ww-deps) to hunt for pure wr cycles."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from .anomaly import Anomaly
from .model import Event, Model

Graph = dict[int, dict[int, tuple[str, str]]]  # op -> {op after it: (kind, key)}


def graphs(model: Model, ww_deps: bool = True) -> tuple[Graph, Graph]:
    """(the ww graph, the ww + wr graph); a pair with both kinds is labelled wr in the second."""
    nodes = {e.index for e in model.events if e.ok and e.f in ("txn", "send", "poll")}
    ww: Graph = {}
    both: Graph = {}
    if ww_deps:
        writers: dict[str, dict[int, Event]] = {}
        for value, send in model.writer.items():
            if send.event.index not in nodes:
                continue
            offset = send.offset if send.offset is not None else model.lowest.get((send.key, value))
            if offset is not None:
                writers.setdefault(send.key, {}).setdefault(offset, send.event)
        for key, by_offset in writers.items():
            order = [by_offset[o] for o in sorted(by_offset)]
            for a, b in zip(order, order[1:]):
                if a is not b:
                    ww.setdefault(a.index, {}).setdefault(b.index, ("ww", key))
                    both.setdefault(a.index, {}).setdefault(b.index, ("ww", key))
    for r in model.reads:
        if r.event.index not in nodes or r.value is None or r.source not in ("poll", "txn"):
            continue
        send = model.writer.get(r.value)
        if send is not None and send.event.index in nodes and send.event is not r.event:
            both.setdefault(send.event.index, {})[r.event.index] = ("wr", r.key)
    return ww, both


def sccs(graph: Graph) -> list[list[int]]:
    """Tarjan's strongly connected components of more than one node, without recursion."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    stack: list[int] = []
    on_stack: set[int] = set()
    out = []
    for root in graph:
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work = [(root, iter(graph.get(root, ())))]
        while work:
            node, successors = work[-1]
            descended = False
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(graph.get(nxt, ()))))
                    descended = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if descended:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(component)
    return out


def _path(graph: Graph, start: int, goal: int, members: set[int]) -> list[int]:
    """The shortest path start -> goal through `members` (there is one: they are one component)."""
    came: dict[int, int | None] = {start: None}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        if node == goal:
            break
        for nxt in graph.get(node, ()):
            if nxt in members and nxt not in came:
                came[nxt] = node
                queue.append(nxt)
    path = [goal]
    while path[-1] != start:
        path.append(came[path[-1]])
    return path[::-1]


def _anomaly(cls: str, graph: Graph, cycle: list[int]) -> Anomaly:
    steps = [{"from": a, "to": b, "kind": graph[a][b][0], "key": graph[a][b][1]} for a, b in zip(cycle, cycle[1:])]
    text = f"{cycle[0]}" + "".join(f" -{s['kind']} {s['key']}-> {s['to']}" for s in steps)
    return Anomaly(cls, f"{cls} cycle of {len(cycle) - 1} ops: {text}", cycle[:-1], {"steps": steps})


def cycles(model: Model, ww_deps: bool = True) -> Iterator[Anomaly]:
    ww, both = graphs(model, ww_deps)
    for component in sccs(ww):
        members = set(component)
        start = component[0]
        nxt = next(n for n in ww[start] if n in members)
        yield _anomaly("G0", ww, [start, *_path(ww, nxt, start, members)])
    for component in sccs(both):
        members = set(component)
        wr = next(((a, b) for a in component for b, (kind, _) in both.get(a, {}).items() if kind == "wr" and b in members), None)
        if wr is not None:  # a component of ww edges alone is G0's, reported above
            a, b = wr
            yield _anomaly("G1c", both, [a, *_path(both, b, a, members)])
