"""Cost of Pod Security and image checks per pod template, next to a baseline in the same run.

The baseline is ``json.loads(json.dumps(pod))`` — what decoding the pod out of an AdmissionReview
costs anyway — so the figures read as "PSS costs N times the decoding of the pod".

    .venv/bin/python benchmarks/pss.py
"""

from __future__ import annotations

import json
import timeit
from typing import Any

from mpigate.policy.images import parse_image, registry_allowed
from mpigate.policy.pss import evaluate_pod

SC = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
IMAGE = "registry.acme.internal/mpigate/openmpi-runtime:4.1.4-cuda12.4@sha256:" + "ab" * 32


def pod(containers: int) -> dict[str, Any]:
    return {
        "metadata": {"name": "train-node-0-0", "annotations": {"a": "b"}},
        "spec": {
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 1000,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "initContainers": [{"name": "init", "image": IMAGE, "securityContext": SC}],
            "containers": [
                {
                    "name": f"c{i}",
                    "image": IMAGE,
                    "ports": [{"containerPort": 2222}],
                    "readinessProbe": {"tcpSocket": {"port": 2222}},
                    "securityContext": SC,
                }
                for i in range(containers)
            ],
            "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
        },
    }


def per_call_us(fn: Any, number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def row(case: str, base: float, cost: float) -> None:
    print(f"{case:<42}{base:>12.1f}{cost:>13.1f}{cost / base:>8.1f}")


def main() -> None:
    print(f"{'case':<42}{'baseline µs':>12}{'measured µs':>13}{'ratio':>8}")
    for containers in (1, 8):
        p = pod(containers)
        text = json.dumps(p)
        base = per_call_us(lambda text=text: json.loads(text), 2000)
        for level in ("baseline", "restricted"):
            cost = per_call_us(lambda p=p, level=level: evaluate_pod(p["metadata"], p["spec"], level), 2000)
            row(f"evaluate_pod {level}, {containers} container(s)", base, cost)
        worst = dict(p, spec=dict(p["spec"], hostNetwork=True, securityContext={"runAsUser": 0}))
        cost = per_call_us(lambda w=worst: evaluate_pod(w["metadata"], w["spec"], "restricted"), 2000)
        row(f"evaluate_pod restricted, failing, {containers}", base, cost)
    base = per_call_us(lambda: json.loads(json.dumps(IMAGE)), 20000)
    cost = per_call_us(
        lambda: registry_allowed(parse_image(IMAGE), ["quay.io/acme", "registry.acme.internal"]), 20000
    )
    row("parse_image + registry_allowed", base, cost)


if __name__ == "__main__":
    main()
