"""DescribeCluster (key 60), v0-v1: every live broker, whatever the client's zone (as Metadata
answers: a client must know of other zones' brokers to survive its own zone's loss), the cluster
id, and as controller the lowest node id (neve has no controller; Metadata names the same one). Only the broker endpoint type exists:
asking for controllers (v1 endpoint_type 2) answers MISMATCHED_ENDPOINT_TYPE, an unknown type
UNSUPPORTED_ENDPOINT_TYPE. Authorized operations are not reported (no authorizer)."""

from __future__ import annotations

import datetime

from kio.schema.errors import ErrorCode

from ..codec import build
from ..registry import handles

NO_THROTTLE = datetime.timedelta(0)
BROKERS, CONTROLLERS = 1, 2
NOT_REPORTED = -2147483648


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
    brokers = tuple(build(r.DescribeClusterBroker, broker_id=b.node_id, host=b.host, port=b.port, rack=b.zone, is_fenced=False) for b in live)
    return build(
        r.DescribeClusterResponse,
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none,
        error_message=None,
        endpoint_type=BROKERS,
        cluster_id=s.cluster_id,
        controller_id=min(b.node_id for b in live),
        brokers=brokers,
        cluster_authorized_operations=NOT_REPORTED,
    )
