"""The benchmark's C producer (bench/loadgen/produce.c) against a real `neve dev`: every record it
counts as acknowledged is in the topic exactly once, where it said it would send it, stamped."""

from __future__ import annotations

import struct
import subprocess
import time
from array import array
from collections import Counter

import confluent_kafka
import pytest

from bench import native
from tests.scenarios.records import create_topic

pytestmark = pytest.mark.integration

PARTITIONS, RECORD_BYTES = 4, 200


def test_c_producer_acknowledges_exactly_what_is_stored(neve_node, tmp_path):
    topic = create_topic(neve_node.bootstrap, PARTITIONS, "loadgen")
    out = tmp_path / "samples"
    args = [str(native.producer_binary()), topic, str(PARTITIONS), str(RECORD_BYTES), "20000", "0", "1", "30000", str(out),
            f"bootstrap.servers={neve_node.bootstrap}", "linger.ms=20", "acks=all"]
    with subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1) as child:
        assert child.stdout.readline() == "ready\n"
        started = time.monotonic_ns()
        child.stdin.write("run\n")
        for line in child.stdout:  # stop once 5,000 records are acknowledged (20,000/s offered)
            word, *fields = line.split()
            assert word == "progress", line
            if int(fields[1]) >= 5000:
                child.stdin.write("stop\n")
                break
        done = [line.split() for line in child.stdout if line.startswith("done ")]
        assert child.wait(30) == 0
    [[_, sent, acked, failed, unacked, first_error]] = done
    sent, acked = int(sent), int(acked)
    assert (acked, failed, unacked, first_error) == (sent, "0", "0", "-") and sent >= 5000
    acks, latencies = array("d"), array("d")
    acks.frombytes((tmp_path / "samples.acks").read_bytes())
    latencies.frombytes((tmp_path / "samples.latencies").read_bytes())
    assert len(acks) == len(latencies) == acked
    assert all(0 < x < 30 for x in latencies)

    consumer = confluent_kafka.Consumer({"bootstrap.servers": neve_node.bootstrap, "group.id": "loadgen-check", "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    got = []
    deadline = time.monotonic() + 60
    while len(got) < acked and time.monotonic() < deadline:
        for m in consumer.consume(1000, timeout=1):
            assert m.error() is None, m.error()
            got.append((m.partition(), m.offset(), m.value()))
    consumer.close()
    assert len(got) == acked
    # record i went to partition i % PARTITIONS: the counts are exact
    assert Counter(p for p, _, _ in got) == {p: len(range(p, sent, PARTITIONS)) for p in range(PARTITIONS)}
    assert all(len(v) == RECORD_BYTES for _, _, v in got)
    for p in range(PARTITIONS):
        stamps = [struct.unpack_from("<q", v)[0] for q, _, v in sorted(got) if q == p]
        assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)  # produce-time stamps, in order
        assert started < stamps[0] and stamps[-1] < time.monotonic_ns()
