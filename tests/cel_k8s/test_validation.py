"""mpigate.cel.validation: a policy's variables as the API server composes them, and programs that
Gatekeeper-sized policies need (many variables, long parameters, long image names)."""

from __future__ import annotations

from typing import Any

from mpigate.cel.validation import CompiledPolicy, compile_policy, environment

ENV = environment()


def _policy(
    variables: list[tuple[str, str]], validations: list[dict[str, Any]], params: Any = None
) -> CompiledPolicy:
    compiled = compile_policy(
        ENV,
        match_conditions=[],
        variables=variables,
        validations=validations,
        failure_policy="Fail",
        params=params,
    )
    assert isinstance(compiled, CompiledPolicy), compiled
    return compiled


def test_an_error_in_a_variable_fails_only_the_expressions_that_read_it() -> None:
    policy = _policy(
        [("broken", "object.spec.missing == 1"), ("name", "object.metadata.name")],
        [{"expression": "variables.name == 'p'"}, {"expression": "variables.broken"}],
    )
    outcomes = policy.evaluate(ENV, ENV.inputs({"object": {"metadata": {"name": "x"}, "spec": {}}}))
    assert [o.kind for o in outcomes] == ["violation", "error"]
    assert outcomes[0].validation is not None and outcomes[0].validation.index == 0


def test_variables_read_through_other_variables_are_bound() -> None:
    policy = _policy(
        [("a", "object.n"), ("unused", "1 / 0"), ("b", "variables.a + 1")],
        [{"expression": "variables.b == 3"}],
    )
    assert policy.evaluate(ENV, ENV.inputs({"object": {"n": 2}})) == []


def test_long_parameters_and_many_variables_compile() -> None:
    # the length limit is the API server's on what was written, not on mpigate's wrapped program
    params = {"allowed": [f"registry.example.com/team-{i}/" for i in range(400)]}
    variables = [(f"v{i}", f"size(params.allowed) + {i}") for i in range(20)]
    policy = _policy(variables, [{"expression": "variables.v19 > 0"}], params)
    assert policy.evaluate(ENV, ENV.inputs({"object": {}})) == []


def test_a_pod_with_long_image_names_is_not_stopped_by_the_cost_bound() -> None:
    # Gatekeeper's k8spsphostnetworkingports shape: comprehensions over containers, images
    # compared with prefixes; its strings are long, its lists short
    policy = _policy(
        [
            ("containers", "object.spec.containers + object.spec.?initContainers.orValue([])"),
            ("exempt", "params.exemptImages.filter(i, i.endsWith('*')).map(i, i.replace('*', ''))"),
            (
                "bad",
                "variables.containers.filter(c, !variables.exempt.exists(e, c.image.startsWith(e)) && "
                "c.?ports.orValue([]).exists(p, has(p.hostPort) && (p.hostPort < 80 || p.hostPort > 9000)))",
            ),
        ],
        [{"expression": "size(variables.bad) == 0"}],
        {"exemptImages": ["safe.example.com/*"]},
    )
    image = "registry.example.com/a-rather-long-team-name/an-even-longer-image-name:1.2.3-build.4567"
    pod = {
        "spec": {
            "containers": [{"name": f"c{i}", "image": image, "ports": [{"hostPort": 80}]} for i in range(4)]
        }
    }
    assert policy.evaluate(ENV, ENV.inputs({"object": pod})) == []


def test_the_cost_bound_knows_the_sizes_of_the_parameters_written() -> None:
    """A loop over a parameter list inside a loop over the pod's containers costs the list written,
    not the inputs' n: the library's exemptImages shape is quadratic, not cubic, and a filter's
    result grows by one element per step (a cubic bound stopped 20 library rules on one pod)."""
    policy = _policy(
        [
            ("exempt", "params.exemptImages.map(p, '^' + p.replace('.', '\\\\.').replace('*', '.*'))"),
            (
                "containers",
                "object.spec.containers.filter(c, !variables.exempt.exists(r, c.image.matches(r)))",
            ),
        ],
        [{"expression": "variables.containers.all(c, c.?ports.orValue([]).all(p, p.containerPort > 0))"}],
        {"exemptImages": [], "other": {"x": 1}},
    )
    cost = policy.validations[0].expression.program.cost
    assert cost.degree == 2, cost
    assert cost.at(40) < 100_000, cost


def test_variables_of_different_types_type_check() -> None:
    """cel-cpp types a map literal's values by joining their types, and a list(dyn) joined with dyn
    is list(dyn): a filtered list next to a map variable made `variables.pod` a list. Each variable
    is bound as dyn, as the API server types them."""
    policy = _policy(
        [
            ("containers", "object.spec.containers.filter(c, c.name != '')"),
            ("pod", "object.spec.?securityContext.orValue({})"),
        ],
        [{"expression": "variables.pod.?runAsUser.orValue(1) == 1 && size(variables.containers) == 0"}],
        {"runAsUser": {"rule": "MustRunAs", "ranges": [{"min": 1, "max": 2}]}, "exemptImages": []},
    )
    assert policy.evaluate(ENV, ENV.inputs({"object": {"spec": {"containers": []}}})) == []
