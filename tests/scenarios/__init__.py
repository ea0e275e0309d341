"""Scenario tests: stock Kafka clients and raw protocol bytes against real `neve dev` processes."""
