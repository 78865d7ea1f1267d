#!/usr/bin/env python3
"""Write docs/policies/<ID>.md for every rule of the catalogue and of the rule library, the index
README.md and the library's index library.md.

The narrative (what, why, how to fix) is written here per rule; the "Example" section of every
page is the real output of ``mpigate explain`` on an example object, produced when this script
runs. Pages are deterministic (the config revision is shown as ``<revision>``), and a test checks
that the committed pages equal what this script writes:

    .venv/bin/python scripts/gen_policy_docs.py            # rewrite docs/policies/
    .venv/bin/python scripts/gen_policy_docs.py --check    # exit 1 when a page is stale
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner

from mpigate.catalogue import LibraryRule, RuleInfo, all_rules, library_rules
from mpigate.cli import cli, engine_commands
from mpigate.config import Config
from mpigate.config.schema import defaults_from

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "policies"
NOW = "2026-11-22T12:00:00Z"


@dataclass(frozen=True)
class Example:
    """What to explain: an example file (relative to the repo) or an inline object."""

    file: str | None = None
    obj: dict[str, Any] | None = None
    args: tuple[str, ...] = ()
    old: dict[str, Any] | None = None
    baseline: bool = False
    show_patch: bool = False


@dataclass(frozen=True)
class Page:
    what: str
    why: str
    fix: str
    example: Example
    notes: str = ""
    extra: tuple[str, ...] = field(default_factory=tuple)
    more: tuple[Example, ...] = field(default_factory=tuple)


def trainjob(
    name: str, patch_spec: dict[str, Any] | None = None, metadata: dict[str, Any] | None = None
) -> dict[str, Any]:
    """An nlp-team TrainJob whose runtime patch (manager acme.example/debug) sets ``patch_spec`` on "
    "the launcher."""
    job: dict[str, Any] = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": "nlp-team", "labels": {"mpigate.io/cost-center": "cc-4711"}},
        "spec": {
            "runtimeRef": {"name": "mpi-openmpi-gpu"},
            "trainer": {
                "numNodes": 1,
                "image": "registry.acme.internal/nlp/llm-train:1.4.2",
                "resourcesPerNode": {"limits": {"nvidia.com/gpu": 8}},
            },
        },
    }
    if patch_spec is not None or metadata is not None:
        template: dict[str, Any] = {}
        if metadata:
            template["metadata"] = metadata
        if patch_spec:
            template["spec"] = patch_spec
        job["spec"]["runtimePatches"] = [
            {
                "manager": "acme.example/debug",
                "trainingRuntimeSpec": {
                    "template": {
                        "spec": {
                            "replicatedJobs": [
                                {"name": "launcher", "template": {"spec": {"template": template}}}
                            ]
                        }
                    }
                },
            }
        ]
    return job


def container(sc: dict[str, Any]) -> dict[str, Any]:
    return {"containers": [{"name": "node", "securityContext": sc}]}


def runtime(
    name: str, pod: dict[str, Any] | None = None, node: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A restricted-compliant OpenMPI runtime with ``pod``/``node`` fields added to its node job."""
    spec: dict[str, Any] = {
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": "node",
                "image": "registry.acme.internal/mpigate/openmpi-runtime:4.1.4",
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                **(node or {}),
            }
        ],
        **(pod or {}),
    }
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": name},
        "spec": {
            "mlPolicy": {
                "numNodes": 1,
                "mpi": {
                    "mpiImplementation": "OpenMPI",
                    "sshAuthMountPath": "/home/mpiuser/.ssh",
                    "runLauncherAsNode": True,
                },
            },
            "template": {
                "spec": {
                    "replicatedJobs": [{"name": "node", "template": {"spec": {"template": {"spec": spec}}}}]
                }
            },
        },
    }


MODES = (
    "The mode comes from `spec.enforcement` in `policies/org.yaml` (exact ID, family prefix such as "
    "`MPG-SEC`, or glob): `enforce` denies, `warn` admits with a warning that `kubectl` prints, "
    "`audit` only records the violation in the decision and the audit trail. A `PolicyException` "
    "naming this rule waives it for matching jobs until its `expires` day; the decision records the "
    "exception, its approver and ticket."
)

# Why each Pod Security check matters for MPI training pods (the "what" is the upstream check).
PSS_WHY: dict[str, str] = {
    "hostNamespaces": "Host networking/PID/IPC lets a training pod see and reach every process and socket "
    "on the node, including other teams' jobs on shared GPU nodes. MPI works over the pod network.",
    "privileged": "A privileged container has every capability and all host devices; it is root on the node.",
    "capabilities_baseline": "Capabilities such as SYS_ADMIN, SYS_PTRACE or NET_ADMIN break the container "
    "boundary. MPI images that ask for IPC_LOCK or SYS_PTRACE usually work without them (shared memory "
    "through an emptyDir with medium Memory; CMA disabled through "
    "OMPI_MCA_btl_vader_single_copy_mechanism=none).",
    "hostPathVolumes": "A hostPath volume reads or writes the node's file system: other pods' data, kubelet "
    "credentials, container runtime sockets.",
    "hostPorts": "A host port exposes the pod on the node's address, outside the NetworkPolicies that "
    "isolate a team's jobs; sshd on 2222 needs only the pod network.",
    "hostProbesAndHostLifecycle": "A probe or lifecycle hook with `host` makes the kubelet connect to an "
    "arbitrary address, which can be used to reach the node's or other tenants' services.",
    "appArmorProfile": "An Unconfined AppArmor profile removes the mandatory access control that "
    "confines the container.",
    "seLinuxOptions": "Custom SELinux users, roles or types (such as spc_t) escape the container's "
    "SELinux confinement.",
    "procMount": "An Unmasked /proc exposes kernel interfaces that the runtime normally hides from "
    "containers.",
    "seccompProfile_baseline": "An Unconfined seccomp profile exposes every system call of the "
    "node's kernel.",
    "sysctls": "Only namespaced, safe sysctls may be set; others change kernel behaviour for the whole node.",
    "windowsHostProcess": "A Windows HostProcess container runs as a process on the node itself.",
    "restrictedVolumes": "Only volume types that cannot reach the node or arbitrary storage are allowed; "
    "data goes through PersistentVolumeClaims, CSI or the initializers.",
    "allowPrivilegeEscalation": "Without allowPrivilegeEscalation: false a process can gain more privileges "
    "than its parent (setuid binaries, file capabilities).",
    "runAsNonRoot": "Root in a container is root on the node once anything goes wrong. Trainer's "
    "MPI runtimes "
    "run sshd as UID 1000 (keys in /home/mpiuser/.ssh); mpigate's reference runtimes do the same.",
    "runAsUser": "UID 0 is root. Many MPI images default to it; use a non-root user and the "
    "matching sshAuthMountPath.",
    "seccompProfile_restricted": "RuntimeDefault filters the system calls containers do not need; "
    "restricted requires it.",
    "capabilities_restricted": "Dropping ALL capabilities (adding back at most NET_BIND_SERVICE) is "
    "what restricted requires.",
    "procMount_restricted": "At restricted (1.35+) /proc must be the default mount, even with user "
    "namespaces.",
}

PSS_EXAMPLES: dict[str, Example] = {
    "hostNamespaces": Example(obj=runtime("host-ipc", pod={"hostIPC": True})),
    "privileged": Example(obj=trainjob("privileged-launcher", container({"privileged": True}))),
    "capabilities_baseline": Example(
        obj=trainjob("extra-caps", container({"capabilities": {"add": ["SYS_ADMIN"]}})), baseline=True
    ),
    "hostPathVolumes": Example(
        obj=trainjob("host-logs", {"volumes": [{"name": "logs", "hostPath": {"path": "/var/log"}}]}),
        baseline=True,
    ),
    "hostPorts": Example(
        obj=runtime("host-ports", node={"ports": [{"containerPort": 2222, "hostPort": 2222}]})
    ),
    "hostProbesAndHostLifecycle": Example(
        obj=runtime("probe-host", node={"readinessProbe": {"tcpSocket": {"port": 2222, "host": "10.0.0.1"}}})
    ),
    "appArmorProfile": Example(
        obj=trainjob("unconfined", container({"appArmorProfile": {"type": "Unconfined"}}))
    ),
    "seLinuxOptions": Example(
        obj=trainjob("spc", {"securityContext": {"seLinuxOptions": {"type": "spc_t"}}})
    ),
    "procMount": Example(obj=trainjob("unmasked", container({"procMount": "Unmasked"})), baseline=True),
    "seccompProfile_baseline": Example(
        obj=trainjob("no-seccomp", {"securityContext": {"seccompProfile": {"type": "Unconfined"}}}),
        baseline=True,
    ),
    "sysctls": Example(
        obj=trainjob(
            "shm", {"securityContext": {"sysctls": [{"name": "kernel.shmmax", "value": "68719476736"}]}}
        )
    ),
    "windowsHostProcess": Example(
        obj=trainjob("host-process", container({"windowsOptions": {"hostProcess": True}}))
    ),
    "restrictedVolumes": Example(
        obj=trainjob("nfs", {"volumes": [{"name": "data", "nfs": {"server": "10.0.0.5", "path": "/data"}}]})
    ),
    "allowPrivilegeEscalation": Example(
        obj=trainjob("setuid", container({"allowPrivilegeEscalation": True}))
    ),
    "runAsNonRoot": Example(obj=trainjob("root-ok", {"securityContext": {"runAsNonRoot": False}})),
    "runAsUser": Example(obj=trainjob("uid0", container({"runAsUser": 0}))),
    "seccompProfile_restricted": Example(
        obj=trainjob("no-seccomp", container({"seccompProfile": {"type": "Unconfined"}}))
    ),
    "capabilities_restricted": Example(
        obj=trainjob("net-raw", container({"capabilities": {"add": ["NET_RAW"]}}))
    ),
    "procMount_restricted": Example(obj=trainjob("unmasked", container({"procMount": "Unmasked"}))),
}

ALIAS_WHAT = "Trainer resolves the TrainJob's pods from its runtime, every runtime patch and `spec.trainer`; "

PAGES: dict[str, Page] = {
    "MPG-API-001": Page(
        what="The object must be a kind and `apiVersion` mpigate judges: `TrainJob`, `TrainingRuntime` and "
        "`ClusterTrainingRuntime` in `trainer.kubeflow.org/v1alpha1`, and `MPIJob` in `kubeflow.org/v2beta1` "
        "([MPIJobs](../mpijobs.md)). The install base sends every version "
        'of TrainJobs, runtimes and `kubeflow.org` MPIJobs to the webhooks (`apiVersions: ["*"]`); any '
        "other version or kind that reaches the engine — a TrainJob version Trainer serves after this "
        "release, an MPIJob of the old training operator (`kubeflow.org/v1`), a kind a widened webhook "
        "configuration sends — is answered by this rule, naming the `apiVersion`. `mpigate explain`, "
        "`mpigate review` and the webhook give the same answer. DELETE is allowed and recorded.",
        why="An object mpigate cannot read would run unjudged: no quota, Pod Security, image, residency or "
        "network rule could see its pods. Judging it as the version mpigate knows could miss fields the "
        "new version added. Failing closed turns an API upgrade into a visible decision instead of a "
        "silent bypass.",
        fix="Write the object in the version mpigate judges. An org that accepts running such objects "
        "unjudged (for a migration, say) sets `spec.enforcement.overrides: {MPG-API-001: warn}` in "
        "`policies/org.yaml` (admitted with a warning, recorded), or a `PolicyException` for one team.",
        example=Example(file="examples/trainjobs/deny-unknown-version.yaml"),
    ),
    "MPG-TEAM-001": Page(
        what="A TrainJob's namespace must belong to a team (a `TeamQuota` lists it under `spec.namespaces`). "
        "With `managedNamespaces.unmanaged: deny` (the example org) TrainJobs elsewhere are denied; "
        "with `allow` "
        "they are admitted without team rules (quota, queues, residency, team labels), while the org-wide "
        "rules (Pod Security, images, credentials, MPI sanity, runtimes) still apply.",
        why="Every GPU, every job and every audit record must be attributable to a team: quotas, "
        "chargeback and "
        "access reviews depend on it.",
        fix="Create the TrainJob in your team's namespace, or have the platform team add the "
        "namespace to the "
        "team's `quotas/<team>.yaml`.",
        example=Example(file="examples/trainjobs/deny-unmanaged-namespace.yaml"),
    ),
    "MPG-Q001": Page(
        what="Kueue must be able to admit the job into the team's ClusterQueue at all: mpigate runs "
        "Kueue's own admission arithmetic (`mpigate.kueue`, mirroring Kueue v0.19.2's "
        "`potentialAvailable` and flavor assigner) on the ClusterQueue as it renders it, on an empty "
        "cluster. Every covered resource counts — GPUs, `cpu`, `memory` and `pods` —, each pod set "
        "(replicated job) gets **one** flavor per resource group (two 8-GPU flavors do not make a "
        "16-GPU pod set), earlier pod sets' share counts against later ones, borrowing reaches only as "
        "far as the cohort can actually lend (other teams' quota minus their `lendingLimit`; a "
        "`borrowingLimit` with no lender adds nothing), pods must match a flavor's node labels, and a "
        "resource no resource group covers (`ephemeral-storage`, a GPU type without a flavor) makes "
        "the job inadmissible (Kueue's default `quotaCheckStrategy: BlockUndeclared`). Requests are "
        "counted as Kueue counts them: limits stand in for missing requests, and a container that "
        "requests no `cpu`/`memory` is counted at the namespace LimitRange's default (500m, 1Gi) — "
        "even when it states a limit. Pod counts follow Trainer: with `runLauncherAsNode`, "
        "`numNodes: N` runs 1 launcher + max(N−1, 1) nodes, all with `resourcesPerNode`.",
        why="Kueue never rejects at submission: a job that no flavor assignment can ever fit waits in "
        "the queue forever (Kueue reports it as `NoFit`). mpigate says so at `kubectl apply` time, with "
        "the numbers Kueue uses.",
        fix="Lower `spec.trainer.numNodes` (the message says to what) or the resources per node, drop "
        "requests for uncovered resources, or ask the team's contact to raise the quota in "
        "`quotas/<team>.yaml`.",
        example=Example(file="examples/trainjobs/deny-over-quota.yaml"),
        more=(
            Example(file="examples/trainjobs/deny-cpu-over-quota.yaml"),
            Example(file="examples/trainjobs/deny-uncovered-resource.yaml"),
        ),
    ),
    "MPG-Q002": Page(
        what="`spec.trainer.numNodes` (or the runtime's `mlPolicy.numNodes` when the job omits it) "
        "must not exceed "
        "the team's `maxNodesPerJob`.",
        why="Very wide jobs fragment the cluster, hold many nodes while their gang starts and take "
        "long to schedule; the limit is an agreement between the team and the platform. (Width does "
        "not decide preemption: Kueue preempts other teams' borrowed jobs before the team's own, lower "
        "priority first, then the most recently admitted.)",
        fix="Use fewer, fuller nodes (more GPUs per pod), or ask for a higher `maxNodesPerJob`.",
        example=Example(file="examples/trainjobs/deny-too-many-nodes.yaml"),
    ),
    "MPG-Q003": Page(
        what="Per pod, GPUs must fit one node of the team's flavors (`gpusPerNode`), GPU requests must equal "
        "limits (or only limits are set), and GPU counts are whole numbers.",
        why="A pod asking for more GPUs than a node has can never be scheduled; extended resources cannot be "
        "overcommitted, and the API server rejects requests without limits only after Kueue "
        "admitted the job.",
        fix="Ask for at most `gpusPerNode` GPUs per pod (`spec.trainer.resourcesPerNode.limits`) "
        "and scale out "
        "with `numNodes`.",
        example=Example(file="examples/trainjobs/deny-gpus-per-pod.yaml"),
    ),
    "MPG-Q004": Page(
        what="MPI slots per worker should match GPUs per pod. Slots are "
        "`spec.trainer.numProcPerNode`, else the "
        "runtime's `mlPolicy.mpi.numProcPerNode`; when that is 1 and a pod asks for more than one "
        "GPU, Trainer "
        "uses the GPU count. CPU-only jobs are warned when slots exceed the requested CPUs.",
        why="Fewer ranks than GPUs leaves GPUs idle (and still billed); more ranks than GPUs makes "
        "them share "
        "devices. Advisory: Trainer runs the job either way.",
        fix="Set `spec.trainer.numProcPerNode` to the GPUs per pod, or ask for as many GPUs as ranks.",
        example=Example(file="examples/trainjobs/warn-slots-mismatch.yaml"),
        notes="Advisory in the catalogue: `enforce` acts as `warn`.",
    ),
    "MPG-Q005": Page(
        what="The Kueue queue label `kueue.x-k8s.io/queue-name` must name one of the team's "
        "LocalQueues. When "
        "it is absent, mpigate sets the team's default queue on CREATE. Every TrainJob of a team "
        "namespace is also created with `spec.suspend: true` (mpigate sets it): Kueue un-suspends "
        "it when the team's ClusterQueue admits it. Kueue's own defaulter suspends only jobs that "
        "already carry the queue label when it runs, and the API server runs it before mpigate's "
        "(mutating webhook configurations run in name order: `defaulter.trainer.kubeflow.org`, "
        "`kueue-mutating-webhook-configuration`, `mpigate`); a CREATE that reaches validation "
        "unsuspended (the mutation was skipped or undone) is refused.",
        why="A job in another team's queue would consume that team's quota; a job stored "
        "unsuspended starts at once, outside the team's quota and flavors, until Kueue stops it.",
        fix="Remove the label (mpigate sets the default) or use one of the queues the message lists; "
        "leave `spec.suspend` to mpigate and Kueue.",
        example=Example(file="examples/trainjobs/deny-other-team-queue.yaml"),
        extra=("minimal",),
    ),
    "MPG-Q006": Page(
        what="The priority label `kueue.x-k8s.io/priority-class` must name a WorkloadPriorityClass "
        "the team may "
        "use (`priorityClasses` in its TeamQuota). When absent, mpigate sets the team's default (the first).",
        why="Priority decides preemption; teams agree on which classes they may use.",
        fix="Remove the label or use one of the allowed classes.",
        example=Example(file="examples/trainjobs/deny-other-team-queue.yaml"),
        extra=("minimal",),
    ),
    "MPG-Q007": Page(
        what="On CREATE of a TrainJob or an MPIJob, the team's active jobs - TrainJobs and MPIJobs "
        "together, queued and suspended ones included, finished ones (TrainJob Complete/Failed, MPIJob "
        "Succeeded/Failed) not, read by the webhook from the cluster - must be fewer than its "
        "`maxConcurrentJobs`. Without live context the rule is silent (the webhook adds a warning that "
        "live context was unavailable); the rendered ResourceQuota backstop still counts TrainJob "
        "objects.",
        why="A cap on concurrent jobs keeps one team's sweep from flooding the queue and the API server.",
        fix="Wait for a job to finish or delete one, or ask for a higher `maxConcurrentJobs`.",
        example=Example(file="examples/trainjobs/queue-full.yaml", args=("--active-jobs", "5")),
    ),
    "MPG-Q008": Page(
        what="On CREATE, with live usage from Kueue (`status.flavorsReservation` of the team's "
        "ClusterQueue and of every other queue of its cohort), warn when Kueue could not admit the "
        "job right now, saying how much more of which flavor must free up: the same flavor "
        "assignment as MPG-Q001, with Kueue's `available` (own unused quota plus what the cohort can "
        "lend now) instead of `potentialAvailable`.",
        why="Users otherwise see a silent `Pending`; the warning says what must free up first. It is a "
        "lower bound, not a forecast: Kueue may preempt lower-priority jobs of the team "
        "(`withinClusterQueue: LowerPriority`) and take back quota the team lent to its cohort "
        "(`reclaimWithinCohort: Any`), but never preempts to borrow (`borrowWithinCohort: Never`; with "
        "fair sharing on, jobs of teams over their fair share can be preempted); with "
        "`BestEffortFIFO` smaller jobs queued later may start first.",
        fix="Nothing is required: Kueue admits the job later. Ask for fewer GPUs to start sooner.",
        example=Example(file="examples/trainjobs/queue-full.yaml", args=("--gpus-in-use", "a100-eu=12")),
        notes="Advisory in the catalogue: `enforce` acts as `warn`.",
    ),
    "MPG-RES-001": Page(
        what="Every replicated job's pods are pinned to the team's region: on CREATE mpigate's runtime patch "
        "adds the region's `nodeLabels` as a nodeSelector for every replicated job. A data classification "
        "label (`mpigate.io/data-classification`) may narrow the regions; a team outside them is denied.",
        why="Data residency (GDPR Art. 44, HIPAA) is about where the computation runs, not only "
        "where data rests.",
        fix="Run the job from a team in an allowed region, and do not override the region nodeSelector.",
        example=Example(file="examples/trainjobs/deny-phi-outside-eu.yaml"),
        extra=("minimal",),
    ),
    "MPG-RES-002": Page(
        what="No nodeSelector, node affinity or toleration — in the runtime or in any runtime patch "
        "other than "
        "mpigate's — may target another region: its node labels or the labels and tolerations of "
        "flavors there.",
        why="A later patch could otherwise pull pods across the border despite mpigate's own pinning.",
        fix="Remove the selector; mpigate pins the pods to the team's region itself.",
        example=Example(file="examples/trainjobs/deny-other-region-nodes.yaml"),
    ),
    "MPG-RES-003": Page(
        what="Every data location a job's pods read must start with one of the region's `dataLocations`. "
        "In Trainer's initializer containers that is the value the initializer actually reads: the "
        "effective `STORAGE_URI` (Trainer sets it from `spec.initializer.dataset/model.storageUri`, then "
        "applies the TrainJob's `env`, so an env `STORAGE_URI` wins and is reported at its env path), "
        "and `ENDPOINT` (the S3 providers' endpoint), `METADATA_LOC` (the cache provider's metadata) and "
        "`HF_ENDPOINT` (the Hugging Face hub), whatever their scheme; an empty value means the "
        "initializer's default and is not judged. A location mpigate cannot read — an initializer "
        "variable taken from `valueFrom`, or `STORAGE_URI` left to a Secret or ConfigMap through "
        "`envFrom`/`secretRef` — is refused; a `secretRef` that could set the other variables is a "
        "warning naming them. In every other container, each env value that is a storage URI (s3://, "
        "gs://, hf://, pvc://, abfs:// ... and every scheme named in a region's `dataLocations`) is "
        "judged; http(s) URLs there are endpoints of the program, not data locations. Credentials "
        "inside a URI are never shown.",
        why="Reading data from another region moves it across the border; the initializer reads what "
        "its environment says, not what the TrainJob's `storageUri` says.",
        fix="Use the copy of the data in the team's region; write locations literally (credentials "
        "stay in the Secret); list other endpoints (a MinIO in the region) in the region's "
        "`dataLocations`.",
        example=Example(file="examples/trainjobs/deny-wrong-region-data.yaml"),
    ),
    "MPG-RT-001": Page(
        what="The TrainJob's `spec.runtimeRef` must name a runtime approved in `policies/org.yaml` "
        "(`spec.runtimes.allowed`, optionally per team) and allowed by the team's `runtimes`; "
        "approved runtimes "
        "are reviewed manifests in the config tree (or marked `external`). It also covers what Trainer would "
        "reject about the fit of job and runtime: patches naming jobs or containers the runtime lacks, env "
        "patches on Trainer's reserved containers, initializers the runtime does not run, reserved "
        "OpenMPI env in `spec.trainer.env`. And malformed input: a field mpigate reads with the wrong "
        'type or out of range (a `runtimePatches` part of `42`, `true`, `"x"` or `[null]`, a '
        "`numProcPerNode` below 1) is a denial naming the field, and the part is left out of the "
        "merge so that nothing next to it goes unjudged (`numNodes`, `resourcesPerNode`, "
        "`spec.trainer.image`, env and initializer fields are reported under the rule that reads "
        "them: MPG-Q002, MPG-Q003, MPG-IMG-001, MPG-SEC-SECRETS, MPG-RES-003). On "
        "CREATE/UPDATE of a "
        "runtime object with an approved name, its spec must equal the reviewed manifest.",
        why="The runtime decides the pods: images, users, volumes. Only reviewed runtimes keep that under "
        "change control.",
        fix="Use an approved runtime, or have the runtime reviewed and added to `policies/runtimes/`.",
        example=Example(file="examples/trainjobs/deny-unapproved-runtime.yaml"),
    ),
    "MPG-RT-002": Page(
        what="MPI runtime sanity: `mlPolicy.mpi.mpiImplementation` must be one the org allows "
        "(Trainer supports "
        "OpenMPI), and `sshAuthMountPath` must match the user the launcher and node containers run as: "
        "`/root/.ssh` only for root, `/home/<user>/.ssh` for non-root images. On an MPIJob the same holds "
        "for `spec.mpiImplementation` and `spec.sshAuthMountPath` (the first container of the Launcher and "
        "Worker), and this rule also refuses what the MPI Operator would not run: no Launcher, a Launcher "
        "with other than 1 replica, a replica without a container, a `restartPolicy` other than `Never` "
        "or `OnFailure`, a negative `slotsPerWorker` ([MPIJobs](../mpijobs.md)).",
        why="ssh reads keys from the home of the user it runs as; a mismatch makes mpirun fail "
        "after the job was "
        "admitted and the GPUs reserved.",
        fix="Set `sshAuthMountPath` to the home of the image's user (Trainer's images: "
        "`/home/mpiuser/.ssh`, UID 1000).",
        example=Example(file="examples/runtimes/deny-root-runtime.yaml"),
    ),
    "MPG-RT-003": Page(
        what="A TrainJob on a runtime approved as `external` (installed with Trainer, not kept in the "
        "config tree) is judged on the runtime's manifest as the cluster has it: the webhook reads it for "
        "/mutate and /validate, on CREATE and UPDATE alike, so mpigate's runtime patch covers the "
        "runtime's jobs and every rule sees the effective pods. When it cannot be read (not found, a "
        "timeout, an API error, `serve --no-live`, `mpigate explain` without `--runtime FILE`), the "
        "job is denied.",
        why="Without the runtime, mpigate cannot build the job's pods, so their images, Pod Security, "
        "residency, service accounts and network would go unjudged: admitting such a job on "
        "`spec.trainer` alone let a failed lookup open the gate.",
        fix="Retry when the runtime can be read; with `mpigate explain`, pass the runtime's manifest "
        "with `--runtime FILE`. An org that prefers availability sets `MPG-RT-003: warn` under "
        "`spec.enforcement.overrides`: such jobs are then admitted with a warning, judged on "
        "`spec.trainer` only, and their GPU demand is the lower bound `numNodes × resourcesPerNode`.",
        example=Example(
            obj={
                "apiVersion": "trainer.kubeflow.org/v1alpha1",
                "kind": "TrainJob",
                "metadata": {
                    "name": "ds",
                    "namespace": "cv-team",
                    "labels": {"mpigate.io/cost-center": "cc-2200"},
                },
                "spec": {
                    "runtimeRef": {"name": "deepspeed-distributed"},
                    "trainer": {
                        "numNodes": 2,
                        "image": "quay.io/acme/ds:1.0",
                        "resourcesPerNode": {"limits": {"nvidia.com/gpu": 8}},
                    },
                },
            }
        ),
    ),
    "MPG-SEC-SECRETS": Page(
        what="No literal env value may look like a credential: by its name (PASSWORD, TOKEN, "
        "SECRET, API_KEY, "
        "ACCESS_KEY ... as whole words) or by its shape (AWS key ids, GitHub/Slack/Hugging Face "
        "tokens, private "
        "keys, JWTs, credentials in URIs, long random strings). Checked on every container of every "
        "effective "
        "pod. Values are never echoed back — only the variable's name, why it looks like a "
        "credential and its length.",
        why="Literal values are stored in etcd, in the audit log and in every `kubectl get -o yaml`.",
        fix="Put the value in a Secret and use `valueFrom.secretKeyRef`; rotate the credential.",
        example=Example(file="examples/trainjobs/deny-plaintext-secret.yaml"),
        notes="Only when `spec.security.forbidPlaintextSecrets` is true (the default).",
    ),
    "MPG-SEC-SECRETREF": Page(
        what="Every secret the effective pods read — a `secret` volume, a secret inside a `projected` "
        "volume, an env `valueFrom.secretKeyRef`, an `envFrom.secretRef`, in any container — must be one "
        "the team's TeamAccess lists under `spec.secrets` (names or globs such as `nlp-data-*`). Not "
        "judged: what the approved runtime itself references, and the SSH-auth secret Trainer's MPI "
        "plugin creates for this TrainJob (`<trainjob>-mpi-ssh-auth`). Another job's SSH secret is "
        "refused unless `spec.secrets` names it exactly: a glob never covers it.",
        why="Anyone who may create a TrainJob could otherwise read every secret of the namespace "
        "through a runtime patch or the trainer's env (the pipeline's credentials, another job's SSH "
        "key), although personas may not read secrets.",
        fix="Use one of the team's secrets, or have the team admin list the secret under `spec.secrets` "
        "in `rbac/<team>.yaml`.",
        example=Example(file="examples/trainjobs/deny-foreign-secret.yaml"),
    ),
    "MPG-SA-001": Page(
        what="A `serviceAccountName` set by a runtime patch must be one of the team's service accounts (from "
        "`rbac/<team>.yaml`) or `default`.",
        why="A pod runs with its service account's permissions: borrowing another team's identity "
        "borrows its access.",
        fix="Use one of your team's service accounts, or have the team admin add it to `rbac/<team>.yaml`.",
        example=Example(file="examples/trainjobs/deny-foreign-service-account.yaml"),
    ),
    "MPG-IMG-001": Page(
        what="Every image reference of every effective pod and runtime must come from an allowed "
        "registry: the image of every container (trainer, runtime, initializers, init and ephemeral "
        "containers), every OCI image volume (`volumes[].image.reference`, also from `runtimePatches`) "
        "and the cache dataset initializer's `CACHE_IMAGE` (see [images](../images.md)). "
        "References are parsed like the container runtime does "
        "(`python:3.12` is `docker.io/library/python:3.12`; `registry.acme.internal.evil.com` is not "
        "`registry.acme.internal`). On CREATE, `spec.trainer.image` — the only image field a TrainJob can "
        "patch — is rewritten to a configured mirror.",
        why="Images are code; only registries that are scanned and under the org's control are trusted.",
        fix="Push the image to an allowed registry; for runtime images, use a runtime that does.",
        example=Example(file="examples/trainjobs/deny-foreign-registry.yaml"),
    ),
    "MPG-IMG-002": Page(
        what="No untagged or `:latest` images (when `forbidLatest`); a digest where the org or the data "
        "classification requires one (`requireDigest`). Judged on the same references as MPG-IMG-001: "
        "containers of every kind, image volumes and `CACHE_IMAGE`.",
        why="A moving tag makes runs irreproducible and lets the image change between launcher and nodes.",
        fix="Pin a version tag, or better a digest (`image@sha256:...`).",
        example=Example(file="examples/trainjobs/warn-latest-tag.yaml"),
        notes="In the example org this rule is in `warn` mode while tags are being migrated.",
    ),
    "MPG-NET-001": Page(
        what="Every pod carries `mpigate.io/team=<team>`, which the namespace NetworkPolicies "
        "select. mpigate's "
        "runtime patch sets it on CREATE; the runtime or another patch may not set it to another team.",
        why="Without the label the pods are isolated from each other and DNS; with another team's label they "
        "would be let in by that team's policies.",
        fix="Do not set `mpigate.io/team` yourself.",
        example=Example(file="examples/trainjobs/deny-team-label-spoof.yaml"),
    ),
    "MPG-NET-002": Page(
        what="With the `pinned-ports` network profile (the team's, or the data classification's), "
        "the OpenMPI "
        "port environment (`OMPI_MCA_btl_tcp_port_min_v4`, `..._port_range_v4`, "
        "`OMPI_MCA_oob_tcp_static_ipv4_ports` and its Open MPI 5 (PRRTE) twin "
        "`PRTE_MCA_oob_tcp_static_ipv4_ports`, IPv6 disabled) is injected into `spec.trainer.env` "
        "on CREATE, and nothing may override it.",
        why="The profile's NetworkPolicy opens only sshd and the pinned ports; OpenMPI on other "
        "ports would hang.",
        fix="Remove the overriding variable; mpigate sets it.",
        example=Example(file="examples/trainjobs/deny-pinned-port-override.yaml"),
        extra=("phi-pinned",),
    ),
    "MPG-LIFE-001": Page(
        what="`spec.activeDeadlineSeconds` must not exceed the org's `maxRuntime`; when absent, mpigate sets "
        "`defaultRuntime` on CREATE.",
        why="Forgotten jobs hold GPUs for days; a deadline bounds cost and blast radius.",
        fix="Set a deadline within the maximum and checkpoint to resume in a new job.",
        example=Example(file="examples/trainjobs/deny-lifecycle.yaml"),
        extra=("minimal",),
    ),
    "MPG-LIFE-002": Page(
        what="Labels the org (`lifecycle.requiredLabels`) or the team (`requiredLabels`) require "
        "must be present; "
        "a data classification label must name a classification the org defines and the team may process.",
        why="Cost centers drive chargeback; classifications drive residency, network posture and digests.",
        fix="Add the labels the message lists.",
        example=Example(file="examples/trainjobs/deny-lifecycle.yaml"),
    ),
    "MPG-LIFE-003": Page(
        what="An UPDATE judges the whole new object like a CREATE; only a finding identical to one of "
        "the stored object (same rule, path and value) is grandfathered, so a condition that predates the "
        "update (a quota lowered since) does not block Kueue's suspend, while anything the update brings in "
        "or makes worse is denied. MPG-LIFE-003 adds what only an UPDATE can do: mpigate's runtime patch "
        "entry (`manager: mpigate.io/admission`) must stay as CREATE wrote it (and an entry under that "
        "name that mpigate did not write is judged as a tenant's patch); the policy-carrying labels "
        "(`kueue.x-k8s.io/queue-name`, `kueue.x-k8s.io/priority-class`, `mpigate.io/data-classification`, "
        "`mpigate.io/cost-center`, `mpigate.io/team`, required labels, labels exceptions match on) keep "
        "their admitted values unless `OrgPolicy.spec.updates.labelChanges` names the requester; and "
        "nothing mpigate set on CREATE (queue and priority labels, the default runtime, the mirror, the "
        "pinned OpenMPI ports, the suspension) may be taken back — the suspension only by Kueue's "
        "controller (`GPUFlavors.spec.kueue.controller`, by default "
        "`system:serviceaccount:kueue-system:kueue-controller-manager`), which resumes a job it admits and "
        "suspends one it preempts. A job without a queue label is never grandfathered.",
        why="Trainer lets suspended jobs change their runtime patches and Kueue ignores jobs without a "
        "queue label: removing the label while suspended, then resuming, ran jobs outside every quota; "
        "downgrading `phi` to `public` loosened residency and the network; a new cost center redirected "
        "chargeback. Kueue itself never changes these labels on UPDATE (it writes only `spec.suspend` and "
        "its own `kueue.x-k8s.io/manager` patch entry).",
        fix="Leave the entry and the labels alone; delete and re-create the job to change them, or ask "
        "someone `updates.labelChanges` names (e.g. the team admin, to re-queue a suspended job).",
        example=Example(file="examples/trainjobs/minimal.yaml", old={"queue": "nlp-team"}),
    ),
    "MPG-LIFE-004": Page(
        what="DELETE (and CONNECT) of TrainJobs and runtimes are always allowed and recorded, with "
        "who did it, "
        "in mode `audit` whatever the enforcement settings say.",
        why="Audit trails must show who stopped or removed a job, not only who created it.",
        fix="Nothing to fix: this rule only records.",
        example=Example(
            file="examples/trainjobs/minimal.yaml",
            args=("--operation", "DELETE", "--user", "lena@acme.example"),
        ),
    ),
}


def baseline_tree(target: Path) -> Path:
    for folder in ("policies", "quotas", "rbac", "networkpolicies", "examples"):
        shutil.copytree(REPO / folder, target / folder)
    org = target / "policies" / "org.yaml"
    org.write_text(
        org.read_text(encoding="utf-8").replace("level: restricted", "level: baseline"), encoding="utf-8"
    )
    return target


def run_explain(example: Example, tmp: Path, baseline: Path) -> tuple[str, str, str | None]:
    """(command line shown, output, object YAML shown or None)."""
    shown_obj: str | None = None
    if example.obj is not None:
        path = tmp / "example.yaml"
        path.write_text(yaml.safe_dump(example.obj, sort_keys=False), encoding="utf-8")
        shown_obj = yaml.safe_dump(example.obj, sort_keys=False, width=100)
        display = "example.yaml"
    else:
        assert example.file is not None
        path = REPO / example.file
        display = example.file
    args = ["explain", str(path), "--now", NOW, *example.args]
    shown_args = [display, *example.args]
    if example.old is not None:
        stored = yaml.safe_load(path.read_text(encoding="utf-8"))
        changed = yaml.safe_load(path.read_text(encoding="utf-8"))
        changed["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "cv-team"
        stored["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = example.old["queue"]
        (tmp / "stored.yaml").write_text(yaml.safe_dump(stored, sort_keys=False), encoding="utf-8")
        (tmp / "changed.yaml").write_text(yaml.safe_dump(changed, sort_keys=False), encoding="utf-8")
        args = [
            "explain",
            str(tmp / "changed.yaml"),
            "--now",
            NOW,
            "--operation",
            "UPDATE",
            "--old",
            str(tmp / "stored.yaml"),
        ]
        shown_args = ["changed.yaml", "--operation", "UPDATE", "--old", "stored.yaml"]
    config = baseline if example.baseline else REPO
    result = CliRunner().invoke(cli, [*args[:1], "--config", str(config), *args[1:]])
    output = result.output
    output = re.sub(r"config revision \S+", "config revision <revision>", output)
    output = output.replace(str(tmp) + "/", "").replace(str(REPO) + "/", "")
    if not example.show_patch:
        output = output.split("  patch (JSONPatch):")[0].rstrip() + "\n"
    else:
        output = output.split("  mutated object:")[0].rstrip() + "\n"
    prefix = "mpigate explain" + (" --config <example org at baseline>" if example.baseline else "")
    return f"$ {prefix} {' '.join(shown_args)}", output, shown_obj


def render(info: RuleInfo, page: Page, tmp: Path, baseline: Path) -> str:
    command, output, shown = run_explain(page.example, tmp, baseline)
    lines = [f"# {info.id} — {info.title}", ""]
    if info.pss_check:
        family = f"security — Pod Security Standards, upstream check `{info.pss_check}` ({info.pss_level})"
    else:
        family = info.family
    lines += [
        "| | |",
        "|---|---|",
        f"| Family | {family} |",
        f"| Applies to | {', '.join(info.applies)} |",
        f"| Mutation (CREATE) | {info.mutates or '—'} |",
        f"| Controls | {', '.join(info.controls)} |",
        f"| Advisory | {'yes: never denies (`enforce` acts as `warn`)' if info.advisory else 'no'} |",
        "",
        "## What",
        "",
        page.what,
        "",
        "## Why",
        "",
        page.why,
        "",
        "## Example",
        "",
    ]
    if shown is not None:
        lines += ["```yaml", shown.rstrip(), "```", ""]
    lines += ["```console", command, output.rstrip(), "```", ""]
    for example in page.more:
        command, output, _ = run_explain(example, tmp, baseline)
        lines += ["```console", command, output.rstrip(), "```", ""]
    for name in page.extra:
        mutation = Example(file=f"examples/trainjobs/{name}.yaml", show_patch=True)
        command, output, _ = run_explain(mutation, tmp, baseline)
        lines += [
            "What mpigate sets on CREATE (the JSONPatch the mutating webhook returns):",
            "",
            "```console",
            command,
            output.rstrip(),
            "```",
            "",
        ]
    lines += ["## How to fix", "", page.fix, "", "## Modes and exceptions", "", MODES]
    if page.notes:
        lines += ["", page.notes]
    lines += ["", "See also: [all rules](README.md), [writing policy tests](../policy-tests.md).", ""]
    return "\n".join(lines)


def pss_page(info: RuleInfo) -> Page:
    check = info.pss_check or ""
    at = "the `baseline` level and therefore also at `restricted`"
    if info.pss_level == "restricted":
        at = "the `restricted` level"
    overridden = {
        "hostPathVolumes": "MPG-SEC-RESTRICTEDVOLUMES",
        "capabilities_baseline": "MPG-SEC-CAPABILITIES-RESTRICTED",
        "seccompProfile_baseline": "MPG-SEC-SECCOMPPROFILE-RESTRICTED",
        "procMount": "MPG-SEC-PROCMOUNT-RESTRICTED",
    }
    notes = ""
    if check in overridden:
        notes = (
            "At `restricted` this baseline check is replaced by "
            f"[{overridden[check]}]({overridden[check]}.md), "
            "exactly as upstream pod-security-admission does, so it fires only when the org runs `baseline`; "
            "the example above uses the example org switched to `baseline`."
        )
    return Page(
        what=ALIAS_WHAT
        + f"mpigate runs the upstream Pod Security check `{check}` on every effective pod (init, "
        f"regular and ephemeral containers), at {at} (`spec.security.podSecurity` in `policies/org.yaml`, "
        "versioned like pod-security-admission; `latest` is the newest). The violation points at "
        "the document "
        "and field that set the value: the runtime, a runtime patch (by manager) or `spec.trainer`. "
        "Runtimes are "
        "checked on their own when they are created or updated.",
        why=PSS_WHY.get(check, ""),
        fix=info.title + ". " + _pss_fix(check),
        example=PSS_EXAMPLES[check],
        notes=notes,
    )


def _pss_fix(check: str) -> str:
    from mpigate.policy.rules.security import PSS_FIXES

    extra = ""
    if check in (
        "runAsNonRoot",
        "seccompProfile_restricted",
        "allowPrivilegeEscalation",
        "capabilities_restricted",
    ):
        extra = (
            " With `injectDefaults` mpigate adds this setting through its runtime patch wherever "
            "the pod leaves it "
            "unset; it never overrides a value that is set explicitly."
        )
    return PSS_FIXES.get(check, "") + extra


def index(rules: list[RuleInfo]) -> str:
    lines = [
        "# Policy rules",
        "",
        "Every rule has a stable ID, a page here, a mode from `spec.enforcement` in `policies/org.yaml` "
        "(`enforce` denies, `warn` warns, `audit` records) and the compliance controls whose evidence its "
        "decisions provide. Pages are generated by `scripts/gen_policy_docs.py`; their examples are real "
        "`mpigate explain` output on the example org.",
        "",
        "| ID | Rule | Family | Mutation (CREATE) | Controls |",
        "|---|---|---|---|---|",
    ]
    for info in rules:
        family = f"security (PSS {info.pss_level})" if info.pss_check else info.family
        if info.advisory:
            family += ", advisory"
        lines.append(
            f"| [{info.id}]({info.id}.md) | {info.title} | {family} | {info.mutates or '—'} | "
            f"{', '.join(info.controls)} |"
        )
    lines += [
        "",
        "Rules of the [library](library.md) (`MPG-LIB-…`) are judged where the OrgPolicy enables them.",
        "",
        "How the engine evaluates: [architecture](../architecture.md). How to test policies: "
        "[policy tests](../policy-tests.md).",
        "",
    ]
    return "\n".join(lines)


SUITES = REPO / "tests" / "policy" / "library"


def library_tree(target: Path) -> Path:
    """The example org with every library rule enabled as tests/policy/library/rules.yaml does."""
    for folder in ("policies", "quotas", "rbac", "networkpolicies"):
        shutil.copytree(REPO / folder, target / folder, ignore=shutil.ignore_patterns("tests"))
    org_file = target / "policies" / "org.yaml"
    org = yaml.safe_load(org_file.read_text(encoding="utf-8"))
    org["spec"].setdefault("rules", {})["library"] = yaml.safe_load(
        (SUITES / "rules.yaml").read_text(encoding="utf-8")
    )
    org_file.write_text(yaml.safe_dump(org, sort_keys=False), encoding="utf-8")
    return target


def _origin(rule: LibraryRule) -> str:
    """The rule file's leading comment: the Gatekeeper and Kyverno policies it stands in for."""
    text = (REPO / "src" / "mpigate" / "catalogue" / "library" / f"{rule.name}.yaml").read_text(
        encoding="utf-8"
    )
    comment = [line[2:] for line in text.splitlines() if line.startswith("# ")]
    return " ".join(comment)


def _resolved(schema: dict[str, Any], prop: dict[str, Any]) -> dict[str, Any]:
    ref = prop.get("$ref", "")
    return {**schema["$defs"][ref.split("/")[-1]], **prop} if ref.startswith("#/$defs/") else prop


def _kind(prop: dict[str, Any]) -> str:
    if "enum" in prop:
        return "one of " + ", ".join(f"`{v}`" for v in prop["enum"])
    kind = str(prop.get("type", "any"))
    if kind == "array" and isinstance(prop.get("items"), dict):
        return f"list of {_kind(prop['items'])}"
    return kind


def _params_table(schema: dict[str, Any]) -> list[str]:
    defaults = defaults_from(schema, None)
    rows = ["| Parameter | Type | Default | Meaning |", "|---|---|---|---|"]
    for name, prop in schema.get("properties", {}).items():
        resolved = _resolved(schema, prop)
        meaning = " ".join(str(resolved.get("description", "")).split())
        if resolved.get("type") == "object" and "properties" in resolved:
            subs = []
            for key, sub in resolved["properties"].items():
                sub = _resolved(schema, sub)
                text = " ".join(str(sub.get("description", "")).split())
                subs.append(f"`{key}` ({_kind(sub)}){': ' + text if text else ''}")
            meaning = (meaning + " " if meaning else "") + "; ".join(subs)
        default = json.dumps(defaults.get(name)) if name in defaults else "—"
        escaped = meaning.replace("|", "\\|")
        rows.append(f"| `{name}` | {_kind(resolved)} | `{default}` | {escaped} |")
    return rows


def library_page(rule: LibraryRule, tree: Path, tmp: Path) -> str:
    spec = rule.document["spec"]
    schema = spec.get("paramsSchema", {})
    enabled = next(
        e
        for e in yaml.safe_load((SUITES / "rules.yaml").read_text(encoding="utf-8"))
        if e["name"] == rule.name
    )
    suite = yaml.safe_load((SUITES / f"{rule.name}.yaml").read_text(encoding="utf-8"))
    cases = suite["spec"]["cases"]
    firing = next(
        c for c in cases if rule.id in c["expect"].get("includes", []) + c["expect"].get("warnings", [])
    )
    path = tmp / f"{rule.name}.yaml"
    path.write_text(yaml.safe_dump(firing["object"], sort_keys=False), encoding="utf-8")
    result = CliRunner().invoke(cli, ["explain", "--config", str(tree), str(path), "--now", NOW])
    output = re.sub(r"config revision \S+", "config revision <revision>", result.output)
    output = output.replace(str(tmp) + "/", "").split("  patch (JSONPatch):")[0].rstrip()
    targets = ", ".join(spec.get("match", {}).get("targets", ["TrainJob", "MPIJob"]))
    source = f"src/mpigate/catalogue/library/{rule.name}.yaml"
    suite_file = f"tests/policy/library/{rule.name}.yaml"
    lines = [
        f"# {rule.id} — {rule.title}",
        "",
        "| | |",
        "|---|---|",
        "| Family | library (judged where the OrgPolicy enables it) |",
        f"| Name | `{rule.name}` |",
        f"| Applies to | {targets} |",
        f"| Controls | {', '.join(rule.controls)} |",
        f"| Source | [`{source}`](../../{source}) |",
        "",
        "## What",
        "",
        _origin(rule),
    ]
    if spec.get("description"):
        lines += ["", " ".join(str(spec["description"]).split())]
    lines += ["", "## Parameters", "", *_params_table(schema), "", "## Enable it", ""]
    lines += [
        "In `policies/org.yaml` (`params` omitted take the defaults above; `teamParams`, `action`, "
        "`failurePolicy`, `match` and `controls` as for every library rule, [library.md](library.md)):",
        "",
        "```yaml",
        "spec:",
        "  rules:",
        "    library:",
        *("      " + line for line in yaml.safe_dump([enabled], sort_keys=False, width=100).splitlines()),
        "```",
        "",
        "## Example",
        "",
        f"With the rule enabled as above, the case “{firing['name']}” of its test suite:",
        "",
        "```yaml",
        yaml.safe_dump(firing["object"], sort_keys=False, width=100).rstrip(),
        "```",
        "",
        "```console",
        f"$ mpigate explain {rule.name}.yaml",
        output,
        "```",
        "",
        f"Its PolicyTest suite ([`{suite_file}`](../../{suite_file})):",
        "",
    ]
    for case in cases:
        expect = case["expect"]
        verdict = (
            "fires"
            if rule.id in expect.get("includes", [])
            else "warns"
            if rule.id in expect.get("warnings", [])
            else "does not fire"
        )
        lines.append(f"- {case['name']}: {verdict}")
    lines += [
        "",
        "## Modes and exceptions",
        "",
        MODES,
        "",
        "See also: [all rules](README.md), [the library](library.md).",
        "",
    ]
    return "\n".join(lines)


def library_index(rules: list[LibraryRule]) -> str:
    lines = [
        "# The rule library",
        "",
        "Rules shipped with mpigate for what Gatekeeper's policy library and Kyverno's pod-security "
        "policies cover beyond the catalogue. A library rule is judged only where the OrgPolicy "
        "enables it, with its parameters; it is then a rule like the catalogue's: its ID is in "
        "decisions, audit records and reports, `spec.enforcement.overrides` and PolicyExceptions "
        "name it, and `mpigate report` maps its controls. Each is a CustomRule in CEL "
        "([custom-rules.md](custom-rules.md)) with a PolicyTest suite in `tests/policy/library/`.",
        "",
        "```yaml",
        "apiVersion: mpigate.io/v1alpha1",
        "kind: OrgPolicy",
        "spec:",
        "  rules:",
        "    library:",
        "      - name: allowed-capabilities          # the rule",
        "        params: {allowed: [NET_BIND_SERVICE], requiredDrop: [ALL]}",
        "        teamParams:                         # instead of params for a team's jobs",
        "          research-team: {allowed: [NET_BIND_SERVICE, SYS_PTRACE]}",
        "        action: enforce                     # enforce (default) | warn | audit; overrides win",
        "        failurePolicy: Fail                 # an evaluation error: Fail (default) denies,",
        "                                            # Ignore warns",
        "        match: {classifications: [phi]}     # narrows: operations, teams, namespaces, labels,",
        "                                            # classifications, replicatedJobs",
        "        controls: [CC7.2]                   # besides the rule's own",
        "```",
        "",
        "`mpigate check` refuses an unknown rule, a rule enabled twice, parameters its schema rejects "
        "(at the parameter), unknown teams, classifications and controls. Image patterns (`allowed`, "
        "`denied`, `exemptImages`) are a prefix when they end in `/`, a glob over the whole "
        "reference with `*` or `?`, else the exact image or its repository.",
        "",
        "| ID | Name | Rule | Controls |",
        "|---|---|---|---|",
    ]
    for rule in rules:
        lines.append(
            f"| [{rule.id}]({rule.id}.md) | `{rule.name}` | {rule.title} | {', '.join(rule.controls)} |"
        )
    lines.append("")
    return "\n".join(lines)


@contextlib.contextmanager
def trees_loaded_once() -> Iterator[None]:
    """``mpigate explain`` loads its config tree on every call; the pages use three trees (the
    example org, at baseline, with the library enabled) that do not change while they are generated,
    so each is loaded and checked once and its Config (with what it compiled) serves every page."""
    loaded: dict[Path, Config] = {}
    original = engine_commands.load

    def load_once(path: Path) -> Config:
        key = Path(path).resolve()
        if key not in loaded:
            loaded[key] = original(path)
        return loaded[key]

    engine_commands.load = load_once  # type: ignore[assignment]
    try:
        yield
    finally:
        engine_commands.load = original  # type: ignore[assignment]


def generate() -> dict[Path, str]:
    rules = list(all_rules().values())
    library = list(library_rules().values())
    out: dict[Path, str] = {OUT / "README.md": index(rules), OUT / "library.md": library_index(library)}
    with tempfile.TemporaryDirectory() as raw, trees_loaded_once():
        tmp = Path(raw)
        baseline = baseline_tree(tmp / "baseline")
        for info in rules:
            page = pss_page(info) if info.pss_check else PAGES[info.id]
            out[OUT / f"{info.id}.md"] = render(info, page, tmp, baseline)
        tree = library_tree(tmp / "library")
        for rule in library:
            out[OUT / f"{rule.id}.md"] = library_page(rule, tree, tmp)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a committed page differs")
    args = parser.parse_args()
    pages = generate()
    stale = [p for p, text in pages.items() if not p.exists() or p.read_text(encoding="utf-8") != text]
    if args.check:
        for path in stale:
            print(f"stale: {path.relative_to(REPO)} (run scripts/gen_policy_docs.py)")
        return 1 if stale else 0
    OUT.mkdir(parents=True, exist_ok=True)
    for path in stale:
        path.write_text(pages[path], encoding="utf-8")
        print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
