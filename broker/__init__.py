"""The Kafka wire protocol, stateless: connections, codecs, and one handler module per API."""
