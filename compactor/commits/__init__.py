"""Committing: a cycle's files become one Iceberg snapshot; an upsert's position deletes; the Kafka
index swapped onto the snapshot, or re-pointed after a rewrite; a table bound to its topic."""
