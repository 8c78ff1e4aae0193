"""The Kafka side: CLI, inputs, the single worker, the stage roles, metrics, HTTP. Nothing
in the engine imports it."""
