"""JSON Schemas (draft 2020-12) of the config kinds, validation to located problems, defaults."""

from __future__ import annotations

import copy
import difflib
import json
from collections.abc import Iterator, Mapping
from functools import cache
from importlib import resources
from typing import Any, cast

import jsonschema
import yaml
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match

from .problems import Problem, Severity, format_path
from .yamlsource import Document

__all__ = [
    "ADMISSION_SCHEMA_KINDS",
    "API_VERSION",
    "KINDS",
    "apply_defaults",
    "defaults_from",
    "kind_schema",
    "validate_document",
]

API_VERSION = "mpigate.io/v1alpha1"
KINDS: tuple[str, ...] = (
    "OrgPolicy",
    "GPUFlavors",
    "TeamQuota",
    "Personas",
    "TeamAccess",
    "NetworkProfiles",
    "TeamNetwork",
    "PolicyException",
    "PolicyTest",
    "CustomRule",
)
# Kubernetes kinds a tree may hold, validated by mpigate's schemas of them (config/admission.py).
ADMISSION_SCHEMA_KINDS: tuple[str, ...] = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


def _read_schema_file(name: str) -> dict[str, Any]:
    text = resources.files(__package__).joinpath("schemas", name).read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    assert isinstance(data, dict)
    return data


@cache
def _kind_schema_json(kind: str) -> str:
    if kind not in KINDS and kind not in ADMISSION_SCHEMA_KINDS:
        raise KeyError(kind)
    schema = _read_schema_file(f"{kind}.yaml")
    common = _read_schema_file("_common.yaml")["$defs"]
    if kind in ADMISSION_SCHEMA_KINDS:
        common = {**common, **_read_schema_file("_admission.yaml")["$defs"]}
    defs = {**common, **schema.get("$defs", {})}
    ordered: dict[str, Any] = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://mpigate.io/schemas/v1alpha1/{kind}.json",
    }
    ordered.update({k: v for k, v in schema.items() if k != "$defs"})
    ordered["$defs"] = defs
    return json.dumps(ordered, sort_keys=False)


def kind_schema(kind: str) -> dict[str, Any]:
    """The self-contained JSON Schema of ``kind`` (a fresh copy; KeyError when unknown)."""
    result: dict[str, Any] = json.loads(_kind_schema_json(kind))
    return result


@cache
def _validator(kind: str) -> Draft202012Validator:
    schema = kind_schema(kind)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def _resolve(schema: Mapping[str, Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        target = root["$defs"][ref.split("/")[-1]]
        merged = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
        if "properties" in target and "properties" in schema:
            merged["properties"] = {**target["properties"], **schema["properties"]}
        return _resolve(merged, root) if "$ref" in target else merged
    return schema


def _defaults_into(instance: Any, schema: Mapping[str, Any], root: Mapping[str, Any]) -> None:
    schema = _resolve(schema, root)
    if isinstance(instance, dict):
        props: Mapping[str, Any] = schema.get("properties", {})
        for key, sub in props.items():
            sub_resolved = _resolve(sub, root)
            if key not in instance and "default" in sub_resolved:
                instance[key] = copy.deepcopy(sub_resolved["default"])
            if key in instance:
                _defaults_into(instance[key], sub_resolved, root)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key, value in instance.items():
                if key not in props:
                    _defaults_into(value, extra, root)
        for alternative in schema.get("oneOf", ()):
            alt = _resolve(alternative, root)
            if alt.get("type") == "object" and all(r in instance for r in alt.get("required", ())):
                _defaults_into(instance, alt, root)
                break
    elif isinstance(instance, list):
        items = schema.get("items")
        if isinstance(items, dict):
            for item in instance:
                _defaults_into(item, items, root)


def defaults_from(schema: Mapping[str, Any], instance: Any) -> Any:
    """A copy of ``instance`` (valid against ``schema``, a JSON Schema of its own, e.g. a rule's
    ``paramsSchema``) with the schema's defaults filled in (``None``: the schema's top default)."""
    if instance is None and "default" in schema:
        instance = schema["default"]
    if instance is None and schema.get("type") == "object":
        instance = {}
    result = copy.deepcopy(instance)
    _defaults_into(result, schema, schema)
    return result


def apply_defaults(kind: str, document: Any) -> Any:
    """A copy of a *valid* document of ``kind`` with every schema ``default`` filled in.

    The schemas are the single source of defaults: docs, editors and the loader agree.
    """
    result = copy.deepcopy(document)
    schema = kind_schema(kind)
    _defaults_into(result, schema, schema)
    return result


# ----------------------------------------------------------------------------------------------
# errors → problems


def _describe(value: Any) -> str:
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return f"number {value}"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"string {json.dumps(shown)}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


_TYPE_NAMES = {
    "object": "a mapping",
    "array": "a list",
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "null": "null",
}


def _expected(types: Any) -> str:
    if isinstance(types, list):
        names = [_TYPE_NAMES.get(str(t), str(t)) for t in types if t != "null"]
        return " or ".join(dict.fromkeys(names))
    return _TYPE_NAMES.get(types, str(types))


def _flatten(error: ValidationError) -> ValidationError:
    """For oneOf/anyOf, the alternative that got furthest is the useful one to report."""
    if error.validator in ("oneOf", "anyOf") and error.context:
        deepest = best_match(error.context)
        if deepest is not None:
            return _flatten(deepest)
    return error


def _errors_of(validator: Draft202012Validator, instance: Any) -> Iterator[ValidationError]:
    for error in validator.iter_errors(instance):
        yield _flatten(error)


def _schema_title(schema: Mapping[str, Any]) -> str:
    return str(schema.get("description", "")).split(". ")[0].rstrip(".")


def _problem(doc: Document, error: ValidationError, extra_path: tuple[str | int, ...] = ()) -> Problem:
    path = (*tuple(error.absolute_path), *extra_path)
    shown = format_path(path)
    value = error.instance
    validator = error.validator
    hint = ""
    code = f"schema.{validator}"
    schema = error.schema if isinstance(error.schema, Mapping) else {}
    if validator == "type":
        message = f"expected {_expected(error.validator_value)}, got {_describe(value)}"
        if isinstance(value, bool) and "string" in str(error.validator_value):
            hint = "YAML reads yes/no/on/off/true/false as booleans; quote the value"
        elif isinstance(value, str) and error.validator_value in ("integer", "number"):
            hint = "write the number without quotes"
    elif validator == "required":
        missing = str(error.message).split("'")[1] if "'" in error.message else error.message
        message = f"missing required field {missing!r}"
        return Problem(doc.locate(path), shown, message, code, hint=_field_hint(schema, missing))
    elif validator == "enum":
        choices: list[Any] = list(cast(Any, error.validator_value))
        allowed = ", ".join(json.dumps(v) for v in choices)
        message = f"{_describe(value)} is not one of {allowed}"
        if isinstance(value, str):
            close = difflib.get_close_matches(value, [str(v) for v in choices], n=1)
            if close:
                hint = f"did you mean {close[0]!r}?"
    elif validator == "const":
        message = f"must be {json.dumps(error.validator_value)}, got {_describe(value)}"
    elif validator == "pattern":
        message = f"{_describe(value)} is not valid"
        title = _schema_title(schema)
        hint = f"expected {title[0].lower() + title[1:]}" if title else f"must match {error.validator_value}"
    elif validator in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        words = {
            "minimum": "at least",
            "exclusiveMinimum": "greater than",
            "maximum": "at most",
            "exclusiveMaximum": "less than",
        }[str(validator)]
        message = f"{_describe(value)} must be {words} {error.validator_value}"
    elif validator in ("minItems", "minProperties"):
        message = f"needs at least {error.validator_value} entr{'y' if error.validator_value == 1 else 'ies'}"
    elif validator in ("maxLength",):
        message = f"is longer than {error.validator_value} characters"
    elif validator == "uniqueItems":
        message = "entries must be unique"
    elif validator == "format":
        message = f"{_describe(value)} is not a valid {error.validator_value}"
    elif validator in ("oneOf", "anyOf"):
        message = f"{_describe(value)} does not match any allowed form"
    else:
        message = error.message
    return Problem(doc.locate(path, key=validator != "type"), shown, message, code, Severity.ERROR, hint)


def _field_hint(schema: Mapping[str, Any], field: str) -> str:
    props = schema.get("properties", {})
    sub = props.get(field, {}) if isinstance(props, Mapping) else {}
    desc = str(sub.get("description", "")) if isinstance(sub, Mapping) else ""
    return desc.split(". ")[0].rstrip(".") if desc else ""


def _unknown_key_problems(doc: Document, error: ValidationError) -> list[Problem]:
    schema = error.schema if isinstance(error.schema, Mapping) else {}
    known = list(schema.get("properties", {}))
    instance = error.instance if isinstance(error.instance, dict) else {}
    problems = []
    for key in instance:
        if key in known:
            continue
        path = (*tuple(error.absolute_path), key)
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        if close:
            hint = f"did you mean {close[0]!r}?"
        elif known:
            hint = "allowed keys here: " + ", ".join(known)
        else:
            hint = ""
        problems.append(
            Problem(
                doc.locate(path), format_path(path), f"unknown key {key!r}", "schema.unknown-key", hint=hint
            )
        )
    return problems


def validate_document(kind: str, doc: Document) -> list[Problem]:
    """Every schema problem of ``doc`` (a document of ``kind``), located."""
    validator = _validator(kind)
    problems: list[Problem] = []
    seen: set[tuple[str, str]] = set()
    for error in _errors_of(validator, doc.data):
        if error.validator == "additionalProperties" and error.validator_value is False:
            found = _unknown_key_problems(doc, error)
        elif "propertyNames" in error.schema_path:
            found = [_bad_name_problem(doc, error)]
        else:
            found = [_problem(doc, error)]
        for problem in found:
            key = (problem.path, problem.message)
            if key not in seen:
                seen.add(key)
                problems.append(problem)
    return problems


def _bad_name_problem(doc: Document, error: ValidationError) -> Problem:
    """A mapping key that is not a valid name (jsonschema reports it on the parent mapping)."""
    bad = error.instance
    path = (*tuple(error.absolute_path), bad) if isinstance(bad, str) else tuple(error.absolute_path)
    schema = error.schema if isinstance(error.schema, Mapping) else {}
    title = _schema_title(schema)
    hint = f"expected {title[0].lower() + title[1:]}" if title else ""
    return Problem(
        doc.locate(path),
        format_path(path),
        f"{_describe(bad)} is not a valid name here",
        "schema.name",
        hint=hint,
    )


def check_schemas() -> None:
    """Raise when a shipped schema is not a valid draft 2020-12 schema (used by tests)."""
    for kind in KINDS:
        jsonschema.Draft202012Validator.check_schema(kind_schema(kind))
