"""Records a real client produces to `neve dev` for the compactor's tests, and the rows they must
become: confluent-kafka through every codec, raw values and Avro ones from its AvroSerializer
against neve's registry (two schema versions, every Avro type the table lays out), tombstones and
malformed values; `check_rows` compares a table's rows, as any reader returns them, field by field."""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import json
import uuid

from compactor.rows.translator import COLUMNS, COLUMNS_RAW, RAW, TOMBSTONE
from registry.wire import frame
from tests.readers import normalize

UTC = dt.UTC
DAY_MS = 86_400_000
T0 = 1_700_000_000_000  # 2023-11-14T22:13:20Z
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
PARTITIONS = 2
PER_CODEC = 60
UNKNOWN_ID = 999_999
EVENT = {
    "type": "record", "name": "Event", "namespace": "neve.test",
    "fields": [
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "at_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "id", "type": "long"},
        {"name": "seq", "type": "int"},
        {"name": "ok", "type": "boolean"},
        {"name": "ratio", "type": "float"},
        {"name": "score", "type": "double"},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "origin", "type": {"type": "record", "name": "Origin", "fields": [{"name": "host", "type": "string"}, {"name": "port", "type": "int"}]}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "counts", "type": {"type": "map", "values": "long"}},
        {"name": "uid", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "mac", "type": {"type": "fixed", "name": "Mac", "size": 6}},
        {"name": "payload", "type": "bytes"},
        {"name": "comment", "type": ["null", "string"], "default": None},
    ],
}  # fmt: skip
EVENT_V2 = {**EVENT, "fields": [*EVENT["fields"], {"name": "email", "type": ["null", "string"], "default": None}]}


def ms(timestamp_ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(timestamp_ms / 1000, UTC)


def event(i: int, v2: bool) -> dict:
    value = {
        "at": ms(T0 + i * 1000), "at_us": ms(T0) + dt.timedelta(microseconds=i * 1_000_003), "id": 2**40 + i, "seq": -(2**31) + i * 7919,
        "ok": i % 3 == 0, "ratio": i / 4 - 30.0, "score": i * 1.1 - 1e300 * (i % 2), "kind": "AB"[i % 2], "amount": decimal.Decimal(i * 101 - 5000) / 100,
        "day": dt.date(2024, 2, 29) + dt.timedelta(days=i), "origin": {"host": f"h{i % 7}" * (i % 4 + 1), "port": 9000 + i},
        "tags": [f"t{j}" for j in range(i % 3)], "counts": {"a": i, "b": -i}, "uid": uuid.UUID(int=i + 1), "mac": i.to_bytes(6, "big"),
        "payload": bytes([i % 256]) * (i % 5), "comment": None if i % 2 else f"comment {i}",
    }  # fmt: skip
    if v2:
        value["email"] = None if i % 3 == 0 else f"u{i}@example.com"
    return value


@dataclasses.dataclass
class Want:
    """One produced record as its row must read."""

    codec: str
    key: bytes | None
    headers: list
    timestamp: int
    outcome: str
    value_raw: bytes | None = None
    value: dict | None = None
    schema_id: int | None = None
    error: str | None = None  # exact, or a prefix when it ends with "…"


@dataclasses.dataclass
class Produced:
    topic: str
    want: dict[tuple[int, int], Want]
    schemas: dict[int, tuple[str, None]]

    def counts(self) -> dict[int, int]:
        """Records per partition."""
        out: dict[int, int] = {}
        for partition, _ in self.want:
            out[partition] = out.get(partition, 0) + 1
        return out


def produce(bootstrap: str, topic: str, codec: str, items: list[tuple[int, Want, bytes | None]], want: dict) -> None:
    """Produce `items` ((partition, Want, value bytes)) through `codec`, idempotent, acks=all; each
    acknowledged record's Want is put in `want` under (partition, offset)."""
    from confluent_kafka import Producer

    failures = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "compression.type": codec, "linger.ms": 5, "enable.idempotence": True})

    def report(item: Want, partition: int):
        def on_delivery(err, msg) -> None:
            if err is not None:
                failures.append(str(err))
            else:
                assert msg.partition() == partition
                want[(partition, msg.offset())] = item

        return on_delivery

    for partition, item, value in items:
        producer.produce(topic, value=value, key=item.key, partition=partition, timestamp=item.timestamp, headers=item.headers, on_delivery=report(item, partition))
        producer.poll(0)
    assert producer.flush(60) == 0
    assert not failures, failures[:3]


def headers_of(i: int) -> list:
    return [("trace", f"t{i}".encode()), ("empty", b""), ("null", None)][: i % 4]


def key_of(i: int, j: int) -> bytes | None:
    return None if i % 11 == 0 else f"k{j}".encode()


def timestamp_of(j: int) -> int:
    """Over three days, so that a table partitioned by day has three partition values."""
    return T0 + (j % 3) * DAY_MS + j


def produce_raw(bootstrap: str, per_codec: int = PER_CODEC) -> Produced:
    from tests.scenarios.records import create_topic

    topic = create_topic(bootstrap, PARTITIONS, prefix="job-raw")
    want: dict = {}
    for n, codec in enumerate(CODECS):
        items = []
        for i in range(per_codec):
            j = n * per_codec + i
            value = None if i % 9 == 4 else (b"raw %d " % j) * (j % 13 + 1)
            items.append((j % PARTITIONS, Want(codec, key_of(i, j), headers_of(j), timestamp_of(j), TOMBSTONE if value is None else RAW, value_raw=value), value))
        produce(bootstrap, topic, codec, items, want)
    return Produced(topic, want, {})


def malformed(row: Want, encoded: bytes, kind: int, subject: str, j: int) -> tuple[Want, bytes | None]:
    """Record `kind` (its index mod 10) of an Avro topic made a tombstone or malformed, or kept:
    1 a tombstone, 3 framed with an unknown id, 5 not framed, 7 bytes after the value, 9 bytes that
    do not decode."""
    schema_id = row.schema_id
    if kind == 1:
        return dataclasses.replace(row, outcome=TOMBSTONE, value=None, schema_id=None), None
    if kind == 3:
        encoded = frame(UNKNOWN_ID, encoded[5:])
        return dataclasses.replace(row, outcome=RAW, value=None, value_raw=encoded, schema_id=UNKNOWN_ID, error=f"schema id {UNKNOWN_ID} is not a version of subject {subject}"), encoded
    if kind == 5:
        encoded = json.dumps({"id": j}).encode()
        return dataclasses.replace(row, outcome=RAW, value=None, value_raw=encoded, schema_id=None, error="not framed: magic byte 123, not 0"), encoded
    if kind == 7:
        encoded += b"\x00"
        return dataclasses.replace(row, outcome=COLUMNS_RAW, value_raw=encoded, error=f"1 bytes after the value of schema {schema_id}"), encoded
    if kind == 9:
        encoded = frame(schema_id, b"\xff" * 3)
        return dataclasses.replace(row, outcome=RAW, value=None, value_raw=encoded, error=f"does not decode with schema {schema_id}: …"), encoded
    return row, encoded


def produce_avro(bootstrap: str, registry_url: str, per_codec: int = PER_CODEC) -> Produced:
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from tests.scenarios.records import create_topic

    topic = create_topic(bootstrap, PARTITIONS, prefix="job-avro")
    client = SchemaRegistryClient({"url": registry_url})
    try:
        subject = f"{topic}-value"
        v1_id = client.register_schema(subject, Schema(json.dumps(EVENT), "AVRO"))
        v2_id = client.register_schema(subject, Schema(json.dumps(EVENT_V2), "AVRO"))
        serializers = {False: AvroSerializer(client, json.dumps(EVENT)), True: AvroSerializer(client, json.dumps(EVENT_V2))}
        context = SerializationContext(topic, MessageField.VALUE)
        want: dict = {}
        for n, codec in enumerate(CODECS):
            items = []
            for i in range(per_codec):
                j = n * per_codec + i
                v2 = n >= 3  # v1 through none, gzip and snappy; v2 through lz4 and zstd
                schema_id = v2_id if v2 else v1_id
                value = event(j, v2)
                row = Want(codec, key_of(i, j), headers_of(j), timestamp_of(j), COLUMNS, value={**value, "email": value.get("email")}, schema_id=schema_id)
                row, encoded = malformed(row, serializers[v2](value, context), i % 10, subject, j)
                items.append((j % PARTITIONS, row, encoded))
            produce(bootstrap, topic, codec, items, want)
        schemas = {v.schema_id: (v.schema.schema_str, None) for v in (client.get_version(subject, n) for n in client.get_versions(subject))}
    finally:
        client.close()
    assert set(schemas) == {v1_id, v2_id}
    return Produced(topic, want, schemas)


def check_rows(p: Produced, rows: list[dict], *, where: str = "") -> None:
    """`rows` (a whole table's, from any reader) are exactly `p`'s acknowledged records: one row per
    (partition, offset), every field equal to what was produced, value_raw exactly where expected.
    Both sides pass through tests/readers.normalize, which evens out what engines legitimately differ
    in (time zones, maps as pairs, UUIDs as text)."""
    rows = sorted((normalize(r) for r in rows), key=lambda row: (row["kafka"]["partition"], row["kafka"]["offset"]))
    assert [(r["kafka"]["partition"], r["kafka"]["offset"]) for r in rows] == sorted(p.want), f"{where}: one row per acknowledged offset"
    seen_codecs: dict[str, set] = {}
    for row in rows:
        kafka = row["kafka"]
        want = p.want[(kafka["partition"], kafka["offset"])]
        at = f"{where} {p.topic} {kafka['partition']}:{kafka['offset']} ({want.outcome})"
        seen_codecs.setdefault(want.codec, set()).add(kafka["batch_compression"])
        assert (kafka["timestamp"], kafka["timestamp_type"], kafka["batch_magic"]) == (ms(want.timestamp), 0, 2), at
        assert kafka["producer_id"] >= 0 and kafka["batch_base_offset"] <= kafka["offset"] and not kafka["is_control"], at
        assert row["key_raw"] == want.key, at
        # key_bytes is set only for a key that is not UTF-8 (none here)
        assert [{n: x for n, x in h.items() if n != "key_bytes" or x is not None} for h in row["headers"]] == [{"key": k, "value": v} for k, v in want.headers], at
        assert row["value_raw"] == want.value_raw, at
        assert row["value_schema_id"] == want.schema_id, at
        if want.error is not None and want.error.endswith("…"):
            assert row["value_error"].startswith(want.error[:-1]), at
        else:
            assert row["value_error"] == want.error, at
        if p.schemas:
            assert row["value"] == normalize(want.value), at
        else:
            assert "value" not in row, at
    for codec, compressions in seen_codecs.items():
        # librdkafka sends a batch its codec would not shrink uncompressed
        assert codec in compressions and compressions <= {codec, "none"}, (where, codec, compressions)
