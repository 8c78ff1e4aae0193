"""deploy/Dockerfile built with podman from a Debian base image made of Debian packages
(deploy/container/base-image.sh, no registry needed) and run on the host network against the
test broker, with compose's configuration (deploy/dupalign.toml mounted, the Kafka address
and topics from the environment): it consumes pages, publishes the same matches as the
embedded engine with that configuration, sends malformed input to the DLQ, answers its
health check and stops cleanly on SIGTERM. And the topology of
deploy/docker-compose.topology.yml from the same image: 2 sketch, 2 index (an owner and a
standby) and 2 align containers with deploy/k8s-topology/topology.toml give the matches of
``scan`` over the pages in ``sequence`` order.

Minutes of work (base image ~1 min once, image build ~3 min when the sources changed), so
marked ``container``: runs only with DUPALIGN_CONTAINER_TESTS=1 (see conftest.py)."""

from __future__ import annotations

import collections
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from dupalign.runtime.engine import Engine
from dupalign.service.config import load_config
from dupalign.wire import messages
from tests.service.test_ops_prometheus import free_port, http_get, pages_for_round
from tests.service.test_worker_kafka import Topics, clough_pages, match_key, wait_for
from tests.topology_harness import Topology, rfc_pages

pytestmark = [pytest.mark.container, pytest.mark.kafka]

REPO = Path(__file__).resolve().parents[2]
CONTAINER_DIR = REPO / "deploy" / "container"
IMAGE = "localhost/dupalign:test"
COMPOSE_CONFIG = REPO / "deploy" / "dupalign.toml"
TOPOLOGY_CONFIG = REPO / "deploy" / "k8s-topology" / "topology.toml"


def run(cmd: list[str], timeout: float, what: str) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False,
                          cwd=REPO)
    assert proc.returncode == 0, (
        f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n"
        f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc.stdout.strip()


@pytest.fixture(scope="module")
def image() -> tuple[str, list[str]]:
    """The worker image and the podman arguments this host needs."""
    missing = [t for t in ("podman", "mmdebstrap") if shutil.which(t) is None]
    if missing:
        pytest.fail(f"container tests need {missing} (apt-get install podman mmdebstrap runc)",
                    pytrace=False)
    base = run(["bash", str(CONTAINER_DIR / "base-image.sh")], 900, "base image")
    args = run(["bash", str(CONTAINER_DIR / "podman-args.sh")], 30, "podman-args.sh").split()
    run(["podman", "build", *args, "--network", "host", "--pull=never", "--format", "docker",
         "--build-arg", f"BASE_IMAGE={base}", "-f", "deploy/Dockerfile",
         "--ignorefile", "deploy/Dockerfile.dockerignore", "-t", IMAGE, "."],
        1800, "podman build")
    return IMAGE, args


async def test_image_consumes_pages_and_publishes_matches(
    image: tuple[str, list[str]], kafka_bootstrap: str, tmp_path: Path
) -> None:
    tag, args = image
    topics = await Topics(kafka_bootstrap, partitions=1).create()
    port = free_port()
    env = {"DUPALIGN_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
           "DUPALIGN_KAFKA_INPUT_TOPIC": topics.pages,
           "DUPALIGN_KAFKA_OUTPUT_TOPIC": topics.matches, "DUPALIGN_KAFKA_DLQ_TOPIC": topics.dlq,
           "DUPALIGN_KAFKA_GROUP_ID": topics.group, "DUPALIGN_METRICS_PORT": str(port)}
    name = f"dupalign-test-{uuid.uuid4().hex[:8]}"
    run(["podman", "run", "-d", "--name", name, *args, "--network", "host",
         *[f"--env={k}={v}" for k, v in env.items()],
         "-v", f"{COMPOSE_CONFIG}:/etc/dupalign/dupalign.toml:ro", tag], 120, "podman run")
    pages = pages_for_round(0) + pages_for_round(1)
    try:
        await topics.send(pages)
        await topics.send_raw([(b"bad", b"\xc1 not msgpack")])

        async def all_committed() -> bool:
            state = run(["podman", "inspect", "-f", "{{.State.Status}}", name], 30, "inspect")
            assert state == "running", run(["podman", "logs", name], 30, "logs")
            return await topics.committed_total() == len(pages) + 1
        await wait_for(all_committed, 180, "every message consumed and committed")
        # The image's own HEALTHCHECK command, run inside the container.
        run(["podman", "healthcheck", "run", name], 60, "the image's health check")
        status, metrics = http_get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200 and 'dupalign_pages_total{outcome="processed"} 8.0' in metrics
        run(["podman", "stop", "-t", "60", name], 120, "podman stop")  # SIGTERM
        exit_code = run(["podman", "inspect", "-f", "{{.State.ExitCode}}", name], 30, "inspect")
        assert exit_code == "0", run(["podman", "logs", name], 30, "logs")
    finally:
        subprocess.run(["podman", "rm", "-f", "-v", name], capture_output=True, timeout=120,
                       check=False)
    published = [match_key(messages.decode_match(r.value))
                 for r in await topics.read(topics.matches)]
    engine_config = load_config(COMPOSE_CONFIG, env={}).engine
    with Engine.open(tmp_path / "embedded", engine_config) as engine:
        expected = [match_key(m.to_dict(0)) for page in pages for m in engine.process(page)]
    assert {k[1] for k in expected} == {"exact", "near", "passage"}
    assert collections.Counter(published) == collections.Counter(expected)
    dead = [messages.decode_dead_letter(r.value) for r in await topics.read(topics.dlq)]
    assert [d["error"] for d in dead] == ["not_msgpack"]


def topology_env(topo: Topology) -> dict[str, str]:
    """The environment that points compose's topology.toml at this test's broker and topics:
    every ``*_topic`` key, the group, and the partition counts the roles check."""
    kafka = topo.config.kafka
    env = {"DUPALIGN_KAFKA_BOOTSTRAP_SERVERS": topo.bootstrap,
           "DUPALIGN_KAFKA_GROUP_ID": kafka.group_id,
           "DUPALIGN_KAFKA_ALIGN_PARTITIONS": str(kafka.align_partitions),
           "DUPALIGN_KAFKA_INDEX_SHARDS": str(kafka.index_shards)}
    env.update({f"DUPALIGN_KAFKA_{name.upper()}": str(value)
                for name, value in vars(kafka).items() if name.endswith("_topic")})
    return env


@pytest.mark.testdata
async def test_the_compose_topology_from_the_image_gives_the_matches_of_scan(
    image: tuple[str, list[str]], kafka_bootstrap: str, tmp_path: Path
) -> None:
    tag, args = image
    topo = await Topology(kafka_bootstrap, tmp_path).create()
    env = topology_env(topo)
    # as the compose file runs them: each role with its command; index stores on volumes
    roles = [("sketch", None), ("sketch", None), ("index", "a"), ("index", "b"),
             ("align", None), ("align", None)]
    names: list[str] = []
    try:
        for role, store in roles:
            name = f"dupalign-{role}-{uuid.uuid4().hex[:8]}"
            volume: list[str] = []
            command = ["worker", "--roles", role]
            if store is not None:
                data = tmp_path / f"index-{store}"
                data.mkdir()
                data.chmod(0o777)  # the image runs as its own user
                volume = ["-v", f"{data}:/data"]
                command += ["--store", "/data/store"]
            command += ["--config", "/etc/dupalign/topology.toml"]
            port_env = {"DUPALIGN_METRICS_PORT": str(free_port())}
            run(["podman", "run", "-d", "--name", name, *args, "--network", "host",
                 *[f"--env={k}={v}" for k, v in {**env, **port_env}.items()], *volume,
                 "-v", f"{TOPOLOGY_CONFIG}:/etc/dupalign/topology.toml:ro", tag, *command],
                120, f"podman run ({role})")
            names.append(name)
        corpus = clough_pages() + rfc_pages(max_bytes=200_000)
        await topo.send(corpus)
        try:
            published = await topo.published(len(corpus), timeout=600)
        except AssertionError as exc:
            logs = "\n".join(f"== {n}\n{run(['podman', 'logs', n], 30, 'logs')[-3000:]}"
                             for n in names)
            raise AssertionError(f"{exc}\n{logs}") from None
        for name in names:  # every role's own health check, from inside its container
            run(["podman", "healthcheck", "run", name], 60, f"health check of {name}")
        for name in names:
            run(["podman", "stop", "-t", "60", name], 120, "podman stop")  # SIGTERM
            code = run(["podman", "inspect", "-f", "{{.State.ExitCode}}", name], 30, "inspect")
            assert code == "0", run(["podman", "logs", name], 30, "logs")
    finally:
        for name in names:
            subprocess.run(["podman", "rm", "-f", "-v", name], capture_output=True,
                           timeout=120, check=False)
    expected = await topo.scan_in_sequence_order(tmp_path / "oracle")
    got = collections.Counter(match_key(messages.decode_match(r.value)) for r in published)
    assert sum(1 for k in expected if k[1] == "passage") > 10
    assert got == expected
