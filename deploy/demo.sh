#!/usr/bin/env bash
# The real thing, locally: start a single-node Kafka broker (official Maven Central jars),
# create the topics, publish the demo corpus shipped in demo/ (LLVM documentation pages of two
# releases, RFCs that rewrite earlier ones, a small WARC crawl) to `pages`, run the worker,
# print matches from `matches` as they arrive, then stop everything cleanly.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
work=${DUPALIGN_DEMO_DIR:-$here/var/demo}
bin=$here/.venv/bin
demo=$here/demo
rm -rf "$work/store" "$work/kafka"; mkdir -p "$work"

worker_pid=""
cleanup() {
  if [[ -n "$worker_pid" ]] && kill -0 "$worker_pid" 2>/dev/null; then
    kill -TERM "$worker_pid"; wait "$worker_pid" || true
  fi
  bash "$here/deploy/kafka/broker.sh" stop "$work/kafka" >/dev/null 2>&1 || true
}
trap cleanup EXIT

bootstrap=$(bash "$here/deploy/kafka/broker.sh" start "$work/kafka")
echo "demo: broker at $bootstrap"

# Topics exist and the group coordinator answers before any client uses them: otherwise the
# worker's first metadata and group requests log errors while the broker creates them.
"$bin/python" - "$bootstrap" <<'PY'
import asyncio, logging, sys
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # the coordinator is expected late

async def main(bootstrap: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(t, 1, 1) for t in ("pages", "matches", "pages.dlq")])
    finally:
        await admin.close()
    probe = AIOKafkaConsumer("matches", bootstrap_servers=bootstrap, group_id="demo-warm-up")
    await probe.start()  # waits until the group coordinator is available
    await probe.stop()

asyncio.run(main(sys.argv[1]))
PY

"$bin/dupalign" worker --bootstrap "$bootstrap" --store "$work/store" --metrics-port 0 \
  --log-level WARNING &
worker_pid=$!

"$bin/dupalign" produce --bootstrap "$bootstrap" --topic pages --quiet \
  "$demo/llvm-docs" "$demo/rfc" "$demo/web/creativecommons.org.warc.gz"

# Print matches as they arrive; stop 20 s after the last one (or after 5 minutes, or when the
# worker dies). The first match can take a minute: a fresh clone compiles the numba kernels.
echo "demo: waiting for matches (the first run compiles the kernels: about a minute)"
"$bin/python" - "$bootstrap" "$worker_pid" <<'PY'
import asyncio, os, sys, time
import msgpack
from aiokafka import AIOKafkaConsumer

def worker_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False

async def main(bootstrap: str, worker_pid: int) -> None:
    consumer = AIOKafkaConsumer("matches", bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                isolation_level="read_committed", group_id=None)
    await consumer.start()
    n, last, start = 0, time.monotonic(), time.monotonic()
    try:
        while ((n == 0 or time.monotonic() - last < 20) and time.monotonic() - start < 300
               and worker_alive(worker_pid)):
            batch = await consumer.getmany(timeout_ms=1000)
            for records in batch.values():
                for rec in records:
                    m = msgpack.unpackb(rec.value)
                    n += 1
                    last = time.monotonic()
                    spans = m.get("spans") or []
                    extra = f" {len(spans)} span(s)" if spans else ""
                    print(f"{m['kind']:<8} {m['doc_id'][:40]:<40} ~ {m['match_doc_id'][:40]:<40} "
                          f"est={m.get('est_jaccard', 0):.2f}{extra}", flush=True)
    finally:
        await consumer.stop()
    print(f"demo: {n} matches received")
    if n == 0:
        sys.exit("demo: no match arrived" + ("" if worker_alive(worker_pid) else
                                            " (the worker stopped: see its log above)"))

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
PY
