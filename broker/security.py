"""The broker's authentication and authorization, assembled from its settings: the SASL
mechanisms its SASL listeners offer, the SCRAM users an operator bootstraps from a file, and
(with the authorizer on) the ACL authorizer. The mechanisms themselves live in auth/."""

from __future__ import annotations

import asyncio
import logging

from auth.authorizer import Authorizer
from auth.credentials import ScramCredentials
from auth.oauthbearer import JwtValidation
from auth.sasl import SaslMechanisms

from .config import BrokerConfig

log = logging.getLogger("neve.broker.security")

SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")


def mechanism_names(settings: BrokerConfig) -> list[str]:
    return [m.strip().upper() for m in settings.sasl_enabled_mechanisms.split(",") if m.strip()]


def sasl_mechanisms(settings: BrokerConfig, credentials: ScramCredentials) -> SaslMechanisms:
    """What the SASL listeners offer, as the settings say; ValueError for settings that cannot be
    used (an unknown mechanism, OAUTHBEARER without a way to check tokens)."""
    names = mechanism_names(settings)
    jwt = None
    if "OAUTHBEARER" in names:
        source = settings.sasl_oauthbearer_jwks
        remote = source.startswith(("https://", "http://"))
        if source.startswith("http://") and not settings.sasl_oauthbearer_allow_http_jwks:
            raise ValueError(f"OAUTHBEARER's JWKS URL {source} is not https: anyone on its path could sign tokens (broker.sasl_oauthbearer_allow_http_jwks allows it)")
        if source and not settings.sasl_oauthbearer_audience and not settings.sasl_oauthbearer_allow_any_audience:
            raise ValueError(
                "OAUTHBEARER needs broker.sasl_oauthbearer_audience: without it a token issued for any other service is accepted "
                "(broker.sasl_oauthbearer_allow_any_audience allows that)"
            )
        jwt = JwtValidation(
            allow_unsecured=settings.sasl_oauthbearer_allow_unsecured,
            jwks_file=None if remote or not source else source,
            jwks_url=source if remote else None,
            issuer=settings.sasl_oauthbearer_issuer or None,
            audience=settings.sasl_oauthbearer_audience or None,
            principal_claim=settings.sasl_oauthbearer_sub_claim,
            clock_skew_s=settings.sasl_oauthbearer_clock_skew_s,
        )
    return SaslMechanisms(
        names,
        credentials,
        plain_users_file=settings.sasl_plain_users_file or None,
        jwt=jwt,
        connections_max_reauth_ms=settings.connections_max_reauth_ms,
        failed_delay_ms=settings.failed_authentication_delay_ms,
    )


def _read_users(path: str) -> list[tuple[str, str]]:
    users = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            user, sep, password = line.partition(":")
            if not sep or not user.strip() or not password:
                raise ValueError(f"{path}, line {number}: not user:password")
            users.append((user.strip(), password))
    return users


async def bootstrap_scram_users(path: str, credentials: ScramCredentials) -> list[str]:
    """Create the SCRAM users of `path` (`user:password` a line) that have no credential yet,
    for both SCRAM mechanisms; users already there keep theirs (a password changed since through
    AlterUserScramCredentials is not overwritten at every restart). The users created."""
    created = []
    for user, password in await asyncio.to_thread(_read_users, path):
        for mechanism in SCRAM_MECHANISMS:
            if credentials.lookup(mechanism, user) is None:
                await credentials.bootstrap(user, password, mechanism)
                created.append(f"{user} ({mechanism})")
    if created:
        log.info("scram_users_created", extra={"users": created, "file": path})
    return created


def authorizer(settings: BrokerConfig, metadata) -> Authorizer | None:
    """The ACL authorizer when `authorizer_enabled`, else None (every request allowed)."""
    if not settings.authorizer_enabled:
        return None
    super_users = [u.strip() for u in settings.super_users.split(";") if u.strip()]
    bad = [u for u in super_users if not u.startswith("User:")]
    if bad:
        raise ValueError(f"super users are principals written User:<name>, not {', '.join(bad)}")
    return Authorizer(metadata, super_users, settings.allow_everyone_if_no_acl_found)
