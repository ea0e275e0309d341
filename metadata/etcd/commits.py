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
from ..sequencer import Head, PartitionHead, ProducerState, involved, sequence
from ..store import MetadataUnavailable, ObjectFenced, UnknownTopic
from .keys import MAX_OPS, MAX_TXN_BYTES, PARTITIONS_PER_TXN, PRODUCERS_PER_TXN, decode_producer, encode_producer, encode_wal_index

log = logging.getLogger("neve.metadata.etcd")


class _Commits:
    """Commit transactions, mixed into EtcdMetadataStore. Owns `_commit_lock`, and adds to the
    follower's `_own_revisions` and `_commits_in_flight`. Uses the store's `keys`, `settings`,
    `_client`, `ops`, `notifier`, `_txn`, the view (`_partitions`, `_topics_by_id`,
    `_topic_created`, `_revision`, IndexReads' `referenced_objects`) and the follower's
    `_topic_gone` and `_view_reaches`."""

    # -- the sequencer ------------------------------------------------------------------------

    async def fence_objects(self, object_keys: Collection[str]) -> set[str]:
        keys = list(dict.fromkeys(object_keys))
        if not keys:
            return set()
        tx = self._client.transactions
        fenced_at = 0
        for i in range(0, len(keys), MAX_OPS):
            # on the expiring lease: a fence must outlive the commits in flight for its object (bounded
            # by the WAL writer's commit deadline, seconds), not the cluster
            lease = await self._expiring_lease()
            _ok, responses = await self._txn([], [tx.put(self.keys.swept(key), b"", lease=lease) for key in keys[i : i + MAX_OPS]])
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
        each partition, each topic's key (it still exists), each idempotent producer's key, the fence
        and its wal-index record (absent), and puts the heads, the producers and the record: one
        operation per partition, per topic and per producer, and two per group, in each branch.

        A partition whose appends come from more idempotent producers than one transaction can
        compare is split among transactions of its own, a producer's appends (and every
        non-idempotent one) staying together in one, in object order: Kafka's atomicity is one
        producer's batch, and a producer's order is kept."""
        by_tp: dict[tuple[uuid.UUID, int], list[int]] = {}
        producers_of: dict[tuple[uuid.UUID, int], set[int]] = {}
        for i, a in enumerate(commit.appends):
            by_tp.setdefault((a.topic_id, a.partition), []).append(i)
            if a.producer_id >= 0:
                producers_of.setdefault((a.topic_id, a.partition), set()).add(a.producer_id)
        groups: list[list[int]] = []
        current: list[int] = []
        topics: set[uuid.UUID] = set()
        ops = size = 0
        for tp, idx in list(by_tp.items()):
            if len(producers_of.get(tp, ())) > PRODUCERS_PER_TXN:
                groups.extend(self._producer_chunks(commit, idx))
                continue
            producers = len(producers_of.get(tp, ()))
            need_bytes = 300 + 100 * len(idx) + 200 * producers
            need_ops = (1 if tp[0] in topics else 2) + producers
            if current and (ops + need_ops > PARTITIONS_PER_TXN or size + need_bytes > MAX_TXN_BYTES):
                groups.append(current)
                current, ops, size = [], 0, 0
                topics = set()
                need_ops = 2 + producers
            current.extend(idx)
            topics.add(tp[0])
            ops += need_ops
            size += need_bytes
        if current:
            groups.append(current)
        return groups

    @staticmethod
    def _producer_chunks(commit: ObjectCommit, idx: list[int]) -> list[list[int]]:
        """One partition's appends as transactions of at most PRODUCERS_PER_TXN producers each:
        a producer's appends all in one, the non-idempotent ones in the first, in object order."""
        chunk_of: dict[int, int] = {}
        chunks: list[list[int]] = [[]]
        for i in idx:
            pid = commit.appends[i].producer_id
            if pid < 0:
                chunks[0].append(i)
                continue
            n = chunk_of.get(pid)
            if n is None:
                n = chunk_of[pid] = len(chunk_of) // PRODUCERS_PER_TXN
                if n == len(chunks):
                    chunks.append([])
            chunks[n].append(i)
        return [c for c in chunks if c]

    async def _commit_group(self, commit: ObjectCommit, idx: list[int], group: int, touched: list[tuple[uuid.UUID, int]]) -> list[AppendResult]:
        """One transaction's appends; the partitions it grew are added to `touched`."""
        from aetcd import rpc

        EQUAL, MOD, CREATE = rpc.Compare.EQUAL, rpc.Compare.MOD, rpc.Compare.CREATE
        sub = ObjectCommit(commit.object_key, commit.object_size, tuple(commit.appends[i] for i in idx))
        partitions, producer_keys = involved(sub)
        fence_key = self.keys.swept(commit.object_key)
        record_key = self.keys.wal_index(commit.object_key, group)
        # What a conflict's failure branch read, newer than the view: the heads and producer states
        # the next attempt sequences on and compares. They are not put into the view, which serves
        # reads: a head learned this way runs ahead of the index entries the view holds (the other
        # writer's come with its watch events), and a Fetch would skip the offsets in between.
        learned_heads: dict[tuple[uuid.UUID, int], tuple[Head, int]] = {}
        learned_producers: dict[tuple[int, uuid.UUID, int], tuple[ProducerState | None, int]] = {}
        for attempt in range(self.settings.commit_attempts):
            parts = {tp: self._partitions[tp] for tp in partitions if tp in self._partitions}
            heads: dict[tuple[uuid.UUID, int], object] = {}
            head_revisions: dict[tuple[uuid.UUID, int], int] = {}
            ahead = False  # sequenced on something the view has not reached
            for tp, part in parts.items():
                learned = learned_heads.get(tp)
                if learned is not None and learned[1] > part.mod_revision:
                    heads[tp], head_revisions[tp], ahead = learned[0], learned[1], True
                else:
                    heads[tp], head_revisions[tp] = part, part.mod_revision
            producers = {}
            producer_revisions: dict[tuple[int, uuid.UUID, int], int | None] = {}
            for pkey in producer_keys:
                pid, tid, p = pkey
                part = parts.get((tid, p))
                if part is None:
                    continue
                known = part.producer_revisions.get(pid)
                learned = learned_producers.get(pkey)
                if learned is not None and learned[1] > (known or 0) and (learned[0] is not None or known is not None):
                    state, known, ahead = learned[0], (learned[1] if learned[0] is not None else None), True
                else:
                    state = part.producers.get(pid)
                if state is not None:
                    producers[pkey] = state
                producer_revisions[pkey] = known
            seq = sequence(sub, heads, producers)
            if not heads:
                return seq.results
            request = rpc.TxnRequest()
            # Compare every touched head, changed or not: answers computed from a stale cache
            # (a duplicate, a sequence error) must be confirmed too.
            compare = request.compare.add
            for tp, part in parts.items():
                compare(result=EQUAL, target=MOD, key=part.head_key, mod_revision=head_revisions[tp])
            # Each topic still exists, as the view knows it: a head compared at revision 0 (never
            # written) also matches once the topic is deleted, and would be put again for a dead topic.
            topic_keys = [(tid, self.keys.topic(self._topics_by_id[tid].name), self._topic_created[tid]) for tid in {tid for tid, _ in heads}]
            for _tid, key, created in topic_keys:
                compare(result=EQUAL, target=CREATE, key=key, create_revision=created)
            compare(result=EQUAL, target=CREATE, key=fence_key, create_revision=0)  # the sweeper has not fenced the object off
            compare(result=EQUAL, target=CREATE, key=record_key, create_revision=0)  # never overwrite another commit's entries
            # Each producer's state as the sequencer read it: at the revision the view has, or
            # absent (a state the view lacks, or one whose key expired, is read back on failure).
            producer_keys_compared = []
            for pkey, known in producer_revisions.items():
                pid, tid, p = pkey
                key = self.keys.producer(tid, p, pid)
                producer_keys_compared.append((pkey, key))
                if known is not None:
                    compare(result=EQUAL, target=MOD, key=key, mod_revision=known)
                else:
                    compare(result=EQUAL, target=CREATE, key=key, create_revision=0)
            now_ms = int(time.time() * 1000)
            new_heads = {}
            success = request.success.add
            for tp, part in parts.items():
                next_offset = seq.heads.get(tp)
                if next_offset is None:
                    continue
                new_heads[tp] = next_offset
                put = success().request_put
                put.key, put.value = part.head_key, self._encode_head(heads[tp], next_offset)
            if seq.producers:
                # A state expires with producer_expiry_ms of disuse, but not while it holds an open
                # transaction (as Kafka's ProducerStateManager): its first offset pins the last
                # stable offset, which would otherwise jump past the transaction's records. Put
                # with no lease then; the marker that ends the transaction puts it on the lease.
                lease = (await self._expiring_lease()).id if any(state.txn_first_offset < 0 for state in seq.producers.values()) else 0
                for (pid, tid, p), state in seq.producers.items():
                    put = success().request_put
                    put.key, put.value, put.lease = self.keys.producer(tid, p, pid), encode_producer(state, now_ms), lease if state.txn_first_offset < 0 else 0
            if seq.entries:
                put = success().request_put
                put.key, put.value = record_key, encode_wal_index(sub.object_key, seq.entries, seq.aborted, seq.committed)
            failure = request.failure.add
            for part in parts.values():
                failure().request_range.key = part.head_key
            failure().request_range.key = fence_key
            failure().request_range.key = record_key
            for _tid, key, _created in topic_keys:
                failure().request_range.key = key
            for _pkey, key in producer_keys_compared:
                failure().request_range.key = key
            in_flight = asyncio.get_running_loop().create_future()  # the watch waits for it (`_follow`)
            self._commits_in_flight.add(in_flight)
            try:
                response = await self._commit_txn(request)
                # A transaction that put nothing (every append a duplicate or refused) made no
                # revision: its header's is the latest one, another writer's, whose events the
                # watch must still apply.
                revision = response.header.revision if response.succeeded and request.success else 0
                if revision and not ahead:
                    self._own_revisions.add(revision)  # the transaction put only heads and a wal-index record
            finally:
                self._commits_in_flight.discard(in_flight)
                in_flight.set_result(None)
            if response.succeeded:
                if not ahead:
                    touched += self._apply_commit(seq, new_heads, revision, now_ms)
                elif revision and not await self._view_reaches(revision, self.settings.timeout):
                    # Its watch events apply it, in order after the other writer's; waited for
                    # (bounded) so that this broker's readers see what it has just acknowledged.
                    log.warning("etcd_commit_view_behind", extra={"revision": revision, "view_revision": self._revision})
                return seq.results
            responses = response.responses
            n, t = len(parts), len(topic_keys)
            head_responses, (fence, record), topic_responses, producer_responses = responses[:n], responses[n : n + 2], responses[n + 2 : n + 2 + t], responses[n + 2 + t :]
            for (pkey, _key), got in zip(producer_keys_compared, producer_responses, strict=True):
                kvs = got.response_range.kvs
                if kvs:
                    state, _used = decode_producer(kvs[0].value)
                    learned_producers[pkey] = (state, kvs[0].mod_revision)
                else:  # expired (or never there): compared as absent next time
                    learned_producers[pkey] = (None, response.header.revision)
            for (tid, _key, created), got in zip(topic_keys, topic_responses, strict=True):
                if not any(kv.create_revision == created for kv in got.response_range.kvs):
                    self._topic_gone(tid)  # its appends are answered UNKNOWN_TOPIC_OR_PARTITION next attempt
            if fence.response_range.kvs:
                raise ObjectFenced(f"{commit.object_key} was fenced off by the orphan sweeper")
            if record.response_range.kvs:  # one object is committed once: this is a bug, not a race
                raise MetadataUnavailable(f"{commit.object_key} already has index entries of commit transaction {group}")
            # Conflict: sequence again on the heads the failure branch read.
            for tp, got in zip(parts, head_responses, strict=True):
                for kv in got.response_range.kvs:
                    d = orjson.loads(kv.value)
                    learned_heads[tp] = (Head(d["n"], d["s"]), kv.mod_revision)
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

    @staticmethod
    def _encode_head(part: PartitionHead, next_offset: int, log_start: int | None = None) -> bytes:
        """A head's value `{"n": next offset, "s": log start}`: the same size whatever producers
        write the partition (their states are keys of their own)."""
        start = part.log_start_offset if log_start is None else log_start
        return f'{{"n":{next_offset:d},"s":{start:d}}}'.encode()

    def _apply_commit(self, seq, new_heads, revision: int, now_ms: int) -> list[tuple[uuid.UUID, int]]:
        """Take a successful transaction into the view; returns the partitions whose head it moved."""
        touched = []
        for tp, entries in seq.entries.items():
            part = self._partitions.get(tp)
            if part is not None:
                for e in entries:
                    part.add(e)
        for tp, next_offset in new_heads.items():
            part = self._partitions.get(tp)
            if part is not None and revision > part.mod_revision:
                part.next_offset, part.mod_revision = next_offset, revision
                touched.append(tp)
        for (pid, tid, p), state in seq.producers.items():
            part = self._partitions.get((tid, p))
            if part is not None:
                part.take_producer(pid, state, now_ms, revision)
        for tp, txns in seq.aborted.items():
            part = self._partitions.get(tp)
            if part is not None:
                for a in txns:
                    part.add_aborted(a)
        for tp, txns in seq.committed.items():
            part = self._partitions.get(tp)
            if part is not None:
                for c in txns:
                    part.add_committed(c)
        return touched

    def producer_state(self, topic_id: uuid.UUID, partition: int, producer_id: int) -> ProducerState | None:
        part = self._partitions.get((topic_id, partition))
        return None if part is None else part.producers.get(producer_id)

    def producer_last_used(self, topic_id: uuid.UUID, partition: int, producer_id: int) -> int | None:
        part = self._partitions.get((topic_id, partition))
        return None if part is None else part.producer_used.get(producer_id)

    def producer_states(self, topic_id: uuid.UUID, partition: int) -> dict[int, ProducerState]:
        part = self._partitions.get((topic_id, partition))
        if part is None:
            return {}
        # an expired producer's key lingers up to an hour past the expiry (its lease's bucket)
        expiry = int(time.time() * 1000) - self.settings.producer_expiry_ms
        return {pid: state for pid, state in part.producers.items() if part.producer_used.get(pid, expiry) >= expiry or state.txn_first_offset >= 0}

    # -- log start ------------------------------------------------------------------------------

    async def advance_log_start(self, topic_id: uuid.UUID, partition: int, offset: int) -> int:
        tp = (topic_id, partition)
        tx = self._client.transactions
        learned: tuple[Head, int] | None = None  # a conflict's read, not put into the view (see _commit_group)
        for _ in range(self.settings.commit_attempts):
            part = self._partitions.get(tp)
            if part is None:
                raise UnknownTopic(f"{topic_id}/{partition}")
            key = part.head_key
            head, head_revision = (part, part.mod_revision) if learned is None or learned[1] <= part.mod_revision else learned
            target = clamped_log_start(offset, head.log_start_offset, head.next_offset)
            if target == head.log_start_offset:
                return target
            value = self._encode_head(head, head.next_offset, log_start=target)
            ok, responses = await self._txn([tx.mod(key) == head_revision], [tx.put(key, value)], [tx.get(key)])
            if ok:
                revision = responses[0].response_put.header.revision
                if head is part and revision > part.mod_revision:
                    part.log_start_offset, part.mod_revision = target, revision
                return target
            if responses and responses[0]:
                fresh, meta = responses[0][0]
                d = orjson.loads(fresh)
                learned = (Head(d["n"], d["s"]), meta.mod_revision)
        raise MetadataUnavailable(f"log start of {topic_id}/{partition} kept conflicting")
