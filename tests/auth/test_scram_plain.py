"""SCRAM exchanges driven by scramp's client side, and PLAIN against a credentials file or the
SCRAM store: who gets in, who does not, and that no refusal carries the secret."""

from __future__ import annotations

import hashlib

import pytest
from scramp import ScramClient

from auth.credentials import ScramCredentials, credential_from_salted_password
from auth.sasl import AuthenticationFailed, SaslMechanisms

SCRAMS = ["SCRAM-SHA-256", "SCRAM-SHA-512"]


async def mechanisms(store, **kwargs) -> SaslMechanisms:
    creds = ScramCredentials(store)
    for mechanism in SCRAMS:
        await creds.bootstrap("alice", "s3cret-pw", mechanism, 4096)
    kwargs.setdefault("enabled", ["PLAIN", *SCRAMS])
    return SaslMechanisms(credentials=creds, **kwargs)


async def scram_login(sasl: SaslMechanisms, mechanism: str, user: str, password: str):
    client = ScramClient([mechanism], user, password)
    exchange = sasl.start(mechanism)
    server_first, done, who = await exchange.step(client.get_client_first().encode())
    assert (done, who) == (False, None)
    client.set_server_first(server_first.decode())
    server_final, done, who = await exchange.step(client.get_client_final().encode())
    client.set_server_final(server_final.decode())  # the client checks the server knew its key too
    return done, who, exchange


@pytest.mark.parametrize("mechanism", SCRAMS)
async def test_scram_authenticates_the_user(store, mechanism):
    sasl = await mechanisms(store, connections_max_reauth_ms=60_000)
    done, who, exchange = await scram_login(sasl, mechanism, "alice", "s3cret-pw")
    assert (done, who) == (True, "alice")
    assert exchange.session_lifetime_ms() == 60_000


@pytest.mark.parametrize("mechanism", SCRAMS)
@pytest.mark.parametrize("user", ["alice", "mallory"])
async def test_scram_refuses_a_wrong_password_and_an_unknown_user_alike(store, mechanism, user):
    sasl = await mechanisms(store)
    with pytest.raises(AuthenticationFailed) as refused:
        await scram_login(sasl, mechanism, user, "guessed-pw")
    assert str(refused.value) == f"Authentication failed during authentication due to invalid credentials with SASL mechanism {mechanism}"


async def test_an_unknown_user_gets_the_same_made_up_salt_from_every_broker_shaped_as_a_real_one(store):
    """Issue 43, finding 6: the made-up credential of an unknown name was a 16-byte salt at 4,096
    iterations from a key each broker drew for itself: a name answered with another salt by two
    brokers, or with a salt unlike the real ones, was unknown. Now two brokers over one store
    (two credential views, two sets of mechanisms) give the same salt, as long as a real one
    (32 bytes, 8,192 iterations), and the same again after a restart."""
    import base64

    async def first(sasl, user):
        answer = (await sasl.start("SCRAM-SHA-512").step(f"n,,n={user},r=abcdefghijklmnop".encode()))[0].decode()
        return {k: v for k, v in (item.split("=", 1) for item in answer.split(","))}

    brokers = []
    for _ in range(2):
        creds = ScramCredentials(store)
        await creds.ensure_unknown_user_key()
        brokers.append(SaslMechanisms(["SCRAM-SHA-512"], creds))
    await brokers[0].credentials.bootstrap("alice", "s3cret-pw", "SCRAM-SHA-512")
    real = await first(brokers[0], "alice")
    made_up = [await first(b, "mallory") for b in brokers]
    assert made_up[0]["s"] == made_up[1]["s"] != real["s"]
    assert len(base64.b64decode(made_up[0]["s"])) == len(base64.b64decode(real["s"])) == 32
    assert made_up[0]["i"] == real["i"] == "8192"
    assert (await first(brokers[1], "trudy"))["s"] != made_up[0]["s"]  # another name, another salt
    restarted = ScramCredentials(store)
    await restarted.ensure_unknown_user_key()  # the cluster's key is kept
    assert (await first(SaslMechanisms(["SCRAM-SHA-512"], restarted), "mallory"))["s"] == made_up[0]["s"]


async def test_scram_with_the_credential_a_client_salted(store):
    creds = ScramCredentials(store)
    salt = b"client-made-salt-0123"
    salted = hashlib.pbkdf2_hmac("sha512", b"from-admin-client", salt, 4096)
    await creds.write({("SCRAM-SHA-512", "bob"): credential_from_salted_password("SCRAM-SHA-512", salt, 4096, salted)})
    sasl = SaslMechanisms(["SCRAM-SHA-512"], creds)
    assert (await scram_login(sasl, "SCRAM-SHA-512", "bob", "from-admin-client"))[:2] == (True, "bob")
    assert sasl.start("SCRAM-SHA-512").session_lifetime_ms() == 0  # no re-authentication asked


async def test_scram_refuses_delegation_tokens_and_a_foreign_authorization_id(store):
    sasl = await mechanisms(store)
    with pytest.raises(AuthenticationFailed, match="Delegation tokens are not supported"):
        await sasl.start("SCRAM-SHA-256").step(b"n,,n=alice,r=abcdefghijklmnop,tokenauth=true")
    with pytest.raises(AuthenticationFailed, match="authorization id that is different"):
        await sasl.start("SCRAM-SHA-256").step(b"n,a=bob,n=alice,r=abcdefghijklmnop")
    with pytest.raises(AuthenticationFailed, match="Authorization ids are not supported"):
        await sasl.start("SCRAM-SHA-256").step(b"n,a=alice,n=alice,r=abcdefghijklmnop")
    server_first, done, _ = await sasl.start("SCRAM-SHA-256").step(b"n,,n=alice,r=abcdefghijklmnop")
    assert server_first.startswith(b"r=abcdefghijklmnop") and not done


async def test_plain_against_the_scram_store(store):
    sasl = await mechanisms(store)
    assert await sasl.start("PLAIN").step(b"\0alice\0s3cret-pw") == (b"", True, "alice")
    assert await sasl.start("PLAIN").step(b"alice\0alice\0s3cret-pw") == (b"", True, "alice")
    for message in (b"\0alice\0wrong", b"\0nobody\0s3cret-pw"):
        with pytest.raises(AuthenticationFailed, match="^Authentication failed: Invalid username or password$"):
            await sasl.start("PLAIN").step(message)


@pytest.mark.parametrize(
    ("message", "why"),
    [
        (b"bob\0alice\0s3cret-pw", "authorization id that is different from username"),
        (b"alice\0s3cret-pw", "expected 3 tokens"),
        (b"\0\0s3cret-pw", "username not specified"),
        (b"\0alice\0", "password not specified"),
    ],
)
async def test_plain_refuses_malformed_and_foreign_requests(store, message, why):
    sasl = await mechanisms(store)
    with pytest.raises(AuthenticationFailed, match=why) as refused:
        await sasl.start("PLAIN").step(message)
    assert "s3cret" not in str(refused.value)


async def test_plain_against_a_credentials_file_read_again_when_it_changes(store, tmp_path):
    users = tmp_path / "users"
    users.write_text("# operators' users\nalice:pw:with:colons\n\ncarol:carol-pw\n")
    sasl = await mechanisms(store, enabled=["PLAIN"], plain_users_file=str(users))
    assert (await sasl.start("PLAIN").step(b"\0alice\0pw:with:colons"))[1:] == (True, "alice")
    with pytest.raises(AuthenticationFailed):  # the SCRAM store is not asked when a file is given
        await sasl.start("PLAIN").step(b"\0alice\0s3cret-pw")
    users.write_text("alice:rotated-password-longer\n")
    assert (await sasl.start("PLAIN").step(b"\0alice\0rotated-password-longer"))[1:] == (True, "alice")
    with pytest.raises(AuthenticationFailed):
        await sasl.start("PLAIN").step(b"\0carol\0carol-pw")


async def test_only_enabled_mechanisms_start_and_settings_are_checked(store):
    sasl = await mechanisms(store, enabled=["SCRAM-SHA-512"])
    assert sasl.offers("SCRAM-SHA-512") and not sasl.offers("PLAIN") and not sasl.offers("scram-sha-512")
    with pytest.raises(ValueError, match="not enabled"):
        sasl.start("PLAIN")
    with pytest.raises(ValueError, match="unsupported SASL mechanisms"):
        SaslMechanisms(["GSSAPI"])
    with pytest.raises(ValueError, match="credential store"):
        SaslMechanisms(["SCRAM-SHA-256"])
    with pytest.raises(ValueError, match="OAUTHBEARER needs"):
        SaslMechanisms(["OAUTHBEARER"])


async def test_password_checks_hash_on_their_own_pool_and_as_much_for_an_unknown_user(store, monkeypatch):
    """Issue 43, finding 5: every failed password cost a PBKDF2 on the default executor (which
    compacted-topic reads share), unbounded, and an unknown user's none at all (its name told by
    the answer's speed). Now each check, a known user's or not, hashes once, on the
    HASH_THREADS threads of the password pool, however many come at once."""
    import asyncio
    import threading

    import auth.credentials as credentials

    creds = ScramCredentials(store)
    await creds.bootstrap("alice", "s3cret-pw", "SCRAM-SHA-512", 4096)
    running, seen = [0, 0], []
    lock = threading.Lock()
    real = credentials.salted_password

    def counted(*args):
        with lock:
            running[0] += 1
            running[1] = max(running[1], running[0])
            seen.append(threading.current_thread().name)
        try:
            return real(*args)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(credentials, "salted_password", counted)
    checks = [creds.check_password("alice", f"guess-{i}") for i in range(10)] + [creds.check_password(f"nobody-{i}", "guess") for i in range(10)]
    assert await asyncio.gather(*checks) == [False] * 20
    assert len(seen) == 20  # the unknown users' checks hashed too
    assert all(name.startswith("password-hash") for name in seen) and running[1] <= credentials.HASH_THREADS
    assert await creds.check_password("alice", "s3cret-pw") and len(seen) == 21


def test_failed_authentications_from_one_address_wait_longer_each_time():
    sasl = SaslMechanisms(["PLAIN"], plain_users_file=None, credentials=object(), failed_delay_ms=100)
    waits = [sasl.failed_from("10.0.0.9", now=t) for t in range(8)]
    assert waits == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    assert sasl.failed_from("10.0.0.10", now=8) == 0.1  # another address: its own count
    assert sasl.failed_from("10.0.0.9", now=100) == 0.1  # a minute on: counted afresh
    assert SaslMechanisms(["PLAIN"], credentials=object(), failed_delay_ms=0).failed_from("10.0.0.9") == 0.0
