"""The `neve` command: `neve dev` runs a single node with no external services; `neve broker`
runs one broker of a cluster over etcd and S3; `neve compactor` turns WAL objects into each topic's
Iceberg table; `neve registry` serves only the schema registry
over the metadata store; `neve sql` queries the tables with DuckDB; `neve config` prints every
option with its default and environment variable."""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import signal
import sys

from .config import ConfigError, describe_defaults, load_config
from .logs import setup_logging


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="neve", description="A leaderless Kafka-compatible broker on object storage.")
    sub = parser.add_subparsers(dest="command", required=True)
    dev = sub.add_parser("dev", help="run a single node: broker + embedded metadata + local object store")
    dev.add_argument("--data-dir", help="where objects and metadata live (default ./neve-data)")
    dev.add_argument("--port", type=int, help="Kafka port (default 9092)")
    dev.add_argument("--host", help="listen address (default 127.0.0.1)")
    dev.add_argument("--config", help="TOML config file (see `neve config`)")
    broker = sub.add_parser("broker", help="run one stateless broker of a cluster (set metadata.url and wal.object_store)")
    broker.add_argument("--config", help="TOML config file (see `neve config`); NEVE_* variables override it")
    broker.add_argument("--port", type=int, help="Kafka port (overrides the config)")
    registry = sub.add_parser("registry", help="serve only the schema registry (Confluent's REST API) over metadata.url")
    registry.add_argument("--config", help="TOML config file (see `neve config`); NEVE_* variables override it")
    registry.add_argument("--port", type=int, help="registry port (default 8081)")
    registry.add_argument("--data-dir", help="without metadata.url: the data dir whose SQLite metadata it serves")
    compactor = sub.add_parser("compactor", help="run the compaction service: WAL objects into each topic's Iceberg table (set compactor.catalog_url)")
    compactor.add_argument("--config", help="TOML config file (see `neve config`); NEVE_* variables override it")
    compactor.add_argument("--data-dir", help="without metadata.url and wal.object_store: a data dir no node is running on")
    compactor.add_argument("--once", action="store_true", help="compact everything there is now (freshness 0), print each cycle, and exit")
    compactor.add_argument("--metrics-port", type=int, help="Prometheus metrics on this port (compactor.metrics_port)")
    sql = sub.add_parser("sql", help="query the topics' Iceberg tables with DuckDB: one view per table, e.g. neve sql \"SELECT * FROM orders\"")
    sql.add_argument("query", nargs="?", help="the SQL (DuckDB's dialect); without it, the tables there are")
    sql.add_argument("--data-dir", help="the data dir of the `neve dev` whose tables to read (default ./neve-data)")
    sql.add_argument("--config", help="TOML config file (see `neve config`): its [compactor] catalog")
    sql.add_argument("--format", choices=("box", "csv", "json"), default="box", help="DuckDB's boxes (default), CSV, or one JSON object a line")
    sub.add_parser("config", help="print every option, its default and its environment variable")
    return parser


async def _run_compactor(config, once: bool) -> int:
    from .compaction import CompactorNode
    from .node import StartupError

    node = CompactorNode(config)
    try:
        await node.start(cycle=not once)
    except StartupError as e:
        print(f"neve: {e}", file=sys.stderr)
        return 1
    settings = node.running.settings
    print(f"neve compactor: metadata {node.metadata_url}; catalog {settings.catalog_url.split('@')[-1]}; tasks run {settings.runner}", flush=True)
    if once:
        def progress(c) -> None:
            offsets = ", ".join(f"{p}:{a}-{b}" for p, (a, b) in sorted(c.offsets.items()))
            print(f"{c.topic} -> {c.table}: {c.rows} rows in {c.files} files, snapshot {c.snapshot_id} (partition:offsets {offsets})", flush=True)

        try:
            done = await node.running.run_until_caught_up(progress)
        finally:
            await node.stop()
        failed = node.running.service.failed
        if failed:  # the log says why
            print(f"neve compactor: compaction failed for {', '.join(failed)} after {len(done)} cycles", file=sys.stderr, flush=True)
            return 1
        print(f"caught up: {len(done)} cycles, {sum(c.rows for c in done)} rows", flush=True)
        return 0
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    print("neve compactor stopping", flush=True)
    await node.stop()
    return 0


async def _run_node(config, command: str) -> int:
    from .node import Node, RegistryNode, StartupError

    node = RegistryNode(config) if command == "registry" else Node(config, dev=command == "dev", on_cycle=_table_announcer(config))
    try:
        await node.start()
    except StartupError as e:
        print(f"neve: {e}", file=sys.stderr)
        return 1
    if command == "registry":
        print(f"neve schema registry on {node.registry.url}; metadata {node.metadata_url}", flush=True)
    else:
        registry = f"; schema registry on {node.registry.url}" if node.registry is not None else ""
        first, *others = node.listening()
        more = "".join(f"; {protocol} listener {name} on {host}:{port}" for name, protocol, host, port in others)
        print(f"neve listening on {first[2]}:{first[3]}; data in {node.data_dir}{registry}{more}", flush=True)
        if command == "dev" or node.compactor is not None:
            print(_where_things_are(config, node), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    print("neve stopping", flush=True)
    await node.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "config":
        sys.stdout.write(describe_defaults())
        return 0
    if args.command == "sql":
        return _sql(args)
    try:
        if args.command == "dev":
            config = load_config(args.config, dev=True, data_dir=args.data_dir, broker__port=args.port, broker__host=args.host)
        elif args.command == "registry":
            config = load_config(args.config, data_dir=args.data_dir, registry__port=args.port)
            if config.registry.url:
                raise ConfigError("registry.url names an external registry: `neve registry` would serve none")
        elif args.command == "compactor":
            config = load_config(args.config, data_dir=args.data_dir, compactor__metrics_port=args.metrics_port, **({"compactor__freshness_ms": 0} if args.once else {}))
        else:
            config = load_config(args.config, broker__port=args.port)
            if not config.metadata.url or not config.wal.object_store:
                raise ConfigError("`neve broker` needs metadata.url (etcd://host:port) and wal.object_store (s3://bucket/prefix?endpoint=...)")
    except ConfigError as e:
        print(f"neve: {e}", file=sys.stderr)
        return 2
    setup_logging(config.log_level)
    tune_gc(config.broker.gc_young_threshold)
    import uvloop

    if args.command == "compactor":
        return uvloop.run(_run_compactor(config, args.once))
    return uvloop.run(_run_node(config, args.command))


def _where_things_are(config, node) -> str:
    """`neve dev`'s word to a new user: where Kafka, the registry and the tables are, and a line to
    paste that reads a topic's table."""
    _name, protocol, host, port = node.listening()[0]
    lines = [f"  Kafka      bootstrap.servers={host}:{port}" + (f" ({protocol})" if protocol != "PLAINTEXT" else "") + (" (a topic is created on first use)" if config.broker.auto_create_topics else "")]
    if node.registry is not None:
        lines.append(f"  registry   {node.registry.url}")
    if node.compactor is None:
        lines.append("  tables     none: the compactor is off (compactor.in_node)")
        return "\n".join(lines)
    from compactor.catalog import catalog_target

    from .sql import one_liner, pyiceberg_one_liner, sqlite_path, table_query

    settings = node.compactor.settings
    target = catalog_target(settings)
    ns = settings.namespace
    lines.append(f"  tables     {ns}.<topic> (. and - made _), one Iceberg table per topic, its rows there seconds after the acknowledgement;")
    lines.append(f"             catalog {sqlite_path(target) or target.display}, warehouse {target.warehouse}, tasks on {settings.runner}")
    lines.append(f"  query      {one_liner(table_query('<topic>'), None if config.compactor.catalog_url else node.data_dir)}")
    if (line := pyiceberg_one_liner(target, f"{ns}.<topic>")) is not None:
        lines.append(f"  pyiceberg  {line}")
    return "\n".join(lines)


def _table_announcer(config):
    """A node's `on_cycle`: prints, at the first rows of each table since start, the line that
    reads it."""
    seen: set[str] = set()

    def announce(cycle) -> None:
        if cycle.table in seen:
            return
        seen.add(cycle.table)
        from .sql import one_liner, table_query

        data_dir = None if config.compactor.catalog_url else os.path.abspath(config.data_dir)
        name = cycle.table.rsplit(".", 1)[-1]
        print(f"table {cycle.table} of topic {cycle.topic} has rows; read them: {one_liner(table_query(name), data_dir)}", flush=True)

    return announce


def _sql(args) -> int:
    from compactor.catalog import CatalogError

    from .compaction import compactor_settings
    from .sql import SqlError, run

    try:
        config = load_config(args.config, data_dir=args.data_dir)
        run(compactor_settings(config, os.path.abspath(config.data_dir)), args.query, args.format)
    except (ConfigError, CatalogError, SqlError) as e:
        print(f"neve sql: {e}", file=sys.stderr)
        return 1
    return 0


def tune_gc(young_threshold: int) -> None:
    """See BrokerConfig.gc_young_threshold (every neve process; the benches' workers too)."""
    if young_threshold > 0:
        gc.freeze()  # what start-up built (modules, codecs) is never garbage: leave it out of every pass
        gc.set_threshold(young_threshold, 20, 100)


if __name__ == "__main__":
    sys.exit(main())
