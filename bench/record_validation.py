"""What produce's validation of every record costs, per record, in this process.

`wal.batch.validate` checks each batch's framing and CRC-32C, then walks every record's framing
(decompressing the batch first) with the compiled walk, `wal.record_walk.check_records`. This times, on batches of 100-byte and 1 KiB records (keys of
10 bytes, no headers, 1,000 records a batch unless `--records`):

- walk: the record walk alone (`check_records`, uncompressed bytes);
- validate: the whole of `validate` on an uncompressed batch, and `header_only`: the same batch
  checked as before records were walked (framing and CRC-32C only), so validate - header_only
  is what the walk added to the produce path;
- one line per codec: `validate` of that batch compressed (decompression included).

Each figure is the best of `--rounds` rounds of this thread's CPU time (the machine is shared:
CPU time leaves out the time other processes hold the core, the best round the least disturbed). `python -m bench.record_validation [--records N] [--rounds N]`; one JSON line per
measurement, in ns per record.
"""

from __future__ import annotations

import argparse
import json
import time

import cramjam
from crc32c import crc32c

from wal import batch as wal_batch
from wal.batch_builder import zigzag_varint
from wal.record_walk import as_array, check_records

_CODECS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
_COMPRESS = {1: cramjam.gzip.compress, 2: cramjam.snappy.compress_raw, 3: cramjam.lz4.compress, 4: cramjam.zstd.compress}


def records(count: int, value_size: int) -> bytes:
    """A record section: distinct 10-byte keys, values of `value_size` bytes, timestamps 1 ms apart."""
    out = []
    for i in range(count):
        key = b"key-%06d" % i
        value = bytes([i % 251]) * value_size
        body = b"\x00" + zigzag_varint(i) + zigzag_varint(i) + zigzag_varint(len(key)) + key + zigzag_varint(len(value)) + value + b"\x00"
        out.append(zigzag_varint(len(body)) + body)
    return b"".join(out)


def frame(payload: bytes, count: int, codec: int) -> bytes:
    if codec:
        payload = bytes(_COMPRESS[codec](payload))
    post = wal_batch.BATCH_HEADER.pack(0, 0, 0, 0, 0, codec, count - 1, 0, count - 1, -1, -1, -1, count)[21:] + payload
    pre = wal_batch.BATCH_HEADER.pack(0, 49 + len(payload), -1, 2, crc32c(post), 0, 0, 0, 0, 0, 0, 0, 0)[:21]
    return pre + post


def best_ns(fn, count: int, rounds: int) -> float:
    """The best of `rounds` rounds of at least 50 ms of CPU each, in ns per record."""
    fn()
    reps = 1
    while True:
        t = time.thread_time()
        for _ in range(reps):
            fn()
        if time.thread_time() - t > 0.05:
            break
        reps *= 2
    best = float("inf")
    for _ in range(rounds):
        t = time.thread_time()
        for _ in range(reps):
            fn()
        best = min(best, (time.thread_time() - t) / reps)
    return best / count * 1e9


def _header_only(data: bytes) -> None:
    """validate as it was before records were walked: the walk replaced by nothing."""
    saved = wal_batch._check_records
    wal_batch._check_records = lambda *args: None
    try:
        wal_batch.validate(data)
    finally:
        wal_batch._check_records = saved


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.record_validation", description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=1000, help="records per batch")
    p.add_argument("--rounds", type=int, default=15)
    args = p.parse_args(argv)
    n = args.records
    for size in (100, 1024):
        payload = records(n, size)
        plain = frame(payload, n, 0)
        array = as_array(payload)
        figures = {
            "walk": best_ns(lambda array=array: check_records(array, 0, len(array), n, False), n, args.rounds),
            "validate": best_ns(lambda plain=plain: wal_batch.validate(plain), n, args.rounds),
            "header_only": best_ns(lambda plain=plain: _header_only(plain), n, args.rounds),
        }
        for name, codec in _CODECS.items():
            compressed = frame(payload, n, codec)
            figures[name] = best_ns(lambda compressed=compressed: wal_batch.validate(compressed), n, args.rounds)
        print(json.dumps({"value_bytes": size, "records_per_batch": n, "ns_per_record": {k: round(v) for k, v in figures.items()}}))


if __name__ == "__main__":
    main()
