"""bench/servers.py's PostgreSQL launcher, as the test fixtures use it: a real server on loopback,
a fresh database per test, a restart that keeps the data, a clean stop."""

from __future__ import annotations

import psycopg2
import pytest

from bench.servers import Postgres


def _query(url: str, sql: str) -> list[tuple]:
    with psycopg2.connect(url) as conn, conn.cursor() as cur:
        cur.execute(sql)
        return cur.fetchall() if cur.description else []


def test_each_test_gets_a_database_of_its_own(postgres_server, postgres_db):
    other = postgres_server.create_database("another_one")
    _query(postgres_db, "CREATE TABLE t (k int PRIMARY KEY, v bytea)")
    _query(postgres_db, "INSERT INTO t VALUES (1, '\\x00ff'::bytea)")
    assert [(k, bytes(v)) for k, v in _query(postgres_db, "SELECT k, v FROM t")] == [(1, b"\x00\xff")]
    assert _query(other, "SELECT count(*) FROM pg_tables WHERE tablename = 't'") == [(0,)]
    assert _query(postgres_db, "SHOW listen_addresses") == [("127.0.0.1",)]


def test_restart_keeps_the_data_and_stop_removes_it(tmp_path):
    server = Postgres(tmp_path, tmp_path / "postgres.log", durable=False)
    try:
        server.start()
        url = server.create_database("kept")
        _query(url, "CREATE TABLE t AS SELECT 42 AS answer")
        server.stop()
        assert server.process.poll() is not None
        with pytest.raises(psycopg2.OperationalError):
            _query(url, "SELECT 1")
        server.start()
        assert _query(url, "SELECT answer FROM t") == [(42,)]
        data_dir = server.data_dir
    finally:
        server.remove_data()
    assert not data_dir.exists()
    assert "database system is ready to accept connections" in (tmp_path / "postgres.log").read_text()
