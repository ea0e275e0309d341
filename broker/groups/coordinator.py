"""The group coordinator: which broker owns a group, and the group operations handlers call.

Ownership: a group is coordinated by one live broker, picked by rendezvous hashing of the group id
over the live brokers of the group's home zone (all live brokers when it has none, or none of them
is live). A group's live state (members, generation, pending joins) is held by its coordinator
alone, so every member's requests must reach the same broker whatever its own zone: the product
card's "hash of (group, zone)" would give each zone its own coordinator and split the group. A
zoned member is sent to a broker of its own zone, which relays its group requests to this one
(broker/forwarding.py), so clients stay in their zone and only broker-to-broker group bytes cross. The home
zone is the zone of the first client that looked the group up, recorded once in the metadata
store by compare-and-write (`HOME_ZONES`, never changed after), so every broker, asked by members
of any zone, names the same coordinator; a group whose members are all in one zone is coordinated
there. In a cluster where no live broker has a zone nothing is recorded and every live broker is
a candidate. When a broker dies its lease expires, the live set shrinks, and only its groups move.
A broker asked about a group it does not own answers NOT_COORDINATOR, and clients look the
coordinator up again.

A group id holds one type of group: a classic group (`group.py`: JoinGroup/SyncGroup) or a
KIP-848 consumer group (`consumer_group.py`: ConsumerGroupHeartbeat); an empty group changes type
when the other protocol's first request arrives, a group with members refuses the other protocol.

One owner per group: all state of a group is mutated only here, in the event loop. The first
request for a group loads its stored state (`metadata.load_group`); every new generation and every
new set of assignments is stored again (`save_group`, writes kept in order per group), so a new
coordinator carries on where a dead one stopped. Committed offsets go straight to the metadata
store and are read back from it, never from a cache.

Ownership is re-checked whenever the live broker set changes, seen on the next request; a group
that moved away and back between two requests keeps the state this broker had (members then see
ILLEGAL_GENERATION or UNKNOWN_MEMBER_ID and rejoin), unless this broker's registration lapsed in
between (a pause past its lease: then every group is read again, and until this broker registers
again the store refuses its group writes, `metadata/etcd/groups.py`), so a coordinator that
resumes after its groups moved writes neither its stale state nor a commit that waited in its
socket.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence

from kio.schema.errors import ErrorCode

from metadata.model import CommittedOffset
from metadata.store import MetadataError, TopicPartition

from ..locality import brokers_for_zone
from . import consumer_group, state
from .consumer_group import ConsumerGroup, Heartbeat, HeartbeatResult
from .group import Group, GroupError, GroupState, JoinResult, SyncResult

log = logging.getLogger("neve.broker.groups")

# Kafka's group.min/max.session.timeout.ms defaults.
MIN_SESSION_TIMEOUT_MS = 6_000
MAX_SESSION_TIMEOUT_MS = 1_800_000
# Small keys of the metadata store (its compare-and-write items): a group's home zone, "" for none.
HOME_ZONES = "group-zones/"


def _weight(group_id: str, node_id: int) -> bytes:
    return hashlib.blake2b(f"group\0{group_id}\0{node_id}".encode(), digest_size=8).digest()


def coordinator_for(group_id: str, brokers: Sequence, home: str | None = None):
    """The live broker coordinating `group_id`: rendezvous hashing over the live brokers of its
    home zone, or over every live broker when it has none or none of them is live."""
    return max(brokers_for_zone(brokers, home or None), key=lambda b: _weight(group_id, b.node_id))


class GroupCoordinator:
    def __init__(
        self,
        metadata,
        live_brokers: Callable[[], Sequence],
        node_id: Callable[[], int],
        *,
        min_session_timeout_ms: int = MIN_SESSION_TIMEOUT_MS,
        max_session_timeout_ms: int = MAX_SESSION_TIMEOUT_MS,
        consumer_session_timeout_ms: int = consumer_group.SESSION_TIMEOUT_MS,
        consumer_heartbeat_interval_ms: int = consumer_group.HEARTBEAT_INTERVAL_MS,
        drop_commit_every: int = 0,
    ) -> None:
        self.metadata = metadata
        self.live_brokers = live_brokers
        self.node_id = node_id
        self.min_session_timeout_ms = min_session_timeout_ms
        self.max_session_timeout_ms = max_session_timeout_ms
        self.consumer_session_timeout_ms = consumer_session_timeout_ms
        self.consumer_heartbeat_interval_ms = consumer_heartbeat_interval_ms
        self.groups: dict[str, Group | ConsumerGroup] = {}
        self._loading: dict[str, asyncio.Future] = {}
        self._save_locks: dict[str, asyncio.Lock] = {}
        self._saves: set[asyncio.Task] = set()
        self._live_seen: tuple[int, ...] = ()
        self._registration_seen = 0  # the store's registration_revision when the groups were last checked
        self._homes: dict[str, str] = {}  # group id -> home zone ("": none), as stored (never changes)
        self._drop_commit_every = drop_commit_every  # a planted bug ([faults] offset_commit_dropped_every)
        self._commits_accepted = 0  # counted for that plant alone

    # -- ownership ----------------------------------------------------------------------------------

    def coordinator(self, group_id: str):
        """The group's coordinator (its home zone must be known here: see `place`)."""
        live = self.live_brokers()
        return coordinator_for(group_id, live, self._homes.get(group_id) if _zoned(live) else None)

    async def place(self, group_id: str, zone: str | None) -> None:
        """Learn the group's home zone, recording `zone` (the asking client's, None for none) if
        the group has none yet. Nothing to learn while no live broker has a zone."""
        if group_id in self._homes or not _zoned(self.live_brokers()):
            return
        key = HOME_ZONES + group_id
        try:
            item = await self.metadata.registry_get(key)
            if item is None and not await self.metadata.registry_write({key: (zone or "").encode()}, {key: 0}):
                item = await self.metadata.registry_get(key)  # another broker recorded it first
        except MetadataError as e:
            raise GroupError(ErrorCode.coordinator_not_available, str(e)) from e
        home = self._homes[group_id] = (zone or "") if item is None else item.value.decode()
        if zone is not None and home != zone:  # this broker's first asker is a member from elsewhere
            log.info("group_home_elsewhere", extra={"group": group_id, "home_zone": home, "client_zone": zone})

    async def _place_listed(self, names: Iterable[str]) -> None:
        """Learn the recorded home zones of `names` in one read (ListGroups)."""
        if not _zoned(self.live_brokers()) or all(name in self._homes for name in names):
            return
        for item in await self.metadata.registry_items(HOME_ZONES):
            self._homes.setdefault(item.key[len(HOME_ZONES) :], item.value.decode())

    def owns(self, group_id: str) -> bool:
        return self.coordinator(group_id).node_id == self.node_id()

    def _drop_moved_groups(self) -> None:
        registration = self.metadata.registration_revision()
        if registration != self._registration_seen:
            # registered again (its lease lapsed: a pause, a cut-off): what this broker holds of
            # its groups may have moved away and back meanwhile; each is read again from the store
            if self.groups:
                log.info("groups_dropped_on_registration", extra={"groups": len(self.groups)})
                for group in self.groups.values():
                    group.shutdown(ErrorCode.not_coordinator)
                self.groups.clear()
            self._registration_seen = registration
        live = tuple(sorted(b.node_id for b in self.live_brokers()))
        if live == self._live_seen:
            return
        self._live_seen = live
        for group_id in [g for g in self.groups if not self.owns(g)]:
            log.info("group_moved", extra={"group": group_id, "coordinator": self.coordinator(group_id).node_id})
            self.groups.pop(group_id).shutdown(ErrorCode.not_coordinator)

    async def check_owner(self, group_id: str) -> None:
        if not group_id:
            raise GroupError(ErrorCode.invalid_group_id, "empty group id")
        await self.place(group_id, None)
        self._drop_moved_groups()
        if not self.owns(group_id):
            # held from before its home zone was known here (the cluster gained zones): let it go
            stale = self.groups.pop(group_id, None)
            if stale is not None:
                stale.shutdown(ErrorCode.not_coordinator)
            raise GroupError(ErrorCode.not_coordinator)

    async def group(self, group_id: str, create: bool = False) -> Group | ConsumerGroup | None:
        """The group's live state, loaded from the store the first time; None if it has no stored
        state (and `create` is false). Raises GroupError(NOT_COORDINATOR) if another broker owns it."""
        await self.check_owner(group_id)
        if group_id in self.groups:
            return self.groups[group_id]
        if group_id not in self._loading:
            self._loading[group_id] = asyncio.ensure_future(self._load(group_id))
        try:
            group = await asyncio.shield(self._loading[group_id])
        finally:
            self._loading.pop(group_id, None)
        if group is None and create:
            group = self.groups.setdefault(group_id, Group(group_id, self._on_change))
        return group

    async def _load(self, group_id: str) -> Group | None:
        try:
            data = await self.metadata.load_group(group_id)
        except MetadataError as e:
            raise GroupError(ErrorCode.coordinator_not_available, str(e)) from e
        if group_id in self.groups:
            return self.groups[group_id]
        if data is None:
            return None
        try:
            empty = self._new_consumer_group(group_id) if state.group_type(data) == ConsumerGroup.TYPE else Group(group_id, self._on_change)
            group = state.decode(group_id, data, empty)
        except (ValueError, KeyError, TypeError) as e:
            # Unreadable (a newer version, or damaged): start afresh; members rejoin, offsets are kept apart.
            log.error("group_state_unreadable", extra={"group": group_id, "error": repr(e)})
            return None
        if not self.owns(group_id):
            raise GroupError(ErrorCode.not_coordinator)
        self.groups[group_id] = group
        group.start_sessions()
        if isinstance(group, ConsumerGroup):
            log.info("group_loaded", extra={"group": group_id, "type": ConsumerGroup.TYPE, "epoch": group.group_epoch, "members": len(group.members), "state": group.state_name})
        else:
            log.info("group_loaded", extra={"group": group_id, "generation": group.generation, "members": len(group.members), "state": group.state.value})
        return group

    def _new_consumer_group(self, group_id: str) -> ConsumerGroup:
        return ConsumerGroup(group_id, self._on_change, session_timeout_ms=self.consumer_session_timeout_ms, heartbeat_interval_ms=self.consumer_heartbeat_interval_ms)

    def _replace(self, old: Group | ConsumerGroup, new: Group | ConsumerGroup) -> None:
        """An empty group of one type becomes a group of the other type (as Kafka converts them)."""
        old.shutdown(ErrorCode.coordinator_not_available)
        self.groups[new.group_id] = new
        log.info("group_type_changed", extra={"group": new.group_id, "type": _type(new)})

    # -- persistence ----------------------------------------------------------------------------------

    def _on_change(self, group: Group) -> None:
        data = None if _dead(group) else state.encode(group)
        task = asyncio.ensure_future(self._save(group.group_id, data))
        self._saves.add(task)
        task.add_done_callback(self._saves.discard)

    async def _save(self, group_id: str, data: bytes | None) -> None:
        lock = self._save_locks.setdefault(group_id, asyncio.Lock())
        async with lock:  # FIFO: snapshots reach the store in the order they were taken
            if not self.owns(group_id) or self.metadata.registration_revision() != self._registration_seen:
                return  # the new owner's state must not be overwritten by ours (nor by what we held before registering again)
            try:
                await self.metadata.save_group(group_id, data)
            except MetadataError as e:
                log.warning("group_save_failed", extra={"group": group_id, "error": str(e)})

    async def flush(self) -> None:
        """Wait for every pending state write (tests, shutdown)."""
        while self._saves:
            await asyncio.gather(*list(self._saves), return_exceptions=True)

    def close(self) -> None:
        for group in self.groups.values():
            group.shutdown(ErrorCode.not_coordinator)
        self.groups.clear()

    # -- membership ----------------------------------------------------------------------------------

    async def join(self, group_id: str, member_id: str, instance_id: str | None, protocol_type: str, protocols, session_timeout_ms: int, rebalance_timeout_ms: int, client_id: str, client_host: str, require_known_member_id: bool):
        if not self.min_session_timeout_ms <= session_timeout_ms <= self.max_session_timeout_ms:
            return JoinResult(ErrorCode.invalid_session_timeout, member_id=member_id)
        group = await self.group(group_id, create=True)
        if isinstance(group, ConsumerGroup):
            if not group.is_empty:
                return JoinResult(ErrorCode.inconsistent_group_protocol, member_id=member_id)  # a consumer-protocol group
            self._replace(group, group := Group(group_id, self._on_change))
        fut = group.join(member_id, instance_id, protocol_type, list(protocols), session_timeout_ms, rebalance_timeout_ms, client_id, client_host, require_known_member_id)
        return await fut

    async def sync(self, group_id: str, generation: int, member_id: str, instance_id: str | None, protocol_type: str | None, protocol_name: str | None, assignments: Mapping[str, bytes]):
        group = await self.group(group_id)
        if group is None or isinstance(group, ConsumerGroup):
            return SyncResult(ErrorCode.unknown_member_id)
        return await group.sync(generation, member_id, instance_id, protocol_type, protocol_name, dict(assignments))

    async def heartbeat(self, group_id: str, generation: int, member_id: str, instance_id: str | None) -> int:
        group = await self.group(group_id)
        return ErrorCode.unknown_member_id if group is None or isinstance(group, ConsumerGroup) else group.heartbeat(generation, member_id, instance_id)

    async def leave(self, group_id: str, members: Iterable[tuple[str, str | None]]) -> list[int]:
        group = await self.group(group_id)
        return [ErrorCode.unknown_member_id if group is None or isinstance(group, ConsumerGroup) else group.leave(m, i) for m, i in members]

    async def consumer_heartbeat(self, group_id: str, heartbeat: Heartbeat) -> HeartbeatResult:
        """A KIP-848 ConsumerGroupHeartbeat. A non-empty classic group of that id answers
        GROUP_ID_NOT_FOUND (no online upgrade); an empty one becomes a consumer group."""
        group = await self.group(group_id)
        if isinstance(group, Group):
            if not group.is_empty or group.pending:
                return HeartbeatResult(ErrorCode.group_id_not_found, f"Group {group_id} is not a consumer group.", heartbeat.member_id or None)
            self._replace(group, group := self._new_consumer_group(group_id))
        elif group is None:
            if heartbeat.member_epoch != 0:
                return HeartbeatResult(ErrorCode.unknown_member_id, f"Group {group_id} has no member {heartbeat.member_id}.", heartbeat.member_id or None)
            group = self._new_consumer_group(group_id)
            result = group.heartbeat(heartbeat, self.metadata.topics())
            if result.error == ErrorCode.none:  # a refused first heartbeat leaves no empty group behind
                self.groups.setdefault(group_id, group)
            return result
        return group.heartbeat(heartbeat, self.metadata.topics())

    async def describe_consumer_group(self, group_id: str) -> ConsumerGroup:
        """ConsumerGroupDescribe: GROUP_ID_NOT_FOUND unless it is a consumer-protocol group."""
        group = await self.group(group_id)
        if not isinstance(group, ConsumerGroup) or group.deleted:
            raise GroupError(ErrorCode.group_id_not_found, f"Group {group_id} is not a consumer group.")
        return group

    # -- offsets ----------------------------------------------------------------------------------------

    async def commit_offsets(self, group_id: str, generation: int, member_id: str, instance_id: str | None, offsets: Mapping[TopicPartition, CommittedOffset]) -> dict[TopicPartition, int]:
        """Each partition's answer: the group's (the member and its generation or epoch), or, in a
        KIP-848 group, STALE_MEMBER_EPOCH for a partition the member no longer holds."""
        group, code = await self._commit_check(group_id, generation, member_id, instance_id)
        codes = dict.fromkeys(offsets, code)
        if code == ErrorCode.none and isinstance(group, ConsumerGroup):
            refused = group.not_held(member_id, offsets)
            if refused:
                log.info("offset_commit_refused", extra={"group": group_id, "member": member_id, "partitions": len(refused), "reason": "not held by the member"})
            codes.update(dict.fromkeys(refused, ErrorCode.stale_member_epoch))
        accepted = {tp: offset for tp, offset in offsets.items() if codes[tp] == ErrorCode.none}
        if accepted and self._drop_commit_every and self._commit_dropped(group_id, accepted):
            return codes
        if accepted:
            try:
                stored = await self.metadata.commit_offsets(group_id, accepted)
            except MetadataError as e:
                log.warning("offset_commit_failed", extra={"group": group_id, "error": str(e)})
                codes.update(dict.fromkeys(accepted, ErrorCode.coordinator_not_available))
            else:
                if not stored:  # this broker's registration lapsed: the group may be another's now
                    log.warning("offset_commit_fenced", extra={"group": group_id})
                    codes.update(dict.fromkeys(accepted, ErrorCode.not_coordinator))
        return codes

    def _commit_dropped(self, group_id: str, accepted: Mapping[TopicPartition, CommittedOffset]) -> bool:
        """The offset_commit_dropped plant (a deliberate bug, test only): every Nth commit this
        coordinator accepts is not stored, yet answered with no error (the caller returns the
        codes as they are): the group keeps its previous offsets, behind the acknowledged ones."""
        self._commits_accepted += 1
        if self._commits_accepted % self._drop_commit_every:
            return False
        log.warning("planted_bug_offset_commit_dropped", extra={"group": group_id, "partitions": len(accepted)})
        return True

    async def _commit_check(self, group_id: str, generation: int, member_id: str, instance_id: str | None) -> tuple[Group | ConsumerGroup | None, int]:
        """The group and the answer for a commit by this member at this generation (or epoch)."""
        group = await self.group(group_id)
        if group is not None:
            return group, group.validate_commit(generation, member_id, instance_id)
        return None, ErrorCode.unknown_member_id if (generation >= 0 or member_id or instance_id is not None) else ErrorCode.none

    async def check_commit(self, group_id: str, generation: int, member_id: str, instance_id: str | None) -> int:
        """A transactional offset commit's answer before the transaction keeps its offsets
        (KIP-447: the member and its generation, as OffsetCommit checks them). Raises
        GroupError(NOT_COORDINATOR) if another broker owns the group."""
        return (await self._commit_check(group_id, generation, member_id, instance_id))[1]

    async def fetch_offsets(self, group_id: str, member_id: str | None = None, member_epoch: int = -1) -> dict[TopicPartition, CommittedOffset]:
        """Committed offsets; a member of a consumer-protocol group naming itself (OffsetFetch v9)
        must give its current epoch (STALE_MEMBER_EPOCH, UNKNOWN_MEMBER_ID otherwise)."""
        await self.check_owner(group_id)
        if member_id is not None:
            group = await self.group(group_id)
            if isinstance(group, ConsumerGroup):
                code = group.validate_fetch(member_id, member_epoch)
                if code != ErrorCode.none:
                    raise GroupError(code)
        try:
            return await self.metadata.fetch_offsets(group_id)
        except MetadataError as e:
            raise GroupError(ErrorCode.coordinator_not_available, str(e)) from e

    async def delete_offsets(self, group_id: str, partitions: list[TopicPartition]) -> None:
        await self.check_owner(group_id)
        try:
            await self.metadata.delete_offsets(group_id, partitions)
        except MetadataError as e:
            raise GroupError(ErrorCode.coordinator_not_available, str(e)) from e

    # -- admin ------------------------------------------------------------------------------------------

    async def exists(self, group_id: str) -> bool:
        group = await self.group(group_id)
        return group is not None or bool(await self.fetch_offsets(group_id))

    async def describe(self, group_id: str) -> Group | ConsumerGroup | None:
        """The group, or None when nothing is known of it (Kafka answers Dead)."""
        group = await self.group(group_id)
        if group is None and await self.fetch_offsets(group_id):
            return Group(group_id)  # offsets only: an Empty group with no protocol
        return group

    async def list(self) -> list[tuple[str, str, str]]:
        """(group id, protocol type, state) of every group this broker coordinates."""
        return [(name, protocol_type, group_state) for name, protocol_type, group_state, _ in await self.listing()]

    async def listing(self) -> list[tuple[str, str, str, str]]:
        """(group id, protocol type, state, group type "classic"/"consumer") of every group this
        broker coordinates."""
        try:
            names = await self.metadata.list_groups()
            names = sorted(set(names) | set(self.groups))
            await self._place_listed(names)
        except MetadataError as e:
            raise GroupError(ErrorCode.coordinator_not_available, str(e)) from e
        out = []
        for name in names:
            if not self.owns(name):
                continue
            try:
                group = await self.group(name)
            except GroupError:
                continue
            if group is None:
                out.append((name, "", GroupState.EMPTY.value, "classic"))
            elif isinstance(group, ConsumerGroup):
                if not group.deleted:
                    out.append((name, ConsumerGroup.TYPE, group.state_name, ConsumerGroup.TYPE))
            elif group.state is not GroupState.DEAD:
                out.append((name, group.protocol_type or "", group.state.value, "classic"))
        return out

    async def delete(self, group_id: str) -> int:
        group = await self.group(group_id)
        if group is not None and not group.is_empty:
            return ErrorCode.non_empty_group
        if group is None and not await self.fetch_offsets(group_id):
            return ErrorCode.group_id_not_found
        try:
            await self.metadata.delete_offsets(group_id)
            if group is not None:
                if isinstance(group, ConsumerGroup):
                    group.deleted = True
                else:
                    group.state = GroupState.DEAD
                group.shutdown(ErrorCode.coordinator_not_available)
                self.groups.pop(group_id, None)
                self._on_change(group)
                await self.flush()
        except MetadataError as e:
            raise GroupError(ErrorCode.coordinator_not_available, str(e)) from e
        return ErrorCode.none


def _zoned(brokers: Sequence) -> bool:
    return any(b.zone for b in brokers)


def _dead(group: Group | ConsumerGroup) -> bool:
    return group.deleted if isinstance(group, ConsumerGroup) else group.state is GroupState.DEAD


def _type(group: Group | ConsumerGroup) -> str:
    return ConsumerGroup.TYPE if isinstance(group, ConsumerGroup) else "classic"
