"""Rewrite the JSON schemas beside this file from their sources (see README.md).

    python tests/data/k8s-schemas/vendor.py \\
        --keda KEDA_CHECKOUT/config/crd/bases --keda-version v2.20.2 \\
        --kubernetes CLIENT_CHECKOUT/kubernetes/swagger.json.unprocessed \\
        --kubernetes-version "1.36 (kubernetes-client/python v36.0.3)"

Every schema is trimmed and made strict the same way: descriptions and `status` dropped,
`apiVersion` and `kind` pinned to the one they describe, and every object that lists its
properties (and neither names `additionalProperties` nor preserves unknown fields) refuses
others, as `kubectl apply --validate=strict` does. Nothing else is changed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
DRAFT = "http://json-schema.org/draft-07/schema#"
# Kubernetes' two scalar types that take a number or a string.
EITHER = {
    "io.k8s.apimachinery.pkg.api.resource.Quantity": [{"type": "string"}, {"type": "number"}],
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString": [{"type": "string"},
                                                         {"type": "integer"}],
}


def strict(node: Any) -> Any:
    """Drop descriptions; objects with listed properties refuse unknown ones."""
    if isinstance(node, list):
        return [strict(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: (v if k in ("properties", "enum", "default") else strict(v))
           for k, v in node.items() if k != "description"}
    if "properties" in node:
        out["properties"] = {k: strict(v) for k, v in node["properties"].items()}
        if ("additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
    return out


def pinned(schema: dict[str, Any], api_version: str, kind: str, source: str) -> dict[str, Any]:
    props = dict(schema["properties"])
    props.pop("status", None)
    props["apiVersion"] = {"type": "string", "enum": [api_version]}
    props["kind"] = {"type": "string", "enum": [kind]}
    required = sorted({*schema.get("required", []), "apiVersion", "kind"})
    return {"$schema": DRAFT, "$comment": source, **schema, "properties": props,
            "required": required}


def crd(path: Path, version: str) -> dict[str, Any]:
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    (stored,) = [v for v in doc["spec"]["versions"] if v.get("storage")]
    api_version = f"{doc['spec']['group']}/{stored['name']}"
    kind = doc["spec"]["names"]["kind"]
    source = (f"kedacore/keda {version}, config/crd/bases/{path.name}, "
              "spec.versions[].schema.openAPIV3Schema; Apache-2.0; trimmed by vendor.py")
    schema = strict(stored["schema"]["openAPIV3Schema"])
    return pinned(schema, api_version, kind, source)


def inline(node: Any, defs: dict[str, Any], depth: int = 0) -> Any:
    """Kubernetes' OpenAPI definitions with every $ref replaced by what it names."""
    if depth > 40:
        raise ValueError("$ref nesting too deep (a recursive definition?)")
    if isinstance(node, list):
        return [inline(n, defs, depth) for n in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str):
        name = ref.removeprefix("#/definitions/")
        if name in EITHER:
            return {"anyOf": EITHER[name]}
        rest = {k: v for k, v in node.items() if k != "$ref"}
        return {**inline(defs[name], defs, depth + 1), **inline(rest, defs, depth)}
    return {k: inline(v, defs, depth) for k, v in node.items()}


def kubernetes(swagger: Path, version: str, definition: str, api_version: str,
               kind: str) -> dict[str, Any]:
    defs = json.loads(swagger.read_text(encoding="utf-8"))["definitions"]
    schema = strict(inline(defs[definition], defs))
    source = (f"Kubernetes {version} OpenAPI, definitions/{definition}; Apache-2.0; "
              "trimmed by vendor.py")
    return pinned(schema, api_version, kind, source)


def write(name: str, schema: dict[str, Any]) -> None:
    text = json.dumps(schema, indent=1, sort_keys=False, ensure_ascii=False) + "\n"
    (HERE / name).write_text(text, encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keda", type=Path, required=True)
    parser.add_argument("--keda-version", required=True)
    parser.add_argument("--kubernetes", type=Path, required=True)
    parser.add_argument("--kubernetes-version", required=True)
    args = parser.parse_args()
    write("scaledobject-keda-v1alpha1.json",
          crd(args.keda / "keda.sh_scaledobjects.yaml", args.keda_version))
    write("triggerauthentication-keda-v1alpha1.json",
          crd(args.keda / "keda.sh_triggerauthentications.yaml", args.keda_version))
    write("horizontalpodautoscaler-autoscaling-v2.json",
          kubernetes(args.kubernetes, args.kubernetes_version,
                     "io.k8s.api.autoscaling.v2.HorizontalPodAutoscaler",
                     "autoscaling/v2", "HorizontalPodAutoscaler"))


if __name__ == "__main__":
    main()
