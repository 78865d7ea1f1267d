"""What mpigate changes on CREATE, computed as a mutated copy of the TrainJob.

* TrainJob labels: ``kueue.x-k8s.io/queue-name`` (the team's default LocalQueue) and
  ``kueue.x-k8s.io/priority-class`` (the team's default) when absent (MPG-Q005, MPG-Q006);
* ``spec.suspend: true`` for every job of a team namespace (MPG-Q005): Kueue un-suspends it when
  its ClusterQueue admits it. Kueue's own TrainJob defaulter suspends a job only when the queue
  label is already present when it runs (``jobframework.WorkloadShouldBeSuspended``, called from
  ``(*TrainJobWebhook).Default`` in Kueue's pkg/controller/jobs/trainjob/trainjob_webhook.go), and
  the API server calls it *before* mpigate (mutating webhook configurations run in name order:
  ``defaulter.trainer.kubeflow.org``, ``kueue-mutating-webhook-configuration``, ``mpigate``) and
  never again (its reinvocationPolicy is ``Never``). Without this, a job whose label mpigate adds
  would be stored running, outside the team's quota, until Kueue's reconciler stopped it;
* ``spec.activeDeadlineSeconds``: the org's default runtime when absent (MPG-LIFE-001);
* ``spec.trainer.image``: the configured mirror, for an image the allow-list admits upstream
  (MPG-IMG-001) — the only patchable image field;
* ``spec.trainer.env``: the pinned port environment of the ``pinned-ports`` profile for the job's
  MPI implementation (``JobContext.implementation``), names that are missing only (MPG-NET-002);
* mpigate's own ``runtimePatches`` entry (``manager: mpigate.io/admission``), appended — or
  rebuilt in place when present — with, for every replicated job of the runtime, the region's
  ``nodeSelector`` (MPG-RES-001), the pod label ``mpigate.io/team`` (MPG-NET-001) and, with
  ``injectDefaults`` at ``restricted``, the security defaults a patch may set and the effective pod
  lacks: pod ``runAsNonRoot``/``seccompProfile``, container and init container
  ``allowPrivilegeEscalation: false`` and ``capabilities.drop: [ALL]`` (MPG-SEC-*). Nothing set
  explicitly is weakened or overridden; privileged containers are left alone (the API server rejects
  ``allowPrivilegeEscalation: false`` with ``privileged: true``).

The entry is derived from the job *without* mpigate's entry, so evaluating the mutated object
again yields the same entry and an empty patch. Other managers' entries are never touched.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mpigate.config import Config
from mpigate.trainjob import Resolution
from mpigate.trainjob.jsontypes import is_mapping
from mpigate.trainjob.resolve import MPIGATE_MANAGER

from . import images
from .context import PRIORITY_LABEL, QUEUE_LABEL, TEAM_LABEL, JobContext, as_list, as_mapping, as_str
from .rules.lifecycle import own_patch_entry

__all__ = ["build_patch_entry", "default_labels", "mirrored_image", "mutate", "security_defaults"]


def mutate(ctx: JobContext, obj: Mapping[str, Any], base: Resolution | None) -> dict[str, Any]:
    """A mutated copy of ``obj``. ``ctx`` describes the job; ``base`` is its resolution without
    mpigate's own runtime patch (``None`` when the runtime is unknown).

    Copy-on-write: the mappings mpigate may change (the object, ``metadata``, its labels, ``spec``
    and ``spec.trainer``) are new, everything else is shared with ``obj`` — both are read-only from
    here on (the engine diffs them, skipping the shared subtrees).
    """
    out: dict[str, Any] = dict(obj)
    config = ctx.config
    team = ctx.team
    metadata = out.get("metadata")
    metadata = out["metadata"] = dict(metadata) if is_mapping(metadata) else {}
    spec = out.get("spec")
    if not is_mapping(spec):
        return out
    spec = out["spec"] = dict(spec)

    if team is not None:
        default_labels(ctx, metadata)
        if spec.get("suspend") is not True:
            spec["suspend"] = True

    default_runtime = config.org.lifecycle.default_runtime_seconds
    if "activeDeadlineSeconds" not in spec and default_runtime:
        spec["activeDeadlineSeconds"] = default_runtime

    trainer = spec.get("trainer")
    if is_mapping(trainer):
        trainer = spec["trainer"] = dict(trainer)
        image = trainer.get("image")
        mirrored = mirrored_image(config, image) if isinstance(image, str) else None
        if mirrored is not None:
            trainer["image"] = mirrored
    profile = ctx.profile
    if team is not None and profile is not None and profile.mode == "pinned-ports":
        if trainer is None:
            trainer = spec["trainer"] = {}
        if isinstance(trainer, dict) and (trainer.get("env") is None or isinstance(trainer.get("env"), list)):
            env = list(trainer.get("env") or [])
            present = {as_str(as_mapping(v).get("name")) for v in env}
            added = [
                {"name": n, "value": v} for n, v in profile.pinned_env(ctx.implementation) if n not in present
            ]
            if added:
                trainer["env"] = env + added

    if base is not None:
        entry = build_patch_entry(ctx, base)
        patches = spec.get("runtimePatches")
        if patches is None or isinstance(patches, list):
            items = list(patches or [])
            existing = own_patch_entry(out)
            if existing is not None:
                if entry is None:
                    del items[existing[0]]
                else:
                    items[existing[0]] = entry
            elif entry is not None:
                items.append(entry)
            if items or patches is not None:
                spec["runtimePatches"] = items
    return out


def default_labels(ctx: JobContext, metadata: dict[str, Any]) -> None:
    """The team's default queue and priority class labels, where absent (``metadata`` is a private
    copy; its labels are copied before they change)."""
    team = ctx.team
    if team is None:
        return
    labels = metadata.get("labels")
    if labels is None:
        labels = {}
    elif is_mapping(labels):
        labels = dict(labels)
    if isinstance(labels, dict):
        if QUEUE_LABEL not in labels:
            labels[QUEUE_LABEL] = team.default_queue
        if PRIORITY_LABEL not in labels and team.default_priority_class:
            labels[PRIORITY_LABEL] = team.default_priority_class
        if labels:
            metadata["labels"] = labels


def mirrored_image(config: Config, image: str) -> str | None:
    """``image`` rewritten to the configured mirror, when a mirror covers it and the allow-list
    admits it upstream (``None``: leave it; MPG-IMG-001 judges it). A mirror is transport, not
    approval: MPG-IMG-001 judges a mirrored image by what it mirrors, so an image no entry admits
    is not rewritten (it is denied naming its real registry)."""
    mirrors = config.org.images.mirrors
    if not mirrors:
        return None
    try:
        ref = images.parse_image(image)
    except images.ImageRefError:
        return None
    allowed = config.org.images.allowed_registries
    if allowed and images.registry_allowed(ref, allowed) is None:
        return None
    try:
        mirrored = images.mirror_image(ref, mirrors)
    except images.ImageRefError:  # e.g. the mirrored name would exceed 255 characters
        return None
    return str(mirrored) if mirrored is not None else None


def security_defaults(effective: Mapping[str, Any]) -> dict[str, Any]:
    """The restricted-level fields a patch may add to the effective pod spec ``effective`` and that it
    lacks, pod-spec shaped (``securityContext``, and per container name in ``initContainers`` and
    ``containers``); never weakening or overriding what is set."""
    pod_spec: dict[str, Any] = {}
    _security_defaults(effective, pod_spec)
    return pod_spec


def build_patch_entry(ctx: JobContext, base: Resolution) -> dict[str, Any] | None:
    """mpigate's ``runtimePatches`` entry for the job resolved without it (``None`` when empty)."""
    security = ctx.config.org.security
    inject = security.inject_defaults and security.level == "restricted"
    region = ctx.region
    jobs: list[dict[str, Any]] = []
    for job in base.jobs:
        pod_meta: dict[str, Any] = {}
        pod_spec: dict[str, Any] = {}
        if ctx.team is not None:
            pod_meta["labels"] = {TEAM_LABEL: ctx.team.name}
            if region is not None and region.node_labels:
                pod_spec["nodeSelector"] = dict(sorted(region.node_labels.items()))
        if inject:
            pod_spec.update(security_defaults(job.spec))
        if not pod_meta and not pod_spec:
            continue
        template: dict[str, Any] = {}
        if pod_meta:
            template["metadata"] = pod_meta
        if pod_spec:
            template["spec"] = pod_spec
        jobs.append({"name": job.name, "template": {"spec": {"template": template}}})
    if not jobs:
        return None
    return {
        "manager": MPIGATE_MANAGER,
        "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": jobs}}},
    }


def _security_defaults(effective: Mapping[str, Any], pod_spec: dict[str, Any]) -> None:
    pod_sc = effective.get("securityContext")
    pod_sc = pod_sc if is_mapping(pod_sc) else {}
    sc: dict[str, Any] = {}
    if "runAsNonRoot" not in pod_sc:
        sc["runAsNonRoot"] = True
    if "seccompProfile" not in pod_sc:
        sc["seccompProfile"] = {"type": "RuntimeDefault"}
    if sc and is_mapping(effective.get("securityContext", {})):
        pod_spec["securityContext"] = sc
    for list_field in ("initContainers", "containers"):
        patched: list[dict[str, Any]] = []
        for container in as_list(effective.get(list_field)):
            if not is_mapping(container) or not isinstance(container.get("name"), str):
                continue
            csc = container.get("securityContext")
            if csc is not None and not is_mapping(csc):
                continue
            csc = csc or {}
            if csc.get("privileged") is True:
                continue
            add: dict[str, Any] = {}
            if "allowPrivilegeEscalation" not in csc:
                add["allowPrivilegeEscalation"] = False
            caps = csc.get("capabilities")
            if caps is None or is_mapping(caps):
                drop = as_mapping(caps).get("drop")
                if drop is None or (isinstance(drop, list) and "ALL" not in drop):
                    # capabilities.drop is replaced by a strategic merge: keep what was dropped.
                    kept = [d for d in as_list(drop) if d != "ALL"]
                    add["capabilities"] = {"drop": ["ALL", *kept]}
            if add:
                patched.append({"name": container["name"], "securityContext": add})
        if patched:
            pod_spec[list_field] = patched
