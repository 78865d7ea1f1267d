"""MPG-RES-001..003: pods stay in the team's (or the data classification's) region, nothing points
them elsewhere, and storage URIs are within the region's data locations."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from mpigate.config import Config
from mpigate.config.model import Region
from mpigate.policy.context import JobContext, as_list, as_mapping, as_str
from mpigate.policy.findings import Finding
from mpigate.policy.prepared import memoized
from mpigate.trainjob import EffectiveJob, Layer
from mpigate.trainjob.builder import INITIALIZER_LOCATION_ENV, STORAGE_URI
from mpigate.trainjob.model import DATASET_INITIALIZER, MODEL_INITIALIZER

__all__ = ["STORAGE_SCHEMES", "check_residency", "redact_uri"]

# URI schemes that name stored data (object stores, HDFS, model hubs, volumes). http(s) URLs are
# endpoints rather than data locations and are not judged here.
STORAGE_SCHEMES = frozenset(
    {
        "s3",
        "s3a",
        "s3n",
        "gs",
        "gcs",
        "az",
        "azure",
        "abfs",
        "abfss",
        "wasb",
        "wasbs",
        "adl",
        "hdfs",
        "hf",
        "pvc",
        "oss",
        "cos",
        "obs",
        "minio",
        "r2",
        "swift",
        "nfs",
        "webhdfs",
        "ms",
    }
)
_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/@]*@")


def redact_uri(uri: str) -> str:
    """The URI without credentials (``s3://key:secret@bucket`` → ``s3://***@bucket``)."""
    return _USERINFO.sub(r"\1***@", uri)


def _schemes(ctx: JobContext) -> frozenset[str]:
    config = ctx.config

    def build() -> frozenset[str]:
        extra = {
            m.group(1).lower()
            for r in config.org.regions.values()
            for loc in r.data_locations
            if (m := _URI.match(loc))
        }
        return STORAGE_SCHEMES | extra

    return memoized(config, ("policy.residency.schemes",), build)


def check_residency(ctx: JobContext) -> Iterator[Finding]:
    team = ctx.team
    if team is None:
        return
    classification = ctx.classification
    if (
        classification is not None
        and classification.regions is not None
        and team.region not in classification.regions
    ):
        yield Finding(
            "MPG-RES-001",
            'metadata.labels["mpigate.io/data-classification"]',
            f"data classified {classification.name} must stay in {', '.join(classification.regions)}, but "
            f"{team.name} runs in {team.region}.",
            f"Run this job from a team in {' or '.join(classification.regions)}, or correct the "
            "classification.",
            f"{classification.name} data must stay in {', '.join(classification.regions)}; "
            f"{team.name} is in {team.region}",
        )
        return
    region = ctx.region
    if region is None:
        return
    if ctx.resolution is not None:
        # MPG-RES-001: every replicated job is pinned to the region (mpigate's patch does this on CREATE).
        for job in ctx.resolution.jobs:
            selector = as_mapping(job.spec.get("nodeSelector"))
            for key, value in region.node_labels.items():
                if selector.get(key) == value:
                    continue
                if _affinity_pins(job.spec, key, value):
                    continue
                yield Finding(
                    "MPG-RES-001",
                    job.origin(("spec", "nodeSelector", key)),
                    f"pods of replicated job {job.name} are not pinned to region {region.name} "
                    f"({key}={value}); they could be scheduled anywhere.",
                    "Let mpigate add its runtime patch (create the TrainJob again), and do not override "
                    f"nodeSelector {key}.",
                    f"replicated job {job.name} is not pinned to region {region.name}",
                )
        # MPG-RES-002: nothing in the runtime or another manager's patch targets another region.
        foreign, own_keys = _foreign_labels(ctx)
        for job in ctx.resolution.jobs:
            for layer in job.layers:
                if layer.kind not in ("runtime", "patch") or layer.manager in ctx.trusted_managers:
                    continue
                yield from _foreign_in_layer(ctx, job, layer, foreign, own_keys)
    yield from _uris(ctx)


def _affinity_pins(spec: Mapping[str, Any], key: str, value: str) -> bool:
    required = as_mapping(
        as_mapping(as_mapping(spec.get("affinity")).get("nodeAffinity")).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
    )
    terms = as_list(required.get("nodeSelectorTerms"))
    if not terms:
        return False
    for term in terms:
        exprs = as_list(as_mapping(term).get("matchExpressions"))
        if not any(
            as_mapping(e).get("key") == key
            and as_mapping(e).get("operator") == "In"
            and as_list(as_mapping(e).get("values")) == [value]
            for e in exprs
        ):
            return False
    return True


def _foreign_labels(ctx: JobContext) -> tuple[dict[tuple[str, str], str], dict[str, str]]:
    """Label pairs that identify nodes of other regions (region labels and other-region flavors),
    and the region label keys with this region's value (once per config and region)."""
    region = ctx.region
    assert region is not None
    config = ctx.config
    return memoized(
        config,
        ("policy.residency.foreign_labels", region.name),
        lambda: _build_foreign_labels(config, region),
    )


def _build_foreign_labels(
    config: Config, region: Region
) -> tuple[dict[tuple[str, str], str], dict[str, str]]:
    own_pairs = set(region.node_labels.items())
    for flavor in config.flavors.values():
        if flavor.region == region.name:
            own_pairs |= set(flavor.node_labels.items())
    foreign: dict[tuple[str, str], str] = {}
    own_keys: dict[str, str] = {}
    for other in config.org.regions.values():
        for key, value in other.node_labels.items():
            if other.name == region.name:
                own_keys[key] = value
            elif (key, value) not in own_pairs:
                foreign[(key, value)] = f"region {other.name}"
    for flavor in config.flavors.values():
        if flavor.region != region.name:
            for pair in flavor.node_labels.items():
                if pair not in own_pairs:
                    foreign.setdefault(pair, f"flavor {flavor.name} in region {flavor.region}")
    return foreign, own_keys


def _foreign_in_layer(
    ctx: JobContext,
    job: EffectiveJob,
    layer: Layer,
    foreign: dict[tuple[str, str], str],
    own_keys: dict[str, str],
) -> Iterator[Finding]:
    region = ctx.region
    assert region is not None
    spec = as_mapping(layer.template.get("spec"))

    def finding(path: tuple[Any, ...], what: str, target: str) -> Finding:
        return Finding(
            "MPG-RES-002",
            layer.display(path),
            f"{what} targets {target}, but {ctx.team_name}'s pods must stay in region {region.name} "
            f"(replicated job {job.name}).",
            "Remove it; mpigate pins the pods to the team's region itself.",
            f"{what} targets {target}; pods must stay in {region.name}",
        )

    for key, value in as_mapping(spec.get("nodeSelector")).items():
        value_s = str(value)
        if (key, value_s) in foreign:
            yield finding(
                ("spec", "nodeSelector", key), f"nodeSelector {key}={value_s}", foreign[(key, value_s)]
            )
        elif key in own_keys and value_s != own_keys[key]:
            yield finding(("spec", "nodeSelector", key), f"nodeSelector {key}={value_s}", "another region")
    node_affinity = as_mapping(as_mapping(spec.get("affinity")).get("nodeAffinity"))
    required = as_mapping(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution"))
    terms: list[tuple[Any, ...]] = [
        ("requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms", i, t)
        for i, t in enumerate(as_list(required.get("nodeSelectorTerms")))
    ]
    terms += [
        ("preferredDuringSchedulingIgnoredDuringExecution", i, "preference", as_mapping(p).get("preference"))
        for i, p in enumerate(as_list(node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution")))
    ]
    for *prefix, term in terms:
        for e_index, raw_expr in enumerate(as_list(as_mapping(term).get("matchExpressions"))):
            expr = as_mapping(raw_expr)
            expr_key = as_str(expr.get("key"))
            values = [str(v) for v in as_list(expr.get("values"))]
            operator = expr.get("operator")
            if expr_key is None:
                continue
            key = expr_key
            path = ("spec", "affinity", "nodeAffinity", *prefix, "matchExpressions", e_index)
            if operator == "In":
                for value in values:
                    if (key, value) in foreign:
                        yield finding(path, f"node affinity {key} In {value}", foreign[(key, value)])
                    elif key in own_keys and value != own_keys[key]:
                        yield finding(path, f"node affinity {key} In {value}", "another region")
            elif operator == "NotIn" and key in own_keys and own_keys[key] in values:
                yield finding(path, f"node affinity {key} NotIn {own_keys[key]}", "another region")
    own_tolerations, foreign_tolerations = memoized(
        ctx.config,
        ("policy.residency.tolerations", region.name),
        lambda: _tolerations(ctx.config, region),
    )
    for t_index, toleration in enumerate(as_list(spec.get("tolerations"))):
        toleration = as_mapping(toleration)
        key = str(toleration.get("key", ""))
        value = str(toleration.get("value", ""))
        path = ("spec", "tolerations", t_index)
        if (key, value) in foreign_tolerations and dict(toleration) not in own_tolerations:
            yield finding(path, f"toleration {key}={value}", foreign_tolerations[(key, value)])
        elif key in own_keys and value and value != own_keys[key]:
            yield finding(path, f"toleration {key}={value}", "another region")


def _tolerations(config: Config, region: Region) -> tuple[list[dict[str, Any]], dict[tuple[str, str], str]]:
    """The region's flavors' tolerations, and those of other regions' flavors (by key and value)."""
    own_tolerations = [
        dict(t) for f in config.flavors.values() if f.region == region.name for t in f.tolerations
    ]
    foreign_tolerations = {
        (str(dict(t).get("key")), str(dict(t).get("value", ""))): f"flavor {f.name} in region {f.region}"
        for f in config.flavors.values()
        if f.region != region.name
        for t in f.tolerations
        if dict(t) not in own_tolerations
    }
    return own_tolerations, foreign_tolerations


def _uris(ctx: JobContext) -> Iterator[Finding]:
    region = ctx.region
    assert region is not None
    schemes = _schemes(ctx)
    # A finding per (field, value): several pods share a field, but one field can carry different
    # values (the effective env entry is not always the first of its name).
    seen: set[tuple[str, str]] = set()
    locations = region.data_locations
    classification = f" (data classified {ctx.classification.name})" if ctx.classification else ""

    def judge(path: str, uri: str, what: str, *, any_scheme: bool = False) -> Iterator[Finding]:
        if not any_scheme:
            match = _URI.match(uri)
            if match is None or match.group(1).lower() not in schemes:
                return
        if (path, uri) in seen:
            return
        seen.add((path, uri))
        if _inside(uri, locations):
            return
        shown = redact_uri(uri)
        yield Finding(
            "MPG-RES-003",
            path,
            f"{what} {shown} is outside region {region.name}'s data locations "
            f"({', '.join(locations) or 'none'}){classification}.",
            f"Use a copy of the data in {region.name} (a location starting with "
            f"{' or '.join(locations) or 'an approved prefix'}).",
            f"{shown} is outside {region.name}'s data locations",
        )

    if ctx.resolution is None:
        # Runtime unknown: what the TrainJob itself says is all there is to judge.
        initializer = as_mapping(ctx.spec.get("initializer"))
        for key in ("dataset", "model"):
            source = as_mapping(initializer.get(key))
            uri = as_str(source.get("storageUri"))
            if uri:
                yield from judge(f"spec.initializer.{key}.storageUri", uri, "storage URI", any_scheme=True)
            for var in as_list(source.get("env")):
                var = as_mapping(var)
                name, value = as_str(var.get("name")), as_str(var.get("value"))
                if name in INITIALIZER_LOCATION_ENV and value:
                    yield from judge(f"spec.initializer.{key}.env[name={name}]", value, name, any_scheme=True)
        for var in as_list(ctx.trainer.get("env")):
            var = as_mapping(var)
            value = as_str(var.get("value"))
            name = as_str(var.get("name"))
            if value is not None and name is not None:
                yield from judge(f"spec.trainer.env[name={name}]", value, f"env {name}")
        return
    for job in ctx.resolution.jobs:
        if job.ancestor in _INITIALIZERS:
            yield from _initializer_locations(job, judge, locations)
    for job in ctx.resolution.jobs:
        for list_field, index, e_index, var in job.env():
            value = as_str(var.get("value"))
            if value is None or "://" not in value:
                continue
            # Only a storage URI can be a finding: the field's origin (costly) only for one.
            match = _URI.match(value)
            if match is None or match.group(1).lower() not in schemes:
                continue
            if _inside(value, locations):  # judge() finds nothing: no origin to look up
                continue
            path = job.origin(("spec", list_field, index, "env", e_index))
            name = var.get("name")
            what = "storage URI" if path.endswith("storageUri") else f"env {name}"
            yield from judge(path, value, what)


_INITIALIZERS = frozenset({DATASET_INITIALIZER, MODEL_INITIALIZER})


def _inside(uri: str, locations: Sequence[str]) -> bool:
    """Whether ``uri`` is in one of the region's data locations (then it is no finding, and the
    origin of its field, the costly part, is not looked up)."""
    return any(uri.startswith(prefix) for prefix in locations)


def _initializer_locations(
    job: EffectiveJob, judge: Callable[..., Iterator[Finding]], locations: Sequence[str]
) -> Iterator[Finding]:
    """The data locations Trainer's initializer reads in ``job``'s initializer container: the
    effective value of each of :data:`INITIALIZER_LOCATION_ENV` (the last entry of a name wins, as
    the kubelet builds the environment), whatever its scheme. A value the gate cannot read
    (valueFrom, or STORAGE_URI left to an envFrom source) is refused; a value inside ``locations``
    passes."""
    key = _KEYS.get(str(job.ancestor), "dataset")
    for list_field, index, container in job.containers():
        if list_field != "containers" or container.get("name") != job.ancestor:
            continue
        effective: dict[str, tuple[int, Mapping[str, Any]]] = {}
        for e_index, var in enumerate(as_list(container.get("env"))):
            name = as_mapping(var).get("name")
            if name in INITIALIZER_LOCATION_ENV:
                effective[name] = (e_index, as_mapping(var))
        for name in INITIALIZER_LOCATION_ENV:
            if name not in effective:
                if name == STORAGE_URI and (sources := _env_from(container)):
                    yield Finding(
                        "MPG-RES-003",
                        job.origin(("spec", list_field, index, "envFrom")),
                        f"the {job.ancestor} would read STORAGE_URI from {sources}, which mpigate "
                        "cannot read: the data location would be checked by nobody.",
                        f"Set spec.initializer.{key}.storageUri; keep only credentials in the Secret.",
                        f"{job.ancestor}: STORAGE_URI would come from {sources}",
                    )
                continue
            e_index, var = effective[name]
            value_from = var.get("valueFrom")
            if value_from is None and (value := as_str(var.get("value"))) and _inside(value, locations):
                continue  # what judge() would pass: no origin to look up
            path = job.origin(("spec", list_field, index, "env", e_index))
            if value_from is not None:
                source = _source(value_from)
                yield Finding(
                    "MPG-RES-003",
                    path,
                    f"{name} of the {job.ancestor} comes from {source}, which mpigate cannot read: the "
                    "initializer would read data from a location nobody checked.",
                    f"Write the location as a literal value (spec.initializer.{key}"
                    ".storageUri or env value); keep only credentials in Secrets.",
                    f"{job.ancestor}: {name} comes from {source}",
                )
                continue
            value = as_str(var.get("value"))
            if value:  # the initializer reads an empty value as unset
                what = "storage URI" if path.endswith("storageUri") else f"{name} of the {job.ancestor}"
                yield from judge(path, value, what, any_scheme=True)


_KEYS = {DATASET_INITIALIZER: "dataset", MODEL_INITIALIZER: "model"}


def _env_from(container: Mapping[str, Any]) -> str:
    """``Secret a, ConfigMap b``: the envFrom sources of a container (empty: none)."""
    names = []
    for source in as_list(container.get("envFrom")):
        source = as_mapping(source)
        for kind, label in (("secretRef", "Secret"), ("configMapRef", "ConfigMap")):
            ref = as_mapping(source.get(kind))
            if ref:
                names.append(f"{label} {ref.get('name', '')}")
    return ", ".join(names)


def _source(value_from: Any) -> str:
    """``Secret s (key k)``: what a valueFrom reads."""
    value_from = as_mapping(value_from)
    for kind, label in (("secretKeyRef", "Secret"), ("configMapKeyRef", "ConfigMap")):
        ref = as_mapping(value_from.get(kind))
        if ref:
            return f"{label} {ref.get('name', '')} (key {ref.get('key', '')})"
    if value_from.get("fieldRef") is not None or value_from.get("resourceFieldRef") is not None:
        return "a field of the pod"
    return "a source the pod cannot resolve"
