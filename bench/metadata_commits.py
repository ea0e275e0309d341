"""What one WAL object's sequencer commit costs the brokers, per partition it holds, on a real etcd.

Every WAL object commits one head and one index entry per partition it holds, and every broker
follows every commit through its etcd watch. With many partitions per object (records spread over
10,000 partitions) that per-partition work is most of a broker's CPU. This measures, in one
process against a stock etcd started on a free port:

- commit: the committing broker's CPU per partition-append (`EtcdMetadataStore.commit`, its
  transactions, and skipping its own watch events);
- follow: the CPU a second store following those commits spends per append (the process's CPU
  with a follower, minus the same run without one).

`python -m bench.metadata_commits [--partitions N] [--per-object N] [--objects N] [--rounds N]`;
one JSON line per measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import tempfile
import time
import uuid
from pathlib import Path

from metadata.etcd import EtcdMetadataStore
from metadata.model import Append, ObjectCommit

from .servers import Etcd

RECORD_BYTES = 1100  # one 1 KiB record as a stored batch


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def measure(port: int, partitions: int, per_object: int, objects: int, follow: bool) -> dict:
    """Commit `objects` objects of `per_object` one-batch appends each, in turn over the partitions;
    returns the process's CPU per append and the mean commit time."""
    root = "bench-commits-" + uuid.uuid4().hex[:8]
    store = EtcdMetadataStore("127.0.0.1", port, root=root)
    await store.start()
    follower = None
    try:
        info = await store.create_topic("t", partitions)
        if follow:
            follower = EtcdMetadataStore("127.0.0.1", port, root=root)
            await follower.start()

        async def commit(n: int, chosen: list[int]) -> None:
            appends = tuple(Append(info.topic_id, p, i * RECORD_BYTES, RECORD_BYTES, 1, 1_700_000_000_000) for i, p in enumerate(chosen))
            results = await store.commit(ObjectCommit(f"objects/{n:08d}", len(chosen) * RECORD_BYTES, appends))
            if any(r.error_code for r in results):
                raise RuntimeError(f"commit {n} failed: {[r for r in results if r.error_code][:3]}")

        async def followed(chosen: list[int]) -> None:
            """Until the follower has applied the last commit (watch events come in revision order)."""
            if follower is None:
                return
            want = {p: store.high_watermark(info.topic_id, p) for p in chosen}
            deadline = time.monotonic() + 60
            while any(follower.high_watermark(info.topic_id, p) < o for p, o in want.items()):
                if time.monotonic() > deadline:
                    raise RuntimeError("the follower did not see every commit within 60 s")
                await asyncio.sleep(0.02)

        everything = list(range(partitions))
        await commit(0, everything)  # every head exists before the measured commits
        await followed(everything)
        cpu, t = _cpu(), time.perf_counter()
        chosen: list[int] = []
        for n in range(1, objects + 1):
            chosen = [((n - 1) * per_object + k) % partitions for k in range(per_object)]
            await commit(n, chosen)
        await followed(chosen)
        cpu, t = _cpu() - cpu, time.perf_counter() - t
        appends = objects * per_object
        return {"follower": follow, "appends": appends, "cpu_us_per_append": round(cpu / appends * 1e6, 2), "commit_ms": round(t / objects * 1000, 1)}
    finally:
        if follower is not None:
            await follower.close()
        await store.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.metadata_commits", description=__doc__.split("\n\n")[0])
    p.add_argument("--partitions", type=int, default=10_000, help="partitions of the topic (default 10000)")
    p.add_argument("--per-object", type=int, default=3_400, help="partitions each object holds (default 3400, as at 10,000 round-robin partitions)")
    p.add_argument("--objects", type=int, default=12, help="measured commits per run (default 12)")
    p.add_argument("--rounds", type=int, default=2, help="runs without and with a follower, alternating (default 2)")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="neve-bench-commits-"))
    etcd = Etcd(work, work / "etcd.log")
    etcd.start()
    try:
        for round_no in range(args.rounds):
            alone = asyncio.run(measure(etcd.client_port, args.partitions, args.per_object, args.objects, follow=False))
            both = asyncio.run(measure(etcd.client_port, args.partitions, args.per_object, args.objects, follow=True))
            print(json.dumps({"round": round_no, "role": "commit", **alone}), flush=True)
            follow_cost = round(both["cpu_us_per_append"] - alone["cpu_us_per_append"], 2)
            print(json.dumps({"round": round_no, "role": "follow", "appends": both["appends"], "cpu_us_per_append": follow_cost}), flush=True)
    finally:
        etcd.stop()


if __name__ == "__main__":
    main()
