"""table/files.py: where a broker reads a table's data files from. Files in a bucket other than
the WAL's are read with the table files' own keys (the compactor's settings) when they are set,
not the environment's that the WAL uses: a real SeaweedFS, which refuses keys it does not know."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from pyarrow.fs import S3FileSystem

from cache.reader import ObjectReader
from cache.recent import RecentObjects
from table.files import TableFiles
from tests.fixtures import S3_KEY, S3_SECRET
from wal.store import MemoryObjectStore, ObjectStoreError

REGION = "us-east-1"


async def _read(files: TableFiles, path: str, start: int, size: int) -> bytes:
    try:
        reader, key = files.locate(path)
        return bytes(await reader.read(key, start, size))
    finally:
        await files.close()


def test_a_table_in_another_bucket_is_read_with_the_table_files_keys(seaweedfs, monkeypatch):
    fs = S3FileSystem(access_key=S3_KEY, secret_key=S3_SECRET, endpoint_override=seaweedfs.endpoint.removeprefix("http://"), scheme="http", region=REGION, allow_bucket_creation=True)
    bucket = f"tables-{uuid.uuid4().hex[:8]}"
    fs.create_dir(bucket)
    data = bytes(range(256)) * 16
    with fs.open_output_stream(f"{bucket}/t/data/f.parquet") as out:
        out.write(data)
    path = f"s3://{bucket}/t/data/f.parquet"
    # the broker's environment holds keys the store does not know (the WAL's would be others)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "not-a-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-a-secret")
    wal = ObjectReader(MemoryObjectStore(), RecentObjects(0))
    wal_url = seaweedfs.object_store_url("wal")

    with_keys = TableFiles(wal, wal_url, seaweedfs.endpoint, REGION, S3_KEY, S3_SECRET)
    assert asyncio.run(_read(with_keys, path, 100, 1000)) == data[100:1100]

    with pytest.raises(ObjectStoreError):  # the environment's keys: refused
        asyncio.run(_read(TableFiles(wal, wal_url, seaweedfs.endpoint, REGION), path, 100, 1000))
