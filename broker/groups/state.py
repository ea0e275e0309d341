"""A group's stored form: what a new coordinator needs to carry on after the old one died.
Version 1 is a classic group (generation, protocol, leader, members with their subscriptions,
assignments and static ids); version 2 a KIP-848 consumer group (group and assignment epochs,
assignor, target assignment, and each member's epochs, reconciliation state, assigned and
revoking partitions and subscription).

Versioned JSON with binary fields in base64; an unknown version is refused rather than guessed at
(so a broker that knows only version 1 starts a consumer group afresh instead of misreading it).
"""

from __future__ import annotations

import base64
import json
import uuid

from .consumer_group import ConsumerGroup, ConsumerMember, MemberState
from .group import Group, GroupState, Member

VERSION = 1
CONSUMER_VERSION = 2


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def group_type(data: bytes) -> str:
    """"classic" or "consumer": which kind of group a stored document holds."""
    return "consumer" if json.loads(data).get("v") == CONSUMER_VERSION else "classic"


def encode(group: Group | ConsumerGroup) -> bytes:
    if isinstance(group, ConsumerGroup):
        return _encode_consumer(group)
    members = [
        {
            "id": m.member_id,
            "instance": m.instance_id,
            "client": m.client_id,
            "host": m.client_host,
            "session_ms": m.session_timeout_ms,
            "rebalance_ms": m.rebalance_timeout_ms,
            "protocols": [[name, _b64(meta)] for name, meta in m.protocols],
            "assignment": _b64(m.assignment),
        }
        for m in group.members.values()
    ]
    doc = {
        "v": VERSION,
        "state": group.state.value,
        "generation": group.generation,
        "protocol_type": group.protocol_type,
        "protocol": group.protocol_name,
        "leader": group.leader,
        "members": members,
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def decode(group_id: str, data: bytes, group: Group | ConsumerGroup | None = None) -> Group | ConsumerGroup:
    doc = json.loads(data)
    if doc.get("v") == CONSUMER_VERSION:
        return _decode_consumer(group_id, doc, group if isinstance(group, ConsumerGroup) else None)
    if doc.get("v") != VERSION:
        raise ValueError(f"group {group_id!r}: stored state version {doc.get('v')!r} is not {VERSION}")
    group = group or Group(group_id)
    group.state = GroupState(doc["state"])
    group.generation = doc["generation"]
    group.protocol_type = doc["protocol_type"]
    group.protocol_name = doc["protocol"]
    group.leader = doc["leader"]
    for m in doc["members"]:
        member = Member(
            m["id"],
            m["instance"],
            m["client"],
            m["host"],
            m["session_ms"],
            m["rebalance_ms"],
            group.protocol_type or "",
            [(name, base64.b64decode(meta)) for name, meta in m["protocols"]],
            base64.b64decode(m["assignment"]),
        )
        group.members[member.member_id] = member
        if member.instance_id is not None:
            group.static[member.instance_id] = member.member_id
    return group


def _partitions(a) -> list:
    return [[str(t), sorted(ps)] for t, ps in sorted(a.items(), key=lambda kv: str(kv[0]))]


def _assignment(rows) -> dict:
    return {uuid.UUID(t): frozenset(ps) for t, ps in rows}


def _encode_consumer(group: ConsumerGroup) -> bytes:
    members = [
        {
            "id": m.member_id,
            "instance": m.instance_id,
            "rack": m.rack_id,
            "client": m.client_id,
            "host": m.client_host,
            "epoch": m.epoch,
            "previous_epoch": m.previous_epoch,
            "state": m.state.value,
            "assigned": _partitions(m.assigned),
            "revoking": _partitions(m.revoking),
            "topics": list(m.topic_names),
            "regex": m.topic_regex,
            "assignor": m.assignor,
            "rebalance_ms": m.rebalance_timeout_ms,
        }
        for m in group.members.values()
    ]
    doc = {
        "v": CONSUMER_VERSION,
        "group_epoch": group.group_epoch,
        "assignment_epoch": group.assignment_epoch,
        "assignor": group.assignor,
        "subscribed": [[name, str(tid), n] for name, (tid, n) in sorted(group.subscribed.items())],
        "target": [[m, _partitions(a)] for m, a in sorted(group.target.items())],
        "members": members,
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def _decode_consumer(group_id: str, doc: dict, group: ConsumerGroup | None) -> ConsumerGroup:
    group = group or ConsumerGroup(group_id)
    group.group_epoch = doc["group_epoch"]
    group.assignment_epoch = doc["assignment_epoch"]
    group.assignor = doc["assignor"]
    group.subscribed = {name: (uuid.UUID(tid), n) for name, tid, n in doc["subscribed"]}
    group.target = {m: _assignment(rows) for m, rows in doc["target"]}
    for m in doc["members"]:
        member = ConsumerMember(
            m["id"],
            m["instance"],
            m["rack"],
            m["client"],
            m["host"],
            m["epoch"],
            m["previous_epoch"],
            MemberState(m["state"]),
            _assignment(m["assigned"]),
            _assignment(m["revoking"]),
            tuple(m["topics"]),
            m["regex"],
            m["assignor"],
            m["rebalance_ms"],
        )
        group.members[member.member_id] = member
        if member.instance_id is not None:
            group.static[member.instance_id] = member.member_id
    group.loaded()
    return group
