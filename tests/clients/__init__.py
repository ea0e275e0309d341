"""Stock Kafka clients driven from tests: the Java client as a compiled subprocess driver."""
