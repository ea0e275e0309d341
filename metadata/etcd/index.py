"""The etcd store's range replace (compaction's index swap) and the removal of wal-index records
no partition refers to any more.

A replace writes the one new entry as a per-entry key (`index/<partition>/<base offset>`), which
stands for every offset it covers, and deletes the other per-entry keys it supersedes (earlier
replaces within its range) with one range deletion: two operations however many entries it
replaces. The
wal-index records holding the superseded WAL entries are shared with other partitions and are not
touched by it. Its compare: no per-entry key of the partition changed since the revision the
caller's view reflected (a compare over the partition's key range), the topic still exists, and
with a fence, the leadership's key is still the one its lead created (a deposed compactor's swap
fails, Fenced).
Another replace of the partition in between fails it; the store then waits for its view to see
that replace and answers False if the entries are no longer the ones to replace.

A wal-index record goes once every entry in it is superseded: after a replace, each WAL object it
superseded entries of has its records read back (they name their partitions) and checked against
the view, once the view has reached the read's revision; records wholly superseded are deleted,
each compared at the create revision read. Then the WAL object is garbage (its deletion, after a
read grace, is the object-store GC's work).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence

from ..model import IndexEntry, ObjectType
from ..store import Fence, Fenced, MetadataUnavailable, UnknownTopic, check_replacement
from .keys import _prefix_end, decode_wal_index, encode_entry

log = logging.getLogger("neve.metadata.etcd")


class _Index:
    """Range replaces, mixed into EtcdMetadataStore. Uses the store's `keys`, `settings`,
    `_client`, `ops`, `_commit_txn`, the view (`_partitions`, `_by_path`, `_topics_by_id`,
    `_topic_created`, `_revision`) and the follower's `_view_reaches`."""

    async def replace_entries(self, topic_id: uuid.UUID, partition: int, replaced: Sequence[IndexEntry], replacement: IndexEntry, fence: Fence | None = None) -> bool:
        from aetcd import rpc

        check_replacement(replaced, replacement)
        replaced = list(replaced)
        tp = (topic_id, partition)
        first, last = replaced[0].base_offset, replaced[-1].last_offset
        for _attempt in range(self.settings.commit_attempts):
            part = self._partitions.get(tp)
            if part is None:
                raise UnknownTopic(f"{topic_id}/{partition}")
            if part.covering(first, last) != replaced:
                return False
            seen = self._revision
            prefix = self.keys.partition_index(topic_id, partition)
            request = rpc.TxnRequest()
            request.compare.add(result=rpc.Compare.LESS, target=rpc.Compare.MOD, key=prefix, range_end=_prefix_end(prefix), mod_revision=seen + 1)
            topic_key = self.keys.topic(self._topics_by_id[topic_id].name)
            request.compare.add(result=rpc.Compare.EQUAL, target=rpc.Compare.CREATE, key=topic_key, create_revision=self._topic_created[topic_id])
            if fence is not None:  # the lead's key is the one its campaign created (leaders.py)
                leader_key = self.keys.leader(fence.name)
                request.compare.add(result=rpc.Compare.EQUAL, target=rpc.Compare.CREATE, key=leader_key, create_revision=fence.epoch)
                request.failure.add().request_range.key = leader_key
            # the keys after the first within the range go (etcd refuses a put inside a range the
            # same transaction deletes); the first is put, over an earlier replace's if there is one
            key = self.keys.index(topic_id, partition, first)
            delete = request.success.add().request_delete_range
            delete.key, delete.range_end = key + b"\0", self.keys.index(topic_id, partition, last + 1)
            put = request.success.add().request_put
            put.key, put.value = key, encode_entry(replacement)
            response = await self._commit_txn(request)
            if response.succeeded:
                # The watch brings the same change. Applied here too unless the view is past it
                # already: then a later replace (another store's merge over this range) may be in
                # the view, and this older entry must not cut it back.
                if self._revision < response.header.revision:
                    part.replace(replacement)
                log.info("etcd_entries_replaced", extra={"topic_id": topic_id.hex, "partition": partition, "first": first, "last": last, "entries": len(replaced), "object": replacement.object_key})
                await self._drop_superseded_records({e.object_key for e in replaced if e.object_type is ObjectType.WAL})
                return True
            if fence is not None and not any(kv.create_revision == fence.epoch for kv in response.responses[0].response_range.kvs):
                raise Fenced(f"leadership {fence.name!r} epoch {fence.epoch} is no longer held")
            # Another replace of this partition (or the topic's deletion) came after the view's
            # revision: wait until the view has it, then look again.
            if not await self._view_reaches(response.header.revision, self.settings.timeout):
                raise MetadataUnavailable(f"the view did not reach revision {response.header.revision} after a replace conflicted")
            if topic_id not in self._topics_by_id:
                raise UnknownTopic(f"{topic_id}/{partition}")
        raise MetadataUnavailable(f"replace of {topic_id}/{partition} offsets {first}-{last} kept conflicting")

    async def _drop_superseded_records(self, object_keys: set[str]) -> None:
        """Delete the wal-index records of these WAL objects whose every entry is superseded in
        the view (or belongs to a topic no longer there). Best effort: a record left behind is
        only kept too long, and the next replace touching its object tries again."""
        from aetcd import rpc

        for object_key in sorted(object_keys):
            prefix = self.keys.wal_indexes(object_key)
            try:
                self.ops += 1
                read = await self._client.kvstub.Range(rpc.RangeRequest(key=prefix, range_end=_prefix_end(prefix)), timeout=self.settings.timeout, metadata=self._client.metadata)
                # The records' partitions are judged by the view, which must hold them all first.
                if not await self._view_reaches(read.header.revision, self.settings.timeout):
                    continue
                superseded = [kv for kv in read.kvs if not self._still_referenced(kv.value)]
                if not superseded:
                    continue
                request = rpc.TxnRequest()
                for kv in superseded:
                    request.compare.add(result=rpc.Compare.EQUAL, target=rpc.Compare.CREATE, key=kv.key, create_revision=kv.create_revision)
                    request.success.add().request_delete_range.key = kv.key
                await self._commit_txn(request)
                log.info("etcd_wal_index_records_dropped", extra={"object": object_key, "records": len(superseded), "left": len(read.kvs) - len(superseded)})
            except MetadataUnavailable as e:
                log.warning("etcd_wal_index_drop_failed", extra={"object": object_key, "error": str(e)})

    def _still_referenced(self, raw: bytes) -> bool:
        """Whether any entry of a wal-index record is still one the view serves."""
        object_key, entries = decode_wal_index(raw)
        for path, entry in entries:
            found = self._by_path.get(path)
            if found is None:
                continue  # a topic deleted since: nothing reads its entries
            if any(e.object_key == object_key for e in found[1].covering(entry.base_offset, entry.last_offset)):
                return True
        return False
