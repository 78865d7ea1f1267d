"""Running ``PolicyTest`` suites: the engine of ``mpigate test`` (the analogue of ``kyverno test``).

Each case builds an :class:`~mpigate.policy.AdmissionInput` from its object (a file relative to the
suite, or inline), evaluates it exactly as the webhook would, and compares the
:class:`~mpigate.policy.Decision` with the case's ``expect``. A failed expectation is reported as a
difference ("expected ..., got ..."), never as a traceback; a case whose object cannot be read is an
error of that case.
"""

from __future__ import annotations

import datetime as dt
import os
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mpigate.config import Config, parse_file, parse_quantity, thaw
from mpigate.config.model import PolicyTestSuite
from mpigate.config.queueing import kueue_amount
from mpigate.policy import AdmissionInput, Decision, LiveContext, UserInfo, evaluate
from mpigate.policy.jsonpatch import JsonPatchError, apply_patch, resolve_pointer, unescape

__all__ = ["CaseResult", "SuiteResult", "junit_xml", "parse_time", "run_case", "run_suites"]

_MISSING = object()


@dataclass(frozen=True, slots=True)
class CaseResult:
    """One case: passed, or the differences between expectation and decision (or an error)."""

    suite: str
    name: str
    location: str
    differences: tuple[str, ...] = ()
    error: str | None = None
    decision: Decision | None = None
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return not self.differences and self.error is None


@dataclass(frozen=True, slots=True)
class SuiteResult:
    name: str
    file: str
    cases: tuple[CaseResult, ...] = field(default_factory=tuple)

    @property
    def failed(self) -> int:
        return sum(1 for c in self.cases if not c.passed)


def parse_time(text: str) -> dt.datetime:
    """An RFC 3339 time (``2026-11-22T12:00:00Z``) or a date (midnight UTC)."""
    value = text.strip()
    if value.endswith(("Z", "z")):
        value = value[:-1] + "+00:00"
    parsed = dt.datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed


def _load_object(source: Mapping[str, Any], base_dir: str) -> Mapping[str, Any]:
    if "file" not in source:
        return dict(thaw(source))
    path = os.path.normpath(os.path.join(base_dir, str(source["file"])))
    documents, problems = parse_file(path, display=os.path.relpath(path))
    if problems:
        raise ValueError("; ".join(str(p) for p in problems))
    index = int(source.get("document", 0))
    if index >= len(documents):
        raise ValueError(f"{os.path.relpath(path)} has {len(documents)} document(s), no document {index}")
    data = documents[index].data
    if not isinstance(data, Mapping):
        raise ValueError(f"{os.path.relpath(path)} document {index} is not an object")
    return dict(data)


def _ids(values: Iterable[Any]) -> list[str]:
    return [str(v) for v in values]


def run_case(
    config: Config,
    suite: PolicyTestSuite,
    index: int,
    now: dt.datetime | None = None,
    *,
    namespace: str | None = None,
) -> CaseResult:
    """Evaluate case ``index`` of ``suite`` and compare it with its expectations. ``namespace``
    is the case's namespace when neither the case nor its object names one."""
    case = thaw(suite.cases[index])
    location = str(suite.case_locations[index]) if index < len(suite.case_locations) else suite.file
    name = str(case.get("name", f"case {index}"))
    base_dir = os.path.dirname(suite.absolute_file)
    try:
        obj = _load_object(case["object"], base_dir)
        old = _load_object(case["oldObject"], base_dir) if case.get("oldObject") else None
    except (ValueError, OSError, KeyError) as exc:
        return CaseResult(suite.name, name, location, error=f"cannot read the object: {exc}")
    operation = case.get("operation", "CREATE")
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    namespace = (
        case.get("namespace") or (meta.get("namespace") if isinstance(meta, Mapping) else None) or namespace
    )
    user = case.get("user") or {}
    request = AdmissionInput(
        operation=operation,
        kind=str(obj.get("kind", "")),
        namespace=namespace,
        name=str(meta.get("name", "")) if isinstance(meta, Mapping) else "",
        obj=None if operation == "DELETE" else obj,
        old_obj=old if old is not None else (obj if operation == "DELETE" else None),
        user=UserInfo(str(user.get("username", "policy-test")), tuple(user.get("groups", ()))),
    )
    live_spec = case.get("live")
    live = None
    if isinstance(live_spec, Mapping):
        usage = live_spec.get("queueUsage")
        live = LiveContext(
            active_jobs=live_spec.get("activeJobs"),
            gpus_in_use=dict(live_spec["gpusInUse"]) if "gpusInUse" in live_spec else None,
            queue_usage=(
                {
                    queue: {
                        flavor: {r: kueue_amount(r, parse_quantity(q)) for r, q in resources.items()}
                        for flavor, resources in flavors.items()
                    }
                    for queue, flavors in usage.items()
                }
                if isinstance(usage, Mapping)
                else None
            ),
            source="the test case",
        )
    when = now or (parse_time(suite.now) if suite.now else None)
    started = dt.datetime.now(dt.UTC)
    decision = evaluate(config, request, live, when)
    seconds = (dt.datetime.now(dt.UTC) - started).total_seconds()
    differences = compare(case.get("expect") or {}, decision, obj)
    return CaseResult(suite.name, name, location, tuple(differences), None, decision, seconds)


def compare(expect: Mapping[str, Any], decision: Decision, obj: Mapping[str, Any]) -> list[str]:
    """Every way ``decision`` differs from ``expect`` (empty when it matches)."""
    out: list[str] = []
    found = set(decision.rule_ids)
    enforced = sorted({v.rule for v in decision.violations if v.denies})
    if "allowed" in expect and bool(expect["allowed"]) != decision.allowed:
        why = f" ({', '.join(enforced)})" if enforced else ""
        out.append(f"allowed: expected {expect['allowed']}, got {decision.allowed}{why}")
    if "violations" in expect:
        wanted = sorted(set(_ids(expect["violations"])))
        if wanted != enforced:
            missing = [i for i in wanted if i not in enforced]
            extra = [i for i in enforced if i not in wanted]
            detail = "; ".join(
                part
                for part in (
                    f"missing {', '.join(missing)}" if missing else "",
                    f"unexpected {', '.join(extra)}" if extra else "",
                )
                if part
            )
            out.append(
                f"violations: expected exactly [{', '.join(wanted)}], got [{', '.join(enforced)}] ({detail})"
            )
    for rule in _ids(expect.get("includes", ())):
        if rule not in found:
            out.append(f"includes: {rule} did not fire (fired: {', '.join(sorted(found)) or 'none'})")
    for rule in _ids(expect.get("excludes", ())):
        if rule in found:
            hit = next(v for v in decision.violations if v.rule == rule)
            out.append(f"excludes: {rule} fired at {hit.path}: {hit.message}")
    for rule in _ids(expect.get("warnings", ())):
        if not any(w.startswith(f"[{rule}]") for w in decision.warnings):
            out.append(f"warnings: no warning from {rule} (warnings: {list(decision.warnings) or 'none'})")
    contains = expect.get("messageContains")
    if contains is not None:
        text = "\n".join([decision.message, *(v.message for v in decision.violations), *decision.warnings])
        for part in [contains] if isinstance(contains, str) else contains:
            if str(part) not in text:
                out.append(f"messageContains: {part!r} not found in the decision's messages")
    if "patched" in expect or "notPatched" in expect:
        try:
            mutated = apply_patch(obj, decision.patch)
        except JsonPatchError as exc:
            return [*out, f"patch does not apply: {exc}"]
        for ptr, value in (expect.get("patched") or {}).items():
            try:
                got = resolve_pointer(mutated, ptr)
            except (KeyError, IndexError):
                got = _MISSING
            if got is _MISSING:
                out.append(f"patched: {ptr} is not set in the mutated object (expected {value!r})")
            elif got != value:
                out.append(f"patched: {ptr} is {got!r}, expected {value!r}")
        for ptr in expect.get("notPatched") or ():
            touching = [op for op in decision.patch if _overlaps(str(op.get("path", "")), str(ptr))]
            if touching:
                out.append(f"notPatched: {ptr} is changed by {touching[0]['op']} {touching[0]['path']}")
    if "exceptions" in expect:
        wanted = sorted(_ids(expect["exceptions"]))
        got = sorted(e.name for e in decision.exceptions)
        if wanted != got:
            out.append(f"exceptions: expected [{', '.join(wanted)}], got [{', '.join(got)}]")
    return out


def _overlaps(op_path: str, ptr: str) -> bool:
    """An op at the pointer, at a parent of it (which replaces it) or below it (which changes part of it)."""
    a = [unescape(t) for t in op_path.split("/")[1:]]
    b = [unescape(t) for t in ptr.split("/")[1:]]
    shorter = min(len(a), len(b))
    return a[:shorter] == b[:shorter]


def run_suites(
    config: Config, suites: Sequence[PolicyTestSuite] | None = None, *, namespace: str | None = None
) -> list[SuiteResult]:
    """Run every case of every suite (default: all suites of the config tree), in file order;
    ``namespace`` for cases that name none."""
    results: list[SuiteResult] = []
    for suite in suites if suites is not None else config.tests:
        cases = tuple(run_case(config, suite, i, namespace=namespace) for i in range(len(suite.cases)))
        results.append(SuiteResult(suite.name, suite.file, cases))
    return results


def junit_xml(results: Sequence[SuiteResult]) -> str:
    """JUnit XML (one testsuite per PolicyTest, one testcase per case) for CI dashboards."""
    root = ET.Element(
        "testsuites",
        name="mpigate test",
        tests=str(sum(len(s.cases) for s in results)),
        failures=str(sum(s.failed for s in results)),
    )
    for suite in results:
        node = ET.SubElement(
            root,
            "testsuite",
            name=suite.name,
            file=suite.file,
            tests=str(len(suite.cases)),
            failures=str(sum(1 for c in suite.cases if c.differences)),
            errors=str(sum(1 for c in suite.cases if c.error)),
        )
        for case in suite.cases:
            item = ET.SubElement(
                node,
                "testcase",
                classname=suite.name,
                name=case.name,
                file=case.location,
                time=f"{case.seconds:.6f}",
            )
            if case.error:
                ET.SubElement(item, "error", message=case.error).text = case.error
            elif case.differences:
                ET.SubElement(item, "failure", message=case.differences[0]).text = "\n".join(case.differences)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
