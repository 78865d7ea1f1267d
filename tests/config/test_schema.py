"""The shipped schemas: valid draft 2020-12, self-contained, documented, and the reference doc."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from mpigate.config import KINDS, kind_schema
from mpigate.config.reference import render_reference
from tests.conftest import REPO


@pytest.mark.parametrize("kind", KINDS)
def test_schema_is_valid_and_self_contained(kind: str) -> None:
    schema = kind_schema(kind)
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    text = str(schema)
    for ref in _refs(schema):
        assert ref.startswith("#/$defs/"), ref
        assert ref.split("/")[-1] in schema["$defs"], ref
    assert schema["properties"]["kind"] == {"const": kind}
    assert "additionalProperties" in text


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        out = [node["$ref"]] if "$ref" in node else []
        for value in node.values():
            out.extend(_refs(value))
        return out
    if isinstance(node, list):
        return [r for item in node for r in _refs(item)]
    return []


@pytest.mark.parametrize("kind", KINDS)
def test_unknown_keys_are_rejected_at_every_level(kind: str) -> None:
    """Every object schema that declares properties also forbids others."""

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            if (
                "properties" in node
                and node.get("type", "object") == "object"
                and path != "$defs.objectSource"
            ):
                assert node.get("additionalProperties") is False or "$ref" in node, path
            for key, value in node.items():
                walk(value, f"{path}.{key}")
        elif isinstance(node, list):
            for i, item in enumerate(node):
                walk(item, f"{path}[{i}]")

    walk(kind_schema(kind), kind)


def test_config_reference_is_current() -> None:
    current = (REPO / "docs" / "config-reference.md").read_text(encoding="utf-8")
    assert current == render_reference(), "docs/config-reference.md is stale: run `make docs`"


def test_config_reference_lists_the_fields_of_an_object_alternative() -> None:
    """Issue 21 item 8: ``runtimes.allowed`` takes a name or an object; the object's fields are
    documented too."""
    rows = {line.split("|")[1].strip() for line in render_reference().splitlines() if line.startswith("| `")}
    for field in ("name", "kind", "external", "teams"):
        assert f"`spec.runtimes.allowed[].{field}`" in rows
