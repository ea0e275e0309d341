"""The registry's operations in Confluent's terms (register, look up, list, delete, configure),
over its storage (store.py): what the REST resources call. Holds no state of its own beyond the
caches of what never changes (a schema id's parsed form)."""

from __future__ import annotations

from dataclasses import dataclass

from . import compatibility
from .formats import Parsed, parse
from .model import (
    DEFAULT_COMPATIBILITY,
    Compatibility,
    IncompatibleSchema,
    InvalidCompatibility,
    InvalidMode,
    InvalidSchema,
    InvalidVersion,
    Mode,
    OperationNotPermitted,
    ReferenceExists,
    RegisteredVersion,
    Schema,
    SchemaNotFound,
    StoreTimeout,
    SubjectCompatibilityNotConfigured,
    SubjectModeNotConfigured,
    SubjectNotFound,
    SubjectNotSoftDeleted,
    SubjectSoftDeleted,
    SubjectVersion,
    VersionNotFound,
    VersionNotSoftDeleted,
    VersionSoftDeleted,
)
from .store import (
    IDS,
    RegistryStore,
    Versions,
    config_key,
    encode_schema,
    encode_version,
    fingerprint_key,
    mode_key,
    schema_key,
    version_key,
)

MAX_VERSION = 2**31 - 1
WRITE_ATTEMPTS = 64  # compare-and-write rounds before a write gives up (each lost round means another write won)


def parse_version(text: str | int) -> int | None:
    """A version as a path names it: None for "latest" (or -1); InvalidVersion (42202) otherwise
    unless 1 to 2^31-1."""
    if text in ("latest", "-1", -1):
        return None
    try:
        version = int(text)
    except (TypeError, ValueError):
        raise InvalidVersion(text) from None
    if not 1 <= version <= MAX_VERSION:
        raise InvalidVersion(text)
    return version


def parse_compatibility(value: object) -> Compatibility:
    try:
        return Compatibility(str(value).upper())
    except ValueError:
        raise InvalidCompatibility(value) from None


def parse_mode(value: object) -> Mode:
    try:
        return Mode(str(value).upper())
    except ValueError:
        raise InvalidMode(value) from None


@dataclass(frozen=True)
class Compatible:
    is_compatible: bool
    messages: list[str]


class Registry:
    def __init__(self, store: RegistryStore) -> None:
        self.store = store
        self._parsed: dict[int, Parsed] = {}

    # -- schemas ----------------------------------------------------------------------------------

    async def schema(self, schema_id: int) -> Schema:
        schema = await self.store.schema(schema_id)
        if schema is None:
            raise SchemaNotFound(schema_id)
        return schema

    async def parsed(self, schema_id: int) -> Parsed:
        found = self._parsed.get(schema_id)
        if found is None:
            found = self._parsed[schema_id] = await self.parse(await self.schema(schema_id))
        return found

    async def parse(self, schema: Schema) -> Parsed:
        """Parse with the named types of its references (each a registered subject version)."""
        names: dict = {}
        for ref in schema.references:
            versions = await self.store.versions(ref.subject)
            found = next((v for v in versions.all if v.version == ref.version), None)
            if found is None:
                raise InvalidSchema(f"Invalid schema: reference {ref.name} to subject '{ref.subject}' version {ref.version} not found")
            names.update((await self.parsed(found.schema_id)).names or {})
        return parse(schema, names)

    async def subjects_of_schema(self, schema_id: int, deleted: bool = False) -> list[SubjectVersion]:
        await self.schema(schema_id)
        return [v for v in await self.store.all_versions() if v.schema_id == schema_id and (deleted or not v.deleted)]

    # -- subjects and versions --------------------------------------------------------------------

    async def subjects(self, deleted: bool = False, prefix: str = "") -> list[str]:
        return [s for s in self.store.subjects_of(await self.store.all_versions(), deleted) if s.startswith(prefix)]

    async def _versions(self, subject: str, deleted: bool = False) -> Versions:
        """A subject's versions; SubjectNotFound (40401) if it has none (none live, unless `deleted`)."""
        versions = await self.store.versions(subject)
        if not (versions.all if deleted else versions.live):
            raise SubjectNotFound(subject)
        return versions

    async def versions(self, subject: str, deleted: bool = False) -> list[int]:
        versions = await self._versions(subject, deleted)
        return [v.version for v in (versions.all if deleted else versions.live)]

    def _pick(self, versions: Versions, version: int | None, deleted: bool) -> SubjectVersion:
        candidates = versions.all if deleted else versions.live
        if version is None:
            if not versions.live:
                raise VersionNotFound("latest")
            return versions.live[-1]
        found = next((v for v in candidates if v.version == version), None)
        if found is None:
            raise VersionNotFound(version)
        return found

    async def version(self, subject: str, version_text: str, deleted: bool = False) -> RegisteredVersion:
        version = parse_version(version_text)
        found = self._pick(await self._versions(subject, deleted), version, deleted)
        return RegisteredVersion(found, await self.schema(found.schema_id))

    async def lookup(self, subject: str, schema: Schema, deleted: bool = False) -> RegisteredVersion:
        """The subject's version holding this schema: SubjectNotFound, or SchemaNotFound (40403)."""
        versions = await self._versions(subject, deleted)
        parsed = await self.parse(schema)
        for v in reversed(versions.all if deleted else versions.live):
            if (await self.parsed(v.schema_id)).fingerprint == parsed.fingerprint:
                return RegisteredVersion(v, await self.schema(v.schema_id))
        raise SchemaNotFound()

    async def register(self, subject: str, schema: Schema, schema_id: int | None = None, version: int | None = None) -> int:
        """The schema's id in the subject: its existing live version's, or a new version's (the id
        of the same schema in any subject, or a new id). IMPORT mode takes a given id and version
        and skips the compatibility check."""
        parsed = await self.parse(schema)
        for _ in range(WRITE_ATTEMPTS):
            versions = await self.store.versions(subject)
            for v in reversed(versions.live):
                if (await self.parsed(v.schema_id)).fingerprint == parsed.fingerprint and schema_id in (None, v.schema_id):
                    return v.schema_id
            mode = await self.mode(subject)
            if mode == Mode.READONLY:
                raise OperationNotPermitted(f"Subject {subject} is in read-only mode")
            if mode != Mode.IMPORT:
                if schema_id is not None or version is not None:
                    raise OperationNotPermitted("Cannot specify an id or a version outside IMPORT mode")
                level = await self.compatibility(subject)
                messages = compatibility.check(level, parsed, [await self.parsed(v.schema_id) for v in versions.live])
                if messages:
                    raise IncompatibleSchema(subject, messages)
            new_id, writes, expect = await self._id_writes(parsed, schema_id)
            new_version = version or versions.next_version
            if versions.revision(new_version):
                raise OperationNotPermitted(f"Version {new_version} of subject {subject} exists already")
            key = version_key(subject, new_version)
            writes[key], expect[key] = encode_version(new_id), 0
            if await self.store.write(writes, expect):
                return new_id
        raise StoreTimeout(f"Registering a schema in subject {subject} lost {WRITE_ATTEMPTS} races in a row")

    async def _id_writes(self, parsed: Parsed, wanted: int | None) -> tuple[int, dict, dict]:
        """The writes and compares that give `parsed` its id: the one its fingerprint has, or
        `wanted` (IMPORT), or the next one."""
        fp_key = fingerprint_key(parsed.fingerprint)
        existing, fp_revision = await self.store.schema_id(parsed.fingerprint)
        writes: dict = {}
        expect: dict = {fp_key: fp_revision}
        if wanted is not None:
            held = await self.store.schema(wanted)
            if held is not None and (await self.parsed(wanted)).fingerprint != parsed.fingerprint:
                raise OperationNotPermitted(f"Overwrite new schema with id {wanted} is not permitted.")
            last, revision = await self.store.last_id()
            if held is None:
                writes[schema_key(wanted)], expect[schema_key(wanted)] = encode_schema(parsed.stored), 0
            if existing is None:
                writes[fp_key] = str(wanted).encode()
            if wanted > last:
                writes[IDS], expect[IDS] = str(wanted).encode(), revision
            schema_id = wanted
        elif existing is not None:
            schema_id = existing
        else:
            last, revision = await self.store.last_id()
            schema_id = last + 1
            writes[IDS], expect[IDS] = str(schema_id).encode(), revision
            writes[schema_key(schema_id)], expect[schema_key(schema_id)] = encode_schema(parsed.stored), 0
            writes[fp_key] = str(schema_id).encode()
        return schema_id, writes, expect

    async def delete_subject(self, subject: str, permanent: bool) -> list[int]:
        for _ in range(WRITE_ATTEMPTS):
            versions = await self._versions(subject, deleted=True)
            if await self.mode(subject) == Mode.READONLY:
                raise OperationNotPermitted(f"Subject {subject} is in read-only mode")
            if permanent:
                if versions.live:
                    raise SubjectNotSoftDeleted(subject)
                gone = versions.all
                writes = {version_key(subject, v.version): None for v in gone} | {config_key(subject): None, mode_key(subject): None}
            else:
                if not versions.live:
                    raise SubjectSoftDeleted(subject)
                gone = versions.live
                for v in gone:
                    await self._check_unreferenced(v)
                writes = {version_key(subject, v.version): encode_version(v.schema_id, True) for v in gone}
            if await self.store.write(writes, {version_key(subject, v.version): versions.revision(v.version) for v in gone}):
                return [v.version for v in gone]
        raise StoreTimeout(f"Deleting subject {subject} lost {WRITE_ATTEMPTS} races in a row")

    async def delete_version(self, subject: str, version_text: str, permanent: bool) -> int:
        version = parse_version(version_text)
        for _ in range(WRITE_ATTEMPTS):
            versions = await self._versions(subject, deleted=True)
            if await self.mode(subject) == Mode.READONLY:
                raise OperationNotPermitted(f"Subject {subject} is in read-only mode")
            found = self._pick(versions, version, deleted=True)
            key = version_key(subject, found.version)
            if permanent:
                if not found.deleted:
                    raise VersionNotSoftDeleted(subject, found.version)
                value = None
            else:
                if found.deleted:
                    raise VersionSoftDeleted(subject, found.version)
                await self._check_unreferenced(found)
                value = encode_version(found.schema_id, True)
            if await self.store.write({key: value}, {key: versions.revision(found.version)}):
                return found.version
        raise StoreTimeout(f"Deleting version {version_text} of subject {subject} lost {WRITE_ATTEMPTS} races in a row")

    async def referenced_by(self, subject: str, version_text: str) -> list[int]:
        found = self._pick(await self._versions(subject, deleted=True), parse_version(version_text), deleted=True)
        return await self._referencing(found)

    async def _referencing(self, version: SubjectVersion) -> list[int]:
        schemas = await self.store.all_schemas()
        live_ids = {v.schema_id for v in await self.store.all_versions() if not v.deleted}
        return sorted(i for i, s in schemas.items() if i in live_ids and any(r.subject == version.subject and r.version == version.version for r in s.references))

    async def _check_unreferenced(self, version: SubjectVersion) -> None:
        if referencing := await self._referencing(version):
            raise ReferenceExists(f"One or more references exist to the schema {{subject={version.subject},version={version.version}}}: ids {referencing}")

    # -- compatibility ----------------------------------------------------------------------------

    async def _effective(self, key, subject: str | None) -> str | None:
        """A setting (config or mode, by its key function) of a subject: its own, else the global one."""
        if subject is not None and (own := await self.store.setting(key(subject))) is not None:
            return own
        return await self.store.setting(key(None))

    async def compatibility(self, subject: str | None) -> Compatibility:
        """The level a subject's registrations are checked at."""
        return Compatibility(await self._effective(config_key, subject) or DEFAULT_COMPATIBILITY)

    async def _own(self, key, subject: str, missing: type[Exception]) -> str:
        own = await self.store.setting(key(subject))
        if own is None:
            raise missing(subject)
        return own

    async def config(self, subject: str | None, default_to_global: bool = False) -> Compatibility:
        if subject is None or default_to_global:
            return await self.compatibility(subject)
        return Compatibility(await self._own(config_key, subject, SubjectCompatibilityNotConfigured))

    async def set_config(self, subject: str | None, level: object) -> Compatibility:
        parsed = parse_compatibility(level)
        await self.store.put_setting(config_key(subject), parsed.value)
        return parsed

    async def delete_config(self, subject: str | None) -> Compatibility:
        """Forget a subject's own level (or reset the global one); answers the level it had."""
        if subject is not None and await self.store.setting(config_key(subject)) is None and not (await self.store.versions(subject)).all:
            raise SubjectNotFound(subject)
        before = await self.compatibility(subject)
        await self.store.put_setting(config_key(subject), None)
        return before

    async def test(self, subject: str, version_text: str | None, schema: Schema) -> Compatible:
        """POST /compatibility: whether `schema` may follow the subject's versions at its level,
        against the version named (or, with none, every version the level compares with)."""
        parsed = await self.parse(schema)
        level = await self.compatibility(subject)
        versions = await self.store.versions(subject)
        if version_text is None:
            previous = versions.live
        else:
            version = parse_version(version_text)
            if not versions.live:
                if version is None:
                    return Compatible(True, [])  # nothing to be incompatible with (Confluent answers so too)
                raise SubjectNotFound(subject)
            picked = self._pick(versions, version, deleted=False)
            previous = versions.live if version is None and level.transitive else [picked]
        messages = compatibility.check(level, parsed, [await self.parsed(v.schema_id) for v in previous])
        return Compatible(not messages, messages)

    # -- modes ------------------------------------------------------------------------------------

    async def mode(self, subject: str | None) -> Mode:
        return Mode(await self._effective(mode_key, subject) or Mode.READWRITE)

    async def get_mode(self, subject: str | None, default_to_global: bool = False) -> Mode:
        if subject is None or default_to_global:
            return await self.mode(subject)
        return Mode(await self._own(mode_key, subject, SubjectModeNotConfigured))

    async def set_mode(self, subject: str | None, mode: object, force: bool = False) -> Mode:
        parsed = parse_mode(mode)
        if parsed == Mode.IMPORT and not force:
            has = (await self.store.versions(subject)).all if subject is not None else await self.store.all_versions()
            if has:
                raise OperationNotPermitted(f"Cannot import since found existing subjects{'' if subject is None else ' ' + subject}")
        await self.store.put_setting(mode_key(subject), parsed.value)
        return parsed

    async def delete_mode(self, subject: str) -> Mode:
        before = await self.mode(subject)
        await self.store.put_setting(mode_key(subject), None)
        return before
