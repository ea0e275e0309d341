"""Records for the table benchmarks (compaction, freshness): raw values or Confluent-framed Avro
values of about a given size, produced with confluent-kafka into a node, acknowledgements counted
(and, at a fixed rate, each one's time kept, for freshness). A record's size is its value's."""

from __future__ import annotations

import datetime
import itertools
import json
import random
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from io import BytesIO

import numpy as np
from fastavro import parse_schema, schemaless_writer

from registry.wire import frame

CODECS = ("raw", "avro", "avro-nested")

# An order event: the kinds of fields a topic's values carry (ints, a timestamp, text, a double, a
# flag, an optional field), `note` padded so the framed value has about the size asked for.
AVRO_SCHEMA = {
    "type": "record",
    "name": "Order",
    "namespace": "bench",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "created", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "customer", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "quantity", "type": "int"},
        {"name": "express", "type": "boolean"},
        {"name": "coupon", "type": ["null", "string"], "default": None},
        {"name": "note", "type": "string"},
    ],
}
# The same order with what other topics' values carry besides: a list, a map, a decimal, a uuid, a
# time of day (every kind of field avro_columns.py reads at once).
NESTED_SCHEMA = {
    **AVRO_SCHEMA,
    "name": "NestedOrder",
    "fields": [
        *AVRO_SCHEMA["fields"][:-1],
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "scores", "type": {"type": "map", "values": "double"}},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
        {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "opened", "type": {"type": "int", "logicalType": "time-millis"}},
        AVRO_SCHEMA["fields"][-1],
    ],
}
SCHEMAS = {"avro": AVRO_SCHEMA, "avro-nested": NESTED_SCHEMA}  # the Avro codecs' value schemas
_TAGS = ("new", "gift", "bulk", "priority", "returning", "fragile")
LETTERS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789 "  # random text: about 6 bits a byte for zstd
POOL_BYTES = 4 * 2**20  # distinct values produced in turn: more than a Parquet page, so zstd finds no repeats within one
PRODUCER_CONFIG = {
    "acks": "all",
    "linger.ms": 20,
    "batch.size": 1_000_000,
    "compression.type": "none",
    "queue.buffering.max.kbytes": 64 * 1024,
    "queue.buffering.max.messages": 1_000_000,
    "log_level": 3,
}


def register_schema(registry_port: int, subject: str, schema: dict = AVRO_SCHEMA) -> int:
    """Register `schema` under `subject` with the node's registry (Confluent's REST API); its id."""
    body = json.dumps({"schema": json.dumps(schema)}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{registry_port}/subjects/{subject}/versions", data=body, headers={"Content-Type": "application/vnd.schemaregistry.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return int(json.loads(response.read())["id"])


def values(codec: str, record_bytes: int, schema_id: int | None = None, seed: int = 7) -> list[bytes]:
    """A pool of distinct values of about `record_bytes` each (Avro: framed with `schema_id`)."""
    rng = random.Random(seed)
    count = max(1024, POOL_BYTES // record_bytes)
    text = np.random.default_rng(seed).choice(np.frombuffer(LETTERS, dtype=np.uint8), size=(count, record_bytes))
    if codec == "raw":
        return [row.tobytes() for row in text]
    if codec not in SCHEMAS or schema_id is None:
        raise ValueError(f"codec {codec!r} (one of {CODECS}; an Avro one needs a schema id)")
    parsed = parse_schema(SCHEMAS[codec])
    pool = []
    for i in range(count):
        record = {
            "id": i,
            "created": 1_764_000_000_000 + i,  # fastavro takes the millis as an int for timestamp-millis
            "customer": f"customer-{rng.randrange(100_000):05d}",
            "amount": round(rng.uniform(1, 1000), 2),
            "quantity": rng.randrange(1, 50),
            "express": rng.random() < 0.3,
            "coupon": None if rng.random() < 0.7 else f"C{rng.randrange(10_000)}",
            "note": "",
        }
        if codec == "avro-nested":
            record |= {
                "tags": rng.sample(_TAGS, rng.randrange(4)),
                "scores": {f"s{k}": round(rng.uniform(0, 5), 1) for k in range(rng.randrange(3))},
                "price": Decimal(rng.randrange(100, 10**7)).scaleb(-2),
                "ref": uuid.UUID(int=rng.getrandbits(128)),
                "opened": datetime.time(rng.randrange(24), rng.randrange(60), rng.randrange(60), rng.randrange(1000) * 1000),
            }
        pool.append(_sized(parsed, record, schema_id, record_bytes, text[i]))
    return pool


def _sized(parsed, record: dict, schema_id: int, record_bytes: int, text: np.ndarray) -> bytes:
    """The framed encoding of `record` with `note` padded to bring it to about `record_bytes`."""

    def encode() -> bytes:
        out = BytesIO()
        schemaless_writer(out, parsed, record)
        return frame(schema_id, out.getvalue())

    bare = len(encode())
    pad = max(0, record_bytes - bare - 2)  # a note over 63 bytes takes a 2-byte length
    record["note"] = text[:pad].tobytes().decode()
    return encode()


def count_delivery(out, err) -> bool:
    """One delivery report counted into `out` (its `acked`, `failed` and first 10 `errors`):
    whether the record was acknowledged."""
    if err is not None:
        out.failed += 1
        if len(out.errors) < 10:
            out.errors.append(str(err))
        return False
    out.acked += 1
    return True


@dataclass
class Produced:
    """What a produce run saw: acknowledged records, failures, seconds, value bytes; and, when
    asked for, each acknowledged record's (partition, offset, wall-clock ack time)."""

    acked: int = 0
    failed: int = 0
    seconds: float = 0.0
    value_bytes: int = 0
    errors: list[str] = field(default_factory=list)
    acks: list[tuple[int, int, float]] = field(default_factory=list)

    def ack_array(self) -> np.ndarray:
        """Acks as a (n, 3) float array: partition, offset, time."""
        return np.array(self.acks, dtype=np.float64).reshape(-1, 3)


def produce(
    bootstrap: str, topic: str, partitions: int, pool: list[bytes], count: int | None = None, *, rate: float | None = None, keep_acks: bool = False, until: Callable[[], bool] | None = None
) -> Produced:
    """`count` records of `pool` in turn (or until `until()` is true, asked every 100 records),
    partition after partition, at saturation or at `rate` records/s (paced in 10 ms ticks); waits
    for every acknowledgement."""
    from confluent_kafka import Producer

    out = Produced()
    producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER_CONFIG})

    def delivered(err, msg) -> None:
        if not count_delivery(out, err):
            return
        if keep_acks:
            out.acks.append((msg.partition(), msg.offset(), time.time()))

    started = time.monotonic()
    size = len(pool)
    for i in itertools.count() if count is None else range(count):
        if until is not None and i % 100 == 0 and until():
            break
        if rate is not None:
            due = started + i / rate
            wait = due - time.monotonic()
            if wait > 0.01:
                producer.poll(wait)
        value = pool[i % size]
        out.value_bytes += len(value)
        while True:
            try:
                producer.produce(topic, value, partition=i % partitions, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 1000 == 0:
            producer.poll(0)
    left = producer.flush(300)
    out.seconds = time.monotonic() - started
    if left:
        out.errors.append(f"{left} records not acknowledged after 300 s")
    return out
