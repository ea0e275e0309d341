"""Bad input on raw sockets while a well-behaved client works beside it.

Each case sends one kind of bad input to a `neve dev` node (frame limit 1 MiB) and asserts the
exact outcome: either a Kafka error inside a response (and the connection stays usable), or the
connection closed by the broker with no response bytes. Meanwhile a librdkafka producer and
consumer run on their own connections; they must make progress after the bad input and, at the
end, have produced, acknowledged and consumed exactly the same records. The broker must still be
running."""

from __future__ import annotations

import io
import logging
import socket
import struct
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from kio.schema.api_versions.v0 import response as api_versions_v0
from kio.serial import entity_writer

from tests.batches import make_batch
from tests.raw import Raw, api_versions_v3, assert_still_serving, encode_request, metadata_v12, produce_v9
from tests.scenarios.records import LOG, create_topic

MAX_FRAME = 1024 * 1024
ENV = {"NEVE_WAL_LINGER_MS": "10", "NEVE_BROKER_MAX_FRAME_BYTES": str(MAX_FRAME)}
PROGRESS = 50  # records the good client must get acknowledged and consumed after the bad input
DEADLINE = 30.0

CORRUPT_MESSAGE = 2
UNSUPPORTED_VERSION = 35


def records(n: int, tag: str) -> list:
    return [(f"k{i}".encode(), f"{tag}-{i}".encode() * 3, [("h", b"v")], 1_700_000_000_000 + i) for i in range(n)]


def flip_crc(batch: bytes) -> bytes:
    corrupt = bytearray(batch)
    corrupt[17] ^= 0xFF  # the CRC-32C field of a v2 batch header
    return bytes(corrupt)


# --- the well-behaved client ---------------------------------------------------------------


class GoodClient:
    """A librdkafka producer (acks=all) and consumer on one topic, each in its own thread.
    The producer sends value good-<n> for n = 0, 1, ... until stopped; the consumer reads from
    offset 0. `wait_progress` blocks until both moved `n` records past where they were."""

    def __init__(self, bootstrap: str, topic: str, log_dir: Path) -> None:
        self.topic = topic
        self.acked: list[tuple[int, int]] = []  # (seq, offset)
        self.failures: list[str] = []
        self.consumed: list[tuple[int, bytes]] = []  # (offset, value)
        self.sent = 0
        self.errors: list[BaseException] = []
        self._stop_producing = threading.Event()
        self._stop_at: float | None = None
        self._progress = threading.Condition()
        self.logger = logging.getLogger(f"good.{topic}")
        self.logger.propagate = False
        self.handler = logging.FileHandler(log_dir / "good-client.log")
        self.logger.addHandler(self.handler)
        self.bootstrap = bootstrap
        self.producer_thread = threading.Thread(target=self._produce, daemon=True)
        self.consumer_thread = threading.Thread(target=self._consume, daemon=True)

    def __enter__(self) -> GoodClient:
        self.producer_thread.start()
        self.consumer_thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop_producing.set()
        self._stop_at = time.monotonic()
        self.producer_thread.join(DEADLINE)
        self.consumer_thread.join(DEADLINE)
        self.logger.removeHandler(self.handler)
        self.handler.close()

    def _on_delivery(self, err, msg) -> None:
        if err is not None:
            self.failures.append(str(err))
            return
        with self._progress:
            self.acked.append((int(msg.value()[5:]), msg.offset()))
            self._progress.notify_all()

    def _produce(self) -> None:
        try:
            producer = Producer({"bootstrap.servers": self.bootstrap, "acks": "all", "linger.ms": 2, "logger": self.logger})
            while not self._stop_producing.is_set():
                producer.produce(self.topic, value=f"good-{self.sent}".encode(), partition=0, on_delivery=self._on_delivery)
                self.sent += 1
                producer.poll(0.005)  # paces the load: a few hundred records per second
            remaining = producer.flush(DEADLINE)
            if remaining:
                self.failures.append(f"{remaining} records unacknowledged at the end")
        except BaseException as e:  # noqa: BLE001 - asserted by the test
            self.errors.append(e)

    def _consume(self) -> None:
        try:
            consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"good-{self.topic}", "enable.auto.commit": False, "logger": self.logger})
            consumer.assign([TopicPartition(self.topic, 0, OFFSET_BEGINNING)])
            try:
                while True:
                    for msg in consumer.consume(500, timeout=0.2):
                        if msg.error() is not None:
                            raise AssertionError(f"good consumer error: {msg.error()}")
                        with self._progress:
                            self.consumed.append((msg.offset(), msg.value()))
                            self._progress.notify_all()
                    if self._stop_at is not None:
                        # Stopping: read until everything the finished producer sent is in.
                        if not self.producer_thread.is_alive() and len(self.consumed) >= self.sent:
                            break
                        if time.monotonic() > self._stop_at + DEADLINE:
                            break
            finally:
                consumer.close()
        except BaseException as e:  # noqa: BLE001 - asserted by the test
            self.errors.append(e)

    def wait_progress(self, n: int = PROGRESS) -> None:
        with self._progress:
            acked, consumed = len(self.acked), len(self.consumed)
            ok = self._progress.wait_for(lambda: len(self.acked) >= acked + n and len(self.consumed) >= consumed + n, timeout=DEADLINE)
        assert ok, f"good client stalled: acknowledged {acked}->{len(self.acked)}, consumed {consumed}->{len(self.consumed)} in {DEADLINE}s; errors {self.errors} {self.failures[:3]}"

    def check(self) -> None:
        assert not self.errors, f"good client raised: {self.errors!r}"
        assert not self.producer_thread.is_alive() and not self.consumer_thread.is_alive(), "good client threads did not finish"
        assert not self.failures, f"good producer failures: {self.failures[:5]}"
        assert len(self.acked) == self.sent, f"sent {self.sent}, acknowledged {len(self.acked)}"
        assert sorted(self.acked) == [(i, i) for i in range(self.sent)], "acknowledged offsets are not seq 0..n-1 at offsets 0..n-1"
        assert self.consumed == [(i, f"good-{i}".encode()) for i in range(self.sent)], (
            f"consumed {len(self.consumed)} records, sent {self.sent}; first mismatch at "
            f"{next((i for i, c in enumerate(self.consumed) if c != (i, f'good-{i}'.encode())), len(self.consumed))}"
        )


# --- the cases -----------------------------------------------------------------------------


def garbage_negative_length(raw: Raw, ctx) -> None:
    raw.send(bytes.fromhex("deadbeef") + bytes(range(256)) * 4)
    raw.expect_closed()


def garbage_frame(raw: Raw, ctx) -> None:
    junk = bytes((i * 37 + 11) % 256 for i in range(200))  # api key 0x0b30: not a Kafka API
    raw.send(struct.pack(">i", len(junk)) + junk)
    raw.expect_closed()


def garbage_body_of_known_api(raw: Raw, ctx) -> None:
    good = encode_request(metadata_v12(), 7)
    header_end = len(good) - len(_body_bytes(metadata_v12()))
    payload = good[4:header_end] + b"\xff" * 12  # a compact-array length varint that never ends
    raw.send(struct.pack(">i", len(payload)) + payload)
    raw.expect_closed()


def frame_over_limit(raw: Raw, ctx) -> None:
    # A full, well-formed request under the limit works on its own connection ...
    ok = Raw(ctx["port"])
    try:
        batch = make_batch([(b"k", b"x" * (MAX_FRAME - 4096), [], 1_700_000_000_000)])
        cid = ok.request(produce_v9(ctx["raw_topic"], {1: batch}))
        response = ok.response(0, 9, cid)
        assert [(p.index, p.error_code) for t in response.responses for p in t.partition_responses] == [(1, 0)]
    finally:
        ok.close()
    ctx["expected_ends"] = {0: 0, 1: 1}
    # ... one byte over the limit closes the connection as soon as the length is read.
    raw.send(struct.pack(">i", MAX_FRAME + 1) + b"\x00\x00\x00\x09" + b"\x00" * 1000)
    raw.expect_closed()


def unknown_api_key(raw: Raw, ctx) -> None:
    client_id = b"raw-test"
    payload = struct.pack(">hhih", 9999, 0, 42, len(client_id)) + client_id
    raw.send(struct.pack(">i", len(payload)) + payload)
    raw.expect_closed()


def unsupported_version_of_other_api(raw: Raw, ctx) -> None:
    frame = bytearray(encode_request(metadata_v12(), 43))
    struct.pack_into(">h", frame, 6, 999)  # Metadata v999
    raw.send(bytes(frame))
    raw.expect_closed()


def api_versions_too_high(raw: Raw, ctx) -> None:
    cid = raw.request(api_versions_v3())
    advertised = raw.response(18, 3, cid).api_keys
    frame = bytearray(encode_request(api_versions_v3(), 4242))
    struct.pack_into(">h", frame, 6, 127)  # ApiVersions v127
    raw.send(bytes(frame))
    body = raw.response(18, 0, 4242)  # KIP-511: answered in v0
    assert isinstance(body, api_versions_v0.ApiVersionsResponse)
    assert body.error_code == UNSUPPORTED_VERSION
    fallback = [(a.api_key, a.min_version, a.max_version) for a in body.api_keys]
    assert fallback == [(a.api_key, a.min_version, a.max_version) for a in advertised]
    assert {0, 1, 2, 3, 18} <= {k for k, _, _ in fallback}, fallback
    assert_still_serving(raw)  # the client retries on the same connection, as librdkafka does


def truncated_request_in_frame(raw: Raw, ctx) -> None:
    good = encode_request(metadata_v12(ctx["raw_topic"]), 44)
    cut = good[4:-5]
    raw.send(struct.pack(">i", len(cut)) + cut)
    raw.expect_closed()


def truncated_stream(raw: Raw, ctx) -> None:
    good = encode_request(metadata_v12(ctx["raw_topic"]), 45)
    raw.send(good[: len(good) // 2])
    raw.sock.shutdown(socket.SHUT_WR)  # the client goes away mid-frame
    raw.expect_closed()


def wrong_crc(raw: Raw, ctx) -> None:
    good = make_batch(records(10, "good"))
    bad = flip_crc(make_batch(records(10, "bad")))
    cid = raw.request(produce_v9(ctx["raw_topic"], {0: bad, 1: good}))
    response = raw.response(0, 9, cid)
    got = {(p.index, p.error_code, p.base_offset) for t in response.responses for p in t.partition_responses}
    assert got == {(0, CORRUPT_MESSAGE, -1), (1, 0, 0)}, got
    assert_still_serving(raw)
    ctx["expected_ends"] = {0: 0, 1: 10}


def truncated_batch(raw: Raw, ctx) -> None:
    good = make_batch(records(10, "good"))
    cid = raw.request(produce_v9(ctx["raw_topic"], {0: good[:-7], 1: good}))
    response = raw.response(0, 9, cid)
    got = {(p.index, p.error_code, p.base_offset) for t in response.responses for p in t.partition_responses}
    assert got == {(0, CORRUPT_MESSAGE, -1), (1, 0, 0)}, got
    assert_still_serving(raw)
    ctx["expected_ends"] = {0: 0, 1: 10}


def _body_bytes(body) -> bytes:
    buffer = io.BytesIO()
    entity_writer(type(body))(buffer, body)
    return buffer.getvalue()


CASES = {
    f.__name__: f
    for f in (
        garbage_negative_length,
        garbage_frame,
        garbage_body_of_known_api,
        frame_over_limit,
        unknown_api_key,
        unsupported_version_of_other_api,
        api_versions_too_high,
        truncated_request_in_frame,
        truncated_stream,
        wrong_crc,
        truncated_batch,
    )
}


@pytest.mark.integration
@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", list(CASES))
def test_bad_input(case: str, neve_factory, artifacts_dir: Path) -> None:
    node = neve_factory(env=ENV)
    good_topic = create_topic(node.bootstrap, 1, prefix="good")
    raw_topic = create_topic(node.bootstrap, 2, prefix="raw")
    ctx = {"port": node.port, "raw_topic": raw_topic, "expected_ends": {0: 0, 1: 0}}

    with GoodClient(node.bootstrap, good_topic, artifacts_dir) as good:
        good.wait_progress()
        raw = Raw(node.port)
        try:
            CASES[case](raw, ctx)
        finally:
            raw.close()
        good.wait_progress()
        assert node.process.poll() is None, "neve exited after the bad input"
    good.check()

    # Nothing of the bad input was stored; what was accepted is exactly there.
    consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "ends", "logger": LOG})
    try:
        ends = {p: consumer.get_watermark_offsets(TopicPartition(raw_topic, p), timeout=10, cached=False) for p in (0, 1)}
    finally:
        consumer.close()
    assert ends == {p: (0, n) for p, n in ctx["expected_ends"].items()}
    assert node.process.poll() is None, "neve exited"
