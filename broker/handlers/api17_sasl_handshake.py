"""SaslHandshake (key 17), v0-v1: picks the SASL mechanism of a connection to a SASL listener when
this broker offers it, and answers the mechanisms it offers. An unsupported mechanism answers
UNSUPPORTED_SASL_MECHANISM and the connection is closed, as Kafka does; a handshake on a
listener without SASL, or on an authenticated connection that is not re-authenticating (KIP-368:
only a session given a lifetime re-authenticates, with its original mechanism), answers
ILLEGAL_SASL_STATE. After v0, the client's SASL tokens come as raw frames (the connection's
concern); after v1, in SaslAuthenticate requests."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from ..codec import build
from ..registry import handles


@handles(17, "SaslHandshake", 0, 1)
async def sasl_handshake(ctx, request):
    session = ctx.session
    sasl = ctx.services.sasl
    enabled = sasl.enabled if sasl is not None else ()

    def answer(code, close=False):
        session.close_after_reply = session.close_after_reply or close
        return build(ctx.response.SaslHandshakeResponse, error_code=code, mechanisms=enabled)

    if not session.uses_sasl:
        return answer(ErrorCode.illegal_sasl_state)
    if session.exchange is not None:  # a handshake in the middle of an exchange: the client is lost
        return answer(ErrorCode.illegal_sasl_state, close=True)
    reauthenticating = session.authenticated
    if reauthenticating and (ctx.api_version < 1 or session.expires_at is None):
        return answer(ErrorCode.illegal_sasl_state)
    if sasl is None or not sasl.offers(request.mechanism):
        return answer(ErrorCode.unsupported_sasl_mechanism, close=True)
    if reauthenticating and request.mechanism != session.mechanism:
        return answer(ErrorCode.illegal_sasl_state, close=True)
    session.mechanism = request.mechanism
    session.exchange = sasl.start(request.mechanism)
    return answer(ErrorCode.none)
