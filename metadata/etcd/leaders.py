"""Named leaderships on etcd (`MetadataStore.campaign`): the holder's key `leaders/<name>`, put only
if absent and on a lease of the holder's own, which it keeps alive while it leads."""

from __future__ import annotations

import asyncio
import logging
import time
from urllib.parse import unquote

from ..store import Holder, Leadership

log = logging.getLogger("neve.metadata.etcd")


class _Leaders:
    """Leaderships, mixed into EtcdMetadataStore: each campaign is one of the store's `_tasks`, so
    closing the store ends it (and revokes its lease). Uses the store's `keys`, `settings`,
    `_client`, `ops`, `_txn`, `_tasks` and `_closed`."""

    async def campaign(self, name: str, holder: str) -> Leadership:
        leadership = Leadership(name, holder)
        task = asyncio.create_task(self._campaign(leadership))
        self._tasks.append(task)

        async def resign() -> None:
            task.cancel()  # its last step revokes the lease: the key goes at once
            await asyncio.wait([task], timeout=self.settings.timeout * 2)

        leadership._resign = resign
        return leadership

    async def holders(self, prefix: str) -> list[Holder]:
        # A name's key is its quoted name: quoting goes character by character, so the keys of the
        # names starting with `prefix` are those starting with the quoted prefix. A key lives on its
        # holder's lease: one whose lease expired or was revoked is gone from the range.
        root = self.keys.leader("")
        found = await self._read(self._client.get_prefix(self.keys.leader(prefix)))
        return sorted(Holder(unquote(kv.key[len(root) :].decode()), bytes(kv.value).decode(), kv.create_revision) for kv in found)

    async def _campaign(self, leadership: Leadership) -> None:
        # Every third of the lease's TTL: keep the lease alive, and, not leading, put the key if it
        # is absent (one transaction, whose failure branch reads the key: a put whose answer was
        # lost shows up as the key on this lease). A lead is assured for a TTL from the moment the
        # refresh or put was sent, which is before etcd started the lease's TTL again: the holder
        # sees its lead end no later than etcd expires the key for another holder to take.
        key, holder = self.keys.leader(leadership.name), leadership.holder.encode()
        ttl = self.settings.lease_ttl
        tx = self._client.transactions
        lease = None
        failing = None  # the last round's failure, logged once
        try:
            while not self._closed:
                sent = time.monotonic()
                try:
                    if lease is not None:
                        reply = await asyncio.wait_for(lease.refresh(), self.settings.timeout)
                        self.ops += 1
                        if getattr(reply, "TTL", 1) <= 0:
                            lease = None  # expired: its key is gone, another holder may lead already
                            self._lost(leadership, "lease expired")
                    if lease is None:
                        lease = await asyncio.wait_for(self._client.lease(ttl), self.settings.timeout)
                        self.ops += 1
                    if leadership.is_leader():
                        leadership._lead(sent + ttl)
                    else:
                        # The key's create revision numbers this lead (its epoch, `Leadership.fence`):
                        # a lead taken again, by anyone, is a new key with a higher one.
                        ok, responses = await self._txn([tx.create(key) == 0], [tx.put(key, holder, lease=lease), tx.get(key)], [tx.get(key)])
                        mine = [kv for _value, kv in responses[-1] if kv.lease == lease.id]
                        if mine:
                            leadership._lead(sent + ttl, epoch=mine[0].create_revision)
                            log.info("leadership_taken", extra={"leadership": leadership.name, "holder": leadership.holder, "epoch": mine[0].create_revision})
                    failing = None
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # etcd away: the lead lapses with its TTL, the campaign goes on
                    if leadership.is_leader():
                        log.warning("leadership_renewal_failed", extra={"leadership": leadership.name, "error": repr(e)})
                    elif failing != repr(e):  # a line per kind of failure, not per round
                        log.info("leadership_campaign_failed", extra={"leadership": leadership.name, "error": repr(e)})
                    failing = repr(e)
                await asyncio.sleep(ttl / 3)
        finally:
            leadership._lose()
            if lease is not None:
                try:
                    await asyncio.wait_for(lease.revoke(), self.settings.timeout)
                except Exception as e:  # it expires with its TTL instead
                    log.info("leadership_revoke_failed", extra={"leadership": leadership.name, "error": repr(e)})

    def _lost(self, leadership: Leadership, reason: str) -> None:
        if leadership.is_leader():
            log.warning("leadership_lost", extra={"leadership": leadership.name, "holder": leadership.holder, "reason": reason})
        leadership._lose()
