"""SaslAuthenticate (key 36), v0-v2: carries one step of the exchange SaslHandshake started. Once
the mechanism is done the connection's principal is set ("User:<name>") and, from v1, the
session's lifetime is answered (KIP-368: the client re-authenticates before it ends; 0: never).
A failed authentication answers SASL_AUTHENTICATION_FAILED with a message that never holds the
secret, and the connection is closed after the answer, as Kafka does. A re-authentication must
prove the same principal; it moves the session's end."""

from __future__ import annotations

import asyncio
import datetime
import logging
import time

from kio.schema.errors import ErrorCode

from auth.exchange import AuthenticationFailed
from auth.session import has_control_character

from ..codec import build
from ..metrics import SASL_AUTHENTICATIONS
from ..registry import handles

log = logging.getLogger("neve.broker.sasl")


@handles(36, "SaslAuthenticate", 0, 2)
async def sasl_authenticate(ctx, request):
    session = ctx.session
    exchange = session.exchange
    if not session.uses_sasl or exchange is None:
        message = "SaslAuthenticate received after successful authentication" if session.authenticated else "SaslAuthenticate received before SaslHandshake"
        session.close_after_reply = session.close_after_reply or not session.authenticated
        return _answer(ctx, ErrorCode.illegal_sasl_state, message)
    reauthenticating = session.authenticated
    try:
        server_bytes, done, user = await exchange.step(request.auth_bytes)
        if done and has_control_character(user):
            raise AuthenticationFailed("the authenticated name holds a control character")
        if done and reauthenticating and f"User:{user}" != session.principal:
            raise AuthenticationFailed(f"Cannot change principals during re-authentication from {session.principal}: User:{user}")
    except AuthenticationFailed as e:
        session.exchange = None
        session.authenticated = False  # nothing more is served on this connection, re-authenticating or not
        session.close_after_reply = True
        SASL_AUTHENTICATIONS.labels(exchange.mechanism, "failure").inc()
        delay = ctx.services.sasl.failed_from(session.host)
        log.warning(
            "sasl_authentication_failed",
            extra={"mechanism": exchange.mechanism, "host": session.host, "listener": session.listener, "reauthentication": reauthenticating, "reason": str(e), "answer_delay_s": delay},
        )
        if delay:
            await asyncio.sleep(delay)  # the connection reads nothing meanwhile (connection.py): one guess at a time
        return _answer(ctx, ErrorCode.sasl_authentication_failed, str(e))
    if not done:
        return _answer(ctx, ErrorCode.none, None, server_bytes)
    lifetime_ms = exchange.session_lifetime_ms()
    session.principal = f"User:{user}"
    session.authenticated = True
    session.exchange = None
    session.expires_at = time.monotonic() + lifetime_ms / 1000 if lifetime_ms else None
    SASL_AUTHENTICATIONS.labels(exchange.mechanism, "success").inc()
    log.info(
        "sasl_authenticated",
        extra={"mechanism": exchange.mechanism, "principal": session.principal, "host": session.host, "listener": session.listener, "reauthentication": reauthenticating, "session_lifetime_ms": lifetime_ms},
    )
    return _answer(ctx, ErrorCode.none, None, server_bytes, lifetime_ms)


def _answer(ctx, code, message, auth_bytes=b"", lifetime_ms=0):
    return build(
        ctx.response.SaslAuthenticateResponse,
        error_code=code,
        error_message=message,
        auth_bytes=auth_bytes,
        session_lifetime=datetime.timedelta(milliseconds=lifetime_ms),
    )
