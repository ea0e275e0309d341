"""FindCoordinator (key 10), v0-v5; v4+ batches several keys in one request.

Groups (key_type 0) are coordinated by one live broker per group (broker/groups/coordinator.py);
a single node always answers itself. Transactional ids (key_type 1) are answered with a broker of
the client's zone by the same rendezvous hashing (any broker can coordinate any transaction: its
state is the metadata store's, broker/transactions/coordinator.py); any other key type gets
INVALID_REQUEST.

Zones: a group's coordinator is "rendezvous hashing of the group id over the live brokers of the
group's home zone", where the home zone is the zone of the first client that looked the group up,
recorded once in the metadata store (every live broker when that client had no zone, when the zone
has no live broker, or when no broker has a zone). Why one coordinator and not one per zone: a
group's live state (members, generation, the join barrier) is kept by one broker, and only its
snapshots reach the metadata store, for a successor after a failure; two coordinators of one group
would each run their own join barrier and generations and hand out overlapping assignments.

A zoned client is answered with a broker of its own zone: rendezvous of the group id over its
zone's live brokers (the same hashing), so every member of one zone is sent to the same broker,
and a client never learns of a broker its Metadata does not list. In the group's home zone that
broker is the coordinator. In another zone it is the group's relay there: it forwards the
member's group requests to the coordinator broker to broker and relays the answers
(broker/forwarding.py), so only those small frames cross zones and the member's connections stay
in its zone. A client without a zone is answered with the coordinator itself. A hint naming no
live broker's zone is counted and logged (locality.ZoneHints) and answered as for a client
without a zone.

With ACLs: DESCRIBE on the group (else GROUP_AUTHORIZATION_FAILED) or the transactional id (else
TRANSACTIONAL_ID_AUTHORIZATION_FAILED), as Kafka checks before looking the key up."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from ..authorization import DESCRIBE, allowed
from ..authorization import GROUP as GROUP_RESOURCE
from ..authorization import TRANSACTIONAL_ID as TRANSACTIONAL_ID_RESOURCE
from ..codec import NO_THROTTLE, build, has_field
from ..groups.coordinator import coordinator_for
from ..groups.group import GroupError
from ..locality import ZONE_HINTS
from ..registry import handles

GROUP, TRANSACTION = 0, 1


async def _find(ctx, key: str, key_type: int, zone: str | None) -> dict:
    if key_type == GROUP and not allowed(ctx, DESCRIBE, GROUP_RESOURCE, key):
        return dict(error_code=ErrorCode.group_authorization_failed, error_message=None, node_id=-1, host="", port=-1)
    if key_type == TRANSACTION and not allowed(ctx, DESCRIBE, TRANSACTIONAL_ID_RESOURCE, key):
        return dict(error_code=ErrorCode.transactional_id_authorization_failed, error_message=None, node_id=-1, host="", port=-1)
    if key_type == TRANSACTION:
        if not key:
            return dict(error_code=ErrorCode.invalid_request, error_message="empty transactional id", node_id=-1, host="", port=-1)
        # any broker can take any step of a transaction (its state is the store's): the hashing
        # only gives each id one broker at a time, in the client's zone, to order its requests
        broker = coordinator_for(key, ctx.services.live_brokers(), zone)
        return _found(ctx, broker)
    if key_type != GROUP:
        return dict(error_code=ErrorCode.invalid_request, error_message=f"unknown key type {key_type}", node_id=-1, host="", port=-1)
    if not key:
        return dict(error_code=ErrorCode.invalid_group_id, error_message="empty group id", node_id=-1, host="", port=-1)
    coordinator = ctx.services.coordinator
    try:
        await coordinator.place(key, zone)
    except GroupError as e:
        return dict(error_code=ErrorCode(e.code), error_message=str(e), node_id=-1, host="", port=-1)
    # a zoned client's relay in its zone (the coordinator itself in the group's home zone)
    broker = coordinator.coordinator(key) if zone is None else coordinator_for(key, ctx.services.live_brokers(), zone)
    return _found(ctx, broker)


def _found(ctx, broker) -> dict:
    host, port = broker.endpoint(ctx.session.listener)  # on the listener the client came in through
    return dict(error_code=ErrorCode.none, error_message=None, node_id=broker.node_id, host=host, port=port)


@handles(10, "FindCoordinator", 0, 5)
async def find_coordinator(ctx, request):
    r = ctx.response
    key_type = getattr(request, "key_type", GROUP)
    zone = ZONE_HINTS.zone(ctx.client_id, ctx.services.live_brokers()) if key_type in (GROUP, TRANSACTION) else None
    if has_field(request, "coordinator_keys"):
        coordinators = tuple([build(r.Coordinator, key=key, **await _find(ctx, key, key_type, zone)) for key in request.coordinator_keys])
        return build(r.FindCoordinatorResponse, throttle_time=NO_THROTTLE, coordinators=coordinators)
    return build(r.FindCoordinatorResponse, throttle_time=NO_THROTTLE, **await _find(ctx, request.key, key_type, zone))
