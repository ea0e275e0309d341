"""The etcd store's consumer groups: committed offsets and the coordinator's state, read and
written straight through to etcd (the view holds neither)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Mapping
from urllib.parse import unquote

from ..model import CommittedOffset
from ..store import MetadataUnavailable
from .keys import MAX_OPS, _prefix_end


class _Groups:
    """Consumer groups, mixed into EtcdMetadataStore. Uses the store's `keys`, `_client`, `_txn`,
    `_read`, `_registration` and `_registered_revision`.

    A registered broker's writes of group state and offsets hold only while its registration is
    the one etcd has (compared in the same transaction): a broker paused past its lease, whose
    groups have moved to another coordinator meanwhile, must not write its stale state or a
    request that waited in its socket over the newer one when it resumes."""

    def _registered(self) -> list:
        if self._registration is None:
            return []
        return [self._client.transactions.mod(self.keys.broker(self._registration.node_id)) == self._registered_revision]

    async def commit_offsets(self, group: str, offsets: Mapping[tuple[uuid.UUID, int], CommittedOffset], if_unchanged: Mapping[str, int] | None = None) -> bool:
        tx = self._client.transactions
        puts = [
            tx.put(self.keys.offset(group, tid, p), json.dumps([o.offset, o.leader_epoch, o.metadata, o.commit_timestamp]).encode())
            for (tid, p), o in offsets.items()
        ]
        compare = [tx.mod(self.keys.registry(key)) == revision for key, revision in (if_unchanged or {}).items()] + self._registered()
        if len(puts) + len(compare) > MAX_OPS:
            # More partitions than one transaction holds: each put is still atomic on its own key,
            # and a group's commit names each partition once. Each part compares on its own: a
            # condition that stops holding between them leaves the later parts unwritten.
            step = MAX_OPS - len(compare)
            done = await asyncio.gather(*(self._txn(compare, puts[i : i + step]) for i in range(0, len(puts), step)))
            return all(ok for ok, _ in done)
        if puts:
            ok, _ = await self._txn(compare, puts)
            return bool(ok)
        return True

    async def fetch_offsets(self, group: str) -> dict[tuple[uuid.UUID, int], CommittedOffset]:
        prefix = self.keys.offsets(group)
        result = await self._read(self._client.get_prefix(prefix))
        out = {}
        for kv in result:
            topic_hex, partition = kv.key[len(prefix) :].decode().split("/")
            offset, epoch, metadata, ts = json.loads(kv.value)
            out[(uuid.UUID(hex=topic_hex), int(partition))] = CommittedOffset(offset, epoch, metadata, ts)
        return out

    async def delete_offsets(self, group: str, partitions=None) -> None:
        tx = self._client.transactions
        if partitions is None:
            prefix = self.keys.offsets(group)
            await self._txn([], [tx.delete(prefix, _prefix_end(prefix))])
            return
        deletes = [tx.delete(self.keys.offset(group, tid, p)) for tid, p in partitions]
        for i in range(0, len(deletes), MAX_OPS):
            await self._txn([], deletes[i : i + MAX_OPS])

    async def save_group(self, group: str, state: bytes | None) -> None:
        tx = self._client.transactions
        key = self.keys.group(group)
        ok, _ = await self._txn(self._registered(), [tx.delete(key) if state is None else tx.put(key, state)])
        if not ok:
            raise MetadataUnavailable("this broker's registration lapsed: the group's state is not its to write")

    async def load_group(self, group: str) -> bytes | None:
        got = await self._read(self._client.get(self.keys.group(group)))
        return None if got is None else bytes(got.value)

    async def list_groups(self) -> list[str]:
        names = set()
        for kind in ("groups/", "offsets/"):
            prefix = self.keys.prefix(kind)
            for kv in await self._read(self._client.get_prefix(prefix, keys_only=True)):
                names.add(unquote(kv.key[len(prefix) :].decode().split("/", 1)[0]))
        return sorted(names)
