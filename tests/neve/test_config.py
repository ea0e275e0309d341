"""Configuration: defaults < TOML file < NEVE_* environment < command line; mistakes fail loudly."""

from __future__ import annotations

import pytest

from neve.config import ConfigError, describe_defaults, load_config


def test_defaults():
    c = load_config(env={})
    assert (c.broker.port, c.wal.linger_ms, c.wal.flush_bytes, c.broker.auto_create_topics) == (9092, 200, 4 * 1024 * 1024, False)


def test_precedence_file_env_flags(tmp_path):
    path = tmp_path / "neve.toml"
    path.write_text('[broker]\nport = 9100\nzone = "a"\n[wal]\nlinger_ms = 50\nflush_bytes = 1024\n')
    c = load_config(str(path), env={"NEVE_WAL_LINGER_MS": "5", "NEVE_BROKER_AUTO_CREATE_TOPICS": "true"}, broker__port=9200)
    assert c.broker.port == 9200  # flag over file
    assert c.wal.linger_ms == 5  # env over file
    assert c.wal.flush_bytes == 1024  # file over default
    assert c.broker.zone == "a" and c.broker.auto_create_topics is True


@pytest.mark.parametrize(
    "env, message",
    [
        ({"NEVE_FAULT_DROP_PRODUCE_RESPONSE_EVERY": "7"}, "not a neve option"),
        ({"NEVE_WAL_LINGERMS": "7"}, "unknown option 'lingerms'"),
        ({"NEVE_WAL_LINGER_MS": "soon"}, "cannot use 'soon'"),
        ({"NEVE_BROKER_AUTO_CREATE_TOPICS": "maybe"}, "cannot use 'maybe'"),
    ],
)
def test_mistakes_fail_with_the_variable_named(env, message):
    with pytest.raises(ConfigError, match=message) as raised:
        load_config(env=env)
    assert next(iter(env)) in str(raised.value)


def test_bad_file_is_named(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[wal\n")
    with pytest.raises(ConfigError, match="bad.toml"):
        load_config(str(path), env={})


def test_every_option_is_documented_with_its_variable():
    text = describe_defaults()
    for name in ("NEVE_WAL_LINGER_MS", "NEVE_BROKER_ZONE", "NEVE_METADATA_URL", "NEVE_FAULTS_DROP_PRODUCE_RESPONSE_EVERY", "NEVE_WAL_ORPHAN_GRACE_S"):
        line = next(line for line in text.splitlines() if name in line)
        assert line.split("#", 1)[1].split(":", 1)[1].strip(), f"{name} has no description"


@pytest.mark.parametrize(
    "env, pause_ms",
    [
        ({}, 20),  # the default, a tenth of the default 200 ms linger
        ({"NEVE_WAL_LINGER_MS": "20"}, 2.0),  # capped at a tenth of the linger
        ({"NEVE_WAL_LINGER_MS": "0"}, 0.0),  # no linger: no pause
        ({"NEVE_BROKER_PRODUCE_READ_PAUSE_MS": "0"}, 0),
        ({"NEVE_BROKER_PRODUCE_READ_PAUSE_MS": "12", "NEVE_WAL_LINGER_MS": "1000"}, 12),
    ],
)
def test_the_broker_pauses_reading_produce_requests_for_at_most_a_tenth_of_the_linger(env, pause_ms):
    from neve.node import broker_settings

    assert broker_settings(load_config(env=env)).produce_read_pause_ms == pause_ms


def test_neve_dev_lingers_briefly_and_creates_topics_and_every_layer_still_overrides(tmp_path):
    dev = load_config(env={}, dev=True)
    assert (dev.wal.linger_ms, dev.broker.auto_create_topics) == (5, True)
    path = tmp_path / "neve.toml"
    path.write_text("[wal]\nlinger_ms = 50\n")
    assert load_config(str(path), env={}, dev=True).wal.linger_ms == 50
    assert load_config(env={"NEVE_BROKER_AUTO_CREATE_TOPICS": "false"}, dev=True).broker.auto_create_topics is False
    assert (load_config(env={}).wal.linger_ms, load_config(env={}).broker.auto_create_topics) == (200, False)


def test_the_produce_deadline_never_ends_before_the_wal_upload_does():
    from neve.node import broker_settings

    assert broker_settings(load_config(env={})).produce_timeout_ms == 25_000  # 10 s upload + 15 s commit
    assert broker_settings(load_config(env={"NEVE_WAL_UPLOAD_TIMEOUT_MS": "30000"})).produce_timeout_ms == 45_000
    assert broker_settings(load_config(env={"NEVE_BROKER_PRODUCE_TIMEOUT_MS": "60000"})).produce_timeout_ms == 60_000
    assert broker_settings(load_config(env={"NEVE_BROKER_PRODUCE_TIMEOUT_MS": "1000"})).produce_timeout_ms == 25_000
