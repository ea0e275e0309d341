"""The S3-compatible object-store backend (production), over obstore (Rust's object_store).

obstore was chosen over aioboto3 by measurement (bench/s3_clients.py, numbers in
bench/RESULTS.md): against the same SeaweedFS it moved WAL-sized PUTs and ranged GETs 1.3-1.5x
faster at about a third of the client CPU per GiB, and its I/O runs on Rust threads, off the event
loop.

URL form: `s3://bucket/optional/prefix?endpoint=http://127.0.0.1:8333&region=us-east-1`;
credentials come from the usual AWS environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY).
Puts are conditional (If-None-Match: *), so an object is never overwritten. Every call has a
timeout and bounded retries with backoff.

Request bodies are not hashed into the signature by default (SigV4's UNSIGNED-PAYLOAD; the
request itself is still signed): hashing every PUT body with SHA-256 took a quarter of the
broker's CPU at 64 KiB records (perf, bench/RESULTS.md), and it buys little the stored bytes do
not already carry: every reader checks the footer's crc32c, every record batch carries the
CRC-32C that Kafka clients check, each section carries a crc32c (`wal.format.verify`), and over
HTTPS TLS protects the body in transit. `unsigned_payload=false` in the URL signs bodies again (worth
it only on a plain-HTTP link that an attacker could write to).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from urllib.parse import parse_qs, urlparse

from .store import ObjectExists, ObjectInfo, ObjectNotFound, ObjectStore, ObjectStoreError

log = logging.getLogger("neve.wal.s3")


class S3ObjectStore(ObjectStore):
    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint: str | None = None,
        region: str | None = None,
        timeout: float = 10.0,
        retries: int = 3,
        unsigned_payload: bool = True,
        access_key_id: str = "",
        secret_access_key: str = "",
    ) -> None:
        try:
            import obstore
            from obstore.store import S3Store
        except ImportError as e:  # pragma: no cover - depends on the installation
            raise ImportError("the S3 backend needs obstore: pip install 'neve[s3]'") from e
        self._obstore = obstore
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.timeout = timeout
        self.retries = retries
        config = {}
        if access_key_id:  # given (a table's own keys): they, not the environment's
            config["access_key_id"] = access_key_id
            config["secret_access_key"] = secret_access_key
        elif os.environ.get("AWS_ACCESS_KEY_ID"):
            config["access_key_id"] = os.environ["AWS_ACCESS_KEY_ID"]
            config["secret_access_key"] = os.environ.get("AWS_SECRET_ACCESS_KEY", "")
        self._store = S3Store(
            bucket,
            endpoint=endpoint,
            region=region or os.environ.get("AWS_REGION", "us-east-1"),
            client_options={
                "allow_http": bool(endpoint and endpoint.startswith("http://")),
                "timeout": timedelta(seconds=timeout),
                "connect_timeout": timedelta(seconds=min(timeout, 5.0)),
            },
            # We retry ourselves (with our own logs and deadline); obstore's own retries stay short.
            retry_config={"max_retries": 1, "retry_timeout": timedelta(seconds=timeout)},
            unsigned_payload=unsigned_payload,
            **config,
        )

    async def _call(self, what: str, coro_fn):
        from obstore.exceptions import AlreadyExistsError, NotFoundError, PreconditionError

        delay = 0.1
        for attempt in range(self.retries + 1):
            try:
                return await asyncio.wait_for(coro_fn(), self.timeout)
            except (AlreadyExistsError, PreconditionError):
                raise ObjectExists(what) from None
            except (NotFoundError, FileNotFoundError):
                raise ObjectNotFound(what) from None
            except Exception as e:
                if attempt == self.retries:
                    raise ObjectStoreError(f"{what}: {e!r}") from e
                log.warning("s3_retry", extra={"op": what, "attempt": attempt + 1, "error": repr(e)})
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def put(self, key: str, data: bytes) -> None:
        full = self.prefix + key
        await self._call(f"put {full}", lambda: self._obstore.put_async(self._store, full, data, mode="create"))

    async def put_parts(self, key: str, parts: Sequence[bytes]) -> None:
        """One PUT whose body is the parts in turn: obstore takes each buffer as it is, so the
        object is never joined (0.2-0.4 ms of CPU per 4 MiB object, measured in RESULTS.md)."""
        full = self.prefix + key
        parts = list(parts)  # a retry sends the same parts again
        await self._call(f"put {full}", lambda: self._obstore.put_async(self._store, full, parts, mode="create", use_multipart=False))

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        full = self.prefix + key
        if end is not None and end <= start:
            return b""

        async def fetch():
            if start == 0 and end is None:
                result = await self._obstore.get_async(self._store, full)
                return bytes(await result.bytes_async())
            if end is None:
                result = await self._obstore.get_async(self._store, full, options={"range": {"offset": start}})
                return bytes(await result.bytes_async())
            return bytes(await self._obstore.get_range_async(self._store, full, start=start, end=end))

        return await self._call(f"get {full}", fetch)

    async def size(self, key: str) -> int:
        full = self.prefix + key
        meta = await self._call(f"head {full}", lambda: self._obstore.head_async(self._store, full))
        return int(meta["size"])

    async def delete(self, key: str) -> None:
        full = self.prefix + key
        try:
            await self._call(f"delete {full}", lambda: self._obstore.delete_async(self._store, full))
        except ObjectNotFound:
            pass

    async def probe(self) -> None:
        """One signed request that needs the bucket to exist (a listing of at most one key under
        the prefix), with the usual retries; raises ObjectStoreError saying why it failed. An
        unsigned request cannot tell: SeaweedFS answers 403 to one whether or not the bucket
        exists yet."""
        where = f"s3://{self.bucket}/{self.prefix}"

        async def first_listing() -> None:
            async for _chunk in self._obstore.list(self._store, self.prefix + "neve-probe/", chunk_size=1):
                break

        try:
            await self._call(f"list {where}", first_listing)
        except ObjectNotFound:
            raise ObjectStoreError(f"{where}: no such bucket") from None
        except ObjectStoreError as e:
            if "NoSuchBucket" in str(e):
                raise ObjectStoreError(f"{where}: no such bucket") from None
            # what failed and its first line; the retries' log lines hold the whole error
            raise ObjectStoreError(str(e).split("\n")[0].split("\\n")[0]) from None

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        found = []
        async for chunk in self._obstore.list(self._store, self.prefix + prefix, chunk_size=1000):
            for meta in chunk:
                found.append(ObjectInfo(meta["path"][len(self.prefix) :], meta["size"], meta["last_modified"].timestamp()))
        found.sort(key=lambda o: o.key)
        for info in found:
            yield info


def from_url(url: str, *, access_key_id: str = "", secret_access_key: str = "") -> S3ObjectStore:
    """The store of an s3:// URL; keys given here are used instead of the environment's (never in
    a URL, which logs and error messages print)."""
    parsed = urlparse(url)
    query = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
    return S3ObjectStore(
        parsed.netloc,
        parsed.path,
        endpoint=query.get("endpoint"),
        region=query.get("region"),
        timeout=float(query.get("timeout", 10)),
        retries=int(query.get("retries", 3)),
        unsigned_payload=_flag(query.get("unsigned_payload", "true"), "unsigned_payload"),
        access_key_id=access_key_id,
        secret_access_key=secret_access_key,
    )


def _flag(text: str, name: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise ValueError(f"{name} in an s3:// URL is true or false, not {text!r}")
