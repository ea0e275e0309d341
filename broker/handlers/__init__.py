"""One module per Kafka API (or API family), named by API key, e.g. `p00_produce.py`."""
