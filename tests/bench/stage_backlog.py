"""bench_stage_roles ``--backlog``: what each stage role costs when its input is already there,
as it would be at 10^3-10^4 pages/s (issue 43): the cost at saturation, with turns as large as
the role makes them, which a burst on this 2-core machine never reaches (every stage there
runs beside the others and takes what its upstream committed since its last turn).

The roles are started and warmed up as for the burst (``--warm`` pages through all of them),
then every role process is stopped (SIGSTOP: a process keeps its kernels, its stores and its
partitions, the groups' sessions being longer than the run), every measured page is sent to
the input topic, and the roles run one group at a time in upstream order (``GROUPS``), each
continued until every partition of its stages has applied every page (``Applied``) and its
changelogs have been quiet for ``QUIET_S``, then stopped again: its CPU over that time less
its idle rate (measured for ``IDLE_S`` after) times it, per page. Roles that feed each other
run together: the combine and align (align's answers come back to the combine). The learner
runs before the routers: they wait for its freezes, it waits for nothing of theirs.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

from aiokafka import TopicPartition

from dupalign.service.config import load_config
from dupalign.service.sequence_batch import SequenceBatch
from dupalign.service.stage_topics import StageTopics
from dupalign.service.topology import ensure_topics, record_ordinal
from tests.bench import stage_setup
from tests.bench.stage_setup import ROLES, Applied, Setup
from tests.role_processes import check_alive, read_topic, stop_all

# run one after the other, in upstream order; a group's roles together
GROUPS = (("sketch",), ("directory",), ("exact",), ("learner",), ("router",), ("near",),
          ("lists",), ("combine", "align"))
IDLE_S = 3.0  # a group's idle CPU measured this long once it is done
LONG_SESSION = """session_timeout_ms = 1800000
max_poll_interval_ms = 3600000"""


class BacklogSetup(Setup):
    """``Setup`` whose groups keep a stopped member for the whole run (the broker's
    group.max.session.timeout.ms: 30 min by default), so continuing it moves nothing."""

    def __init__(self, bootstrap: str, tmp: Path, partitions: int, copies: int, batch: int,
                 engine: str = stage_setup.ENGINE) -> None:
        super().__init__(bootstrap, tmp, partitions, copies, batch, engine)
        text = self.config_path.read_text("utf-8")
        assert "session_timeout_ms = 6000" in text
        self.config_path.write_text(text.replace("session_timeout_ms = 6000", LONG_SESSION),
                                    "utf-8")
        self.config = load_config(self.config_path, env={})
        self.kc = self.config.kafka
        self.topics = StageTopics(self.kc, self.shape)

    def signal(self, roles: tuple[str, ...], sig: signal.Signals) -> None:
        for role in roles:
            for proc, _ in self.of(role):
                os.kill(proc.pid, sig)

    async def sequenced(self) -> tuple[int, int]:
        """The pages sequenced so far, and those dead-lettered."""
        bootstrap, kc = self.kc.bootstrap_servers, self.kc
        batches = await read_topic(bootstrap, self.topics.batches, 1)
        dead = await read_topic(bootstrap, kc.dlq_topic, kc.topic_partitions)
        return sum(SequenceBatch.from_bytes(r.value).n for r in batches), len(dead)

    async def group_done(self, group: tuple[str, ...], n_pages: int, applied: Applied,
                         timeout: float = 1800) -> int:
        """Once the sketch role has sequenced (or dead-lettered) every page, or every
        partition of the group's stages has applied every page sequenced and their
        changelogs got no record for ``QUIET_S``: the pages sequenced."""
        deadline = time.monotonic() + timeout
        tps = [TopicPartition(self.topics.changelog(role), p) for role in group
               if role != "sketch" for p in range(self.topics.partitions(role))]
        while True:
            check_alive(self.procs)
            sequenced, dead = await self.sequenced()
            if not tps:
                if sequenced + dead == n_pages:
                    return sequenced
            else:
                await applied.lowest()
                last = max(applied.seen.get(tp, 0.0) for tp in tps)
                if (min(applied.at[tp] for tp in tps) == sequenced
                        and time.monotonic() - last > stage_setup.QUIET_S):
                    return sequenced
            if time.monotonic() > deadline:
                raise TimeoutError(f"{group} not done: {applied.at}")
            await asyncio.sleep(0.5)


async def measure_backlog(bootstrap: str, tmp: Path, pages: list[Any], partitions: int,
                          copies: int, batch: int, warm: int = 0,
                          engine: str = stage_setup.ENGINE, profile: Path | None = None
                          ) -> dict[str, Any]:
    """``pages[:warm]`` through every role first, then the rest as a backlog: each group
    of roles alone on it in turn (module docstring). A row as ``measure``'s, with each
    group's seconds. ``profile``: each group's processes sampled by py-spy while it runs
    (``stage_setup.spied``: DIR/p<partitions>-<role>-<i>.txt); its CPU figures are then
    not to be quoted."""
    setup = BacklogSetup(bootstrap, tmp, partitions, copies, batch, engine)
    await ensure_topics(setup.kc, setup.topics.wanted())
    applied = Applied(setup)
    cpu: dict[str, float] = {}
    seconds: dict[str, float] = {}  # by role: its group's
    total_s, until = 0.0, 0
    try:
        setup.start_all()
        await setup.started()
        await applied.start()
        if warm:
            await setup.send(pages[:warm])
            await setup.done(warm, applied)
        since = await applied.lowest()
        taken = stage_setup.moves(setup)
        setup.signal(ROLES, signal.SIGSTOP)
        await setup.send(pages[warm:])
        for group in GROUPS:
            before, t0 = setup.cpu(), time.monotonic()
            setup.signal(group, signal.SIGCONT)
            spies = [] if profile is None else stage_setup.spied(
                [pl for role in group for pl in setup.of(role)], profile, f"p{partitions}")
            until = await setup.group_done(group, len(pages), applied)
            for spy in spies:
                spy.send_signal(signal.SIGINT)  # (it writes its file and exits)
            for spy in spies:
                spy.wait(60)
            took = time.monotonic() - t0
            after = setup.cpu()
            await asyncio.sleep(IDLE_S)
            idle = setup.cpu()
            setup.signal(group, signal.SIGSTOP)
            for role in group:
                rate = (idle[role] - after[role]) / IDLE_S
                cpu[role] = after[role] - before[role] - rate * took
                seconds[role] = took - (0.0 if group == ("sketch",) else stage_setup.QUIET_S)
            total_s += seconds[group[0]]
        setup.signal(ROLES, signal.SIGCONT)
        got = await setup.done(len(pages), applied)
        moved = stage_setup.moves(setup) - taken
    finally:
        setup.signal(ROLES, signal.SIGCONT)
        stop_all(setup.procs)
        await applied.consumer.stop()
    n = len(pages) - warm
    logs = await stage_setup.changelogs(setup)
    turned = stage_setup.turns(logs, got["batches"], since, until)
    return {"partitions": partitions, "copies": copies, "mode": "backlog", "pages": n,
            "seconds": total_s, "group_seconds": seconds, "moved": moved,
            "waiting": len({record_ordinal(r) for r in got["align"]}),
            "published": len({record_ordinal(r) for r in got["matches"]}),
            "cpu_ms": {r: 1000 * cpu[r] / n for r in ROLES}, "turns": turned,
            "transactions": {role: len(turned[role]) / n for role in ROLES[1:]},
            "bytes": {t: sum(len(r.value or b"") for r in recs) / n for t, recs in got.items()},
            "changelog_bytes": {f"{t} changelog": sum(len(r.key or b"") + len(r.value or b"")
                                                      for r in recs) / n
                                for t, recs in logs.items()}}


def backlog_table(rows: list[dict[str, Any]], single: dict[str, Any] | None) -> str:
    """Each role's CPU per page and transactions per page, burst and backlog side by side,
    and each whole against the single worker."""
    roles = list(ROLES)
    base = single["cpu_ms"] if single else float("nan")
    lines = ["CPU ms per page of each role, burst (every role at once) and backlog (each "
             "group alone on its whole input); the whole against the single worker, same pages",
             "| setup | mode | " + " | ".join(roles) + " | all roles | vs single |",
             "|---|---|" + "---|" * (len(roles) + 2)]
    if single:
        lines.append("| single worker | burst | " + " | ".join("" for _ in roles)
                     + f" | {base:.2f} | 1.00 |")
    for r in rows:
        total = sum(r["cpu_ms"].values())
        lines.append(f"| {r['partitions']} × {r['copies']} | {r.get('mode', 'burst')} | "
                     + " | ".join(f"{r['cpu_ms'][role]:.2f}" for role in roles)
                     + f" | {total:.2f} | {total / base:.2f} |")
    stages = roles[1:]
    lines += ["", "transactions per page of each stage (all its partitions, the pages measured)",
              "| setup | mode | " + " | ".join(stages) + " |", "|---|---|" + "---|" * len(stages)]
    lines += [f"| {r['partitions']} × {r['copies']} | {r.get('mode', 'burst')} | "
              + " | ".join(f"{r['transactions'][s]:.2f}" for s in stages) + " |" for r in rows]
    timed = [r for r in rows if "group_seconds" in r]
    if timed:
        lines += ["", "backlog: pages/s of each group while it ran alone (the combine and align "
                  "together)", "| setup | " + " | ".join(roles) + " |",
                  "|---|" + "---|" * len(roles)]
        lines += [f"| {r['partitions']} × {r['copies']} | " + " | ".join(
            f"{r['pages'] / max(r['group_seconds'][role], 1e-9):.0f}" for role in roles) + " |"
            for r in timed]
    return "\n".join(lines)
