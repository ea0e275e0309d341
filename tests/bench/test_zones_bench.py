"""Smoke run of `python -m bench zones --quick` (four brokers in two zones over etcd and SeaweedFS)
at a tiny size: the report's fields and its counts, not the machine's speed. Every group of both
zones read every record once; with the chunk cache on, SeaweedFS counted one GET per chunk per zone
(more only where a broker read around a failed owner, each such read counted); neve's own GET
count agrees with SeaweedFS's; no zoned client's byte crossed zones."""

from __future__ import annotations

import pytest

from .test_bench_smoke import RESULT_KEYS, TARGET_KEYS, run_bench

pytestmark = pytest.mark.integration

ZONES_KEYS = {
    "records", "record_bytes", "produced_value_bytes", "produced_per_zone", "produce_cross_zone_client_bytes", "partitions", "objects", "object_bytes",
    "chunk_bytes", "chunks", "zones", "brokers", "consumers_per_group", "steps",
}  # fmt: skip
STEP_KEYS = {
    "cache", "groups_per_zone", "groups", "groups_complete", "consumed_records", "records_read_again", "consumed_bytes", "gets", "neve_object_gets", "neve_object_get_bytes",
    "direct_reads", "cache_lookups", "peer_bytes_received", "client_bytes", "cross_zone_client_bytes", "seconds", "broker_cpu_s", "load_average",
    "error", "gets_per_gib_consumed", "gets_per_chunk_per_zone",
}  # fmt: skip
RECORDS = 2 * 2**20 // 1024  # --quick: 2 MiB of 1 KiB values
CHUNK = 64 * 1024  # --quick's NEVE_CACHE_CHUNK_BYTES


def test_zones_quick(tmp_path) -> None:
    doc, out = run_bench(tmp_path, "zones", "--groups", "1,2")
    assert set(doc) == RESULT_KEYS
    assert doc["scenario"] == "zones" and doc["quick"] is True
    assert doc["ok"] is True, doc["notes"]
    assert doc["steps"] == []  # no librdkafka load step: the scenario drives its own clients

    z = doc["derived"]["zones"]
    assert set(z) == ZONES_KEYS
    assert z["records"] == RECORDS and z["record_bytes"] == 1024 and z["produced_value_bytes"] == RECORDS * 1024
    assert z["produced_per_zone"] == {"a": RECORDS // 2, "b": RECORDS // 2}
    assert z["produce_cross_zone_client_bytes"] == 0
    assert z["zones"] == ["a", "b"] and z["brokers"] == 4 and z["consumers_per_group"] == 2 and z["partitions"] == 4
    assert z["chunk_bytes"] == CHUNK
    # objects hold the values and their batches' headers; each is cut into aligned chunks
    assert z["object_bytes"] > z["produced_value_bytes"]
    assert z["object_bytes"] / CHUNK <= z["chunks"] < z["object_bytes"] / CHUNK + z["objects"]

    steps = z["steps"]
    assert [(s["cache"], s["groups_per_zone"]) for s in steps] == [(True, 1), (True, 2), (False, 1), (False, 2)]
    for s in steps:
        assert set(s) == STEP_KEYS
        groups = 2 * s["groups_per_zone"]
        assert s["groups"] == s["groups_complete"] == groups and s["error"] is None
        assert s["consumed_records"] == groups * RECORDS and s["consumed_bytes"] == groups * RECORDS * 1024
        assert s["cross_zone_client_bytes"] == 0
        assert set(s["client_bytes"]) == {"in a->a", "in b->b", "out a->a", "out b->b"}  # zoned clients only, each on its zone's brokers
        assert s["client_bytes"]["out a->a"] > s["consumed_bytes"] / 2 and s["client_bytes"]["out b->b"] > s["consumed_bytes"] / 2
        assert s["gets"] == s["neve_object_gets"] > 0  # SeaweedFS's count and neve's agree
        assert s["gets_per_chunk_per_zone"] == round(s["gets"] / (2 * z["chunks"]), 3)
        assert s["gets_per_gib_consumed"] == round(s["gets"] / (s["consumed_bytes"] / 2**30), 2)
        if s["cache"]:
            # each zone's owners read each chunk once, whatever the number of groups (consecutive
            # chunks an owner lacks in one GET: at most a GET a chunk)
            assert s["gets"] <= 2 * z["chunks"] or s["direct_reads"] > 0
            assert s["neve_object_get_bytes"] >= 2 * z["object_bytes"]
            if s["direct_reads"] == 0:
                assert s["neve_object_get_bytes"] == 2 * z["object_bytes"]
            assert s["peer_bytes_received"] > 0
        else:
            assert s["peer_bytes_received"] == 0 and s["direct_reads"] == 0
            assert not any(k.startswith(("chunk", "peer")) for k in s["cache_lookups"])

    targets = doc["targets"]
    assert all(set(t) == TARGET_KEYS for t in targets)
    assert [t["name"] for t in targets] == [
        "object-store GETs per chunk per zone, cache on, 1 group(s) per zone",
        "object-store GETs per chunk per zone, cache on, 2 group(s) per zone",
        "client bytes across zones, zoned clients (every step, producers included)",
    ]
    assert targets[-1]["measured"] == 0 and targets[-1]["met"] is True
    assert "Object-store GETs and client bytes across zones" in (out / "results.md").read_text()
