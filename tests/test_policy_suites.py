"""The example org's PolicyTest suites pass and cover every rule of the catalogue; the runner reports
differences precisely and writes JUnit XML."""

from __future__ import annotations

import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from mpigate.catalogue import rule_ids
from mpigate.config import load, thaw
from mpigate.policytest import junit_xml, run_suites
from tests.conftest import FIXTURES, REPO, TODAY


def test_example_org_suites_pass() -> None:
    config = load(REPO, today=TODAY)
    results = run_suites(config)
    failures = [
        (c.name, c.location, c.differences, c.error) for s in results for c in s.cases if not c.passed
    ]
    assert failures == []
    assert sum(len(s.cases) for s in results) >= 50


def test_every_catalogue_rule_appears_in_some_suite_expectation() -> None:
    config = load(REPO, today=TODAY)
    mentioned: set[str] = set()
    for suite in config.tests:
        for case in suite.cases:
            expect = thaw(case.get("expect", {}))
            for key in ("violations", "includes", "excludes", "warnings"):
                mentioned.update(expect.get(key, []))
    missing = [rule for rule in rule_ids() if rule not in mentioned]
    assert missing == []


WRONG = """\
apiVersion: mpigate.io/v1alpha1
kind: PolicyTest
metadata: {name: wrong}
spec:
  now: "2026-11-22T12:00:00Z"
  cases:
    - name: expectations that do not hold
      object: {file: ../../jobs/hello.yaml}
      expect:
        allowed: false
        violations: [MPG-Q001]
        includes: [MPG-Q002]
        warnings: [MPG-IMG-002]
        messageContains: "no such text"
        patched: {/metadata/labels/kueue.x-k8s.io~1queue-name: other, /spec/nothing: 1}
        notPatched: [/metadata/labels]
        exceptions: [alpha-images]
    - name: an unreadable object
      object: {file: ../../jobs/gone.yaml}
      expect: {allowed: true}
    - name: a passing case
      object: {file: ../../jobs/hello.yaml}
      expect:
        allowed: true
        excludes: [MPG-Q001]
        patched: {/metadata/labels/kueue.x-k8s.io~1queue-name: alpha}
"""


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "org"
    shutil.copytree(FIXTURES / "config" / "base", root)
    (root / "policies" / "tests" / "wrong.yaml").write_text(WRONG, encoding="utf-8")
    shutil.copy(root / "jobs" / "hello.yaml", root / "jobs" / "gone.yaml")
    return root


def test_differences_are_precise(tree: Path) -> None:
    config = load(tree, today=TODAY)
    (tree / "jobs" / "gone.yaml").unlink()  # removed after the config was loaded
    results = {s.name: s for s in run_suites(config)}
    wrong = results["wrong"]
    first, unreadable, passing = wrong.cases
    assert not first.passed
    assert first.location == "policies/tests/wrong.yaml:7:7"
    assert first.differences == (
        "allowed: expected False, got True",
        "violations: expected exactly [MPG-Q001], got [] (missing MPG-Q001)",
        "includes: MPG-Q002 did not fire (fired: none)",
        "warnings: no warning from MPG-IMG-002 (warnings: "
        "['spec.trainer.image reaches no container: runtime mpi-fixture has no job labelled trainer'])",
        "messageContains: 'no such text' not found in the decision's messages",
        "patched: /metadata/labels/kueue.x-k8s.io~1queue-name is 'alpha', expected 'other'",
        "patched: /spec/nothing is not set in the mutated object (expected 1)",
        "notPatched: /metadata/labels is changed by add /metadata/labels",
        "exceptions: expected [alpha-images], got []",
    )
    assert unreadable.error is not None and "cannot read the object" in unreadable.error
    assert "gone.yaml" in unreadable.error
    assert passing.passed
    xml = junit_xml(list(results.values()))
    root = ET.fromstring(xml)
    assert root.get("tests") == "4" and root.get("failures") == "2"
    suite = next(s for s in root if s.get("name") == "wrong")
    failure = suite.find("testcase/failure")
    assert failure is not None and failure.get("message") == "allowed: expected False, got True"
    assert suite.find("testcase/error") is not None
