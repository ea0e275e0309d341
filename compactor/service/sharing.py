"""Compactors sharing the topics (`share_topics`): every live compactor of a cluster takes its own
share of the topics, so that freshness does not wait on one process's walk over all of them.

Membership: a compactor leads a leadership of a name of its own, `compactor-members/<its id>`
(`MetadataStore.campaign`): it leads at once, its lease keeps it alive, and the live members are
the holders of that prefix (`MetadataStore.holders`). The membership is the service's
`leadership`: the service checks it between the steps of a cycle and its index swaps carry its
fence, as in the single-leader mode, so a compactor whose lease expired swaps nothing.

Assignment: a topic belongs to the member with the highest weight, a stable hash of the member's
name and the topic id (rendezvous hashing). Every compactor computes it alone from the same list,
so once their lists agree each topic has exactly one owner; a member that joins takes only the
topics it now wins, one that leaves (resigns, or dies: its lease expires) gives up only its own,
each to the member that weighs most after it.

Handover: lists are read at the start of each run (`refresh`), so for up to a run after a change
two live compactors may both work a topic (the old owner before it has read the new list). That
is safe: the Iceberg commit keeps the offsets each cycle committed and refuses a cycle whose
offsets the table holds already (commits/committer.py, CycleOverlap), so of two cycles over the same
entries one commits; the other deletes its files, and its compactor's next cycle of the topic
finishes the committed cycle's index swap (reindex.finish_last_cycle) before planning again.
Every offset is in the table once, and the index only ever points at committed cycles. A
compactor that gains topics forgets which tables it had recovered (`refresh` says so), so its
first cycle of each finishes whatever the last owner left unswapped.

Dropping deleted topics' tables (maintenance/retention.py TopicDrops) is work for one compactor of the
cluster, not per topic (a deleted topic has no owner): the holder of the single-leader mode's
"compactor" leadership does it, which each sharing compactor also campaigns for (`drops_tables`).
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Iterable

from metadata.store import Leadership, MetadataError, MetadataStore

from ..maintenance.retention import TopicDrops

log = logging.getLogger("neve.compactor.sharing")

MEMBERS = "compactor-members/"  # + a compactor's id: its membership's leadership name
LEADERSHIP = "compactor"  # the single-leader mode's leadership; in this mode, its holder drops deleted topics' tables


def weight(member: str, topic_id: uuid.UUID) -> int:
    """The member's weight for the topic: the same in every process and every Python (blake2b,
    not hash(), which is salted per process)."""
    return int.from_bytes(hashlib.blake2b(member.encode() + b"\0" + topic_id.bytes, digest_size=8).digest(), "big")


def owner(members: Iterable[str], topic_id: uuid.UUID) -> str | None:
    """The member that owns the topic: the highest weight (a tie, which 64 bits make unlikely, to
    the greater name); None without members."""
    return max(members, key=lambda m: (weight(m, topic_id), m), default=None)


class Sharing:
    """One compactor's membership and its share of the topics (the service's `sharing` hook)."""

    def __init__(self, metadata: MetadataStore, member_id: str) -> None:
        self.metadata = metadata
        self.member_id = member_id
        self.name = MEMBERS + member_id
        self.membership: Leadership | None = None
        self.drops: Leadership | None = None
        self.members: tuple[str, ...] = ()  # the live members' names, as last read
        self._owned: set[uuid.UUID] = set()
        self._drops_epoch: int | None = None
        self._read_failed = False

    async def start(self) -> Leadership:
        """Join: campaign for this compactor's membership (the service's `leadership`) and for the
        drops of deleted topics' tables."""
        self.membership = await self.metadata.campaign(self.name, self.member_id)
        self.drops = await self.metadata.campaign(LEADERSHIP, self.member_id)
        return self.membership

    async def stop(self) -> None:
        """Leave: the others take this compactor's topics at their next run, not a lease TTL later."""
        for leadership in (self.membership, self.drops):
            if leadership is not None:
                await leadership.resign()

    async def refresh(self) -> bool:
        """Read the live members and work out this compactor's share; True when it gained topics
        (their last owner may have left a cycle unswapped). A read that fails keeps the last list:
        a topic worked by two compactors meanwhile is safe (the module's docstring), and the swaps
        of a compactor whose membership lapsed are fenced."""
        try:
            listed = {h.name for h in await self.metadata.holders(MEMBERS)}
        except MetadataError as e:
            if not self._read_failed:
                log.warning("compactor_members_unread", extra={"error": str(e)})
            self._read_failed = True
            listed = set(self.members)
        else:
            self._read_failed = False
        leading = self.membership is not None and self.membership.is_leader()
        # This compactor's own lead counts as soon as it has it, before a read shows its key.
        members = tuple(sorted(listed | {self.name} if leading else listed - {self.name}))
        topics = {info.topic_id: info for info in self.metadata.topics().values()}
        owned = {t for t in topics if leading and owner(members, t) == self.name}
        gained, lost = owned - self._owned, self._owned - owned
        if gained or lost or members != self.members:
            log.info(
                "compactor_share_changed",
                extra={"member": self.name, "members": len(members), "topics": len(owned), "gained": len(gained), "lost": len(lost), "member_names": ",".join(members)},
            )
        self.members, self._owned = members, owned
        return bool(gained)

    def owns(self, topic_id: uuid.UUID) -> bool:
        """Whether this compactor works the topic, by the list of the last `refresh`."""
        return topic_id in self._owned

    def drops_tables(self, drops: TopicDrops) -> bool:
        """Whether this compactor drops deleted topics' tables now (it holds "compactor"). A lead
        taken again starts `drops` afresh: topics deleted while another held it are found by
        their tables' marks, as at a compactor's start."""
        if self.drops is None or not self.drops.is_leader():
            return False
        if self.drops.epoch != self._drops_epoch:
            drops.restart()
            self._drops_epoch = self.drops.epoch
        return True
