"""PySpark compaction of WAL objects into Iceberg Parquet (a later issue); depends on metadata, wal."""
