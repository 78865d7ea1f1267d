"""Gatekeeper's policy library through mpigate's ValidatingAdmissionPolicy evaluator (issue 22).

For every template of open-policy-agent/gatekeeper-library that judges Pods, the template's CEL
(``engine: K8sNativeValidation``) is turned into a ValidatingAdmissionPolicy as Gatekeeper
generates it (gatekeeper pkg/drivers/k8scel/transform: the ``params`` variable bound to the
constraint's ``spec.parameters``, ``anyObject``, and the constraint's match conditions) and run,
with each sample constraint as its parameter object, on every sample object of the template's
``suite.yaml``; a template counts as covered when every case gives the suite's verdict. Where the
library has only Rego, the template is listed as such. For the templates with both, the same
cases are timed through the Rego (OPA's interpreter via ``regopy``) as the peer figure.

Usage: ``.venv/bin/python benchmarks/gatekeeper_library.py [--library DIR]``, DIR a bare clone of
the library (default: the mirror at /work/.mirror/open-policy-agent+gatekeeper-library/repo); the
peer needs the ``bench`` extra.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

import yaml

from mpigate.cel.validation import CompiledPolicy, compile_policy, environment

DEFAULT_LIBRARY = "/work/.mirror/open-policy-agent+gatekeeper-library/repo"
# gatekeeper pkg/drivers/k8scel/transform/cel_snippets.go: BindParamsV1Beta1, BindObjectV1Beta1
GATEKEEPER_VARIABLES = [
    ("params", "!has(params.spec) ? null : !has(params.spec.parameters) ? null: params.spec.parameters"),
    (
        "anyObject",
        'has(request.operation) && request.operation == "DELETE" && object == null ? oldObject : object',
    ),
]
# ... and MatchKindsV1Beta1 (the constraint's spec.match.kinds)
MATCH_KINDS = (
    "gatekeeper_internal_match_kinds",
    """!has(params.spec) ? true: (!has(params.spec.match) ? true: (!has(params.spec.match.kinds) ? true : (
      params.spec.match.kinds.exists(groupskinds,
        (!has(groupskinds.kinds) || size(groupskinds.kinds) == 0 || "*" in groupskinds.kinds ||
         request.kind.kind in groupskinds.kinds) &&
        (!has(groupskinds.apiGroups) || size(groupskinds.apiGroups) == 0 || "*" in groupskinds.apiGroups ||
         request.kind.group in groupskinds.apiGroups)))))""",
)


class Library:
    def __init__(self, git_dir: str) -> None:
        self.git_dir = git_dir

    def files(self) -> list[str]:
        out = subprocess.run(
            ["git", "-C", self.git_dir, "ls-tree", "-r", "HEAD", "--name-only", "library"],
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.split()

    def read(self, path: str) -> list[Any]:
        out = subprocess.run(
            ["git", "-C", self.git_dir, "show", f"HEAD:{path}"], capture_output=True, text=True, check=True
        )
        return [d for d in yaml.safe_load_all(out.stdout) if d is not None]


@dataclass
class Result:
    name: str
    engine: str  # "cel" or "rego only"
    cases: int = 0
    passed: int = 0
    failures: list[str] = field(default_factory=list)
    cel_us: list[float] = field(default_factory=list)
    rego_us: list[float] = field(default_factory=list)


def _request(obj: Any) -> tuple[Any, Any, dict[str, Any]]:
    """(object, oldObject, request) of a sample: a plain object is a CREATE."""
    if isinstance(obj, dict) and obj.get("kind") == "AdmissionReview":
        req = obj["request"]
        target = req.get("object")
        kind = (target or req.get("oldObject") or {}).get("kind", "")
        request = {
            "operation": req.get("operation", "CREATE"),
            "kind": {"group": "", "version": "v1", "kind": kind},
        }
        return target, req.get("oldObject"), request
    group = str(obj.get("apiVersion", "")).rpartition("/")[0]
    return (
        obj,
        None,
        {"operation": "CREATE", "kind": {"group": group, "version": "v1", "kind": obj.get("kind", "")}},
    )


def _policy(template: Any, constraint: Any) -> CompiledPolicy | str:
    source = next(
        (
            c["source"]
            for t in template["spec"]["targets"]
            for c in t.get("code", [])
            if c.get("engine") == "K8sNativeValidation"
        ),
        None,
    )
    assert source is not None
    compiled = compile_policy(
        environment(),
        match_conditions=[
            MATCH_KINDS,
            *((m["name"], m["expression"]) for m in source.get("matchConditions", [])),
        ],
        variables=[
            *GATEKEEPER_VARIABLES,
            *((v["name"], v["expression"]) for v in source.get("variables", [])),
        ],
        validations=source.get("validations", []),
        failure_policy=source.get("failurePolicy", "Fail"),
        params=constraint,
    )
    if isinstance(compiled, list):
        return "; ".join(f"{'.'.join(map(str, i.path))}: {i.issue.message}" for i in compiled)
    return compiled


def _rego_run(template: Any, constraint: Any) -> Callable[[Any], bool] | None:
    try:
        import regopy
    except ImportError:
        return None
    # the Rego is the target's `rego` (and `libs`) or, in newer templates, its `engine: Rego` code
    sources = [
        src
        for t in template["spec"]["targets"]
        for src in [t, *(c.get("source") or {} for c in t.get("code", []) if c.get("engine") == "Rego")]
        if src.get("rego")
    ]
    if not sources:
        return None
    rego = sources[0]["rego"]
    interpreter = regopy.Interpreter()
    interpreter.add_module("template", rego)
    for i, lib in enumerate(sources[0].get("libs") or []):
        interpreter.add_module(f"lib{i}", lib)
    package = rego.split("package", 1)[1].split()[0]
    parameters = (constraint.get("spec") or {}).get("parameters") or {}

    def run(obj: Any) -> bool:
        target, old, request = _request(obj)
        review = {
            "object": target,
            "oldObject": old,
            "operation": request["operation"],
            "kind": request["kind"],
        }
        interpreter.set_input_term(json.dumps({"review": review, "parameters": parameters}))
        out = interpreter.query(f"x = data.{package}.violation")
        return '"msg"' in str(out)

    return run


def _time(fn: Callable[[], Any], rounds: int = 50) -> float:
    start = time.perf_counter_ns()
    for _ in range(rounds):
        fn()
    return (time.perf_counter_ns() - start) / rounds / 1000


def judge(library: Library, folder: str, peer: bool) -> Result:
    template = library.read(f"{folder}/template.yaml")[0]
    name = template["metadata"]["name"]
    has_cel = any(
        c.get("engine") == "K8sNativeValidation"
        for t in template["spec"]["targets"]
        for c in t.get("code", [])
    )
    result = Result(name, "cel" if has_cel else "rego only")
    if not has_cel:
        return result
    env = environment()
    suite = library.read(f"{folder}/suite.yaml")[0]
    for test in suite.get("tests", []):
        constraint = library.read(str(PurePosixPath(folder) / test["constraint"]))[0]
        policy = _policy(template, constraint)
        rego = _rego_run(template, constraint) if peer else None
        for case in test.get("cases", []):
            result.cases += 1
            want = case["assertions"][0].get("violations")
            expected = want not in ("no", 0, False)
            obj = library.read(str(PurePosixPath(folder) / case["object"]))[0]
            if isinstance(policy, str):
                result.failures.append(f"{case['name']}: does not compile: {policy}")
                continue
            target, old, request = _request(obj)
            inputs = env.inputs({"object": target, "oldObject": old, "request": request})
            outcomes = policy.evaluate(env, inputs)
            errors = [o for o in outcomes if o.kind != "violation"]
            got = bool(outcomes)
            if got == expected and not errors:  # an error is never the expected verdict
                result.passed += 1
            else:
                detail = (errors or outcomes)[0].message if outcomes else "no violation"
                result.failures.append(f"{case['name']}: expected violations={want}, got {detail}")
            values = {"object": target, "oldObject": old, "request": request}
            result.cel_us.append(_time(lambda p=policy, v=values: p.evaluate(env, env.inputs(v))))
            if rego is not None:
                result.rego_us.append(_time(lambda r=rego, o=obj: r(o), rounds=10))
    return result


def pod_templates(library: Library) -> list[str]:
    """Template folders whose constraints' samples select Pods."""
    folders = sorted(
        str(PurePosixPath(f).parent)
        for f in library.files()
        if f.endswith("/template.yaml")
        and f.count("/") == 3
        and f.startswith(("library/pod-security-policy/", "library/general/"))
    )
    out = []
    for folder in folders:
        try:
            suite = library.read(f"{folder}/suite.yaml")[0]
        except subprocess.CalledProcessError:
            continue
        kinds: set[str] = set()
        for test in suite.get("tests", []):
            constraint = library.read(str(PurePosixPath(folder) / test["constraint"]))[0]
            for m in ((constraint.get("spec") or {}).get("match") or {}).get("kinds") or []:
                kinds.update(m.get("kinds") or [])
        if "Pod" in kinds:
            out.append(folder)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--library", default=DEFAULT_LIBRARY)
    parser.add_argument("--no-peer", action="store_true", help="skip the Rego timing")
    args = parser.parse_args()
    library = Library(args.library)
    results = [judge(library, folder, not args.no_peer) for folder in pod_templates(library)]
    print(f"{'template':38} {'engine':10} {'cases':>7}  {'CEL µs':>8} {'Rego µs':>8}")
    for r in results:
        cel = f"{statistics.median(r.cel_us):8.0f}" if r.cel_us else " " * 8
        rego = f"{statistics.median(r.rego_us):8.0f}" if r.rego_us else " " * 8
        print(f"{r.name:38} {r.engine:10} {r.passed:>3}/{r.cases:<3}  {cel} {rego}")
        for failure in r.failures:
            print(f"    {failure}")
    cel = [r for r in results if r.engine == "cel"]
    full = [r for r in cel if r.cases and r.passed == r.cases]
    print(
        f"\n{len(results)} pod templates: {len(cel)} with CEL, of which {len(full)} pass every suite case "
        f"unchanged through mpigate; {len(results) - len(cel)} have only Rego"
    )
    pairs = [
        (statistics.median(r.cel_us), statistics.median(r.rego_us)) for r in cel if r.cel_us and r.rego_us
    ]
    if pairs:
        ratio = statistics.median(rg / c for c, rg in pairs)
        print(f"Rego (regopy) / mpigate CEL per evaluation, median over {len(pairs)} templates: {ratio:.1f}×")


if __name__ == "__main__":
    main()
