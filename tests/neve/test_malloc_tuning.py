"""The broker process's malloc settings (BrokerConfig.malloc_keep_bytes): megabyte buffers made
and freed a few at a time (as the records of produce requests are, held until the recent-objects
cache lets them go) reuse freed pages instead of faulting in fresh ones. The churn below, 4 MiB
buffers made in a worker thread, faulted in ~100 of each buffer's ~1,000 pages at glibc's
defaults here, tuned 5."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

CHURN = """
import asyncio, collections, os, random, resource, sys
from concurrent.futures import ThreadPoolExecutor
from neve.cli import _tune_malloc
from neve.config import load_config

applied = _tune_malloc(load_config(None, env=os.environ).broker.malloc_keep_bytes)
parts = [os.urandom(16384) for _ in range(270)]
live = collections.deque()
random.seed(7)

encoder = ThreadPoolExecutor(max_workers=1)  # a thread's arena, as the broker's worker threads have

async def churn(objects):
    loop = asyncio.get_running_loop()
    for _ in range(objects):  # 3.7-4.2 MiB objects
        live.append(await loop.run_in_executor(encoder, b"".join, parts[: random.randint(235, 270)]))
        while len(live) > 6:  # uploads in flight plus commits pending
            live.popleft()

async def main():
    await churn(50)  # warm up: the arena grows to its working size
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    await churn(200)
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 200

print(applied, asyncio.run(main()))
"""


def _churn(keep_bytes: str) -> tuple[bool, float]:
    out = subprocess.run(
        [sys.executable, "-c", CHURN], env={"NEVE_BROKER_MALLOC_KEEP_BYTES": keep_bytes, "PATH": ""}, capture_output=True, text=True, timeout=60, check=True
    ).stdout.split()
    return out[0] == "True", float(out[1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_object_sized_buffers_reuse_freed_pages():
    applied, faults_per_object = _churn(str(64 * 1024 * 1024))
    assert applied
    assert faults_per_object < 32, faults_per_object  # of ~1,000 pages per object


def test_zero_keeps_the_allocator_defaults():
    assert _churn("0")[0] is False
