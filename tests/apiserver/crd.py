"""CustomResourceDefinitions as the API server serves them: names and scope for discovery, and for
each object of the kind what apiextensions-apiserver does to it before storage — pruning unknown
fields, defaulting, OpenAPI schema validation, list-type uniqueness and x-kubernetes-validations
(CEL) — with the API server's field error text.

Simplifications (test support, not a reimplementation):

- the OpenAPI schema keywords are checked by ``jsonschema`` (Draft 4, which is what OpenAPI 3.0's
  schema object is based on) after ``nullable`` and ``x-kubernetes-int-or-string`` are rewritten
  into plain JSON Schema; kube-openapi's validator has the same keywords, its error messages are
  reproduced for the keywords the Trainer CRDs use (required, type, enum, minimum/maximum, lengths,
  pattern) and given as ``Invalid value`` for the rest;
- ``format`` is not checked (kube-openapi checks a fixed list of formats; the Trainer CRDs use
  int32/int64 and the quantity pattern, checked through ``pattern``);
- CEL rules are compiled per request (no cost estimation at CRD registration); ``oldSelf`` is bound
  for transition rules only where the old object has the same path (the API server correlates
  list items by key for map lists; here by index for every list);
- ``metadata`` is checked for a name (DNS subdomain) only.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from mpigate.cel import CompileError, Environment, EvalError, Program

__all__ = ["CRD", "FieldError", "load_crds"]

# apimachinery: pkg/util/validation/validation.go IsDNS1123Subdomain
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_CEL = Environment(["self", "oldSelf"])
_PROGRAMS: dict[str, Program] = {}


@dataclass(frozen=True)
class FieldError:
    """apimachinery: pkg/util/validation/field/errors.go (*Error).Error — ``path: type: detail``."""

    path: str
    type: str  # "Invalid value", "Required value", "Unsupported value", "Duplicate value", ...
    detail: str
    value: Any = None
    show_value: bool = True
    reason: str = "FieldValueInvalid"

    def __str__(self) -> str:
        # field/errors.go (*Error).ErrorBody: the value is printed for Invalid/Unsupported/Duplicate
        if self.show_value and self.type in ("Invalid value", "Unsupported value", "Duplicate value"):
            return f"{self.path}: {self.type}: {_go_value(self.value)}: {self.detail}"
        if self.detail:
            return f"{self.path}: {self.type}: {self.detail}" if self.type else f"{self.path}: {self.detail}"
        return f"{self.path}: {self.type}"


def _go_value(value: Any) -> str:
    # field/errors.go (*Error).ErrorBody: strings quoted, numbers and bools bare, objects as "object"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if value is None:
        return "null"
    return json.dumps(value, separators=(",", ":"))


def _path(parts: list[str | int]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _cel_type(value: Any) -> str:
    # apiextensions-apiserver: pkg/apiserver/schema/cel/validation.go — the "Invalid value" of a rule
    # failure is the schema type of the node, not its value
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return "string"


def _json_schema(schema: Any) -> Any:
    """OpenAPI 3.0 → JSON Schema Draft 4: ``nullable`` and ``x-kubernetes-int-or-string`` become
    types; the x-kubernetes-* extensions are dropped (handled by the walks below)."""
    if isinstance(schema, list):
        return [_json_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key.startswith("x-kubernetes-") or key in ("nullable", "format", "default", "description"):
            continue
        if key in ("properties", "patternProperties", "definitions"):
            out[key] = {k: _json_schema(v) for k, v in value.items()}
        elif key in ("items", "additionalProperties", "not", "allOf", "anyOf", "oneOf"):
            out[key] = _json_schema(value)
        else:
            out[key] = value
    if schema.get("x-kubernetes-int-or-string"):
        # apiextensions: pkg/apiserver/schema/validation.go — int-or-string takes either type
        out.pop("anyOf", None)
        out["type"] = ["integer", "string"]
    if schema.get("nullable") and "type" in out:
        types = out["type"] if isinstance(out["type"], list) else [out["type"]]
        out["type"] = [*types, "null"]
    return out


@dataclass
class CRD:
    """One CustomResourceDefinition (apiextensions.k8s.io/v1)."""

    raw: dict[str, Any]
    group: str = field(init=False)
    plural: str = field(init=False)
    singular: str = field(init=False)
    kind: str = field(init=False)
    list_kind: str = field(init=False)
    short_names: list[str] = field(init=False)
    categories: list[str] = field(init=False)
    namespaced: bool = field(init=False)

    def __post_init__(self) -> None:
        spec = self.raw["spec"]
        names = spec["names"]
        self.group = spec["group"]
        self.plural = names["plural"]
        self.singular = names.get("singular", names["plural"])
        self.kind = names["kind"]
        self.list_kind = names.get("listKind", names["kind"] + "List")
        self.short_names = list(names.get("shortNames", []))
        self.categories = list(names.get("categories", []))
        self.namespaced = spec["scope"] == "Namespaced"

    @property
    def versions(self) -> list[str]:
        return [v["name"] for v in self.raw["spec"]["versions"] if v.get("served", True)]

    @property
    def storage_version(self) -> str:
        return next(v["name"] for v in self.raw["spec"]["versions"] if v.get("storage"))

    def schema(self, version: str) -> dict[str, Any]:
        for v in self.raw["spec"]["versions"]:
            if v["name"] == version:
                return dict(v["schema"]["openAPIV3Schema"])
        raise KeyError(version)

    @cached_property
    def _validators(self) -> dict[str, jsonschema.Draft4Validator]:
        return {v: jsonschema.Draft4Validator(_json_schema(self.schema(v))) for v in self.versions}

    # --- apiextensions-apiserver: pkg/apiserver/schema/pruning/algorithm.go PruneWithOptions
    def prune(self, version: str, obj: dict[str, Any]) -> list[str]:
        """Drop the fields the schema does not declare (in place); the paths dropped, as
        ``unknown field "spec.foo"`` is reported (pruning/algorithm.go ReturnPruned)."""
        pruned: list[str] = []
        schema = self.schema(version)
        for key in list(obj):
            if key in ("apiVersion", "kind", "metadata"):
                continue  # pruning/algorithm.go: apiVersion, kind and metadata are always kept
            sub = schema.get("properties", {}).get(key)
            if sub is None:
                pruned.append(key)
                del obj[key]
            else:
                _prune(obj[key], sub, [key], pruned)
        return pruned

    # --- apiextensions-apiserver: pkg/apiserver/schema/defaulting/algorithm.go Default
    def default(self, version: str, obj: dict[str, Any]) -> None:
        _default(obj, self.schema(version))

    def validate(self, version: str, obj: dict[str, Any], old: dict[str, Any] | None) -> list[FieldError]:
        """apiextensions-apiserver: pkg/registry/customresource/strategy.go
        (customResourceStrategy).Validate / ValidateUpdate — object meta, the OpenAPI schema
        (validation.go ValidateCustomResource), list types (listtype/validation.go
        ValidateListSetsAndMaps) and CEL (schema/cel/validation.go (*Validator).Validate)."""
        errors: list[FieldError] = []
        name = obj.get("metadata", {}).get("name", "")
        if not name:
            errors.append(FieldError("metadata.name", "Required value", "name or generateName is required"))
        elif len(name) > 253 or not _DNS1123_SUBDOMAIN.match(name):
            errors.append(
                FieldError(
                    "metadata.name",
                    "Invalid value",
                    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
                    "'-' or '.', and must start and end with an alphanumeric character (e.g. "
                    "'example.com', regex used for validation is "
                    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
                    name,
                )
            )
        body = {k: v for k, v in obj.items() if k != "metadata"}
        for error in sorted(self._validators[version].iter_errors(body), key=lambda e: list(e.path)):
            errors.append(_schema_error(error))
        schema = self.schema(version)
        _list_types(body, schema, [], errors)
        if not errors:  # the API server runs CEL only on a schema-valid object
            # cel/validation.go: of metadata, rules see only name and generateName
            _cel(_cel_view(obj), None if old is None else _cel_view(old), schema, [], errors)
        return errors


def _cel_view(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    return {**obj, "metadata": {k: meta[k] for k in ("name", "generateName") if k in meta}}


def _prune(value: Any, schema: dict[str, Any], path: list[str | int], pruned: list[str]) -> None:
    if schema.get("x-kubernetes-preserve-unknown-fields") and "properties" not in schema:
        return
    if isinstance(value, dict):
        if schema.get("x-kubernetes-embedded-resource"):
            props = {**schema.get("properties", {}), "apiVersion": {}, "kind": {}, "metadata": {}}
        else:
            props = schema.get("properties")
        additional = schema.get("additionalProperties")
        for key in list(value):
            if props is not None and key in props:
                _prune(value[key], props[key], [*path, key], pruned)
            elif isinstance(additional, dict):
                _prune(value[key], additional, [*path, key], pruned)
            elif additional is True or schema.get("x-kubernetes-preserve-unknown-fields"):
                continue
            elif props is not None or additional is False or schema.get("type") == "object":
                pruned.append(_path([*path, key]))
                del value[key]
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            _prune(item, schema["items"], [*path, i], pruned)


def _default(value: Any, schema: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for key, sub in schema.get("properties", {}).items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                _default(value[key], sub)
        additional = schema.get("additionalProperties")
        if isinstance(additional, dict):
            for key in value:
                _default(value[key], additional)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            _default(item, schema["items"])


def _schema_error(error: jsonschema.ValidationError) -> FieldError:
    """kube-openapi: pkg/validation/errors — the texts the API server returns for a schema
    violation, converted to field errors by apiextensions-apiserver validation.go
    ValidateCustomResource (``<path> in body ...``)."""
    parts = list(error.absolute_path)
    if error.validator == "required":
        missing = re.match(r"'([^']+)' is a required property", error.message)
        name = missing[1] if missing else "?"
        return FieldError(
            _path([*parts, name]), "Required value", "", show_value=False, reason="FieldValueRequired"
        )
    where = _path(parts) or "<root>"
    value = error.instance
    if error.validator == "type":
        expected = error.validator_value
        want = expected if isinstance(expected, str) else next(t for t in expected if t != "null")
        return FieldError(
            where,
            "Invalid value",
            f'{where} in body must be of type {want}: "{_cel_type(value)}"',
            _cel_type(value),
        )
    if error.validator == "enum":
        allowed = ", ".join(json.dumps(v) for v in error.validator_value)
        return FieldError(
            where, "Unsupported value", f"supported values: {allowed}", value, reason="FieldValueNotSupported"
        )
    texts = {
        "minimum": f"{where} in body should be greater than or equal to {error.validator_value}",
        "maximum": f"{where} in body should be less than or equal to {error.validator_value}",
        "minLength": f"{where} in body should be at least {error.validator_value} chars long",
        "maxLength": f"{where} in body should be at most {error.validator_value} chars long",
        "minItems": f"{where} in body should have at least {error.validator_value} items",
        "maxItems": f"{where} in body should have at most {error.validator_value} items",
        "pattern": f"{where} in body should match '{error.validator_value}'",
    }
    detail = texts.get(str(error.validator), error.message)
    shown = value if not isinstance(value, dict | list) else _cel_type(value)
    return FieldError(where, "Invalid value", detail, shown)


def _list_types(value: Any, schema: dict[str, Any], path: list[str | int], errors: list[FieldError]) -> None:
    """apiextensions-apiserver: pkg/apiserver/schema/listtype/validation.go validateListSetsAndMapsArray
    — ``set`` items and ``map`` keys are unique."""
    if isinstance(value, dict):
        for key, sub in value.items():
            child = schema.get("properties", {}).get(key)
            if child is None and isinstance(schema.get("additionalProperties"), dict):
                child = schema["additionalProperties"]
            if child is not None:
                _list_types(sub, child, [*path, key], errors)
    elif isinstance(value, list):
        items = schema.get("items") if isinstance(schema.get("items"), dict) else {}
        kind = schema.get("x-kubernetes-list-type")
        seen: dict[str, int] = {}
        for i, item in enumerate(value):
            if kind == "set":
                key = json.dumps(item, sort_keys=True)
            elif kind == "map" and isinstance(item, dict):
                keys = schema.get("x-kubernetes-list-map-keys", [])
                key = json.dumps({k: item.get(k) for k in keys}, sort_keys=True)
            else:
                key = ""
            if key:
                if key in seen:
                    shown = item if kind == "set" else json.loads(key)
                    errors.append(
                        FieldError(
                            _path([*path, i]), "Duplicate value", "", shown, reason="FieldValueDuplicate"
                        )
                    )
                seen[key] = i
            _list_types(item, items or {}, [*path, i], errors)


def _program(rule: str) -> Program:
    program = _PROGRAMS.get(rule)
    if program is None:
        program = _PROGRAMS[rule] = _CEL.compile(rule)
    return program


def _cel(
    value: Any, old: Any, schema: dict[str, Any], path: list[str | int], errors: list[FieldError]
) -> None:
    """apiextensions-apiserver: pkg/apiserver/schema/cel/validation.go (*Validator).validate — each
    node's rules with ``self`` (and ``oldSelf`` for transition rules, only on UPDATE where the
    old object has the node: validation.go (*Validator).validateExpressions skips them otherwise)."""
    for rule in schema.get("x-kubernetes-validations", []):
        source = rule["rule"]
        transition = "oldSelf" in source
        if transition and old is None:
            continue
        where = _path(path) or "<root>"
        try:
            program = _program(source)
            result = program.evaluate(_CEL.inputs({"self": value, "oldSelf": old}))
        except (CompileError, EvalError) as exc:
            errors.append(
                FieldError(
                    where, "Invalid value", f"{_cel_type(value)}: {exc}", _cel_type(value), show_value=False
                )
            )
            continue
        if result is not True:
            message = rule.get("message") or f"failed rule: {source}"
            target = where
            if rule.get("fieldPath"):
                target = where + rule["fieldPath"] if where != "<root>" else rule["fieldPath"].lstrip(".")
            reason = {
                "FieldValueForbidden": "Forbidden",
                "FieldValueRequired": "Required value",
                "FieldValueDuplicate": "Duplicate value",
            }.get(rule.get("reason", ""), "Invalid value")
            errors.append(FieldError(target, reason, message, _cel_type(value)))
    if isinstance(value, dict):
        props = schema.get("properties", {})
        additional = schema.get("additionalProperties")
        for key, sub in value.items():
            child = props.get(key) if key in props else (additional if isinstance(additional, dict) else None)
            if child is not None:
                before = old.get(key) if isinstance(old, dict) else None
                _cel(sub, before, child, [*path, key], errors)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            before = old[i] if isinstance(old, list) and i < len(old) else None
            _cel(item, before, schema["items"], [*path, i], errors)


def load_crds(directory: Path) -> list[CRD]:
    """Every CustomResourceDefinition in ``directory``'s YAML files."""
    crds = []
    for path in sorted(directory.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                crds.append(CRD(doc))
    return crds
