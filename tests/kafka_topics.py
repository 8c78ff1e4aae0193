"""Topics that a test makes itself, usable once made. The admin client's CreateTopics returns
when the controller has them, before the broker's metadata does: a client that asks for one
in between gets UnknownTopicOrPartition, which aiokafka logs as ``ERROR Topic ... not found
in cluster metadata`` (a test counting a process's ERROR lines failed CI on it at 7fade33),
and a role checking its topics may not see them yet. The product's own creation waits the
same way (dupalign.service.topology ``ensure_topics``)."""

from __future__ import annotations

import asyncio
import time

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import for_code


async def create_topics(bootstrap: str, topics: list[NewTopic], timeout: float = 60) -> None:
    """Create ``topics`` and wait until the broker's metadata has each with all its
    partitions led."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        response = await admin.create_topics(topics)
        for name, code, *_ in response.topic_errors:  # the admin client does not raise
            assert code == 0, f"creating topic {name!r}: {for_code(code).__name__}"
        wanted = {t.name: t.num_partitions for t in topics}
        deadline = time.monotonic() + timeout
        while (ready := await _led(admin, wanted)) != set(wanted):
            assert time.monotonic() < deadline, f"topics {set(wanted) - ready} not in metadata"
            await asyncio.sleep(0.1)
    finally:
        await admin.close()


async def _led(admin: AIOKafkaAdminClient, wanted: dict[str, int]) -> set[str]:
    # only topics listed: a metadata request naming a missing topic makes a broker with
    # auto.create.topics.enable create it
    present = [t for t in wanted if t in set(await admin.list_topics())]
    return {t["topic"] for t in (await admin.describe_topics(present) if present else [])
            if t["error_code"] == 0 and len(t["partitions"]) == wanted[t["topic"]]
            and all(p["leader"] >= 0 for p in t["partitions"])}
