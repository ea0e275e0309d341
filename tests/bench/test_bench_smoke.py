"""Smoke runs of the benchmark suite (`python -m bench <scenario> --quick`), so it keeps working:
the result document has exactly the expected shape, throughput is positive, and every record the
producers handed to librdkafka was acknowledged (and, with consumers, read back exactly once).
The neve-s3 runs start their own etcd and SeaweedFS; the tansu peer runs on the same SeaweedFS."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

RESULT_KEYS = {"scenario", "quick", "started_at", "finished_at", "elapsed_s", "command", "machine", "system", "options", "steps", "baselines", "targets", "derived", "notes", "ok"}
MACHINE_KEYS = {"nproc", "cpu_model", "memory_gib", "kernel", "python", "confluent_kafka", "librdkafka", "neve_commit", "loadavg_at_start"}
STEP_KEYS = {
    "name", "system", "topic", "partitions", "record_bytes", "producers", "consumers", "mode", "offered_records_per_s", "warmup_s", "window_s",
    "produced", "acked", "failed", "unacknowledged", "transactions", "records_per_s", "mb_per_s", "ack_latency_ms", "backlog_records", "consumed_per_consumer",
    "consumer_offset_anomalies", "consume_mb_per_s", "e2e_latency_ms", "broker_cpu_s", "broker_cpu_s_per_gib_produced",
    "broker_cpu_s_per_gib_consumed", "client_cpu_s", "servers_cpu_s", "machine_busy_cores", "slow_wal_puts", "slow_wal_commits", "hedged_wal_puts", "produce_requests", "objects_put",
    "object_bytes_put", "mean_object_bytes", "store_puts", "store_gets",
    "step_objects_put", "step_store_puts", "step_hedged_wal_puts", "puts_per_gib",
    "stored_bytes_per_gib", "ratio_to_put_ceiling", "errors", "timeline",
}  # fmt: skip
LATENCY_KEYS = {"count", "mean", "p50", "p99", "p999", "max"}
CEILING_KEYS = {"name", "backend", "object_bytes", "concurrency", "window_s", "puts", "puts_per_s", "mb_per_s", "put_latency_ms", "machine_busy_cores", "servers_cpu_s", "errors"}
ETCD_TXN_KEYS = {"name", "backend", "partitions", "ops_per_txn", "window_s", "txns", "txns_per_s", "txn_latency_ms", "errors"}
TARGET_KEYS = {"name", "target", "measured", "met"}


def run_bench(tmp_path: Path, *args: str) -> tuple[dict, Path]:
    proc = subprocess.run(
        [sys.executable, "-m", "bench", *args, "--quick", "--results-dir", str(tmp_path), "--work-dir", str(tmp_path / "work")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, f"bench {args} exited {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-6000:]}"
    out = Path(next(line.split(": ", 1)[1] for line in proc.stdout.splitlines() if line.startswith("results: ")))
    assert out.parent == tmp_path
    assert "measure" in proc.stderr  # the per-second progress lines
    return json.loads((out / "result.json").read_text()), out


def check_document(doc: dict, scenario: str) -> None:
    assert set(doc) == RESULT_KEYS
    assert set(doc["machine"]) == MACHINE_KEYS
    assert doc["scenario"] == scenario and doc["quick"] is True and doc["ok"] is True
    assert doc["steps"], "no load step ran"
    for target in doc["targets"]:
        assert set(target) == TARGET_KEYS


def check_step(step: dict, stores: bool = True) -> None:
    """`stores`: the step's system keeps what it is sent (not the null-store sink)."""
    assert set(step) == STEP_KEYS
    assert set(step["ack_latency_ms"]) == LATENCY_KEYS
    assert step["errors"] == []
    assert step["produced"] > 0
    assert step["acked"] == step["produced"], "every produced record must be acknowledged"
    assert step["failed"] == 0 and step["unacknowledged"] == 0
    assert step["records_per_s"] > 0 and step["mb_per_s"] > 0
    assert step["ack_latency_ms"]["count"] > 0 and 0 < step["ack_latency_ms"]["p50"] <= step["ack_latency_ms"]["p99"] <= step["ack_latency_ms"]["max"]
    assert step["broker_cpu_s"] is not None and step["broker_cpu_s"] > 0
    if stores:
        assert step["objects_put"] > 0 and step["object_bytes_put"] > 0
    else:
        assert step["objects_put"] is None and step["puts_per_gib"] is None
    # Produce requests the broker counted in the window: neve's counter, none from the peer
    requests = step["produce_requests"]
    assert requests > 0 if step["system"].startswith("neve") else requests is None


def is_sink(step: dict) -> bool:
    return step["name"].startswith("sink/")


def check_put_ceilings(doc: dict) -> None:
    ceilings = [b for b in doc["baselines"] if "object_bytes" in b]
    assert ceilings
    for base in ceilings:
        assert set(base) == CEILING_KEYS and base["puts"] > 0 and base["mb_per_s"] > 0 and base["errors"] == []


def test_produce_quick(tmp_path):
    doc, out = run_bench(tmp_path, "produce")
    check_document(doc, "produce")
    steps = [s for s in doc["steps"] if not is_sink(s)]
    assert {s["record_bytes"] for s in steps} == {100, 1024, 65536}
    assert {s["mode"] for s in steps} == {"saturation", "fixed-rate"}
    for step in doc["steps"]:
        check_step(step, stores=not is_sink(step))
        assert step["system"] == "neve-dev"
        assert step["consumers"] == 0 and step["e2e_latency_ms"] is None
        assert step["store_puts"] is None  # local files count no requests
    for step in (s for s in steps if s["mode"] == "saturation"):
        assert step["ratio_to_put_ceiling"] is not None and step["ratio_to_put_ceiling"] > 0
    # the sink baseline: one saturation step per size against the null object store, as a ratio
    assert sorted(s["record_bytes"] for s in doc["steps"] if is_sink(s)) == [100, 1024, 65536]
    assert set(doc["derived"]["ratio_to_sink"]) == {"100B-saturation", "1KiB-saturation", "64KiB-saturation"}
    assert all(v > 0 for v in doc["derived"]["ratio_to_sink"].values())
    check_put_ceilings(doc)
    # neve's ceiling is measured before the steps too (at its flush size), and each step is a ratio of both
    assert [b["object_bytes"] for b in doc["baselines"] if b["name"].startswith("put-ceiling-before-")] == [4 * 2**20]
    assert set(doc["derived"]["ratio_to_put_ceiling_before"]) == {"100B-saturation", "1KiB-saturation", "64KiB-saturation"}
    assert not any("txn_latency_ms" in b for b in doc["baselines"])  # no etcd in neve-dev
    assert (out / "results.md").read_text().startswith("# bench: produce")
    assert (out / "latency_cdf.png").stat().st_size > 0


def test_produce_quick_neve_s3_against_tansu(tmp_path):
    """neve over etcd + SeaweedFS, then tansu on the same SeaweedFS, then neve's sink; ceilings on
    the same S3 and the raw etcd transaction as baselines."""
    doc, out = run_bench(tmp_path, "produce", "--system", "neve-s3", "--peer", "tansu", "--sizes", "1KiB")
    check_document(doc, "produce")
    assert doc["system"]["name"] == "neve-s3" and doc["system"]["metadata"].startswith("etcd://")
    assert doc["system"]["object_store"].startswith("s3://neve/") and doc["system"]["peer"]["name"] == "tansu"
    by_name = {s["name"]: s for s in doc["steps"]}
    assert set(by_name) == {"1KiB-saturation", "1KiB-fixed", "tansu/1KiB-saturation", "tansu/1KiB-fixed", "sink/1KiB-saturation"}
    for step in doc["steps"]:
        check_step(step, stores=not is_sink(step))
        if not is_sink(step):
            assert step["store_puts"] > 0  # SeaweedFS's own request counters for the system's bucket
        assert set(step["servers_cpu_s"]) == {"etcd", "seaweedfs"}
        assert step["servers_cpu_s"]["seaweedfs"] > 0 or is_sink(step)  # the sink stores nothing
        # /proc/stat counts in clock ticks (1/100 s), so a short window may read a little over
        assert 0 < step["machine_busy_cores"] <= os.cpu_count() + 0.1
        # neve's own histograms say how many PUTs and commits were slow; tansu exposes none
        slow = (step["slow_wal_puts"], step["slow_wal_commits"], step["hedged_wal_puts"])
        assert all(isinstance(n, int) and n >= 0 for n in slow) if step["system"] == "neve-s3" else slow == (None, None, None)
        if step["system"] == "neve-s3" and not is_sink(step):
            # over the whole step no upload crosses an edge: one PUT per object, a hedged one apart
            objects, puts, hedged = step["step_objects_put"], step["step_store_puts"], step["step_hedged_wal_puts"]
            assert objects > 0 and objects <= puts <= objects + hedged, (objects, puts, hedged)
    assert {by_name[n]["system"] for n in ("1KiB-saturation", "1KiB-fixed", "sink/1KiB-saturation")} == {"neve-s3"}
    assert {by_name[n]["system"] for n in ("tansu/1KiB-saturation", "tansu/1KiB-fixed")} == {"tansu"}
    assert by_name["tansu/1KiB-saturation"]["ratio_to_put_ceiling"] > 0
    check_put_ceilings(doc)
    assert all(b["backend"] == "S3ObjectStore" for b in doc["baselines"] if "object_bytes" in b)
    [txn] = [b for b in doc["baselines"] if "txn_latency_ms" in b]
    assert set(txn) == ETCD_TXN_KEYS and txn["txns"] > 0 and txn["errors"] == [] and txn["txn_latency_ms"]["p99"] > 0
    names = {t["name"]: t for t in doc["targets"]}
    assert names["1KiB-saturation: throughput vs tansu"]["measured"] > 0
    assert "etcd txn p99" in names["1KiB-fixed: ack p99 (ms)"]["target"]
    assert doc["derived"]["ratio_to_peer"]["1KiB"]["mb_per_s"] > 0
    assert "neve against tansu" in (out / "results.md").read_text()


def test_cost_quick_neve_s3(tmp_path):
    doc, _ = run_bench(tmp_path, "cost", "--system", "neve-s3")
    check_document(doc, "cost")
    [step] = doc["steps"]
    check_step(step)
    assert step["consumed_per_consumer"] == [step["acked"]]
    per = doc["derived"]["per_gib"]
    assert per["puts_counted_in_store"] > 0 and per["puts_from_broker_metrics"] > 0
    assert per["metadata_ops"] > 0  # neve_metadata_ops_total from the etcd store
    assert per["gets"] is not None
    # etcd keeps one wal-index record per object (its 10 partitions fit one commit transaction), not
    # a key per partition per object; and the topic, heads and brokers, a few keys in all
    puts = per["puts_counted_in_store"]
    assert puts * 0.9 <= per["metadata_keys"] < puts * 5 and per["metadata_bytes"] > per["metadata_keys"] * 100
    assert doc["derived"]["etcd_default_quota"]["gib_produced"] > 0


def test_cost_quick_with_a_standin_compactor(tmp_path):
    """--compact-every: the index is kept short by the real range replace while the load runs, and
    etcd is sampled each cycle: the wal-index records and entries stay a few per partition."""
    doc, _ = run_bench(tmp_path, "cost", "--system", "neve-s3", "--compact-every", "0.3")
    check_document(doc, "cost")
    over = doc["derived"]["metadata_over_time"]
    assert len(over["samples"]) >= 3 and over["entries_replaced"] > 0 and over["replaces_lost"] == 0
    last = over["samples"][-1]
    assert last["gib_produced"] > 0 and last["index_entries"] <= 10 * 8 and last["wal_index_records"] <= 10 * 8
    assert "etcd_default_quota" not in doc["derived"]


def test_e2e_quick(tmp_path):
    doc, out = run_bench(tmp_path, "e2e")
    check_document(doc, "e2e")
    [step] = doc["steps"]
    check_step(step)
    assert step["consumers"] == 1
    assert step["consumed_per_consumer"] == [step["acked"]], "the tailing consumer must read every acknowledged record once"
    assert step["consumer_offset_anomalies"] == 0
    assert set(step["e2e_latency_ms"]) == LATENCY_KEYS and step["e2e_latency_ms"]["count"] > 0 and step["e2e_latency_ms"]["p50"] > 0
    assert (out / "latency_cdf.png").stat().st_size > 0
    assert "producers: librdkafka driven from C" in (out / "results.md").read_text()  # the default; its stamps gave the e2e latencies


def test_transactions_quick(tmp_path):
    """An idempotent producer, then a transactional one committing every 100 ms, both from Python;
    every record acknowledged, the transactional step's transactions counted, the ratio judged."""
    doc, out = run_bench(tmp_path, "transactions", "--sizes", "1KiB")
    check_document(doc, "transactions")
    idempotent, transactional = doc["steps"]
    assert (idempotent["name"], transactional["name"]) == ("1KiB-idempotent", "1KiB-transactions-100ms")
    for step in doc["steps"]:
        check_step(step)
    assert idempotent["transactions"] == 0 and transactional["transactions"] > 0
    assert [t["name"] for t in doc["targets"]] == ["1KiB-transactions-100ms: throughput vs the idempotent producer", "1KiB-transactions-100ms: broker CPU-s per GiB vs the idempotent producer"]
    assert "producers: confluent-kafka from Python" in (out / "results.md").read_text()


def test_fanout_quick_consumers_in_groups(tmp_path):
    """Each consumer subscribes in a group of its own and reads every acknowledged record once;
    this run's producer is the Python one (`--client python`), every other smoke run's the C one."""
    doc, out = run_bench(tmp_path, "fanout", "--consumer-counts", "1,2", "--client", "python")
    check_document(doc, "fanout")
    assert [s["consumers"] for s in doc["steps"]] == [1, 2]
    for step in doc["steps"]:
        check_step(step)
        assert step["consumed_per_consumer"] == [step["acked"]] * step["consumers"]
        assert step["consumer_offset_anomalies"] == 0
    assert "consumer group of their own" in (out / "results.md").read_text()
    assert "producers: confluent-kafka from Python" in (out / "results.md").read_text()  # the Python producer path stays working


def test_partitions_quick_with_sink_keyless(tmp_path):
    """Keyless records (librdkafka's sticky partitioner) at 10 and 100 partitions, and the sink."""
    doc, out = run_bench(tmp_path, "partitions", "--sink", "--keyless")
    check_document(doc, "partitions")
    assert [(s["name"], s["partitions"]) for s in doc["steps"]] == [("p10", 10), ("p100", 100), ("sink/p10", 10), ("sink/p100", 100)]
    for step in doc["steps"]:
        check_step(step, stores=not is_sink(step))
    assert doc["derived"]["scaling"]["10"] == 1.0 and doc["derived"]["scaling"]["100"] > 0
    scaling = doc["derived"]["tables"]["Scaling against the 10-partition step"]
    cores = [dict(zip(scaling["headers"], row, strict=True)) for row in scaling["rows"]]
    assert [c["partitions"] for c in cores] == ["10", "100"]
    assert all(float(c["broker cores"]) > 0 and float(c["client cores"]) > 0 for c in cores)  # what each process used, to see which one sets the rate
    # the broker's own request counter: keyless batches carry many records per request
    assert all(float(c["Produce requests/s"].replace(",", "")) > 0 and float(c["records per request"]) > 1 and float(c["broker µs per request"]) > 0 for c in cores)
    assert set(doc["derived"]["ratio_to_sink"]) == {"10", "100"} and all(v > 0 for v in doc["derived"]["ratio_to_sink"].values())
    assert (out / "throughput_vs_partitions.png").stat().st_size > 0
    assert "sticky partitioner" in (out / "results.md").read_text()


def test_catchup_quick_neve_s3(tmp_path):
    """A backlog on SeaweedFS read from offset 0 while a producer keeps going: the consumer reads
    the backlog and the new records exactly once."""
    doc, out = run_bench(tmp_path, "catchup", "--system", "neve-s3")
    check_document(doc, "catchup")
    backlog, tail, step = doc["steps"]
    assert [s["name"] for s in doc["steps"]] == ["backlog", "tail", "catchup"]
    for s in doc["steps"]:
        check_step(s)
    assert step["topic"] == backlog["topic"] != tail["topic"]
    assert step["backlog_records"] == backlog["acked"] > 0
    assert step["consumed_per_consumer"] == [backlog["acked"] + step["acked"]]
    assert step["consumer_offset_anomalies"] == 0
    figures = doc["derived"]["catchup"]
    assert figures["backlog_records"] == backlog["acked"] and figures["read_mb_per_s"] > 0
    assert "Catching up" in (out / "results.md").read_text()
