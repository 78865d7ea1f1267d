"""MPIJobs (``kubeflow.org/v2beta1``) under the rules TrainJobs are judged by.

The engine resolves an MPIJob into effective pods (:func:`mpigate.trainjob.mpijob.resolve_mpijob`)
and runs the same rule families on them, naming the MPIJob's own fields through
:data:`~mpigate.policy.shapes.MPIJOB`. What differs from a TrainJob is what mpigate may change, since
an MPIJob has no runtime and no ``runtimePatches``: the tenant's pod templates are the pods.

What :func:`mutate_mpijob` does on CREATE (docs/mpijobs.md):

* the labels a TrainJob gets: ``kueue.x-k8s.io/queue-name`` and ``kueue.x-k8s.io/priority-class``
  when absent (Kueue's MPIJob integration reads the queue label from the MPIJob);
* ``spec.runPolicy.suspend: true`` in a team namespace, as a TrainJob's ``spec.suspend``: Kueue's
  MPIJob defaulter (``(*MpiJobWebhook).Default``, ``ApplyDefaultForSuspend``) runs before mpigate's
  and suspends only a job that already carries the queue label; Kueue un-suspends it on admission;
* ``spec.runPolicy.activeDeadlineSeconds``: the org's default run time when absent (the MPI Operator
  hands it to the launcher Job, ``newLauncherJob``);
* in the Launcher's and the Worker's pod template: the pod label ``mpigate.io/team`` and the region's
  ``nodeSelector`` — each only where the key is absent, so that a value pointing elsewhere is left
  for MPG-NET-001 / MPG-RES-001 to deny rather than silently overwritten — and, with
  ``injectDefaults`` at ``restricted``, the security defaults a TrainJob's mpigate patch carries;
* every container image of a registry outside the allow-list that has a mirror, rewritten to the
  mirror (in a TrainJob only ``spec.trainer.image`` is the tenant's to rewrite; here all are);
* the ``pinned-ports`` profile's OpenMPI port environment, names that are missing only, in the first
  container of the Launcher (where ``mpirun`` runs and reads ``OMPI_MCA_*``) and of the Worker.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from mpigate.trainjob import PathPart, Resolution, copy_json
from mpigate.trainjob.jsontypes import is_mapping
from mpigate.trainjob.mpijob import LAUNCHER_ROLE, LAUNCHER_TYPE, WORKER_ROLE, WORKER_TYPE

from .context import TEAM_LABEL, JobContext, as_list, as_mapping, as_str
from .mutation import default_labels, mirrored_image, security_defaults

__all__ = ["MPIJOB_PROBLEM_RULES", "mutate_mpijob"]

#: Which rule refuses an MPIJob the MPI Operator would not run (by field; the rest: MPG-RT-002).
MPIJOB_PROBLEM_RULES: Final[tuple[tuple[tuple[PathPart, ...], str], ...]] = (
    (("spec", "mpiReplicaSpecs", WORKER_TYPE, "replicas"), "MPG-Q002"),
    (("spec", "runPolicy"), "MPG-LIFE-001"),
)

_REPLICAS: Final = ((LAUNCHER_TYPE, LAUNCHER_ROLE), (WORKER_TYPE, WORKER_ROLE))


def mutate_mpijob(ctx: JobContext, obj: Mapping[str, Any], base: Resolution | None) -> dict[str, Any]:
    """A mutated copy of the MPIJob ``obj`` (``base``: its resolution before mutation). Mutating the
    result again changes nothing (the webhook's reinvocation)."""
    out: dict[str, Any] = dict(obj)
    metadata = out.get("metadata")
    metadata = out["metadata"] = dict(metadata) if is_mapping(metadata) else {}
    spec = out.get("spec")
    if not is_mapping(spec):
        return out
    spec = out["spec"] = dict(spec)
    config = ctx.config
    team = ctx.team
    if team is not None:
        default_labels(ctx, metadata)
    default_runtime = config.org.lifecycle.default_runtime_seconds
    run_policy = spec.get("runPolicy")
    if run_policy is None or is_mapping(run_policy):
        policy = dict(run_policy or {})
        if default_runtime and "activeDeadlineSeconds" not in policy:
            policy["activeDeadlineSeconds"] = default_runtime
        if team is not None and policy.get("suspend") is not True:
            policy["suspend"] = True
        if policy != (run_policy or {}):
            spec["runPolicy"] = policy
    replicas = spec.get("mpiReplicaSpecs")
    if not is_mapping(replicas):
        return out
    replicas = spec["mpiReplicaSpecs"] = dict(replicas)
    profile = ctx.profile
    pinned = (
        profile.pinned_env(ctx.implementation)
        if team is not None and profile is not None and profile.mode == "pinned-ports"
        else ()
    )
    security = config.org.security
    inject = security.inject_defaults and security.level == "restricted"
    region = ctx.region
    for replica_type, role in _REPLICAS:
        replica = replicas.get(replica_type)
        if not is_mapping(replica) or not is_mapping(replica.get("template", {})):
            continue
        template: dict[str, Any] = copy_json(replica.get("template") or {})
        if _mutate_template(
            ctx, template, base.job(role) if base is not None else None, pinned, inject, region
        ):
            replicas[replica_type] = {**replica, "template": template}
    return out


def _mutate_template(
    ctx: JobContext,
    template: dict[str, Any],
    effective: Any,
    pinned: tuple[tuple[str, str], ...],
    inject: bool,
    region: Any,
) -> bool:
    """Apply mpigate's changes to one pod template (a private copy); whether anything changed."""
    changed = False
    meta = template.get("metadata")
    if meta is None:
        meta = template["metadata"] = {}
    spec = template.get("spec")
    if not isinstance(meta, dict) or not isinstance(spec, dict):
        return False
    if ctx.team is not None:
        labels = meta.get("labels")
        if labels is None:
            labels = meta["labels"] = {}
        if isinstance(labels, dict) and TEAM_LABEL not in labels:
            labels[TEAM_LABEL] = ctx.team.name
            changed = True
        if region is not None and region.node_labels:
            selector = spec.get("nodeSelector")
            if selector is None:
                selector = spec["nodeSelector"] = {}
            if isinstance(selector, dict):
                for key, value in sorted(region.node_labels.items()):
                    if key not in selector:
                        selector[key] = value
                        changed = True
    if inject and effective is not None:
        changed |= _merge_defaults(spec, security_defaults(effective.spec))
    for list_field in ("initContainers", "containers", "ephemeralContainers"):
        for container in as_list(spec.get(list_field)):
            if not isinstance(container, dict):
                continue
            image = container.get("image")
            mirror = mirrored_image(ctx.config, image) if isinstance(image, str) else None
            if mirror is not None and mirror != image:
                container["image"] = mirror
                changed = True
    containers = as_list(spec.get("containers"))
    if pinned and containers and isinstance(containers[0], dict):
        first = containers[0]
        env = first.get("env")
        if env is None or isinstance(env, list):
            present = {as_str(as_mapping(v).get("name")) for v in env or []}
            added = [{"name": n, "value": v} for n, v in pinned if n not in present]
            if added:
                first["env"] = [*(env or []), *added]
                changed = True
    return changed


def _merge_defaults(spec: dict[str, Any], defaults: Mapping[str, Any]) -> bool:
    """Put the security defaults (pod ``securityContext`` fields, and per container name the
    container ``securityContext`` fields) into the template; they only name fields that are absent."""
    changed = False
    pod_sc = defaults.get("securityContext")
    if is_mapping(pod_sc):
        current = spec.get("securityContext")
        if current is None:
            current = spec["securityContext"] = {}
        if isinstance(current, dict):
            for key, value in pod_sc.items():
                current.setdefault(key, value)
            changed = True
    for list_field in ("initContainers", "containers"):
        wanted = {c["name"]: c["securityContext"] for c in as_list(defaults.get(list_field))}
        for container in as_list(spec.get(list_field)):
            name = container.get("name") if isinstance(container, dict) else None
            # a name of the wrong type (a list, a map) is never a defaulted container: MPG-RT-002
            # reports it, and it must not reach the dictionary lookup (unhashable)
            if not isinstance(container, dict) or not isinstance(name, str) or name not in wanted:
                continue
            current = container.get("securityContext")
            if current is None:
                current = container["securityContext"] = {}
            if not isinstance(current, dict):
                continue
            for key, value in wanted[name].items():
                if key == "capabilities" and isinstance(current.get("capabilities"), dict):
                    current["capabilities"] = {**current["capabilities"], **value}
                else:
                    current[key] = value
            changed = True
    return changed
