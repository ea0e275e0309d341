"""bench.metadata_commits against the worker's real etcd: its measured commits all land, and a
following store in a process of its own sees every one of them (the tool raises otherwise) and
reports the CPU it spent on them."""

from __future__ import annotations

import pytest

from bench.metadata_commits import measure, measure_producers

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


async def test_measures_commits_on_a_partition_of_many_producers(etcd_server):
    got = await measure_producers(etcd_server.ports["client"], producers=1_200, commits=5)
    assert (got["producers"], got["commits"]) == (1_200, 5)
    for side in ("one", "many"):
        assert got[side]["cpu_us_per_commit"] > 0 and got[side]["commit_ms"] > 0
    assert got["cpu_ratio"] > 0 and got["time_ratio"] > 0
