"""One KIP-848 consumer group (group.protocol=consumer): the coordinator computes the assignment,
each member reconciles towards it through its own heartbeats.

Epochs: the group epoch grows whenever membership, a subscription or a subscribed topic's partition
count changes; the target assignment is recomputed right then by the group's server-side assignor,
so the target assignment epoch always equals the group epoch here. Each member has its own epoch:
it reaches the target epoch once it holds everything of its target it may hold.

Reconciliation (Kafka's CurrentAssignmentBuilder): a member whose target drops partitions it holds
first keeps only what stays and is asked to revoke the rest (UNREVOKED_PARTITIONS, epoch
unchanged); it must acknowledge by heartbeating owned partitions without them within its rebalance
timeout, or it is fenced. A member then gets the partitions of its target that no other member
holds or is still revoking; the others stay withheld (UNRELEASED_PARTITIONS) until released, seen on
its next heartbeat. So a partition is never held by two members at once.

Sessions: a member that does not heartbeat for the group's session timeout is removed. A static
member (instance id) leaving with epoch -2 keeps its assignment for the session timeout; rejoining
with the same instance id and a new member id takes it back without moving anything.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from .assignors import ASSIGNORS, DEFAULT, Assignment

log = logging.getLogger("neve.broker.groups")

JOIN, LEAVE, STATIC_LEAVE = 0, -1, -2
# Kafka's group.consumer.session.timeout.ms / heartbeat.interval.ms defaults.
SESSION_TIMEOUT_MS = 45_000
HEARTBEAT_INTERVAL_MS = 5_000


class MemberState(enum.Enum):
    STABLE = "stable"
    UNREVOKED_PARTITIONS = "unrevoked_partitions"
    UNRELEASED_PARTITIONS = "unreleased_partitions"


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A ConsumerGroupHeartbeat request, version-independent. None means "unchanged"."""

    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    topic_names: tuple[str, ...] | None = None
    topic_regex: str | None = None
    assignor: str | None = None
    owned: Assignment | None = None
    client_id: str = ""
    client_host: str = ""
    version: int = 1
    # whether the heartbeating principal may DESCRIBE a topic (None: no authorizer): the group's
    # regexes take only such topics, as Kafka resolves them with the triggering request's rights
    describable: Callable[[str], bool] | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class HeartbeatResult:
    error: int
    message: str | None = None
    member_id: str | None = None
    member_epoch: int = -1
    heartbeat_interval_ms: int = HEARTBEAT_INTERVAL_MS
    assignment: Assignment | None = None  # None: unchanged, not sent


@dataclass(eq=False)
class ConsumerMember:
    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    epoch: int = 0
    previous_epoch: int = -1
    state: MemberState = MemberState.STABLE
    assigned: Assignment = field(default_factory=dict)
    revoking: Assignment = field(default_factory=dict)
    topic_names: tuple[str, ...] = ()
    topic_regex: str | None = None
    assignor: str | None = None
    rebalance_timeout_ms: int = 0
    session_timer: asyncio.TimerHandle | None = field(default=None, repr=False)
    revocation_timer: asyncio.TimerHandle | None = field(default=None, repr=False)

    def subscribes(self, name: str) -> bool:
        return name in self.topic_names or (self.topic_regex is not None and re.fullmatch(self.topic_regex, name) is not None)


MAX_REGEX_REPEATS = 2


def regex_problem(pattern: str) -> str | None:
    """Why a subscription regex is refused, or None. Kafka matches with RE2J, which never
    backtracks; Python's `re` does, so only simple patterns are taken: no quantified groups, no
    back-references or lookarounds, and at most two repeats (`*`, `+`, `?`, `{m,n}`), which keeps
    matching a topic name (at most 249 characters) to tens of thousands of steps at worst."""
    try:
        re.compile(pattern)
    except re.error as e:
        return f"invalid: {e}"
    repeats, i, in_class = 0, 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            if i + 1 < len(pattern) and pattern[i + 1].isdigit() and not in_class:
                return "back-references are not supported"
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            if pattern[i + 1 : i + 2] == "]":
                i += 1  # a leading ] is a literal
        elif c == "(" and pattern[i + 1 : i + 2] == "?" and pattern[i + 2 : i + 3] != ":":
            return "only (?:...) groups are supported"
        elif c == ")" and pattern[i + 1 : i + 2] in ("*", "+", "?", "{"):
            return "repeated groups are not supported"
        elif c in "*+{" or (c == "?" and pattern[i - 1 : i] not in ("(", "*", "+", "?", "}")):
            repeats += 1  # a "?" right after another quantifier only makes it lazy
        i += 1
    if repeats > MAX_REGEX_REPEATS:
        return f"more than {MAX_REGEX_REPEATS} repeats (*, +, ?, {{m,n}}) are not supported"
    return None


def _minus(a: Assignment, b: Assignment) -> Assignment:
    return {t: ps - b.get(t, frozenset()) for t, ps in a.items() if ps - b.get(t, frozenset())}


def _intersect(a: Assignment, b: Assignment) -> Assignment:
    return {t: ps & b[t] for t, ps in a.items() if t in b and ps & b[t]}


def _union(a: Assignment, b: Assignment) -> Assignment:
    return {t: a.get(t, frozenset()) | b.get(t, frozenset()) for t in a.keys() | b.keys() if a.get(t) or b.get(t)}


def _overlaps(a: Assignment, b: Assignment) -> bool:
    return any(ps & b.get(t, frozenset()) for t, ps in a.items())


class ConsumerGroup:
    TYPE = "consumer"

    def __init__(
        self,
        group_id: str,
        on_change: Callable[[ConsumerGroup], None] = lambda g: None,
        *,
        session_timeout_ms: int = SESSION_TIMEOUT_MS,
        heartbeat_interval_ms: int = HEARTBEAT_INTERVAL_MS,
    ) -> None:
        self.group_id = group_id
        self.group_epoch = 0
        self.assignment_epoch = 0
        self.assignor = DEFAULT
        self.members: dict[str, ConsumerMember] = {}
        self.static: dict[str, str] = {}  # instance id -> member id
        self.target: dict[str, Assignment] = {}
        self.subscribed: dict[str, tuple[uuid.UUID, int]] = {}  # topic name -> (id, partitions) at the last epoch
        self.deleted = False
        self._membership_changed = False  # a member joined or was removed since the last epoch
        self._subscriptions_seen: dict[str, frozenset[uuid.UUID]] | None = None  # what the last epoch was computed from
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self._on_change = on_change
        self._describable: Callable[[str], bool] | None = None  # see Heartbeat.describable

    # -- queries ----------------------------------------------------------------------------------

    @property
    def is_empty(self) -> bool:
        return not self.members

    @property
    def state_name(self) -> str:
        """Kafka's ConsumerGroupState names."""
        if self.deleted:
            return "Dead"
        if not self.members:
            return "Empty"
        if self.group_epoch > self.assignment_epoch:
            return "Assigning"
        if any(m.epoch != self.assignment_epoch or m.state is not MemberState.STABLE for m in self.members.values() if m.epoch != STATIC_LEAVE):
            return "Reconciling"
        return "Stable"

    def _loop(self) -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    # -- ConsumerGroupHeartbeat -------------------------------------------------------------------

    def heartbeat(self, hb: Heartbeat, topics: Mapping) -> HeartbeatResult:
        """One heartbeat: join (epoch 0), heartbeat, or leave (-1, static -2). `topics` maps topic
        names to TopicInfo (id, partitions)."""
        if self.deleted:
            return HeartbeatResult(ErrorCode.coordinator_not_available)
        if hb.describable is not None:
            self._describable = hb.describable  # the regexes' rights from the last heartbeat, for refreshes between them
        problem = self._invalid(hb)
        if problem is not None:
            return HeartbeatResult(*problem, member_id=hb.member_id or None)
        if hb.member_epoch in (LEAVE, STATIC_LEAVE):
            return self._leave(hb)
        if hb.member_epoch == JOIN:
            member, error = self._join(hb)
        else:
            member, error = self._existing(hb)
        if error is not None:
            return error
        before = dict(member.assigned)
        if hb.rebalance_timeout_ms >= 0:
            member.rebalance_timeout_ms = hb.rebalance_timeout_ms
        for name in ("instance_id", "rack_id", "assignor"):
            if getattr(hb, name) is not None:
                setattr(member, name, getattr(hb, name))
        member.client_id, member.client_host = hb.client_id or member.client_id, hb.client_host or member.client_host
        if hb.topic_names is not None:
            member.topic_names = tuple(hb.topic_names)
        if hb.topic_regex is not None:
            member.topic_regex = hb.topic_regex or None
        self._touch(member)
        self._refresh(topics)
        self._reconcile(member, hb.owned)
        full = hb.member_epoch == JOIN or (hb.rebalance_timeout_ms != -1 and hb.topic_names is not None and hb.owned is not None)
        changed = member.assigned != before
        if changed or hb.member_epoch == JOIN:
            self._on_change(self)
        return HeartbeatResult(ErrorCode.none, None, member.member_id, member.epoch, self.heartbeat_interval_ms, dict(member.assigned) if full or changed else None)

    def _invalid(self, hb: Heartbeat) -> tuple[int, str] | None:
        if hb.version >= 1 and not hb.member_id:
            return ErrorCode.invalid_request, "MemberId can't be empty."
        if hb.member_epoch < STATIC_LEAVE:
            return ErrorCode.invalid_request, f"MemberEpoch {hb.member_epoch} is invalid."
        if hb.member_epoch != JOIN and not hb.member_id:
            return ErrorCode.invalid_request, "MemberId can't be empty."
        if hb.member_epoch == STATIC_LEAVE and hb.instance_id is None:
            return ErrorCode.invalid_request, "InstanceId can't be null when leaving as a static member."
        if hb.member_epoch == JOIN:
            if hb.rebalance_timeout_ms < 0:
                return ErrorCode.invalid_request, "RebalanceTimeoutMs must be provided in first request."
            if hb.owned is None or any(hb.owned.values()):
                return ErrorCode.invalid_request, "TopicPartitions must be empty when (re-)joining."
            if hb.topic_names is None and hb.topic_regex is None:
                return ErrorCode.invalid_request, "SubscribedTopicNames or SubscribedTopicRegex must be set in first request."
        if hb.assignor is not None and hb.assignor not in ASSIGNORS:
            return ErrorCode.unsupported_assignor, f"ServerAssignor {hb.assignor} is not supported. Supported assignors: {', '.join(ASSIGNORS)}."
        if hb.topic_regex:
            problem = regex_problem(hb.topic_regex)
            if problem is not None:
                return ErrorCode.invalid_regular_expression, f"SubscribedTopicRegex {hb.topic_regex!r}: {problem}"
        return None

    def _join(self, hb: Heartbeat) -> tuple[ConsumerMember, HeartbeatResult | None]:
        member_id = hb.member_id or str(uuid.uuid4())  # v0: the coordinator names the member
        if hb.instance_id is not None and hb.instance_id in self.static:
            old = self.members[self.static[hb.instance_id]]
            if old.member_id != member_id:
                if old.epoch != STATIC_LEAVE:
                    return old, HeartbeatResult(ErrorCode.unreleased_instance_id, f"Static member {old.member_id} with instance id {hb.instance_id} is not released.", member_id)
                return self._replace_static(old, member_id), None
        member = self.members.get(member_id)
        if member is not None:
            # The member lost its state (it was fenced, or restarted with its id): it holds nothing now.
            self._cancel(member)
            member.assigned, member.revoking, member.state = {}, {}, MemberState.STABLE
            member.previous_epoch, member.epoch = member.epoch, JOIN
            return member, None
        member = ConsumerMember(member_id, hb.instance_id)
        self.members[member_id] = member
        if hb.instance_id is not None:
            self.static[hb.instance_id] = member_id
        self._membership_changed = True
        log.info("consumer_group_member_joined", extra={"group": self.group_id, "member": member_id})
        return member, None

    def _replace_static(self, old: ConsumerMember, member_id: str) -> ConsumerMember:
        """A static member came back under a new member id: it takes the old one's place as is."""
        self._cancel(old)
        del self.members[old.member_id]
        member = dataclasses.replace(old, member_id=member_id, epoch=old.previous_epoch, session_timer=None, revocation_timer=None)
        self.members[member_id] = member
        self.static[old.instance_id] = member_id
        if old.member_id in self.target:
            self.target[member_id] = self.target.pop(old.member_id)
        if self._subscriptions_seen is not None and old.member_id in self._subscriptions_seen:
            self._subscriptions_seen[member_id] = self._subscriptions_seen.pop(old.member_id)
        if member.state is MemberState.UNREVOKED_PARTITIONS:
            self._start_revocation(member)
        return member

    def _existing(self, hb: Heartbeat) -> tuple[ConsumerMember | None, HeartbeatResult | None]:
        member = self.members.get(hb.member_id)
        if member is None:
            return None, HeartbeatResult(ErrorCode.unknown_member_id, f"Member {hb.member_id} is not a member of group {self.group_id}.", hb.member_id)
        if hb.instance_id is not None and self.static.get(hb.instance_id, member.member_id) != member.member_id:
            return None, HeartbeatResult(ErrorCode.fenced_instance_id, None, hb.member_id)
        if hb.member_epoch > member.epoch:
            return None, HeartbeatResult(ErrorCode.fenced_member_epoch, f"The member epoch {hb.member_epoch} is newer than {member.epoch}.", hb.member_id)
        if hb.member_epoch < member.epoch:
            # Only the epoch just before, with nothing beyond the current assignment: our answer was lost.
            lost_answer = hb.member_epoch == member.previous_epoch and (hb.owned is None or not _minus(hb.owned, member.assigned))
            if not lost_answer:
                return None, HeartbeatResult(ErrorCode.fenced_member_epoch, f"The member epoch {hb.member_epoch} is older than {member.epoch}.", hb.member_id)
        return member, None

    def _leave(self, hb: Heartbeat) -> HeartbeatResult:
        member_id = hb.member_id
        if hb.instance_id is not None:
            known = self.static.get(hb.instance_id)
            if known is None:
                return HeartbeatResult(ErrorCode.unknown_member_id, f"Instance id {hb.instance_id} is unknown.", member_id)
            if known != member_id:
                return HeartbeatResult(ErrorCode.fenced_instance_id, None, member_id)
        member = self.members.get(member_id)
        if member is None:
            return HeartbeatResult(ErrorCode.unknown_member_id, f"Member {member_id} is not a member of group {self.group_id}.", member_id)
        if hb.member_epoch == STATIC_LEAVE:
            # Kept, assignment and all, for the session timeout: a restart takes it back unchanged.
            if member.state is MemberState.UNREVOKED_PARTITIONS:
                self._cancel_revocation(member)
            if member.epoch != STATIC_LEAVE:
                member.previous_epoch, member.epoch = member.epoch, STATIC_LEAVE
            self._touch(member)
            self._on_change(self)
            return HeartbeatResult(ErrorCode.none, None, member_id, STATIC_LEAVE, self.heartbeat_interval_ms)
        self._remove(member, "left")
        return HeartbeatResult(ErrorCode.none, None, member_id, LEAVE, self.heartbeat_interval_ms)

    # -- the target assignment ----------------------------------------------------------------------

    def _subscribed_topics(self, topics: Mapping) -> dict[str, tuple[uuid.UUID, int]]:
        names = {n for m in self.members.values() for n in m.topic_names}
        regexes = {m.topic_regex for m in self.members.values() if m.topic_regex}
        if regexes:
            describable = self._describable or (lambda name: True)
            names |= {n for n in topics if any(re.fullmatch(r, n) for r in regexes) and describable(n)}
        return {n: (topics[n].topic_id, topics[n].partitions) for n in sorted(names) if n in topics}

    def _chosen_assignor(self) -> str:
        votes: dict[str, int] = {}
        for m in self.members.values():
            if m.assignor:
                votes[m.assignor] = votes.get(m.assignor, 0) + 1
        return max(sorted(votes), key=lambda n: votes[n]) if votes else DEFAULT

    def _refresh(self, topics: Mapping) -> None:
        """A new group epoch and target assignment when membership, subscriptions or subscribed
        topics changed since the last one."""
        subscribed = self._subscribed_topics(topics)
        subscriptions = self._subscriptions(subscribed)
        assignor = self._chosen_assignor()
        if not self._membership_changed and subscribed == self.subscribed and assignor == self.assignor and self._subscriptions_seen == subscriptions:
            return
        self._membership_changed = False
        self._subscriptions_seen = subscriptions
        self.subscribed, self.assignor = subscribed, assignor
        self.group_epoch += 1
        by_id = {tid: (name, n) for name, (tid, n) in subscribed.items()}
        self.target = ASSIGNORS[assignor](subscriptions, by_id, self.target)
        self.assignment_epoch = self.group_epoch
        log.info("consumer_group_epoch", extra={"group": self.group_id, "epoch": self.group_epoch, "members": len(self.members), "assignor": assignor})
        self._on_change(self)

    def _subscriptions(self, subscribed: Mapping[str, tuple[uuid.UUID, int]]) -> dict[str, frozenset[uuid.UUID]]:
        return {m.member_id: frozenset(tid for n, (tid, _) in subscribed.items() if m.subscribes(n)) for m in self.members.values()}

    def loaded(self) -> None:
        """Stored state was just read back: what the last epoch was computed from is what it holds."""
        self._subscriptions_seen = self._subscriptions(self.subscribed)

    # -- reconciliation -------------------------------------------------------------------------------

    def _held_by_others(self, member: ConsumerMember) -> Assignment:
        held: Assignment = {}
        for m in self.members.values():
            if m is not member:
                held = _union(held, _union(m.assigned, m.revoking))
        return held

    def _reconcile(self, member: ConsumerMember, owned: Assignment | None) -> None:
        if member.state is MemberState.UNREVOKED_PARTITIONS:
            if owned is None or _overlaps(owned, member.revoking):
                return  # still waiting for the member to give them up
            member.revoking = {}
            self._cancel_revocation(member)
        elif member.state is MemberState.STABLE and member.epoch == self.assignment_epoch:
            return
        target = self.target.get(member.member_id, {})
        keep = _intersect(member.assigned, target)
        revoke = _minus(member.assigned, target)
        if revoke:
            member.assigned, member.revoking = keep, revoke
            member.state = MemberState.UNREVOKED_PARTITIONS
            self._start_revocation(member)
            return
        wanted = _minus(target, member.assigned)
        withheld = _intersect(wanted, self._held_by_others(member))
        member.assigned = _union(keep, _minus(wanted, withheld))
        if member.epoch != self.assignment_epoch:
            member.previous_epoch, member.epoch = member.epoch, self.assignment_epoch
        member.state = MemberState.UNRELEASED_PARTITIONS if withheld else MemberState.STABLE

    def _start_revocation(self, member: ConsumerMember) -> None:
        self._cancel_revocation(member)
        member.revocation_timer = self._loop().call_later(max(member.rebalance_timeout_ms, 0) / 1000, self._revocation_expired, member)

    def _cancel_revocation(self, member: ConsumerMember) -> None:
        if member.revocation_timer is not None:
            member.revocation_timer.cancel()
            member.revocation_timer = None

    def _revocation_expired(self, member: ConsumerMember) -> None:
        member.revocation_timer = None
        if self.members.get(member.member_id) is member and member.state is MemberState.UNREVOKED_PARTITIONS:
            self._remove(member, "did not revoke its partitions within the rebalance timeout")

    # -- sessions, removal ------------------------------------------------------------------------------

    def _touch(self, member: ConsumerMember) -> None:
        if member.session_timer is not None:
            member.session_timer.cancel()
        member.session_timer = self._loop().call_later(self.session_timeout_ms / 1000, self._expire, member)

    def _cancel(self, member: ConsumerMember) -> None:
        if member.session_timer is not None:
            member.session_timer.cancel()
            member.session_timer = None
        self._cancel_revocation(member)

    def _expire(self, member: ConsumerMember) -> None:
        member.session_timer = None
        if self.members.get(member.member_id) is member:
            self._remove(member, "session expired")

    def _remove(self, member: ConsumerMember, reason: str) -> None:
        log.info("consumer_group_member_removed", extra={"group": self.group_id, "member": member.member_id, "reason": reason})
        self._cancel(member)
        del self.members[member.member_id]
        if member.instance_id is not None and self.static.get(member.instance_id) == member.member_id:
            del self.static[member.instance_id]
        self._membership_changed = True
        self._refresh_known()

    def _refresh_known(self) -> None:
        """A new epoch after a departure, against the subscribed topics last seen (the next
        heartbeat refreshes them from the metadata)."""
        self._refresh({n: _Topic(tid, count) for n, (tid, count) in self.subscribed.items()})

    # -- offsets ----------------------------------------------------------------------------------------

    def validate_commit(self, member_epoch: int, member_id: str, instance_id: str | None) -> int:
        """Kafka's rule: epoch -1 without member commits only while the group is empty; otherwise
        the member must exist and give its current epoch (STALE_MEMBER_EPOCH if not)."""
        if self.deleted:
            return ErrorCode.coordinator_not_available
        if member_epoch < 0 and not member_id and not self.members:
            return ErrorCode.none
        member = self.members.get(member_id)
        if member is None:
            return ErrorCode.unknown_member_id
        if member_epoch != member.epoch:
            return ErrorCode.stale_member_epoch
        return ErrorCode.none

    def not_held(self, member_id: str, partitions: Iterable[tuple[uuid.UUID, int]]) -> set[tuple[uuid.UUID, int]]:
        """The partitions a member's commit names but the member does not hold (neither assigned
        nor still revoking): their commits are refused with STALE_MEMBER_EPOCH, as KIP-1251 does.

        The epoch alone does not fence them: a member that acknowledged a revocation moves to the
        new epoch at once, and a client can still commit, with that epoch, records it read from a
        partition it has just given up (librdkafka hands back records fetched before the revocation
        and the application commits them after it). Accepting that commit while the new owner has
        already fetched the older committed offset delivers those records twice with every commit
        reported successful. A member without a member id (a simple commit) holds nothing to check."""
        member = self.members.get(member_id)
        if member is None:
            return set()
        held = _union(member.assigned, member.revoking)
        return {(t, p) for t, p in partitions if p not in held.get(t, frozenset())}

    def validate_fetch(self, member_id: str | None, member_epoch: int) -> int:
        if member_id is None or (member_epoch < 0 and not member_id):
            return ErrorCode.none
        member = self.members.get(member_id)
        if member is None:
            return ErrorCode.unknown_member_id
        return ErrorCode.none if member_epoch == member.epoch else ErrorCode.stale_member_epoch

    # -- lifecycle --------------------------------------------------------------------------------------

    def start_sessions(self) -> None:
        """After loading stored state on a new coordinator: every member gets a full session, and
        a member that was revoking gets a full rebalance timeout again."""
        for m in self.members.values():
            self._touch(m)
            if m.state is MemberState.UNREVOKED_PARTITIONS:
                self._start_revocation(m)

    def shutdown(self, code: int) -> None:
        for m in self.members.values():
            self._cancel(m)


@dataclass(frozen=True, slots=True)
class _Topic:
    topic_id: uuid.UUID
    partitions: int
