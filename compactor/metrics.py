"""Prometheus metrics of the compactor (served with the node's metrics, or by `neve compactor`)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

CYCLES = Counter("neve_compactor_cycles", "Compaction cycles committed (one Iceberg snapshot each)", ["topic"])
CYCLE_FAILURES = Counter("neve_compactor_cycle_failures", "Compaction cycles of a topic that failed and are retried")
TOPIC_FAILING = Gauge("neve_compactor_topic_failing", "Cycles of a topic failed in a row, once they are 3 or more (0 once a cycle succeeds), by the kind of the last failure", ["topic", "reason"])
MAINTENANCE_FAILURES = Counter("neve_compactor_maintenance_failures", "Table maintenance rounds of a topic that failed (retried at the next round; the topic's compaction goes on)", ["topic", "reason"])
CYCLE_SECONDS = Histogram("neve_compactor_cycle_seconds", "Time of a committed cycle, plan to index swap", buckets=(0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300))
TASK_SECONDS = Histogram("neve_compactor_task_seconds", "Time of one compaction task (a Spark task, or a task run in the compactor's process)", buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120))
ROWS = Counter("neve_compactor_rows", "Rows committed to tables, by how the value was kept (columns, columns+raw, raw, tombstone, malformed)", ["topic", "outcome"])
FILES = Counter("neve_compactor_files", "Parquet files committed", ["topic"])
FILES_PER_COMMIT = Histogram("neve_compactor_files_per_commit", "Parquet files in one cycle's snapshot", buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256))
BYTES_READ = Counter("neve_compactor_wal_bytes_read", "WAL bytes read by compaction tasks", ["topic"])
BYTES_WRITTEN = Counter("neve_compactor_parquet_bytes", "Parquet bytes committed", ["topic"])
LAG_OFFSETS = Gauge("neve_compactor_table_lag_offsets", "Offsets of a partition not in its table yet (high watermark - first WAL offset)", ["topic", "partition"])
LAG_SECONDS = Gauge("neve_compactor_table_lag_seconds", "Age of the oldest record timestamp of a partition not in its table yet", ["topic", "partition"])
TRANSACTION_HELD_OFFSETS = Gauge(
    "neve_compactor_transaction_held_offsets",
    "Offsets of a partition kept out of its table by an open transaction (high watermark - last stable offset; 0 once none is open), for partitions that had one",
    ["topic", "partition"],
)
UPSERT_DELETED = Counter("neve_compactor_upsert_deleted_rows", "Rows of a compacted topic's table a cycle deleted: superseded by a newer record of their key, or a tombstone (the key deleted)", ["topic", "why"])
DELETE_FILE_BYTES = Counter("neve_compactor_delete_file_bytes", "Bytes of the position-delete files compacted topics' cycles committed", ["topic"])
FILES_REWRITTEN = Counter("neve_compactor_files_rewritten", "Data files neve's merge rewrote into larger ones", ["topic"])
PARTITIONS_REINDEXED = Counter("neve_compactor_partitions_reindexed", "Kafka partitions whose index entries were pointed at the files a rewrite made", ["topic"])
SNAPSHOTS_EXPIRED = Counter("neve_compactor_snapshots_expired", "Table snapshots expired", ["topic"])
FILES_DELETED = Counter("neve_compactor_files_deleted", "Table files deleted (held by no retained snapshot and named by no index entry)", ["topic"])
ROWS_EXPIRED = Counter("neve_compactor_rows_expired", "Table rows deleted by the topic's table retention (neve.iceberg.retention.ms)", ["topic"])
RETENTION_FILES = Counter("neve_compactor_retention_files", "Data files table retention dropped whole or rewrote without the expired rows", ["topic", "how"])
WAL_ENTRIES_EXPIRED = Counter("neve_compactor_wal_entries_expired", "WAL index entries of topics without a table let go below their log start (their objects then collected)", ["topic"])
TABLES_DROPPED = Counter("neve_compactor_tables_dropped", "Tables dropped and purged because their topic was deleted (neve.iceberg.drop.on.delete)", ["topic"])


def set_lag(topic: str, partition: int, offsets: int, seconds: float) -> None:
    LAG_OFFSETS.labels(topic, str(partition)).set(offsets)
    LAG_SECONDS.labels(topic, str(partition)).set(seconds)


def set_held(topic: str, partition: int, offsets: int) -> None:
    TRANSACTION_HELD_OFFSETS.labels(topic, str(partition)).set(offsets)


def forget_lag(topic: str, partitions: int) -> None:
    """A topic this compactor no longer cycles (another compactor took it, or it was deleted):
    its lag is that compactor's to export."""
    for p in range(partitions):
        for gauge in (LAG_OFFSETS, LAG_SECONDS, TRANSACTION_HELD_OFFSETS):
            try:
                gauge.remove(topic, str(p))
            except KeyError:
                pass


def observe_cycle(cycle, seconds: float, task_seconds=()) -> None:
    CYCLES.labels(cycle.topic).inc()
    for t in task_seconds:
        TASK_SECONDS.observe(t)
    CYCLE_SECONDS.observe(seconds)
    FILES.labels(cycle.topic).inc(cycle.files)
    FILES_PER_COMMIT.observe(cycle.files)
    BYTES_READ.labels(cycle.topic).inc(cycle.bytes_read)
    BYTES_WRITTEN.labels(cycle.topic).inc(cycle.bytes_written)
    for outcome, n in cycle.outcomes.items():
        ROWS.labels(cycle.topic, outcome).inc(n)
    if cycle.rows_superseded or cycle.tombstones:
        UPSERT_DELETED.labels(cycle.topic, "superseded").inc(cycle.rows_superseded)
        UPSERT_DELETED.labels(cycle.topic, "tombstone").inc(cycle.tombstones)
        DELETE_FILE_BYTES.labels(cycle.topic).inc(cycle.delete_bytes)
