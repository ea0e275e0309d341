"""ConsumerGroupHeartbeat (key 68), v0-v1: KIP-848 consumer groups (group.protocol=consumer).

Join with member epoch 0, heartbeat with the current epoch, leave with -1 (-2: a static member
leaving for a restart). The coordinator's server-side assignor ("uniform" by default, or "range"
if members ask for it; any other name gets UNSUPPORTED_ASSIGNOR) computes the target assignment
and each member reconciles towards it (broker/groups/consumer_group.py): partitions still held or
being revoked by another member are withheld until that member's heartbeat shows them released.
v0 members without an id get one from the coordinator; v1 members bring their own (KIP-1082).
Subscriptions are topic names or (v1) a regular expression matched in full against topic names
(Python `re`; only simple patterns, since `re` backtracks where Kafka's RE2J does not). The answer carries the member epoch,
the heartbeat interval and, when it changed or the request was a full one, the assignment.
Errors: FENCED_MEMBER_EPOCH, UNKNOWN_MEMBER_ID, UNRELEASED_INSTANCE_ID, FENCED_INSTANCE_ID,
INVALID_REQUEST (bad first heartbeat), INVALID_REGULAR_EXPRESSION, GROUP_ID_NOT_FOUND (a classic
group with members has that id), NOT_COORDINATOR. With ACLs: READ on the group, else
GROUP_AUTHORIZATION_FAILED."""

from __future__ import annotations

import datetime

from ..authorization import DESCRIBE, GROUP, READ, TOPIC, allowed
from ..codec import NO_THROTTLE, build, error
from ..groups.consumer_group import Heartbeat, HeartbeatResult
from ..groups.group import GROUP_AUTHORIZATION_FAILED, GroupError
from ..registry import handles


def _ms(value) -> int:
    return int(value.total_seconds() * 1000) if isinstance(value, datetime.timedelta) else int(value)


@handles(68, "ConsumerGroupHeartbeat", 0, 1)
async def consumer_group_heartbeat(ctx, request):
    r = ctx.response
    owned = None
    if request.topic_partitions is not None:
        owned = {}
        for t in request.topic_partitions:
            if t.topic_id is not None:
                owned[t.topic_id] = owned.get(t.topic_id, frozenset()) | frozenset(t.partitions)
    heartbeat = Heartbeat(
        member_id=request.member_id,
        member_epoch=request.member_epoch,
        instance_id=request.instance_id,
        rack_id=request.rack_id,
        rebalance_timeout_ms=_ms(request.rebalance_timeout),
        topic_names=None if request.subscribed_topic_names is None else tuple(request.subscribed_topic_names),
        topic_regex=getattr(request, "subscribed_topic_regex", None),
        assignor=request.server_assignor,
        owned=owned,
        client_id=ctx.client_id or "",
        client_host=str(ctx.peer[0]) if ctx.peer else "",
        version=ctx.api_version,
        describable=None if ctx.services.authorizer is None else lambda name: allowed(ctx, DESCRIBE, TOPIC, name),
    )
    try:
        if not allowed(ctx, READ, GROUP, request.group_id):
            raise GroupError(GROUP_AUTHORIZATION_FAILED)
        result = await ctx.services.coordinator.consumer_heartbeat(request.group_id, heartbeat)
    except GroupError as e:
        result = HeartbeatResult(e.code, None, request.member_id or None)
    assignment = None
    if result.assignment is not None:
        topics = tuple(build(r.TopicPartitions, topic_id=t, partitions=tuple(sorted(ps))) for t, ps in sorted(result.assignment.items(), key=lambda kv: str(kv[0])))
        assignment = build(r.Assignment, topic_partitions=topics)
    return build(
        r.ConsumerGroupHeartbeatResponse,
        throttle_time=NO_THROTTLE,
        error_code=error(result.error),
        error_message=result.message,
        member_id=result.member_id,
        member_epoch=result.member_epoch,
        heartbeat_interval=datetime.timedelta(milliseconds=result.heartbeat_interval_ms),
        assignment=assignment,
    )
