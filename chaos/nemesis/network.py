"""The run's network when the harness is root: one network namespace per process, each joined by a veth pair to
one bridge in the root namespace, and the faults cut into it (blackhole routes, links down). It owns creating and
removing all of it, a record of what it made, and the clean-up of what a crashed run left behind."""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import logging
import os
import signal
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("chaos.network")

# What each run made, by run id, so that the next run removes it if the run that made it died (its pid is gone):
# the run's own directory may be anywhere, this one is fixed. /run is a tmpfs: a reboot forgets it and the namespaces alike.
REGISTRY = Path(os.environ.get("NEVE_CHAOS_NETNS_REGISTRY", "/run/neve-chaos"))
NS_PREFIX = "chaos-"
BRIDGE_HOST = 1  # the harness's clients: their connections leave the root namespace from .1, the bridge's first address
PROXY_HOST = 2  # the fault proxies listen on .2, so a route that cuts a node from the clients (.1) leaves its proxies alone
FIRST_NODE_HOST = 10


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}")
    return done


@dataclass(frozen=True)
class Endpoint:
    """One process's place in the network: its namespace, address and the host end of its veth."""

    name: str
    netns: str
    address: str
    veth: str

    @property
    def prefix(self) -> list[str]:
        """The command prefix that runs a process inside the namespace (`ip netns exec` execs: the pid is the process's)."""
        return ["ip", "netns", "exec", self.netns]


class Network:
    """Namespaces, veths and a bridge for one run (`run`: a few hex digits, unique per run), on a private /24 picked
    from the run id among those no route of this machine uses. `create(names)` makes an endpoint per name;
    `cut(a, b)` drops every packet between two endpoints (or between one and the root namespace's clients);
    `heal()` undoes every cut; `remove()` removes everything, and is safe to call twice."""

    def __init__(self, run: str, record: Path) -> None:
        self.run = run
        self.record = record  # a copy of the registry entry in the run's directory, for a person
        self.bridge = f"nvb{run}"
        self.subnet = self._pick_subnet()
        self.endpoints: dict[str, Endpoint] = {}
        self._cuts: set[tuple[str, str]] = set()  # (netns, address blackholed in it)
        self._down: set[str] = set()  # veths taken down
        self._lock = threading.Lock()

    # -- addresses ------------------------------------------------------------------------------

    def _pick_subnet(self) -> ipaddress.IPv4Network:
        used = ip("-4", "route", "show", "table", "all").stdout + ip("-4", "addr").stdout
        seed = int(hashlib.sha256(self.run.encode()).hexdigest(), 16)
        for attempt in range(256):
            n = (seed + attempt * 7919) % (64 * 256)
            net = ipaddress.IPv4Network(f"10.{192 + n // 256}.{n % 256}.0/24")
            if f"10.{192 + n // 256}.{n % 256}." not in used:
                return net
        raise RuntimeError("no free 10.192-255.x.0/24 for the chaos network")

    def host(self, n: int) -> str:
        return str(self.subnet.network_address + n)

    @property
    def client_address(self) -> str:
        return self.host(BRIDGE_HOST)

    @property
    def proxy_address(self) -> str:
        return self.host(PROXY_HOST)

    # -- making and removing ----------------------------------------------------------------------

    def create(self, names: list[str]) -> None:
        """The bridge, then a namespace and a veth per name (loopback up in each), recording each step before it is
        taken so that a crash midway leaves nothing unrecorded."""
        cleanup_leftovers()
        self._save(names)
        ip("link", "add", self.bridge, "type", "bridge")
        # .1 first: the kernel takes the first address of the subnet as the source of the clients' connections
        ip("addr", "add", f"{self.client_address}/24", "dev", self.bridge)
        ip("addr", "add", f"{self.proxy_address}/24", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        for i, name in enumerate(names):
            netns, veth = f"{NS_PREFIX}{self.run}-{name}", f"nv{self.run}{i:02d}"
            endpoint = Endpoint(name, netns, self.host(FIRST_NODE_HOST + i), veth)
            ip("netns", "add", netns)
            ip("link", "add", veth, "type", "veth", "peer", "name", f"{veth}p")
            ip("link", "set", f"{veth}p", "netns", netns)
            ip("-n", netns, "link", "set", f"{veth}p", "name", "eth0")
            ip("-n", netns, "addr", "add", f"{endpoint.address}/24", "dev", "eth0")
            ip("-n", netns, "link", "set", "eth0", "up")
            ip("-n", netns, "link", "set", "lo", "up")
            ip("link", "set", veth, "master", self.bridge)
            ip("link", "set", veth, "up")
            self.endpoints[name] = endpoint
        self._save(names)

    def _save(self, names: list[str]) -> None:
        entry = {
            "pid": os.getpid(), "run": self.run, "bridge": self.bridge, "subnet": str(self.subnet),
            "namespaces": [f"{NS_PREFIX}{self.run}-{n}" for n in names], "veths": [f"nv{self.run}{i:02d}" for i in range(len(names))],
            "endpoints": {n: e.address for n, e in self.endpoints.items()},
        }  # fmt: skip
        REGISTRY.mkdir(parents=True, exist_ok=True)
        (REGISTRY / f"{self.run}.json").write_text(json.dumps(entry, indent=1))
        self.record.parent.mkdir(parents=True, exist_ok=True)
        self.record.write_text(json.dumps(entry, indent=1))

    def remove(self) -> None:
        path = REGISTRY / f"{self.run}.json"
        if path.exists():
            _remove_entry(json.loads(path.read_text()))
            path.unlink(missing_ok=True)
        self.endpoints.clear()
        self._cuts.clear()
        self._down.clear()

    # -- faults -------------------------------------------------------------------------------------

    def cut(self, a: str, b: str) -> None:
        """Drop every packet between endpoints `a` and `b` (either may be "clients", the root namespace's .1): a
        blackhole route to the other's address in each one's namespace. Packets vanish, as Jepsen's DROP makes them
        vanish: an open connection retransmits into the void; a new one fails at once (EINVAL from the route), which
        the client sees as it sees a host it cannot reach."""
        for src, dst in ((a, b), (b, a)):
            if src == "clients":
                continue  # routes in the root namespace would cut the proxies too; the other side's route is enough for TCP
            netns = self.endpoints[src].netns
            address = self.client_address if dst == "clients" else self.endpoints[dst].address
            with self._lock:
                if (netns, address) in self._cuts:
                    continue
                ip("-n", netns, "route", "add", "blackhole", f"{address}/32")
                self._cuts.add((netns, address))

    def isolate(self, name: str) -> None:
        """Cut `name` from every other endpoint and from the root namespace (its clients and its proxies)."""
        for other in self.endpoints:
            if other != name:
                self.cut(name, other)
        self.cut(name, "clients")
        netns = self.endpoints[name].netns
        with self._lock:
            if (netns, self.proxy_address) not in self._cuts:
                ip("-n", netns, "route", "add", "blackhole", f"{self.proxy_address}/32")
                self._cuts.add((netns, self.proxy_address))

    def link_down(self, name: str) -> None:
        """Take `name`'s veth down: the namespace loses every peer at once, its own sockets see no error."""
        veth = self.endpoints[name].veth
        with self._lock:
            ip("link", "set", veth, "down")
            self._down.add(veth)

    def heal(self) -> None:
        """Every cut route removed, every veth up."""
        with self._lock:
            for netns, address in sorted(self._cuts):
                ip("-n", netns, "route", "del", "blackhole", f"{address}/32", check=False)
            self._cuts.clear()
            for veth in sorted(self._down):
                ip("link", "set", veth, "up", check=False)
            self._down.clear()

    @property
    def cuts(self) -> list[tuple[str, str]]:
        with self._lock:
            return sorted(self._cuts)

    def describe(self) -> dict:
        return {"subnet": str(self.subnet), "bridge": self.bridge, "clients": self.client_address, "proxies": self.proxy_address,
                "namespaces": {n: {"netns": e.netns, "address": e.address, "veth": e.veth} for n, e in self.endpoints.items()}}  # fmt: skip


def _remove_entry(entry: dict) -> None:
    """Remove what one registry entry names: the processes left in its namespaces (killed), the namespaces, the veths
    (deleting one end removes its peer) and the bridge. Each step ignores what is already gone."""
    for netns in entry.get("namespaces", []):
        pids = ip("netns", "pids", netns, check=False).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        ip("netns", "del", netns, check=False)
    for veth in entry.get("veths", []):
        ip("link", "del", veth, check=False)
    ip("link", "del", entry["bridge"], check=False)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def cleanup_leftovers() -> list[str]:
    """Remove the namespaces, veths and bridges of runs whose harness died without removing them; the runs of
    harnesses still alive are left alone. Returns the run ids removed."""
    removed = []
    if not REGISTRY.exists():
        return removed
    for path in sorted(REGISTRY.glob("*.json")):
        try:
            entry = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if entry.get("pid") == os.getpid() or _alive(int(entry.get("pid", 0))):
            continue
        log.warning("removing the network of chaos run %s left by pid %s", entry.get("run"), entry.get("pid"))
        _remove_entry(entry)
        path.unlink(missing_ok=True)
        removed.append(entry.get("run", path.stem))
    return removed
