"""bench.metadata_commits against the worker's real etcd: its measured commits all land, and a
following store in a process of its own sees every one of them (the tool raises otherwise) and
reports the CPU it spent on them."""

from __future__ import annotations

import pytest

from bench.metadata_commits import measure

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("follow", [False, True])
async def test_measures_every_append_committed_and_followed(etcd_server, follow):
    # 3 objects of 40 appends over 100 partitions: each object's appends span a transaction
    # boundary (60 partitions per transaction), and the last wraps around the partitions
    got = await measure(etcd_server.ports["client"], partitions=100, per_object=40, objects=3, follow=follow)
    assert got["follower"] is follow
    assert got["appends"] == 120
    assert got["cpu_us_per_append"] > 0 and got["commit_ms"] > 0
    if follow:
        assert got["follow_cpu_us_per_append"] > 0
    else:
        assert "follow_cpu_us_per_append" not in got
