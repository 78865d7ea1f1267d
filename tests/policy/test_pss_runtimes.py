"""PSS and image rules on real runtimes: Trainer's own MPI runtime and the example org's."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from mpigate.policy.images import parse_image, registry_allowed
from mpigate.policy.pss import evaluate_pod, format_message


def pod_templates(runtime: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(replicated job name, pod template) of a (Cluster)TrainingRuntime."""
    for job in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        yield job["name"], job["template"]["spec"]["template"]


@pytest.mark.upstream
def test_trainers_deepspeed_runtime_is_baseline_but_not_restricted(upstream: Path) -> None:
    runtime = yaml.safe_load((upstream / "trainer" / "runtimes" / "deepspeed_distributed.yaml").read_text())
    templates = dict(pod_templates(runtime))
    assert set(templates) == {"node", "launcher"}
    for template in templates.values():
        metadata, spec = template.get("metadata", {}), template["spec"]
        assert evaluate_pod(metadata, spec, "baseline") == ()
        findings = evaluate_pod(metadata, spec, "restricted")
        assert format_message("restricted", "latest", findings) == (
            'violates PodSecurity "restricted:latest": '
            'allowPrivilegeEscalation != false (container "node" must set '
            "securityContext.allowPrivilegeEscalation=false), "
            'unrestricted capabilities (container "node" must set '
            'securityContext.capabilities.drop=["ALL"]), '
            'runAsNonRoot != true (pod or container "node" must set securityContext.runAsNonRoot=true), '
            'seccompProfile (pod or container "node" must set securityContext.seccompProfile.type to '
            '"RuntimeDefault" or "Localhost")'
        )
        assert [p for f in findings for p in f.paths] == [
            "spec.containers[0].securityContext.allowPrivilegeEscalation",
            "spec.containers[0].securityContext.capabilities.drop",
            "spec.containers[0].securityContext.runAsNonRoot",
            "spec.containers[0].securityContext.seccompProfile.type",
        ]
        # Trainer's image is on ghcr.io, untagged: neither allowed by the example org nor pinned.
        image = parse_image(spec["containers"][0]["image"])
        assert (image.name, image.is_latest) == ("ghcr.io/kubeflow/trainer/deepspeed-runtime", True)


def test_example_org_runtime_passes_restricted_and_its_images_are_allowed(repo: Path) -> None:
    runtime = yaml.safe_load((repo / "policies" / "runtimes" / "mpi-openmpi-gpu.yaml").read_text())
    org = yaml.safe_load((repo / "policies" / "org.yaml").read_text())
    allowed = org["spec"]["images"]["allowedRegistries"]
    for _, template in pod_templates(runtime):
        assert evaluate_pod(template.get("metadata", {}), template["spec"], "restricted", "v1.0") == ()
        assert evaluate_pod(template.get("metadata", {}), template["spec"], "restricted") == ()
        for container in template["spec"]["containers"]:
            image = parse_image(container["image"])
            assert registry_allowed(image, allowed) == "registry.acme.internal"
            assert image.digest is not None and not image.is_latest
