"""The nemesis: the faults a chaos run injects (kills, pauses, partitions, slow links) and the schedule it records.

`Nemesis(cluster, recorder, mix, rng).run(stop_at)` loops until `stop_at` (time.monotonic()): a fault drawn from the
mix, held for a while, healed, a quiet gap, again; each fault is recorded as a "start" and a "stop" line of process
"nemesis". Processes are handled by process.py, namespaces and routes by network.py, links by the cluster's proxies.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("chaos.nemesis")

NEMESES: dict[str, str] = {
    "none": "no faults: the workload alone, the baseline every other mix is read against",
    "kill": "kill -9 of a broker or a compactor, started again a few seconds later",
    "pause": "SIGSTOP of a broker, a compactor, an etcd member or SeaweedFS for 1-30 s (some outlive the leases), then SIGCONT",
    "partition": "network partitions (root): one node from the rest, random halves, brokers from etcd, from S3, from each other, clients from a broker",
    "slow": "delay, jitter, loss and bandwidth caps on broker→etcd and broker→S3 links",
    "object-store": "SeaweedFS stopped or paused for 10-60 s",
    "etcd": "etcd's leader killed with -9 and started again, or cut from the other members",
    "all": "a random mix of every fault above",
}

MIXES: dict[str, tuple[str, ...]] = {
    "none": (),
    "kill": ("kill",),
    "pause": ("pause",),
    "partition": ("isolate", "halves", "brokers-etcd", "brokers-s3", "brokers-brokers", "clients-broker"),
    "slow": ("slow",),
    "object-store": ("s3-stop", "s3-pause"),
    "etcd": ("etcd-leader-kill", "etcd-leader-partition"),
}
MIXES["all"] = tuple(dict.fromkeys(f for faults in MIXES.values() for f in faults))
NEEDS_NETNS = {"isolate", "halves", "brokers-brokers", "clients-broker", "etcd-leader-partition"}
PROXY_FALLBACK = ("brokers-etcd", "brokers-s3")  # what a partition mix can still do without namespaces


@dataclass
class Fault:
    f: str  # the history's name of it
    value: Any  # what it hit
    heal: Callable[[], None]


class Nemesis:
    def __init__(self, cluster: Any, recorder: Any, mix: str, rng: random.Random) -> None:
        if mix not in NEMESES:
            raise ValueError(f"unknown nemesis {mix!r}; known: {', '.join(NEMESES)}")
        self.cluster, self.recorder, self.mix, self.rng = cluster, recorder, mix, rng
        self.kinds = list(MIXES[mix])
        netns = getattr(cluster, "network", None) is not None
        if not netns:
            dropped = [k for k in self.kinds if k in NEEDS_NETNS]
            self.kinds = [k for k in self.kinds if k not in NEEDS_NETNS]
            if mix == "partition":
                self.kinds = list(PROXY_FALLBACK)
            if dropped:
                note = f"network namespaces unavailable (not root): {', '.join(dropped)} left out; proxy faults only"
                log.warning("nemesis %s: %s", mix, note)
                self.recorder.fault("note", "start", note)
                self.recorder.fault("note", "stop", note)
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._active: Fault | None = None

    # -- the schedule -----------------------------------------------------------------------------------

    def run(self, stop_at: float) -> None:
        """Faults one after another until `stop_at` (or heal()); the last is healed before it returns."""
        total = max(1.0, stop_at - time.monotonic())
        self._wait(min(self.rng.uniform(1.0, 5.0), total * 0.1), stop_at)  # the workload starts on a healthy cluster
        while self.kinds and not self._stopping.is_set() and time.monotonic() < stop_at - 1.0:
            kind = self.rng.choice(self.kinds)
            hold = self._duration(kind, total)
            try:
                self._begin(kind)
            except Exception as e:  # a fault that cannot be made (a process already gone) is noted, not fatal
                log.warning("nemesis: %s not injected: %s", kind, e)
                self.recorder.fault(kind, "start", {"error": str(e)})
                self.recorder.fault(kind, "stop", {"error": str(e)})
                self._wait(1.0, stop_at)
                continue
            self._wait(hold, stop_at)
            try:
                self._end()
            except Exception as e:  # the cluster's heal() starts what this could not
                log.warning("nemesis: healing %s failed: %s", kind, e)
            self._wait(self.rng.uniform(1.0, max(2.0, total * 0.05)), stop_at)

    def _wait(self, seconds: float, stop_at: float) -> None:
        self._stopping.wait(max(0.0, min(seconds, stop_at - time.monotonic())))

    def _duration(self, kind: str, total: float) -> float:
        """How long a fault is held: pauses of 1-4 s or of 6-30 s (the long ones outlive the brokers' 5 s leases and the
        clients' 10 s sessions), the object store out for 10-60 s; each bounded by a share of the run, so a 60 s run
        still sees several faults and a heal."""
        if kind == "pause":
            return self.rng.choice([self.rng.uniform(1, 4), self.rng.uniform(6, max(7.0, min(30.0, total * 0.4)))])
        if kind.startswith("s3"):
            return self.rng.uniform(10, max(11.0, min(60.0, total * 0.5)))
        if kind in ("kill", "etcd-leader-kill"):
            return self.rng.uniform(2, max(3.0, min(10.0, total * 0.1)))
        return self.rng.uniform(5, max(6.0, min(40.0, total * 0.3)))

    def _begin(self, kind: str) -> None:
        with self._lock:
            if self._active is not None:
                raise RuntimeError(f"{self._active.f} is still under way")
            fault = getattr(self, "_" + kind.replace("-", "_"))()
            self._active = fault
            self.recorder.fault(fault.f, "start", fault.value)

    def inject(self, kind: str) -> Any:
        """Start one fault of `kind` (a name of MIXES' lists) now, outside the schedule; its value. `release()` heals it."""
        self._begin(kind)
        return self._active.value

    def release(self) -> None:
        """Heal the fault under way, recording its stop."""
        self._end()

    def _end(self) -> None:
        with self._lock:
            fault, self._active = self._active, None
            if fault is None:
                return
            try:
                fault.heal()
            finally:
                self.recorder.fault(fault.f, "stop", fault.value)

    def heal(self) -> None:
        """Stop the schedule and heal the fault under way (the cluster's heal() clears everything else)."""
        self._stopping.set()
        self._end()

    # -- faults: processes ------------------------------------------------------------------------------

    def _pick(self, *kinds: str):
        return self.rng.choice([n for n in self.cluster.nodes.values() if n.kind in kinds])

    def _kill(self) -> Fault:
        node = self._pick("broker", "compactor")
        node.kill9()
        return Fault("kill", node.name, node.start)

    def _pause(self) -> Fault:
        node = self._pick("broker", "compactor", "etcd", "s3")
        node.pause()
        return Fault("pause", node.name, node.resume)

    def _s3_stop(self) -> Fault:
        node = self.cluster.node("s3")
        node.kill9()
        return Fault("s3-stop", "s3", node.start)

    def _s3_pause(self) -> Fault:
        node = self.cluster.node("s3")
        node.pause()
        return Fault("s3-pause", "s3", node.resume)

    def _leader(self):
        member = self.cluster.etcd.leader()
        if member is None:
            raise RuntimeError("no etcd member says it leads")
        return self.cluster.node(member.name)

    def _etcd_leader_kill(self) -> Fault:
        node = self._leader()
        node.kill9()
        return Fault("etcd-leader-kill", node.name, node.start)

    # -- faults: network ----------------------------------------------------------------------------------

    def _brokers(self) -> list[str]:
        return [n.name for n in self.cluster.nodes.values() if n.kind == "broker"]

    def _blackhole(self, links: list[tuple[str, str]]) -> Callable[[], None]:
        for link in links:
            self.cluster.links[link].set(blackhole=True)

        def heal() -> None:
            # a partition longer than TCP's patience: the connections that lived through it end with an RST
            for link in links:
                self.cluster.links[link].set(reset=True)

        return heal

    def _cut(self, pairs: list[tuple[str, str]], links: list[tuple[str, str]] = ()) -> Callable[[], None]:
        net = self.cluster.network
        for a, b in pairs:
            net.cut(a, b)
        heal_links = self._blackhole(list(links))

        def heal() -> None:
            net.heal()
            heal_links()

        return heal

    def _some_brokers(self) -> list[str]:
        brokers = self._brokers()
        return sorted(self.rng.sample(brokers, self.rng.randint(1, len(brokers))))

    def _brokers_etcd(self) -> Fault:
        brokers = self._some_brokers()
        links = [link for link in self.cluster.links if link[0] in brokers and link[1].startswith("etcd")]
        return Fault("partition", {"kind": "brokers-etcd", "brokers": brokers}, self._blackhole(links))

    def _brokers_s3(self) -> Fault:
        brokers = self._some_brokers()
        links = [link for link in self.cluster.links if link[0] in brokers and link[1] == "s3"]
        return Fault("partition", {"kind": "brokers-s3", "brokers": brokers}, self._blackhole(links))

    def _isolate(self) -> Fault:
        node = self._pick("broker", "compactor", "etcd", "s3", "postgres")
        net = self.cluster.network
        net.isolate(node.name)
        # a broker's own links run through the proxies, and a server's through every broker's proxy to it
        links = [link for link in self.cluster.links if node.name in link]
        heal_links = self._blackhole(links)

        def heal() -> None:
            net.heal()
            heal_links()

        return Fault("partition", {"kind": "isolate", "node": node.name}, heal)

    def _halves(self) -> Fault:
        names = list(self.cluster.nodes)
        self.rng.shuffle(names)
        half = set(names[: self.rng.randint(1, len(names) - 1)])
        other = [n for n in names if n not in half]
        pairs = [(a, b) for a in sorted(half) for b in other]
        links = [link for link in self.cluster.links if (link[0] in half) != (link[1] in half)]
        return Fault("partition", {"kind": "halves", "halves": [sorted(half), sorted(other)]}, self._cut(pairs, links))

    def _brokers_brokers(self) -> Fault:
        brokers = self._brokers()
        one = self.rng.choice(brokers)
        if self.rng.random() < 0.5:
            pairs = [(one, b) for b in brokers if b != one]
            value = {"kind": "brokers-brokers", "isolated": one}
        else:
            pairs = [(a, b) for i, a in enumerate(brokers) for b in brokers[i + 1 :]]
            value = {"kind": "brokers-brokers", "isolated": brokers}
        return Fault("partition", value, self._cut(pairs))

    def _clients_broker(self) -> Fault:
        broker = self.rng.choice(self._brokers())
        return Fault("partition", {"kind": "clients-broker", "broker": broker}, self._cut([(broker, "clients")]))

    def _etcd_leader_partition(self) -> Fault:
        leader = self._leader()
        others = [n.name for n in self.cluster.nodes.values() if n.kind == "etcd" and n.name != leader.name]
        return Fault("partition", {"kind": "etcd-leader", "leader": leader.name, "from": others}, self._cut([(leader.name, o) for o in others]))

    def _slow(self) -> Fault:
        brokers = self._some_brokers()
        targets = self.rng.choice([("etcd",), ("s3",), ("etcd", "s3")])
        links = [link for link in self.cluster.links if link[0] in brokers and link[1].startswith(targets)]
        faults = {"delay_ms": self.rng.choice([20, 100, 300, 1000]), "jitter_ms": self.rng.choice([0, 20, 100])}
        if self.rng.random() < 0.3:
            faults["loss"] = self.rng.choice([0.01, 0.05, 0.2])
        if self.rng.random() < 0.3:
            faults["bandwidth_bytes_per_s"] = self.rng.choice([64 << 10, 512 << 10, 4 << 20])
        for link in links:
            self.cluster.links[link].set(**faults)

        def heal() -> None:
            for link in links:
                self.cluster.links[link].clear()

        return Fault("slow", {"links": [f"{a}->{b}" for a, b in links], **faults}, heal)
