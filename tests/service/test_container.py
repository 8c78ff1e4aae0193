"""deploy/Dockerfile built with podman from a Debian base image made of Debian packages
(deploy/container/base-image.sh, no registry needed) and run on the host network against the
test broker, with compose's configuration (deploy/dupalign.toml mounted, the Kafka address
and topics from the environment): it consumes pages, publishes the same matches as the
embedded engine with that configuration, sends malformed input to the DLQ, answers its
health check and stops cleanly on SIGTERM.

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
from tests.service.test_worker_kafka import Topics, match_key, wait_for

pytestmark = [pytest.mark.container, pytest.mark.kafka]

REPO = Path(__file__).resolve().parents[2]
CONTAINER_DIR = REPO / "deploy" / "container"
IMAGE = "localhost/dupalign:test"
COMPOSE_CONFIG = REPO / "deploy" / "dupalign.toml"


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
