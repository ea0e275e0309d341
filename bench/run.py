"""The state of one scenario run, handed to the scenario: the system under test (started on first
use), the step and baseline records gathered so far, targets, notes, and the latency samples the
plots need. `result()` is the JSON document the run writes."""

from __future__ import annotations

import argparse
import datetime
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import procstat
from .ceiling import etcd_txn_baseline, put_ceiling
from .load import Load, run_load
from .profile import hot_frames
from .progress import Progress
from .servers import Servers
from .systems import NULL_STORE, SYSTEMS, System

RESULT_KEYS = ("scenario", "quick", "started_at", "finished_at", "elapsed_s", "command", "machine", "system", "options", "steps", "baselines", "targets", "derived", "notes", "ok")
TARGET_KEYS = ("name", "target", "measured", "met")


@dataclass
class Timing:
    warmup_s: float
    duration_s: float


@dataclass
class Run:
    scenario: str
    args: argparse.Namespace
    argv: list[str]
    out_dir: Path
    work_dir: Path
    progress: Progress
    servers: Servers
    system: System | None = None
    peer: System | None = None  # --peer, measured in the same run on the same servers
    sink: System | None = None  # the system again, over the null object store (a baseline)
    steps: list[dict] = field(default_factory=list)
    baselines: list[dict] = field(default_factory=list)
    targets: list[dict] = field(default_factory=list)
    derived: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    ack_samples: dict[str, np.ndarray] = field(default_factory=dict)
    e2e_samples: dict[str, np.ndarray] = field(default_factory=dict)
    failure: str | None = None
    started_at: datetime.datetime = field(default_factory=lambda: datetime.datetime.now(datetime.UTC))
    _t0: float = field(default_factory=time.monotonic)
    _machine: dict = field(default_factory=procstat.machine)  # taken before any load of ours

    @property
    def quick(self) -> bool:
        return bool(self.args.quick)

    def timing(self, full: tuple[float, float], quick: tuple[float, float]) -> Timing:
        """Warm-up and window of a load step: the scenario's defaults, unless --warmup/--duration."""
        warmup, duration = quick if self.quick else full
        if self.args.warmup is not None:
            warmup = self.args.warmup
        if self.args.duration is not None:
            duration = self.args.duration
        return Timing(warmup, duration)

    def _broker_env(self) -> dict[str, str]:
        env = dict(self.args.broker_env)
        if self.args.linger_ms is not None:
            env["NEVE_WAL_LINGER_MS"] = str(self.args.linger_ms)
        if self.args.flush_bytes is not None:
            env["NEVE_WAL_FLUSH_BYTES"] = str(self.args.flush_bytes)
        return env

    def make_system(self) -> System:
        """The system under test, built but not started (a baseline may need only its store)."""
        if self.system is None:
            self.system = SYSTEMS[self.args.system](self.work_dir / "system", self.out_dir / "broker.log", self._broker_env(), self.servers)
        return self.system

    def make_peer(self) -> System | None:
        """The --peer system (tansu), built but not started; None without --peer."""
        if self.peer is None and getattr(self.args, "peer", None):
            self.peer = SYSTEMS[self.args.peer](self.work_dir / "peer", self.out_dir / f"{self.args.peer}.log", {}, self.servers)
        return self.peer

    def make_sink(self) -> System | None:
        """The system under test again, with its WAL going to the null object store: the broker
        path runs whole but storing costs nothing. None for a system that is not neve."""
        if self.sink is None and self.make_system().neve:
            env = {**self._broker_env(), "NEVE_WAL_OBJECT_STORE": NULL_STORE}
            self.sink = SYSTEMS[self.args.system](self.work_dir / "sink", self.out_dir / "broker-sink.log", env, self.servers)
        return self.sink

    def start_system(self, system: System | None = None) -> System:
        system = system or self.make_system()
        if not system.started:
            self.progress.line(f"starting {system.name}" + (" over the null object store" if system is self.sink else ""))
            system.start()
            self.progress.line(f"{system.name} up at {system.bootstrap}")
        return system

    def stop_system(self, system: System | None) -> None:
        if system is not None and system.running:
            self.progress.line(f"stopping {system.name}" + (" (null store)" if system is self.sink else ""))
            system.stop()

    def stop_all(self) -> None:
        for system in (self.system, self.peer, self.sink):
            self.stop_system(system)
        if self.servers.started:
            self.progress.line(f"stopping {', '.join(self.servers.started)}")
            self.servers.stop()

    def load(self, load: Load, system: System | None = None) -> dict:
        """One load step against `system` (default: the system under test), started if need be."""
        system = self.start_system(system)
        load.producer_config = {**dict(self.args.producer_config), **load.producer_config}
        if self.quick:
            # A smoke run keeps the suite working, it measures nothing: a 4 MiB client queue holds
            # its saturation steps to tens of MB/s, so it does not flood the disk and cores that the
            # test suite's other tests share (at full speed the C producer wrote 400 MB/s through
            # neve dev, and other tests' object-store writes stalled past their 10 s timeout).
            load.producer_config.setdefault("queue.buffering.max.kbytes", 4096)
        load.consumer_config = {**dict(self.args.consumer_config), **load.consumer_config}
        load.client = self.args.client
        if self.args.profile and system.neve:  # py-spy reads Python stacks: not the peer's
            load.profile_path = self.out_dir / ("profile-" + load.name.replace("/", "-") + (".txt" if self.args.profile == "raw" else ".svg"))
        self.progress.begin(load.name)
        outcome = run_load(system, load, self.progress)
        r = outcome.record
        self.steps.append(r)
        self.ack_samples[load.name] = outcome.ack_latencies
        if outcome.e2e_latencies.size:
            self.e2e_samples[load.name] = outcome.e2e_latencies
        lat = r["ack_latency_ms"]
        summary = ""
        if r["producers"]:
            summary = f"{r['records_per_s']:,.0f} rec/s  {r['mb_per_s']:.2f} MB/s  ack p50 {lat['p50']} p99 {lat['p99']} ms  broker {r['broker_cpu_s_per_gib_produced']} cpu-s/GiB"
        if r["consumers"]:
            summary += f"  consumed {r['consume_mb_per_s']:.2f} MB/s  broker {r['broker_cpu_s_per_gib_consumed']} cpu-s/GiB consumed"
        if r["e2e_latency_ms"] is not None and r["e2e_latency_ms"]["count"]:
            summary += f"  e2e p50 {r['e2e_latency_ms']['p50']} p99 {r['e2e_latency_ms']['p99']} ms"
        self.progress.line(summary.strip())
        if load.profile_path is not None and load.profile_path.suffix == ".txt" and load.profile_path.exists():
            self.derived.setdefault("profiles", {})[load.name] = hot_frames(load.profile_path)
        for error in r["errors"]:
            self.progress.line(f"ERROR {error}")
        return r

    def ceiling(self, name: str, object_bytes: int, concurrency: int, timing: Timing, system: System | None = None) -> dict:
        record = put_ceiling(system or self.make_system(), name, object_bytes, concurrency, timing.warmup_s, timing.duration_s, self.progress)
        self.baselines.append(record)
        return record

    def etcd_txn(self, name: str, partitions: int, timing: Timing) -> dict | None:
        """The raw etcd transaction latency, shaped like one sequencer commit; None without etcd."""
        endpoint = getattr(self.make_system(), "etcd_endpoint", None)
        if endpoint is None:
            return None
        record = etcd_txn_baseline(endpoint(), name, partitions, timing.warmup_s, timing.duration_s, self.progress)
        self.baselines.append(record)
        return record

    def target(self, name: str, target: str, measured, met: bool | None) -> None:
        """An issue's target (5, 21) and whether this run met it (None: could not be judged)."""
        self.targets.append(dict(zip(TARGET_KEYS, (name, target, measured, met), strict=True)))

    def fail(self, reason: str) -> None:
        self.failure = reason
        self.notes.append(reason)

    def ok(self) -> bool:
        if self.failure is not None:
            return False
        for s in self.steps:
            if s["errors"] or s["failed"] or s["unacknowledged"] or s["acked"] != s["produced"]:
                return False
            if s["consumers"] and (any(c != s["backlog_records"] + s["acked"] for c in s["consumed_per_consumer"]) or s["consumer_offset_anomalies"]):
                return False
        return not any(b["errors"] for b in self.baselines)

    def result(self) -> dict:
        system = self.system.describe() if self.system is not None else None
        if system is not None and self.peer is not None:
            system["peer"] = self.peer.describe()
        options = {k: v for k, v in sorted(vars(self.args).items()) if k not in ("func",)}
        finished = datetime.datetime.now(datetime.UTC)
        doc = {
            "scenario": self.scenario,
            "quick": self.quick,
            "started_at": self.started_at.isoformat(timespec="seconds"),
            "finished_at": finished.isoformat(timespec="seconds"),
            "elapsed_s": round(time.monotonic() - self._t0, 1),
            "command": " ".join(shlex.quote(a) for a in ["python", "-m", "bench", *self.argv]),
            "machine": self._machine,
            "system": system,
            "options": {k: _jsonable(k, v) for k, v in options.items()},
            "steps": self.steps,
            "baselines": self.baselines,
            "targets": self.targets,
            "derived": self.derived,
            "notes": self.notes,
            "ok": self.ok(),
        }
        assert tuple(doc) == RESULT_KEYS
        return doc


def _jsonable(key: str, value):
    if key.endswith("_config") or key == "broker_env":
        return dict(value)
    if isinstance(value, Path):
        return str(value)
    return value
