"""check compares what a team may read (its region's dataLocations) with what its egress serves
(issue 21 item 7: hf:// was allowed in both regions, no team's egress reached huggingface.co, and
llm-finetune was admitted and then hung at its model initializer)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mpigate.config import check_tree, load
from tests.conftest import REPO, TODAY


@pytest.fixture
def tree(org_tree: Path) -> Path:
    return org_tree


def warnings_of(tree: Path) -> list[str]:
    return [str(p) for p in check_tree(tree, today=TODAY).problems if p.code == "reachability.data"]


def test_the_example_org_reaches_every_location_it_allows() -> None:
    assert warnings_of(REPO) == []
    config = load(REPO, today=TODAY)
    served = {s for rule in config.egress_lists["huggingface"] for s in rule.serves}
    assert served == {"hf://"}
    assert "huggingface" in config.network_for("nlp-team").egress_lists  # llm-finetune's team


def test_a_team_whose_egress_serves_no_hf_is_warned(tree: Path) -> None:
    """The example org as the issue found it: hf:// allowed, no egress to it."""
    network = tree / "networkpolicies" / "nlp-team.yaml"
    network.write_text(network.read_text().replace(", huggingface]", "]"))
    [warning] = warnings_of(tree)
    assert warning == (
        "networkpolicies/nlp-team.yaml:8:3: warning: spec.egressLists: team nlp-team may read hf:// "
        "(region eu's dataLocations), but none of its egress serves it (egress lists: registry, "
        "object-storage-eu): its jobs would be admitted and then fail to reach their data "
        '(hint: add an egress list whose destination serves hf:// (`serves: ["hf://"]`) to the '
        "team's TeamNetwork, or remove hf:// from region eu's dataLocations)"
    )


def test_a_team_s_own_egress_rule_can_serve_a_location(tree: Path) -> None:
    network = tree / "networkpolicies" / "nlp-team.yaml"
    text = network.read_text().replace(", huggingface]", "]")
    network.write_text(text + '  egress:\n    - {cidr: 10.9.9.9/32, ports: [443], serves: ["hf://"]}\n')
    assert warnings_of(tree) == []


def test_volumes_need_no_egress_and_an_undeclared_tree_is_not_judged(tree: Path) -> None:
    profiles = tree / "networkpolicies" / "profiles.yaml"
    text = profiles.read_text()
    for serves in (', serves: ["s3://acme-eu-"]', ', serves: ["s3://acme-us-"]', ', serves: ["hf://"]'):
        text = text.replace(serves, "")
    profiles.write_text(text)
    assert warnings_of(tree) == []  # nothing says what any destination serves: nothing to compare
    text = text.replace("description: egress proxy to huggingface.co", 'serves: ["hf://"]')
    profiles.write_text(text)
    found = warnings_of(tree)
    assert found and all("s3://acme-" in w for w in found)  # pvc:// never, hf:// served
    assert not any("pvc://" in w for w in found)
