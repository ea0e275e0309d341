"""The registry's storage, laid out over the metadata store's registry items
(`MetadataStore.registry_*`), so every metadata backend stores it and one contract suite covers it.

Keys (values compact JSON):

    ids                                  the highest schema id given out
    schemas/<id:010d>                    {"schemaType", "schema", "references"}: never rewritten
    fingerprints/<sha-256 hex>           the id of the schema with that fingerprint (formats.Parsed)
    subjects/<subject, quoted>/<version:010d>
                                         {"id", "deleted"}: a subject's version; soft delete sets deleted
    config, mode                         the global compatibility level and mode (absent: the defaults)
    config/<subject, quoted>, mode/<subject, quoted>
                                         a subject's own level and mode

A registration is one `registry_write` comparing what it read (the version key's absence, the
fingerprint's, the id counter's revision), so two brokers registering at once agree on one id and
one version; the loser reads again and finds the winner's. Schemas by id and fingerprints never
change once written, so they are cached; everything else is read from the store each time (a
write on another broker is seen at once)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import quote, unquote

from metadata.store import MetadataError, MetadataStore, RegistryItem

from .model import Reference, Schema, SchemaType, StoreError, SubjectVersion


def subject_prefix(subject: str) -> str:
    return f"subjects/{quote(subject, safe='')}/"


def version_key(subject: str, version: int) -> str:
    return f"{subject_prefix(subject)}{version:010d}"


def schema_key(schema_id: int) -> str:
    return f"schemas/{schema_id:010d}"


def fingerprint_key(fingerprint: str) -> str:
    return f"fingerprints/{fingerprint}"


def config_key(subject: str | None) -> str:
    return "config" if subject is None else f"config/{quote(subject, safe='')}"


def mode_key(subject: str | None) -> str:
    return "mode" if subject is None else f"mode/{quote(subject, safe='')}"


IDS = "ids"


@dataclass(frozen=True)
class Versions:
    """A subject's versions as read (deleted ones too, in version order) with their revisions, for
    a write that must fail if they changed."""

    subject: str
    items: tuple[tuple[SubjectVersion, int], ...]

    @property
    def all(self) -> list[SubjectVersion]:
        return [v for v, _ in self.items]

    @property
    def live(self) -> list[SubjectVersion]:
        return [v for v, _ in self.items if not v.deleted]

    @property
    def next_version(self) -> int:
        return self.items[-1][0].version + 1 if self.items else 1

    def revision(self, version: int) -> int:
        return next((r for v, r in self.items if v.version == version), 0)


def encode_schema(schema: Schema) -> bytes:
    return json.dumps({"schemaType": schema.type.value, "schema": schema.text, "references": [r.to_json() for r in schema.references]}, separators=(",", ":")).encode()


def decode_schema(raw: bytes) -> Schema:
    d = json.loads(raw)
    return Schema(SchemaType(d["schemaType"]), d["schema"], tuple(Reference(r["name"], r["subject"], r["version"]) for r in d["references"]))


def encode_version(schema_id: int, deleted: bool = False) -> bytes:
    return json.dumps({"id": schema_id, "deleted": deleted}, separators=(",", ":")).encode()


class RegistryStore:
    """Typed reads of the layout above and the one write, with the immutable parts cached."""

    def __init__(self, metadata: MetadataStore) -> None:
        self.metadata = metadata
        self._schemas: dict[int, Schema] = {}
        self._fingerprints: dict[str, int] = {}

    async def _call(self, aw):
        try:
            return await aw
        except MetadataError as e:
            raise StoreError(f"Error in the backend data store: {e}") from e

    async def get(self, key: str) -> RegistryItem | None:
        return await self._call(self.metadata.registry_get(key))

    async def items(self, prefix: str) -> list[RegistryItem]:
        return await self._call(self.metadata.registry_items(prefix))

    async def write(self, writes: Mapping[str, bytes | None], expect: Mapping[str, int]) -> bool:
        return await self._call(self.metadata.registry_write(writes, expect))

    # -- schemas by id ------------------------------------------------------------------------

    async def schema(self, schema_id: int) -> Schema | None:
        cached = self._schemas.get(schema_id)
        if cached is not None:
            return cached
        item = await self.get(schema_key(schema_id))  # read through: another broker may have written it
        if item is None:
            return None
        schema = self._schemas[schema_id] = decode_schema(item.value)
        return schema

    async def all_schemas(self) -> dict[int, Schema]:
        out = {}
        for item in await self.items("schemas/"):
            schema_id = int(item.key.rsplit("/", 1)[1])
            out[schema_id] = self._schemas.setdefault(schema_id, decode_schema(item.value))
        return out

    async def schema_id(self, fingerprint: str) -> tuple[int | None, int]:
        """(the id of the schema with this fingerprint or None, the fingerprint key's revision)."""
        item = await self.get(fingerprint_key(fingerprint))
        if item is None:
            return None, 0
        return int(item.value), item.revision

    async def last_id(self) -> tuple[int, int]:
        """(the highest id given out, the counter's revision)."""
        item = await self.get(IDS)
        return (0, 0) if item is None else (int(item.value), item.revision)

    # -- subjects -----------------------------------------------------------------------------

    async def versions(self, subject: str) -> Versions:
        items = []
        for item in await self.items(subject_prefix(subject)):
            d = json.loads(item.value)
            items.append((SubjectVersion(subject, int(item.key.rsplit("/", 1)[1]), d["id"], d["deleted"]), item.revision))
        return Versions(subject, tuple(items))

    async def all_versions(self) -> list[SubjectVersion]:
        out = []
        for item in await self.items("subjects/"):
            _, quoted, version = item.key.split("/")
            d = json.loads(item.value)
            out.append(SubjectVersion(unquote(quoted), int(version), d["id"], d["deleted"]))
        return out

    @staticmethod
    def subjects_of(versions: Iterable[SubjectVersion], deleted: bool = False) -> list[str]:
        return sorted({v.subject for v in versions if deleted or not v.deleted})

    # -- config and mode ------------------------------------------------------------------------

    async def setting(self, key: str) -> str | None:
        item = await self.get(key)
        return None if item is None else json.loads(item.value)

    async def put_setting(self, key: str, value: str | None) -> None:
        await self.write({key: None if value is None else json.dumps(value).encode()}, {})
