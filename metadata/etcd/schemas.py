"""The etcd store's part for the schema registry: its items as keys under `registry/`, read and
written straight through to etcd (the view holds none), each write one transaction comparing the
mod revisions the registry read."""

from __future__ import annotations

from collections.abc import Mapping

from ..store import RegistryItem


class _Schemas:
    """The schema registry's storage, mixed into EtcdMetadataStore. Uses the store's `keys`,
    `_client`, `_txn` and `_read`. A registry key's revision is its etcd mod revision: an absent
    key's is 0, which is what etcd compares an absent key's mod revision as."""

    async def registry_get(self, key: str) -> RegistryItem | None:
        got = await self._read(self._client.get(self.keys.registry(key)))
        return None if got is None else RegistryItem(key, bytes(got.value), got.mod_revision)

    async def registry_items(self, prefix: str) -> list[RegistryItem]:
        root = self.keys.registry("")
        result = await self._read(self._client.get_prefix(self.keys.registry(prefix)))
        return sorted(RegistryItem(kv.key[len(root) :].decode(), bytes(kv.value), kv.mod_revision) for kv in result)

    async def registry_write(self, writes: Mapping[str, bytes | None], expect: Mapping[str, int]) -> bool:
        tx = self._client.transactions
        compare = [tx.mod(self.keys.registry(key)) == revision for key, revision in expect.items()]
        success = [tx.delete(self.keys.registry(key)) if value is None else tx.put(self.keys.registry(key), value) for key, value in writes.items()]
        ok, _responses = await self._txn(compare, success)
        return bool(ok)
