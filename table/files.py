"""Where the broker reads a table's data files from: a file's path in the catalog (`file:///dir/x.parquet`,
`s3://bucket/key.parquet`) → an ObjectReader and a key. Files in the WAL's own bucket go through the
broker's reader (its single flight, its GET counting); other buckets get a store of their own, on
the table files' S3 endpoint when one is set (the compactor's), else the WAL's, with the table
files' keys when they are set (the compactor's), else the environment's (AWS_ACCESS_KEY_ID, as for
the WAL); local paths a file store over `/`. Data files are immutable, so
their sizes (needed to find a Parquet footer) are remembered."""

from __future__ import annotations

from collections import OrderedDict
from urllib.parse import urlencode, urlparse, urlunparse

from cache.reader import ObjectReader
from cache.recent import RecentObjects
from wal.store import FileObjectStore, ObjectStore

SIZES_REMEMBERED = 100_000


class TableFiles:
    def __init__(self, wal_reader: ObjectReader, wal_store_url: str, s3_endpoint: str = "", s3_region: str = "", s3_access_key_id: str = "", s3_secret_access_key: str = "") -> None:
        self._wal_reader = wal_reader
        self._wal_url = urlparse(wal_store_url)
        self._s3 = {k: v for k, v in (("endpoint", s3_endpoint), ("region", s3_region)) if v}
        self._keys = (s3_access_key_id, s3_secret_access_key)
        self._readers: dict[tuple[str, str], tuple[ObjectReader, str]] = {}  # (scheme, bucket) -> reader, key prefix to strip
        self._sizes: OrderedDict[str, int] = OrderedDict()
        self._owned: list[ObjectStore] = []

    def locate(self, path: str) -> tuple[ObjectReader, str]:
        """The reader of `path` and its key in that reader's store. Raises ValueError for a path
        neve cannot read (an unknown scheme)."""
        url = urlparse(path)
        scheme = "s3" if url.scheme in ("s3", "s3a") else url.scheme
        if scheme not in ("s3", "file"):
            raise ValueError(f"table file {path!r}: neve reads file:// and s3:// paths")
        bucket = url.netloc if scheme == "s3" else ""
        found = self._readers.get((scheme, bucket))
        if found is None:
            found = self._readers[(scheme, bucket)] = self._reader_for(scheme, bucket)
        reader, strip = found
        key = url.path.lstrip("/")
        if not key.startswith(strip):
            raise ValueError(f"table file {path!r} is outside the store prefix {strip!r}")
        return reader, key[len(strip) :]

    def _reader_for(self, scheme: str, bucket: str) -> tuple[ObjectReader, str]:
        wal = self._wal_url
        if scheme == "s3" and wal.scheme == "s3" and wal.netloc == bucket:
            return self._wal_reader, wal.path.strip("/") + "/" if wal.path.strip("/") else ""
        if scheme == "file":
            store: ObjectStore = FileObjectStore("/")
        else:
            query = urlencode(self._s3) if self._s3 else wal.query if wal.scheme == "s3" else ""
            from wal.s3 import from_url  # obstore: only for tables on S3

            store = from_url(urlunparse(("s3", bucket, "", "", query, "")), access_key_id=self._keys[0], secret_access_key=self._keys[1])
        self._owned.append(store)
        return ObjectReader(store, RecentObjects(0)), ""

    async def size(self, path: str) -> int:
        found = self._sizes.get(path)
        if found is None:
            reader, key = self.locate(path)
            found = await reader.store.size(key)
            self._sizes[path] = found
            if len(self._sizes) > SIZES_REMEMBERED:
                self._sizes.popitem(last=False)
        return found

    async def close(self) -> None:
        for store in self._owned:
            await store.close()
