"""Decoding: a WAL byte range into Kafka records, a record (and its writer schema) into a table row,
many batches at once into Arrow columns; Avro writer schemas as Iceberg types."""
