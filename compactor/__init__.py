"""WAL objects into each topic's Iceberg table, a stage per folder: rows/ (a Kafka record becomes a
table row), files/ (a cycle's plan and the job that writes its Parquet files), commits/ (a snapshot,
an upsert's position deletes, the index swap), maintenance/ (merge, expiry, retention), service/ (the
cycle loop and the tables it owns). Beside them what every stage shares: config, catalog, metrics.
Depends on metadata, wal and table."""
