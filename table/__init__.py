"""The table's rows as Kafka sees them again: what the broker needs to serve compacted offsets from
the Iceberg table's Parquet files (values back to their produced bytes, rows back to record
batches). The compactor writes the rows; this package reads them, and imports neither. Also the
table's names (names.py), which the broker checks at topic creation and the compactor names
tables by."""
