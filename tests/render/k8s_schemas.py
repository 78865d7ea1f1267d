"""Validating Kubernetes objects offline, for the render and install-base tests.

- Core Kubernetes kinds: the JSON schemas that the ``kubernetes-validate`` package ships (strict:
  unknown fields are errors, as a typo would be silently pruned by the API server).
- Kueue kinds: the upstream CRDs' ``openAPIV3Schema`` of the served version, converted to JSON
  Schema (``nullable``, ``x-kubernetes-int-or-string``, ``x-kubernetes-preserve-unknown-fields``,
  ``x-kubernetes-embedded-resource``; objects without preserve-unknown-fields reject unknown keys),
  plus the CRDs' CEL rules (``x-kubernetes-validations``) evaluated with a CEL interpreter. Rules
  that compare with ``oldSelf`` (transition rules) need an old object and are not evaluated.
- PrometheusRule (monitoring.coreos.com/v1) and cert-manager Issuer/Certificate (cert-manager.io/v1):
  their CRDs are not available offline here, so a hand-written schema checks their structure
  (the fields mpigate uses, their types and enums; unknown fields rejected).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import cel
import jsonschema
import kubernetes_validate
import yaml

KUBERNETES_VERSION = "1.33"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
OBJECT_META = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "maxLength": 253, "pattern": DNS_SUBDOMAIN},
        "namespace": {"type": "string", "maxLength": 63, "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
        "labels": _STRING_MAP,
        "annotations": _STRING_MAP,
    },
}


@dataclass(frozen=True)
class Finding:
    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


def convert_openapi(node: Any, *, root: bool = False) -> Any:
    """A CRD ``openAPIV3Schema`` node → JSON Schema (draft 2020-12)."""
    if not isinstance(node, Mapping):
        return node
    out: dict[str, Any] = {}
    preserve = bool(node.get("x-kubernetes-preserve-unknown-fields"))
    embedded = bool(node.get("x-kubernetes-embedded-resource"))
    for key, value in node.items():
        if key.startswith("x-kubernetes-") or key in ("description", "default", "nullable", "example"):
            continue
        if key == "properties":
            out[key] = {k: convert_openapi(v) for k, v in value.items()}
        elif key in ("items", "not"):
            out[key] = convert_openapi(value)
        elif key == "additionalProperties":
            out[key] = convert_openapi(value) if isinstance(value, Mapping) else value
        elif key in ("anyOf", "allOf", "oneOf"):
            out[key] = [convert_openapi(v) for v in value]
        else:
            out[key] = copy.deepcopy(value)
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if embedded:
        props = out.setdefault("properties", {})
        props.setdefault("apiVersion", {"type": "string"})
        props.setdefault("kind", {"type": "string"})
        props.setdefault("metadata", {"type": "object"})
    if (
        out.get("type") == "object"
        and "properties" in out
        and "additionalProperties" not in out
        and not preserve
    ):
        out["additionalProperties"] = False
    if root:
        out.setdefault("properties", {})["metadata"] = OBJECT_META
        out["required"] = sorted({*out.get("required", ()), "apiVersion", "kind", "metadata"})
    return out


@dataclass(frozen=True)
class CRD:
    group: str
    kind: str
    version: str
    scope: str
    raw_schema: Mapping[str, Any]
    schema: Mapping[str, Any]


@cache
def load_crds(directory: str) -> dict[tuple[str, str], CRD]:
    """CRDs of ``directory`` by (apiVersion, kind), one entry per served version."""
    crds: dict[tuple[str, str], CRD] = {}
    for path in sorted(Path(directory).glob("*.yaml")):
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        if not isinstance(doc, dict) or doc.get("kind") != "CustomResourceDefinition":
            continue
        spec = doc["spec"]
        for version in spec["versions"]:
            if not version.get("served"):
                continue
            raw = version["schema"]["openAPIV3Schema"]
            crds[(f"{spec['group']}/{version['name']}", spec["names"]["kind"])] = CRD(
                spec["group"],
                spec["names"]["kind"],
                version["name"],
                spec["scope"],
                raw,
                convert_openapi(raw, root=True),
            )
    return crds


def _children(schema: Mapping[str, Any], value: Any) -> Iterator[tuple[str, Mapping[str, Any], Any]]:
    if isinstance(value, dict):
        for key, child in value.items():
            props = schema.get("properties") or {}
            if key in props:
                yield f".{key}", props[key], child
            elif isinstance(schema.get("additionalProperties"), Mapping):
                yield f"[{key!r}]", schema["additionalProperties"], child
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for i, child in enumerate(value):
            yield f"[{i}]", schema["items"], child


def cel_findings(schema: Mapping[str, Any], value: Any, where: str = "") -> tuple[list[Finding], list[str]]:
    """Evaluate the CRD's ``x-kubernetes-validations`` on ``value`` (a raw openAPIV3Schema node).

    Returns (violations, rules that could not be evaluated)."""
    findings: list[Finding] = []
    skipped: list[str] = []
    for rule in schema.get("x-kubernetes-validations") or ():
        expression = rule["rule"]
        if "oldSelf" in expression:
            continue
        try:
            ok = cel.evaluate(expression, {"self": value})
        except Exception as exc:  # the interpreter lacks a Kubernetes CEL library function
            skipped.append(f"{where or '.'}: {expression} ({exc})")
            continue
        if ok is not True:
            findings.append(Finding(where or ".", f"{rule.get('message') or expression}"))
    for suffix, child_schema, child in _children(schema, value):
        child_findings, child_skipped = cel_findings(child_schema, child, where + suffix)
        findings.extend(child_findings)
        skipped.extend(child_skipped)
    return findings, skipped


_DURATION = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
PROMETHEUS_RULE = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": OBJECT_META,
        "spec": {
            "type": "object",
            "required": ["groups"],
            "additionalProperties": False,
            "properties": {
                "groups": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name", "rules"],
                        "additionalProperties": False,
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "interval": {"type": "string", "pattern": _DURATION},
                            "rules": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "required": ["expr"],
                                    "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                                    "additionalProperties": False,
                                    "properties": {
                                        "alert": {"type": "string", "pattern": r"^[A-Za-z_][A-Za-z0-9_]*$"},
                                        "record": {"type": "string"},
                                        "expr": {"type": "string", "minLength": 1},
                                        "for": {"type": "string", "pattern": _DURATION},
                                        "labels": _STRING_MAP,
                                        "annotations": _STRING_MAP,
                                    },
                                },
                            },
                        },
                    },
                }
            },
        },
    },
}
_ISSUER_REF = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string"},
        "kind": {"enum": ["Issuer", "ClusterIssuer"]},
        "group": {"type": "string"},
    },
}
CERT_MANAGER = {
    "Issuer": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
        "properties": {
            "apiVersion": {"const": "cert-manager.io/v1"},
            "kind": {"const": "Issuer"},
            "metadata": OBJECT_META,
            "spec": {
                "type": "object",
                "minProperties": 1,
                "maxProperties": 1,
                "additionalProperties": False,
                "properties": {
                    "selfSigned": {"type": "object"},
                    "ca": {
                        "type": "object",
                        "required": ["secretName"],
                        "properties": {"secretName": {"type": "string"}},
                        "additionalProperties": False,
                    },
                },
            },
        },
    },
    "Certificate": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
        "properties": {
            "apiVersion": {"const": "cert-manager.io/v1"},
            "kind": {"const": "Certificate"},
            "metadata": OBJECT_META,
            "spec": {
                "type": "object",
                "required": ["secretName", "issuerRef"],
                "additionalProperties": False,
                "properties": {
                    "secretName": {"type": "string"},
                    "issuerRef": _ISSUER_REF,
                    "isCA": {"type": "boolean"},
                    "commonName": {"type": "string", "maxLength": 64},
                    "dnsNames": {"type": "array", "items": {"type": "string"}},
                    "duration": {"type": "string", "pattern": r"^([0-9]+(\.[0-9]+)?(h|m|s))+$"},
                    "renewBefore": {"type": "string", "pattern": r"^([0-9]+(\.[0-9]+)?(h|m|s))+$"},
                    "usages": {
                        "type": "array",
                        "items": {
                            "enum": [
                                "server auth",
                                "client auth",
                                "digital signature",
                                "key encipherment",
                                "cert sign",
                            ]
                        },
                    },
                    "privateKey": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "algorithm": {"enum": ["RSA", "ECDSA", "Ed25519"]},
                            "size": {"type": "integer"},
                            "rotationPolicy": {"enum": ["Never", "Always"]},
                            "encoding": {"enum": ["PKCS1", "PKCS8"]},
                        },
                    },
                },
            },
        },
    },
}


def _schema_findings(schema: Mapping[str, Any], obj: Any) -> list[Finding]:
    validator = jsonschema.Draft202012Validator(schema)
    return [
        Finding("." + ".".join(str(p) for p in error.absolute_path), error.message)
        for error in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))
    ]


def _balanced(expr: str) -> bool:
    pairs = {")": "(", "]": "[", "}": "{"}
    stack: list[str] = []
    in_string = False
    for ch in expr:
        if ch == '"':
            in_string = not in_string
        elif in_string:
            continue
        elif ch in "([{":
            stack.append(ch)
        elif ch in pairs and (not stack or stack.pop() != pairs[ch]):
            return False
    return not stack and not in_string


def validate_object(
    obj: Mapping[str, Any], kueue_crds: Mapping[tuple[str, str], CRD] | None
) -> tuple[list[Finding], str]:
    """Findings for one object and how it was validated (``kubernetes``, ``crd``, ``structural``).

    Kueue objects are skipped (method ``skipped``) when ``kueue_crds`` is None."""
    findings, method = _validate(obj, kueue_crds)
    return findings + _metadata_findings(obj), method


def _validate(
    obj: Mapping[str, Any], kueue_crds: Mapping[tuple[str, str], CRD] | None
) -> tuple[list[Finding], str]:
    api_version, kind = str(obj.get("apiVersion")), str(obj.get("kind"))
    group = api_version.rpartition("/")[0]
    if group == "kueue.x-k8s.io":
        if kueue_crds is None:
            return [], "skipped"
        crd = kueue_crds.get((api_version, kind))
        if crd is None:
            return [Finding(".", f"no served Kueue CRD for {api_version} {kind}")], "crd"
        findings = _schema_findings(crd.schema, obj)
        cel_found, _ = cel_findings(crd.raw_schema, obj)
        if crd.scope == "Cluster" and obj["metadata"].get("namespace"):
            findings.append(Finding(".metadata.namespace", f"{kind} is cluster-scoped"))
        if crd.scope == "Namespaced" and not obj["metadata"].get("namespace"):
            findings.append(Finding(".metadata.namespace", f"{kind} is namespaced: set metadata.namespace"))
        return findings + cel_found, "crd"
    if group == "monitoring.coreos.com":
        if kind != "PrometheusRule":
            return [Finding(".", f"no schema for {kind}")], "structural"
        findings = _schema_findings(PROMETHEUS_RULE, obj)
        for g in obj.get("spec", {}).get("groups", ()):
            for r in g.get("rules", ()):
                if isinstance(r.get("expr"), str) and not _balanced(r["expr"]):
                    findings.append(
                        Finding(f".spec.groups[{g.get('name')}]", f"unbalanced expression {r['expr']!r}")
                    )
        return findings, "structural"
    if group == "cert-manager.io":
        schema = CERT_MANAGER.get(kind)
        if schema is None:
            return [Finding(".", f"no schema for {kind}")], "structural"
        return _schema_findings(schema, obj), "structural"
    try:
        kubernetes_validate.validate(dict(obj), KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = ".".join(str(p) for p in exc.path)
        return [Finding("." + path, exc.message)], "kubernetes"
    except (kubernetes_validate.SchemaNotFoundError, kubernetes_validate.InvalidSchemaError) as exc:
        return [Finding(".", str(exc.message if hasattr(exc, "message") else exc))], "kubernetes"
    if api_version == "v1" and kind == "ResourceQuota":
        return _quota_findings(obj), "kubernetes"
    return [], "kubernetes"


# kubernetes pkg/apis/core/helper/helpers.go standardQuotaResources (IsStandardQuotaResourceName)
_STANDARD_QUOTA = frozenset(
    f"{prefix}{name}"
    for prefix, names in (
        ("", ("cpu", "memory", "ephemeral-storage", "pods", "resourcequotas", "services", "secrets")),
        ("", ("replicationcontrollers", "persistentvolumeclaims", "configmaps")),
        ("", ("services.nodeports", "services.loadbalancers")),
        ("requests.", ("cpu", "memory", "storage", "ephemeral-storage")),
        ("limits.", ("cpu", "memory", "ephemeral-storage")),
    )
    for name in names
)


def _quota_findings(obj: Mapping[str, Any]) -> list[Finding]:
    """What the OpenAPI schema cannot say about a ResourceQuota's ``spec.hard`` keys, as the API
    server validates them (kubernetes pkg/apis/core/validation/validation.go
    ValidateResourceQuotaResourceName): a qualified name (apimachinery IsQualifiedName), and a
    standard quota resource when it has no prefix (``count/<resource>.<group>`` counts objects)."""
    findings = []
    for key in (obj.get("spec") or {}).get("hard") or {}:
        prefix, slash, name = key.rpartition("/")
        qualified = (
            len(name) <= 63
            and bool(_LABEL_NAME.match(name))
            and (not slash or (len(prefix) <= 253 and bool(re.match(DNS_SUBDOMAIN, prefix))))
        )
        standard = bool(slash) or key in _STANDARD_QUOTA or key.startswith("requests.hugepages-")
        if not (qualified and standard):
            findings.append(Finding(".spec.hard", f"invalid quota resource name {key!r}"))
    return findings


_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


def _metadata_findings(obj: Mapping[str, Any]) -> list[Finding]:
    """What the JSON schemas cannot say about metadata: label syntax (the API server checks it)."""
    findings = []
    for key, value in (obj.get("metadata", {}).get("labels") or {}).items():
        prefix, _, name = key.rpartition("/")
        if not _LABEL_NAME.match(name) or len(name) > 63 or (prefix and not re.match(DNS_SUBDOMAIN, prefix)):
            findings.append(Finding(".metadata.labels", f"invalid label key {key!r}"))
        if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
            findings.append(Finding(".metadata.labels", f"invalid label value {value!r} for {key}"))
    return findings
