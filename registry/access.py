"""Who may call the registry's REST API, as Confluent's registry with authentication.method=BASIC:
HTTP Basic credentials checked against a users file and, in a broker, the SCRAM store; and what
each user may do.

Roles (a user holds the highest it is given; each includes the ones above it in this list):
    read    GET anything; look a schema up in a subject (POST /subjects/{s}) and test
            compatibility (POST /compatibility/...), which change nothing (Confluent counts
            them as subject reads too)
    write   and register schemas (POST /subjects/{s}/versions)
    admin   and change or reset compatibility levels and modes (PUT, DELETE /config, /mode),
            and delete versions and subjects
    prefix:<p>  limits the user to subjects starting with <p> (several: any of them). A request
            naming another subject is refused (403); listings (GET /subjects, a schema id's
            subjects and versions) leave the others out; a schema is read by id only when a
            subject the user sees holds it; global config and mode changes are refused, since
            they reach every subject.
A user with no role authenticates and is refused everything (403).

The users file is Jetty's PropertyFileLoginModule format, as Confluent's registry reads it:
    # a comment
    alice: alice-secret,write,prefix:orders-
    bob: bob-secret,read
Passwords are plain text only: Jetty's OBF:, MD5: and CRYPT: forms are refused when the file is
read, rather than taken as literal passwords.

No credentials or wrong ones: 401 with `WWW-Authenticate: Basic realm="neve-registry"`; allowed
in but not to this: 403. Each refusal is counted (neve_registry_auth_failures_total) and logged
with the user's name, never the password.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from enum import IntEnum

from prometheus_client import Counter

log = logging.getLogger("neve.registry")

REALM = "neve-registry"
CheckPassword = Callable[[str, str], Awaitable[bool]]
"""`await check(user, password)`: whether the SCRAM store holds this user with this password
(computed off the event loop by whoever provides it)."""

FAILURES = Counter(
    "neve_registry_auth_failures_total",
    "Schema registry requests refused: no_credentials, bad_credentials (401: none given; a wrong user or password), malformed (401: not Basic user:password), forbidden (403: without the role or subject prefix)",
    ["reason"],
)
_HASHED = ("OBF:", "MD5:", "CRYPT:")


class Role(IntEnum):
    READ = 1
    WRITE = 2
    ADMIN = 3


@dataclass(frozen=True)
class Grant:
    """What one caller may do: `role` None for none; `prefixes` empty for every subject."""

    user: str
    role: Role | None
    prefixes: tuple[str, ...] = ()

    def may(self, needed: Role) -> bool:
        return self.role is not None and self.role >= needed

    def sees(self, subject: str) -> bool:
        return not self.prefixes or subject.startswith(self.prefixes)


def grant_of(user: str, roles: Iterable[str], where: str) -> Grant:
    """The grant of `roles` as written in a users file or a setting; ValueError names `where`."""
    role: Role | None = None
    prefixes: list[str] = []
    for item in (r.strip() for r in roles):
        if not item:
            continue
        if item.startswith("prefix:"):
            prefixes.append(item[len("prefix:") :])
            continue
        try:
            named = Role[item.upper()]
        except KeyError:
            raise ValueError(f"{where}: unknown role {item!r} (read, write, admin or prefix:<subject prefix>)") from None
        role = named if role is None else max(role, named)
    return Grant(user, role, tuple(prefixes))


@dataclass(frozen=True)
class User:
    password: str
    grant: Grant


def parse_users(text: str, where: str) -> dict[str, User]:
    """A users file's lines `user: password[,role ...]`; ValueError names the line."""
    users: dict[str, User] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith(("#", "!")):
            continue
        at = f"{where}:{number}"
        name, colon, rest = line.partition(":")
        name = name.strip()
        if not colon or not name:
            raise ValueError(f"{at}: not `user: password,role,...`")
        password, *roles = rest.strip().split(",")
        password = password.strip()
        if not password:
            raise ValueError(f"{at}: user {name!r} has no password")
        if password.startswith(_HASHED):
            raise ValueError(f"{at}: user {name!r}: obfuscated or hashed passwords ({', '.join(_HASHED)}) are not supported; write it in plain text")
        users[name] = User(password, grant_of(name, roles, at))
    return users


class Unauthenticated(Exception):
    """401: no credentials, or wrong ones (`reason` as the failures counter's label)."""

    def __init__(self, reason: str, user: str | None = None) -> None:
        super().__init__(reason)
        self.reason, self.user = reason, user


class Access:
    """Authenticates a request's Authorization header to a Grant. `users`: the users file's (they
    are checked there, and only there); `check_password`: the SCRAM store's, for anyone else, who
    gets `scram_grant`'s role and prefixes; `anonymous`: the grant of a request without
    credentials, None to refuse it."""

    def __init__(self, users: dict[str, User] | None = None, check_password: CheckPassword | None = None, scram_grant: Grant | None = None, anonymous: Grant | None = None) -> None:
        self._users = users or {}
        self._check_password = check_password
        self._scram_grant = scram_grant or Grant("", Role.READ)
        self._anonymous = anonymous

    async def authenticate(self, authorization: str | None) -> Grant:
        if authorization is None:
            if self._anonymous is None:
                raise Unauthenticated("no_credentials")
            return self._anonymous
        credentials = _basic(authorization)
        if credentials is None:
            raise Unauthenticated("malformed")
        user, password = credentials
        grant = await self._check(user, password)
        if grant is None:
            raise Unauthenticated("bad_credentials", user)
        return grant

    async def _check(self, user: str, password: str) -> Grant | None:
        known = self._users.get(user)
        if known is not None:
            # constant time: the comparison's duration says nothing of how much of it matched
            return known.grant if hmac.compare_digest(known.password.encode(), password.encode()) else None
        if self._check_password is not None and await self._check_password(user, password):
            return Grant(user, self._scram_grant.role, self._scram_grant.prefixes)
        return None


def _basic(header: str) -> tuple[str, str] | None:
    scheme, _, encoded = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, colon, password = decoded.partition(":")
    return (user, password) if colon and user else None


def refused(reason: str, user: str | None, client: str | None, method: str, path: str) -> None:
    """Counts and logs one refused request (its password is never at hand here)."""
    FAILURES.labels(reason).inc()
    log.warning("registry_auth_failed", extra={"reason": reason, "user": user, "client": client, "method": method, "path": path})


def load_access(users_file: str = "", scram_users: bool = False, scram_roles: str = "read", anonymous: str = "", check_password: CheckPassword | None = None) -> Access | None:
    """The settings' Access (registry/config.py names them); None when the registry is open
    (no users and no anonymous roles set). Reads the users file: call it off the event loop.
    ValueError for a malformed file or role, or SCRAM users without a `check_password`."""
    users = None
    if users_file:
        with open(users_file, encoding="utf-8") as f:
            users = parse_users(f.read(), users_file)
    if scram_users and check_password is None:
        raise ValueError("registry.scram_users needs the SCRAM store, which only a registry run in a broker has")
    has_users = users is not None or scram_users
    if anonymous.strip().lower() == "none" or (not anonymous and has_users):
        anonymous_grant = None
    elif not anonymous:
        return None
    else:
        anonymous_grant = grant_of("ANONYMOUS", anonymous.split(","), "registry.anonymous")
    scram_grant = grant_of("", scram_roles.split(","), "registry.scram_roles")
    return Access(users, check_password if scram_users else None, scram_grant, anonymous_grant)
