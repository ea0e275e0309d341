"""SCRAM credentials in the security family: what is stored (never the password), Kafka's bounds on
what AlterUserScramCredentials may store, the view following the family's version, and the
password check behind PLAIN and the registry's Basic auth (PBKDF2 once per password)."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest
from scramp import ScramMechanism

import auth.credentials as credentials_module
from auth.credentials import ScramCredential, ScramCredentials, UnacceptableCredential, credential_from_salted_password, salted_password


async def test_bootstrap_stores_the_keys_scramp_derives_and_never_the_password(store):
    creds = ScramCredentials(store)
    made = await creds.bootstrap("alice", "correct horse", "SCRAM-SHA-256", iterations=4096)
    items = store.security_items("scram/")
    assert list(items) == ["scram/SCRAM-SHA-256/alice"]
    raw = items["scram/SCRAM-SHA-256/alice"]
    assert b"correct horse" not in raw and base64.b64encode(b"correct horse") not in raw
    assert set(json.loads(raw)) == {"salt", "iterations", "stored_key", "server_key"}
    salt, stored_key, server_key, iterations = ScramMechanism("SCRAM-SHA-256").make_auth_info("correct horse", iteration_count=4096, salt=made.salt)
    assert creds.lookup("SCRAM-SHA-256", "alice") == ScramCredential(salt, iterations, stored_key, server_key)
    assert creds.lookup("SCRAM-SHA-512", "alice") is None


def test_a_clients_salted_password_gives_the_same_keys_as_the_password():
    salt = b"0123456789abcdefghij"
    salted = hashlib.pbkdf2_hmac("sha512", b"pw", salt, 8192)  # what a Kafka client sends (KIP-554)
    made = credential_from_salted_password("SCRAM-SHA-512", salt, 8192, salted)
    _, stored_key, server_key, _ = ScramMechanism("SCRAM-SHA-512").make_auth_info("pw", iteration_count=8192, salt=salt)
    assert (made.stored_key, made.server_key) == (stored_key, server_key)
    assert salted_password("SCRAM-SHA-512", "pw", salt, 8192) == salted


@pytest.mark.parametrize(
    ("iterations", "salt", "salted", "message"),
    [
        (4095, b"s" * 20, b"x" * 64, "Too few iterations"),
        (16385, b"s" * 20, b"x" * 64, "Too many iterations"),
        (4096, b"s" * 11, b"x" * 64, "salt is 11 bytes"),
        (4096, b"s" * 1025, b"x" * 64, "salt is 1025 bytes"),
        (4096, b"s" * 20, b"", "salted password is empty"),
    ],
)
def test_kafkas_bounds_on_a_credential(iterations, salt, salted, message):
    with pytest.raises(UnacceptableCredential, match=message):
        credential_from_salted_password("SCRAM-SHA-256", salt, iterations, salted)
    assert credential_from_salted_password("SCRAM-SHA-256", b"s" * 12, 16384, b"x").iterations == 16384  # the bounds themselves are fine


async def test_the_view_is_rebuilt_only_when_the_family_moves(store):
    reads = []
    items = store.security_items
    store.security_items = lambda prefix: reads.append(prefix) or items(prefix)
    creds = ScramCredentials(store)
    assert creds.users() == {}
    await creds.bootstrap("alice", "a", "SCRAM-SHA-256", 4096)
    await creds.bootstrap("alice", "a", "SCRAM-SHA-512", 8192)
    await creds.bootstrap("bob", "b", "SCRAM-SHA-512", 4096)
    assert creds.users() == {"alice": {"SCRAM-SHA-256": 4096, "SCRAM-SHA-512": 8192}, "bob": {"SCRAM-SHA-512": 4096}}
    assert creds.lookup("SCRAM-SHA-512", "bob") is not None
    assert len(reads) == 2  # once before the writes, once after them
    # Another broker's view: a write made through this one is seen there as the family moves.
    other = ScramCredentials(store)
    await creds.write({}, [("SCRAM-SHA-512", "bob")])
    assert other.lookup("SCRAM-SHA-512", "bob") is None and creds.users() == {"alice": {"SCRAM-SHA-256": 4096, "SCRAM-SHA-512": 8192}}


async def test_password_check_runs_pbkdf2_once_per_password_and_follows_a_changed_credential(store, monkeypatch):
    creds = ScramCredentials(store)
    await creds.bootstrap("alice", "first", "SCRAM-SHA-256", 4096)
    await creds.bootstrap("alice", "first", "SCRAM-SHA-512", 4096)
    derived = []
    real = credentials_module.salted_password
    monkeypatch.setattr(credentials_module, "salted_password", lambda m, *a: derived.append(m) or real(m, *a))

    assert await creds.check_password("alice", "first")
    assert await creds.check_password("alice", "first")
    assert derived == ["SCRAM-SHA-512"]  # the stronger hash, and once: the second check was cached
    assert not await creds.check_password("alice", "wrong")
    assert not await creds.check_password("alice", "wrong")
    assert derived == ["SCRAM-SHA-512"] * 3  # failures are never cached
    assert not await creds.check_password("nobody", "first")
    assert not await creds.check_password("alice", "fir\udc80st")  # not text a client could have sent: no password

    await creds.bootstrap("alice", "second", "SCRAM-SHA-512", 4096)  # a new password: the cached check no longer holds
    assert not await creds.check_password("alice", "first")
    assert await creds.check_password("alice", "second")
    await creds.write({}, [("SCRAM-SHA-512", "alice")])  # then the SHA-256 credential is the one checked
    assert await creds.check_password("alice", "first")
    assert not await creds.check_password("alice", "second")
