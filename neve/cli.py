"""The `neve` command: `neve dev` runs a single node with no external services; `neve broker`
runs one broker of a cluster over etcd and S3; `neve config` prints every option with its default
and environment variable."""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import logging
import platform
import signal
import sys

from .config import ConfigError, describe_defaults, load_config
from .logs import setup_logging

log = logging.getLogger("neve.cli")


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
    sub.add_parser("config", help="print every option, its default and its environment variable")
    return parser


async def _run_node(config) -> int:
    from .node import Node, StartupError

    node = Node(config)
    try:
        await node.start()
    except StartupError as e:
        print(f"neve: {e}", file=sys.stderr)
        return 1
    print(f"neve listening on {config.broker.host}:{node.port}; data in {node.data_dir}", flush=True)
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
    try:
        if args.command == "dev":
            config = load_config(args.config, data_dir=args.data_dir, broker__port=args.port, broker__host=args.host)
        else:
            config = load_config(args.config, broker__port=args.port)
            if not config.metadata.url or not config.wal.object_store:
                raise ConfigError("`neve broker` needs metadata.url (etcd://host:port) and wal.object_store (s3://bucket/prefix?endpoint=...)")
    except ConfigError as e:
        print(f"neve: {e}", file=sys.stderr)
        return 2
    setup_logging(config.log_level)
    _tune_gc(config.broker.gc_young_threshold)
    _tune_malloc(config.broker.malloc_keep_bytes)
    import uvloop

    return uvloop.run(_run_node(config))


def _tune_gc(young_threshold: int) -> None:
    """See BrokerConfig.gc_young_threshold."""
    if young_threshold > 0:
        gc.freeze()  # what start-up built (modules, codecs) is never garbage: leave it out of every pass
        gc.set_threshold(young_threshold, 20, 100)


# glibc's mallopt parameters (malloc.h) and its ceiling for M_MMAP_THRESHOLD on 64-bit systems.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_MAX = 32 * 1024 * 1024


def _tune_malloc(keep_bytes: int) -> bool:
    """See BrokerConfig.malloc_keep_bytes. True when glibc took both settings."""
    if keep_bytes <= 0 or platform.libc_ver()[0] != "glibc":
        return False
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    took = mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX) == 1 and mallopt(_M_TRIM_THRESHOLD, min(keep_bytes, 2**31 - 1)) == 1
    log.info("malloc_tuned", extra={"keep_bytes": keep_bytes, "mmap_threshold": _MMAP_THRESHOLD_MAX, "applied": took})
    return took


if __name__ == "__main__":
    sys.exit(main())
