"""One chaos run, start to verdict: the cluster up, the workloads' clients and the nemesis for the
run's time, a heal, the final reads of every partition and every table, then the checker over the
history and the report. Everything the run made is under its own directory."""

from __future__ import annotations

import datetime
import json
import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from bench.progress import Progress

from . import history, report
from .checker import Result, check

DEFAULT_RESULTS = Path(__file__).resolve().parent.parent / "chaos-results"
PROGRESS_EVERY_S = 5.0
QUIET_AFTER_HEAL_S = 5.0  # clients keep running on the healed cluster before they stop: what the faults left pending completes
FINAL_READ_TIMEOUT_S = 120.0
TABLE_READ_TIMEOUT_S = 120.0


@dataclass
class RunOptions:
    workloads: list[str]
    nemesis: str
    time_s: float
    plant: str | None = None
    seed: int = field(default_factory=lambda: random.randrange(1 << 31))
    results_dir: Path = DEFAULT_RESULTS
    netns: bool | None = None  # None: namespaces when root
    scale: float = 1.0


@dataclass
class RunOutcome:
    out_dir: Path
    result: Result
    report_path: Path

    @property
    def anomalies(self) -> int:
        return self.result.count


def run(options: RunOptions, progress: Progress | None = None) -> RunOutcome:
    from .cluster import ChaosCluster
    from .nemesis import Nemesis
    from .plants import PLANTS
    from .workloads import WORKLOADS

    plant = PLANTS[options.plant] if options.plant else None
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    name = f"{stamp}-{'+'.join(options.workloads)}-{options.nemesis}" + (f"-{plant.name}" if plant else "")
    out_dir = options.results_dir / name
    out_dir.mkdir(parents=True, exist_ok=True)
    progress = progress or Progress(name)
    rng = random.Random(options.seed)
    run_id = uuid.UUID(int=rng.getrandbits(128)).hex[:8]
    cluster = ChaosCluster(out_dir / "cluster", netns=options.netns, broker_env=plant.broker_env if plant else {}, compactor_env=plant.compactor_env if plant else {})
    recorder: history.Recorder | None = None
    about = {"workloads": options.workloads, "nemesis": options.nemesis, "plant": options.plant, "seed": options.seed, "time_s": options.time_s, "run_id": run_id}
    workloads = []
    timings: dict[str, float] = {}
    try:
        progress.begin("cluster")
        began = time.monotonic()
        cluster.start()
        timings["cluster_start_s"] = round(time.monotonic() - began, 1)
        described = cluster.describe()
        (out_dir / "cluster.json").write_text(json.dumps(described, indent=1, default=str))
        about["cluster"] = f"{described.get('bootstrap')}, {'network namespaces' if described.get('netns') else 'loopback, process faults only'} (cluster.json)"
        progress.line(f"cluster up in {timings['cluster_start_s']}s: {cluster.bootstrap}")
        # the history's clock starts once the cluster is up: time 0 is the workloads' start
        recorder = cluster.recorder = history.Recorder(out_dir / "history.jsonl")

        progress.begin("workload")
        workloads = [WORKLOADS[w](run_id, rng, recorder, scale=options.scale) for w in options.workloads]
        for workload in workloads:
            workload.setup(cluster.bootstrap)
        for workload in workloads:
            workload.start(cluster.bootstrap)
        nemesis = Nemesis(cluster, recorder, options.nemesis, random.Random(rng.getrandbits(64)))
        until = time.monotonic() + options.time_s
        faults = threading.Thread(target=nemesis.run, args=(until,), name="nemesis", daemon=True)
        faults.start()
        while time.monotonic() < until:
            time.sleep(min(PROGRESS_EVERY_S, max(0.0, until - time.monotonic())))
            progress.line(_counts(recorder))
        faults.join(timeout=120)

        progress.begin("heal")
        began = time.monotonic()
        nemesis.heal()
        cluster.heal()
        timings["heal_s"] = round(time.monotonic() - began, 1)
        recorder.fault("heal", "start", "every fault cleared, every process running")
        time.sleep(QUIET_AFTER_HEAL_S)
        for workload in workloads:
            workload.stop()
        recorder.fault("heal", "stop", None)
        progress.line(f"healed in {timings['heal_s']}s; clients stopped: {_counts(recorder)}")

        progress.begin("final reads")
        for workload in workloads:
            workload.final_reads(cluster.bootstrap, FINAL_READ_TIMEOUT_S)
        from compactor.catalog import load_catalog

        catalog = load_catalog(cluster.catalog_config())
        progress.begin("table reads")
        for workload in workloads:
            workload.table_reads(catalog, TABLE_READ_TIMEOUT_S)
    except BaseException as e:
        if recorder is not None:
            recorder.record(history.NEMESIS, history.INFO, "harness-error", f"{type(e).__name__}: {e}")
        raise
    finally:
        for workload in workloads:
            try:
                workload.stop()
            except Exception as e:  # stopping is best effort: the cluster must still come down
                progress.line(f"stopping {workload.name}: {e}")
        if recorder is not None:
            recorder.close()
        progress.begin("stop")
        cluster.stop()
    progress.begin("check")
    ops = history.read(out_dir / "history.jsonl")
    # Kafka's transactions order writes by offset, not by commit: two transactions writing the same
    # partitions interleave, a write cycle (G0) Kafka allows (Jepsen's --no-ww-deps; Redpanda's
    # analysis). The verdict infers cycles from write-read edges only; write cycles are counted apart.
    result = check(ops, ww_deps=False)
    about["write cycles (G0, allowed by Kafka)"] = len(check(ops, ww_deps=True).anomalies.get("G0", []))
    about.update(timings)
    path = report.write(out_dir, ops, result, about)
    progress.end()
    progress.line(f"report {path}")
    return RunOutcome(out_dir, result, path)


def _counts(recorder: history.Recorder) -> str:
    by_f: dict[str, dict[str, int]] = {}
    for (f, type_), n in sorted(recorder.counts.items()):
        if type_ != history.INVOKE:
            by_f.setdefault(f, {})[type_] = n
    return "; ".join(f"{f} " + "/".join(f"{n} {t}" for t, n in outcomes.items()) for f, outcomes in by_f.items() if f in ("send", "poll", "txn", "commit", "offsets")) or "no ops yet"
