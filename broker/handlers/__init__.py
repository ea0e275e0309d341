"""One module per Kafka API (or API family), named by API key, e.g. `api00_produce.py`."""
