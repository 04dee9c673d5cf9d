"""The deployment files in deploy/ agree with the gateway and with each other.

Static checks (no Docker, no cluster): every YAML/JSON parses; the k8s probes hit real
routes; ports agree (Dockerfile EXPOSE = containerPort = config port = scrape target);
shipped configs pass the gateway's own validation; alerts and the dashboard only query
metrics of the /metrics contract; `promtool` checks and unit-tests the alert rules when
it is installed (skip, or fail under SLOTGATE_REQUIRE_ALL=1).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from router.app import create_app
from router.config import parse_config
from tests.support import require_program

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
PROM = DEPLOY / "prometheus"
GRAFANA = DEPLOY / "grafana"

# The /metrics contract: histograms by their base name, without _bucket/_sum/_count.
def _exported_names() -> frozenset[str]:
    """Every metric family the gateway really exports, read off its own registry."""
    from router.telemetry.metrics import Metrics

    names: set[str] = set()
    for family in Metrics().registry.collect():
        names.add(family.name + ("_total" if family.type == "counter" else ""))
    return frozenset(names)


METRICS_CONTRACT: frozenset[str] = _exported_names()

ALERTS = ("SlotgateSlotsSaturated", "SlotgateQueueWaitHigh", "SlotgateRejectionsHigh",
          "SlotgateUpstreamErrors", "SlotgateReplicaDown", "SlotgateTtftObjectiveMissed",
          "SlotgateDown", "SlotgateMetricsAbsent")

METRIC_RE = re.compile(r"\b(?:llm|slotgate)_[a-z_]+")
HISTOGRAM_SUFFIX = re.compile(r"_(?:bucket|sum|count)$")

YAML_FILES = sorted(DEPLOY.rglob("*.yaml")) + sorted(DEPLOY.rglob("*.yml"))
JSON_FILES = sorted(DEPLOY.rglob("*.json"))


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def k8s_docs() -> dict[str, dict[str, Any]]:
    """kind -> the manifest of that kind, over every file of deploy/k8s."""
    docs: dict[str, dict[str, Any]] = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc:
                docs[doc["kind"]] = doc
    return docs


def gateway_container() -> dict[str, Any]:
    pod = k8s_docs()["Deployment"]["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "slotgate"]
    return dict(container)


def dockerfile() -> str:
    return (DEPLOY / "Dockerfile").read_text(encoding="utf-8")


def metric_names(exprs: list[str]) -> set[str]:
    return {HISTOGRAM_SUFFIX.sub("", m) for e in exprs for m in METRIC_RE.findall(e)}


def alert_rules() -> list[dict[str, Any]]:
    return [r for g in load_yaml(PROM / "alerts.yaml")["groups"] for r in g["rules"]]


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((GRAFANA / "slotgate.json").read_text(encoding="utf-8"))
    return data


def dashboard_exprs() -> list[str]:
    dash = dashboard()
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    for var in dash.get("templating", {}).get("list", []):
        query = var.get("query")
        exprs.append(query["query"] if isinstance(query, dict) else str(query or ""))
    return exprs


# ---------------------------------------------------------------- parsing


def test_deploy_files_exist() -> None:
    for rel in ("Dockerfile", "docker-compose.yaml", "compose/config.yaml",
                "prometheus/prometheus.yaml", "prometheus/alerts.yaml",
                "prometheus/alerts_test.yaml", "grafana/slotgate.json",
                "k8s/deployment.yaml", "k8s/service.yaml", "k8s/configmap.yaml",
                "k8s/pdb.yaml", "k8s/hpa.yaml", "k8s/README.md"):
        assert (DEPLOY / rel).is_file(), rel
    assert (ROOT / ".dockerignore").is_file()
    assert (ROOT / "docs" / "operations.md").is_file()


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_yaml_parses(path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]
    assert docs, f"{path} is empty"


@pytest.mark.parametrize("path", JSON_FILES, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_json_parses(path: Path) -> None:
    assert json.loads(path.read_text(encoding="utf-8"))


# ---------------------------------------------------------------- image


def test_dockerfile_shape() -> None:
    text = dockerfile()
    froms = re.findall(r"^FROM\s+(\S+)", text, re.M)
    assert len(froms) >= 2, "multi-stage build expected"
    assert all(f == "python:3.11-slim" for f in froms)
    assert re.search(r"^EXPOSE\s+8080\s*$", text, re.M)
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert re.search(r"^HEALTHCHECK\b.*\\\n\s*CMD \[\"python\".*/healthz", text, re.M)
    assert "curl" not in text.split("HEALTHCHECK", 1)[1]
    cmd = re.findall(r"^CMD\s+(\[.*\])\s*$", text, re.M)[-1]
    assert json.loads(cmd) == ["slotgate", "serve", "--config", "/etc/slotgate/config.yaml",
                               "--host", "0.0.0.0"]
    installs = re.findall(r"pip install[^\n]*", text)
    assert any(re.search(r"install --no-deps \.(\s|$)", i) for i in installs)
    assert not any(re.search(r"\s(-e|--editable)\s", i) for i in installs)


def test_dockerfile_copies_exist_and_are_not_ignored() -> None:
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    for flag in (".venv", ".git"):
        assert flag in ignored
    sources = []
    for line in re.findall(r"^COPY\s+(?!--from)(.+)$", dockerfile(), re.M):
        sources += shlex.split(line)[:-1]
    assert sources
    for src in sources:
        assert (ROOT / src).exists(), src
        assert src.rstrip("/") not in ignored, f"{src} is in .dockerignore"
    # Package data the image needs: the classifier model and the web pages.
    assert list((ROOT / "classifier" / "model").glob("*.npy"))
    assert (ROOT / "router" / "console" / "web" / "dashboard.html").is_file()


# ---------------------------------------------------------------- configs


def test_k8s_configmap_is_a_valid_config() -> None:
    cm = k8s_docs()["ConfigMap"]
    config = parse_config(cm["data"]["config.yaml"], "deploy/k8s/configmap.yaml")
    assert config.server.port == 8080
    assert all(b.url is not None for b in config.backends.values())


def test_compose_config_is_valid_and_points_at_the_simulators() -> None:
    path = DEPLOY / "compose" / "config.yaml"
    config = parse_config(path.read_text(encoding="utf-8"), str(path))
    assert config.server.port == 8080
    services = load_yaml(DEPLOY / "docker-compose.yaml")["services"]
    for name, backend in config.backends.items():
        url = str(backend.url)
        match = re.match(r"http://([a-z0-9-]+):(\d+)/v1/?$", url)
        assert match, (name, url)
        host, port = match.group(1), match.group(2)
        assert host in services, f"{name}: no compose service {host}"
        command = services[host]["command"]
        assert command[:2] == ["slotgate", "simulate"]
        assert command[command.index("--port") + 1] == port
        assert command[command.index("--host") + 1] == "0.0.0.0"
        assert command[command.index("--slots") + 1] == str(backend.slots)
        assert command[command.index("--model") + 1] == backend.model


def test_compose_stack() -> None:
    compose = load_yaml(DEPLOY / "docker-compose.yaml")
    services = compose["services"]
    assert {"gateway", "sim-70b", "sim-8b", "redis", "prometheus", "grafana"} <= set(services)
    gw = services["gateway"]
    assert gw["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile"}
    assert (DEPLOY / gw["build"]["context"] / gw["build"]["dockerfile"]).is_file()
    assert "8080:8080" in gw["ports"]
    assert "./compose/config.yaml:/etc/slotgate/config.yaml:ro" in gw["volumes"]
    for svc in services.values():  # every bind-mounted file exists
        for volume in svc.get("volumes", []):
            src = volume.split(":")[0]
            if src.startswith("."):
                assert (DEPLOY / src).exists(), src
    grafana_mounts = dict(v.split(":")[:2] for v in services["grafana"]["volumes"])
    provider = load_yaml(GRAFANA / "provisioning" / "dashboards" / "slotgate.yaml")
    dash_dir = provider["providers"][0]["options"]["path"]
    assert grafana_mounts["./grafana/slotgate.json"].startswith(dash_dir.rstrip("/") + "/")
    assert grafana_mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"


def test_prometheus_scrapes_the_gateway_and_loads_the_alerts() -> None:
    prom = load_yaml(PROM / "prometheus.yaml")
    (job,) = [j for j in prom["scrape_configs"] if j["job_name"] == "slotgate"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    assert job["static_configs"][0]["targets"] == ["gateway:8080"]
    assert prom["rule_files"] == ["alerts.yaml"]
    compose = load_yaml(DEPLOY / "docker-compose.yaml")["services"]["prometheus"]
    mounts = dict(v.split(":")[:2] for v in compose["volumes"])
    assert mounts["./prometheus/alerts.yaml"] == "/etc/prometheus/alerts.yaml"
    assert mounts["./prometheus/prometheus.yaml"] == "/etc/prometheus/prometheus.yaml"


def test_grafana_datasource_uid_matches_the_dashboard() -> None:
    ds = load_yaml(GRAFANA / "provisioning" / "datasources" / "prometheus.yaml")
    (prom,) = ds["datasources"]
    assert prom["url"] == "http://prometheus:9090"
    uids = {p["datasource"]["uid"] for p in dashboard()["panels"] if "datasource" in p}
    assert uids == {prom["uid"]}


# ---------------------------------------------------------------- kubernetes


def test_k8s_probes_hit_real_routes() -> None:
    config = parse_config(k8s_docs()["ConfigMap"]["data"]["config.yaml"])
    app = create_app(config)
    get_paths = {r.resource.canonical for r in app.router.routes()
                 if r.method == "GET" and r.resource is not None}
    container = gateway_container()
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        if probe in container:
            assert container[probe]["httpGet"]["path"] in get_paths, probe


def test_k8s_ports_agree_with_the_image() -> None:
    expose = re.findall(r"^EXPOSE\s+(\d+)", dockerfile(), re.M)
    docs = k8s_docs()
    container = gateway_container()
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["http"] == 8080 == int(expose[-1])
    args = container.get("args", [])
    if "--port" in args:
        assert int(args[args.index("--port") + 1]) == 8080
    config = parse_config(docs["ConfigMap"]["data"]["config.yaml"])
    assert config.server.port == 8080
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] in ("http", 8080)
    (svc_port,) = docs["Service"]["spec"]["ports"]
    assert svc_port["targetPort"] in ("http", 8080)
    selector = docs["Service"]["spec"]["selector"]
    labels = docs["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= labels.items()
    assert docs["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"].items() \
        <= labels.items()
    assert docs["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]["name"] \
        == docs["Deployment"]["metadata"]["name"]


def test_k8s_config_mount_and_shutdown_budget() -> None:
    docs = k8s_docs()
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    container = gateway_container()
    (mount,) = [m for m in container["volumeMounts"]
                if m["mountPath"] == "/etc/slotgate/config.yaml"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == docs["ConfigMap"]["metadata"]["name"]
    assert mount["subPath"] in docs["ConfigMap"]["data"]
    args = container.get("args") or container.get("command") or []
    if args:
        assert args[args.index("--config") + 1] == "/etc/slotgate/config.yaml"
    # preStop sleep + shutdown_timeout_s must fit in the grace period, which is sized
    # for long streams.
    grace = pod["terminationGracePeriodSeconds"]
    assert grace >= 120
    sleep = container["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep[0] == "sleep"
    config = parse_config(docs["ConfigMap"]["data"]["config.yaml"])
    assert int(sleep[1]) + config.server.shutdown_timeout_s < grace


def test_k8s_runs_as_non_root_with_resources() -> None:
    pod = k8s_docs()["Deployment"]["spec"]["template"]["spec"]
    container = gateway_container()
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["resources"]["requests"]["cpu"]
    assert container["resources"]["limits"]["memory"]
    uid = re.findall(r"^USER\s+(\d+)", dockerfile(), re.M)[-1]
    assert int(uid) == pod["securityContext"]["runAsUser"]


def test_k8s_runs_several_replicas_only_with_shared_pools() -> None:
    docs = k8s_docs()
    config = yaml.safe_load(docs["ConfigMap"]["data"]["config.yaml"])
    replicas = docs["Deployment"]["spec"]["replicas"]
    most = docs["HorizontalPodAutoscaler"]["spec"]["maxReplicas"]
    if max(replicas, most) > 1:  # else N replicas would let N x slots reach an engine
        assert config["coordination"]["mode"] == "redis"
        assert config["coordination"]["expected_replicas"] == replicas
    readme = (K8S / "README.md").read_text(encoding="utf-8")
    assert "coordination.mode: redis" in readme


# ---------------------------------------------------------------- metrics


def test_alerts_only_use_contract_metrics() -> None:
    rules = alert_rules()
    assert {r["alert"] for r in rules} == set(ALERTS)
    used = metric_names([r["expr"] for r in rules])
    assert used, "no metric found in the alert expressions"
    assert used <= METRICS_CONTRACT, used - METRICS_CONTRACT
    saturation = next(r for r in rules if r["alert"] == "SlotgateSlotsSaturated")
    assert " ".join(saturation["expr"].split()) == (
        "sum by (backend) (llm_active_slots_gauge) / "
        "sum by (backend) (slotgate_slot_capacity) > 0.9")
    assert saturation["for"] == "5m"
    for rule in rules:
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["summary"]


def test_dashboard_only_uses_contract_metrics() -> None:
    used = metric_names(dashboard_exprs())
    assert used <= METRICS_CONTRACT, used - METRICS_CONTRACT
    for needed in ("llm_active_slots_gauge", "slotgate_slot_capacity", "llm_queue_depth_gauge",
                   "llm_queue_wait_time_seconds", "llm_rejection_total",
                   "slotgate_fallbacks_total", "slotgate_ttft_seconds",
                   "slotgate_tokens_total", "slotgate_cost_total"):
        assert needed in used, needed
    titles = [p["title"] for p in dashboard()["panels"]]
    assert len(titles) == len(set(titles))


def test_metric_regex_strips_histogram_suffixes() -> None:
    expr = ('histogram_quantile(0.95, sum by (le) (rate(llm_queue_wait_time_seconds_bucket'
            '[5m]))) / slotgate_ttft_seconds_count + slotgate_ttft_seconds_sum{job="slotgate"}')
    assert metric_names([expr]) == {"llm_queue_wait_time_seconds", "slotgate_ttft_seconds"}


def test_operations_doc_covers_every_metric_and_alert() -> None:
    doc = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    for name in sorted(METRICS_CONTRACT) + list(ALERTS):
        assert name in doc, name
    assert "## Example /metrics output" in doc


# ---------------------------------------------------------------- promtool


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    exe = require_program("promtool")
    return subprocess.run([exe, *args], cwd=PROM, capture_output=True, text=True, timeout=60,
                          check=False)


def test_promtool_check_rules() -> None:
    result = promtool("check", "rules", "alerts.yaml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_test_rules() -> None:
    result = promtool("test", "rules", "alerts_test.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    tested = set(re.findall(r"alertname:\s*(\w+)",
                            (PROM / "alerts_test.yaml").read_text(encoding="utf-8")))
    assert len(tested) >= 2 and tested <= set(ALERTS)


def test_promtool_check_config() -> None:
    result = promtool("check", "config", "prometheus.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
