"""The topology's topics (names from ``[kafka]``) and their partition counts: what the roles
check at start-up (dupalign/service/topology.py ``ensure_topics``) and what their ACLs
name (dupalign/service/acls.py). No Kafka client here, so ``dupalign acls`` stays cheap."""

from __future__ import annotations

from dupalign.service.config import KafkaConfig


def topology_topics(kc: KafkaConfig) -> dict[str, int | None]:
    """Every topic of the topology and the partition count it must have (None: any)."""
    topics: dict[str, int | None] = {
        kc.input_topic: None, kc.output_topic: None, kc.dlq_topic: None,
        kc.sequence_topic: 1,  # one order: the ordinal is the offset
        kc.sketch_topic: 1, kc.aligned_topic: 1,  # the index role's (the fan-in's)
        kc.align_topic: None, kc.forward_topic: None,  # as many as each other
    }
    if kc.index_shards > 1:  # partition s of keys: shard s's input
        topics[kc.keys_topic] = kc.index_shards
        topics[kc.partials_topic] = 1
    return topics


def retained_topics(kc: KafkaConfig) -> set[str]:
    """The topics a rebuild by replay reads from their beginning (a store on a fresh
    directory): kept forever, or the stores built from them cannot be rebuilt."""
    topics = {kc.sequence_topic, kc.sketch_topic}
    if kc.index_shards > 1:  # a shard rebuilds from keys, the fan-in from its partials
        topics |= {kc.keys_topic, kc.partials_topic}
    return topics
