"""The etcd store's writes of partition heads: a WAL object's commit transactions (sequenced on
the cached heads, compared, retried on conflict), the sweeper's fences, and log start advances."""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections.abc import Collection

import orjson

from ..model import AppendResult, ObjectCommit
from ..rules import clamped_log_start
from ..sequencer import ProducerState, involved, sequence
from ..store import MetadataUnavailable, ObjectFenced, UnknownTopic
from .follower import _PartitionState
from .keys import MAX_OPS, MAX_TXN_BYTES, PARTITIONS_PER_TXN, _Keys, encode_wal_index

log = logging.getLogger("neve.metadata.etcd")


class _Commits:
    """Commit transactions, mixed into EtcdMetadataStore. Owns `_commit_lock`, and adds to the
    follower's `_own_revisions` and `_commits_in_flight`. Uses the store's `keys`, `settings`,
    `_client`, `ops`, `notifier`, `_txn`, the view (`_partitions`, `_topics_by_id`,
    `_topic_created`, `_revision`, IndexReads' `referenced_objects`) and the follower's
    `_apply_head`, `_topic_gone` and `_view_reaches`."""

    # -- the sequencer ------------------------------------------------------------------------

    async def fence_objects(self, object_keys: Collection[str]) -> set[str]:
        keys = list(dict.fromkeys(object_keys))
        if not keys:
            return set()
        tx = self._client.transactions
        fenced_at = 0
        for i in range(0, len(keys), MAX_OPS):
            _ok, responses = await self._txn([], [tx.put(self.keys.swept(key), b"") for key in keys[i : i + MAX_OPS]])
            fenced_at = max(fenced_at, responses[0].response_put.header.revision)
        # A commit of one of these objects either landed before its fence, and is in the view
        # once the view reaches the fence's revision, or finds the fence and lands nothing.
        if not await self._view_reaches(fenced_at, self.settings.timeout * 2):
            log.warning("etcd_fence_view_behind", extra={"revision": fenced_at, "view_revision": self._revision})
            return set()
        referenced = self.referenced_objects()
        return {key for key in keys if key not in referenced}

    async def commit(self, commit: ObjectCommit) -> list[AppendResult]:
        # One broker's commits go one at a time (its WAL writer orders them anyway); contention is
        # only between brokers, where the optimistic transaction settles it.
        async with self._commit_lock:
            return await self._commit(commit)

    async def _commit(self, commit: ObjectCommit) -> list[AppendResult]:
        groups = self._groups(commit)
        results: list[AppendResult | None] = [None] * len(commit.appends)
        # The partitions the groups' transactions grew, announced once they all returned: a
        # long-poll Fetch of many partitions answers once per object, not once per group.
        touched: list[tuple[uuid.UUID, int]] = []
        try:
            outcomes = await asyncio.gather(*(self._commit_group(commit, idx, n, touched) for n, idx in enumerate(groups)), return_exceptions=True)
        finally:
            self.notifier.notify(touched)
        failure = None
        for idx, outcome in zip(groups, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                failure = outcome
                continue
            for i, r in zip(idx, outcome, strict=True):
                results[i] = r
        if failure is not None:
            if all(r is None for r in results):
                error = failure if isinstance(failure, MetadataUnavailable) else MetadataUnavailable(repr(failure))
                # Raised from this frame, the error references it through its traceback; if the
                # frame still referenced the error (`failure`, `outcome`, `outcomes`, `error`), the
                # cycle would keep the callers' frames, and with them the WAL object's bytes, until
                # a full collection.
                failure = outcome = outcomes = None
                try:
                    raise error
                finally:
                    del error
            # Some groups committed, others did not: answer the failed appends with a retriable error.
            results = [r if r is not None else AppendResult(MetadataUnavailable.error_code) for r in results]
        return results  # type: ignore[return-value]

    def _groups(self, commit: ObjectCommit) -> list[list[int]]:
        """Indices of the appends, grouped so each group's transaction fits etcd's limits; a
        partition's appends always stay in one group. A group's transaction compares the head of
        each partition, each topic's key (it still exists), the fence and its wal-index record
        (absent), and puts the heads and the record: one operation per partition and per topic, and
        two per group, in each branch."""
        by_tp: dict[tuple[uuid.UUID, int], list[int]] = {}
        for i, a in enumerate(commit.appends):
            by_tp.setdefault((a.topic_id, a.partition), []).append(i)
        groups: list[list[int]] = []
        current: list[int] = []
        topics: set[uuid.UUID] = set()
        ops = size = 0
        for tp, idx in by_tp.items():
            part = self._partitions.get(tp)
            need_bytes = 300 + 100 * len(idx) + (120 * len(part.producers) if part is not None else 0)
            need_ops = 1 if tp[0] in topics else 2
            if current and (ops + need_ops > PARTITIONS_PER_TXN or size + need_bytes > MAX_TXN_BYTES):
                groups.append(current)
                current, ops, size = [], 0, 0
                topics = set()
                need_ops = 2
            current.extend(idx)
            topics.add(tp[0])
            ops += need_ops
            size += need_bytes
        if current:
            groups.append(current)
        return groups

    async def _commit_group(self, commit: ObjectCommit, idx: list[int], group: int, touched: list[tuple[uuid.UUID, int]]) -> list[AppendResult]:
        """One transaction's appends; the partitions it grew are added to `touched`."""
        from aetcd import rpc

        EQUAL, MOD, CREATE = rpc.Compare.EQUAL, rpc.Compare.MOD, rpc.Compare.CREATE
        sub = ObjectCommit(commit.object_key, commit.object_size, tuple(commit.appends[i] for i in idx))
        partitions, producer_keys = involved(sub)
        fence_key = self.keys.swept(commit.object_key)
        record_key = self.keys.wal_index(commit.object_key, group)
        for attempt in range(self.settings.commit_attempts):
            heads = {tp: self._partitions[tp] for tp in partitions if tp in self._partitions}
            producers = {}
            for pid, tid, p in producer_keys:
                part = heads.get((tid, p))
                if part is not None and pid in part.producers:
                    producers[(pid, tid, p)] = part.producers[pid]
            seq = sequence(sub, heads, producers)
            if not heads:
                return seq.results
            request = rpc.TxnRequest()
            # Compare every touched head, changed or not: answers computed from a stale cache
            # (a duplicate, a sequence error) must be confirmed too.
            compare = request.compare.add
            for tp, part in heads.items():
                compare(result=EQUAL, target=MOD, key=part.head_key, mod_revision=part.mod_revision)
            # Each topic still exists, as the view knows it: a head compared at revision 0 (never
            # written) also matches once the topic is deleted, and would be put again for a dead topic.
            topic_keys = [(tid, self.keys.topic(self._topics_by_id[tid].name), self._topic_created[tid]) for tid in {tid for tid, _ in heads}]
            for _tid, key, created in topic_keys:
                compare(result=EQUAL, target=CREATE, key=key, create_revision=created)
            compare(result=EQUAL, target=CREATE, key=fence_key, create_revision=0)  # the sweeper has not fenced the object off
            compare(result=EQUAL, target=CREATE, key=record_key, create_revision=0)  # never overwrite another commit's entries
            changed_by_tp: dict[tuple[uuid.UUID, int], dict[int, ProducerState]] = {}
            for (pid, tid, p), state in seq.producers.items():
                changed_by_tp.setdefault((tid, p), {})[pid] = state
            now_ms = int(time.time() * 1000)
            new_heads = {}
            success = request.success.add
            for tp, part in heads.items():
                changed_producers = changed_by_tp.get(tp, {})
                next_offset = seq.heads.get(tp)
                if next_offset is None:
                    if not changed_producers:
                        continue
                    next_offset = part.next_offset
                value, kept, used = self._encode_head(part, next_offset, changed_producers, now_ms)
                new_heads[tp] = (next_offset, kept, used)
                put = success().request_put
                put.key, put.value = part.head_key, value
            if seq.entries:
                put = success().request_put
                put.key, put.value = record_key, encode_wal_index(sub.object_key, seq.entries)
            failure = request.failure.add
            for part in heads.values():
                failure().request_range.key = part.head_key
            failure().request_range.key = fence_key
            failure().request_range.key = record_key
            for _tid, key, _created in topic_keys:
                failure().request_range.key = key
            in_flight = asyncio.get_running_loop().create_future()  # the watch waits for it (`_follow`)
            self._commits_in_flight.add(in_flight)
            try:
                response = await self._commit_txn(request)
                # A transaction that put nothing (every append a duplicate or refused) made no
                # revision: its header's is the latest one, another writer's, whose events the
                # watch must still apply.
                revision = response.header.revision if response.succeeded and request.success else 0
                if revision:
                    self._own_revisions.add(revision)  # the transaction put only heads and a wal-index record
            finally:
                self._commits_in_flight.discard(in_flight)
                in_flight.set_result(None)
            if response.succeeded:
                touched += self._apply_commit(seq, new_heads, revision)
                return seq.results
            responses = response.responses
            head_responses, (fence, record), topic_responses = responses[: len(heads)], responses[len(heads) : len(heads) + 2], responses[len(heads) + 2 :]
            for (tid, _key, created), got in zip(topic_keys, topic_responses, strict=True):
                if not any(kv.create_revision == created for kv in got.response_range.kvs):
                    self._topic_gone(tid)  # its appends are answered UNKNOWN_TOPIC_OR_PARTITION next attempt
            if fence.response_range.kvs:
                raise ObjectFenced(f"{commit.object_key} was fenced off by the orphan sweeper")
            if record.response_range.kvs:  # one object is committed once: this is a bug, not a race
                raise MetadataUnavailable(f"{commit.object_key} already has index entries of commit transaction {group}")
            # Conflict: refresh the heads from the failure branch's reads and sequence again.
            for tp, got in zip(heads, head_responses, strict=True):
                for kv in got.response_range.kvs:
                    self._apply_head(_Keys.partition_path(*tp), kv.value, kv.mod_revision)
            if attempt >= 2:
                await asyncio.sleep(random.uniform(0, min(0.002 * 2**attempt, 0.1)))
        raise MetadataUnavailable(f"commit of {commit.object_key} kept conflicting")

    async def _commit_txn(self, request) -> object:
        """One commit transaction, built as etcd's own protobuf message (`rpc.TxnRequest`) and sent
        on aetcd's KV stub. aetcd's `transaction` wraps every compare and operation in an object of
        its own and converts each response: at 10,000 partitions an object's commit is dozens of
        transactions of 120 operations, and that wrapping was a quarter of the commit's CPU. gRPC's
        deadline bounds it (no wrapping task)."""
        import grpc

        self.ops += 1
        try:
            await self._client.connect()
            return await self._client.kvstub.Txn(request, timeout=self.settings.timeout, metadata=self._client.metadata)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise MetadataUnavailable("etcd transaction timed out") from e
            raise MetadataUnavailable(f"etcd transaction failed: {e.code().name} {e.details()}") from e
        except Exception as e:
            raise MetadataUnavailable(f"etcd transaction failed: {e!r}") from e

    def _encode_head(
        self, part: _PartitionState, next_offset: int, changed: dict[int, ProducerState], now_ms: int, log_start: int | None = None
    ) -> tuple[bytes, dict[int, ProducerState], dict[int, int]]:
        """A head's value `{"n": next offset, "s": log start, "p": {producer id: [epoch, batches,
        last used ms]}}`, and the producers it keeps with their last-used times (the view takes
        them as they are once the commit succeeds, rather than decoding the value again)."""
        expiry = now_ms - self.settings.producer_expiry_ms
        kept: dict[int, ProducerState] = {}
        used: dict[int, int] = {}
        for pid, state in part.producers.items():
            last_used = part.producer_used.get(pid, now_ms)
            if pid not in changed and last_used >= expiry:
                kept[pid], used[pid] = state, last_used
        for pid, state in changed.items():
            kept[pid], used[pid] = state, now_ms
        start = part.log_start_offset if log_start is None else log_start
        if not kept:  # the common case, non-idempotent producers only: no JSON encoder needed
            return f'{{"n":{next_offset:d},"s":{start:d},"p":{{}}}}'.encode(), kept, used
        producers = {str(pid): [state.epoch, [list(b) for b in state.batches], used[pid]] for pid, state in kept.items()}
        return orjson.dumps({"n": next_offset, "s": start, "p": producers}), kept, used

    def _apply_commit(self, seq, new_heads, revision: int) -> list[tuple[uuid.UUID, int]]:
        """Take a successful transaction into the view; returns the partitions whose head it moved."""
        touched = []
        for tp, entries in seq.entries.items():
            part = self._partitions.get(tp)
            if part is not None:
                for e in entries:
                    part.add(e)
        for tp, (next_offset, kept, used) in new_heads.items():
            part = self._partitions.get(tp)
            if part is not None and revision > part.mod_revision:
                part.next_offset, part.mod_revision = next_offset, revision
                part.producers, part.producer_used = kept, used
                touched.append(tp)
        return touched

    def producer_states(self, topic_id: uuid.UUID, partition: int) -> dict[int, ProducerState]:
        part = self._partitions.get((topic_id, partition))
        if part is None:
            return {}
        # expired producers linger in the head until its next write; they are not active
        expiry = int(time.time() * 1000) - self.settings.producer_expiry_ms
        return {pid: state for pid, state in part.producers.items() if part.producer_used.get(pid, expiry) >= expiry}

    # -- log start ------------------------------------------------------------------------------

    async def advance_log_start(self, topic_id: uuid.UUID, partition: int, offset: int) -> int:
        tp = (topic_id, partition)
        tx = self._client.transactions
        for _ in range(self.settings.commit_attempts):
            part = self._partitions.get(tp)
            if part is None:
                raise UnknownTopic(f"{topic_id}/{partition}")
            key = part.head_key
            target = clamped_log_start(offset, part.log_start_offset, part.next_offset)
            if target == part.log_start_offset:
                return target
            value, _kept, _used = self._encode_head(part, part.next_offset, {}, int(time.time() * 1000), log_start=target)
            ok, responses = await self._txn([tx.mod(key) == part.mod_revision], [tx.put(key, value)], [tx.get(key)])
            if ok:
                revision = responses[0].response_put.header.revision
                if revision > part.mod_revision:
                    part.log_start_offset, part.mod_revision = target, revision
                return target
            if responses and responses[0]:
                fresh, meta = responses[0][0]
                self._apply_head(_Keys.partition_path(topic_id, partition), fresh, meta.mod_revision)
        raise MetadataUnavailable(f"log start of {topic_id}/{partition} kept conflicting")
