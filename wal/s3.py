"""The S3-compatible object-store backend (production), over aioboto3.

URL form: `s3://bucket/optional/prefix?endpoint=http://127.0.0.1:8333&region=us-east-1`;
credentials come from the usual AWS environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY).
Puts are conditional (If-None-Match: *), so an object is never overwritten. Every call has a
timeout and bounded retries with backoff; all I/O is asynchronous, nothing blocks the loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
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
        region: str = "us-east-1",
        timeout: float = 10.0,
        retries: int = 3,
        max_connections: int = 64,
    ) -> None:
        try:
            import aioboto3
            from aiobotocore.config import AioConfig
        except ImportError as e:  # pragma: no cover - depends on the installation
            raise ImportError("the S3 backend needs aioboto3: pip install 'neve[s3]'") from e
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.timeout = timeout
        self.retries = retries
        self._session = aioboto3.Session()
        self._config = AioConfig(
            connect_timeout=timeout,
            read_timeout=timeout,
            retries={"max_attempts": 1},  # we retry ourselves, with our own backoff and logs
            max_pool_connections=max_connections,
            s3={"addressing_style": "path"},
        )
        self._endpoint = endpoint
        self._region = region
        self._client = None
        self._client_cm = None
        self._lock = asyncio.Lock()

    async def _s3(self):
        if self._client is None:
            async with self._lock:
                if self._client is None:
                    self._client_cm = self._session.client("s3", endpoint_url=self._endpoint, region_name=self._region, config=self._config)
                    self._client = await self._client_cm.__aenter__()
        return self._client

    async def _call(self, what: str, fn):
        delay = 0.1
        for attempt in range(self.retries + 1):
            try:
                return await asyncio.wait_for(fn(await self._s3()), self.timeout)
            except (ObjectExists, ObjectNotFound):
                raise
            except Exception as e:
                code = _error_code(e)
                if code in ("PreconditionFailed", "412"):
                    raise ObjectExists(what) from None
                if code in ("NoSuchKey", "404", "NotFound"):
                    raise ObjectNotFound(what) from None
                if attempt == self.retries:
                    raise ObjectStoreError(f"{what}: {e!r}") from e
                log.warning("s3_retry", extra={"op": what, "attempt": attempt + 1, "error": repr(e)})
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def put(self, key: str, data: bytes) -> None:
        full = self.prefix + key
        await self._call(f"put {full}", lambda s3: s3.put_object(Bucket=self.bucket, Key=full, Body=data, IfNoneMatch="*"))

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        full = self.prefix + key
        if end is not None and end <= start:
            return b""
        byte_range = f"bytes={start}-" if end is None else f"bytes={start}-{end - 1}"

        async def fetch(s3):
            response = await s3.get_object(Bucket=self.bucket, Key=full, Range=byte_range)
            async with response["Body"] as body:
                return await body.read()

        return await self._call(f"get {full}", fetch)

    async def delete(self, key: str) -> None:
        full = self.prefix + key
        await self._call(f"delete {full}", lambda s3: s3.delete_object(Bucket=self.bucket, Key=full))

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        s3 = await self._s3()
        paginator = s3.get_paginator("list_objects_v2")
        async for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + prefix):
            for item in page.get("Contents", ()):
                yield ObjectInfo(item["Key"][len(self.prefix) :], item["Size"], item["LastModified"].timestamp())

    async def close(self) -> None:
        if self._client_cm is not None:
            await self._client_cm.__aexit__(None, None, None)
            self._client = self._client_cm = None


def _error_code(e: Exception) -> str:
    response = getattr(e, "response", None)
    if isinstance(response, dict):
        err = response.get("Error", {})
        return str(err.get("Code") or response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
    return ""


def from_url(url: str) -> S3ObjectStore:
    parsed = urlparse(url)
    query = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
    return S3ObjectStore(
        parsed.netloc,
        parsed.path,
        endpoint=query.get("endpoint"),
        region=query.get("region", "us-east-1"),
        timeout=float(query.get("timeout", 10)),
        retries=int(query.get("retries", 3)),
    )
