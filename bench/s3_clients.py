"""Which S3 client should the WAL use? Measures aioboto3 and obstore against the same SeaweedFS:
PUT throughput of WAL-sized objects and ranged-GET throughput, each with the client process's CPU
seconds per GiB moved. `python -m bench.s3_clients [--objects N] [--size MiB] [--concurrency C] [--rounds R]`; one JSON
line per client per round. SeaweedFS is started on free ports by bench/servers.py."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import tempfile
import time
from pathlib import Path

SIZE_MIB = 4
RANGE = 256 * 1024


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def _measure(name, put, get, objects: int, size: int, concurrency: int, round_no: int) -> dict:
    data = os.urandom(size)
    sem = asyncio.Semaphore(concurrency)

    async def one_put(i):
        async with sem:
            await put(f"{name}/{round_no}/{i:06d}", data)

    async def one_get(i):
        async with sem:
            got = await get(f"{name}/{round_no}/{i % objects:06d}", (i * RANGE) % (size - RANGE), RANGE)
            assert len(got) == RANGE

    cpu, t = _cpu(), time.perf_counter()
    await asyncio.gather(*(one_put(i) for i in range(objects)))
    put_s, put_cpu = time.perf_counter() - t, _cpu() - cpu
    gets = objects * (size // RANGE)
    cpu, t = _cpu(), time.perf_counter()
    await asyncio.gather(*(one_get(i) for i in range(gets)))
    get_s, get_cpu = time.perf_counter() - t, _cpu() - cpu
    gib_put = objects * size / 2**30
    gib_get = gets * RANGE / 2**30
    return {
        "client": name,
        "put_MBps": round(objects * size / 2**20 / put_s, 1),
        "put_cpu_s_per_GiB": round(put_cpu / gib_put, 2),
        "get_MBps": round(gets * RANGE / 2**20 / get_s, 1),
        "get_cpu_s_per_GiB": round(get_cpu / gib_get, 2),
    }


async def main(args) -> list[dict]:
    from .servers import NEVE_BUCKET, Servers

    with tempfile.TemporaryDirectory() as tmp:
        servers = Servers(Path(tmp), Path(tmp))
        try:
            s3 = servers.s3()
            os.environ.update(s3.env)
            bucket = NEVE_BUCKET
            import aioboto3
            from aiobotocore.config import AioConfig

            session = aioboto3.Session()
            boto_cm = session.client("s3", endpoint_url=s3.endpoint, region_name="us-east-1", config=AioConfig(max_pool_connections=64, s3={"addressing_style": "path"}))
            boto = await boto_cm.__aenter__()

            async def boto_put(key, data):
                await boto.put_object(Bucket=bucket, Key="bench/" + key, Body=data, IfNoneMatch="*")

            async def boto_get(key, start, n):
                response = await boto.get_object(Bucket=bucket, Key="bench/" + key, Range=f"bytes={start}-{start + n - 1}")
                async with response["Body"] as body:
                    return await body.read()

            import obstore
            from obstore.store import S3Store

            obs = S3Store(bucket, endpoint=s3.endpoint, access_key_id=s3.env["AWS_ACCESS_KEY_ID"], secret_access_key=s3.env["AWS_SECRET_ACCESS_KEY"], region="us-east-1", client_options={"allow_http": True})

            async def obs_put(key, data):
                await obstore.put_async(obs, "bench/" + key, data)

            async def obs_get(key, start, n):
                return bytes(await obstore.get_range_async(obs, "bench/" + key, start=start, end=start + n))

            size = args.size * 2**20
            results = []
            for round_no in range(args.rounds):
                results.append(await _measure("aioboto3", boto_put, boto_get, args.objects, size, args.concurrency, round_no))
                results.append(await _measure("obstore", obs_put, obs_get, args.objects, size, args.concurrency, round_no))
            await boto_cm.__aexit__(None, None, None)
            return results
        finally:
            servers.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--objects", type=int, default=40)
    parser.add_argument("--size", type=int, default=SIZE_MIB, help="object size in MiB")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    for row in asyncio.run(main(parser.parse_args())):
        print(json.dumps(row), flush=True)
