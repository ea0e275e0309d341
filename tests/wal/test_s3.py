"""The S3 backend (wal/s3.py) against a real SeaweedFS, and what it puts on the wire."""

from __future__ import annotations

import asyncio
import hashlib
import os
import uuid

import pytest

from wal.s3 import from_url
from wal.store import ObjectExists


@pytest.fixture
def aws_env(seaweedfs, monkeypatch):
    for key, value in seaweedfs.env.items():
        monkeypatch.setenv(key, value)


@pytest.mark.parametrize("unsigned", ["true", "false"])
async def test_objects_round_trip_with_signed_and_unsigned_bodies(seaweedfs, aws_env, unsigned):
    """SeaweedFS checks signatures (the fixture gives it credentials), so a PUT it stores was signed
    in the way it expects, with the body's SHA-256 or with UNSIGNED-PAYLOAD."""
    prefix = f"s3-{uuid.uuid4().hex[:8]}"
    store = from_url(seaweedfs.object_store_url(prefix) + f"&unsigned_payload={unsigned}")
    data = os.urandom(3 * 1024 * 1024 + 17)
    try:
        await store.put("wal/0001", data)
        assert await store.get("wal/0001") == data
        assert await store.get("wal/0001", 1_000_000, 1_000_123) == data[1_000_000:1_000_123]
        with pytest.raises(ObjectExists):
            await store.put("wal/0001", b"other bytes")
        assert await store.get("wal/0001") == data
        assert [(o.key, o.size) async for o in store.list("wal/")] == [("wal/0001", len(data))]
    finally:
        await store.delete("wal/0001")
        await store.close()


async def test_an_object_put_from_its_parts_reads_back_joined(seaweedfs, aws_env):
    prefix = f"s3-{uuid.uuid4().hex[:8]}"
    store = from_url(seaweedfs.object_store_url(prefix))
    parts = [b"header", *(os.urandom(80_000) for _ in range(40)), b"", b"footer"]
    joined = b"".join(parts)
    try:
        await store.put_parts("wal/0002", parts)
        assert await store.get("wal/0002") == joined
        with pytest.raises(ObjectExists):
            await store.put_parts("wal/0002", [b"other bytes"])
        assert [(o.key, o.size) async for o in store.list("wal/")] == [("wal/0002", len(joined))]
    finally:
        await store.delete("wal/0002")
        await store.close()


class _RecordingS3:
    """A loopback HTTP endpoint that answers every request 200 and keeps its headers."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str], int]] = []
        self.server: asyncio.AbstractServer | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc) -> None:
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                self.requests.append((lines[0].split(" ")[0], headers, len(body)))
                writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: 0\r\nETag: "e"\r\n\r\n')
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.mark.parametrize(("query", "expect_unsigned"), [("", True), ("&unsigned_payload=false", False)])
async def test_put_bodies_are_unsigned_unless_asked(monkeypatch, query, expect_unsigned):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    recorder = _RecordingS3()
    async with recorder as endpoint:
        store = from_url(f"s3://bucket/p?endpoint={endpoint}&retries=0{query}")
        await store.put("k", b"x" * 1000)
        await store.close()
    [(method, headers, length)] = recorder.requests
    assert (method, length) == ("PUT", 1000)
    assert headers["authorization"].startswith("AWS4-HMAC-SHA256 ")  # the request itself is signed either way
    if expect_unsigned:
        assert headers["x-amz-content-sha256"] == "UNSIGNED-PAYLOAD"
    else:
        assert headers["x-amz-content-sha256"] == hashlib.sha256(b"x" * 1000).hexdigest()


async def test_parts_go_out_as_one_put_of_the_whole_object(monkeypatch):
    """No multipart upload: one PUT request per object is what the WAL's cost model counts on."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    recorder = _RecordingS3()
    parts = [b"h" * 10, b"x" * 6_000_000, b"", b"f" * 7]  # over obstore's 5 MiB multipart chunk size
    async with recorder as endpoint:
        store = from_url(f"s3://bucket/p?endpoint={endpoint}&retries=0")
        await store.put_parts("k", parts)
        await store.close()
    [(method, headers, length)] = recorder.requests
    assert (method, length) == ("PUT", 6_000_017)
    assert headers["if-none-match"] == "*"  # create-only, as every WAL object put is


def test_unsigned_payload_takes_true_or_false_only():
    with pytest.raises(ValueError, match="unsigned_payload"):
        from_url("s3://bucket/p?endpoint=http://127.0.0.1:1&unsigned_payload=maybe")
