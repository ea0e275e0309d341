"""A broker's start on the metadata of a large cluster: issue 20's acceptance load, written through
the etcd store's own commit path, then a fresh store (and `neve broker`) started on it.

The load: 1,000 partitions (10 topics of 100) and 2,000 idempotent producers; each commit is one
4 MiB WAL object holding one batch of about 40 KiB (38 records of 1,100 bytes) for each of the
100 partitions of one topic, at byte ranges laid end to end, each batch from one of the topic's
200 producers with sequences that run on per producer and partition. 50 GiB is 12,800 commits.
Objects are names only: the metadata is the point, no WAL object is written. Each topic is one
writer (a store of its own), committing one object after another; writers run in several
processes at once. A writer follows nothing (its view of its own topic is its own commits), so
the set-up spends nothing on following 50 GiB of other writers' commits.

Everything is deterministic, so what a store should hold is computed, not remembered:
`high_watermark(topic, partition, commits)` and `entry(topic, partition, commit)`.

`python -m bench.metadata_load [--gib 50] [--processes 2]` starts a stock etcd, writes the load,
then starts an in-process EtcdMetadataStore and a `neve broker` on it (memory:// objects) and
checks both; one JSON line of figures (set-up time, start time, memory).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from metadata.etcd import EtcdMetadataStore, EtcdSettings
from metadata.model import Append, ObjectCommit

TOPICS = 10
PARTITIONS = 100  # per topic: 1,000 in all
PRODUCERS = 2_000  # 200 per topic
OBJECT_BYTES = 4 * 1024 * 1024
RECORD_BYTES = 1_100  # a 1 KiB record as a stored batch takes
FIRST_PRODUCER_ID = 1_000
T0 = 1_700_000_000_000
FOLLOWED = 20  # commits to topic 0 a started store follows
PATIENT = EtcdSettings(timeout=60.0)  # a slow shared disk takes its time over thousands of transactions


def topic_name(topic: int) -> str:
    return f"load-{topic}"


def object_key(topic: int, commit: int) -> str:
    return f"wal/{topic:02d}-{commit:06d}"


def batch_sizes(topic: int, commit: int) -> list[int]:
    """The bytes of each partition's batch in one object: OBJECT_BYTES split about evenly, each
    batch a little larger or smaller than the next (by a hash of its place)."""
    even = OBJECT_BYTES // PARTITIONS
    sizes = [even - 2_000 + (topic * 7_919 + commit * 104_729 + p * 1_299_709) % 4_000 for p in range(PARTITIONS)]
    sizes[-1] += OBJECT_BYTES - sum(sizes)
    return sizes


def record_count(size: int) -> int:
    return size // RECORD_BYTES


def producer_of(topic: int, commit: int, partition: int) -> int:
    """The producer of a batch: each topic's 200 producers take its partitions in turn."""
    per_topic = PRODUCERS // TOPICS
    return FIRST_PRODUCER_ID + topic * per_topic + (commit + partition) % per_topic


def high_watermark(topic: int, partition: int, commits: int) -> int:
    return sum(record_count(batch_sizes(topic, c)[partition]) for c in range(commits))


def entry(topic: int, partition: int, commit: int) -> tuple[int, str, int, int]:
    """(base offset, object key, start, size) of the index entry a commit added to a partition."""
    sizes = batch_sizes(topic, commit)
    return high_watermark(topic, partition, commit), object_key(topic, commit), sum(sizes[:partition]), sizes[partition]


class Writer(EtcdMetadataStore):
    """A store that commits and follows nothing: its topic's partitions are written by it alone,
    and its own commits keep its view of them."""

    async def _follow(self, revision: int) -> None:
        return None


async def write_topic(store: EtcdMetadataStore, topic: int, topic_id, first: int, commits: int) -> None:
    """Commits `first` .. `first + commits - 1` of one topic, one after another."""
    sequences: dict[tuple[int, int], int] = {}  # (producer, partition) -> its next sequence
    for c in range(first):  # the sequences the commits before `first` used
        for p, size in enumerate(batch_sizes(topic, c)):
            key = (producer_of(topic, c, p), p)
            sequences[key] = sequences.get(key, 0) + record_count(size)
    for c in range(first, first + commits):
        appends = []
        start = 0
        for p, size in enumerate(batch_sizes(topic, c)):
            pid, count = producer_of(topic, c, p), record_count(size)
            seq = sequences.get((pid, p), 0)
            sequences[(pid, p)] = seq + count
            appends.append(Append(topic_id, p, start, size, count, T0 + c * 200, producer_id=pid, producer_epoch=0, base_sequence=seq))
            start += size
        results = await store.commit(ObjectCommit(object_key(topic, c), start, tuple(appends)))
        failed = [r for r in results if r.error_code or r.duplicate]
        if failed:
            raise RuntimeError(f"commit {c} of topic {topic} failed: {failed[0]}")


async def _write_topics(port: int, root: str, topics: list[tuple[int, str]], first: int, commits: int) -> None:
    stores = [Writer("127.0.0.1", port, root=root, settings=PATIENT) for _ in topics]
    for s in stores:
        await s.start()
    try:
        await asyncio.gather(*(write_topic(s, t, uuid.UUID(tid), first, commits) for s, (t, tid) in zip(stores, topics, strict=True)))
    finally:
        for s in stores:
            await s.close()


def _worker(port: int, root: str, topics: list[tuple[int, str]], first: int, commits: int) -> None:
    asyncio.run(_write_topics(port, root, topics, first, commits))


async def create_topics(port: int, root: str) -> dict[int, uuid.UUID]:
    store = EtcdMetadataStore("127.0.0.1", port, root=root, settings=PATIENT)
    await store.start()
    try:
        return {t: (await store.create_topic(topic_name(t), PARTITIONS)).topic_id for t in range(TOPICS)}
    finally:
        await store.close()


def populate(port: int, root: str, topic_ids: dict[int, uuid.UUID], commits_per_topic: int, processes: int, first: int = 0) -> float:
    """Writes commits `first` .. of every topic, the topics spread over `processes` worker
    processes; returns the seconds it took."""
    shares = [[(t, str(topic_ids[t])) for t in range(TOPICS) if t % processes == i] for i in range(processes)]
    context = multiprocessing.get_context("spawn")
    started = time.perf_counter()
    workers = [context.Process(target=_worker, args=(port, root, share, first, commits_per_topic), daemon=True) for share in shares if share]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    failed = [w.exitcode for w in workers if w.exitcode]
    if failed:
        raise RuntimeError(f"writer processes exited with {failed}")
    return time.perf_counter() - started


def rss_bytes(pid: int | None = None) -> int:
    """Resident memory of a process (this one by default), from /proc."""
    with open(f"/proc/{pid or os.getpid()}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def check_view(store: EtcdMetadataStore, topic_ids: dict[int, uuid.UUID], commits: int) -> int:
    """Asserts every partition's high watermark and, for a spread of partitions, the entries of
    the first, middle and last commits; returns the lookups made."""
    lookups = 0
    for t, tid in topic_ids.items():
        for p in range(PARTITIONS):
            expected = high_watermark(t, p, commits)
            got = store.high_watermark(tid, p)
            if got != expected:
                raise AssertionError(f"topic {t} partition {p}: high watermark {got}, expected {expected}")
        for p in (0, t * 11 % PARTITIONS, PARTITIONS - 1):
            for c in sorted({0, 1, commits // 2, commits - 1}):
                base, key, start, size = entry(t, p, c)
                for offset in (base, base + record_count(size) - 1):
                    (found,) = store.entries(tid, p, offset, 1)
                    lookups += 1
                    if (found.base_offset, found.object_key, found.start, found.size) != (base, key, start, size):
                        raise AssertionError(f"topic {t} partition {p} offset {offset}: {found}, expected {(base, key, start, size)}")
    return lookups


async def start_store(port: int, root: str) -> tuple[EtcdMetadataStore, float, int]:
    """A fresh store started as a broker starts it: (store, seconds, bytes of RSS it added)."""
    before = rss_bytes()
    store = EtcdMetadataStore("127.0.0.1", port, root=root, settings=PATIENT)
    started = time.perf_counter()
    await store.start()
    return store, time.perf_counter() - started, rss_bytes() - before


async def follows(store: EtcdMetadataStore, port: int, root: str, topic_ids: dict[int, uuid.UUID], commits: int, more: int) -> float:
    """Another store commits `more` objects to topic 0: seconds until `store`'s view has them all
    (high watermarks and entries checked)."""
    writer = Writer("127.0.0.1", port, root=root, settings=PATIENT)
    await writer.start()
    try:
        started = time.perf_counter()
        await write_topic(writer, 0, topic_ids[0], commits, more)
        put = await writer._client.put(writer.keys.prefix("bench-marker"), b"")
        if not await store._view_reaches(put.header.revision, 60):
            raise AssertionError("the started store's view did not follow the new commits within 60 s")
        seconds = time.perf_counter() - started
    finally:
        await writer.close()
    tid = topic_ids[0]
    for p in range(PARTITIONS):
        if store.high_watermark(tid, p) != high_watermark(0, p, commits + more):
            raise AssertionError(f"partition {p}: {store.high_watermark(tid, p)} after following, expected {high_watermark(0, p, commits + more)}")
    for p in (0, PARTITIONS - 1):
        base, key, start, size = entry(0, p, commits + more - 1)
        (found,) = store.entries(tid, p, base, 1)
        if (found.object_key, found.start, found.size) != (key, start, size):
            raise AssertionError(f"partition {p}: {found} after following, expected {(key, start, size)}")
    return seconds


def start_broker(etcd_port: int, root: str, work_dir: Path) -> tuple[subprocess.Popen, str, float, int]:
    """`neve broker` on the load (objects in memory://: the metadata is measured): (process, its
    bootstrap address, seconds until it listens, its RSS then). Stop it with `servers.terminate`."""
    from .servers import free_port, spawn, wait_log_line

    port = free_port()
    env = {
        "PYTHONUNBUFFERED": "1",
        "NEVE_METADATA_URL": f"etcd://127.0.0.1:{etcd_port}/{root}",
        "NEVE_WAL_OBJECT_STORE": "memory://",
        "NEVE_BROKER_NODE_ID": "0",
        "NEVE_DATA_DIR": str(work_dir / "broker-data"),
        "NEVE_REGISTRY_PORT": "0",
    }
    log_path = work_dir / "broker.log"
    offset = log_path.stat().st_size if log_path.exists() else 0
    started = time.perf_counter()
    proc = spawn([sys.executable, "-m", "neve", "broker", "--port", str(port)], log_path, env)
    wait_log_line(log_path, offset, "neve listening", proc, "neve broker", timeout=600)
    return proc, f"127.0.0.1:{port}", time.perf_counter() - started, rss_bytes(proc.pid)


def broker_high_watermarks(bootstrap: str, topic_ids: dict[int, uuid.UUID]) -> dict[tuple[str, int], int]:
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    admin = AdminClient({"bootstrap.servers": bootstrap})
    asked = {TopicPartition(topic_name(t), p): OffsetSpec.latest() for t in topic_ids for p in range(PARTITIONS)}
    return {(tp.topic, tp.partition): f.result().offset for tp, f in admin.list_offsets(asked, request_timeout=60).items()}


async def run(port: int, gib: float, processes: int, work_dir: Path) -> dict:
    from .servers import terminate

    root = "load-" + uuid.uuid4().hex[:8]
    commits = max(2, round(gib * 1024 / (OBJECT_BYTES / 1024 / 1024) / TOPICS))
    topic_ids = await create_topics(port, root)
    setup_s = populate(port, root, topic_ids, commits, processes)
    figures: dict = {"gib": round(commits * TOPICS * OBJECT_BYTES / 2**30, 1), "commits": commits * TOPICS, "appends": commits * TOPICS * PARTITIONS, "setup_s": round(setup_s, 1)}
    store, start_s, rss = await start_store(port, root)
    try:
        figures.update(store_start_s=round(start_s, 2), store_rss_mib=round(rss / 2**20, 1))
        figures["lookups"] = check_view(store, topic_ids, commits)
        figures["follow_s"] = round(await follows(store, port, root, topic_ids, commits, FOLLOWED), 2)
    finally:
        await store.close()
    proc, bootstrap, broker_start_s, broker_rss = start_broker(port, root, work_dir)
    try:
        figures.update(broker_start_s=round(broker_start_s, 2), broker_rss_mib=round(broker_rss / 2**20, 1))
        hws = await asyncio.to_thread(broker_high_watermarks, bootstrap, topic_ids)
        made = {topic_name(t): commits + (FOLLOWED if t == 0 else 0) for t in topic_ids}
        wrong = [(tp, hw) for tp, hw in hws.items() if hw != high_watermark(int(tp[0].split("-")[1]), tp[1], made[tp[0]])]
        if wrong or len(hws) != TOPICS * PARTITIONS:
            raise AssertionError(f"the broker's high watermarks: {len(wrong)} of {len(hws)} wrong, e.g. {wrong[:3]}")
        figures["broker_rss_after_list_offsets_mib"] = round(rss_bytes(proc.pid) / 2**20, 1)
    finally:
        terminate(proc, timeout=30)
    figures["bench_cpu_s"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_utime + resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime, 1)
    return figures


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.metadata_load", description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=50.0, help="GiB produced the metadata stands for (default 50: 12,800 commits)")
    p.add_argument("--processes", type=int, default=2, help="writer processes (default 2)")
    args = p.parse_args(argv)
    from .servers import Etcd

    with tempfile.TemporaryDirectory(prefix="neve-metadata-load-") as tmp:
        work = Path(tmp)
        etcd = Etcd(work, work / "etcd.log")
        etcd.start()
        try:
            print(json.dumps(asyncio.run(run(etcd.client_port, args.gib, args.processes, work))), flush=True)
        finally:
            etcd.stop()


if __name__ == "__main__":
    main()
