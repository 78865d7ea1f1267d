"""mpigate.cel: Kubernetes' CEL libraries, located compile errors, the cost bound."""

from __future__ import annotations

from typing import Any

import pytest

from mpigate.cel import CompileError, Environment, EvalError
from mpigate.cel.cost import input_size


@pytest.fixture(scope="module")
def env() -> Environment:
    return Environment(["object", "oldObject", "params"])


def _run(env: Environment, source: str, obj: Any = None) -> Any:
    return env.compile(source).evaluate(env.inputs({"object": obj}))


# Examples from the doc comments of k8s.io/apiserver pkg/cel/library/*.go and cel-go ext.
@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('quantity("1Gi").isGreaterThan(quantity("1000Mi"))', True),
        ('quantity("1") == quantity("1000m")', True),
        ('quantity("500m").add(1).asApproximateFloat()', 1.5),
        ('quantity("50k").sub(quantity("20k")) == quantity("30k")', True),
        ('quantity("1.5").isInteger()', False),
        ('quantity("50M").asInteger()', 50_000_000),
        ('quantity("-1").sign()', -1),
        ('isQuantity("1x")', False),
        ('isQuantity(" 1")', False),
        ('semver("1.2.3").isLessThan(semver("1.10.0"))', True),
        ('semver("1.2.3").isGreaterThan(semver("1.2.0"))', True),
        ('semver("v1.2", true).minor()', 2),
        ('semver("1.0.0-alpha").compareTo(semver("1.0.0"))', -1),
        ('semver("1.0.0-alpha.1").compareTo(semver("1.0.0-alpha.beta"))', -1),
        ('isSemver("v1.0.0")', False),
        ('ip("10.0.0.1").family()', 4),
        ('ip("::1").isLoopback()', True),
        ('ip("8.8.8.8").isGlobalUnicast()', True),
        ('ip.isCanonical("2001:db8::abcd")', True),
        ('ip.isCanonical("2001:DB8::ABCD")', False),
        ('cidr("10.0.0.0/8").containsIP("10.2.3.4")', True),
        ('cidr("10.0.0.0/8").containsIP(ip("11.2.3.4"))', False),
        ('cidr("10.0.0.0/8").containsCIDR("10.1.0.0/16")', True),
        ('cidr("192.168.0.1/24").masked() == cidr("192.168.0.0/24")', True),
        ('cidr("10.0.0.0/8").prefixLength()', 8),
        ('isIP("010.0.0.1")', False),
        ('isIP("::ffff:1.2.3.4")', False),
        ('isCIDR("10.0.0.0/33")', False),
        ('url("https://a.example:8443/x?y=1&y=2").getQuery()', {"y": ["1", "2"]}),
        ('url("https://[::1]:80/").getHostname()', "::1"),
        ('url("https://[::1]:80/").getPort()', "80"),
        ('url("/path with space").getEscapedPath()', "/path%20with%20space"),
        ('isURL("relative/path")', False),
        ('"abc123".find("[0-9]+")', "123"),
        ('"a1b2c3".findAll("[0-9]", 2)', ["1", "2"]),
        ("[1, 2, 3].sum()", 6),
        ("[3, 1, 2].isSorted()", False),
        ("[1, 2, 3].max()", 3),
        ('["b", "a"].min()', "a"),
        ("sets.contains([1, 2], [2])", True),
        ("sets.equivalent([1, 2], [2, 1, 1])", True),
        ("sets.intersects([1], [2])", False),
        ("lists.range(3)", [0, 1, 2]),
        ("[[1], [2, [3]]].flatten()", [1, 2, [3]]),
        ("[1, 1, 2].distinct()", [1, 2]),
        ("[1, 2, 3, 4].slice(1, 3)", [2, 3]),
        ('"abc".indexOf("c")', 2),
        ('"a,b".split(",")', ["a", "b"]),
        ('"%s-%d".format(["x", 1])', "x-1"),
        ("object.?spec.?x.orValue(5)", 5),
        ("cel.bind(x, 2, x * x)", 4),
        ("math.greatest(1, 5, 3)", 5),
        ('base64.encode(b"hi")', "aGk="),
        ('object.spec.containers.all(c, c.name.startsWith("a"))', True),
        ('object.spec.containers.exists_one(c, c.name == "a1")', True),
        ("has(object.spec.hostNetwork)", False),
    ],
)
def test_kubernetes_functions(env: Environment, source: str, expected: Any) -> None:
    assert _run(env, source, {"spec": {"containers": [{"name": "a1"}]}}) == expected


@pytest.mark.parametrize(
    ("source", "line", "column", "text"),
    [
        ("object.spec.containers.all(c, ", 1, 31, "Syntax error"),
        ("size('a', 1)", 1, 5, "undeclared reference to 'size'"),
        ("1 +\n  'a' == 2", 1, 3, "no matching overload for '_+_'"),
        ("object.a &&\n  nosuch(1)", 2, 9, "undeclared reference to 'nosuch'"),
        ("[1].all(i, v, v > 0)", 1, 8, "undeclared reference to 'all'"),
        ("   ", 1, 1, "empty"),
    ],
)
def test_compile_errors_are_located(env: Environment, source: str, line: int, column: int, text: str) -> None:
    with pytest.raises(CompileError) as caught:
        env.compile(source)
    assert any(i.line == line and i.column == column and text in i.message for i in caught.value.issues), (
        caught.value.issues
    )


@pytest.mark.parametrize(
    ("source", "text"),
    [
        ("object.missing.x", "missing"),
        ("1 / (size(object.spec) - 1)", "divide by zero"),
        ("9223372036854775807 + size(object.spec)", "overflow"),
        ("quantity(object.spec.containers[0].name)", "regular expression"),
        ("object.spec.containers[3]", "index"),
    ],
)
def test_runtime_errors_are_eval_errors(env: Environment, source: str, text: str) -> None:
    with pytest.raises(EvalError, match=text):
        _run(env, source, {"spec": {"containers": [{"name": "a1"}]}})


def test_errors_inside_or_are_absorbed_as_cel_specifies(env: Environment) -> None:
    assert _run(env, "object.missing.x == 1 || true", {}) is True


def test_cost_bound_stops_a_runaway_expression(env: Environment) -> None:
    program = env.compile("object.l.all(a, object.l.all(b, object.l.all(c, a + b + c >= 0)))")
    assert program.cost.degree >= 3
    small = env.inputs({"object": {"l": list(range(10))}})
    assert program.evaluate(small) is True
    large = env.inputs({"object": {"l": list(range(1000))}})
    with pytest.raises(EvalError, match="cost limit exceeded"):
        program.evaluate(large)


def test_cost_counts_a_map_literals_key_expressions(env: Environment) -> None:
    # the same comprehension as a map key and as a map value costs the same: a key is evaluated too
    as_key = env.compile("{object.spec.containers.map(c, c.name).size(): 1}.size() == 1").cost
    as_value = env.compile("{1: object.spec.containers.map(c, c.name).size()}.size() == 1").cost
    assert as_key.degree == as_value.degree >= 1  # was 0 for the key: its comprehension went uncounted
    assert as_key.at(1000) == as_value.at(1000)


def test_cost_of_a_linear_expression_is_linear(env: Environment) -> None:
    assert env.compile('object.spec.containers.all(c, c.name != "")').cost.degree == 1
    assert env.compile("true").cost.degree == 0


def test_input_size_is_the_longest_collection_or_a_tenth_of_the_longest_string() -> None:
    assert input_size({"a": [1, 2, 3], "b": "x" * 7}) == 3
    assert input_size({"a": [1, 2, 3], "b": "x" * 71}) == 8
    assert input_size({"a": [[1] * 12]}) == 12


def test_digest_identifies_the_source(env: Environment) -> None:
    a, b = env.compile("true"), env.compile("true ")
    assert a.digest.startswith("sha256:") and a.digest != b.digest


def test_imports_before_the_config_package() -> None:
    # mpigate.cel is imported first by anything that only evaluates CEL (a benchmark, a script);
    # it must not depend on mpigate.config having been imported before it (the config package's
    # custom-rule checks import mpigate.cel back).
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", "from mpigate.cel import Environment; Environment(['object'])"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


def test_a_source_compiles_once_and_its_errors_are_kept_too(monkeypatch: pytest.MonkeyPatch) -> None:
    env = Environment(["object"])
    calls: list[str] = []
    compile_once = env._compile

    def counted(source: str, limit_length: bool) -> Any:
        calls.append(source)
        return compile_once(source, limit_length)

    monkeypatch.setattr(env, "_compile", counted)
    program = env.compile("object.a == 1")
    assert env.compile("object.a == 1") is program
    assert program.evaluate(env.inputs({"object": {"a": 1}})) is True
    for _ in range(2):
        with pytest.raises(CompileError) as raised:
            env.compile("object.a ==")
        assert raised.value.issues[0].line == 1
    # a source longer than the API server accepts is refused, but not when mpigate wraps it
    long = " || ".join(["object.a == 1"] * 800)
    with pytest.raises(CompileError, match="longer than"):
        env.compile(long)
    assert env.compile(long, limit_length=False).evaluate(env.inputs({"object": {"a": 1}})) is True
    assert calls == ["object.a == 1", "object.a ==", long, long]


def test_the_compiled_programs_kept_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    import mpigate.cel.env as cel_env

    monkeypatch.setattr(cel_env, "COMPILED_CACHE", 2)
    env = Environment(["object"])
    first = env.compile("1 == 1")
    env.compile("2 == 2")
    assert env.compile("1 == 1") is first  # used last: kept
    env.compile("3 == 3")  # the least recently used (2 == 2) goes
    assert env.compile("1 == 1") is first
    assert len(env._compiled) == 2
    assert env.compile("2 == 2").evaluate(env.inputs({})) is True
