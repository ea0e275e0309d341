"""The schema registry: Confluent Schema Registry's REST API, served by neve itself and stored in the
metadata store. A top-level component the product card does not name (the card's five folders are
the data path); it stands apart because the compactor and clients both use it and neither owns it.
Depends on metadata only."""
