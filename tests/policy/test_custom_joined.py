"""Rules judged together are joined into one CEL source (mpigate.policy.custom_compiled: a plan's
list program, the joint program over a request's pods; mpigate.cel.validation: a policy's
variables and validation wrapped in cel.bind). CEL has line comments (``// …`` to the end of the
line), which Kubernetes accepts at the end of an expression: joined on one line, such a comment
would swallow the rules that follow it up to the next newline inside a later expression — the list
then holds other expressions than its rules (``[a // c, b, c\\n|| d]`` is the one-element list
``[a || d]``). Each rule must be judged exactly as on its own, whatever its text."""

from __future__ import annotations

from pathlib import Path

from tests.policy.helpers import custom_config, custom_rule, decide, runtime_patch, smoke_job

# rule 1 is the victim: it refuses a container running as root; the rules around it are harmless,
# written as people write them (a trailing comment; an expression broken over lines in YAML)
_AROUND = (
    "object.spec.containers.all(c, c.name != '') // every container is named",
    "object.spec.containers.all(c, c.?securityContext.?runAsUser.orValue(1000) != 0)",
    "object.spec.containers.size() > 0\n|| object.spec.initContainers.size() > 0",
)


def _root_job() -> dict[str, object]:
    root = {"name": "node", "securityContext": {"runAsUser": 0}}
    return smoke_job(runtime_patch("acme.example/root", "node", {"containers": [root]}))


def test_a_trailing_comment_does_not_swallow_the_rules_after_it(tmp_path: Path) -> None:
    config = custom_config(
        tmp_path, *(custom_rule(i, e, message=f"rule {i} refuses it") for i, e in enumerate(_AROUND))
    )
    decision = decide(config, _root_job())
    refusing = {v.rule for v in decision.violations}
    assert "ACME-R1" in refusing, decision.violations
    assert not decision.allowed
    # nothing else is refused: the other two rules pass, and no internal error
    assert refusing & {"ACME-R0", "ACME-R2"} == set(), decision.violations
    assert not any("internal" in v.message for v in decision.violations), decision.violations


def test_the_job_rules_are_joined_as_safely(tmp_path: Path) -> None:
    rules = (
        "has(object.metadata.name) // named",
        "object.metadata.?labels.orValue({}).size() < 0",  # refuses every job
        "true\n|| false",
    )
    config = custom_config(tmp_path, *(custom_rule(i, e, target="TrainJob") for i, e in enumerate(rules)))
    decision = decide(config, smoke_job())
    assert {v.rule for v in decision.violations} & {"ACME-R0", "ACME-R1", "ACME-R2"} == {"ACME-R1"}


def test_a_variable_or_validation_ending_in_a_comment_compiles(tmp_path: Path) -> None:
    doc = """\
apiVersion: mpigate.io/v1alpha1
kind: CustomRule
metadata: {name: commented}
spec:
  id: ACME-COMMENTED
  title: commented
  match: {targets: [Pod]}
  variables:
    - name: users
      expression: "object.spec.containers.map(c, c.?securityContext.?runAsUser.orValue(1000)) // uids"
  validations:
    - expression: "variables.users.all(u, u != 0) // no root"
      message: no root
"""
    config = custom_config(tmp_path, doc)
    decision = decide(config, _root_job())
    assert "ACME-COMMENTED" in {v.rule for v in decision.violations}, decision.violations
