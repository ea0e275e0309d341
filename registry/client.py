"""Schema by id, and a subject's schemas, for the registry's readers (the compactor's resolver):
from the metadata store when neve serves its own registry, or from an external registry's REST API
(`registry.url`, over HTTPS and with HTTP Basic credentials as Confluent's basic.auth.user.info),
each behind a cache (a schema id's schema never changes)."""

from __future__ import annotations

import abc
import asyncio
import base64
import json
import ssl
from collections import OrderedDict
from urllib.parse import quote

from metadata.store import MetadataStore

from .config import RegistryConfig
from .model import Reference, Schema, SchemaType, StoreError
from .store import RegistryStore
from .tls import client_context


class SchemaLookup(abc.ABC):
    def __init__(self, cache_size: int = 10_000) -> None:
        self._cache: OrderedDict[int, Schema] = OrderedDict()
        self._cache_size = cache_size

    async def schema(self, schema_id: int) -> Schema | None:
        """The schema registered with this id, or None if there is none. Raises StoreError when
        the registry cannot be asked (retriable: nothing is cached then)."""
        cached = self._cache.get(schema_id)
        if cached is not None:
            self._cache.move_to_end(schema_id)
            return cached
        found = await self._fetch(schema_id)
        if found is not None:
            self._cache[schema_id] = found
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return found

    @abc.abstractmethod
    async def _fetch(self, schema_id: int) -> Schema | None: ...

    @abc.abstractmethod
    async def subject_schemas(self, subject: str) -> list[tuple[int, int, Schema]]:
        """(version, schema id, schema) of every version of `subject` in version order, soft-deleted
        ones too (records framed with them may still be in a topic); empty for an unknown subject.
        Raises StoreError when the registry cannot be asked."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        pass


class StoreLookup(SchemaLookup):
    """neve's own registry, read from the metadata store."""

    def __init__(self, metadata: MetadataStore, cache_size: int = 10_000) -> None:
        super().__init__(cache_size)
        self._store = RegistryStore(metadata)

    async def _fetch(self, schema_id: int) -> Schema | None:
        return await self._store.schema(schema_id)

    async def subject_schemas(self, subject: str) -> list[tuple[int, int, Schema]]:
        out = []
        for v in (await self._store.versions(subject)).all:
            schema = await self.schema(v.schema_id)
            if schema is not None:  # a hard-deleted version's id is kept; this guards a torn read
                out.append((v.version, v.schema_id, schema))
        return out


class UrlLookup(SchemaLookup):
    """An external registry speaking Confluent's REST API (Confluent, Karapace, Apicurio's ccompat),
    or neve's own by URL. `user_info`: "user:password" for HTTP Basic auth (empty: none);
    `ca_file`: the CAs of an https URL's certificate (empty: the system's)."""

    def __init__(self, url: str, cache_size: int = 10_000, timeout_s: float = 10.0, user_info: str = "", ca_file: str = "") -> None:
        super().__init__(cache_size)
        self.url = url.rstrip("/")
        self._timeout_s = timeout_s
        self._authorization: str | None = None
        if user_info:
            user, colon, password = user_info.partition(":")
            if not colon or not user:
                raise ValueError("the registry's user info is not user:password")
            self._authorization = _basic_auth(user, password)
        self._ca_file = ca_file
        self._session = None

    async def _open(self):
        import aiohttp

        # reading the CA file is file I/O: off the loop, once
        context = await asyncio.to_thread(client_context, self._ca_file) if self.url.startswith("https:") else None
        headers = {"Authorization": self._authorization} if self._authorization is not None else None
        return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self._timeout_s), headers=headers, connector=aiohttp.TCPConnector(ssl=context) if context is not None else None)

    async def _get(self, path: str):
        """The decoded JSON answer to GET `path`, or None for a 404."""
        import aiohttp

        if self._session is None:
            opened = await self._open()
            if self._session is None:
                self._session = opened
            else:  # another lookup opened one meanwhile
                await opened.close()
        try:
            async with self._session.get(f"{self.url}{path}", headers={"Accept": "application/vnd.schemaregistry.v1+json, application/json"}) as response:
                text = await response.text()
                if response.status == 404:
                    return None
                if response.status in (401, 403):
                    raise StoreError(f"schema registry {self.url} refused {'the credentials' if self._authorization else 'a request without credentials'} ({response.status}): {text[:200]}")
                if response.status != 200:
                    raise StoreError(f"schema registry {self.url} answered {response.status}: {text[:200]}")
        except (aiohttp.ClientError, ssl.SSLError) as e:
            raise StoreError(f"schema registry {self.url}: {e!r}") from e
        return json.loads(text)

    async def _fetch(self, schema_id: int) -> Schema | None:
        d = await self._get(f"/schemas/ids/{schema_id}")
        return None if d is None else _schema(d)

    async def subject_schemas(self, subject: str) -> list[tuple[int, int, Schema]]:
        quoted = quote(subject, safe="")
        versions = await self._get(f"/subjects/{quoted}/versions?deleted=true")
        out = []
        for version in sorted(versions or ()):
            d = await self._get(f"/subjects/{quoted}/versions/{version}?deleted=true")
            if d is not None:
                schema = _schema(d)
                self._cache.setdefault(d["id"], schema)
                out.append((d["version"], d["id"], schema))
        return out

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _basic_auth(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode("ascii")


def _schema(d: dict) -> Schema:
    refs = tuple(Reference(r["name"], r["subject"], r["version"]) for r in d.get("references") or ())
    return Schema(SchemaType(d.get("schemaType") or "AVRO"), d["schema"], refs)


def load_lookup(settings: RegistryConfig, metadata: MetadataStore) -> SchemaLookup:
    """The external registry when `settings.url` is set, else neve's own through the metadata store."""
    if settings.url:
        return UrlLookup(settings.url, settings.cache_size, user_info=settings.basic_auth_user_info, ca_file=settings.url_ca_file)
    return StoreLookup(metadata, settings.cache_size)
