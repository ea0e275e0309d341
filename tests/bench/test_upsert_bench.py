"""Smoke run of the compacted-topic benchmark (`python -m bench upsert --quick`): 10,000 keys, one
update cycle of 1% of them, the node's compactor in-process for the freshness phase. The plumbing,
not the machine's speed: each cycle committed exactly its updated keys' rows and superseded as many,
its bytes add up by kind, the reads of partition 0 got one record per key of the upsert topic and
every record of the appended one, and the tables were checked whole (the scenario fails otherwise)."""

from __future__ import annotations

import pytest

from .test_bench_smoke import run_bench
from .test_compaction_bench import _document

pytestmark = pytest.mark.integration

CYCLE_KEYS = {
    "cycles", "rows", "files", "data_bytes", "delete_bytes", "rows_superseded", "tombstones", "wal_bytes", "seconds", "cpu_s", "written", "table", "load_average",
    "removal_bytes", "manifest_bytes", "iceberg_metadata_bytes", "other_bytes", "bytes_written", "written_per_changed_byte", "parquet_unaccounted",
}  # fmt: skip


def test_upsert_quick(tmp_path) -> None:
    # The in-process runner keeps the freshness phase off a JVM; the scenario's default is neve dev's (Spark).
    doc, out = run_bench(tmp_path, "upsert", "--broker-env", "NEVE_COMPACTOR_RUNNER=in-process")
    _document(doc, "upsert")
    u = doc["derived"]["upsert"]
    assert (u["keys"], u["updates_per_cycle"], u["cycles"], u["partitions"]) == (10_000, 100, 1, 4)
    rows = doc["derived"]["cycles"]
    assert [row["cycle"] for row in rows] == [0, 1]
    for row in rows:
        want = 10_000 if row["cycle"] == 0 else 100
        for name in ("upsert", "append"):
            m = row[name]
            assert set(m) == CYCLE_KEYS
            assert m["rows"] == want and m["cycles"] >= 1 and m["cpu_s"] > 0 and m["seconds"] > 0
            assert m["parquet_unaccounted"] == 0 and m["other_bytes"] == 0  # every file written is one of the kinds reported
            assert m["bytes_written"] == m["data_bytes"] + m["delete_bytes"] + m["removal_bytes"] + m["manifest_bytes"] + m["iceberg_metadata_bytes"]
            assert m["manifest_bytes"] > 0 and m["iceberg_metadata_bytes"] > 0
        upsert, append = row["upsert"], row["append"]
        # the appended topic supersedes nothing and writes no deletes; the compacted one, after the initial table, one row per update
        assert append["rows_superseded"] == append["delete_bytes"] == append["removal_bytes"] == 0
        assert upsert["rows_superseded"] == (0 if row["cycle"] == 0 else want)
        assert (upsert["delete_bytes"] > 0 and upsert["removal_bytes"] > 0) is (row["cycle"] > 0)
    reads = doc["derived"]["reads"]
    for name in ("upsert", "append"):
        assert len(reads[name]) == 2
        for read in reads[name]:
            assert 0 < read["first_s"] <= read["end_s"]
    # partition 0 of the upsert topic: its keys once each; of the appended one, they and their updates
    assert reads["upsert"][0]["records"] < reads["append"][0]["records"]
    check = doc["derived"]["table_check"]
    assert check["upsert_rows"] == check["distinct_keys"] == 10_000 and check["not_latest"] == 0
    assert check["append_rows"] == check["append_distinct"] == check["append_acked"] == 10_100
    f, s = doc["derived"]["freshness"], doc["derived"]["freshness_s"]
    assert f["compactor"]["runner"] == "in-process" and f["compactor"]["in_node"] is True
    assert f["not_visible"] == 0 and s["count"] == f["records_in_window"] > 0 and 0 < s["p50"] <= s["p99"] <= s["max"]
    assert f["table_rows"] == 10_000  # the poller's own scan of the table: one row per key
    assert [t["name"] for t in doc["targets"]] == ["bytes a cycle writes / its changed rows' bytes (upsert, worst cycle)", "table freshness p99 (s), 1% of the keys updated every ~2 s"]
    text = (out / "results.md").read_text()
    assert "Compaction cycles: the compacted topic (upsert)" in text and "Partition 0 read from offset 0" in text
