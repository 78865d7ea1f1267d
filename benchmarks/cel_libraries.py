"""The CEL library for mpigate.cel, chosen by measurement: the three candidates on the package index.

- ``cel-expr-python`` (Google's C++ CEL, cel-cpp, behind pybind11), alone and as ``mpigate.cel``
  (the same library plus mpigate's Kubernetes function libraries, mpigate/cel/k8slib.py);
- ``common-expression-language`` (a Rust CEL interpreter behind PyO3; ``import cel``);
- ``cel-python`` (a pure-Python interpreter on lark; ``import celpy``).

For each: compile time per expression, evaluation time of a typical pod rule on one pod (the
inputs converted once and shared, as the engine does, and converted at every call), and
conformance to Kubernetes' CEL: the share of expressions written for the API server (its base
environment, k8s.io/apiserver pkg/cel/environment/base.go) that compile, type-check and give the
API server's result — standard macros, strings/optionals/bindings/math/encoders extensions, and the
Kubernetes libraries (lists, sets, regex, quantity, url, ip, cidr, semver) — plus whether a type
error is caught at compile time and an int64 overflow is an error, as cel-go does.

Run from the repository root: ``.venv/bin/python benchmarks/cel_libraries.py`` (the candidates
that are not installed are reported as such; ``pip install -c constraints.txt -e '.[bench]'``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

# (expression, expected result); None as the expected result means "an error" (compile or eval).
# The expressions read `object` (the pod below) where they need an input.
CONFORMANCE: list[tuple[str, str, Any]] = [
    ("macros", "object.spec.containers.all(c, c.image.startsWith('registry.example.com/'))", True),
    ("macros", "object.spec.containers.exists_one(c, c.name == 'launcher')", True),
    ("macros", "object.spec.containers.map(c, c.name).filter(n, n != 'launcher') == ['sidecar']", True),
    ("has", "has(object.metadata.labels) && 'owner' in object.metadata.labels", True),
    ("has", "!has(object.spec.hostNetwork)", True),
    ("maps", "object.metadata.labels.exists(k, k.startsWith('team'))", True),
    ("strings", "'a,b'.split(',') == ['a', 'b']", True),
    ("strings", "'Hello'.lowerAscii() + ' X '.trim() == 'helloX'", True),
    ("strings", "'abcb'.lastIndexOf('b') == 3 && 'abc'.substring(1) == 'bc'", True),
    ("strings", "['a', 'b'].join('-') == 'a-b' && 'abc'.replace('b', 'x') == 'axc'", True),
    ("strings", "'ab'.charAt(1) == 'b' && 'a%sb'.upperAscii() == 'A%SB'", True),
    ("strings", "strings.quote('a\"b') == '\"a\\\\\"b\"'", True),
    ("optionals", "object.?spec.?priority.orValue(5) == 5", True),
    ("optionals", "optional.of(1).hasValue() && !optional.none().hasValue()", True),
    ("optionals", "object.metadata.labels[?'owner'].orValue('') == 'alice'", True),
    ("bind", "cel.bind(x, 3, x * x) == 9", True),
    ("math", "math.greatest(1, 7, 3) == 7 && math.least([4, 2]) == 2", True),
    ("encoders", "base64.encode(b'hi') == 'aGk='", True),
    (
        "time",
        "duration('1h') > duration('30m') && timestamp('2024-01-02T00:00:00Z').getFullYear() == 2024",
        True,
    ),
    ("regex", "'abc123'.matches('^[a-z]+[0-9]+$')", True),
    ("regex", "'abc123def'.find('[0-9]+') == '123'", True),
    ("regex", "'a1b2c3'.findAll('[0-9]') == ['1', '2', '3']", True),
    ("lists", "[1, 2, 3].isSorted() && [1, 2, 3].sum() == 6", True),
    ("lists", "[3, 1, 2].min() == 1 && [3, 1, 2].max() == 3", True),
    ("lists", "[[1], [2, 3]].flatten() == [1, 2, 3]", True),
    ("lists", "lists.range(3) == [0, 1, 2] && [3, 1, 2].sort() == [1, 2, 3]", True),
    ("lists", "[1, 2, 2, 3].distinct() == [1, 2, 3] && [1, 2, 3].slice(1, 3) == [2, 3]", True),
    ("sets", "sets.contains([1, 2, 3], [1, 3]) && sets.intersects([1], [1, 4])", True),
    ("sets", "sets.equivalent([1, 2], [2, 1, 1])", True),
    ("quantity", "quantity('500m').isLessThan(quantity('1'))", True),
    ("quantity", "quantity('1Gi').asInteger() == 1073741824", True),
    (
        "quantity",
        "!isQuantity('1x') && quantity('1').add(quantity('500m')).compareTo(quantity('1.5')) == 0",
        True,
    ),
    ("url", "url('https://example.com:8080/p?q=1').getHost() == 'example.com:8080'", True),
    ("url", "url('https://example.com/p?q=1&q=2').getQuery()['q'] == ['1', '2']", True),
    ("ip", "ip('10.0.0.1').family() == 4 && isIP('::1') && !isIP('10.0.0')", True),
    ("cidr", "cidr('10.0.0.0/8').containsIP(ip('10.1.2.3')) && cidr('10.0.0.0/8').prefixLength() == 8", True),
    ("semver", "semver('1.2.3').isLessThan(semver('1.10.0')) && !isSemver('1.0')", True),
    ("semver", "semver('1.2.3-rc.1').major() == 1 && semver('2.0.0').compareTo(semver('2.0.0')) == 0", True),
    ("errors", "9223372036854775807 + 1 > 0", None),  # int64 overflow: an error in cel-go
    # a type error: at compile time in Kubernetes
    ("errors", "object.spec.containers.size() + 'a' == 1", None),
    ("errors", "object.spec.missingField == 1", None),  # no such key: an error at evaluation
]

POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "train-0", "labels": {"owner": "alice", "team-a": "x"}},
    "spec": {
        "containers": [
            {
                "name": name,
                "image": f"registry.example.com/{name}:1.{i}",
                "securityContext": {"runAsUser": 1000 + i, "capabilities": {"add": ["NET_BIND_SERVICE"]}},
                "resources": {
                    "limits": {"cpu": "2", "memory": "4Gi"},
                    "requests": {"cpu": "1", "memory": "2Gi"},
                },
                "ports": [{"containerPort": 40000 + i, "hostPort": 40000 + i}],
            }
            for i, name in enumerate(["launcher", "sidecar"])
        ],
        "volumes": [{"name": "data", "hostPath": {"path": "/data/x", "type": ""}}],
    },
}

# A rule of the kind a custom rule evaluates on every effective pod (no Kubernetes library call,
# so that every candidate can run it).
RULE = (
    "object.spec.containers.all(c, has(c.securityContext) && has(c.securityContext.runAsUser) && "
    "c.securityContext.runAsUser >= 1000 && c.securityContext.runAsUser <= 2000 && "
    "(!has(c.securityContext.capabilities) || !has(c.securityContext.capabilities.add) || "
    "c.securityContext.capabilities.add.all(a, a in ['NET_BIND_SERVICE'])) && "
    "(!has(c.ports) || c.ports.all(p, !has(p.hostPort) || (p.hostPort >= 40000 && p.hostPort <= 41000))))"
)


class Candidate:
    name: str
    compile: Callable[[str], Any]
    convert: Callable[[dict[str, Any]], Any]  # the inputs, once per object
    run: Callable[[Any, Any], Any]  # (compiled, converted inputs) -> plain result


def candidates() -> list[Candidate | str]:
    found: list[Candidate | str] = []

    try:
        from cel_expr_python import cel as cpp
        from cel_expr_python.ext import ext_bindings, ext_encoders, ext_math, ext_optional, ext_strings

        raw_env = cpp.NewEnv(
            variables={"object": cpp.Type.DYN},
            extensions=[
                ext_strings.ExtStrings(),
                ext_optional.ExtOptional(),
                ext_bindings.ExtBindings(),
                ext_math.ExtMath(),
                ext_encoders.ExtEncoders(),
            ],
        )

        def raw_run(program: Any, activation: Any) -> Any:
            result = program.eval(activation)
            if result.type() == cpp.Type.ERROR:
                raise RuntimeError(str(result.value()))
            return result.plain_value()

        c = Candidate()
        c.name = "cel-expr-python"
        c.compile = raw_env.compile
        c.convert = lambda values: raw_env.Activation(values)
        c.run = raw_run
        found.append(c)

        from mpigate.cel import Environment

        env = Environment(["object"])
        m = Candidate()
        m.name = "mpigate.cel (cel-expr-python + k8slib)"
        m.compile = env.compile
        m.convert = env.inputs
        m.run = lambda program, inputs: program.evaluate(inputs)
        found.append(m)
    except ImportError as exc:
        found.append(f"cel-expr-python: not installed ({exc})")

    try:
        import cel as rust

        r = Candidate()
        r.name = "common-expression-language"
        r.compile = rust.compile
        r.convert = lambda values: values  # the binding converts the dict at each execute()
        r.run = lambda program, values: program.execute(values)
        found.append(r)
    except ImportError as exc:
        found.append(f"common-expression-language: not installed ({exc})")

    try:
        import celpy

        py_env = celpy.Environment()

        def py_compile(source: str) -> Any:
            return py_env.program(py_env.compile(source))

        def py_run(program: Any, activation: Any) -> Any:
            result = program.evaluate(activation)
            if isinstance(result, celpy.CELEvalError):
                raise RuntimeError(str(result))
            return _plain(result, celpy.celtypes.BoolType)

        p = Candidate()
        p.name = "cel-python"
        p.compile = py_compile
        p.convert = lambda values: {k: celpy.json_to_cel(v) for k, v in values.items()}
        p.run = py_run
        found.append(p)
    except ImportError as exc:
        found.append(f"cel-python: not installed ({exc})")
    return found


def _plain(value: Any, boolean: type = bool) -> Any:
    """Plain Python values (cel-python's booleans are ints of their own type)."""
    if isinstance(value, boolean):
        return bool(value)
    if isinstance(value, dict):
        return {_plain(k, boolean): _plain(v, boolean) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v, boolean) for v in value]
    return value


def _equal(got: Any, want: Any) -> bool:
    return type(got) is type(want) and got == want if isinstance(want, bool) else got == want


def conformance(c: Candidate) -> tuple[int, list[str]]:
    passed, failed = 0, []
    for area, source, want in CONFORMANCE:
        try:
            got = c.run(c.compile(source), c.convert({"object": POD}))
            ok = want is not None and _equal(_plain(got), want)
        except Exception:
            ok = want is None
        if ok:
            passed += 1
        else:
            failed.append(area)
    return passed, failed


def per_op(fn: Callable[[], Any], rounds: int, repeat: int = 5) -> float:
    """Microseconds per call: the median of ``repeat`` runs of ``rounds`` calls."""
    runs = []
    for _ in range(repeat):
        start = time.perf_counter_ns()
        for _ in range(rounds):
            fn()
        runs.append((time.perf_counter_ns() - start) / rounds / 1000)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=300, help="calls per timed run (default 300)")
    args = parser.parse_args()
    sources = [s for _, s, want in CONFORMANCE if want is not None]
    print(f"load {os.getloadavg()[0]:.1f}; {len(CONFORMANCE)} conformance cases, rule of {len(RULE)} chars")
    head = f"{'library':42} {'conformance':>12} {'compile µs':>11} {'eval µs':>9} {'convert+eval µs':>16}"
    print(head + "  failed areas")
    for c in candidates():
        if isinstance(c, str):
            print(c)
            continue
        passed, failed = conformance(c)
        program = c.compile(RULE)
        converted = c.convert({"object": POD})
        assert _plain(c.run(program, converted)) is True, c.name
        rounds = max(args.rounds // (20 if c.name == "cel-python" else 1), 5)

        def compile_all(c: Candidate = c) -> None:
            for s in sources[:10]:
                # an expression the candidate does not know still costs its parse
                with contextlib.suppress(Exception):
                    c.compile(s)

        compile_us = per_op(compile_all, max(rounds // 10, 3)) / 10
        eval_us = per_op(lambda c=c, p=program, v=converted: c.run(p, v), rounds)
        full_us = per_op(lambda c=c, p=program: c.run(p, c.convert({"object": POD})), rounds)
        figures = f"{compile_us:>11.1f} {eval_us:>9.1f} {full_us:>16.1f}"
        areas = ", ".join(sorted(set(failed))) or "-"
        print(f"{c.name:42} {passed:>5}/{len(CONFORMANCE):<6} {figures}  {areas}")


if __name__ == "__main__":
    main()
