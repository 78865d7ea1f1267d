"""Which objects the engine understands, and the finding for one it does not (MPG-API-001).

The engine judges exactly the ``(apiVersion, kind)`` pairs of :data:`UNDERSTOOD`. Anything else that
reaches it — a TrainJob version Trainer starts serving after this release, a kubeflow.org/v1 MPIJob
of the old training-operator, a kind a widened webhook configuration sends — would run unjudged if
it were let through, so it is a finding of MPG-API-001 (``enforce`` by default: denied, naming the
apiVersion; an org that accepts the risk sets ``spec.enforcement.overrides: {MPG-API-001: warn}``).
The webhook, ``mpigate explain``, ``mpigate review`` and ``mpigate test`` all get this answer from
the engine, so they cannot disagree.
"""

from __future__ import annotations

from typing import Any, Final

from mpigate.trainjob.jsontypes import is_mapping

from .decision import AdmissionInput
from .findings import Finding

__all__ = ["UNDERSTOOD", "api_version_of", "unrecognized"]

#: (apiVersion, kind) of every object the engine judges. The webhook's routes
#: (admission/routes.py RESOURCES) list the same pairs (tests/webhooks checks it).
UNDERSTOOD: Final = frozenset(
    {
        ("trainer.kubeflow.org/v1alpha1", "TrainJob"),
        ("trainer.kubeflow.org/v1alpha1", "TrainingRuntime"),
        ("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime"),
        ("kubeflow.org/v2beta1", "MPIJob"),
    }
)


def api_version_of(request: AdmissionInput) -> Any:
    """The request's object's ``apiVersion`` (the stored object's on DELETE), as sent."""
    obj = request.obj if request.obj is not None else request.old_obj
    return obj.get("apiVersion") if is_mapping(obj) else None


def _understood_text() -> str:
    by_version: dict[str, list[str]] = {}
    for api_version, kind in sorted(UNDERSTOOD):
        by_version.setdefault(api_version, []).append(kind)
    return "; ".join(f"{', '.join(kinds)} ({version})" for version, kinds in sorted(by_version.items()))


def unrecognized(request: AdmissionInput) -> Finding | None:
    """MPG-API-001 when the engine does not understand the request's ``(apiVersion, kind)``."""
    api_version = api_version_of(request)
    kind = request.kind
    if isinstance(api_version, str) and (api_version, kind) in UNDERSTOOD:
        return None
    shown = api_version if isinstance(api_version, str) and api_version else "(no apiVersion)"
    known_versions = sorted(v for v, k in UNDERSTOOD if k == kind)
    if known_versions:
        fix = (
            f"Write the {kind} as {' or '.join(known_versions)}, the version mpigate judges. An org that "
            "accepts running it unjudged can set spec.enforcement.overrides MPG-API-001: warn in "
            "policies/org.yaml."
        )
    else:
        fix = (
            "Use a kind mpigate judges, or ask the platform team: the webhook configuration should not "
            "send this kind, and an org that accepts running it unjudged can set "
            "spec.enforcement.overrides MPG-API-001: warn in policies/org.yaml."
        )
    return Finding(
        "MPG-API-001",
        "apiVersion",
        f"mpigate does not understand {kind or '(no kind)'} {shown}, so its pods would run unjudged; it "
        f"judges {_understood_text()}.",
        fix,
        f"{kind or '(no kind)'} {shown} is not understood by mpigate",
    )
