"""put-ceiling: the raw object-store PUT rate of the system's own object store (for neve-dev,
wal.store.FileObjectStore on the same filesystem as the broker's data dir), at one object size and
concurrency. No broker traffic; the produce scenario measures the same at its own object sizes."""

from __future__ import annotations

from ..options import size, size_label

NAME = "put-ceiling"
HELP = "raw object-store PUT rate at the WAL object size and upload concurrency"


def add_arguments(parser) -> None:
    parser.add_argument("--object-bytes", type=size, default=None, help="object size (default: the broker's flush size, 4MiB)")
    parser.add_argument("--concurrency", type=int, default=None, help="PUTs at once (default: the broker's max in-flight uploads)")


def run(r) -> None:
    wal = r.make_system().wal_settings()  # no broker needed: the store is used directly
    object_bytes = r.args.object_bytes or (wal.flush_bytes if wal else 4 * 2**20)
    concurrency = r.args.concurrency or (wal.max_inflight_uploads if wal else 4)
    timing = r.timing(full=(1.0, 8.0), quick=(0.2, 1.0))
    r.ceiling(f"put-ceiling-{size_label(object_bytes)}-x{concurrency}", object_bytes, concurrency, timing)
