"""Turns a flushed WAL object into one sequencer commit: each chunk becomes an Append carrying
its byte range and the producer fields read from its batches at produce time (and, for a
transaction marker the coordinator wrote, its control type)."""

from __future__ import annotations

from collections.abc import Sequence

from metadata.model import Append, AppendResult, ObjectCommit
from metadata.store import MetadataStore
from wal.batch import RecordsSummary
from wal.format import Chunk, EncodedObject


def commit_fn(metadata: MetadataStore):
    async def commit(key: str, encoded: EncodedObject, chunks: Sequence[Chunk], metas: Sequence[RecordsSummary]) -> list[AppendResult]:
        appends = tuple(
            Append(
                topic_id=chunk.topic_id,
                partition=chunk.partition,
                start=start,
                size=len(chunk.data),
                record_count=chunk.record_count,
                max_timestamp=chunk.max_timestamp,
                producer_id=summary.producer_id,
                producer_epoch=summary.producer_epoch,
                base_sequence=summary.base_sequence,
                transactional=summary.transactional,
                control=summary.control,
                txn_guard=summary.txn_guard,
                txn_generation=summary.txn_generation,
            )
            for chunk, summary, start in zip(chunks, metas, encoded.chunk_starts, strict=True)
        )
        return await metadata.commit(ObjectCommit(object_key=key, object_size=encoded.size, appends=appends))

    return commit
