"""CustomRule: IDs, references, and every CEL expression compiled, its errors located in the file.

A compile error is reported at the line and column of the YAML file where the offending character
of the expression is: the expression's own position is mapped through the scalar's style (a
``|`` block keeps its lines; a ``>`` block, a plain or a quoted scalar folds lines into one).
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from mpigate.catalogue import rule_ids
from mpigate.cel.validation import PolicyIssue, compile_policy, environment
from mpigate.config.frozen import thaw
from mpigate.config.problems import Location, PathPart, Problem, format_path
from mpigate.config.schema import defaults_from

from .base import Collector, Entry, Tree, check_unique, did_you_mean

__all__ = [
    "check_custom_rules",
    "check_params",
    "check_rule_refs",
    "compile_rule",
    "custom_rule_ids",
    "expression_location",
    "known_controls",
    "report_compile_errors",
    "resolved_spec",
]


@cache
def _environment() -> Any:
    return environment()


def custom_rule_ids(entries: Iterable[Entry]) -> tuple[str, ...]:
    """The IDs the tree's valid CustomRules declare."""
    return tuple(e.data["spec"]["id"] for e in entries if e.valid and not e.builtin)


def expression_location(
    text: str, line: int, column: int, expr_line: int, expr_column: int
) -> tuple[int, int]:
    """Where character ``expr_line``:``expr_column`` (1-based) of a scalar's value is in the file
    whose text is ``text``, the scalar's value starting at ``line``:``column``."""
    lines = text.splitlines()
    if not 0 < line <= len(lines):
        return line, column
    head = lines[line - 1][column - 1 :]
    if head[:1] in ("|", ">"):
        literal = head[:1] == "|"
        body = [i for i in range(line, len(lines)) if lines[i].strip()]
        if not body:
            return line, column
        first = body[0]
        indent = len(lines[first]) - len(lines[first].lstrip(" "))
        if literal:
            target = first + expr_line - 1
            return target + 1, indent + expr_column
        return _folded(lines, first, indent, expr_column)
    quote = 1 if head[:1] in ("'", '"') else 0
    # a one-line plain or quoted scalar (escapes in double quotes may shift the column)
    if expr_line == 1 and len(head) >= quote + expr_column - 1:
        return line, column + quote + expr_column - 1
    indent = column - 1
    return _folded(lines, line - 1, indent, expr_column, start_column=column - 1 + quote)


def _folded(
    lines: list[str], first: int, indent: int, offset: int, *, start_column: int | None = None
) -> tuple[int, int]:
    """The file position of character ``offset`` (1-based) of a value folded from ``lines`` from
    index ``first`` (each line break read as one space)."""
    remaining = offset
    for index in range(first, len(lines)):
        start = start_column if index == first and start_column is not None else None
        raw = lines[index]
        begin = start if start is not None else len(raw) - len(raw.lstrip(" "))
        content = raw[begin:].rstrip()
        if remaining <= len(content) + 1:
            return index + 1, begin + remaining
        remaining -= len(content) + 1
    return first + 1, indent + 1


def _pairs(items: Any) -> list[tuple[str, str]]:
    return [(str(item["name"]), str(item["expression"])) for item in items] if items else []


def compile_rule(spec: Any, params: Any) -> Any:
    """The :class:`~mpigate.cel.validation.CompiledPolicy` of a CustomRule ``spec`` with ``params``
    (a list of :class:`~mpigate.cel.validation.PolicyIssue` when it does not compile)."""
    spec = thaw(spec)
    return compile_policy(
        _environment(),
        match_conditions=_pairs(spec.get("matchConditions")),
        variables=_pairs(spec.get("variables")),
        validations=spec["validations"],
        failure_policy=spec.get("failurePolicy", "Fail"),
        params=thaw(params),
        base=("spec",),
        # a ValidatingAdmissionPolicy's (a CustomRule has none)
        audit_annotations=[
            (str(a["key"]), str(a["valueExpression"])) for a in spec.get("auditAnnotations") or ()
        ],
    )


def known_controls() -> set[str]:
    """Every control of the compliance catalogues. They are data (report/controls/*.yaml) that the
    rule catalogue's controls name too; read here so that a control no report knows is an error,
    not a silent gap."""
    from mpigate.report.controls import all_frameworks

    return {control.id for fw in all_frameworks().values() for control in fw.controls}


def _file_text(tree: Tree, entry: Entry) -> str:
    root = tree.root
    path = root / entry.doc.file if root.is_dir() else root
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError:
        return ""


def report_compile_errors(c: Collector, tree: Tree, entry: Entry, issues: list[PolicyIssue]) -> None:
    """Each compile error at the line and column of the file where its character is."""
    text = _file_text(tree, entry)
    for issue in issues:
        value_at = entry.doc.locate(issue.path, key=False)
        line, column = value_at.line, value_at.column
        if text and line:
            line, column = expression_location(text, line, column, issue.issue.line, issue.issue.column)
        c.problems.append(
            Problem(
                Location(entry.doc.file, line, column),
                format_path(issue.path),
                f"CEL: {issue.issue.message}",
                "cel.compile",
                hint="docs/policies/custom-rules.md lists the variables and functions expressions may use",
            )
        )


def resolved_spec(spec: Any) -> dict[str, Any]:
    """A CustomRule ``spec`` (defaults applied) with its ``paramsSchema``'s defaults filled into
    ``params`` and each ``teamParams`` entry: what the engine compiles."""
    out: dict[str, Any] = dict(thaw(spec))
    schema = out.get("paramsSchema")
    if schema:
        out["params"] = defaults_from(schema, out.get("params"))
        out["teamParams"] = {t: defaults_from(schema, p) for t, p in out.get("teamParams", {}).items()}
    return out


def check_params(c: Collector, entry: Entry, schema: Any, params: Any, path: list[PathPart]) -> bool:
    """Whether ``params`` (at ``path`` of ``entry``) satisfy a rule's ``paramsSchema``; each
    failure is an error at the parameter it concerns."""
    if schema is None:
        return True
    validator = Draft202012Validator(thaw(schema))
    ok = True
    for error in sorted(validator.iter_errors(thaw(params) if params is not None else {}), key=str):
        ok = False
        c.error(
            entry,
            [*path, *error.absolute_path],
            f"params: {error.message}",
            "customrule.params",
            "the rule's paramsSchema (its docs/policies page) lists the parameters",
        )
    return ok


def check_rule_refs(c: Collector, tree: Tree, entry: Entry, spec: Any, path: list[PathPart]) -> None:
    """The teams, classifications and controls a rule (``spec`` at ``path`` of ``entry``: a
    CustomRule's spec or a library rule's enabling entry) names exist; replicatedJobs only with Pod."""
    match = spec.get("match", {})
    for i, team in enumerate(match.get("teams", [])):
        c.ref(entry, [*path, "match", "teams", i], team, tree.team_names, f"no team {team!r}", "ref.team")
    for team in spec.get("teamParams", {}):
        c.ref(entry, [*path, "teamParams", team], team, tree.team_names, f"no team {team!r}", "ref.team")
    for i, name in enumerate(match.get("classifications", [])):
        c.ref(
            entry,
            [*path, "match", "classifications", i],
            name,
            tree.classifications,
            f"no data classification {name!r} in the OrgPolicy",
            "ref.classification",
        )
    known = known_controls()
    for i, control in enumerate(spec.get("controls", [])):
        if control not in known:
            c.error(
                entry,
                [*path, "controls", i],
                f"no control {control!r} in the compliance catalogues",
                "ref.control",
                did_you_mean(control, known),
            )


def check_custom_rules(c: Collector, tree: Tree, entries: list[Entry]) -> None:
    """IDs unique and outside the catalogue, teams and controls that exist, parameters that satisfy
    the rule's paramsSchema, every expression compiles (with its default parameters and with each
    team's)."""
    valid = [e for e in entries if e.valid and not e.builtin]
    check_unique(c, valid, lambda e: e.data["spec"]["id"], "custom rule ID", ["spec", "id"])
    check_unique(c, valid, lambda e: e.data["metadata"]["name"], "CustomRule", ["metadata", "name"])
    catalogue = set(rule_ids())
    for entry in valid:
        spec = entry.data["spec"]
        rule_id = spec["id"]
        if rule_id in catalogue or rule_id.startswith("MPG-"):
            c.error(
                entry,
                ["spec", "id"],
                f"{rule_id} is reserved: MPG- IDs belong to mpigate's catalogue and library",
                "customrule.id",
                "choose an ID with your organisation's prefix (ACME-OWNER-LABEL)",
            )
        check_rule_refs(c, tree, entry, spec, ["spec"])
        if "Pod" not in spec["match"]["targets"] and spec["match"].get("replicatedJobs"):
            c.error(
                entry,
                ["spec", "match", "replicatedJobs"],
                "replicatedJobs selects pods, but the rule does not target Pod",
                "customrule.match",
                "add Pod to match.targets or remove replicatedJobs",
            )
        schema = spec.get("paramsSchema")
        if schema is not None:
            try:
                Draft202012Validator.check_schema(thaw(schema))
            except SchemaError as exc:
                c.error(
                    entry, ["spec", "paramsSchema"], f"not a JSON Schema: {exc.message}", "customrule.params"
                )
                continue
            fine = check_params(c, entry, schema, spec.get("params"), ["spec", "params"])
            for team, params in spec["teamParams"].items():
                fine = check_params(c, entry, schema, params, ["spec", "teamParams", team]) and fine
            if not fine:
                continue
        resolved = resolved_spec(spec)
        compiled = compile_rule(resolved, resolved.get("params"))
        if isinstance(compiled, list):
            report_compile_errors(c, tree, entry, compiled)
            continue
        for team, params in resolved["teamParams"].items():
            per_team = compile_rule(resolved, params)
            if isinstance(per_team, list):  # an expression that only fails with these params
                report_compile_errors(c, tree, entry, per_team)
                c.error(
                    entry,
                    ["spec", "teamParams", team],
                    f"the expressions do not compile with team {team}'s params",
                    "cel.compile",
                )
