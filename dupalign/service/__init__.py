"""The Kafka side: CLI, inputs, the single worker, the topology's roles, metrics, HTTP. Nothing
in the engine imports it."""
