"""The ops stack run for real: Prometheus and promtool from Debian's package (the
``prometheus_bin`` fixture, deploy/prometheus/install.sh) check deploy/prometheus, unit-test
every alert on recorded series (tests/prometheus/alerts_test.yml), scrape a live worker over
the real broker and answer every query of the Grafana dashboards."""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from dupalign.page import Page
from tests.service.test_worker_kafka import Topics

REPO = Path(__file__).resolve().parents[2]
PROM_DIR = REPO / "deploy" / "prometheus"
ALERTS_TEST = Path(__file__).resolve().parents[1] / "prometheus" / "alerts_test.yml"
# The single worker's dashboards; the stage roles' series are queried in
# test_stage_command_kafka.py.
DASHBOARDS = sorted(p for p in (REPO / "deploy" / "grafana" / "dashboards").glob("*.json")
                    if p.name != "dupalign-stages.json")
JOB = "dupalign-worker"  # the scrape job in prometheus.yml; the alerts select on it
MESSAGES_PER_ROUND = 5  # pages_for_round: four pages and one malformed message


def promtool(prometheus_bin: Path, *args: str) -> str:
    proc = subprocess.run([str(prometheus_bin / "promtool"), *args], capture_output=True,
                          text=True, timeout=120, check=False, cwd=REPO)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"promtool {' '.join(args)} failed:\n{output}"
    return output


def test_promtool_check_config(prometheus_bin: Path) -> None:
    out = promtool(prometheus_bin, "check", "config", str(PROM_DIR / "prometheus.yml"))
    assert "1 rule files found" in out  # alerts.yml is found beside it


def test_promtool_check_stages_config(prometheus_bin: Path) -> None:
    promtool(prometheus_bin, "check", "config", str(PROM_DIR / "prometheus.stages.yml"))


def test_promtool_check_rules(prometheus_bin: Path) -> None:
    promtool(prometheus_bin, "check", "rules", str(PROM_DIR / "alerts.yml"))


def test_promtool_test_rules(prometheus_bin: Path) -> None:
    promtool(prometheus_bin, "test", "rules", str(ALERTS_TEST))


def test_every_alert_has_a_firing_and_a_silent_case() -> None:
    alerts = {rule["alert"] for group in yaml.safe_load((PROM_DIR / "alerts.yml").read_text())
              ["groups"] for rule in group["rules"] if "alert" in rule}
    fires, silent = set(), set()
    for case in yaml.safe_load(ALERTS_TEST.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            (fires if check.get("exp_alerts") else silent).add(check["alertname"])
    assert alerts, "no alerts in alerts.yml"
    assert not alerts - fires, f"alerts never made to fire in {ALERTS_TEST}: {alerts - fires}"
    assert not alerts - silent, f"alerts never checked silent in {ALERTS_TEST}: {alerts - silent}"
    assert not (fires | silent) - alerts, "cases for alerts that alerts.yml does not define"


# --- a live Prometheus scraping a live worker ------------------------------------------------


def pages_for_round(r: int) -> list[Page]:
    """Real text (this repository's README) shaped to give every kind of match: a page, an
    exact copy, a copy without its last word (near: a few simhash bits away, more edits can
    exceed the Hamming bound) and another text quoting a passage of it."""
    words = (REPO / "README.md").read_text("utf-8").split()
    other = (REPO / "deploy" / "README.md").read_text("utf-8").split()
    assert len(words) >= 1400 and len(other) >= 600, "the READMEs are too short for this test"
    base = words[r * 700:(r + 1) * 700]
    last_word = max(i for i, w in enumerate(base) if any(c.isalnum() for c in w))
    edited = base[:last_word] + base[last_word + 1:]
    quoting = other[:300] + base[200:400] + other[300:600]
    return [Page(f"r{r}-{name}", " ".join(text)) for name, text in
            (("base", base), ("copy", base), ("edited", edited), ("quoting", quoting))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str, timeout: float = 5) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


@dataclass
class LiveStack:
    prometheus: str  # http://127.0.0.1:port
    worker: str
    instance: str  # the worker's `instance` label
    logs: dict[str, Path]

    def api(self, path: str, **params: str) -> Any:
        status, body = http_get(f"{self.prometheus}/api/v1/{path}?"
                                + urllib.parse.urlencode(params))
        assert status == 200, f"Prometheus /api/v1/{path} {params}: {status} {body[:500]}"
        reply = json.loads(body)
        assert reply["status"] == "success", reply
        return reply["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        result = data["result"]
        return result if data["resultType"] == "vector" else [{"metric": {}, "value": result}]

    def value(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def wait(self, predicate: Callable[[], bool], what: str, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                tails = {k: p.read_text(errors="replace")[-3000:] for k, p in self.logs.items()}
                raise AssertionError(f"timed out waiting for {what}; logs: {tails}")
            time.sleep(0.3)


def prometheus_config(target: str) -> str:
    """deploy/prometheus/prometheus.yml with the compose target replaced by the loopback
    worker and 1 s intervals (the test cannot wait for 10 s scrapes)."""
    text = (PROM_DIR / "prometheus.yml").read_text()
    for old, new in (('"worker:9464"', f'"{target}"'),
                     ("scrape_interval: 10s", "scrape_interval: 1s"),
                     ("evaluation_interval: 10s", "evaluation_interval: 1s")):
        assert old in text, f"prometheus.yml changed: {old!r} not found, update this test"
        text = text.replace(old, new)
    return text


def start(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with open(log, "ab") as fh:
        return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.fixture(scope="module")
def live(prometheus_bin: Path, kafka_bootstrap: str,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    """A worker process on the real broker, a Prometheus scraping it with the repository's
    config and rules, and two rounds of input fed with scrapes in between (so that rates and
    histogram quantiles see counters move, not only appear)."""
    tmp = tmp_path_factory.mktemp("ops")
    topics = asyncio.run(Topics(kafka_bootstrap, partitions=2).create())
    _, worker_config = topics.config(tmp)
    worker_port, prom_port = free_port(), free_port()
    instance = f"127.0.0.1:{worker_port}"
    (tmp / "prom").mkdir()
    (tmp / "prom" / "prometheus.yml").write_text(prometheus_config(instance))
    shutil.copy(PROM_DIR / "alerts.yml", tmp / "prom" / "alerts.yml")
    logs = {"worker": tmp / "worker.log", "prometheus": tmp / "prometheus.log"}
    stack = LiveStack(f"http://127.0.0.1:{prom_port}", f"http://{instance}", instance, logs)

    worker = start([sys.executable, "-m", "dupalign.service.worker", "--store", str(tmp / "store"),
                    "--config", str(worker_config)], logs["worker"],
                   env=dict(os.environ, PYTHONUNBUFFERED="1",
                            DUPALIGN_METRICS_PORT=str(worker_port),
                            # every page audited: the audit panels have data
                            DUPALIGN_ENGINE_AUDIT_SAMPLE="1"))
    prometheus = start([str(prometheus_bin / "prometheus"),
                        f"--config.file={tmp / 'prom' / 'prometheus.yml'}",
                        f"--storage.tsdb.path={tmp / 'prom' / 'data'}",
                        f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
                       logs["prometheus"])
    try:
        stack.wait(lambda: http_get(f"{stack.prometheus}/-/ready")[0] == 200, "Prometheus ready")
        stack.wait(lambda: http_get(f"{stack.worker}/readyz")[0] == 200, "worker ready")
        stack.wait(lambda: stack.value(f'up{{job="{JOB}"}}') == 1, "the first scrape")
        for r in range(2):
            asyncio.run(topics.send(pages_for_round(r)))
            asyncio.run(topics.send_raw([(b"bad", b"\xc1 not msgpack")]))
            handled = MESSAGES_PER_ROUND * (r + 1)
            stack.wait(lambda n=handled: stack.value("sum(dupalign_pages_total)") == n,
                       f"{handled} messages handled and scraped")
            time.sleep(2.5)  # a few more scrapes and rule evaluations at this level
        yield stack
    finally:
        stop(worker)
        stop(prometheus)


@pytest.mark.kafka
def test_prometheus_scrapes_the_worker(live: LiveStack) -> None:
    up = live.query(f'up{{job="{JOB}"}}')
    assert [(s["metric"]["instance"], s["value"][1]) for s in up] == [(live.instance, "1")]
    # Every series name the worker exposes is in Prometheus, and the counters agree.
    status, text = http_get(f"{live.worker}/metrics")
    assert status == 200
    exposed = {s.name: s for fam in text_string_to_metric_families(text) for s in fam.samples
               if s.name.startswith("dupalign_")}
    stored = set(live.api("label/__name__/values"))
    assert exposed and not set(exposed) - stored, sorted(set(exposed) - stored)
    for outcome, expected in (("processed", 8), ("rejected", 2)):
        assert live.value(f'dupalign_pages_total{{outcome="{outcome}"}}') == expected
    # The rules loaded, evaluate without error against the real series, and the dead-letter
    # rule (2 of 10 messages were malformed) matches the worker's real names and labels.
    rules = [r for g in live.api("rules")["groups"] for r in g["rules"]]
    assert rules and all(r["health"] == "ok" for r in rules), [
        (r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    states = {a["labels"]["alertname"]: a["state"] for a in live.api("alerts")["alerts"]}
    assert states == {"DupalignDeadLetters": "pending"}, states


def grafana_variables(dashboard: dict[str, Any]) -> dict[str, str]:
    """What Grafana substitutes in the test's setting: every instance ("All"), rate windows
    as Grafana computes them for a 10 s scrape (4 × scrape interval, rounded up to 1m)."""
    values = {"__rate_interval": "1m", "__interval": "15s", "__range": "1h"}
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            assert var.get("includeAll") and var.get("allValue"), f"variable {var['name']}"
            values[var["name"]] = var["allValue"]
    return values


def substitute(expr: str, values: dict[str, str]) -> str:
    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        assert name in values, f"unknown Grafana variable ${name} in {expr}"
        return values[name]
    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)", one, expr)


def dashboard_targets(paths: list[Path] = DASHBOARDS) -> list[tuple[str, str, str]]:
    """(where, the panel's query, the query with Grafana's variables substituted)."""
    out = []
    for path in paths:
        dashboard = json.loads(path.read_text())
        values = grafana_variables(dashboard)
        panels = list(dashboard["panels"])
        for panel in panels:
            panels.extend(panel.get("panels", []))  # collapsed rows hold their panels
            for target in panel.get("targets", []):
                if target.get("expr"):
                    out.append((f"{path.name}: {panel.get('title')}", target["expr"],
                                substitute(target["expr"], values)))
    return out


@pytest.mark.kafka
def test_every_dashboard_query_returns_data(live: LiveStack) -> None:
    targets = dashboard_targets()
    assert len(targets) >= 20, "the dashboard lost its panels?"
    failures = []
    for where, raw, expr in targets:
        result = live.query(expr)
        values = [float(s["value"][1]) for s in result]
        if not values or not all(math.isfinite(v) for v in values):
            failures.append(f"{where}: {raw}\n    -> {values or 'no data'}")
    assert not failures, "dashboard queries without data:\n" + "\n".join(failures)
    # The breakdowns show what was fed: every outcome, match kind and the dead-letter reason.
    by = {label: {s["metric"][label]: float(s["value"][1]) for s in live.query(expr)}
          for label, expr in (
              ("outcome", "sum by (outcome) (rate(dupalign_pages_total[1m]))"),
              ("kind", "sum by (kind) (rate(dupalign_matches_total[1m]))"),
              ("reason", "sum by (reason) (rate(dupalign_dead_letters_total[5m]))"))}
    assert by["outcome"].keys() == {"processed", "rejected"} and min(by["outcome"].values()) > 0
    assert by["kind"].keys() == {"exact", "near", "passage"} and min(by["kind"].values()) > 0
    assert by["reason"].keys() == {"not_msgpack"} and by["reason"]["not_msgpack"] > 0
    # The instance variable's own query (label_values) finds the worker.
    for path in DASHBOARDS:
        for var in json.loads(path.read_text())["templating"]["list"]:
            m = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", var.get("query", ""))
            if m:
                found = live.api(f"label/{m.group(2)}/values", **{"match[]": m.group(1)})
                assert live.instance in found, (var["name"], found)
