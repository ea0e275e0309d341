"""The etcd backend of the metadata interface (production): many stateless brokers sequence
offsets through one etcd, with optimistic concurrency and no leader.

Key layout (all under `/<root>/`, root "neve" by default; values are compact JSON):

    topics/<name>                             {"id": hex, "partitions": n, "configs": {...}}
    heads/<topic id hex>/<partition:06d>      {"n": next offset, "s": log start}
    producers/<topic id hex>/<partition:06d>/<producer id>
                                              one idempotent producer's state on the partition: [epoch,
                                              [[first seq, last seq, base offset] x<=5], last used ms],
                                              on the expiring lease (producer_expiry_ms of disuse)
    wal-index/<object key>/<group:04d>        the index entries one commit transaction added, all in one WAL
                                              object: [object key, [[topic id hex, [[partition:06d, base
                                              offset, last offset, start, size, max timestamp] ...]] ...]]
    index/<topic id hex>/<partition:06d>/<base offset:020d>
                                              one index entry: [last offset, object key, type, start,
                                              size, max timestamp]: a range replace's entry, standing
                                              for every offset it covers (`index.py`; versions before
                                              wal-index records wrote every entry so, still read)
    producer-ids                              the next unallocated producer id (allocated in blocks)
    producer-epochs/<producer id>             current epoch, on the expiring lease
    swept/<object key>                        the orphan sweeper's fence on an object, on the expiring lease
    brokers/<node id>                         {"host", "port", "zone", "cache_port"?}, attached to the broker's lease
    leaders/<name, url-quoted>                a named leadership's holder, on the holder's own lease (`campaign`); its create
                                              revision numbers the lead (its epoch: fenced writes compare it)
    groups/<group, url-quoted>                the group coordinator's state (opaque to this store)
    offsets/<group, url-quoted>/<topic id hex>/<partition:06d>
                                              [offset, leader epoch, metadata, commit timestamp]
    registry/<key>                            the schema registry's items (laid out in registry/store.py;
                                              `schemas.py`), ignored by the watch
    security/<key>                            the security family's items (SCRAM credentials under scram/,
                                              ACL bindings under acls/; opaque bytes), in every view (`security.py`)

A partition's head is the unit of optimistic concurrency for its offsets: a commit compares its mod
revision, and each idempotent producer's key it read (or that key's absence), so what a commit
writes does not grow with the producers a partition has seen. A missing head means offset 0
(topics with 10,000 partitions are created with one put).

Committing a WAL object: the sequencer (metadata/sequencer.py) runs on the cached heads; one
transaction compares every touched head's mod revision and puts the new heads and one wal-index
record holding the new index entries of all its partitions (one key per transaction, not one per
entry: half the puts and watch events). On conflict the transaction's failure branch returns the current heads
in the same round trip, the cache is refreshed, and the commit is re-sequenced. etcd allows 128
operations per transaction branch and 1.5 MiB per request by default, so an object's partitions
are committed in groups that fit both (each group is atomic; the brief asks for atomicity per
partition): an object touching 500 partitions commits as 5 transactions of at most
`PARTITIONS_PER_TXN` (118), run concurrently because they touch disjoint keys.

Staying bounded over months: index entries are replaced by compaction (`replace_entries`, index.py:
many WAL entries become one PARQUET entry in two operations; a wal-index record goes once every
entry in it is superseded, and its WAL object becomes garbage)
and removed by retention; a deleted topic's entries stay in the wal-index records they share with
other topics until then (its heads and per-entry keys are deleted); producer states, epochs and
the sweeper's fences expire with `producer_expiry_ms` of disuse (Kafka's
producer.id.expiration.ms, 24 h) through one lease a bucket (leases.py); and each broker compacts
etcd's revision history every `compact_interval_s`, keeping the last `keep_revisions` revisions
for watchers that lag.

Brokers follow changes through one watch on the root prefix (no polling): the in-memory view
(`view.py`) stays current and long-poll fetches wake when another broker commits. If the watch
breaks (etcd restarted), the store reloads everything and watches again from the new revision.

etcd may be reached over TLS (a client certificate when etcd asks for one) and with a user and
password (`client.py`, settings from the etcd:// URL's query): a token etcd forgot (unused for its
--auth-token-ttl, or etcd restarted) is renewed by logging in again, and the request sent again.

The package, one module a part: `keys.py` the key layout above, the values' codecs and etcd's
limits; `follower.py` the view (load, watch, apply); `commits.py` the commit transactions, fences
and log start advances; `index.py` the range replace and the removal of superseded wal-index
records; `topics.py` topic transactions; `leases.py` broker registration, producer
ids and epochs, history compaction; `leaders.py` named leaderships (one holder at a time); `groups.py` consumer groups; `schemas.py` the schema registry's items; `security.py` the
security family; `client.py` aetcd's client over TLS, logging in again; `store.py` the entry point,
`EtcdMetadataStore`, one class mixing those parts. The Kafka rules it shares with the embedded
store are in `metadata/rules.py`.
"""

from .client import EtcdSecurity
from .keys import MAX_OPS, MAX_TXN_BYTES, PARTITIONS_PER_TXN, _decode_entry, _Keys, decode_wal_index, encode_wal_index
from .store import EtcdMetadataStore, EtcdSettings

# the private names: the value formats' tests (tests/metadata/test_etcd_values.py) read them
__all__ = ["MAX_OPS", "MAX_TXN_BYTES", "PARTITIONS_PER_TXN", "EtcdMetadataStore", "EtcdSecurity", "EtcdSettings", "decode_wal_index", "encode_wal_index", "_Keys", "_decode_entry"]
