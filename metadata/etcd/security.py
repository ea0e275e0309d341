"""The etcd store's part for the security family: its items are keys under `security/`, loaded
with the view and kept current by the root's watch (follower.py), so every broker reads them from
memory; a write is one transaction."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from ..store import checked_security_writes

log = logging.getLogger("neve.metadata.etcd")


class _Security:
    """The security family, mixed into EtcdMetadataStore. Uses the store's `keys`, `_client`,
    `_txn`, `_view_reaches`, `settings`, and the view's `_security` and `_security_version` (which
    the follower keeps)."""

    async def security_write(self, writes: Mapping[str, bytes | None]) -> None:
        checked = checked_security_writes(writes)
        if not checked:
            return
        tx = self._client.transactions
        success = [tx.delete(self.keys.security(key)) if value is None else tx.put(self.keys.security(key), value) for key, value in checked.items()]
        _ok, responses = await self._txn([], success)
        first = responses[0]  # a put's or a delete's: each carries the transaction's revision
        revision = getattr(first, first.WhichOneof("response")).header.revision
        # Seen here once written (a CreateAcls then a DescribeAcls on one broker): through the
        # watch, never applied ahead of it, where an older event still on its way (another
        # broker's write of the same key) would undo it.
        if not await self._view_reaches(revision, self.settings.timeout):
            log.warning("etcd_security_view_behind", extra={"revision": revision, "view_revision": self._revision})
