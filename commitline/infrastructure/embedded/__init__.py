"""Embedded PostgreSQL and Kafka-protocol broker processes, for development, the demo and tests only."""
