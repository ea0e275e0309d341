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
from .workloads.worker import WorkerProcess, count, merge

DEFAULT_RESULTS = Path(__file__).resolve().parent.parent / "chaos-results"
PROGRESS_EVERY_S = 5.0
QUIET_AFTER_HEAL_S = 5.0  # clients keep running on the healed cluster before they stop: what the faults left pending completes
FINAL_READ_TIMEOUT_S = 120.0
FINAL_READ_ATTEMPTS = 3  # workers for the final reads, should one crash
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
    workers: list[WorkerProcess] = []
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
        # the history's clock starts once the cluster is up: time 0 is the workloads' start; the
        # harness records the faults and the table reads, each workload's worker its clients' ops
        recorder = cluster.recorder = history.Recorder(out_dir / "history-harness.jsonl")

        progress.begin("workload")
        workers = [WorkerProcess(w, i, run_id, rng.getrandbits(31), options.scale, cluster.bootstrap, out_dir, recorder.start) for i, w in enumerate(options.workloads)]
        for worker in workers:
            worker.start("run")
        nemesis = Nemesis(cluster, recorder, options.nemesis, random.Random(rng.getrandbits(64)))
        until = time.monotonic() + options.time_s
        faults = threading.Thread(target=nemesis.run, args=(until,), name="nemesis", daemon=True)
        faults.start()
        progress_at, counts, offsets = time.monotonic() + PROGRESS_EVERY_S, {}, {}
        while time.monotonic() < until:
            time.sleep(min(1.0, max(0.0, until - time.monotonic())))
            _restart_crashed(workers, recorder, progress)
            if time.monotonic() >= progress_at:
                progress_at += PROGRESS_EVERY_S
                progress.line(_counts(workers, offsets, counts))
        faults.join(timeout=120)

        progress.begin("heal")
        began = time.monotonic()
        nemesis.heal()
        cluster.heal()
        timings["heal_s"] = round(time.monotonic() - began, 1)
        recorder.fault("heal", "start", "every fault cleared, every process running")
        time.sleep(QUIET_AFTER_HEAL_S)
        _restart_crashed(workers, recorder, progress)
        for worker in workers:
            worker.stop()
        recorder.fault("heal", "stop", None)
        progress.line(f"healed in {timings['heal_s']}s; clients stopped: {_counts(workers, offsets, counts)}")

        progress.begin("final reads")
        for worker in workers:
            for _ in range(FINAL_READ_ATTEMPTS):
                worker.start("final", FINAL_READ_TIMEOUT_S)
                code = worker.wait(FINAL_READ_TIMEOUT_S + 60)
                if code == 0:
                    break
                recorder.record(history.NEMESIS, history.INFO, "client-crash", {"workload": worker.workload, "mode": "final", "exit": code})
                progress.line(f"{worker.workload}: the final reads' worker ended with {code}; again")
        from compactor.catalog import load_catalog

        catalog = load_catalog(cluster.catalog_config())
        progress.begin("table reads")
        for worker in workers:
            workload = WORKLOADS[worker.workload](run_id, random.Random(0), recorder, scale=options.scale)
            workload.last_offsets = _last_offsets(worker.files[-1])
            workload.table_reads(catalog, TABLE_READ_TIMEOUT_S)
    except BaseException as e:
        if recorder is not None:
            recorder.record(history.NEMESIS, history.INFO, "harness-error", f"{type(e).__name__}: {e}")
        raise
    finally:
        for worker in workers:
            try:
                worker.stop()
            except Exception as e:  # stopping is best effort: the cluster must still come down
                progress.line(f"stopping {worker.workload}'s worker: {e}")
        if recorder is not None:
            recorder.close()
        progress.begin("stop")
        cluster.stop()
    progress.begin("check")
    ops = merge([recorder.path, *(path for worker in workers for path in worker.files)], out_dir / "history.jsonl")
    # Kafka's transactions order writes by offset, not by commit: two transactions writing the same
    # partitions interleave, a write cycle (G0) Kafka allows (Jepsen's --no-ww-deps; Redpanda's
    # analysis). The verdict infers cycles from write-read edges only; write cycles are counted apart.
    result = check(ops, ww_deps=False)
    about["write cycles (G0, allowed by Kafka)"] = len(check(ops, ww_deps=True).anomalies.get("G0", []))
    about["client crashes"] = sum(1 for op in ops if op["f"] == "client-crash")
    about.update(timings)
    path = report.write(out_dir, ops, result, about)
    progress.end()
    progress.line(f"report {path}")
    return RunOutcome(out_dir, result, path)


def _restart_crashed(workers: list[WorkerProcess], recorder: history.Recorder, progress: Progress) -> None:
    """A worker that ended by itself crashed (librdkafka can take its process down): noted in the
    history, started again on a new id range; what it left open stays open (info)."""
    for worker in workers:
        code = worker.crashed()
        if code is not None:
            recorder.record(history.NEMESIS, history.INFO, "client-crash", {"workload": worker.workload, "mode": "run", "exit": code})
            progress.line(f"{worker.workload}: its clients' process ended with {code}; started again")
            worker.start("run")


def _last_offsets(path: Path) -> dict[str, int]:
    """The last offset of each partition in a worker's read_committed final read: what each table
    must reach."""
    last: dict[str, int] = {}
    for op in history.read(path) if path.exists() else ():
        if op["f"] == "final-read" and op["type"] == history.OK and (op.get("value") or {}).get("isolation") == "read_committed":
            last = {k: r[-1][0] for k, r in op["value"]["records"].items() if r}
    return last


def _counts(workers: list[WorkerProcess], offsets: dict, counts: dict[tuple[str, str], int]) -> str:
    count([path for worker in workers for path in worker.files], offsets, counts)
    by_f: dict[str, dict[str, int]] = {}
    for (f, type_), n in sorted(counts.items()):
        if type_ != history.INVOKE:
            by_f.setdefault(f, {})[type_] = n
    return "; ".join(f"{f} " + "/".join(f"{n} {t}" for t, n in outcomes.items()) for f, outcomes in by_f.items() if f in ("send", "poll", "txn", "commit", "offsets")) or "no ops yet"
