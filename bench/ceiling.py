"""The raw object-store PUT ceiling: how fast the system's own object store (through neve's
wal.store interface, no broker) accepts objects of a given size at a given concurrency. Produce
throughput is reported as a ratio of it, and its PUT p99 bounds the ack-latency target."""

from __future__ import annotations

import asyncio
import os
import time
import uuid

import numpy as np

from .procstat import cpu_delta, machine_busy_seconds
from .progress import Progress
from .stats import MB, latency_ms

CEILING_KEYS = ("name", "backend", "object_bytes", "concurrency", "window_s", "puts", "puts_per_s", "mb_per_s", "put_latency_ms", "machine_busy_cores", "servers_cpu_s", "errors")


# A window lasts at least its duration and until this many PUTs finished in it, up to MAX_WINDOW_S:
# on a slow store a 1 s quick window could end before one 4 MiB PUT did, and the ceiling read 0.
MIN_PUTS = 8
MIN_TXNS = 20
MAX_WINDOW_S = 120.0


class _Window:
    """A measurement window from t0: it ends at the first check at or after `t0 + duration_s`
    once `least` events finished inside it (or MAX_WINDOW_S passed), so what it measures is sized
    by events, not only by seconds."""

    def __init__(self, t0: float, duration_s: float, least: int) -> None:
        self.t0, self.t1, self.least = t0, t0 + duration_s, least
        self.inside = 0
        self.end: float | None = None
        self.ended = asyncio.Event()

    def finished(self, at: float) -> None:
        if at >= self.t0 and self.end is None:
            self.inside += 1

    def over(self, now: float) -> bool:
        if self.end is None and now >= self.t1 and (self.inside >= self.least or now >= self.t0 + MAX_WINDOW_S):
            self.end = now
            self.ended.set()
        return self.end is not None

    @property
    def seconds(self) -> float:
        return self.end - self.t0


async def _measure(store, object_bytes: int, concurrency: int, warmup_s: float, duration_s: float, progress: Progress, servers_cpu) -> dict:
    data = os.urandom(object_bytes)
    started = time.monotonic()
    t0 = started + warmup_s
    window = _Window(t0, duration_s, MIN_PUTS)
    done: list[tuple[float, float]] = []  # (finished at, latency)
    errors: list[str] = []
    prefix = f"ceiling/{uuid.uuid4().hex[:8]}"

    async def worker(w: int) -> None:
        i = 0
        while not window.over(time.monotonic()):
            begin = time.monotonic()
            try:
                await store.put(f"{prefix}/{w:03d}-{i:08d}.obj", data)
            except Exception as e:  # recorded, then stop this worker: a failing store has no ceiling
                errors.append(repr(e))
                window.over(float("inf"))
                return
            end = time.monotonic()
            done.append((end, end - begin))
            window.finished(end)
            i += 1

    async def ticker() -> None:
        last_n, last_t = 0, started
        while not window.over(time.monotonic()):
            await asyncio.sleep(1.0)
            now = time.monotonic()
            n = len(done)
            phase = "warmup" if now < t0 else "measure"
            progress.line(f"{phase:7s} t={now - started:5.1f}s  {(n - last_n) / (now - last_t):8.1f} PUT/s  {(n - last_n) * object_bytes / MB / (now - last_t):8.2f} MB/s")
            last_n, last_t = n, now

    async def busy_cores() -> tuple[float, dict]:
        """The whole machine's busy cores over the window, and each server's CPU-seconds in it."""
        await asyncio.sleep(max(0.0, t0 - time.monotonic()))
        servers0, busy0, at0 = servers_cpu(), machine_busy_seconds(), time.monotonic()
        await window.ended.wait()
        servers1, busy1, at1 = servers_cpu(), machine_busy_seconds(), time.monotonic()
        return round((busy1 - busy0) / (at1 - at0), 2), cpu_delta(servers0, servers1)

    tick = asyncio.create_task(ticker())
    busy = asyncio.create_task(busy_cores())
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    tick.cancel()
    machine_busy, servers = await busy
    seconds = window.seconds if window.end != float("inf") else duration_s
    finished = np.array([d[0] for d in done])
    lat = np.array([d[1] for d in done])
    inside = (finished >= t0) & (finished < t0 + seconds)
    puts = int(inside.sum())
    return {
        "window_s": round(seconds, 3),
        "puts": puts,
        "puts_per_s": round(puts / seconds, 2),
        "mb_per_s": round(puts * object_bytes / MB / seconds, 3),
        "put_latency_ms": latency_ms(lat[inside]),
        "machine_busy_cores": machine_busy,
        "servers_cpu_s": servers,
        "errors": errors[:5],
    }


def put_ceiling(system, name: str, object_bytes: int, concurrency: int, warmup_s: float, duration_s: float, progress: Progress) -> dict:
    """Measure in a fresh event loop with a fresh store; everything written is removed after."""
    progress.begin(name)
    progress.line(f"raw PUT ceiling: {object_bytes:,} B objects, {concurrency} at once, {duration_s:.1f}s")
    store = system.ceiling_store()

    async def run() -> dict:
        try:
            return await _measure(store, object_bytes, concurrency, warmup_s, duration_s, progress, system.servers.cpu_seconds)
        finally:
            await store.close()

    try:
        measured = asyncio.run(run())
    finally:
        system.clear_ceiling_store()
    record = {
        "name": name,
        "backend": type(store).__name__,
        "object_bytes": object_bytes,
        "concurrency": concurrency,
        **measured,
    }
    assert tuple(record) == CEILING_KEYS
    progress.line(f"ceiling {record['mb_per_s']:.1f} MB/s, {record['puts_per_s']:.1f} PUT/s, PUT p99 {record['put_latency_ms']['p99']} ms")
    return record


# -- the raw etcd transaction: the metadata term of the ack-latency bound ----------------------------

ETCD_TXN_KEYS = ("name", "backend", "partitions", "ops_per_txn", "window_s", "txns", "txns_per_s", "txn_latency_ms", "errors")


async def _measure_txn(endpoint: str, partitions: int, warmup_s: float, duration_s: float, progress: Progress) -> dict:
    """One commit after another, each shaped like the sequencer's for an object touching
    `partitions` partitions: compare every head's mod revision and that the transaction's
    wal-index record is new, put every head and the record (an entry per partition), read the
    heads back on failure."""
    import aetcd

    from metadata.etcd import encode_wal_index
    from metadata.model import IndexEntry, ObjectType

    host, port = endpoint.rsplit(":", 1)
    client = aetcd.Client(host=host, port=int(port), timeout=10)
    root = f"/bench-txn-{uuid.uuid4().hex[:8]}/".encode()
    heads = [root + b"heads/%06d" % p for p in range(partitions)]
    object_key = "wal/0000000000000000000000-0000-0000-0000-000000000000.wal"
    topic_id = uuid.uuid4()
    record = encode_wal_index(object_key, {(topic_id, p): [IndexEntry(0, 99, object_key, ObjectType.WAL, p * 41943, 41943, 1700000000000)] for p in range(partitions)})
    errors: list[str] = []
    lat: list[tuple[float, float]] = []
    try:
        revisions = {}
        for key in heads:
            put = await client.put(key, b'{"n":0,"s":0,"p":{}}')
            revisions[key] = put.header.revision
        tx = client.transactions
        started = time.monotonic()
        t0 = started + warmup_s
        window = _Window(t0, duration_s, MIN_TXNS)
        next_tick, last_n = started + 1.0, 0
        n = 0
        while not window.over(time.monotonic()):
            n += 1
            record_key = root + b"wal-index/%s/%012d/0000" % (object_key.encode(), n)
            compare = [tx.mod(k) == revisions[k] for k in heads] + [tx.create(record_key) == 0]
            success = [tx.put(k, b'{"n":%d,"s":0,"p":{}}' % (n * 100)) for k in heads] + [tx.put(record_key, record)]
            begin = time.monotonic()
            try:
                ok, responses = await client.transaction(compare=compare, success=success, failure=[tx.get(k) for k in heads])
            except Exception as e:  # recorded; a store that fails has no baseline
                errors.append(repr(e))
                break
            end = time.monotonic()
            if not ok:
                errors.append("transaction conflicted: something else wrote the baseline's keys")
                break
            revision = responses[0].response_put.header.revision
            revisions = dict.fromkeys(heads, revision)
            lat.append((end, end - begin))
            window.finished(end)
            if end >= next_tick:
                phase = "warmup" if end < t0 else "measure"
                progress.line(f"{phase:7s} t={end - started:5.1f}s  {len(lat) - last_n:6d} txn/s  last {1000 * (end - begin):.1f} ms")
                last_n, next_tick = len(lat), next_tick + 1.0
        await client.delete_prefix(root)
    finally:
        await client.close()
    seconds = window.seconds if window.end is not None else duration_s  # None: it failed first
    inside = np.array([d for at, d in lat if t0 <= at < t0 + seconds])
    return {"window_s": round(seconds, 3), "txns": int(inside.size), "txns_per_s": round(inside.size / seconds, 2), "txn_latency_ms": latency_ms(inside), "errors": errors[:5]}


def etcd_txn_baseline(endpoint: str, name: str, partitions: int, warmup_s: float, duration_s: float, progress: Progress) -> dict:
    progress.begin(name)
    from metadata.etcd import PARTITIONS_PER_TXN

    partitions = max(1, min(partitions, PARTITIONS_PER_TXN))  # the etcd store's most per commit transaction
    progress.line(f"raw etcd transaction: {partitions} heads compared, {partitions + 1} puts, one at a time, {duration_s:.1f}s")
    measured = asyncio.run(_measure_txn(endpoint, partitions, warmup_s, duration_s, progress))
    record = {"name": name, "backend": "etcd (aetcd)", "partitions": partitions, "ops_per_txn": partitions + 1, **measured}
    assert tuple(record) == ETCD_TXN_KEYS
    progress.line(f"etcd txn p50 {record['txn_latency_ms']['p50']} ms, p99 {record['txn_latency_ms']['p99']} ms, {record['txns_per_s']} txn/s")
    return record
