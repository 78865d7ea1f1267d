"""The engine's dataclasses whose ``__init__`` is written out (so that mypyc compiles it: the one
``@dataclass`` generates stays interpreted, docs/building.md) construct exactly what the generated
one would: every field from its own argument, by position and by keyword, each default the declared
one, a fresh object from each ``default_factory``, and still frozen. The check runs over every
dataclass of the compiled modules, so a field added without its ``__init__`` line fails here. It
passes stand-in values of no field's type, so it runs on the pure build (the compiled one checks
each attribute's type on assignment); the source is the same in both."""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import pytest

from mpigate._build import module_builds


def _dataclasses() -> list[type[Any]]:
    found: dict[str, type[Any]] = {}
    for name in sorted(module_builds()):
        module = importlib.import_module(name)
        for value in vars(module).values():
            if isinstance(value, type) and dataclasses.is_dataclass(value) and value.__module__ == name:
                found[f"{name}.{value.__qualname__}"] = value
    return [found[key] for key in sorted(found)]


CLASSES = _dataclasses()
pytestmark = pytest.mark.skipif(
    any(module_builds().values()), reason="stand-in values need the pure build (see the docstring)"
)


class _Token:
    """A distinct value per field (compared by identity)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"


def _init_fields(cls: type[Any]) -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(cls) if f.init]


def test_the_engines_dataclasses_are_found() -> None:
    names = {cls.__qualname__ for cls in CLASSES}
    assert {"Layer", "EffectiveJob", "Resolution", "JobContext", "Finding", "Decision", "Key"} <= names


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: f"{cls.__module__}.{cls.__qualname__}")
def test_every_field_comes_from_its_argument(cls: type[Any]) -> None:
    fields = _init_fields(cls)
    tokens = [_Token(f.name) for f in fields]
    by_position = cls(*tokens)
    by_keyword = cls(**{f.name: token for f, token in zip(fields, tokens, strict=True)})
    for f, token in zip(fields, tokens, strict=True):
        assert getattr(by_position, f.name) is token, f.name
        assert getattr(by_keyword, f.name) is token, f.name
    if cls.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(by_keyword, fields[0].name, None)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: f"{cls.__module__}.{cls.__qualname__}")
def test_defaults_are_the_declared_ones(cls: type[Any]) -> None:
    fields = _init_fields(cls)
    required = {
        f.name: _Token(f.name)
        for f in fields
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    first, second = cls(**required), cls(**required)
    for f in fields:
        if f.name in required:
            continue
        if f.default is not dataclasses.MISSING:
            assert getattr(first, f.name) == f.default, f.name
            assert type(getattr(first, f.name)) is type(f.default), f.name
            continue
        made = f.default_factory()  # type: ignore[misc]
        assert getattr(first, f.name) == made and type(getattr(first, f.name)) is type(made), f.name
        if isinstance(made, dict | list | set):  # a mutable default is never shared
            assert getattr(first, f.name) is not getattr(second, f.name), f.name
