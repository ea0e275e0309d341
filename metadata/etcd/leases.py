"""What the etcd store keeps alive or expires by time: this broker's registration on its lease,
producer ids and their epochs (on a lease of the producer expiry), and etcd's revision history."""

from __future__ import annotations

import asyncio
import json
import logging
import time

from ..model import BrokerRegistration
from ..rules import bumped_epoch
from ..store import MetadataUnavailable

log = logging.getLogger("neve.metadata.etcd")

PRODUCER_ID_BLOCK = 1000


class _Leases:
    """Leases and housekeeping, mixed into EtcdMetadataStore. Owns `_lease`, `_registration`,
    `_pid_next`, `_pid_end`, `_pid_lock`, `_expiring_lease_obj` and `_expiring_lease_at` (made in the
    store's __init__). Uses the store's `keys`, `settings`, `_client`, `ops`, `_txn`, `_tasks`,
    `_closed`, and the view's `_brokers` and `_broker_revisions`."""

    # -- brokers ------------------------------------------------------------------------------

    async def register_broker(self, broker: BrokerRegistration) -> None:
        await self._register(broker)
        self._tasks.append(asyncio.create_task(self._keep_alive()))

    async def _register(self, broker: BrokerRegistration) -> None:
        self._registration = broker
        self._lease = await self._client.lease(self.settings.lease_ttl)
        value = json.dumps(broker.fields()).encode()
        put = await self._client.put(self.keys.broker(broker.node_id), value, lease=self._lease)
        self.ops += 2
        self._brokers[broker.node_id] = broker
        self._broker_revisions[broker.node_id] = self._registered_revision = put.header.revision

    def registration_revision(self) -> int:
        return self._registered_revision

    async def _keep_alive(self) -> None:
        interval = self.settings.lease_ttl / 3
        while not self._closed:
            await asyncio.sleep(interval)
            try:
                reply = await asyncio.wait_for(self._lease.refresh(), self.settings.timeout)
                ttl = getattr(reply, "TTL", 1)
                if ttl <= 0:
                    raise RuntimeError("lease expired")
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("broker_lease_lost", extra={"error": repr(e)})
                try:
                    await self._register(self._registration)
                except Exception as again:
                    log.warning("broker_register_failed", extra={"error": repr(again)})

    # -- producer ids -------------------------------------------------------------------------

    async def init_producer_id(self, producer_id: int = -1, producer_epoch: int = -1) -> tuple[int, int]:
        # KIP-360: a producer giving its current (id, epoch) gets the epoch bumped (partitions'
        # heads reset its sequence when they see the higher epoch with sequence 0); a stale epoch
        # or an unknown id gets a fresh id. Epochs live under producer-epochs/, on a lease that
        # expires them with the producer state (producer_expiry_ms).
        tx = self._client.transactions
        bumped = bumped_epoch(producer_id, producer_epoch)
        if bumped is not None:
            key = self.keys.producer_epoch(producer_id)
            lease = await self._expiring_lease()
            ok, _ = await self._txn([tx.value(key) == str(producer_epoch).encode()], [tx.put(key, str(bumped).encode(), lease=lease)])
            if ok:
                return producer_id, bumped
        async with self._pid_lock:
            if self._pid_next >= self._pid_end:
                await self._allocate_producer_ids()
            pid = self._pid_next
            self._pid_next += 1
        lease = await self._expiring_lease()
        await self._txn([], [tx.put(self.keys.producer_epoch(pid), b"0", lease=lease)])
        return pid, 0

    async def _expiring_lease(self):
        """The lease of keys that expire with producer_expiry_ms of disuse (producer epochs,
        producer states, the sweeper's fences): a new one each bucket (an hour, or the expiry if
        shorter), each living the expiry past its bucket, so a key put on it lives at least the
        expiry and at most a bucket longer. One lease grant an hour, however many keys."""
        now = time.monotonic()
        expiry_s = max(self.settings.producer_expiry_ms // 1000, 1)
        bucket_s = min(3600, expiry_s)
        if self._expiring_lease_obj is None or now - self._expiring_lease_at > bucket_s:
            ttl = expiry_s + bucket_s
            self._expiring_lease_obj = await asyncio.wait_for(self._client.lease(ttl), self.settings.timeout)
            self._expiring_lease_at = now
            self.ops += 1
        return self._expiring_lease_obj

    async def _allocate_producer_ids(self) -> None:
        tx = self._client.transactions
        key = self.keys.producer_ids
        for _ in range(self.settings.commit_attempts):
            got = await self._client.get(key)
            self.ops += 1
            current = int(got.value) if got is not None else 0
            compare = [tx.mod(key) == got.mod_revision] if got is not None else [tx.create(key) == 0]
            ok, _ = await self._txn(compare, [tx.put(key, str(current + PRODUCER_ID_BLOCK).encode())])
            if ok:
                self._pid_next, self._pid_end = current, current + PRODUCER_ID_BLOCK
                return
        raise MetadataUnavailable("could not allocate producer ids")

    # -- housekeeping -------------------------------------------------------------------------

    async def _current_revision(self) -> int:
        """etcd's newest revision, from the header of a one-key read. (aetcd's `status()` carries
        no header: compacting from it failed on an AttributeError, logged at debug level, so the
        history was never compacted.)"""
        from aetcd import rpc

        await self._client.connect()
        self.ops += 1
        reply = await self._client.kvstub.Range(rpc.RangeRequest(key=self.keys.producer_ids, limit=1, keys_only=True), timeout=self.settings.timeout, metadata=self._client.metadata)
        return reply.header.revision

    async def _compact_history(self) -> None:
        while not self._closed:
            await asyncio.sleep(self.settings.compact_interval_s)
            try:
                target = await self._current_revision() - self.settings.keep_revisions
                if target > 0:
                    await self._client.compact(target)
                    log.info("etcd_history_compacted", extra={"revision": target})
            except asyncio.CancelledError:
                raise
            except Exception as e:  # another broker compacted further already, or etcd is away
                log.info("etcd_compact_skipped", extra={"error": repr(e)})
