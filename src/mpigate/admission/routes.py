"""The webhook server's HTTP surface, shared by the server, the install base (webhooks/) and the
tests that keep them in line. Changing a value here is an API change for installed clusters."""

from __future__ import annotations

from typing import Final

__all__ = [
    "DEFAULT_PORT",
    "HEALTHZ_PATH",
    "METRICS_PATH",
    "MUTATE_PATH",
    "READYZ_PATH",
    "RESOURCES",
    "ROUTED",
    "VALIDATE_PATH",
    "WEBHOOK_OPERATIONS",
]

MUTATE_PATH: Final = "/mutate"
VALIDATE_PATH: Final = "/validate"
HEALTHZ_PATH: Final = "/healthz"
READYZ_PATH: Final = "/readyz"
METRICS_PATH: Final = "/metrics"
DEFAULT_PORT: Final = 8443

# (apiGroup, resource, kind, namespaced) the install base sends to the webhooks, in every version
# (webhooks/base/webhookconfigurations.yaml: apiVersions ["*"]): a version the engine does not
# understand (one Trainer serves after this release, kubeflow.org/v1 MPIJobs of the old training
# operator) reaches it and is denied by MPG-API-001 instead of passing unjudged. MPIJobs are routed
# so that they cannot run around the gate (many clusters still run the MPI Operator).
ROUTED: Final = (
    ("trainer.kubeflow.org", "trainjobs", "TrainJob", True),
    ("trainer.kubeflow.org", "trainingruntimes", "TrainingRuntime", True),
    ("trainer.kubeflow.org", "clustertrainingruntimes", "ClusterTrainingRuntime", False),
    ("kubeflow.org", "mpijobs", "MPIJob", True),
)
# (apiGroup, version, resource, kind, namespaced) of every object the engine understands
# (policy/kinds.py UNDERSTOOD); any other routed version is answered with MPG-API-001.
RESOURCES: Final = (
    ("trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob", True),
    ("trainer.kubeflow.org", "v1alpha1", "trainingruntimes", "TrainingRuntime", True),
    ("trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes", "ClusterTrainingRuntime", False),
    ("kubeflow.org", "v2beta1", "mpijobs", "MPIJob", True),
)
# Mutation happens on CREATE only (most of a TrainJob is immutable afterwards); validation sees
# every operation so that UPDATE and DELETE are judged and audited (the install base sends DELETE and
# suspend-only UPDATEs, which are never denied, through a failurePolicy: Ignore entry).
WEBHOOK_OPERATIONS: Final = {
    "mutate": ("CREATE",),
    "validate": ("CREATE", "UPDATE", "DELETE"),
}
