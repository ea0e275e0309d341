"""neve's configuration: typed sections with documented defaults, loaded in one place.

Precedence, lowest to highest: the defaults below → a TOML config file (`--config FILE`, sections
named like the dataclasses: [broker], [wal], [metadata], [registry], [compactor], [cache], [table], [faults]) → environment variables
`NEVE_<SECTION>_<FIELD>` (e.g. NEVE_WAL_LINGER_MS=5) → command-line flags.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field
from typing import Any

from broker.config import BrokerConfig, FaultsConfig
from cache.config import CacheConfig
from compactor.config import CompactorConfig
from registry.config import RegistryConfig
from table.config import TableReadConfig


@dataclass
class WalConfig:
    object_store: str = ""
    """Object store URL (file:///path, memory://, or
    s3://bucket/prefix?endpoint=URL&region=R&timeout=S&retries=N&unsigned_payload=true|false, see
    wal/s3.py); empty in `neve dev`: <data-dir>/objects."""
    linger_ms: int = 200
    """Longest a produce request waits in the buffer before its WAL object is flushed. `neve dev`:
    5 (a local disk has no per-request price to batch against; a Java producer with one request in
    flight could not send 10,000 records within its delivery timeout at 200)."""
    flush_bytes: int = 4 * 1024 * 1024
    """Flush as soon as the buffer holds this many bytes (target WAL object size)."""
    max_inflight_uploads: int = 4
    """WAL objects uploading at once; commits still happen in upload-start order."""
    buffer_bytes: int = 64 * 1024 * 1024
    """Bytes buffered plus uploading before produce requests wait (backpressure)."""
    upload_timeout_ms: int = 10000
    """How long a WAL object upload is retried before its produce requests are answered with
    the retriable KAFKA_STORAGE_ERROR; keep it below clients' request.timeout.ms (30 s)."""
    put_hedge_after_ms: int = -1
    """A WAL object PUT that has not answered after this long gets a second PUT of the same
    object racing it (the first to land wins; objects are created once, so nothing is written
    twice). -1: adaptive, twice the 99th percentile of the last 200 PUTs and at least 250 ms
    (off until 20 PUTs were seen); 0: never."""
    recent_objects_bytes: int = 256 * 1024 * 1024
    """Memory for recently written objects, served to tail-reading consumers without a GET."""
    orphan_grace_s: int = 3600
    """WAL objects this old that no index entry references are fenced off in the metadata store
    and deleted (a broker died between upload and commit); a commit that finds the fence lands
    nothing and its producers retry. The grace keeps the sweeper off objects whose commits are
    on their way, and as a second guard a broker never commits an object whose upload began
    more than half this long ago."""
    read_grace_s: int = 60
    """How long a WAL object stays after its last index entry went (compaction replaced its
    entries, retention moved the log start past them) before it is deleted: a fetch that read
    the index before goes on reading it meanwhile. The sweeper watches the index (in memory)
    every quarter of this, at least every second, so an object goes between this and 1.25 times
    this after its entries (75 s at the default), with no extra listing. Keep it well below
    orphan_grace_s."""
    sweep_interval_s: int = 300
    """How often the WAL sweeper lists the objects (a LIST request per thousand), for orphans
    (uploaded, never committed) and what the index watch did not see; one broker of a cluster
    sweeps, the leader of "wal-sweeper" in the metadata store, and another takes over within
    NEVE_METADATA_LEASE_TTL_S when it stops. 0 disables the sweeper."""


@dataclass
class MetadataConfig:
    url: str = ""
    """Metadata store URL (etcd://host:port/root, sqlite:///path/meta.db, memory://); empty in
    `neve dev`: <data-dir>/metadata.db. Several members of one etcd cluster:
    etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379/root (IPv4 addresses; the broker moves to
    another member when its connection to one fails). An etcd URL's query secures the connection: `ca=<file>`
    (the authority etcd's certificate is checked with; `tls=true` alone: the system's),
    `cert=<file>&key=<file>` (a client certificate, for etcd's --client-cert-auth), and
    `user=<name>&password_file=<file>` (etcd's authentication; the password is read from the
    file, a mounted secret, never given in the URL). E.g. etcd://etcd:2379/neve?ca=/s/ca.pem&
    cert=/s/tls.crt&key=/s/tls.key&user=neve&password_file=/s/password."""
    timeout_ms: int = 5000
    """etcd: deadline of each request; a commit that cannot reach etcd answers REQUEST_TIMED_OUT."""
    lease_ttl_s: int = 5
    """etcd: a broker that stops renewing its registration leaves Metadata after this long."""
    compact_interval_s: int = 300
    """etcd: how often each broker compacts etcd's revision history."""
    producer_expiry_ms: int = 24 * 3600 * 1000
    """An idempotent producer's state (its sequences on a partition, its epoch) is forgotten after
    this long without a write, as Kafka's producer.id.expiration.ms (24 h)."""


@dataclass
class Config:
    broker: BrokerConfig = field(default_factory=BrokerConfig)
    wal: WalConfig = field(default_factory=WalConfig)
    metadata: MetadataConfig = field(default_factory=MetadataConfig)
    registry: RegistryConfig = field(default_factory=RegistryConfig)
    compactor: CompactorConfig = field(default_factory=CompactorConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    table: TableReadConfig = field(default_factory=TableReadConfig)
    faults: FaultsConfig = field(default_factory=FaultsConfig)
    data_dir: str = "neve-data"
    """Where `neve dev` keeps its objects and metadata."""
    log_level: str = "INFO"


class ConfigError(ValueError):
    pass


# `neve dev`'s defaults where they differ from a cluster's: the whole product on one machine, on a
# local disk. Applied before the config file, so every layer above still overrides them.
DEV_DEFAULTS: dict[str, dict[str, Any]] = {
    "wal": {"linger_ms": 5},
    "broker": {"auto_create_topics": True},
    "compactor": {"in_node": True},
}


def _coerce(value: Any, kind: Any, where: str) -> Any:
    try:
        if kind in (bool, "bool"):
            if isinstance(value, bool):
                return value
            lowered = str(value).strip().lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if kind in (int, "int"):
            return int(value)
        if kind in (float, "float"):
            return float(value)
        return str(value)
    except ValueError:
        raise ConfigError(f"{where}: cannot use {value!r} as {kind}") from None


def _apply(section: Any, values: dict[str, Any], where: str) -> None:
    names = {f.name: f for f in dataclasses.fields(section)}
    for key, value in values.items():
        if key not in names:
            raise ConfigError(f"{where}: unknown option {key!r} (known: {', '.join(sorted(names))})")
        setattr(section, key, _coerce(value, names[key].type, f"{where}.{key}"))


def load_config(path: str | None = None, env: dict[str, str] | None = None, *, dev: bool = False, **overrides: Any) -> Config:
    """Defaults (`DEV_DEFAULTS` over them when `dev`), then the TOML file, then NEVE_* environment
    variables, then `overrides` given as `section__field=value` (e.g. broker__port=9093) or
    top-level names."""
    config = Config()
    sections = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if dataclasses.is_dataclass(getattr(config, f.name))}
    if dev:
        for section_name, values in DEV_DEFAULTS.items():
            _apply(sections[section_name], values, "neve dev's defaults")
    if path:
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise ConfigError(f"config file {path}: {e}") from None
        for key, value in data.items():
            if key in sections and isinstance(value, dict):
                _apply(sections[key], value, f"{path} [{key}]")
            else:
                _apply(config, {key: value}, path)
    env = os.environ if env is None else env
    for name, value in env.items():
        if not name.startswith("NEVE_"):
            continue
        rest = name[5:].lower()
        for section_name, section in sections.items():
            prefix = section_name + "_"
            if rest.startswith(prefix):
                _apply(section, {rest[len(prefix) :]: value}, name)
                break
        else:
            if rest in ("data_dir", "log_level"):
                _apply(config, {rest: value}, name)
            else:
                # A misspelt variable silently ignored is a setting the operator believes is on.
                raise ConfigError(f"{name}: not a neve option (see `neve config` for every NEVE_* variable)")
    for key, value in overrides.items():
        if value is None:
            continue
        if "__" in key:
            section_name, field_name = key.split("__", 1)
            _apply(sections[section_name], {field_name: value}, "command line")
        else:
            _apply(config, {key: value}, "command line")
    return config


def describe_defaults() -> str:
    """Every option with its default and documentation, for `neve config`."""
    import inspect

    lines = []
    for section_field in dataclasses.fields(Config):
        default = section_field.default_factory() if section_field.default_factory is not dataclasses.MISSING else section_field.default  # type: ignore[misc]
        if not dataclasses.is_dataclass(default):
            lines.append(f"{section_field.name} = {default!r}    # env NEVE_{section_field.name.upper()}")
            continue
        lines.append(f"\n[{section_field.name}]")
        source = inspect.getsource(type(default))
        for f in dataclasses.fields(default):
            doc = ""
            marker = f"    {f.name}:"
            idx = source.find(marker)
            if idx >= 0:
                after = source[idx:].split('"""')
                if len(after) >= 3:
                    doc = " ".join(after[1].split())
            env_name = f"NEVE_{section_field.name.upper()}_{f.name.upper()}"
            lines.append(f"{f.name} = {getattr(default, f.name)!r}    # {env_name}: {doc}")
    return "\n".join(lines).strip() + "\n"
