"""The autoscaling manifests of deploy/k8s against their schemas and against the gateway.

keda-scaledobject.yaml (a KEDA ScaledObject and its TriggerAuthentication) and
hpa-external-metric.yaml (an autoscaling/v2 HPA on an external metric), with hpa.yaml, are
validated against the schemas vendored in tests/data/k8s-schemas (KEDA's CRDs, Kubernetes'
OpenAPI; see its README), offline. Broken copies prove the schemas are really applied. The
rest ties the manifests to the gateway: the scaler reads GET /admin/scaling of the gateway's
Service, at the place of a backend the docs' example scales, and the HPA reads the gauge
router/fleet/signals.py exports.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml

from policies.config.fleet import BackendScalingConfig, FleetConfig
from policies.fleet.desired import Demand
from router.app import create_app
from router.config import parse_config
from router.fleet.signals import FleetCollector, FleetSignals, Reading

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "k8s"
SCHEMAS = Path(__file__).resolve().parent / "data" / "k8s-schemas"
KEDA = K8S / "keda-scaledobject.yaml"
HPA_EXTERNAL = K8S / "hpa-external-metric.yaml"
MANIFESTS = (KEDA, HPA_EXTERNAL, K8S / "hpa.yaml")

SCHEMA_FILES = {
    ("keda.sh/v1alpha1", "ScaledObject"): "scaledobject-keda-v1alpha1.json",
    ("keda.sh/v1alpha1", "TriggerAuthentication"): "triggerauthentication-keda-v1alpha1.json",
    ("autoscaling/v2", "HorizontalPodAutoscaler"): "horizontalpodautoscaler-autoscaling-v2.json",
}

Doc = dict[str, Any]


@cache
def validator(api_version: str, kind: str) -> jsonschema.Draft7Validator:
    name = SCHEMA_FILES[api_version, kind]
    schema = json.loads((SCHEMAS / name).read_text(encoding="utf-8"))
    return jsonschema.Draft7Validator(schema)


def errors(doc: Doc) -> list[str]:
    """Every schema error of a manifest, as `path: message`."""
    found = validator(doc["apiVersion"], doc["kind"]).iter_errors(doc)
    return [f"{'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in found]


def documents(path: Path) -> list[Doc]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def one(path: Path, kind: str) -> Doc:
    (doc,) = [d for d in documents(path) if d["kind"] == kind]
    return doc


def scaled_object() -> Doc:
    return one(KEDA, "ScaledObject")


def trigger() -> Doc:
    (found,) = scaled_object()["spec"]["triggers"]
    assert found["type"] == "metrics-api"
    return dict(found)


def external_metric() -> Doc:
    (metric,) = one(HPA_EXTERNAL, "HorizontalPodAutoscaler")["spec"]["metrics"]
    assert metric["type"] == "External"
    return dict(metric["external"])


def docs_example() -> Doc:
    """The config block docs/autoscaling.md opens with (a backend with `scaling`)."""
    text = (ROOT / "docs" / "autoscaling.md").read_text(encoding="utf-8")
    block = re.search(r"```yaml\n(.*?)```", text, re.S)
    assert block, "docs/autoscaling.md has no yaml block"
    example: Doc = yaml.safe_load(block.group(1))
    return example


def gjson(path: str, data: Any) -> Any:
    """A plain GJSON path (keys joined by dots, nothing special) applied to `data`."""
    assert not re.search(r"[*?|#@\\!=<>%]", path), f"{path}: not a plain GJSON path"
    for key in path.split("."):
        assert isinstance(data, dict) and key in data, f"{path}: no {key!r}"
        data = data[key]
    return data


def signals_with(backend: str, desired: int, replicas: int) -> FleetSignals:
    """The gateway's fleet signals holding one reading, as a look would leave it (no look
    is taken, so the callables are never called)."""
    signals = FleetSignals(config=lambda: parse_config("backends: {}\n"),
                           released=lambda _: 0.0, hold_s=lambda _: 0.0,
                           queued=lambda _: 0, replicas=lambda _: replicas)
    signals.readings[backend] = Reading(Demand(0.61, 4.4, 5, 5.0), desired, replicas,
                                        1796437800.1)
    return signals


def backend_of_value_location() -> str:
    match = re.fullmatch(r"backends\.([^.]+)\.desired", trigger()["metadata"]["valueLocation"])
    assert match, trigger()["metadata"]["valueLocation"]
    return match.group(1)


# ---------------------------------------------------------------- the schemas


@pytest.mark.parametrize("name", sorted(SCHEMA_FILES.values()))
def test_vendored_schemas_are_valid_and_name_their_source(name: str) -> None:
    schema = json.loads((SCHEMAS / name).read_text(encoding="utf-8"))
    jsonschema.Draft7Validator.check_schema(schema)
    assert "Apache-2.0" in schema["$comment"]
    assert re.search(r"kedacore/keda v\d|Kubernetes \d", schema["$comment"])
    readme = (SCHEMAS / "README.md").read_text(encoding="utf-8")
    assert f"`{name}`" in readme
    # Strict: the root and spec refuse fields they do not list.
    assert schema["additionalProperties"] is False
    assert schema["properties"]["spec"]["additionalProperties"] is False


@pytest.mark.parametrize(
    ("path", "index"),
    [(p, i) for p in MANIFESTS for i in range(len(documents(p)))],
    ids=lambda v: v.name if isinstance(v, Path) else str(v))
def test_every_document_matches_its_schema(path: Path, index: int) -> None:
    doc = documents(path)[index]
    assert (doc["apiVersion"], doc["kind"]) in SCHEMA_FILES, (path, doc["kind"])
    assert errors(doc) == []


def test_the_keda_file_holds_the_scaled_object_and_its_authentication() -> None:
    assert sorted(d["kind"] for d in documents(KEDA)) == ["ScaledObject",
                                                          "TriggerAuthentication"]
    assert [d["kind"] for d in documents(HPA_EXTERNAL)] == ["HorizontalPodAutoscaler"]


def _set(path: str, value: Any) -> Callable[[Doc], None]:
    def mutate(doc: Doc) -> None:
        *parents, last = path.split(".")
        node: Any = doc
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return mutate


def _drop(path: str) -> Callable[[Doc], None]:
    def mutate(doc: Doc) -> None:
        *parents, last = path.split(".")
        node: Any = doc
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        del node[last]
    return mutate


BROKEN: list[tuple[Path, str, str, Callable[[Doc], None]]] = [
    (KEDA, "ScaledObject", "minReplicaCount a string",
     _set("spec.minReplicaCount", "zero")),
    (KEDA, "ScaledObject", "maxReplicaCount 0", _set("spec.maxReplicaCount", 0)),
    (KEDA, "ScaledObject", "an unknown spec field", _set("spec.pollingIntervall", 15)),
    (KEDA, "ScaledObject", "a trigger without type", _drop("spec.triggers.0.type")),
    (KEDA, "ScaledObject", "a metadata value not a string",
     _set("spec.triggers.0.metadata.targetValue", 1)),
    (KEDA, "ScaledObject", "no scaleTargetRef", _drop("spec.scaleTargetRef")),
    (KEDA, "ScaledObject", "an unknown authenticationRef kind",
     _set("spec.triggers.0.authenticationRef.kind", "Secret")),
    (KEDA, "ScaledObject", "another apiVersion", _set("apiVersion", "keda.sh/v1")),
    (KEDA, "TriggerAuthentication", "a secretTargetRef without key",
     _drop("spec.secretTargetRef.0.key")),
    (KEDA, "TriggerAuthentication", "an unknown spec field",
     _set("spec.secretRef", [])),
    (HPA_EXTERNAL, "HorizontalPodAutoscaler", "no maxReplicas", _drop("spec.maxReplicas")),
    (HPA_EXTERNAL, "HorizontalPodAutoscaler", "minReplicas a string",
     _set("spec.minReplicas", "1")),
    (HPA_EXTERNAL, "HorizontalPodAutoscaler", "averageValue a list",
     _set("spec.metrics.0.external.target.averageValue", ["1"])),
    (HPA_EXTERNAL, "HorizontalPodAutoscaler", "an unknown field in the metric",
     _set("spec.metrics.0.external.metric.selectors", {})),
    (HPA_EXTERNAL, "HorizontalPodAutoscaler", "another apiVersion",
     _set("apiVersion", "autoscaling/v2beta2")),
]


@pytest.mark.parametrize(("path", "kind", "what", "mutate"), BROKEN,
                         ids=[f"{k}: {w}" for _, k, w, _ in BROKEN])
def test_a_broken_copy_is_rejected(path: Path, kind: str, what: str,
                                   mutate: Callable[[Doc], None]) -> None:
    doc = copy.deepcopy(one(path, kind))
    schema = validator(doc["apiVersion"], doc["kind"])
    assert list(schema.iter_errors(doc)) == []
    mutate(doc)
    assert list(schema.iter_errors(doc)), f"{kind} with {what} passed its schema"


def test_the_scaled_objects_replica_bounds_follow_keda_s_rule() -> None:
    # The CRD's CEL rule (x-kubernetes-validations), which jsonschema does not evaluate.
    spec = scaled_object()["spec"]
    assert spec.get("minReplicaCount", 0) <= spec.get("maxReplicaCount", 100)


# ---------------------------------------------------------------- KEDA and the gateway


def test_the_scaler_reads_admin_scaling_of_the_gateway_service() -> None:
    url = urlsplit(trigger()["metadata"]["url"])
    assert url.scheme == "http" and url.path == "/admin/scaling" and not url.query
    service = one(K8S / "service.yaml", "Service")
    (port,) = service["spec"]["ports"]
    assert url.hostname is not None
    assert url.hostname.split(".")[0] == service["metadata"]["name"]
    assert url.port == port["port"]
    # ... and the gateway really answers GET there.
    config = parse_config(one(K8S / "configmap.yaml", "ConfigMap")["data"]["config.yaml"])
    get_paths = {r.resource.canonical for r in create_app(config).router.routes()
                 if r.method == "GET" and r.resource is not None}
    assert url.path in get_paths


def test_the_value_location_names_a_scaled_backend_of_the_docs_example() -> None:
    example = docs_example()
    name = backend_of_value_location()
    assert name in example["backends"], (name, sorted(example["backends"]))
    scaling = BackendScalingConfig.model_validate(example["backends"][name]["scaling"])
    spec = scaled_object()["spec"]
    # KEDA's bounds do not cut the gateway's count short.
    assert spec["maxReplicaCount"] == scaling.ceiling
    assert spec["minReplicaCount"] <= scaling.floor
    refresh = FleetConfig.model_validate(example["fleet"]).refresh_s
    assert spec["pollingInterval"] <= refresh


def test_the_value_location_reads_the_count_from_the_gateway_s_answer() -> None:
    location = trigger()["metadata"]["valueLocation"]
    answer = signals_with(backend_of_value_location(), desired=3, replicas=2).as_json()
    assert gjson(location, json.loads(json.dumps(answer))) == 3
    # The docs' example answer too.
    text = (ROOT / "docs" / "autoscaling.md").read_text(encoding="utf-8")
    block = re.search(r"```json\n(.*?)```", text, re.S)
    assert block
    assert isinstance(gjson(location, json.loads(block.group(1))), int)


def test_the_trigger_scales_one_replica_per_unit_with_the_admin_key() -> None:
    found = trigger()
    meta = found["metadata"]
    assert meta["targetValue"] == "1"
    assert found.get("metricType", "AverageValue") == "AverageValue"
    assert meta.get("format", "json") == "json"
    assert meta["authMode"] == "bearer"
    auth = one(KEDA, "TriggerAuthentication")
    assert found["authenticationRef"]["name"] == auth["metadata"]["name"]
    assert found["authenticationRef"].get("kind", "TriggerAuthentication") \
        == "TriggerAuthentication"
    (ref,) = auth["spec"]["secretTargetRef"]
    assert ref["parameter"] in ("token", "bearerToken")  # KEDA's names for the bearer token
    spec = scaled_object()["spec"]
    assert spec["minReplicaCount"] == 0  # scale to zero is allowed


# ---------------------------------------------------------------- the HPA and the gauge


def test_the_hpa_reads_the_gauge_of_the_desired_count() -> None:
    external = external_metric()
    name = backend_of_value_location()
    collector = FleetCollector(signals_with(name, desired=3, replicas=2))
    families = {f.name: f for f in collector.collect()}
    metric = external["metric"]["name"]
    assert metric in families, (metric, sorted(families))
    (sample,) = families[metric].samples
    assert sample.labels == {"backend": name}
    assert sample.value == 3  # the desired count, not the replicas of now
    assert external["metric"]["selector"] == {"matchLabels": {"backend": name}}
    assert external["target"] == {"type": "AverageValue", "averageValue": "1"}


def test_the_hpa_and_the_scaled_object_scale_the_same_engine_within_the_ceiling() -> None:
    hpa = one(HPA_EXTERNAL, "HorizontalPodAutoscaler")["spec"]
    keda = scaled_object()["spec"]
    assert hpa["scaleTargetRef"] == keda["scaleTargetRef"]
    assert hpa["maxReplicas"] == keda["maxReplicaCount"]
    assert 1 <= hpa["minReplicas"] <= hpa["maxReplicas"]


def test_the_documented_adapter_rule_serves_the_gauge() -> None:
    comments = [line.removeprefix("#").removeprefix(" ")
                for line in HPA_EXTERNAL.read_text(encoding="utf-8").splitlines()
                if line.startswith("#")]
    start = comments.index("  externalRules:")
    block = []
    for line in comments[start:]:
        if not line.strip():
            break
        block.append(line)
    (rule,) = yaml.safe_load("\n".join(block))["externalRules"]
    metric = external_metric()["metric"]["name"]
    assert re.match(rf"{metric}\{{", rule["seriesQuery"])
    assert rule["name"]["as"] == metric
    assert rule["resources"] == {"namespaced": False}
    assert "by (backend)" in rule["metricsQuery"]
    assert "<<.LabelMatchers>>" in rule["metricsQuery"]
