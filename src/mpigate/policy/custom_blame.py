"""Where a violation on an effective pod is reported: the field the validation's ``fieldPath`` names,
or else the containers, init containers, ephemeral containers or volumes it comes from (found by
judging the pod with that list narrowed to one item, and that item without each of its fields), in
the TrainJob, runtime or runtime patch that set it (:meth:`EffectiveJob.origin`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mpigate.cel import Budget, EvalError, Inputs
from mpigate.cel.reads import Need
from mpigate.cel.validation import CompiledPolicy, Outcome, Validation
from mpigate.config.crossfile.customrules import _environment
from mpigate.trainjob import EffectiveJob

__all__ = ["Narrowed", "blame", "field_path"]

_LISTS = ("initContainers", "containers", "ephemeralContainers", "volumes")


def field_path(template: str, index: tuple[str, int] | None) -> list[str | int]:
    """``spec.containers[*].x`` as path parts, ``[*]`` the blamed item."""
    parts: list[str | int] = []
    for piece in template.replace("[*]", ".[*]").split("."):
        if not piece:
            continue
        if piece == "[*]":
            parts.append(index[1] if index is not None else 0)
        elif piece.endswith("]") and "[" in piece:
            name, _, number = piece[:-1].partition("[")
            parts.append(name)
            parts.append(int(number) if number.isdigit() else number)
        else:
            parts.append(piece)
    return parts


def blame(
    policy: CompiledPolicy,
    outcome: Outcome,
    narrowed: Narrowed,
    where: str,
    job: EffectiveJob | None,
    budget: Budget,
) -> list[str]:
    validation = outcome.validation
    if job is None or validation is None:
        field = validation.field_path if validation is not None else ""
        return [f"{where}{'.' if where and field else ''}{field}" if field else (where or "(object)")]
    items = blamed_items(policy, validation, narrowed, budget)
    paths: list[str] = []
    picks: list[tuple[str, int, Any] | None] = list(items) or [None]
    for pick in picks:
        if validation.field_path:
            paths.append(job.origin(field_path(validation.field_path, pick[:2] if pick else None)))
        elif pick is not None:
            list_field, index, key = pick
            item: tuple[str | int, ...] = ("spec", list_field, index)
            paths.append(job.origin((*item, key) if key else item))  # None: the item as a whole
        else:
            paths.append(job.origin(("spec",)))
    return list(dict.fromkeys(paths))


@dataclass
class Narrowed:
    """One object's pod with one list narrowed — to nothing, to one item, or to one item without one
    field — as CEL inputs: converted on first use and shared by every rule blamed on the pod (each
    conversion costs more than an evaluation). ``base`` holds the inputs with the pod as the rules
    read it (:func:`mpigate.cel.reads.prune`), ``pod`` the whole pod (its lists and fields are what
    blame tries, in their order), ``size`` the cost bound's n of the whole pod and shared values:
    a narrowed pod is no larger, so it is measured once."""

    base: Mapping[str, Any]
    pod: Mapping[str, Any]
    size: int
    # keyed by (list, index, field): a field's key is whatever the object has (a YAML key may be a number)
    inputs: dict[tuple[str, int, Any], Inputs | None] = field(default_factory=dict)

    def read(self, list_field: str, index: int, removed: Any) -> bool:
        """Whether a rule can observe ``list_field`` (item ``index`` without its field ``removed``):
        what no rule reads was cut from ``base``, and judging the pod without it gives the pod's
        own result."""
        spec = self.base["object"].get("spec")
        items = spec.get(list_field) if isinstance(spec, dict) else None
        if not isinstance(items, list):
            return False
        if removed is None:
            return True
        item = items[index]
        return isinstance(item, dict) and removed in item

    def get(self, list_field: str, index: int, removed: Any) -> Inputs | None:
        """The inputs with ``list_field`` narrowed to item ``index`` (-1: none) without its field
        ``removed`` (None: whole); None when they cannot be represented in CEL."""
        key = (list_field, index, removed)
        if key in self.inputs:
            return self.inputs[key]
        pod = self.base["object"]
        spec = pod.get("spec") or {}
        items: list[Any] = []
        if index >= 0:
            item = spec[list_field][index]
            items.append(item if removed is None else {n: v for n, v in item.items() if n != removed})
        narrowed = {**pod, "spec": {**spec, list_field: items}}
        try:
            found: Inputs | None = _environment().inputs({**self.base, "object": narrowed}, self.size)
        except EvalError:
            found = None
        self.inputs[key] = found
        return found


def blamed_items(
    policy: CompiledPolicy, validation: Validation, narrowed: Narrowed, budget: Budget
) -> list[tuple[str, int, Any]]:
    """The items (containers, volumes...) a violation comes from — each alone still violates, and
    the pod without that list does not — and, within an item, the fields whose removal mends it
    (None: the item as a whole; a field's key is whatever the object has, a YAML key may be a
    number); only evaluated for a violation, never on a passing pod. A list or field no rule reads
    is not judged again: the pod without it still violates, and the budget is charged as if it had
    been judged."""
    env = _environment()
    # read as it is (plain or frozen), as thaw would give it: a mapping's keys in order, any
    # sequence but a string as a list
    spec = narrowed.pod.get("spec") or {}
    out: list[tuple[str, int, Any]] = []

    def violates(list_need: Need | None, list_field: str, index: int, removed: Any = None) -> bool:
        if not _part_read(list_need, removed) or not narrowed.read(list_field, index, removed):
            # what the expression does not read: judged without it, the pod still violates
            return policy.charge_violation(validation, narrowed.size, budget)
        inputs = narrowed.get(list_field, index, removed)
        if inputs is None:
            return False
        verdict = policy.check(env, inputs, validation, budget)
        return verdict is not None and verdict.kind == "violation"

    for list_field in _LISTS:
        items = spec.get(list_field)
        if not isinstance(items, Sequence) or isinstance(items, str | bytes) or len(items) < 1:
            continue
        list_need = _list_need(validation, list_field)  # once per list, not per item and field
        if violates(list_need, list_field, -1):
            continue  # the violation does not come from this list (a pod's volumes for its containers)
        for index, item in enumerate(items):
            if not violates(list_need, list_field, index):
                continue
            keys: list[Any] = (
                [k for k in item if k != "name" and not violates(list_need, list_field, index, k)]
                if isinstance(item, Mapping)
                else []
            )
            out.extend((list_field, index, key) for key in keys or [None])
    return out


def _list_need(validation: Validation, list_field: str) -> Need | None:
    """What ``validation``'s expression reads of the pod's ``spec.<list_field>`` (None: nothing; a
    need read whole also when the spec or the whole pod is) — else the pod narrowed there judges as
    the pod itself. The object is converted whole or not at all, so a part no expression reads
    cannot fail it either."""
    need = validation.expression.program.reads.get("object")
    for step in ("spec", list_field):
        if need is None or need.whole:
            return need
        need = need.child(step)
    return need


def _part_read(need: Need | None, removed: Any) -> bool:
    """Whether what is read of a list (``need``, :func:`_list_need`) observes the list (``removed``
    None) or the field ``removed`` of its items."""
    if need is None:
        return False
    if need.whole or removed is None:
        return True
    element = need.any  # an item is read by iterating or indexing the list
    return element is not None and (element.whole or element.child(removed) is not None)
