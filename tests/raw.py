"""A blocking loopback client that speaks raw Kafka frames (kio entities in, kio entities out), for
tests that must send what no stock client sends: bad frames, pipelined requests, exact batches."""

from __future__ import annotations

import datetime
import io
import socket
import struct
import time

from kio.index import load_response_schema
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.serial import entity_reader, entity_writer

IO_TIMEOUT = 10.0  # a connection that neither answers nor closes within this is "hung"


class Raw:
    """One blocking loopback connection speaking raw Kafka frames."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=IO_TIMEOUT)
        self.correlation_id = 100

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def request(self, body, client_id: str = "raw-test") -> int:
        """Send a kio request entity (header version chosen by its schema); returns its correlation id."""
        self.correlation_id += 1
        self.send(encode_request(body, self.correlation_id, client_id))
        return self.correlation_id

    def _read_exactly(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError(f"connection closed after {len(out)} of {n} bytes")
            out += chunk
        return bytes(out)

    def response(self, api_key: int, version: int, expected_correlation_id: int):
        (size,) = struct.unpack(">i", self._read_exactly(4))
        frame = self._read_exactly(size)
        cls = load_response_schema(api_key, version)
        header, used = entity_reader(cls.__header_schema__)(frame, 0)
        body, used_body = entity_reader(cls)(frame, used)
        assert header.correlation_id == expected_correlation_id
        assert used + used_body == size, f"{size - used - used_body} trailing bytes in the response"
        return body

    def expect_closed(self) -> None:
        """The broker closes this connection without sending a byte (EOF or reset), in time."""
        received = b""
        started = time.monotonic()
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    break
                received += chunk
        except ConnectionResetError:
            pass
        except TimeoutError:
            raise AssertionError(f"connection neither answered nor closed within {IO_TIMEOUT}s (hung)") from None
        assert received == b"", f"expected a closed connection, got {len(received)} bytes: {received[:40].hex()}"
        assert time.monotonic() - started < IO_TIMEOUT


def encode_request(body, correlation_id: int, client_id: str = "raw-test") -> bytes:
    cls = type(body)
    header_cls = cls.__header_schema__
    buffer = io.BytesIO()
    entity_writer(header_cls)(
        buffer, header_cls(request_api_key=cls.__api_key__, request_api_version=cls.__version__, correlation_id=correlation_id, client_id=client_id)
    )
    entity_writer(cls)(buffer, body)
    payload = buffer.getvalue()
    return struct.pack(">i", len(payload)) + payload


def api_versions_v3() -> ApiVersionsRequest:
    return ApiVersionsRequest(client_software_name="neve-raw-test", client_software_version="1.0")


def metadata_v12(topic: str | None = None) -> MetadataRequest:
    topics = None if topic is None else (MetadataRequestTopic(topic_id=None, name=topic),)
    return MetadataRequest(topics=topics, allow_auto_topic_creation=False, include_topic_authorized_operations=False)


def produce_v9(topic: str, partitions: dict[int, bytes]) -> ProduceRequest:
    return ProduceRequest(
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=10),
        topic_data=(TopicProduceData(name=topic, partition_data=tuple(PartitionProduceData(index=p, records=r) for p, r in partitions.items())),),
    )


def assert_still_serving(raw: Raw) -> None:
    """The same connection still answers a well-formed request."""
    cid = raw.request(api_versions_v3())
    response = raw.response(18, 3, cid)
    assert response.error_code == 0


def fetch_v12(topic: str, partition: int, offset: int, max_wait_ms: int) -> FetchRequest:
    """A long-polling fetch of one partition: answered when a byte arrives or after max_wait_ms."""
    return FetchRequest(
        cluster_id=None,
        replica_id=-1,
        max_wait=datetime.timedelta(milliseconds=max_wait_ms),
        min_bytes=1,
        max_bytes=1024 * 1024,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(FetchTopic(topic=topic, partitions=(FetchPartition(partition=partition, current_leader_epoch=-1, fetch_offset=offset, last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1024 * 1024),)),),
        forgotten_topics_data=(),
        rack_id="",
    )
