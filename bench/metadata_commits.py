"""What one WAL object's sequencer commit costs the brokers, per partition it holds, on a real etcd.

Every WAL object commits one head per partition it holds and one index record per commit
transaction (metadata/etcd/commits.py), and every broker follows every commit through its etcd watch. With many partitions per object (records spread over
10,000 partitions) that per-partition work is most of a broker's CPU. This measures, against a
stock etcd started on a free port:

- commit: the committing broker's CPU per partition-append (`EtcdMetadataStore.commit`, its
  transactions, and skipping its own watch events), in this process;
- follow: the CPU per append of a second store following those commits through its watch, in a
  process of its own (its own rusage, from the view before the commits to the view after them).

`python -m bench.metadata_commits [--partitions N] [--per-object N] [--objects N] [--rounds N]`;
one JSON line per measurement. `--producers N [--commits N]` measures instead what a commit costs on
a partition N idempotent producers have written against one that only one has (each producer's
state is a key of its own, so it should cost the same).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import resource
import tempfile
import time
import uuid
from pathlib import Path

from metadata.etcd import EtcdMetadataStore
from metadata.model import Append, ObjectCommit

from .servers import Etcd

RECORD_BYTES = 1100  # one 1 KiB record as a stored batch
FOLLOW_TIMEOUT_S = 60.0


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _follower(port: int, root: str, conn) -> None:
    """The following store's process: reports its CPU between the two revisions it is sent."""
    asyncio.run(_follow(port, root, conn))


async def _follow(port: int, root: str, conn) -> None:
    """Sent a revision, wait until the view reaches it and answer ("ok", CPU since the first one);
    twice: the first marks the start (after the priming commit), the second the measured commits."""
    store = EtcdMetadataStore("127.0.0.1", port, root=root)
    await store.start()
    try:
        started = None
        for step in ("primed", "committed"):
            revision = await asyncio.to_thread(conn.recv)
            if not await store._view_reaches(revision, FOLLOW_TIMEOUT_S):
                conn.send(("error", f"the follower's view did not reach revision {revision} ({step}) within {FOLLOW_TIMEOUT_S:g} s"))
                return
            now = _cpu()
            started = now if started is None else started
            conn.send(("ok", now - started))
    finally:
        await store.close()


async def _revision(store: EtcdMetadataStore) -> int:
    """etcd's revision now, past every commit made so far (a put of a marker key)."""
    put = await store._client.put(store.keys.prefix("bench-marker"), b"")
    return put.header.revision


async def measure(port: int, partitions: int, per_object: int, objects: int, follow: bool) -> dict:
    """Commit `objects` objects of `per_object` one-batch appends each, in turn over the partitions;
    returns this process's CPU per append, the mean commit time and, with `follow`, the CPU per
    append of a store following the commits in a process of its own."""
    root = "bench-commits-" + uuid.uuid4().hex[:8]
    store = EtcdMetadataStore("127.0.0.1", port, root=root)
    await store.start()
    follower = conn = None
    try:
        info = await store.create_topic("t", partitions)
        if follow:
            conn, child = multiprocessing.Pipe()
            follower = multiprocessing.get_context("spawn").Process(target=_follower, args=(port, root, child), daemon=True)
            follower.start()

        async def commit(n: int, chosen: list[int]) -> None:
            appends = tuple(Append(info.topic_id, p, i * RECORD_BYTES, RECORD_BYTES, 1, 1_700_000_000_000) for i, p in enumerate(chosen))
            results = await store.commit(ObjectCommit(f"objects/{n:08d}", len(chosen) * RECORD_BYTES, appends))
            if any(r.error_code for r in results):
                raise RuntimeError(f"commit {n} failed: {[r for r in results if r.error_code][:3]}")

        async def followed() -> float:
            """The follower's CPU since it last answered, once its view holds every commit so far."""
            conn.send(await _revision(store))
            if not await asyncio.to_thread(conn.poll, FOLLOW_TIMEOUT_S + 10):
                raise RuntimeError("the follower did not answer")
            status, value = conn.recv()
            if status != "ok":
                raise RuntimeError(value)
            return value

        await commit(0, list(range(partitions)))  # every head exists before the measured commits
        if follower is not None:
            await followed()
        cpu, t = _cpu(), time.perf_counter()
        for n in range(1, objects + 1):
            await commit(n, [((n - 1) * per_object + k) % partitions for k in range(per_object)])
        cpu, t = _cpu() - cpu, time.perf_counter() - t
        appends = objects * per_object
        got = {"follower": follow, "appends": appends, "cpu_us_per_append": round(cpu / appends * 1e6, 2), "commit_ms": round(t / objects * 1000, 1)}
        if follower is not None:
            got["follow_cpu_us_per_append"] = round(await followed() / appends * 1e6, 2)
        return got
    finally:
        if follower is not None:
            follower.join(FOLLOW_TIMEOUT_S)
            if follower.is_alive():
                follower.kill()
        await store.close()


async def measure_producers(port: int, producers: int, commits: int) -> dict:
    """A commit's cost on a partition `producers` idempotent producers have written, against one
    only one has: one producer keeps writing one batch at a time to each partition, in turn, and
    this process's CPU and the commit's time are summed per partition (issue 20: within 1.2x)."""
    root = "bench-producers-" + uuid.uuid4().hex[:8]
    store = EtcdMetadataStore("127.0.0.1", port, root=root)
    await store.start()
    try:
        one, many = (await store.create_topic("one", 1)).topic_id, (await store.create_topic("many", 1)).topic_id
        prime = 1000  # producers per priming object (its transactions of PRODUCERS_PER_TXN each)
        for first in range(0, producers, prime):
            count = min(prime, producers - first)
            appends = tuple(Append(many, 0, i * RECORD_BYTES, RECORD_BYTES, 1, 1_700_000_000_000, producer_id=first + i, producer_epoch=0, base_sequence=0) for i in range(count))
            await store.commit(ObjectCommit(f"objects/prime-{first:08d}", count * RECORD_BYTES, appends))
        spent = {one: [0.0, 0.0], many: [0.0, 0.0]}  # CPU s, wall s
        for seq in range(commits + 1):
            for topic in (one, many):
                append = Append(topic, 0, 0, RECORD_BYTES, 1, 1_700_000_000_000, producer_id=0, producer_epoch=0, base_sequence=seq if topic == one else seq + 1)
                cpu, t = _cpu(), time.perf_counter()
                results = await store.commit(ObjectCommit(f"objects/{topic.hex[:8]}-{seq:08d}", RECORD_BYTES, (append,)))
                if seq:  # the first of each is the warm-up (one's producer is new there)
                    spent[topic][0] += _cpu() - cpu
                    spent[topic][1] += time.perf_counter() - t
                if results[0].error_code or results[0].duplicate:
                    raise RuntimeError(f"commit {seq} to {topic} failed: {results[0]}")
        per = {name: {"cpu_us_per_commit": round(spent[t][0] / commits * 1e6, 1), "commit_ms": round(spent[t][1] / commits * 1000, 2)} for name, t in (("one", one), ("many", many))}
        return {"producers": producers, "commits": commits, **per, "cpu_ratio": round(spent[many][0] / spent[one][0], 3), "time_ratio": round(spent[many][1] / spent[one][1], 3)}
    finally:
        await store.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.metadata_commits", description=__doc__.split("\n\n")[0])
    p.add_argument("--partitions", type=int, default=10_000, help="partitions of the topic (default 10000)")
    p.add_argument("--per-object", type=int, default=3_400, help="partitions each object holds (default 3400, as at 10,000 round-robin partitions)")
    p.add_argument("--objects", type=int, default=12, help="measured commits per run (default 12)")
    p.add_argument("--rounds", type=int, default=2, help="runs, each measuring both (default 2)")
    p.add_argument("--producers", type=int, default=0, help="instead: a commit's cost on a partition this many idempotent producers wrote, against one (issue 20)")
    p.add_argument("--commits", type=int, default=500, help="with --producers: measured commits per partition (default 500)")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="neve-bench-commits-"))
    etcd = Etcd(work, work / "etcd.log")
    etcd.start()
    try:
        if args.producers:
            for round_no in range(args.rounds):
                print(json.dumps({"round": round_no, **asyncio.run(measure_producers(etcd.client_port, args.producers, args.commits))}), flush=True)
            return
        for round_no in range(args.rounds):
            got = asyncio.run(measure(etcd.client_port, args.partitions, args.per_object, args.objects, follow=True))
            print(json.dumps({"round": round_no, "role": "commit", "appends": got["appends"], "cpu_us_per_append": got["cpu_us_per_append"], "commit_ms": got["commit_ms"]}), flush=True)
            print(json.dumps({"round": round_no, "role": "follow", "appends": got["appends"], "cpu_us_per_append": got["follow_cpu_us_per_append"]}), flush=True)
    finally:
        etcd.stop()


if __name__ == "__main__":
    main()
