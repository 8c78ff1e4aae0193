"""Versioned messages on Kafka and their JSON Schemas."""
