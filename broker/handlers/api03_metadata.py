"""Metadata (key 3), v0-v12: brokers, topics with their ids, and per partition a "leader".

neve has no partition leaders: any broker accepts produce and fetch for any partition. The leader
named here is a locality hint only (which broker batches a partition's writes and caches its
reads). Unknown topics are auto-created only when the broker allows it (off by default) and the
request asks for it.

Zones: a client whose client.id names a zone some live broker is in (broker/locality.py) is told
of that zone's live brokers only, and its leaders are chosen among them by rendezvous hashing of
(topic, partition, zone), so a broker joining or leaving moves only its own share. A client never
told of another zone's brokers cannot connect to them, whatever it decides to ask where
(FindCoordinator names one of its zone too, which relays the group's requests to the coordinator
wherever it is: broker/forwarding.py). One exception (locality.brokers_listed): a zone with a
single live broker is listed with the others after it, never as leaders, so that its clients can
move when it dies instead of waiting minutes to go back to their bootstrap list. A client without
a zone, or with a hint naming no live broker's zone (counted and logged, see locality.ZoneHints),
sees every broker.
The controller named is the lowest node id among the leaders' brokers (in the client's zone).

ACLs (broker/authorization.py), as Kafka checks them: a topic the principal may not DESCRIBE is
left out of an all-topics answer, and answers TOPIC_AUTHORIZATION_FAILED when named (so its
existence is not disclosed); auto-creating one needs CREATE on the cluster or the topic. The
authorized-operations bitfields are reported when asked (v8+): the cluster's (v8-v10) only to a
principal that may DESCRIBE it (0 otherwise), each topic's always."""

from __future__ import annotations

import uuid

from kio.schema.errors import ErrorCode

from ..authorization import CLUSTER, CREATE, DESCRIBE, NOT_REPORTED, TOPIC, allowed, allowed_names, authorized_operations
from ..codec import NO_THROTTLE, build, has_field
from ..locality import ZONE_HINTS, brokers_for_zone, brokers_listed, leader_for
from ..registry import handles
from ..topics import create_topic_checked

ZERO_UUID = uuid.UUID(int=0)


@handles(3, "Metadata", 0, 12)
async def metadata(ctx, request):
    r = ctx.response
    s = ctx.services
    store = s.metadata
    topics = store.topics()
    if request.topics is None:
        wanted = [(name, None) for name in sorted(topics)]
    else:
        wanted = []
        for t in request.topics:
            name = t.name
            if name is None and has_field(t, "topic_id") and t.topic_id not in (None, ZERO_UUID):
                info = store.topic_by_id(t.topic_id)
                name = info.name if info else None
                wanted.append((name, t.topic_id))
            else:
                wanted.append((name, None))
    allow_auto = getattr(request, "allow_auto_topic_creation", True)
    described = None  # the names the principal may describe, with ACLs
    if s.authorizer is not None:
        described = allowed_names(ctx, DESCRIBE, TOPIC, [name for name, _ in wanted if name is not None])
        if request.topics is None:
            wanted = [(name, asked_id) for name, asked_id in wanted if name in described]
    topic_ops = bool(getattr(request, "include_topic_authorized_operations", False))
    live = s.live_brokers()
    zone = ZONE_HINTS.zone(ctx.client_id, live)
    visible = brokers_for_zone(live, zone)
    out = []
    for name, asked_id in wanted:
        if described is not None and name is not None and name not in described:
            # asked by id: the name is not told (Kafka answers null), as it is not for an unknown id
            told = None if asked_id else name
            out.append(build(r.MetadataResponseTopic, error_code=ErrorCode.topic_authorization_failed, name=told, topic_id=asked_id or ZERO_UUID, is_internal=False, partitions=(), topic_authorized_operations=NOT_REPORTED))
            continue
        info = topics.get(name) if name is not None else None
        if info is None and name is not None and allow_auto and s.settings.auto_create_topics:
            if not (allowed(ctx, CREATE, CLUSTER) or allowed(ctx, CREATE, TOPIC, name)):
                out.append(build(r.MetadataResponseTopic, error_code=ErrorCode.topic_authorization_failed, name=name, topic_id=ZERO_UUID, is_internal=False, partitions=(), topic_authorized_operations=NOT_REPORTED))
                continue
            code, _message, info = await create_topic_checked(s, name, s.settings.default_partitions, {})
            if info is None:
                out.append(build(r.MetadataResponseTopic, error_code=ErrorCode(code), name=name, topic_id=ZERO_UUID, is_internal=False, partitions=(), topic_authorized_operations=-2147483648))
                continue
        if info is None:
            code = ErrorCode.unknown_topic_id if name is None else ErrorCode.unknown_topic_or_partition
            out.append(build(r.MetadataResponseTopic, error_code=code, name=name, topic_id=asked_id or ZERO_UUID, is_internal=False, partitions=(), topic_authorized_operations=-2147483648))
            continue
        partitions = []
        for p in range(info.partitions):
            leader = leader_for(info.name, p, zone, visible)
            partitions.append(
                build(
                    r.MetadataResponsePartition,
                    error_code=ErrorCode.none,
                    partition_index=p,
                    leader_id=leader,
                    leader_epoch=0,
                    replica_nodes=(leader,),
                    isr_nodes=(leader,),
                    offline_replicas=(),
                )
            )
        partitions = tuple(partitions)
        ops = authorized_operations(ctx, TOPIC, info.name) if topic_ops else NOT_REPORTED
        out.append(build(r.MetadataResponseTopic, error_code=ErrorCode.none, name=info.name, topic_id=info.topic_id, is_internal=False, partitions=partitions, topic_authorized_operations=ops))
    cluster_ops = NOT_REPORTED
    if getattr(request, "include_cluster_authorized_operations", False):
        cluster_ops = authorized_operations(ctx, CLUSTER) if allowed(ctx, DESCRIBE, CLUSTER) else 0
    listener = ctx.session.listener  # each broker's address on the listener the client came in through
    brokers = tuple(build(r.MetadataResponseBroker, node_id=b.node_id, host=(ep := b.endpoint(listener))[0], port=ep[1], rack=b.zone) for b in brokers_listed(live, zone))
    return build(
        r.MetadataResponse,
        throttle_time=NO_THROTTLE,
        brokers=brokers,
        cluster_id=s.cluster_id,
        controller_id=min(b.node_id for b in visible),
        topics=tuple(out),
        cluster_authorized_operations=cluster_ops,
    )
