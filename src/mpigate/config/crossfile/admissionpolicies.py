"""ValidatingAdmissionPolicies and their bindings kept in the tree: names, references, parameter
objects (found, and kept where the policies' owners keep them), rule IDs, and every expression
compiled with each parameter object, its errors located in the file."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from mpigate.config.admission import (
    ParamObject,
    admission_mode,
    admission_rule_id,
    collect_params,
    param_object,
)
from mpigate.config.frozen import freeze
from mpigate.config.model import AdmissionBinding, CustomRule

from .base import Collector, Entry, Tree, check_unique
from .customrules import compile_rule, known_controls, report_compile_errors
from .ownership import layout_applies, owning_folder

__all__ = [
    "CONTROLS_ANNOTATION",
    "admission_rule_ids",
    "admission_rules",
    "check_admission_policies",
    "param_objects",
]

# Compliance controls a policy evidences (comma-separated), so that `report` maps its findings.
CONTROLS_ANNOTATION = "mpigate.io/controls"


def param_objects(objects: Iterable[Entry]) -> list[tuple[Entry, ParamObject]]:
    """The tree's other documents that a binding may name as its parameters."""
    out = []
    for entry in objects:
        found = param_object(entry.data)
        if found is not None:
            out.append((entry, found))
    return out


def _pairs(entries: Sequence[Entry]) -> list[tuple[Entry, Entry]]:
    """(policy, binding) for every binding whose policy is in the tree."""
    policies = {
        e.data["metadata"]["name"]: e for e in entries if e.kind == "ValidatingAdmissionPolicy" and e.valid
    }
    return [
        (policies[b.data["spec"]["policyName"]], b)
        for b in entries
        if b.kind == "ValidatingAdmissionPolicyBinding"
        and b.valid
        and b.data["spec"]["policyName"] in policies
    ]


def admission_rule_ids(entries: Sequence[Entry]) -> tuple[str, ...]:
    return tuple(
        admission_rule_id(p.data["metadata"]["name"], b.data["metadata"]["name"]) for p, b in _pairs(entries)
    )


def _controls(policy: Entry) -> tuple[str, ...]:
    text = (policy.data["metadata"].get("annotations") or {}).get(CONTROLS_ANNOTATION, "")
    return tuple(c.strip() for c in str(text).split(",") if c.strip())


def _kept(tree: Tree, entry: Entry) -> bool:
    """Whether ``entry`` is in a folder that keeps ValidatingAdmissionPolicies (the policy owners'):
    a parameter object elsewhere (a team's file) would let others change what a policy allows."""
    if tree.org is None or not layout_applies(tree.root, [entry.doc.file]):
        return True
    layout: Mapping[str, Sequence[str]] = tree.org_spec["layout"]
    folder = owning_folder(entry.doc.file, layout)
    return folder is not None and "ValidatingAdmissionPolicy" in layout[folder]


def check_admission_policies(c: Collector, tree: Tree, entries: list[Entry], objects: list[Entry]) -> None:
    policies = [e for e in entries if e.kind == "ValidatingAdmissionPolicy" and e.valid]
    bindings = [e for e in entries if e.kind == "ValidatingAdmissionPolicyBinding" and e.valid]
    check_unique(
        c, policies, lambda e: e.data["metadata"]["name"], "ValidatingAdmissionPolicy", ["metadata", "name"]
    )
    check_unique(
        c,
        bindings,
        lambda e: e.data["metadata"]["name"],
        "ValidatingAdmissionPolicyBinding",
        ["metadata", "name"],
    )
    names = {e.data["metadata"]["name"] for e in policies}
    known = known_controls()
    for policy in policies:
        spec = policy.data["spec"]
        if not spec["validations"] and not spec["auditAnnotations"]:
            # the API server: "at least one of validations or auditAnnotations is required"
            c.error(
                policy,
                ["spec", "validations"],
                "the policy has neither validations nor auditAnnotations",
                "vap.validations",
            )
        if not (spec.get("matchConstraints") or {}).get("resourceRules"):
            c.error(
                policy,
                ["spec", "matchConstraints"],
                "matchConstraints.resourceRules is required (the API server refuses a policy without it)",
                "vap.match",
            )
        for i, control in enumerate(_controls(policy)):
            if control not in known:
                c.error(
                    policy,
                    ["metadata", "annotations", CONTROLS_ANNOTATION],
                    f"no control {control!r} (item {i + 1}) in the compliance catalogues",
                    "ref.control",
                )
        if not any(b.data["spec"]["policyName"] == policy.data["metadata"]["name"] for b in bindings):
            c.warning(
                policy,
                ["metadata", "name"],
                "no ValidatingAdmissionPolicyBinding in the tree binds this policy: it applies to nothing",
                "vap.unbound",
            )
    candidates = param_objects(objects)
    by_id: dict[str, Entry] = {}
    for binding in bindings:
        spec = binding.data["spec"]
        if spec["policyName"] not in names:
            c.ref(
                binding,
                ["spec", "policyName"],
                spec["policyName"],
                names,
                f"no ValidatingAdmissionPolicy {spec['policyName']!r} in the tree",
                "ref.vap",
            )
            continue
        actions = spec["validationActions"]
        if "Deny" in actions and "Warn" in actions:
            c.error(
                binding,
                ["spec", "validationActions"],
                "Deny and Warn may not be used together (the API server refuses it)",
                "vap.actions",
            )
        ref = spec.get("paramRef")
        if ref and bool(ref.get("name")) == bool(ref.get("selector") is not None):
            c.error(
                binding,
                ["spec", "paramRef"],
                "paramRef needs exactly one of name and selector",
                "vap.param-ref",
            )
    reported: set[str] = set()  # a policy's compile errors once, whichever bindings bind it
    for policy, binding in _pairs(entries):
        rule_id = admission_rule_id(policy.data["metadata"]["name"], binding.data["metadata"]["name"])
        if rule_id in by_id:
            c.error(
                binding,
                ["metadata", "name"],
                f"rule ID {rule_id} is also that of the binding in {by_id[rule_id].doc.file}: the "
                "names differ only in characters an ID cannot hold",
                "vap.id",
                "rename one of the bindings or policies",
            )
        by_id[rule_id] = binding
        spec = policy.data["spec"]
        ref = binding.data["spec"].get("paramRef")
        if ref and not spec.get("paramKind"):
            c.warning(
                binding,
                ["spec", "paramRef"],
                "the policy has no paramKind: paramRef is ignored",
                "vap.param-ref",
            )
        params = collect_params(spec.get("paramKind"), ref, (o for _, o in candidates))
        policy_name = policy.data["metadata"]["name"]
        if params is None:
            compiled = compile_rule(spec, None)
            if isinstance(compiled, list) and policy_name not in reported:
                reported.add(policy_name)
                report_compile_errors(c, tree, policy, compiled)
            continue
        if not params.objects:
            c.warning(
                binding,
                ["spec", "paramRef"],
                "no parameter object in the tree matches paramRef: "
                + (
                    "every request the binding matches is denied (parameterNotFoundAction: Deny)"
                    if params.deny_missing
                    else "the policy is not evaluated (parameterNotFoundAction: Allow)"
                ),
                "vap.params-missing",
            )
        for entry, obj in candidates:
            if obj not in params.objects:
                continue
            if not _kept(tree, entry):
                c.error(
                    entry,
                    ["kind"],
                    f"{obj.kind} {obj.name} is a parameter of ValidatingAdmissionPolicyBinding "
                    f"{binding.data['metadata']['name']} but is kept outside the folders that keep "
                    "ValidatingAdmissionPolicies",
                    "ownership.folder",
                    "keep a policy's parameters with the policy (its owners review them)",
                )
            compiled = compile_rule(spec, obj.data)
            if isinstance(compiled, list) and policy_name not in reported:
                reported.add(policy_name)
                report_compile_errors(c, tree, policy, compiled)


def admission_rules(
    entries: Sequence[Entry], objects: Iterable[Entry], source: Any
) -> tuple[CustomRule, ...]:
    """One rule per binding of a policy in the tree (``source`` locates an entry)."""
    candidates = [o for _, o in param_objects(objects)]
    out = []
    for policy, binding in _pairs(entries):
        spec = policy.data["spec"]
        bspec = binding.data["spec"]
        policy_name, binding_name = policy.data["metadata"]["name"], binding.data["metadata"]["name"]
        out.append(
            CustomRule(
                id=admission_rule_id(policy_name, binding_name),
                name=binding_name,
                title=f"ValidatingAdmissionPolicy '{policy_name}' with binding '{binding_name}'",
                action=admission_mode(bspec["validationActions"]),  # type: ignore[arg-type]
                controls=_controls(policy),
                spec=freeze(spec),
                source=source(binding),
                admission=AdmissionBinding(
                    policy=policy_name,
                    binding=binding_name,
                    constraints=(freeze(spec.get("matchConstraints")), freeze(bspec.get("matchResources"))),
                    params=collect_params(spec.get("paramKind"), bspec.get("paramRef"), candidates),
                ),
            )
        )
    return tuple(out)
