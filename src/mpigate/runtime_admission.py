"""Would the webhook admit the tree's approved runtimes? And if not, what makes them compliant?

``mpigate check`` asks the admission engine itself (``policy.evaluate`` on a CREATE of each
in-tree runtime, exactly what the webhook does when the runtime is installed), so that a tree
whose approved runtimes cannot be installed fails in CI instead of at ``kubectl apply``.

For each denied runtime a JSONPatch is proposed for the violations that have one compliant value
(Pod Security's securityContext fields, host namespaces): the engine judges the patched runtime
again, and the patch is offered as making it compliant only when it does; violations without a
mechanical fix (an image from a foreign registry, an SSH key path) are listed with their fix text.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mpigate.config import Config
from mpigate.config.frozen import freeze, thaw
from mpigate.config.model import Runtime
from mpigate.policy import AdmissionInput, Decision, UserInfo, apply_patch, evaluate
from mpigate.policy.decision import Violation
from mpigate.policy.jsonpatch import pointer

__all__ = ["RuntimeVerdict", "judge_runtimes"]

# A compliant value per rule, for the field the violation points at: (operation, value).
# "remove" drops the field; "set" adds or replaces it. Restricted Pod Security:
# k8s.io/pod-security-admission policy/check_*.go (the engine's pss.py follows them).
_Setting = tuple[str, Any]
_FIXES: Mapping[str, Callable[[str, Any], _Setting | None]] = {
    "MPG-SEC-ALLOWPRIVILEGEESCALATION": lambda _leaf, _v: ("set", False),
    "MPG-SEC-RUNASNONROOT": lambda _leaf, _v: ("set", True),
    "MPG-SEC-SECCOMPPROFILE-RESTRICTED": lambda _leaf, _v: ("set", "RuntimeDefault"),
    "MPG-SEC-SECCOMPPROFILE-BASELINE": lambda _leaf, _v: ("set", "RuntimeDefault"),
    "MPG-SEC-RUNASUSER": lambda _leaf, _v: ("remove", None),
    "MPG-SEC-HOSTNAMESPACES": lambda _leaf, _v: ("remove", None),
    "MPG-SEC-PRIVILEGED": lambda _leaf, _v: ("set", False),
    "MPG-SEC-HOSTPORTS": lambda _leaf, _v: ("remove", None),
    "MPG-SEC-CAPABILITIES-RESTRICTED": lambda leaf, value: (
        ("set", ["ALL"])
        if leaf == "drop"
        else ("set", [c for c in value if c == "NET_BIND_SERVICE"])
        if leaf == "add" and isinstance(value, list)
        else None
    ),
}

_STEP = re.compile(
    r'\.?([A-Za-z_$][A-Za-z0-9_$-]*)|\[(\d+)\]|\[([A-Za-z]+)=([^\]]*)\]|\["((?:[^"\\]|\\.)*)"\]'
)


@dataclass(frozen=True, slots=True)
class RuntimeVerdict:
    """The webhook's answer for one approved runtime, and the way to a compliant one."""

    runtime: Runtime
    decision: Decision
    patch: tuple[dict[str, Any], ...] = ()  # proposed JSONPatch (RFC 6902) on the manifest
    after: Decision | None = None  # the engine's answer for the patched manifest

    @property
    def denied(self) -> bool:
        return not self.decision.allowed

    @property
    def patch_complies(self) -> bool:
        return self.after is not None and self.after.allowed

    @property
    def by_hand(self) -> tuple[Violation, ...]:
        """Denying violations the patch leaves (the patched runtime's, or all when no patch)."""
        left = self.after if self.after is not None else self.decision
        return tuple(v for v in left.violations if v.denies)


def judge_runtimes(config: Config) -> list[RuntimeVerdict]:
    """The engine's verdict on a CREATE of every runtime in the tree, in file order."""
    verdicts = []
    for runtime in sorted(config.runtimes.values(), key=lambda r: (r.source.file, r.source.line)):
        decision = _create(config, runtime, runtime.manifest)
        if decision.allowed:
            verdicts.append(RuntimeVerdict(runtime, decision))
            continue
        patch = _patch_for(runtime.manifest, decision.violations)
        after = _patched_verdict(config, runtime, patch) if patch else None
        verdicts.append(RuntimeVerdict(runtime, decision, patch, after))
    return verdicts


def _patched_verdict(config: Config, runtime: Runtime, patch: Sequence[Mapping[str, Any]]) -> Decision:
    """The engine's answer once the patch is in the tree's file: the patched manifest judged
    against a config holding it (the drift rule MPG-RT-001 compares a runtime with the tree's)."""
    patched = dataclasses.replace(runtime, manifest=freeze(apply_patch(runtime.manifest, patch)))
    key = next(k for k, v in config.runtimes.items() if v is runtime)
    edited = dataclasses.replace(config, runtimes={**config.runtimes, key: patched})
    return _create(edited, patched, patched.manifest)


def _create(config: Config, runtime: Runtime, manifest: Mapping[str, Any]) -> Decision:
    request = AdmissionInput(
        operation="CREATE",
        kind=runtime.kind,
        namespace=runtime.namespace,
        name=runtime.name,
        obj=manifest,
        user=UserInfo("mpigate-check", ("system:authenticated",)),
    )
    return evaluate(config, request)


def _patch_for(manifest: Mapping[str, Any], violations: Sequence[Violation]) -> tuple[dict[str, Any], ...]:
    """JSONPatch operations that give each fixable violation's field its compliant value."""
    ops: list[dict[str, Any]] = []
    done: set[str] = set()
    doc: Any = thaw(manifest)  # a working copy: later operations see the parents earlier ones made
    for violation in violations:
        fix = _FIXES.get(violation.rule)
        if fix is None or not violation.denies:
            continue
        for path in (violation.path, *_also_at(violation.message)):
            parts = _resolve(doc, path)
            if parts is None:
                continue
            exists, value = _get(doc, parts)
            setting = fix(str(parts[-1]), value)
            key = pointer(parts)
            if setting is None or key in done:
                continue
            done.add(key)
            for op in _operations(doc, parts, setting, exists):
                doc = apply_patch(doc, (op,))
                _merge_or_append(ops, op)
    return tuple(ops)


def _merge_or_append(ops: list[dict[str, Any]], op: dict[str, Any]) -> None:
    """Fold an "add" below the path of an earlier "add" into that one's value (one readable
    securityContext instead of four operations)."""
    if op["op"] == "add":
        for earlier in ops:
            prefix = earlier["path"] + "/"
            if (
                earlier["op"] == "add"
                and op["path"].startswith(prefix)
                and isinstance(earlier["value"], dict)
            ):
                node = earlier["value"]
                *parents, leaf = op["path"][len(prefix) :].split("/")
                for part in parents:
                    node = node.setdefault(part.replace("~1", "/").replace("~0", "~"), {})
                node[leaf.replace("~1", "/").replace("~0", "~")] = op["value"]
                return
    ops.append(op)


def _also_at(message: str) -> list[str]:
    """The other paths of a Pod Security finding ("... Also at: P1, P2.")."""
    _, found, rest = message.partition(" Also at: ")
    return [p.strip() for p in rest.rstrip(".").split(", ") if p.strip()] if found else []


def _operations(doc: Any, parts: list[str | int], setting: _Setting, exists: bool) -> list[dict[str, Any]]:
    action, value = setting
    if action == "remove":
        return [{"op": "remove", "path": pointer(parts)}] if exists else []
    if exists:
        return [{"op": "replace", "path": pointer(parts), "value": value}]
    # "add" needs the parent: add the deepest missing object with the value inside it.
    for depth in range(len(parts) - 1, 0, -1):
        found, _ = _get(doc, parts[:depth])
        if found:
            nested: Any = value
            for part in reversed(parts[depth + 1 :]):
                nested = {part: nested}
            return [{"op": "add", "path": pointer(parts[: depth + 1]), "value": nested}]
    return []


def _resolve(doc: Any, path: str) -> list[str | int] | None:
    """``a.b[name=x].c`` in ``doc`` as JSON-pointer parts (keyed selectors become indexes);
    None when a keyed element or a list index is not there."""
    parts: list[str | int] = []
    node: Any = doc
    pos = 0
    while pos < len(path):
        match = _STEP.match(path, pos)
        if match is None or match.end() == pos:
            return None
        name, index, field, wanted, quoted = match.groups()
        pos = match.end()
        if field is not None:
            if not isinstance(node, list):
                return None
            found = next(
                (
                    i
                    for i, item in enumerate(node)
                    if isinstance(item, Mapping) and str(item.get(field)) == wanted
                ),
                None,
            )
            if found is None:
                return None
            parts.append(found)
            node = node[found]
            continue
        if index is not None:
            if not isinstance(node, list) or int(index) >= len(node):
                return None
            parts.append(int(index))
            node = node[int(index)]
            continue
        key = name if name is not None else re.sub(r"\\(.)", r"\1", quoted)
        parts.append(key)
        node = node.get(key) if isinstance(node, Mapping) else None
    return parts


def _get(doc: Any, parts: Sequence[str | int]) -> tuple[bool, Any]:
    node = doc
    for part in parts:
        if isinstance(part, int):
            if not isinstance(node, list) or part >= len(node):
                return False, None
        elif not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node
