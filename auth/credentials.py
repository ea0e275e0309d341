"""SCRAM credentials (SCRAM-SHA-256, SCRAM-SHA-512) kept in the metadata store's security family,
one key per mechanism and user: the salt, the iteration count, the stored key and the server key,
never the password (RFC 5802). Every broker reads them from its store's view, so a user created
through any broker authenticates on all of them; the password check behind PLAIN and the schema
registry's Basic auth uses the same keys.

Password checks (PBKDF2, a few milliseconds each) run on a pool of their own, HASH_THREADS
threads, so that a flood of wrong passwords waits there instead of taking the default executor
that other work (compacted-topic reads) shares; an unknown user's check hashes against a made-up
credential, so that it takes as long as a known one's."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import secrets
from collections import OrderedDict
from collections.abc import Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from scramp.utils import saslprep

from metadata.store import MAX_SECURITY_KEY_BYTES

PREFIX = "scram/"
# Kafka's ScramMechanism ids, as DescribeUserScramCredentials and AlterUserScramCredentials carry
# them (KIP-554), and the hash each mechanism uses.
MECHANISM_IDS = {"SCRAM-SHA-256": 1, "SCRAM-SHA-512": 2}
MECHANISM_NAMES = {v: k for k, v in MECHANISM_IDS.items()}
_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
# Kafka's bounds for both mechanisms: fewer iterations make a stolen key cheap to crack, more make
# every authentication expensive for the broker.
MIN_ITERATIONS, MAX_ITERATIONS = 4096, 16384
DEFAULT_ITERATIONS = 8192
# The SCRAM library refuses shorter salts when it authenticates, so a credential with one could
# never be used; Kafka's own clients send 20 or more bytes.
MIN_SALT_BYTES = 12
MAX_SALT_BYTES = 1024  # a credential stays a small item of the security family
# The password check prefers the stronger hash when a user has both credentials.
_CHECK_ORDER = ("SCRAM-SHA-512", "SCRAM-SHA-256")
HASH_THREADS = 2  # password checks at once, per process (see the module doc)
_hashing = ThreadPoolExecutor(max_workers=HASH_THREADS, thread_name_prefix="password-hash")


class SecurityItems(Protocol):
    """The part of the metadata store (metadata/store.py) credentials are kept in."""

    def security_items(self, prefix: str) -> dict[str, bytes]: ...

    async def security_write(self, writes: Mapping[str, bytes | None]) -> None: ...

    def security_version(self) -> int: ...


class UnacceptableCredential(ValueError):
    """A credential Kafka's AlterUserScramCredentials refuses (UNACCEPTABLE_CREDENTIAL)."""


@dataclass(frozen=True, slots=True)
class ScramCredential:
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    def encode(self) -> bytes:
        b64 = base64.b64encode
        return json.dumps({"salt": b64(self.salt).decode(), "iterations": self.iterations, "stored_key": b64(self.stored_key).decode(), "server_key": b64(self.server_key).decode()}, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> ScramCredential:
        d = json.loads(data)
        b64 = base64.b64decode
        return cls(b64(d["salt"]), int(d["iterations"]), b64(d["stored_key"]), b64(d["server_key"]))


def key_of(mechanism: str, user: str) -> str:
    return f"{PREFIX}{mechanism}/{user}"


# The cluster's secret for the made-up credentials of unknown users (scram.py), in the security
# family beside the credentials: every broker answers an unknown name with the same salt.
UNKNOWN_USER_KEY = "scram-unknown-user-key"


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    """RFC 5802's Hi(Normalize(password), salt, i): what a Kafka client sends in AlterUserScramCredentials.
    PBKDF2: milliseconds of CPU, never on the event loop."""
    return hashlib.pbkdf2_hmac(_HASHES[mechanism], saslprep(password).encode(), salt, iterations)


def check_user_name(user: str) -> None:
    """Refuse a user name no credential can be kept under."""
    if not user:
        raise UnacceptableCredential("Username must not be empty")
    if len(key_of("SCRAM-SHA-256", user).encode()) > MAX_SECURITY_KEY_BYTES:
        raise UnacceptableCredential(f"Username is too long: at most {MAX_SECURITY_KEY_BYTES - len(key_of('SCRAM-SHA-256', ''))} bytes")


def credential_from_salted_password(mechanism: str, salt: bytes, iterations: int, salted: bytes) -> ScramCredential:
    """The stored and server keys of a salted password, refusing what Kafka refuses."""
    if mechanism not in _HASHES:
        raise KeyError(mechanism)
    if iterations < MIN_ITERATIONS:
        raise UnacceptableCredential(f"Too few iterations: {iterations} (at least {MIN_ITERATIONS})")
    if iterations > MAX_ITERATIONS:
        raise UnacceptableCredential(f"Too many iterations: {iterations} (at most {MAX_ITERATIONS})")
    if not MIN_SALT_BYTES <= len(salt) <= MAX_SALT_BYTES:
        raise UnacceptableCredential(f"The salt is {len(salt)} bytes long: {MIN_SALT_BYTES} to {MAX_SALT_BYTES} are accepted")
    if not 0 < len(salted) <= MAX_SALT_BYTES:
        raise UnacceptableCredential("The salted password is empty or too long")
    name = _HASHES[mechanism]
    client_key = hmac.digest(salted, b"Client Key", name)
    return ScramCredential(salt, iterations, hashlib.new(name, client_key).digest(), hmac.digest(salted, b"Server Key", name))


class ScramCredentials:
    """The credentials of every user, from the store's view. Reads are synchronous and rebuilt only
    when the security family has changed (`security_version`); writes go to the store, and are seen
    here (and on every other broker) once its view has them."""

    def __init__(self, store: SecurityItems, *, checked_passwords: int = 10_000) -> None:
        self.store = store
        self._version: int | None = None
        self._by_key: dict[tuple[str, str], ScramCredential] = {}
        # Passwords that passed `check_password`, by a keyed hash (the key never leaves this
        # process): a client reconnecting with the same password skips PBKDF2. Each entry holds
        # the stored key it matched, so a changed or removed credential no longer matches.
        self._hash_key = secrets.token_bytes(32)
        self._checked: OrderedDict[bytes, bytes] = OrderedDict()
        self._checked_max = checked_passwords
        # what an unknown user's password is checked against (never matches: no stored key is zeros)
        self._made_up = ScramCredential(secrets.token_bytes(32), DEFAULT_ITERATIONS, bytes(64), bytes(64))

    def _view(self) -> dict[tuple[str, str], ScramCredential]:
        version = self.store.security_version()
        if version != self._version:
            by_key = {}
            for key, value in self.store.security_items(PREFIX).items():
                mechanism, _, user = key[len(PREFIX) :].partition("/")
                if mechanism in _HASHES and user:
                    by_key[(mechanism, user)] = ScramCredential.decode(value)
            self._by_key, self._version = by_key, version
        return self._by_key

    def lookup(self, mechanism: str, user: str) -> ScramCredential | None:
        return self._view().get((mechanism, user))

    def unknown_user_key(self) -> bytes:
        """The cluster's key for unknown users' made-up credentials (`ensure_unknown_user_key`);
        this process's own until the store has one."""
        return self.store.security_items(UNKNOWN_USER_KEY).get(UNKNOWN_USER_KEY) or self._hash_key

    async def ensure_unknown_user_key(self) -> None:
        """Store a random key for unknown users' made-up credentials if the cluster has none (at a
        broker's start; two brokers starting at once may both write one: the last stays, and
        every broker's view follows it)."""
        if UNKNOWN_USER_KEY not in self.store.security_items(UNKNOWN_USER_KEY):
            await self.store.security_write({UNKNOWN_USER_KEY: secrets.token_bytes(32)})

    def users(self) -> dict[str, dict[str, int]]:
        """Every user with a credential: {user: {mechanism: iterations}}."""
        out: dict[str, dict[str, int]] = {}
        for (mechanism, user), credential in self._view().items():
            out.setdefault(user, {})[mechanism] = credential.iterations
        return out

    async def write(self, upserts: Mapping[tuple[str, str], ScramCredential], deletions: Collection[tuple[str, str]] = ()) -> None:
        """Put and delete (mechanism, user) credentials in one atomic write; raises MetadataUnavailable."""
        writes: dict[str, bytes | None] = {key_of(m, u): None for m, u in deletions}
        writes.update({key_of(m, u): c.encode() for (m, u), c in upserts.items()})
        if writes:
            await self.store.security_write(writes)

    async def bootstrap(self, user: str, password: str, mechanism: str = "SCRAM-SHA-512", iterations: int = DEFAULT_ITERATIONS) -> ScramCredential:
        """Salt a password with a fresh salt and store its credential: for operators' bootstrap
        users and for tests (clients send a salted password instead, through the broker)."""
        check_user_name(user)
        salt = secrets.token_bytes(32)
        salted = await asyncio.to_thread(salted_password, mechanism, password, salt, iterations)
        credential = credential_from_salted_password(mechanism, salt, iterations, salted)
        await self.write({(mechanism, user): credential})
        return credential

    async def check_password(self, user: str, password: str) -> bool:
        """Whether `password` is the user's (the first of SCRAM-SHA-512 and SCRAM-SHA-256 it has
        a credential for). PBKDF2 runs off the event loop, and only once per password while the
        credential stays the same."""
        view = self._view()
        found = next(((m, view[(m, user)]) for m in _CHECK_ORDER if (m, user) in view), None)
        known = found is not None
        if found is None:  # hashed all the same, against a made-up credential: as slow as a known user's
            found = ("SCRAM-SHA-512", self._made_up)
        mechanism, credential = found
        tag = hmac.digest(self._hash_key, b"\0".join(x.encode("utf-8", "surrogatepass") for x in (mechanism, user, password)), "sha256")
        if known and hmac.compare_digest(self._checked.get(tag, b""), credential.stored_key):
            self._checked.move_to_end(tag)
            return True
        try:
            salted = await asyncio.get_running_loop().run_in_executor(_hashing, salted_password, mechanism, password, credential.salt, credential.iterations)
        except Exception:  # a password SASLprep refuses (prohibited characters) is no password of anyone's
            return False
        name = _HASHES[mechanism]
        stored_key = hashlib.new(name, hmac.digest(salted, b"Client Key", name)).digest()
        if not known or not hmac.compare_digest(stored_key, credential.stored_key):
            return False
        self._checked[tag] = stored_key
        if len(self._checked) > self._checked_max:
            self._checked.popitem(last=False)
        return True
