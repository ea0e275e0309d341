"""Smoke runs of the table benchmarks (`python -m bench compaction|freshness --quick`) at a tiny
size: the plumbing, not the machine's speed. Every acknowledged record is one committed row, each
figure the scenarios report is there and consistent, and the freshness reader saw every offset
of its window once."""

from __future__ import annotations

import pytest

from .test_bench_smoke import RESULT_KEYS, TARGET_KEYS, run_bench

pytestmark = pytest.mark.integration

COMPACTION_KEYS = {
    "runner", "codec", "record_bytes", "rows", "cycles", "files", "outcomes", "wal_mib", "value_mib", "seconds", "cpu_s", "mib_per_s", "rows_per_s",
    "cpu_s_per_gib", "cpu_s_per_gib_by_process", "mib_per_cpu_s", "pyarrow_seconds", "pyarrow_cpu_s", "pyarrow_mib_per_s", "ratio_to_pyarrow", "ratio_to_pyarrow_cpu",
    "parquet_bytes", "pyarrow_parquet_bytes", "load_average",
}  # fmt: skip


def _document(doc: dict, scenario: str) -> None:
    assert set(doc) == RESULT_KEYS
    assert doc["scenario"] == scenario and doc["quick"] is True
    assert doc["ok"] is True, doc["notes"]
    assert doc["steps"] == []  # neither drives the librdkafka load steps
    for target in doc["targets"]:
        assert set(target) == TARGET_KEYS


def test_compaction_in_process(tmp_path) -> None:
    doc, out = run_bench(tmp_path, "compaction", "--runners", "in-process", "--record-sizes", "100,1KiB", "--mib", "0.25")
    _document(doc, "compaction")
    rows = doc["derived"]["compaction"]
    assert [(r["codec"], r["record_bytes"]) for r in rows] == [(codec, size) for size in (100, 1024) for codec in ("raw", "avro", "avro-nested")]
    produced = {(p["codec"], p["record_bytes"]): p for topic, p in doc["derived"]["produced"].items() if topic.startswith("case-")}
    for r in rows:
        assert set(r) == COMPACTION_KEYS
        assert r["runner"] == "in-process"
        # the tree's CPU by kind of process: in-process, the tasks run in the driver and no JVM runs
        by_process = r["cpu_s_per_gib_by_process"]
        assert set(by_process) == {"driver", "jvm", "python workers"} and by_process["driver"] > 0 and by_process["jvm"] == 0
        expected = int(0.25 * 2**20 / r["record_bytes"])
        assert r["rows"] == expected == produced[(r["codec"], r["record_bytes"])]["acked"]
        # raw values are raw rows; the bench's Avro values (lists, maps, decimals, uuids, times among them) all come back byte for byte as columns
        assert {k: n for k, n in r["outcomes"].items() if n} == ({"raw": expected} if r["codec"] == "raw" else {"columns": expected})
        assert r["cycles"] >= 1 and r["files"] >= 1 and r["wal_mib"] >= r["value_mib"] > 0
        assert r["seconds"] > 0 and r["cpu_s"] > 0 and r["pyarrow_seconds"] > 0 and r["pyarrow_cpu_s"] >= 0
        assert r["mib_per_s"] == pytest.approx(r["wal_mib"] / r["seconds"], rel=0.05)  # each rounded
        assert r["ratio_to_pyarrow"] == pytest.approx(r["pyarrow_seconds"] / r["seconds"], rel=0.05, abs=0.002)  # each rounded
    names = [t["name"] for t in doc["targets"]]
    assert sum("pyarrow" in n for n in names) == len(rows) and sum("per core" in n for n in names) == sum(r["record_bytes"] == 1024 for r in rows) == 3
    assert "Compaction of WAL" in (out / "results.md").read_text()


def test_freshness_in_process(tmp_path) -> None:
    # The in-process runner keeps the smoke run off a JVM; the scenario's default is neve dev's (Spark).
    doc, out = run_bench(tmp_path, "freshness", "--broker-env", "NEVE_COMPACTOR_RUNNER=in-process", "--rate-mb", "0.2", "--partitions", "2")
    _document(doc, "freshness")
    f, s = doc["derived"]["freshness"], doc["derived"]["freshness_s"]
    assert f["compactor"] == {"runner": "in-process", "freshness_ms": 2000, "interval_ms": 1000, "parallelism": 2, "in_node": True}
    assert f["records_in_window"] > 0 and s["count"] == f["records_in_window"] and f["not_visible"] == 0
    assert f["table_rows"] == f["acked"] and f["duplicate_rows"] == 0 and f["snapshots"] >= 1
    # a row is seen after its acknowledgement
    assert 0 < s["p50"] <= s["p99"] <= s["max"]
    assert f["node_cores"] > 0 and f["node_cpu_s_per_gib"] > 0  # the node's tree worked in the window
    assert [t["name"] for t in doc["targets"]] == ["table freshness p99 (s)"]
    assert "Acknowledgement to visible row" in (out / "results.md").read_text()
    assert (f["topics"], f["partitions"], f["sampled_topics"], f["sampled_acked"]) == (1, 2, 1, f["acked"])


def test_freshness_over_several_topics(tmp_path) -> None:
    """Three topics of one partition at two records a second each: the reader follows every one
    (fewer than the sample), each table holds every acknowledged offset of its topic once."""
    doc, out = run_bench(tmp_path, "freshness", "--broker-env", "NEVE_COMPACTOR_RUNNER=in-process", "--topics", "3", "--records-per-topic-s", "2", "--record-bytes", "100", "--duration", "6")
    _document(doc, "freshness")
    f, s = doc["derived"]["freshness"], doc["derived"]["freshness_s"]
    assert (f["topics"], f["partitions"], f["sampled_topics"]) == (3, 1, 3)
    assert f["offered_records_per_s"] == 6.0
    assert f["acked"] <= 6.0 * f["produce_s"] + 1  # paced: the i-th record is sent no sooner than i/6 s after the start
    assert f["records_in_window"] > 0 and s["count"] == f["records_in_window"] and f["not_visible"] == 0
    assert f["table_rows"] == f["acked"] == f["sampled_acked"] and f["duplicate_rows"] == 0
    assert 0 < s["p50"] <= s["p99"] <= s["max"]
    assert f["poll_round_s"]["p50"] <= f["poll_round_s"]["max"]
    assert "3 x 1" in (out / "results.md").read_text()
