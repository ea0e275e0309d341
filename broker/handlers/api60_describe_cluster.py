"""DescribeCluster (key 60), v0-v1: the brokers Metadata lists to the same client (a zoned
client: its zone's live brokers; any other client, or one whose zone has no live broker: every
live broker; broker/locality.py), the cluster id, and as controller the lowest node id of those
(neve has no controller; Metadata names the same one). Only the broker endpoint type exists:
asking for controllers (v1 endpoint_type 2) answers MISMATCHED_ENDPOINT_TYPE, an unknown type
UNSUPPORTED_ENDPOINT_TYPE. The cluster's authorized operations are reported when asked, to a
principal that may DESCRIBE the cluster (0 to others), as Kafka does."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from ..authorization import CLUSTER, DESCRIBE, NOT_REPORTED, allowed, authorized_operations
from ..codec import NO_THROTTLE, build
from ..locality import brokers_for_zone, brokers_listed, known_zone
from ..registry import handles

BROKERS, CONTROLLERS = 1, 2


@handles(60, "DescribeCluster", 0, 1)
async def describe_cluster(ctx, request):
    r = ctx.response
    s = ctx.services
    endpoint_type = getattr(request, "endpoint_type", BROKERS)
    if endpoint_type != BROKERS:
        code = ErrorCode.mismatched_endpoint_type if endpoint_type == CONTROLLERS else ErrorCode.unsupported_endpoint_type
        message = f"neve brokers serve endpoint type {BROKERS} (brokers), not {endpoint_type}"
        return build(r.DescribeClusterResponse, throttle_time=NO_THROTTLE, error_code=code, error_message=message, endpoint_type=BROKERS, cluster_id=s.cluster_id, controller_id=-1, brokers=(), cluster_authorized_operations=NOT_REPORTED)
    live = s.live_brokers()
    zone = known_zone(ctx.client_id, live)
    listener = ctx.session.listener  # each broker's address on the listener the client came in through
    brokers = tuple(build(r.DescribeClusterBroker, broker_id=b.node_id, host=(ep := b.endpoint(listener))[0], port=ep[1], rack=b.zone, is_fenced=False) for b in brokers_listed(live, zone))
    return build(
        r.DescribeClusterResponse,
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none,
        error_message=None,
        endpoint_type=BROKERS,
        cluster_id=s.cluster_id,
        controller_id=min(b.node_id for b in brokers_for_zone(live, zone)),  # in the client's zone, as Metadata names it
        brokers=brokers,
        cluster_authorized_operations=_cluster_operations(ctx, request),
    )


def _cluster_operations(ctx, request) -> int:
    if not request.include_cluster_authorized_operations:
        return NOT_REPORTED
    return authorized_operations(ctx, CLUSTER) if allowed(ctx, DESCRIBE, CLUSTER) else 0
