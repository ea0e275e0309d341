"""Smoke runs of the benchmark suite (`python -m bench <scenario> --quick`), so it keeps working:
the result document has exactly the expected shape, throughput is positive, and every record the
producers handed to librdkafka was acknowledged (and, with consumers, read back exactly once)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

RESULT_KEYS = {"scenario", "quick", "started_at", "finished_at", "elapsed_s", "command", "machine", "system", "options", "steps", "baselines", "targets", "derived", "notes", "ok"}
MACHINE_KEYS = {"nproc", "cpu_model", "memory_gib", "kernel", "python", "confluent_kafka", "librdkafka", "neve_commit", "loadavg_at_start"}
STEP_KEYS = {
    "name", "topic", "partitions", "record_bytes", "producers", "consumers", "mode", "offered_records_per_s", "warmup_s", "window_s",
    "produced", "acked", "failed", "unacknowledged", "records_per_s", "mb_per_s", "ack_latency_ms", "consumed_per_consumer",
    "consumer_offset_anomalies", "consume_mb_per_s", "e2e_latency_ms", "broker_cpu_s", "broker_cpu_s_per_gib_produced",
    "broker_cpu_s_per_gib_consumed", "client_cpu_s", "objects_put", "object_bytes_put", "mean_object_bytes", "puts_per_gib",
    "stored_bytes_per_gib", "ratio_to_put_ceiling", "errors", "timeline",
}  # fmt: skip
LATENCY_KEYS = {"count", "mean", "p50", "p99", "p999", "max"}
CEILING_KEYS = {"name", "backend", "object_bytes", "concurrency", "window_s", "puts", "puts_per_s", "mb_per_s", "put_latency_ms", "errors"}
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


def check_step(step: dict) -> None:
    assert set(step) == STEP_KEYS
    assert set(step["ack_latency_ms"]) == LATENCY_KEYS
    assert step["errors"] == []
    assert step["produced"] > 0
    assert step["acked"] == step["produced"], "every produced record must be acknowledged"
    assert step["failed"] == 0 and step["unacknowledged"] == 0
    assert step["records_per_s"] > 0 and step["mb_per_s"] > 0
    assert step["ack_latency_ms"]["count"] > 0 and 0 < step["ack_latency_ms"]["p50"] <= step["ack_latency_ms"]["p99"] <= step["ack_latency_ms"]["max"]
    assert step["broker_cpu_s"] is not None and step["broker_cpu_s"] > 0
    assert step["objects_put"] > 0 and step["object_bytes_put"] > 0


def test_produce_quick(tmp_path):
    doc, out = run_bench(tmp_path, "produce")
    check_document(doc, "produce")
    assert {s["record_bytes"] for s in doc["steps"]} == {100, 1024, 65536}
    assert {s["mode"] for s in doc["steps"]} == {"saturation", "fixed-rate"}
    for step in doc["steps"]:
        check_step(step)
        assert step["consumers"] == 0 and step["e2e_latency_ms"] is None
    for step in (s for s in doc["steps"] if s["mode"] == "saturation"):
        assert step["ratio_to_put_ceiling"] is not None and step["ratio_to_put_ceiling"] > 0
    assert doc["baselines"]
    for base in doc["baselines"]:
        assert set(base) == CEILING_KEYS and base["puts"] > 0 and base["mb_per_s"] > 0 and base["errors"] == []
    assert (out / "results.md").read_text().startswith("# bench: produce")
    assert (out / "latency_cdf.png").stat().st_size > 0


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
