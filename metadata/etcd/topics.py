"""The etcd store's topics: create, update and delete, each one transaction on the topic's key,
answered once the watch has brought the change into the view."""

from __future__ import annotations

import uuid
from collections.abc import Mapping

from ..model import TopicInfo
from ..rules import merged_configs, partition_count
from ..store import InvalidPartitions, MetadataUnavailable, TopicAlreadyExists, UnknownTopic
from .keys import _decode_topic, _encode_topic, _prefix_end


class _Topics:
    """Topic transactions, mixed into EtcdMetadataStore. Uses the store's `keys`, `settings`,
    `_client`, `ops`, `_txn`, the view's `_topics` and `_topics_by_id`, and the follower's
    `_view_settles`, `_adopt_topic` and `_forget_topic`."""

    def topics(self) -> Mapping[str, TopicInfo]:
        return self._topics

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicInfo | None:
        return self._topics_by_id.get(topic_id)

    async def create_topic(self, name: str, partitions: int, configs: Mapping[str, str] | None = None) -> TopicInfo:
        if partitions <= 0:
            raise InvalidPartitions(f"{partitions} partitions")
        info = TopicInfo(name, uuid.uuid4(), partitions, dict(configs or {}))
        tx = self._client.transactions
        key = self.keys.topic(name)
        ok, responses = await self._txn([tx.create(key) == 0], [tx.put(key, _encode_topic(info))])
        if not ok:
            raise TopicAlreadyExists(name)
        revision = responses[0].response_put.header.revision
        await self._view_settles(revision)
        if name not in self._topics:
            self._adopt_topic(info, revision)
        return self._topics[name]

    async def update_topic(self, name: str, partitions: int | None = None, configs: Mapping[str, str | None] | None = None) -> TopicInfo:
        tx = self._client.transactions
        key = self.keys.topic(name)
        for _ in range(self.settings.commit_attempts):
            got = await self._client.get(key)
            self.ops += 1
            if got is None:
                raise UnknownTopic(name)
            info = _decode_topic(name, got.value)
            updated = TopicInfo(name, info.topic_id, partition_count(info, partitions), merged_configs(info.configs, configs))
            ok, responses = await self._txn([tx.mod(key) == got.mod_revision], [tx.put(key, _encode_topic(updated))])
            if ok:
                await self._view_settles(responses[0].response_put.header.revision)
                self._adopt_topic(updated, got.create_revision)
                return updated
        raise MetadataUnavailable(f"update of topic {name} kept conflicting")

    async def delete_topic(self, name: str) -> TopicInfo:
        info = self._topics.get(name)
        if info is None:
            raise UnknownTopic(name)
        tx = self._client.transactions
        heads = self.keys.prefix(f"heads/{info.topic_id.hex}/")
        index = self.keys.prefix(f"index/{info.topic_id.hex}/")
        ok, responses = await self._txn(
            [tx.create(self.keys.topic(name)) > 0],
            [tx.delete(self.keys.topic(name)), tx.delete(heads, _prefix_end(heads)), tx.delete(index, _prefix_end(index))],
        )
        if not ok:
            raise UnknownTopic(name)
        await self._view_settles(responses[0].response_delete_range.header.revision)
        if self._topics.get(name) is info:
            del self._topics[name]
            self._forget_topic(info)
        return info
