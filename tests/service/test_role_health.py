"""The health checks and transaction counts of a process running topology roles
(dupalign/service/roles/launch.py, dupalign/service/roles/metrics.py), without a broker: real
asyncio tasks stand for
the roles' loops."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from aiokafka.errors import TopicAuthorizationFailedError

from dupalign.service.config import KafkaConfig
from dupalign.service.roles.launch import RoleHealth, failure_line
from dupalign.service.roles.metrics import RoleMetrics
from dupalign.service.topology import TopologyError


async def test_health_is_503_once_a_role_fails_and_ready_503_on_a_stop() -> None:
    never = asyncio.Event()
    running = asyncio.create_task(never.wait(), name="index")
    failing = asyncio.Event()

    async def fail() -> None:
        await failing.wait()
        raise TopologyError("topic 'seq' has 2 partitions")

    other = asyncio.create_task(fail(), name="sketch")
    parts = [SimpleNamespace(name="sketch", started=False),
             SimpleNamespace(name="index", started=True)]
    health = RoleHealth(parts, [other, running])
    assert health.healthy() == (True, "ok")
    assert health.ready() == (False, "starting: sketch")
    parts[0].started = True
    assert health.ready() == (True, "running sketch, index")
    failing.set()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    ok, reason = health.healthy()
    assert not ok and reason == "failed: sketch: topic 'seq' has 2 partitions"
    assert health.ready()[0] is False
    health.stopping = True
    assert health.ready() == (False, "stopping")
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running


def test_a_failure_is_one_line_with_a_traceback_only_when_unforeseen() -> None:
    kc = KafkaConfig(security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512",
                     sasl_plain_username="sketcher", sasl_plain_password="s3cret")
    assert failure_line("sketch", TopologyError("bad partitions"), kc) == (
        "sketch role stopped: bad partitions", True)
    assert failure_line("align", KeyError("x"), kc) == (
        "align role stopped: unexpected KeyError: 'x'", False)
    line, known = failure_line("sketch", TopicAuthorizationFailedError("matches"), kc)
    assert known and line.startswith(
        "sketch role stopped: Kafka refused a topic (matches) to user 'sketcher': "
        "TopicAuthorizationFailedError, no ACL allows it; grant the ACLs `dupalign acls")
    assert "s3cret" not in line


async def test_transactions_are_counted_by_outcome() -> None:
    m = RoleMetrics()
    async with m.transaction("align"):
        pass
    with pytest.raises(RuntimeError):
        async with m.transaction("align"):
            raise RuntimeError("broker gone")
    get = m.registry.get_sample_value
    assert get("dupalign_role_transactions_total", {"role": "align", "outcome": "commit"}) == 1
    assert get("dupalign_role_transactions_total", {"role": "align", "outcome": "abort"}) == 1
