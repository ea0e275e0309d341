"""The schema registry: Confluent Schema Registry's REST API, served by neve itself and stored in the
metadata store. A top-level component the product card does not name (the card's five folders are
the data path); it stands apart because the compactor and clients both use it and neither owns it.
Served over HTTPS and with HTTP Basic users, roles and subject prefixes when its settings say so
(access.py holds the model). Depends on metadata only."""
