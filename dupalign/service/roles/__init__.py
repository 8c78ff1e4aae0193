"""The stages as roles of a topology on Kafka."""
