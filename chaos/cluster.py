"""The real cluster a chaos run faults: a 3-member etcd, SeaweedFS (S3), PostgreSQL (the Iceberg SQL catalog), 3
`neve broker` and 2 `neve compactor` (topics shared), each in a network namespace of its own when run as root, and
a fault proxy on every broker → etcd member and broker → S3 link. It owns starting, healing and stopping all of it.

The launchers are the shared ones: bench/servers.py (EtcdCluster, SeaweedFS, Postgres) and tests/fixtures.NeveNode,
imported from the checkout (python -m chaos runs from the repository root).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from bench.servers import EtcdCluster, Postgres, SeaweedFS, remove_weed_sockets, wait_bucket, wait_ready
from tests.fixtures import NeveNode, free_port

from .nemesis.network import Network
from .nemesis.process import Node
from .nemesis.proxy import FaultProxy

log = logging.getLogger("chaos.cluster")

BUCKET = "neve"
ROOT = "chaos"  # the etcd key root and the S3 prefix: the cluster is the run's own
FORMED_TIMEOUT_S = 120.0
HEAL_TIMEOUT_S = 180.0
ZONES = ("a", "b", "c")
# Short freshness and interval: the run ends by reading every table, and should not wait long for it. In-process
# tasks keep Spark's JVMs off a small machine.
COMPACTOR_DEFAULTS = {"NEVE_COMPACTOR_RUNNER": "in-process", "NEVE_COMPACTOR_FRESHNESS_MS": "1000", "NEVE_COMPACTOR_INTERVAL_MS": "500", "NEVE_COMPACTOR_SHARE_TOPICS": "true"}
BROKER_DEFAULTS = {"NEVE_WAL_LINGER_MS": "20"}


class ChaosCluster:
    """`start()`, then `bootstrap` for clients, `nodes` (by name: broker0-2, etcd0-2, s3, postgres, compactor0-1) for
    the nemesis, `links` (FaultProxy by (broker, "etcd<i>" | "s3")), `network` (None without namespaces), `heal()`
    and `stop()`. `stop()` removes everything, whatever state `start()` reached."""

    def __init__(self, work_dir: Path, *, netns: bool | None = None, brokers: int = 3, etcd_members: int = 3, compactors: int = 2,
                 broker_env: dict[str, str] | None = None, compactor_env: dict[str, str] | None = None, recorder: Any = None) -> None:  # fmt: skip
        self.work_dir = Path(work_dir)
        self.logs = self.work_dir / "logs"
        self.netns = (os.geteuid() == 0) if netns is None else netns
        if self.netns and os.geteuid() != 0:
            raise RuntimeError("network namespaces need root; run without netns (process and proxy faults only)")
        self.n_brokers, self.n_etcd, self.n_compactors = brokers, etcd_members, compactors
        self.broker_env, self.compactor_env = dict(broker_env or {}), dict(compactor_env or {})
        self.recorder = recorder
        self.run = uuid.uuid4().hex[:6]
        self.network: Network | None = None
        self.etcd: EtcdCluster | None = None
        self.s3: SeaweedFS | None = None
        self.postgres: Postgres | None = None
        self.catalog_url: str | None = None
        self.brokers: list[NeveNode] = []
        self.compactors: list[NeveNode] = []
        self.links: dict[tuple[str, str], FaultProxy] = {}
        self.nodes: dict[str, Node] = {}
        self._heal_lock = threading.Lock()

    # -- names and addresses ----------------------------------------------------------------------------

    def names(self) -> list[str]:
        return ([f"etcd{i}" for i in range(self.n_etcd)] + ["s3", "postgres"] + [f"broker{i}" for i in range(self.n_brokers)]
                + [f"compactor{i}" for i in range(self.n_compactors)])  # fmt: skip

    def _host(self, name: str) -> str:
        return self.network.endpoints[name].address if self.network else "127.0.0.1"

    def _prefix(self, name: str) -> list[str]:
        return self.network.endpoints[name].prefix if self.network else []

    @property
    def proxy_host(self) -> str:
        return self.network.proxy_address if self.network else "127.0.0.1"

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers)

    def node(self, name: str) -> Node:
        return self.nodes[name]

    def of_kind(self, kind: str) -> list[Node]:
        return [n for n in self.nodes.values() if n.kind == kind]

    # -- start ------------------------------------------------------------------------------------------

    def start(self) -> ChaosCluster:
        self.logs.mkdir(parents=True, exist_ok=True)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        if self.netns:
            self.network = Network(self.run, self.work_dir / "network.json")
            self.network.create(self.names())
            log.info("chaos cluster %s on %s, a namespace per process", self.run, self.network.subnet)
        else:
            log.warning("chaos cluster %s on 127.0.0.1 without network namespaces (not root): process faults and proxy faults only", self.run)
        names = [f"etcd{i}" for i in range(self.n_etcd)]
        self.etcd = EtcdCluster(self.work_dir / "etcd", self.logs, self.n_etcd, hosts=[self._host(n) for n in names], prefixes=[tuple(self._prefix(n)) for n in names])
        self.s3 = SeaweedFS(self.work_dir / "s3", self.logs / "s3.log", host=self._host("s3"), prefix=tuple(self._prefix("s3")), buckets=(BUCKET,))
        trusted = str(self.network.subnet) if self.network else None
        self.postgres = Postgres(self.work_dir / "postgres", self.logs / "postgres.log", durable=False, host=self._host("postgres"), prefix=tuple(self._prefix("postgres")), trusted_network=trusted)
        # etcd, SeaweedFS and PostgreSQL start side by side: each takes seconds, mostly waiting
        self._start_all([self.etcd.start, self.s3.start, self.postgres.start])
        self.catalog_url = self.postgres.create_database("iceberg_catalog")
        self._add_server_nodes()

        # the cache's chunk port listens off loopback: it takes a shared secret, as a deployment's does
        secret = self.work_dir / "peer-secret"
        secret.write_text(uuid.uuid4().hex)
        secure = {"NEVE_BROKER_ALLOW_INSECURE_LISTENERS": "true", "NEVE_CACHE_PEER_SECRET_FILE": str(secret)}
        for i in range(self.n_brokers):
            name = f"broker{i}"
            for m, member in enumerate(self.etcd.members):
                self.links[(name, f"etcd{m}")] = FaultProxy((member.host, member.client_port), listen=(self.proxy_host, 0)).start()
            self.links[(name, "s3")] = FaultProxy((self.s3.host, self.s3.ports["s3.port"]), listen=(self.proxy_host, 0)).start()
            members = ",".join(f"{self.proxy_host}:{self.links[(name, f'etcd{m}')].port}" for m in range(self.n_etcd))
            env = {
                **self.s3.env, **BROKER_DEFAULTS, **secure,
                "NEVE_METADATA_URL": f"etcd://{members}/{ROOT}",
                "NEVE_WAL_OBJECT_STORE": f"s3://{BUCKET}/{ROOT}?endpoint=http://{self.proxy_host}:{self.links[(name, 's3')].port}",
                "NEVE_BROKER_NODE_ID": str(i), "NEVE_BROKER_ZONE": ZONES[i % len(ZONES)], "NEVE_DATA_DIR": str(self.work_dir / name),
                **self.broker_env,
            }  # fmt: skip
            host = self._host(name)
            port = 9092 if self.network else free_port()  # a namespace has its ports to itself
            broker = NeveNode(data_dir=self.work_dir / name, log_path=self.logs / f"{name}.log", port=port, env=env, command="broker", host=host, prefix=self._prefix(name))
            self.brokers.append(broker)
            self._add_neve_node(name, "broker", broker)
        self._start_all([b.start for b in self.brokers])
        self.wait_formed(FORMED_TIMEOUT_S)

        for j in range(self.n_compactors):
            name = f"compactor{j}"
            env = {**self.s3.env, **self.compactor_config_env(), "NEVE_BROKER_NODE_ID": str(100 + j), "NEVE_BROKER_HOST": self._host(name), **secure, **self.compactor_env}
            compactor = NeveNode(data_dir=self.work_dir / name, log_path=self.logs / f"{name}.log", env=env, command="compactor", host=self._host(name), prefix=self._prefix(name))
            self.compactors.append(compactor)
            self._add_neve_node(name, "compactor", compactor)
        self._start_all([c.start for c in self.compactors])

    def compactor_config_env(self) -> dict[str, str]:
        """What a compactor is told: etcd and S3 direct (no proxy: its links are not the nemesis's), the catalog."""
        assert self.etcd is not None and self.s3 is not None
        return {
            "NEVE_METADATA_URL": f"etcd://{','.join(self.etcd.endpoints)}/{ROOT}",
            "NEVE_WAL_OBJECT_STORE": f"s3://{BUCKET}/{ROOT}?endpoint={self.s3.endpoint}",
            "NEVE_BROKER_ZONE": ZONES[0],
            "NEVE_COMPACTOR_CATALOG_URL": self.catalog_url or "",
            "NEVE_COMPACTOR_WAREHOUSE": f"s3://{BUCKET}/{ROOT}/warehouse",
            "NEVE_COMPACTOR_S3_ENDPOINT": self.s3.endpoint,
            **COMPACTOR_DEFAULTS,
        }

    @staticmethod
    def _start_all(starts: list) -> None:
        errors: list[BaseException] = []
        threads = [threading.Thread(target=_collect(errors, start)) for start in starts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]

    def _add_server_nodes(self) -> None:
        assert self.etcd is not None and self.s3 is not None and self.postgres is not None
        for i, member in enumerate(self.etcd.members):

            def start_member(member=member) -> None:
                member.spawn()  # the same ports and data: a restart, never start_on_free_ports' new ports
                member.wait_ready()

            self.nodes[f"etcd{i}"] = Node(f"etcd{i}", "etcd", member.host, lambda m=member: m.process, start_member, member.stop, self._netns_of(f"etcd{i}"))
        s3 = self.s3

        def start_s3() -> None:
            remove_weed_sockets(s3.ports)  # a killed weed leaves its sockets behind, and would not start over them
            s3._start()

        self.nodes["s3"] = Node("s3", "s3", s3.host, lambda: s3.process, start_s3, s3.stop, self._netns_of("s3"))
        pg = self.postgres
        self.nodes["postgres"] = Node("postgres", "postgres", pg.host, lambda: pg.process, pg._start, pg.stop, self._netns_of("postgres"))

    def _add_neve_node(self, name: str, kind: str, node: NeveNode) -> None:
        def start() -> None:
            node.kill9()
            node.start()

        def stop() -> None:
            try:
                node.stop()
            except Exception:
                node.kill9()

        self.nodes[name] = Node(name, kind, node.host, lambda: node.process, start, stop, self._netns_of(name))

    def _netns_of(self, name: str) -> str | None:
        return self.network.endpoints[name].netns if self.network else None

    # -- serving ----------------------------------------------------------------------------------------

    def brokers_listed_by(self, broker: NeveNode) -> set[int]:
        """The node ids `broker` itself lists in its Metadata answer (a raw connection to it alone)."""
        from tests.raw import Raw, metadata_v12

        class _Raw(Raw):
            def __init__(self, host: str, port: int) -> None:
                self.sock = socket.create_connection((host, port), timeout=10)
                self.correlation_id = 100

        raw = _Raw(broker.host, broker.port)
        try:
            cid = raw.request(metadata_v12(), client_id="chaos-cluster")
            return {b.node_id for b in raw.response(3, 12, cid).brokers}
        finally:
            raw.close()

    def wait_formed(self, timeout: float = FORMED_TIMEOUT_S) -> None:
        """Until every broker lists every broker: each learns of the others through etcd's watch."""
        want = set(range(len(self.brokers)))
        deadline = time.monotonic() + timeout
        for broker in self.brokers:
            while True:
                try:
                    seen = self.brokers_listed_by(broker)
                except Exception as e:  # not yet listening again, or still cut off
                    seen = {f"unreachable: {e}"}
                if seen == want:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{broker.bootstrap} lists brokers {sorted(map(str, seen))} after {timeout:.0f}s, not {sorted(want)}")
                time.sleep(0.2)

    def catalog_config(self):
        """The compactor's catalog as pyiceberg reads it from the harness (PostgreSQL, warehouse on S3 direct)."""
        from compactor.config import CompactorConfig
        from tests.fixtures import S3_KEY, S3_SECRET

        assert self.s3 is not None and self.catalog_url is not None
        return CompactorConfig(catalog_url=self.catalog_url, warehouse=f"s3://{BUCKET}/{ROOT}/warehouse", s3_endpoint=self.s3.endpoint, s3_access_key_id=S3_KEY, s3_secret_access_key=S3_SECRET)

    # -- heal and stop ----------------------------------------------------------------------------------

    def clear_links(self, reset: bool = False) -> None:
        """Every proxy healthy again; with `reset`, the connections that lived through a fault end with an RST (after
        a long blackhole the other side's TCP has given up on them)."""
        for proxy in self.links.values():
            if reset and proxy.faults.blackhole:
                proxy.set(reset=True)
            else:
                proxy.clear()

    def heal(self, timeout: float = HEAL_TIMEOUT_S) -> float:
        """Clear every fault (routes, links, proxies), resume every paused process, start every dead one, and wait
        until the cluster serves: every etcd member healthy, S3 answering, every broker listing every broker.
        Returns the seconds it took."""
        began = time.monotonic()
        with self._heal_lock:
            if self.network is not None:
                self.network.heal()
            self.clear_links(reset=True)
            for node in self.nodes.values():
                node.resume()
            # servers first: a broker started before etcd answers waits for it anyway, but its start's deadline runs
            order = sorted(self.nodes.values(), key=lambda n: ("etcd", "s3", "postgres", "broker", "compactor").index(n.kind))
            for kind in ("etcd", "s3", "postgres", "broker", "compactor"):
                dead = [n for n in order if n.kind == kind and not n.alive()]
                if dead:
                    log.info("heal: starting %s again", ", ".join(n.name for n in dead))
                    self._start_all([n.start for n in dead])
            assert self.etcd is not None and self.s3 is not None
            deadline = began + timeout
            for member in self.etcd.members:
                wait_ready(member.health_url, member.process, member.log_path, max(1.0, deadline - time.monotonic()))
            wait_bucket(self.s3.endpoint, BUCKET, self.s3.env, self.s3.process, self.s3.log_path, max(1.0, deadline - time.monotonic()))
            self.wait_formed(max(1.0, deadline - time.monotonic()))
        return time.monotonic() - began

    def stop(self) -> None:
        """Stop every process (compactors, brokers, then the servers), every proxy, and remove the network: always,
        whatever state start() reached, each step on its own so that one failure leaves the rest done."""
        for node in self.nodes.values():
            with contextlib.suppress(Exception):
                node.resume()  # a stopped process would not see SIGTERM until continued
        for group in (self.compactors, self.brokers):  # each group side by side: a broker's shutdown takes seconds

            def stop_one(n: NeveNode) -> None:
                try:
                    n.stop()
                except Exception:
                    n.kill9()

            threads = [threading.Thread(target=stop_one, args=(n,)) for n in group]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        for proxy in self.links.values():
            with contextlib.suppress(Exception):
                proxy.stop()
        for server in (self.postgres, self.s3, self.etcd):
            if server is not None:
                with contextlib.suppress(Exception):
                    server.stop()
        if self.postgres is not None:
            with contextlib.suppress(Exception):
                self.postgres.remove_data()
        if self.network is not None:
            self.network.remove()

    def describe(self) -> dict:
        """For the run's report: where everything is and which process it is now."""
        out: dict[str, Any] = {
            "run": self.run, "netns": self.netns, "bootstrap": self.bootstrap,
            "etcd": self.etcd.endpoints if self.etcd else [], "s3": self.s3.endpoint if self.s3 else None, "catalog": self.catalog_url,
            "nodes": {name: n.describe() for name, n in self.nodes.items()},
            "links": {f"{a}->{b}": f"{p.address[0]}:{p.address[1]}" for (a, b), p in self.links.items()},
        }  # fmt: skip
        if self.network is not None:
            out["network"] = self.network.describe()
        return out


def _collect(errors: list[BaseException], fn):
    def run() -> None:
        try:
            fn()
        except BaseException as e:
            errors.append(e)

    return run
