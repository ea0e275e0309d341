"""Builders for appends and commits, so tests read as the offsets and bytes they check; and an
etcd store opened on a test's etcd server."""

from __future__ import annotations

import itertools
import uuid

from metadata.etcd import EtcdMetadataStore, EtcdSettings
from metadata.model import Append, ObjectCommit

_keys = itertools.count()


def append(topic_id: uuid.UUID, partition: int, start: int, size: int, count: int, max_ts: int = 0, pid: int = -1, epoch: int = -1, seq: int = -1) -> Append:
    return Append(topic_id, partition, start, size, count, max_ts, producer_id=pid, producer_epoch=epoch, base_sequence=seq)


def txn_append(topic_id: uuid.UUID, partition: int, count: int, pid: int, seq: int, epoch: int = 0) -> Append:
    """A transactional batch of `count` records of producer `pid`."""
    return Append(topic_id, partition, 0, 10, count, 0, producer_id=pid, producer_epoch=epoch, base_sequence=seq, transactional=True)


def marker_append(topic_id: uuid.UUID, partition: int, pid: int, kind: int, epoch: int = 0) -> Append:
    """The control batch ending producer `pid`'s transaction (`kind`: ABORT_MARKER, COMMIT_MARKER)."""
    return Append(topic_id, partition, 0, 10, 1, 0, producer_id=pid, producer_epoch=epoch, base_sequence=-1, transactional=True, control=kind)


def commit(*appends: Append, key: str | None = None) -> ObjectCommit:
    size = max((a.start + a.size for a in appends), default=0)
    return ObjectCommit(key if key is not None else f"wal/{next(_keys):08d}", size, tuple(appends))


async def open_etcd_store(etcd, root: str, settings: EtcdSettings | None = None) -> EtcdMetadataStore:
    """A started etcd metadata store under `root` on the etcd server fixture `etcd`."""
    store = EtcdMetadataStore("127.0.0.1", etcd.ports["client"], root=root, settings=settings)
    await store.start()
    return store
