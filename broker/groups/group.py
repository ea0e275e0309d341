"""One consumer group's classic-protocol state machine, as Kafka's GroupCoordinator runs it:
Empty -> PreparingRebalance -> CompletingRebalance -> Stable (and Dead once deleted).

A rebalance waits for every known member to (re)join, up to the rebalance timeout; members that did
not rejoin are dropped. The first joiner stays leader when it can; the leader gets the member list,
and its SyncGroup hands every member its assignment. Members that stop heartbeating for their
session timeout are evicted. Static members (group.instance.id) keep their assignment across a
restart: a rejoin with a new member id replaces the old one without a rebalance of the others.

Everything here runs in the event loop and is synchronous except the futures a pending JoinGroup
or SyncGroup waits on; timers are loop handles. `on_change` is called after each transition that
must be stored (a new generation, new assignments); the coordinator persists it.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

log = logging.getLogger("neve.broker.groups")


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


GROUP_AUTHORIZATION_FAILED = int(ErrorCode.group_authorization_failed)  # ACLs refuse the principal the group


class GroupError(Exception):
    """A group-level Kafka error for the whole request."""

    def __init__(self, code: int, message: str | None = None) -> None:
        super().__init__(message or str(code))
        self.code = code


@dataclass(frozen=True, slots=True)
class JoinResult:
    error: int
    generation: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    member_id: str = ""
    members: tuple[tuple[str, str | None, bytes], ...] = ()  # (member id, instance id, metadata), leader only


@dataclass(frozen=True, slots=True)
class SyncResult:
    error: int
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclass(eq=False)
class Member:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]  # in the member's order of preference
    assignment: bytes = b""
    join_waiter: asyncio.Future | None = None
    sync_waiter: asyncio.Future | None = None
    session_timer: asyncio.TimerHandle | None = field(default=None, repr=False)

    def metadata_for(self, protocol: str | None) -> bytes:
        return next((m for name, m in self.protocols if name == protocol), b"")

    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]


def _resolve(fut: asyncio.Future | None, result) -> None:
    if fut is not None and not fut.done():
        fut.set_result(result)


class Group:
    def __init__(self, group_id: str, on_change: Callable[[Group], None] = lambda g: None) -> None:
        self.group_id = group_id
        self.state = GroupState.EMPTY
        self.generation = 0
        self.protocol_type: str | None = None
        self.protocol_name: str | None = None
        self.leader: str | None = None
        self.members: dict[str, Member] = {}
        self.static: dict[str, str] = {}  # instance id -> member id
        self.pending: dict[str, asyncio.TimerHandle] = {}  # ids handed out with MEMBER_ID_REQUIRED
        self._join_timer: asyncio.TimerHandle | None = None
        self._on_change = on_change

    # -- queries ----------------------------------------------------------------------------------

    @property
    def is_empty(self) -> bool:
        return not self.members

    def subscribed_protocols(self) -> set[str]:
        """Protocols every member supports (the candidates a new member must share one of)."""
        sets = [set(m.protocol_names()) for m in self.members.values()]
        return set.intersection(*sets) if sets else set()

    def _loop(self) -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    # -- JoinGroup --------------------------------------------------------------------------------

    def join(
        self,
        member_id: str,
        instance_id: str | None,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        client_id: str,
        client_host: str,
        require_known_member_id: bool,
    ) -> asyncio.Future:
        """Returns a future of JoinResult: already done for an immediate answer, pending while a
        rebalance waits for the other members."""
        fut = self._loop().create_future()
        if self.state is GroupState.DEAD:
            fut.set_result(JoinResult(ErrorCode.coordinator_not_available, member_id=member_id))
            return fut
        if not protocol_type or not protocols:
            fut.set_result(JoinResult(ErrorCode.inconsistent_group_protocol, member_id=member_id))
            return fut
        if self.members and (protocol_type != self.protocol_type or not self.subscribed_protocols() & {n for n, _ in protocols}):
            fut.set_result(JoinResult(ErrorCode.inconsistent_group_protocol, member_id=member_id))
            return fut
        args = (instance_id, protocol_type, protocols, session_timeout_ms, rebalance_timeout_ms, client_id, client_host)
        if not member_id:
            if instance_id is not None and instance_id in self.static:
                return self._rejoin_static(fut, *args)
            new_id = f"{instance_id or client_id or 'member'}-{uuid.uuid4()}"
            if require_known_member_id and instance_id is None:
                # KIP-394: hand out an id first, so a client that dies mid-join leaves no ghost member
                self.pending[new_id] = self._loop().call_later(session_timeout_ms / 1000, self._expire_pending, new_id)
                fut.set_result(JoinResult(ErrorCode.member_id_required, member_id=new_id))
                return fut
            self._add_member(new_id, fut, *args)
            return fut
        if member_id in self.pending:
            self.pending.pop(member_id).cancel()
            self._add_member(member_id, fut, *args)
            return fut
        member = self.members.get(member_id)
        if instance_id is not None and self.static.get(instance_id, member_id) != member_id:
            fut.set_result(JoinResult(ErrorCode.fenced_instance_id, member_id=member_id))
            return fut
        if member is None:
            fut.set_result(JoinResult(ErrorCode.unknown_member_id, member_id=member_id))
            return fut
        changed = member.protocols != protocols
        self._update(member, *args)
        if self.state is GroupState.PREPARING_REBALANCE:
            self._await_join(member, fut)
            self._maybe_complete_join()
        elif self.state is GroupState.COMPLETING_REBALANCE and not changed:
            fut.set_result(self._join_result(member))  # the client lost our answer: repeat it
        elif self.state is GroupState.STABLE and not changed and member_id != self.leader:
            fut.set_result(self._join_result(member))
        else:
            self._await_join(member, fut)
            self._prepare_rebalance()
        return fut

    def _add_member(self, member_id, fut, instance_id, protocol_type, protocols, session_ms, rebalance_ms, client_id, client_host) -> None:
        member = Member(member_id, instance_id, client_id, client_host, session_ms, rebalance_ms, protocol_type, list(protocols))
        self.members[member_id] = member
        if instance_id is not None:
            self.static[instance_id] = member_id
        if self.protocol_type is None or len(self.members) == 1:
            self.protocol_type = protocol_type
        self._await_join(member, fut)
        if self.state is GroupState.PREPARING_REBALANCE:
            self._maybe_complete_join()
        else:
            self._prepare_rebalance()

    def _update(self, member, instance_id, protocol_type, protocols, session_ms, rebalance_ms, client_id, client_host) -> None:
        member.protocols = list(protocols)
        member.session_timeout_ms = session_ms
        member.rebalance_timeout_ms = rebalance_ms
        member.client_id = client_id
        member.client_host = client_host

    def _rejoin_static(self, fut, instance_id, protocol_type, protocols, session_ms, rebalance_ms, client_id, client_host) -> asyncio.Future:
        """A static member restarted: it takes its old place under a new member id (the old id is
        fenced). In a stable group with unchanged protocols the others see no rebalance."""
        old_id = self.static[instance_id]
        old = self.members.pop(old_id)
        self._cancel_session(old)
        _resolve(old.join_waiter, JoinResult(ErrorCode.fenced_instance_id, member_id=old_id))
        _resolve(old.sync_waiter, SyncResult(ErrorCode.fenced_instance_id))
        new_id = f"{instance_id}-{uuid.uuid4()}"
        member = Member(new_id, instance_id, client_id, client_host, session_ms, rebalance_ms, protocol_type, list(protocols), assignment=old.assignment)
        self.members[new_id] = member
        self.static[instance_id] = new_id
        was_leader = self.leader == old_id
        if was_leader:
            self.leader = new_id
        if self.state is GroupState.STABLE and old.protocols == member.protocols:
            self._touch(member)
            self._on_change(self)
            # Answered as a follower (the old leader id) so it just fetches its kept assignment.
            fut.set_result(JoinResult(ErrorCode.none, self.generation, self.protocol_type, self.protocol_name, old_id if was_leader else (self.leader or ""), new_id))
            return fut
        self._await_join(member, fut)
        if self.state is GroupState.PREPARING_REBALANCE:
            self._maybe_complete_join()
        else:
            self._prepare_rebalance()
        return fut

    def _await_join(self, member: Member, fut: asyncio.Future) -> None:
        _resolve(member.join_waiter, JoinResult(ErrorCode.rebalance_in_progress, member_id=member.member_id))
        member.join_waiter = fut
        self._cancel_session(member)  # a member waiting in a rebalance is bounded by the rebalance timeout

    def _prepare_rebalance(self) -> None:
        if self.state is GroupState.COMPLETING_REBALANCE:
            for m in self.members.values():
                m.assignment = b""
                _resolve(m.sync_waiter, SyncResult(ErrorCode.rebalance_in_progress))
                m.sync_waiter = None
        if self.state is not GroupState.PREPARING_REBALANCE:
            log.info("group_rebalance", extra={"group": self.group_id, "generation": self.generation, "members": len(self.members)})
        self.state = GroupState.PREPARING_REBALANCE
        if self._join_timer is None:
            timeout_ms = max((m.rebalance_timeout_ms for m in self.members.values()), default=0)
            self._join_timer = self._loop().call_later(timeout_ms / 1000, self._complete_join)
        self._maybe_complete_join()

    def _maybe_complete_join(self) -> None:
        if self.state is GroupState.PREPARING_REBALANCE and all(m.join_waiter is not None for m in self.members.values()) and not self.pending:
            self._complete_join()

    def _complete_join(self) -> None:
        if self._join_timer is not None:
            self._join_timer.cancel()
            self._join_timer = None
        if self.state is not GroupState.PREPARING_REBALANCE:
            return
        for m in [m for m in self.members.values() if m.join_waiter is None]:
            log.info("group_member_dropped", extra={"group": self.group_id, "member": m.member_id, "reason": "did not rejoin in the rebalance timeout"})
            self._remove(m)
        self.generation += 1
        if not self.members:
            self.state = GroupState.EMPTY
            self.protocol_name = self.leader = None
            self._on_change(self)
            return
        self.protocol_name = self._select_protocol()
        if self.leader not in self.members:
            self.leader = next(iter(self.members))
        self.state = GroupState.COMPLETING_REBALANCE
        log.info("group_joined", extra={"group": self.group_id, "generation": self.generation, "members": len(self.members), "protocol": self.protocol_name, "pending": len(self.pending)})
        self._on_change(self)
        for m in self.members.values():
            waiter, m.join_waiter = m.join_waiter, None
            self._touch(m)
            _resolve(waiter, self._join_result(m))

    def _select_protocol(self) -> str:
        candidates = self.subscribed_protocols()
        votes: dict[str, int] = {}
        for m in self.members.values():
            choice = next(n for n in m.protocol_names() if n in candidates)
            votes[choice] = votes.get(choice, 0) + 1
        return max(votes, key=lambda n: votes[n])  # ties: the earliest-voted protocol (dict order)

    def _join_result(self, member: Member) -> JoinResult:
        members = ()
        if member.member_id == self.leader:
            members = tuple((m.member_id, m.instance_id, m.metadata_for(self.protocol_name)) for m in self.members.values())
        return JoinResult(ErrorCode.none, self.generation, self.protocol_type, self.protocol_name, self.leader or "", member.member_id, members)

    # -- SyncGroup --------------------------------------------------------------------------------

    def sync(self, generation: int, member_id: str, instance_id: str | None, protocol_type: str | None, protocol_name: str | None, assignments: dict[str, bytes]) -> asyncio.Future:
        fut = self._loop().create_future()
        code = self._check_member(member_id, instance_id, generation)
        if code == ErrorCode.none and ((protocol_type and protocol_type != self.protocol_type) or (protocol_name and protocol_name != self.protocol_name)):
            code = ErrorCode.inconsistent_group_protocol
        if code != ErrorCode.none:
            fut.set_result(SyncResult(code))
            return fut
        member = self.members[member_id]
        if self.state is GroupState.PREPARING_REBALANCE:
            fut.set_result(SyncResult(ErrorCode.rebalance_in_progress))
        elif self.state is GroupState.STABLE:
            self._touch(member)
            fut.set_result(self._sync_result(member))
        else:  # CompletingRebalance: followers wait for the leader's assignments
            self._touch(member)
            _resolve(member.sync_waiter, SyncResult(ErrorCode.rebalance_in_progress))
            member.sync_waiter = fut
            if member_id == self.leader:
                for m in self.members.values():
                    m.assignment = assignments.get(m.member_id, b"")
                self.state = GroupState.STABLE
                self._on_change(self)
                for m in self.members.values():
                    waiter, m.sync_waiter = m.sync_waiter, None
                    _resolve(waiter, self._sync_result(m))
        return fut

    def _sync_result(self, member: Member) -> SyncResult:
        return SyncResult(ErrorCode.none, member.assignment, self.protocol_type, self.protocol_name)

    # -- Heartbeat, LeaveGroup, commits ---------------------------------------------------------------

    def _check_member(self, member_id: str, instance_id: str | None, generation: int) -> int:
        if self.state is GroupState.DEAD:
            return ErrorCode.coordinator_not_available
        if instance_id is not None and instance_id in self.static and self.static[instance_id] != member_id:
            return ErrorCode.fenced_instance_id
        if member_id not in self.members:
            return ErrorCode.unknown_member_id
        if generation != self.generation:
            return ErrorCode.illegal_generation
        return ErrorCode.none

    def heartbeat(self, generation: int, member_id: str, instance_id: str | None) -> int:
        code = self._check_member(member_id, instance_id, generation)
        if code == ErrorCode.none:
            self._touch(self.members[member_id])
            if self.state is GroupState.PREPARING_REBALANCE:
                return ErrorCode.rebalance_in_progress
        return code

    def validate_commit(self, generation: int, member_id: str, instance_id: str | None) -> int:
        """Kafka's rule: a member's commit must match its generation; a commit with no member and
        generation -1 ("simple" commits from assign() consumers) is allowed only while the group
        has no members."""
        if self.state is GroupState.DEAD:
            return ErrorCode.coordinator_not_available
        if generation >= 0 or member_id or instance_id is not None:
            code = self._check_member(member_id, instance_id, generation)
            if code != ErrorCode.none:
                return code
            self._touch(self.members[member_id])
        elif self.members:
            return ErrorCode.unknown_member_id
        if self.state is GroupState.COMPLETING_REBALANCE:
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    def leave(self, member_id: str, instance_id: str | None) -> int:
        if instance_id is not None:
            known = self.static.get(instance_id)
            if known is None:
                return ErrorCode.unknown_member_id
            if member_id and member_id != known:
                return ErrorCode.fenced_instance_id
            member_id = known
        if member_id in self.pending:
            self.pending.pop(member_id).cancel()
            self._maybe_complete_join()
            return ErrorCode.none
        member = self.members.get(member_id)
        if member is None:
            return ErrorCode.unknown_member_id
        self._remove(member)
        self._after_departure()
        return ErrorCode.none

    def _after_departure(self) -> None:
        if self.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance()
        elif self.state is GroupState.PREPARING_REBALANCE:
            self._maybe_complete_join()
        elif self.state is GroupState.EMPTY:
            self._on_change(self)

    def _remove(self, member: Member) -> None:
        self._cancel_session(member)
        del self.members[member.member_id]
        if member.instance_id is not None and self.static.get(member.instance_id) == member.member_id:
            del self.static[member.instance_id]
        _resolve(member.join_waiter, JoinResult(ErrorCode.unknown_member_id, member_id=member.member_id))
        _resolve(member.sync_waiter, SyncResult(ErrorCode.unknown_member_id))
        if self.leader == member.member_id:
            self.leader = next((m for m, v in self.members.items() if v.join_waiter is not None), next(iter(self.members), None))

    # -- sessions -----------------------------------------------------------------------------------

    def _touch(self, member: Member) -> None:
        self._cancel_session(member)
        member.session_timer = self._loop().call_later(member.session_timeout_ms / 1000, self._expire, member)

    def _cancel_session(self, member: Member) -> None:
        if member.session_timer is not None:
            member.session_timer.cancel()
            member.session_timer = None

    def _expire_pending(self, member_id: str) -> None:
        if self.pending.pop(member_id, None) is not None:
            self._maybe_complete_join()

    def _expire(self, member: Member) -> None:
        if self.members.get(member.member_id) is member and member.join_waiter is None:
            log.info("group_member_expired", extra={"group": self.group_id, "member": member.member_id})
            member.session_timer = None
            self._remove(member)
            self._after_departure()

    # -- lifecycle ----------------------------------------------------------------------------------

    def start_sessions(self) -> None:
        """After loading stored state on a new coordinator: every member gets a full session to
        show up; a group caught mid-rebalance starts that rebalance again."""
        for m in self.members.values():
            self._touch(m)
        if self.state in (GroupState.PREPARING_REBALANCE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance()  # the leader's assignments may never have arrived

    def shutdown(self, code: int) -> None:
        """This broker stops owning the group (deleted, or coordination moved): answer every
        waiting request with `code` and stop every timer."""
        if self._join_timer is not None:
            self._join_timer.cancel()
            self._join_timer = None
        for handle in self.pending.values():
            handle.cancel()
        self.pending.clear()
        for m in self.members.values():
            self._cancel_session(m)
            _resolve(m.join_waiter, JoinResult(code, member_id=m.member_id))
            _resolve(m.sync_waiter, SyncResult(code))
            m.join_waiter = m.sync_waiter = None
