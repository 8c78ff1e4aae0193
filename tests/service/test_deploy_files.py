"""What compose and the Kubernetes manifests assume about the image, the worker and each
other, checked where no cluster or registry is at hand: the configurations load with the
worker's own loader, and ports, paths, users and mounts agree across the files. (The image
itself is run by test_container.py, Prometheus and the dashboard by test_ops_prometheus.py.)"""

from __future__ import annotations

import json
import re
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from dupalign.config import EngineConfig
from dupalign.service.config import load_config

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def load_yaml(name: str) -> Any:
    return yaml.safe_load((DEPLOY / name).read_text())


def dockerfile_cmd() -> list[str]:
    lines = re.findall(r"^CMD (\[.*\])$", (DEPLOY / "Dockerfile").read_text(), re.M)
    return list(json.loads(lines[-1]))


def stage_manifests() -> list[str]:
    """The k8s-stages resources that run a role (not its NetworkPolicy)."""
    return [name for name in load_yaml("k8s-stages/kustomization.yaml")["resources"]
            if load_yaml(f"k8s-stages/{name}")["kind"] in ("Deployment", "StatefulSet")]


def probed_and_scraped(pod: Any, container: Any, port_number: int, name: str) -> None:
    """The pod's container serves the metrics port, Prometheus is told to scrape it, and the
    probes ask /healthz and /readyz there."""
    (port,) = container["ports"]
    assert port["containerPort"] == port_number, name
    assert pod["metadata"]["annotations"] == {"prometheus.io/scrape": "true",
                                              "prometheus.io/port": str(port_number)}
    for probe, path in (("startupProbe", "/healthz"), ("livenessProbe", "/healthz"),
                        ("readinessProbe", "/readyz")):
        assert container[probe]["httpGet"] == {"path": path, "port": port["name"]}, name


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_shipped_configurations_load(tmp_path: Path) -> None:
    compose = load_config(DEPLOY / "dupalign.toml", env={})
    configmap = tmp_path / "configmap.toml"
    configmap.write_text(load_yaml("k8s/configmap.yaml")["data"]["dupalign.toml"])
    k8s = load_config(configmap, env={})
    for config in (compose, k8s):
        assert config.metrics.port == 9464 and config.metrics.host == "0.0.0.0"


def test_kubernetes_agrees_with_the_image_and_itself() -> None:
    sts = load_yaml("k8s/statefulset.yaml")
    pod = sts["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert container["args"] == dockerfile_cmd()
    uid = re.search(r"useradd --uid (\d+)", (DEPLOY / "Dockerfile").read_text())
    assert uid and pod["spec"]["securityContext"]["runAsUser"] == int(uid.group(1))
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    args = container["args"]
    assert PurePosixPath(flag(args, "--store")).parent == PurePosixPath(mounts["store"])
    assert PurePosixPath(flag(args, "--config")).parent == PurePosixPath(mounts["config"])
    assert {c["metadata"]["name"] for c in sts["spec"]["volumeClaimTemplates"]} == {"store"}
    (port,) = container["ports"]
    service = load_yaml("k8s/service.yaml")
    assert port["containerPort"] == 9464 == service["spec"]["ports"][0]["port"]
    assert service["spec"]["ports"][0]["targetPort"] == port["name"]
    for notes in (pod["metadata"]["annotations"], service["metadata"]["annotations"]):
        assert notes["prometheus.io/port"] == str(port["containerPort"])
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["port"] == port["name"]
    resources = set(load_yaml("k8s/kustomization.yaml")["resources"])
    shipped = {p.name for p in (DEPLOY / "k8s").glob("*.yaml")}
    assert resources == shipped - {"kustomization.yaml", "secret.example.yaml"}


def test_compose_mounts_what_the_services_read() -> None:
    services = load_yaml("docker-compose.yml")["services"]
    worker = services["worker"]
    config_mount = {v.split(":")[1]: v.split(":")[0] for v in worker["volumes"]}
    assert config_mount[flag(dockerfile_cmd(), "--config")] == "./dupalign.toml"
    assert worker["build"]["dockerfile"] == "deploy/Dockerfile"
    # Prometheus: the config and the rules it names (relative paths) in one directory, and
    # the scrape target is the worker service on its metrics port.
    prom = {v.split(":")[0]: v.split(":")[1] for v in services["prometheus"]["volumes"]}
    config_in = PurePosixPath(prom["./prometheus/prometheus.yml"])
    prom_config = load_yaml("prometheus/prometheus.yml")
    for rule_file in prom_config["rule_files"]:
        assert str(config_in.parent / rule_file) in prom.values(), rule_file
    (job,) = prom_config["scrape_configs"]
    port = load_config(DEPLOY / "dupalign.toml", env={}).metrics.port
    assert job["static_configs"][0]["targets"] == [f"worker:{port}"]
    # Grafana: the provisioned dashboard folder is where the dashboards are mounted, and the
    # datasource is the prometheus service.
    grafana = {v.split(":")[0]: v.split(":")[1] for v in services["grafana"]["volumes"]}
    (provider,) = load_yaml("grafana/provisioning/dashboards/dupalign.yml")["providers"]
    assert grafana["./grafana/dashboards"] == provider["options"]["path"]
    (source,) = load_yaml("grafana/provisioning/datasources/prometheus.yml")["datasources"]
    assert source["url"] == "http://prometheus:9090" and "prometheus" in services


def test_every_kubernetes_pod_runs_the_local_image_without_pulling_it() -> None:
    """``dupalign:latest`` is built locally (deploy/README.md); with a ``:latest`` tag and no
    imagePullPolicy, Kubernetes pulls it at every start, from a registry that has none."""
    folders: set[str] = set()
    for path in sorted(DEPLOY.glob("k8s*/*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            pod = (doc or {}).get("spec", {}).get("template", {}).get("spec")
            if pod is None:
                continue
            for container in pod.get("initContainers", []) + pod["containers"]:
                where = f"{path.relative_to(DEPLOY)}: {container['name']}"
                assert container["image"] == "dupalign:latest", where
                assert container.get("imagePullPolicy") == "IfNotPresent", where
            folders.add(path.parent.name)
    assert folders == {p.name for p in DEPLOY.glob("k8s*") if p.is_dir()}


SASL_KEYS = ("security_protocol", "sasl_mechanism", "sasl_password_file", "ssl_cafile")


@pytest.mark.parametrize("config", ["k8s/configmap.yaml", "k8s-stages/stages.toml"])
def test_the_kubernetes_sasl_settings_read_the_mounted_secret(config: str, tmp_path: Path
                                                              ) -> None:
    """Uncommented, the SASL lines of the shipped configs load with the worker's loader and
    read the password and the CA from where every pod mounts its Secret."""
    text = (load_yaml(config)["data"]["dupalign.toml"] if config.endswith(".yaml")
            else (DEPLOY / config).read_text())
    on = re.sub(rf"^(\s*)# ({'|'.join(SASL_KEYS)}) = ", r"\1\2 = ", text, flags=re.M)
    assert on.count("/run/secrets/kafka/") == 2, "the password and CA files"
    (tmp_path / "password").write_text("from-the-secret\n")
    (tmp_path / "ca.crt").write_text("a CA\n")
    path = tmp_path / "config.toml"
    path.write_text(on.replace("/run/secrets/kafka/", f"{tmp_path}/"))
    kafka = load_config(path, env={"DUPALIGN_KAFKA_SASL_PLAIN_USERNAME": "sketch"}).kafka
    assert (kafka.security_protocol, kafka.sasl_mechanism) == ("SASL_SSL", "SCRAM-SHA-512")
    assert kafka.sasl_plain_password == "from-the-secret"
    pods = ([("k8s/statefulset.yaml", "dupalign-kafka")] if config.startswith("k8s/") else
            [(f"k8s-stages/{n}", None) for n in stage_manifests()])
    for name, secret in pods:
        spec = load_yaml(name)["spec"]["template"]["spec"]
        (container,) = spec["containers"]
        role = name.rsplit("/", 1)[-1].removesuffix(".yaml")
        secret = secret or f"dupalign-kafka-stage-{role}"  # each role its own user
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert mounts["kafka-secret"] == "/run/secrets/kafka", name
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["kafka-secret"]["secret"]["secretName"] == secret, name
        env = {e["name"]: e for e in container["env"]}
        assert env["DUPALIGN_KAFKA_SASL_PLAIN_USERNAME"]["valueFrom"]["secretKeyRef"][
            "name"] == secret, name
        assert spec["securityContext"]["fsGroup"] == 10001, name  # reads the 0440 files


@pytest.mark.parametrize("folder", ["k8s", "k8s-stages"])
def test_only_prometheus_reaches_the_metrics_port(folder: str) -> None:
    assert "networkpolicy.yaml" in load_yaml(f"{folder}/kustomization.yaml")["resources"]
    policy = load_yaml(f"{folder}/networkpolicy.yaml")
    config = (load_yaml("k8s/configmap.yaml")["data"]["dupalign.toml"] if folder == "k8s"
              else (DEPLOY / folder / load_yaml(f"{folder}/kustomization.yaml")[
                  "configMapGenerator"][0]["files"][0]).read_text())
    port = int(re.search(r"^port = (\d+)", config, re.M).group(1))  # type: ignore[union-attr]
    assert policy["spec"]["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "dupalign"}}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": port}]
    assert rule["from"][0]["podSelector"] == {
        "matchLabels": {"app.kubernetes.io/name": "prometheus"}}


def stage_parser() -> Any:
    """``dupalign stage``'s parser."""
    import argparse

    from dupalign.service.kafka_args import add_stage_arguments

    parser = argparse.ArgumentParser()
    add_stage_arguments(parser)
    return parser


def test_the_stage_manifests_run_every_role_with_the_shape_of_one_config() -> None:
    """Compose and Kubernetes run every stage role (one service or workload each, its
    replicas the copies, at most the stage's partitions), each with args ``dupalign stage``
    takes, the one config that holds the shape mounted where the args say, a store for
    every role but sketch, scraped and probed on the port the config serves."""
    from dupalign.service.kafka_args import STAGE_ROLES
    from dupalign.service.roles.stage_command import parse_stage_roles
    from dupalign.service.stage_topics import StageTopics
    from dupalign.stages.partitioned import Shape

    config = load_config(DEPLOY / "k8s-stages" / "stages.toml", env={})
    # (the default 1 MB records: what is larger goes in parts, docs/pipeline.md)
    assert config.kafka.create_topics and config.kafka.max_request_size == 1 << 20
    # the engine's defaults: idf tables learned, so the learner runs among the roles below
    assert config.engine.near.idf_freeze_at == EngineConfig().near.idf_freeze_at
    metrics = config.metrics
    assert metrics.enabled and metrics.host == "0.0.0.0"
    topics = StageTopics(config.kafka, Shape.parse(config.kafka.shape))
    parser = stage_parser()

    def most(role: str) -> int:  # the copies of a role that get work
        return 10_000 if role == "sketch" else topics.partitions(role)

    # Kubernetes
    kustomization = load_yaml("k8s-stages/kustomization.yaml")
    (generated,) = kustomization["configMapGenerator"]
    assert generated["files"] == ["stages.toml"]
    assert set(kustomization["resources"]) == {
        p.name for p in (DEPLOY / "k8s-stages").glob("*.yaml")} - {"kustomization.yaml"}
    kinds: dict[str, str] = {}
    for name in stage_manifests():
        doc = load_yaml(f"k8s-stages/{name}")
        pod = doc["spec"]["template"]
        (container,) = pod["spec"]["containers"]
        assert container["args"][0] == "stage", name
        args = parser.parse_args(container["args"][1:])
        (role,) = parse_stage_roles(args.roles)
        assert name == f"{role}.yaml" and role not in kinds
        kinds[role] = doc["kind"]
        assert 1 <= doc["spec"]["replicas"] <= most(role), name
        mount = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert args.config == f"{mount['config']}/stages.toml" and args.shape is None, name
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert volumes["config"]["configMap"]["name"] == generated["name"], name
        assert (args.store is not None) == (role != "sketch"), name
        if args.store is not None:
            assert args.store.startswith(mount["store"] + "/"), name
        probed_and_scraped(pod, container, metrics.port, name)
    assert kinds == {r: "Deployment" if r == "sketch" else "StatefulSet" for r in STAGE_ROLES}
    # compose: a service per role, named after it (Prometheus finds its replicas by name)
    services = load_yaml("docker-compose.stages.yml")["services"]
    running = {}
    for name, service in services.items():
        if service.get("command", [""])[0] != "stage":
            continue
        args = parser.parse_args(service["command"][1:])
        (role,) = parse_stage_roles(args.roles)
        assert name == role and 1 <= service["deploy"]["replicas"] <= most(role), name
        mounts = {v.split(":")[1]: v.split(":")[0] for v in service["volumes"]}
        assert mounts[args.config] == "./k8s-stages/stages.toml" and args.shape is None, name
        assert (args.store is not None) == (role != "sketch"), name
        assert service["environment"]["DUPALIGN_KAFKA_BOOTSTRAP_SERVERS"] == "kafka:9092"
        running[name] = role
    assert sorted(running.values()) == sorted(STAGE_ROLES)
    assert services["sketch"]["build"]["dockerfile"] == "deploy/Dockerfile"
    prom = {v.split(":")[0]: v.split(":")[1] for v in services["prometheus"]["volumes"]}
    assert prom["./prometheus/prometheus.stages.yml"] == "/etc/prometheus/prometheus.yml"
    (job,) = load_yaml("prometheus/prometheus.stages.yml")["scrape_configs"]
    (dns,) = job["dns_sd_configs"]
    assert set(dns["names"]) == set(running) and dns["port"] == metrics.port
    grafana = {v.split(":")[0]: v.split(":")[1] for v in services["grafana"]["volumes"]}
    (provider,) = load_yaml("grafana/provisioning/dashboards/dupalign.yml")["providers"]
    assert grafana["./grafana/dashboards"] == provider["options"]["path"]


def test_the_stages_dashboard_plots_every_metric_of_the_stage_roles_and_only_those() -> None:
    """Every series a stage role exports (the roles' records, bytes, transactions,
    partitions, the stage partitions' ordinals, the outage) is on a panel, per role; no
    panel asks for one the stage roles do not export."""
    from dupalign.service.roles.metrics import RoleMetrics

    exposed = {f.name + ("_total" if f.type == "counter" else "")
               for f in RoleMetrics().registry.collect()}
    dashboard = dict(json.loads((DEPLOY / "grafana/dashboards/dupalign-stages.json")
                                .read_text()))
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    used = {name for e in exprs for name in re.findall(r"\bdupalign_\w+", e)}
    assert used - exposed == set(), "panels query metrics the stage roles do not expose"
    assert exposed - used == set(), "stage role metrics no panel shows"
    assert any("by (role, partition)" in e for e in exprs)
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
