"""What the registry holds and answers, in Confluent's terms: schemas, subject versions, the
compatibility levels and modes, and the errors with Confluent's error codes and HTTP statuses."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class SchemaType(enum.StrEnum):
    AVRO = "AVRO"
    JSON = "JSON"
    PROTOBUF = "PROTOBUF"


class Compatibility(enum.StrEnum):
    BACKWARD = "BACKWARD"
    BACKWARD_TRANSITIVE = "BACKWARD_TRANSITIVE"
    FORWARD = "FORWARD"
    FORWARD_TRANSITIVE = "FORWARD_TRANSITIVE"
    FULL = "FULL"
    FULL_TRANSITIVE = "FULL_TRANSITIVE"
    NONE = "NONE"

    @property
    def transitive(self) -> bool:
        return self.endswith("_TRANSITIVE")

    @property
    def backward(self) -> bool:
        """The new schema must read data written with the old ones."""
        return self.startswith(("BACKWARD", "FULL"))

    @property
    def forward(self) -> bool:
        """The old schemas must read data written with the new one."""
        return self.startswith(("FORWARD", "FULL"))


DEFAULT_COMPATIBILITY = Compatibility.BACKWARD  # Confluent's default


class Mode(enum.StrEnum):
    READWRITE = "READWRITE"
    READONLY = "READONLY"
    IMPORT = "IMPORT"


@dataclass(frozen=True)
class Reference:
    """A named type of a schema defined in another subject's version (`name` as the schema names it)."""

    name: str
    subject: str
    version: int

    def to_json(self) -> dict:
        return {"name": self.name, "subject": self.subject, "version": self.version}


@dataclass(frozen=True)
class Schema:
    type: SchemaType
    text: str
    references: tuple[Reference, ...] = ()

    def to_json(self) -> dict:
        """Confluent's form: schemaType only when not AVRO, references always."""
        out: dict = {"schema": self.text}
        if self.type != SchemaType.AVRO:
            out["schemaType"] = self.type.value
        out["references"] = [r.to_json() for r in self.references]
        return out


@dataclass(frozen=True)
class SubjectVersion:
    subject: str
    version: int
    schema_id: int
    deleted: bool = False


@dataclass(frozen=True)
class RegisteredVersion:
    """A subject version with its schema: what GET /subjects/{s}/versions/{v} answers."""

    version: SubjectVersion
    schema: Schema = field(repr=False)

    def to_json(self) -> dict:
        v = self.version
        return {"subject": v.subject, "version": v.version, "id": v.schema_id, **self.schema.to_json()}


# -- errors -------------------------------------------------------------------------------------


class RegistryError(Exception):
    """An answer with Confluent's error body `{"error_code": ..., "message": ...}`."""

    status = 500
    error_code = 50001

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def to_json(self) -> dict:
        return {"error_code": self.error_code, "message": self.message}


class SubjectNotFound(RegistryError):
    status, error_code = 404, 40401

    def __init__(self, subject: str) -> None:
        super().__init__(f"Subject '{subject}' not found.")


class VersionNotFound(RegistryError):
    status, error_code = 404, 40402

    def __init__(self, version: object) -> None:
        super().__init__(f"Version {version} not found.")


class SchemaNotFound(RegistryError):
    status, error_code = 404, 40403

    def __init__(self, what: object = None) -> None:
        super().__init__("Schema not found" if what is None else f"Schema {what} not found")


class SubjectSoftDeleted(RegistryError):
    status, error_code = 404, 40404

    def __init__(self, subject: str) -> None:
        super().__init__(f"Subject '{subject}' was soft deleted.Set permanent=true to delete permanently")


class SubjectNotSoftDeleted(RegistryError):
    status, error_code = 404, 40405

    def __init__(self, subject: str) -> None:
        super().__init__(f"Subject '{subject}' was not deleted first before being permanently deleted")


class VersionSoftDeleted(RegistryError):
    status, error_code = 404, 40406

    def __init__(self, subject: str, version: int) -> None:
        super().__init__(f"Subject '{subject}' Version {version} was soft deleted.Set permanent=true to delete permanently")


class VersionNotSoftDeleted(RegistryError):
    status, error_code = 404, 40407

    def __init__(self, subject: str, version: int) -> None:
        super().__init__(f"Subject '{subject}' Version {version} was not deleted first before being permanently deleted")


class SubjectCompatibilityNotConfigured(RegistryError):
    status, error_code = 404, 40408

    def __init__(self, subject: str) -> None:
        super().__init__(f"Subject '{subject}' does not have subject-level compatibility configured")


class SubjectModeNotConfigured(RegistryError):
    status, error_code = 404, 40409

    def __init__(self, subject: str) -> None:
        super().__init__(f"Subject '{subject}' does not have subject-level mode configured")


class IncompatibleSchema(RegistryError):
    status, error_code = 409, 409

    def __init__(self, subject: str, messages: list[str]) -> None:
        super().__init__(f'Schema being registered is incompatible with an earlier schema for subject "{subject}", details: [{", ".join(messages)}]')
        self.messages = messages


class InvalidSchema(RegistryError):
    status, error_code = 422, 42201


class InvalidVersion(RegistryError):
    status, error_code = 422, 42202

    def __init__(self, version: object) -> None:
        super().__init__(f"The specified version '{version}' is not a valid version id. Allowed values are between [1, 2^31-1] and the string \"latest\"")


class InvalidCompatibility(RegistryError):
    status, error_code = 422, 42203

    def __init__(self, level: object) -> None:
        super().__init__(f"Invalid compatibility level. Valid values are none, backward, forward, full, backward_transitive, forward_transitive, and full_transitive (got {level!r})")


class InvalidMode(RegistryError):
    status, error_code = 422, 42204

    def __init__(self, mode: object) -> None:
        super().__init__(f"Invalid mode. Valid values are READWRITE, READONLY and IMPORT (got {mode!r})")


class OperationNotPermitted(RegistryError):
    status, error_code = 422, 42205


class ReferenceExists(RegistryError):
    status, error_code = 422, 42206


class BadRequest(RegistryError):
    """A body that is not JSON at all."""

    status, error_code = 400, 400


class UnprocessableRequest(RegistryError):
    """A body that is not the JSON the resource takes (Confluent answers 422 with code 422)."""

    status, error_code = 422, 422


class StoreError(RegistryError):
    status, error_code = 500, 50001


class StoreTimeout(RegistryError):
    status, error_code = 500, 50002


class ForwardingError(RegistryError):
    status, error_code = 500, 50003
