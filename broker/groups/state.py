"""A group's stored form: what a new coordinator needs to carry on after the old one died
(generation, protocol, leader, members with their subscriptions, assignments and static ids).

Versioned JSON with binary fields in base64; an unknown version is refused rather than guessed at.
"""

from __future__ import annotations

import base64
import json

from .group import Group, GroupState, Member

VERSION = 1


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def encode(group: Group) -> bytes:
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


def decode(group_id: str, data: bytes, group: Group | None = None) -> Group:
    doc = json.loads(data)
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
