"""The Iceberg catalog the compactor commits to, chosen by URL: SQL on SQLite or PostgreSQL, or
REST. `catalog_target` says how both pyiceberg and Spark open the same catalog; `load_catalog`
opens pyiceberg's (imported lazily: it comes with the `table` extra)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal
from urllib.parse import quote, unquote, urlsplit

from .config import CompactorConfig

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

TABLE_EXTRA = "pip install 'neve[table]'"
REST_SCHEMES = {"http": "http", "https": "https", "rest+http": "http", "rest+https": "https"}


class CatalogError(RuntimeError):
    """The catalog URL is wrong, or the catalog cannot be opened; says which and why."""


@dataclass(frozen=True)
class CatalogTarget:
    """One Iceberg catalog as pyiceberg and Spark both open it, so that the tables the compactor
    commits are the tables Spark (and every other JDBC or REST client) reads."""

    kind: Literal["sql", "rest"]
    name: str
    uri: str
    """pyiceberg's `uri`: a SQLAlchemy URL for SQL catalogs, the REST endpoint otherwise."""
    warehouse: str
    """`file:///dir`, `s3://bucket/prefix`, or (REST) the warehouse the server knows; may be empty for REST."""
    io: dict[str, str] = field(default_factory=dict)
    """FileIO settings both engines need (S3 endpoint, keys, region), in pyiceberg's names."""
    credential: str = ""
    """REST: OAuth2 client credential `id:secret`."""
    jdbc_url: str = ""
    """SQL: the same database as a JDBC URL, for Spark's JdbcCatalog."""
    jdbc_user: str = ""
    jdbc_password: str = ""

    def pyiceberg_properties(self) -> dict[str, str]:
        props = {"uri": self.uri, **self.io}
        if self.warehouse:
            props["warehouse"] = self.warehouse
        if self.credential:
            props |= {"credential": self.credential, "oauth2-server-uri": self.oauth2_server_uri}
        return props

    @property
    def oauth2_server_uri(self) -> str:
        """Where a REST catalog's client exchanges its credential for a token: the catalog's own
        endpoint, said explicitly (both clients warn that guessing it is deprecated)."""
        return f"{self.uri}/v1/oauth/tokens"

    @property
    def display(self) -> str:
        """The URI without its password, for messages and logs."""
        return _redact(self.uri)


def catalog_target(config: CompactorConfig) -> CatalogTarget:
    """What `config.catalog_url` names, with the warehouse and S3 settings that go with it."""
    url = config.catalog_url
    parts = urlsplit(url)
    io = _s3_properties(config)
    if parts.scheme == "sqlite":
        if not parts.path or parts.path == "/":
            raise CatalogError(f"catalog URL {url!r} names no file: use sqlite:///path/catalog.db")
        path = Path(unquote(parts.path))
        warehouse = config.warehouse or (path.parent / "warehouse").as_uri()
        return CatalogTarget("sql", config.catalog_name, f"sqlite:///{path}", warehouse, io, jdbc_url=f"jdbc:sqlite:{path}")
    if parts.scheme in ("postgresql", "postgres", "postgresql+psycopg2"):
        if not config.warehouse:
            raise CatalogError(f"a PostgreSQL catalog needs a warehouse (file:///dir or s3://bucket/prefix) beside {_redact(url)}")
        database = parts.path.lstrip("/") or "postgres"
        host = parts.hostname or "127.0.0.1"
        netloc = f"{host}:{parts.port or 5432}"
        user, password = unquote(parts.username or ""), unquote(parts.password or "")
        auth = quote(user, safe="") + (":" + quote(password, safe="") if password else "") + "@" if user else ""
        query = f"?{parts.query}" if parts.query else ""
        return CatalogTarget(
            "sql", config.catalog_name, f"postgresql+psycopg2://{auth}{netloc}/{database}{query}", config.warehouse, io,
            jdbc_url=f"jdbc:postgresql://{netloc}/{database}", jdbc_user=user, jdbc_password=password,
        )  # fmt: skip
    if parts.scheme in REST_SCHEMES:
        uri = f"{REST_SCHEMES[parts.scheme]}://{parts.netloc}{parts.path.rstrip('/')}"
        credential = config.rest_credential or (f"{config.s3_access_key_id}:{config.s3_secret_access_key}" if config.s3_access_key_id else "")
        return CatalogTarget("rest", config.catalog_name, uri, config.warehouse, io, credential=credential)
    if not url:
        raise CatalogError("no Iceberg catalog configured (compactor.catalog_url, NEVE_COMPACTOR_CATALOG_URL)")
    raise CatalogError(f"unsupported catalog URL {_redact(url)!r} (use sqlite:///path, postgresql://user@host:port/db or rest+http://host:port)")


def load_catalog(config: CompactorConfig | CatalogTarget) -> Catalog:
    """pyiceberg's catalog for `config`, its tables created if missing (SQL catalogs) or its
    configuration fetched (REST): a catalog that cannot be reached fails here, saying so."""
    target = config if isinstance(config, CatalogTarget) else catalog_target(config)
    try:
        if target.kind == "sql":
            from pyiceberg.catalog.sql import SqlCatalog as catalog_class
        else:
            from pyiceberg.catalog.rest import RestCatalog as catalog_class
    except ImportError as e:
        raise CatalogError(f"the Iceberg catalog needs pyiceberg and its SQL drivers: {TABLE_EXTRA} ({e})") from e
    attempts = 5  # each retry finds at least one more of the catalog's tables created by another
    for attempt in range(1, attempts + 1):
        try:
            return catalog_class(target.name, **target.pyiceberg_properties())
        except ImportError as e:  # psycopg2, or sqlalchemy's dialect for it
            raise CatalogError(f"the catalog {target.display} needs a driver: {TABLE_EXTRA} ({e})") from e
        except Exception as e:  # unreachable server, refused login, bad database: all mean no catalog
            if attempt < attempts and target.kind == "sql" and _created_meanwhile(e):
                continue  # compactors starting together on a new catalog: another created its tables
            hint = "check compactor.catalog_url, NEVE_COMPACTOR_CATALOG_URL, and that its server runs"
            raise CatalogError(f"cannot open the Iceberg catalog {target.display}: {_first_line(e)} ({hint})") from e
    raise AssertionError("unreachable")


def _created_meanwhile(e: Exception) -> bool:
    """Whether creating the SQL catalog's tables failed because another process created them at
    the same moment. PostgreSQL's CREATE TABLE IF NOT EXISTS is not safe against a concurrent one:
    the loser fails on the table's name (DuplicateTable), on its row type's name (DuplicateObject,
    or UniqueViolation on pg_type), whichever it reaches first."""
    return type(getattr(e, "orig", None)).__name__ in ("UniqueViolation", "DuplicateTable", "DuplicateObject")


def _first_line(e: Exception) -> str:
    """The driver's own reason, in one line: SQLAlchemy wraps it (`orig`) in several, with a link."""
    cause = getattr(e, "orig", None) or e
    lines = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {lines[0]}" if lines else type(cause).__name__


def _s3_properties(config: CompactorConfig) -> dict[str, str]:
    io = {"s3.region": config.s3_region}
    if config.s3_endpoint:
        io["s3.endpoint"] = config.s3_endpoint
    if config.s3_access_key_id:
        io["s3.access-key-id"] = config.s3_access_key_id
    if config.s3_secret_access_key:
        io["s3.secret-access-key"] = config.s3_secret_access_key
    return io


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return url.replace(f":{parts.password}@", ":***@", 1)
