"""The raw object-store PUT ceiling: how fast the system's own object store (through neve's
wal.store interface, no broker) accepts objects of a given size at a given concurrency. Produce
throughput is reported as a ratio of it, and its PUT p99 bounds the ack-latency target."""

from __future__ import annotations

import asyncio
import os
import time
import uuid

import numpy as np

from .progress import Progress
from .stats import MB, latency_ms

CEILING_KEYS = ("name", "backend", "object_bytes", "concurrency", "window_s", "puts", "puts_per_s", "mb_per_s", "put_latency_ms", "errors")


async def _measure(store, object_bytes: int, concurrency: int, warmup_s: float, duration_s: float, progress: Progress) -> dict:
    data = os.urandom(object_bytes)
    started = time.monotonic()
    t0, t1 = started + warmup_s, started + warmup_s + duration_s
    done: list[tuple[float, float]] = []  # (finished at, latency)
    errors: list[str] = []
    prefix = f"ceiling/{uuid.uuid4().hex[:8]}"

    async def worker(w: int) -> None:
        i = 0
        while time.monotonic() < t1:
            begin = time.monotonic()
            try:
                await store.put(f"{prefix}/{w:03d}-{i:08d}.obj", data)
            except Exception as e:  # recorded, then stop this worker: a failing store has no ceiling
                errors.append(repr(e))
                return
            end = time.monotonic()
            done.append((end, end - begin))
            i += 1

    async def ticker() -> None:
        last_n, last_t = 0, started
        while time.monotonic() < t1:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            n = len(done)
            phase = "warmup" if now < t0 else "measure"
            progress.line(f"{phase:7s} t={now - started:5.1f}s  {(n - last_n) / (now - last_t):8.1f} PUT/s  {(n - last_n) * object_bytes / MB / (now - last_t):8.2f} MB/s")
            last_n, last_t = n, now

    tick = asyncio.create_task(ticker())
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    tick.cancel()
    finished = np.array([d[0] for d in done])
    lat = np.array([d[1] for d in done])
    window = (finished >= t0) & (finished < t1)
    puts = int(window.sum())
    return {
        "puts": puts,
        "puts_per_s": round(puts / duration_s, 2),
        "mb_per_s": round(puts * object_bytes / MB / duration_s, 3),
        "put_latency_ms": latency_ms(lat[window]),
        "errors": errors[:5],
    }


def put_ceiling(system, name: str, object_bytes: int, concurrency: int, warmup_s: float, duration_s: float, progress: Progress) -> dict:
    """Measure in a fresh event loop with a fresh store; everything written is removed after."""
    progress.begin(name)
    progress.line(f"raw PUT ceiling: {object_bytes:,} B objects, {concurrency} at once, {duration_s:.1f}s")
    store = system.ceiling_store()

    async def run() -> dict:
        try:
            return await _measure(store, object_bytes, concurrency, warmup_s, duration_s, progress)
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
        "window_s": duration_s,
        **measured,
    }
    assert tuple(record) == CEILING_KEYS
    progress.line(f"ceiling {record['mb_per_s']:.1f} MB/s, {record['puts_per_s']:.1f} PUT/s, PUT p99 {record['put_latency_ms']['p99']} ms")
    return record
