"""Settings of the table read path (compacted offsets served from the table's Parquet files). The
composition root loads them as the [table] section (NEVE_TABLE_<FIELD>)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TableReadConfig:
    rebuilt_bytes: int = 128 * 1024 * 1024
    """Memory for record batches rebuilt from the table's rows, kept in runs of a row group's
    batches (least recently used evicted) for the next fetch and for other consumers of the same
    offsets; the run after the one a consumer reads is rebuilt ahead while there is room. Two
    runs per partition being caught up on (a row group of 8 MiB on neve's tables makes a run of
    about that) is what reading ahead needs."""
    decoded_bytes: int = 64 * 1024 * 1024
    """Memory for row groups of the table's files as decoded (least recently used evicted): a
    compaction cycle writes the rows of all of a topic's partitions into one file, so a row group
    holds many partitions' rows, and the readers of each take theirs from one decode."""
