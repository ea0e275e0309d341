"""Smoke runs of issue 22's benchmarks (`python -m bench catchup-table|stored-bytes|maintenance
--quick`) at a tiny size: the plumbing, not the machine's speed. Every record is read from offset 0
from the WAL and again from Parquet (the index all PARQUET in between), on neve dev and on one
broker over etcd and SeaweedFS (the S3 GETs of each read counted); with the sweeper on, every
WAL object goes and the table holds each acknowledged record once; maintenance merges a table
partition's files into one, deletes the older ones, and the Kafka view reads every record after."""

from __future__ import annotations

import pytest

from .test_bench_smoke import run_bench
from .test_compaction_bench import _document as check_document  # the table benchmarks' document: no load steps

pytestmark = pytest.mark.integration

READ_KEYS = {"consumed", "offset_anomalies", "error", "seconds", "mb_per_s", "records_per_s", "broker_cpu_s", "broker_cpu_s_per_gib", "consumer_cpu_s_per_gib", "load_average"}
STORE_KEYS = {"store_gets", "store_requests", "store_gets_per_gib", "store_cpu_s_per_gib"}
MEDIAN_KEYS = {"seconds", "mb_per_s", "records_per_s", "broker_cpu_s", "broker_cpu_s_per_gib", "consumer_cpu_s_per_gib", "store_gets_per_gib", "store_cpu_s_per_gib"}
TABLE_HEADERS = ["values", "records", "MB", "WAL MB/s", "Parquet MB/s", "Parquet / WAL", "broker CPU-s/GiB WAL", "Parquet", "consumer CPU-s/GiB WAL", "Parquet"]


def _whole_read(read: dict, records: int, keys: set[str] = READ_KEYS) -> None:
    assert set(read) == keys
    assert read["consumed"] == records and read["offset_anomalies"] == 0 and read["error"] is None
    assert read["seconds"] > 0 and read["mb_per_s"] > 0 and read["broker_cpu_s"] >= 0


def _catchup_cases(doc: dict, out, store_counted: bool) -> list[dict]:
    """Each size's records read whole from the WAL and from Parquet, once each; the object
    store's figures present exactly when `store_counted` (S3)."""
    check_document(doc, "catchup-table")
    cases = doc["derived"]["catchup_table"]
    assert [(c["record_bytes"], c["records"]) for c in cases] == [(1024, 256), (100, 2621)]
    for case in cases:
        assert case["value_bytes"] == case["records"] * case["record_bytes"]
        for source in ("wal", "parquet"):
            [read] = case[f"{source}_rounds"]
            _whole_read(read, case["records"], READ_KEYS | STORE_KEYS)
            assert set(case[source]) == MEDIAN_KEYS
            assert case[source]["mb_per_s"] == read["mb_per_s"]  # the median of one round
            if not store_counted:
                assert all(read[k] is None for k in STORE_KEYS)
        assert case["parquet_over_wal"] == pytest.approx(case["parquet"]["mb_per_s"] / case["wal"]["mb_per_s"], rel=0.01)
    compaction = doc["derived"]["compaction"]
    assert compaction["runner"] == "in-process" and compaction["cpu_s"] > 0
    # on S3 the servers' CPU beside the compactor's, taken out of it
    assert set(compaction.get("servers_cpu_s", {})) == ({"etcd", "seaweedfs"} if store_counted else set())
    assert [t["name"] for t in doc["targets"]] == [f"catch-up read from Parquet / from the WAL, raw {n} B (MB/s)" for n in (1024, 100)]
    [(title, table)] = doc["derived"]["tables"].items()
    assert "WAL, then the same records from Parquet" in title and title in (out / "results.md").read_text()
    store_headers = ["S3 GETs/GiB WAL", "Parquet", "SeaweedFS CPU-s/GiB WAL", "Parquet"]
    assert table["headers"] == TABLE_HEADERS + (store_headers if store_counted else [])
    return cases


def test_catchup_table(tmp_path) -> None:
    doc, out = run_bench(tmp_path, "catchup-table", "--mib", "0.25")
    _catchup_cases(doc, out, store_counted=False)


def test_catchup_table_neve_s3(tmp_path) -> None:
    """One broker over etcd and SeaweedFS, compacted into a table whose files are on the same
    SeaweedFS: each read's GETs are counted on the bucket, and each read did GET (the broker was
    started afresh, nothing in its memory)."""
    doc, out = run_bench(tmp_path, "catchup-table", "--system", "neve-s3", "--mib", "0.25")
    assert doc["system"]["name"] == "neve-s3" and doc["system"]["metadata"].startswith("etcd://")
    for case in _catchup_cases(doc, out, store_counted=True):
        for source in ("wal", "parquet"):
            [read] = case[f"{source}_rounds"]
            assert read["store_gets"] >= 1 and read["store_requests"]["GET"] == read["store_gets"]
            assert read["store_gets_per_gib"] == pytest.approx(read["store_gets"] / (case["value_bytes"] / 2**30), abs=0.1)
            assert read["store_cpu_s_per_gib"] >= 0


def test_stored_bytes(tmp_path) -> None:
    doc, out = run_bench(tmp_path, "stored-bytes", "--rate-mb", "1", "--seconds", "4", "--orphan-grace-s", "10")
    check_document(doc, "stored-bytes")
    f = doc["derived"]["stored_bytes"]
    assert f["acked"] > 0 and f["table_rows"] == f["acked"] and f["duplicate_rows"] == 0
    # settled: every WAL object compacted and swept, as unreferenced or as an orphan
    assert f["settled"]["files"]["wal"] == 0 and f["settled"]["bytes"]["wal"] == 0
    assert f["settled"]["files"]["table_data"] == f["table_files"] >= 1
    deleted = f["wal_deleted"]
    assert deleted["unreferenced"]["objects"] + deleted["orphan"]["objects"] >= f["wal_objects_at_end"]
    assert 0 < f["settled_parquet_per_produced"] <= f["settled_stored_per_produced"]
    samples = doc["derived"]["samples"]
    assert {s["phase"] for s in samples} >= {"production", "end of production", "settling"}
    assert samples[-1]["produced_bytes"] == f["acked"] * f["record_bytes"]
    assert [t["name"] for t in doc["targets"]] == ["stored bytes per produced byte at steady state / the Parquet ratio alone"]
    assert "Stored bytes per produced byte" in (out / "results.md").read_text()


def test_maintenance(tmp_path) -> None:
    doc, out = run_bench(tmp_path, "maintenance", "--seconds", "4", "--min-files", "2", "--interval-ms", "500", "--snapshot-age-ms", "1000", "--delete-grace-ms", "1000")
    check_document(doc, "maintenance")
    m = doc["derived"]["maintenance"]
    before, after = m["before"], m["after"]
    assert before["rows"] == after["rows"] == m["acked"] > 0 and before["duplicates"] == after["duplicates"] == 0
    # a cycle every half second: several small files in the day's table partition, on disk too
    assert len(before["per_partition"]) == 1 and before["files"] >= 2 and before["disk"]["files"] == before["files"]
    # merged into one file (far below the target size), the older ones deleted from disk
    assert list(after["per_partition"].values()) == [1] and after["files"] == 1 and after["disk"]["files"] == 1
    assert after["disk"]["bytes"] == after["bytes"]
    _whole_read(m["read_after"], m["acked"], READ_KEYS | STORE_KEYS)  # catchup-table's read: no store counts on local files
    assert m["read_after"]["store_gets"] is None
    assert [(t["name"], t["met"]) for t in doc["targets"]] == [("data files per table partition after maintenance (most)", True)]
    assert "Data files per table partition" in (out / "results.md").read_text()
