"""The compactor's settings: which Iceberg catalog and warehouse, which namespace, the S3 the
tables live on, and where Spark runs. The composition root loads them as the [compactor] section
(NEVE_COMPACTOR_<FIELD>)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class CompactorConfig:
    catalog_url: str = ""
    """The Iceberg catalog, by URL: `sqlite:///path/catalog.db` (SQL catalog on SQLite, the
    single-node default), `postgresql://user[:password]@host:port/db` (SQL catalog on PostgreSQL,
    the one Spark's and Trino's JDBC catalogs share), or `rest+http://host:port` / `http://host:port`
    (an Iceberg REST catalog, such as SeaweedFS's). Empty: no compaction."""
    catalog_name: str = "neve"
    """The catalog's name. SQL catalogs keep it in every row, and Spark's JDBC catalog of the same
    database sees the tables only under the same name."""
    warehouse: str = ""
    """Where new tables' files go: `file:///dir` or `s3://bucket/prefix` (for a REST catalog, the
    warehouse name it knows, e.g. `s3://warehouse/`). Empty for a SQLite catalog: a `warehouse`
    directory beside the catalog file."""
    namespace: str = "neve"
    """The namespace (database) holding one table per topic."""
    s3_endpoint: str = ""
    """S3 endpoint URL for the table files (e.g. http://127.0.0.1:8333); empty: AWS's."""
    s3_access_key_id: str = ""
    """S3 access key for the table files; empty: the environment's (AWS_ACCESS_KEY_ID)."""
    s3_secret_access_key: str = ""
    """S3 secret key for the table files; empty: the environment's (AWS_SECRET_ACCESS_KEY)."""
    s3_region: str = "us-east-1"
    """S3 region for the table files."""
    rest_credential: str = ""
    """OAuth2 client credential `id:secret` for a REST catalog; empty: the S3 keys, which is what
    SeaweedFS's catalog accepts."""
    spark_master: str = "local[*]"
    """Spark master URL: `local[*]` runs Spark inside the compactor; `spark://host:7077` or
    `k8s://...` when one machine is not enough."""
    spark_driver_memory: str = "1g"
    """Spark driver heap (spark.driver.memory)."""
    runner: str = "spark"
    """Where a cycle's tasks run: `spark` (the session above; started on the first cycle that has
    work) or `in-process` (threads of the compactor itself: no JVM, for small machines and tests)."""
    parallelism: int = 2
    """The executors' cores (in-process: the threads tasks run on). A topic's due bytes are cut
    into at most this many tasks, and a cycle's job into about this many Spark tasks, each a bundle
    of whole tasks of about as many bytes, whatever the number of topics."""
    tables_in_parallel: int = 8
    """Topics whose tables a cycle reads, commits to and swaps at the same time (the tasks of
    every topic run in one job): the catalog's and object store's round trips of many small tables
    overlap. A compactor inside a node takes at most 2: a commit is mostly pyiceberg's CPU, which
    more threads do not add to, and the broker's event loop shares that process's interpreter."""
    interval_ms: int = 1000
    """Pause between cycles that found nothing due (a cycle with work is followed at once)."""
    freshness_ms: int = 2000
    """WAL entries wait this long after their newest record before compaction takes them, so
    that a cycle takes a few seconds of records at once instead of every object as it lands (few,
    larger files); rows are visible about this long after their acknowledgement, plus a cycle."""
    due_bytes: int = 64 * 1024 * 1024
    """A partition with this many WAL bytes waiting is compacted without waiting for freshness."""
    tables_by_default: bool = True
    """Whether a topic without a `neve.iceberg.enabled` config gets a table (every topic is a table
    unless switched off)."""
    in_node: bool = False
    """Run the compactor inside the node (`neve dev`: true, with a SQLite catalog and a warehouse
    in the data dir unless `catalog_url` names another). A cluster runs `neve compactor` instead."""
    share_topics: bool = False
    """false: one compactor of the cluster cycles, the holder of the "compactor" leadership, over
    every topic (the others stand by and take over within the lease TTL); the default, and what one
    machine needs. true: the live compactors (`neve compactor` processes, and the compactor inside
    each node that has `in_node` set) divide the topics among themselves (service/sharing.py), each its own
    share, so that adding compactors keeps tables fresh at many topics; one that dies has its
    topics taken over within the lease TTL, one that joins takes only its share. Set it alike on
    every compactor of a cluster: a single leader beside sharing compactors works the topics twice
    (safely, never a row twice, but for nothing)."""
    metrics_port: int = 0
    """Prometheus metrics HTTP port of `neve compactor` (on broker.host); 0: off. A node with the
    compactor inside serves the compactor's metrics with its own, on broker.metrics_port."""
    maintenance_interval_ms: int = 600_000
    """How often each table is maintained: its small files merged, its old snapshots expired and
    the files they alone held deleted. 0: never. (Whether a rewrite, neve's or another engine's,
    moved offsets the index names is checked more often: see `table_check_interval_ms`.)"""
    table_check_interval_ms: int = 10_000
    """How often the table of a topic with nothing to compact is read again, for other engines'
    snapshots (a rewrite that moved offsets the index names is re-indexed), topic config changes
    it carries (the drop-on-delete mark) and files due for deletion. A cycle that commits checks
    its table at once. Each check reads the table's metadata (a catalog call and an object GET): at
    1,000 idle topics, every second would be 2.6 billion GETs a month. 0: every cycle."""
    merge_target_file_bytes: int = 128 * 1024 * 1024
    """The merge rewrites a table partition's files smaller than three quarters of this into files
    of about this size, sorted by kafka.partition and kafka.offset."""
    merge_on_spark_min_bytes: int = 32 * 1024 * 1024
    """With the Spark runner, a table's merge of fewer bytes than this runs in the compactor's own
    process (pyarrow and pyiceberg, as the in-process runner's): a Spark job's fixed cost (0.2-0.4 s
    a table on the 2-core machine) is more than pyarrow's whole rewrite of a few MiB, and at a
    thousand small topics merging was most of the compactor's time. 0: every merge on Spark."""
    merge_min_files: int = 5
    """A table partition is merged once it has at least this many small files."""
    snapshot_max_age_ms: int = 3 * 86_400_000
    """Snapshots older than this are expired (the current one never): time travel reaches this far
    back. The data files no retained snapshot holds are then deleted, once no index entry names them
    and `file_delete_grace_ms` has passed."""
    snapshot_max_count: int = 100
    """A table keeps at most this many snapshots besides its branch and tag heads (the newest;
    older ones expire with those past `snapshot_max_age_ms`, once the table holds twice as many):
    every commit's CPU grows with the snapshots the table keeps (pyiceberg reads, copies and
    writes them all: about 0.14 ms each on the 2-core machine), and a cycle commits every few
    seconds. Time travel reaches this many commits back (a tag keeps a snapshot for good). 0: by
    age alone."""
    file_delete_grace_ms: int = 600_000
    """How long a data file that the table and the index no longer hold is kept before it is
    deleted, so that a Kafka fetch already reading it completes."""
    orphan_file_age_ms: int = 3 * 86_400_000
    """A file in a table's data directory that no snapshot holds, no index entry names and no
    expiry has pending is deleted at a maintenance round once it is this old: the files of a cycle
    or a Spark job that crashed before its commit. It must be longer than any cycle or merge takes
    (a file being written is such a file until its commit); Iceberg's own remove_orphan_files
    uses 3 days. 0: never."""
    fault_kill_after: str = ""
    """Test-only fault injection: kill this process (SIGKILL) at a step: right after a cycle's
    Parquet files are `written`, its snapshot `committed`, or its index `swapped`; a compacted
    topic's cycle also once its removal object is written (`removals-written`), its manifest
    (`manifest-written`), its position-delete files (`deletes-written`, not committed yet), and
    after its partitions' index entries are merged (`entries-merged`); after maintenance `merged` a table's files (its snapshot committed, the index not
    yet re-indexed); after retention's `overwrite` of a table's expired rows; after a deleted
    topic's table is `dropped`. Empty: off."""
    fault_raise_at: str = ""
    """Test-only fault injection: the steps (as in `fault_kill_after`, comma-separated) at which
    the compactor raises an error, once each. Empty: off."""
    fault_drop_row_every: int = 0
    """Planted bug, test only (chaos/plants.py's table-row-dropped): every Nth task this
    compactor plans (1: every one) leaves its first record out of the Parquet file it writes,
    while the cycle's index swap still replaces the WAL entries holding it: the table, and the
    Kafka reads served from the table, miss that record. 0: off."""
