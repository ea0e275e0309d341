"""Named leaderships (`MetadataStore.campaign`): one holder leads a name at a time; when it resigns,
its store closes or (etcd) its lease expires, another takes the lead."""

from __future__ import annotations

import asyncio
import logging
import sys
import uuid
from pathlib import Path

from metadata.store import Holder, MetadataStore, load_metadata_store

ROOT = Path(__file__).resolve().parents[2]
LEAD_BOUND_S = 60.0  # generous: a lead changes hands within a lease TTL and a campaign round


async def test_one_holder_leads_until_it_resigns(store: MetadataStore):
    first = await store.campaign("wal-sweeper", "node-1")
    assert await first.wait_leading(LEAD_BOUND_S)
    second = await store.campaign("wal-sweeper", "node-2")
    other = await store.campaign("another-job", "node-2")  # names are independent
    assert await other.wait_leading(LEAD_BOUND_S)
    assert first.is_leader() and not second.is_leader()
    await first.resign()
    assert not first.is_leader()
    assert await second.wait_leading(LEAD_BOUND_S)
    assert not first.is_leader()


async def test_holders_lists_the_live_leaderships_under_a_prefix(store: MetadataStore):
    a = await store.campaign("members/a:1", "host-a")
    b = await store.campaign("members/b:2", "host-b")
    other = await store.campaign("membersx", "host-c")  # starts with the prefix's letters, not with it
    for lead in (a, b, other):
        assert await lead.wait_leading(LEAD_BOUND_S)
    # Only now: campaigning beside a's first round, on etcd it could be the one to put the key first.
    standby = await store.campaign("members/a:1", "host-z")  # waits its turn: not listed
    assert not await standby.wait_leading(1.0)  # a round or more tried (on etcd), and lost to a
    assert await store.holders("members/") == [Holder("members/a:1", "host-a", a.epoch), Holder("members/b:2", "host-b", b.epoch)]
    assert a.epoch != b.epoch
    await b.resign()
    assert await store.holders("members/") == [Holder("members/a:1", "host-a", a.epoch)]
    await a.resign()
    assert await standby.wait_leading(LEAD_BOUND_S)  # the name again, another holder, another epoch
    assert await store.holders("members/") == [Holder("members/a:1", "host-z", standby.epoch)]
    assert standby.epoch != a.epoch
    await standby.resign()
    assert await store.holders("members/") == []
    assert [h.name for h in await store.holders("")] == ["membersx"]


async def _etcd_stores(etcd_server, n: int) -> list[MetadataStore]:
    url = f"{etcd_server.url}/leaders-{uuid.uuid4().hex[:8]}"
    stores = [load_metadata_store(url, lease_ttl_s=2) for _ in range(n)]
    for s in stores:
        await s.start()
    return stores


async def test_etcd_the_other_store_leads_once_the_leaders_store_closes(etcd_server, caplog):
    caplog.set_level(logging.INFO, logger="neve")  # the campaign's log lines are made, as in a node
    a, b = await _etcd_stores(etcd_server, 2)
    try:
        lead_a = await a.campaign("wal-sweeper", "a")
        assert await lead_a.wait_leading(LEAD_BOUND_S)
        lead_b = await b.campaign("wal-sweeper", "b")
        # b has campaigned a few rounds (a third of the 2 s TTL each) while a held the key
        assert not await lead_b.wait_leading(3.0)
        assert lead_a.is_leader()
        await a.close()  # revokes a's lease: its key goes at once
        assert not lead_a.is_leader()
        assert await lead_b.wait_leading(LEAD_BOUND_S)
        taken = [(r.leadership, r.holder) for r in caplog.records if r.getMessage() == "leadership_taken"]
        assert taken == [("wal-sweeper", "a"), ("wal-sweeper", "b")]
    finally:
        await a.close()
        await b.close()


HOLDER_PROCESS = """
import asyncio, sys
from metadata.store import load_metadata_store

async def main():
    store = load_metadata_store(sys.argv[1], lease_ttl_s=2)
    await store.start()
    leadership = await store.campaign(sys.argv[2] if len(sys.argv) > 2 else "wal-sweeper", "a")
    print("leading" if await leadership.wait_leading(60) else "not leading", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


async def test_etcd_a_dead_holders_lead_passes_when_its_lease_expires(etcd_server):
    url = f"{etcd_server.url}/leaders-{uuid.uuid4().hex[:8]}"
    holder = await asyncio.create_subprocess_exec(sys.executable, "-c", HOLDER_PROCESS, url, stdout=asyncio.subprocess.PIPE, cwd=ROOT)
    b = load_metadata_store(url, lease_ttl_s=2)
    await b.start()
    try:
        assert await asyncio.wait_for(holder.stdout.readline(), LEAD_BOUND_S) == b"leading\n"
        lead_b = await b.campaign("wal-sweeper", "b")
        assert not await lead_b.wait_leading(3.0)  # a few rounds of b's while a's process holds the key
        holder.kill()  # dies without revoking its lease
        await holder.wait()
        assert await lead_b.wait_leading(LEAD_BOUND_S)
    finally:
        if holder.returncode is None:
            holder.kill()
            await holder.wait()
        await b.close()


async def test_etcd_a_holder_that_resigns_can_campaign_again(etcd_server):
    (a,) = await _etcd_stores(etcd_server, 1)
    try:
        first = await a.campaign("wal-sweeper", "a")
        assert await first.wait_leading(LEAD_BOUND_S)
        again = await a.campaign("wal-sweeper", "a")  # same holder, a new claim: waits its turn
        await first.resign()
        assert await again.wait_leading(LEAD_BOUND_S)
        assert not first.is_leader()
    finally:
        await a.close()


async def test_etcd_a_dead_holder_leaves_the_holders_when_its_lease_expires(etcd_server):
    url = f"{etcd_server.url}/leaders-{uuid.uuid4().hex[:8]}"
    holder = await asyncio.create_subprocess_exec(sys.executable, "-c", HOLDER_PROCESS, url, "members/dead:1", stdout=asyncio.subprocess.PIPE, cwd=ROOT)
    b = load_metadata_store(url, lease_ttl_s=2)
    await b.start()
    try:
        assert await asyncio.wait_for(holder.stdout.readline(), LEAD_BOUND_S) == b"leading\n"
        live = await b.campaign("members/live:2", "b")
        assert await live.wait_leading(LEAD_BOUND_S)
        assert [(h.name, h.holder) for h in await b.holders("members/")] == [("members/dead:1", "a"), ("members/live:2", "b")]
        holder.kill()  # dies without revoking its lease: listed until the lease expires
        await holder.wait()
        deadline = asyncio.get_running_loop().time() + LEAD_BOUND_S
        while len(listed := await b.holders("members/")) > 1:
            assert asyncio.get_running_loop().time() < deadline, listed
            await asyncio.sleep(0.2)  # etcd tells no one when a lease expires: read again
        assert listed == [Holder("members/live:2", "b", live.epoch)]
    finally:
        if holder.returncode is None:
            holder.kill()
            await holder.wait()
        await b.close()
