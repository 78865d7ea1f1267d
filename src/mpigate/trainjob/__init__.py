"""The TrainJob domain: effective pod specs of each replicated job and demand arithmetic.

>>> from mpigate.trainjob import resolve
>>> resolution = resolve(trainjob, runtime_manifest)   # doctest: +SKIP
>>> [(job.name, job.pods) for job in resolution.jobs]  # doctest: +SKIP
[('node', 1), ('launcher', 1)]
"""

from .demand import (
    ContainerResources,
    PodResources,
    container_resources,
    format_quantity,
    kueue_pod_requests,
    pod_resources,
)
from .jsontypes import is_mapping
from .paths import MERGE_KEYS, Key, PathPart, format_path, get_path, keyed_path, parse_path
from .resolve import (
    ANCESTOR_LABEL,
    MPIGATE_MANAGER,
    EffectiveJob,
    Layer,
    MLPolicy,
    PreparedRuntime,
    Problem,
    Resolution,
    prepare_runtime,
    resolve,
    resolve_runtime,
)
from .smp import copy_json, merge_shared, strategic_merge

__all__ = [
    "ANCESTOR_LABEL",
    "MERGE_KEYS",
    "MPIGATE_MANAGER",
    "ContainerResources",
    "EffectiveJob",
    "Key",
    "Layer",
    "MLPolicy",
    "PathPart",
    "PodResources",
    "PreparedRuntime",
    "Problem",
    "Resolution",
    "container_resources",
    "copy_json",
    "format_path",
    "format_quantity",
    "get_path",
    "is_mapping",
    "keyed_path",
    "kueue_pod_requests",
    "merge_shared",
    "parse_path",
    "pod_resources",
    "prepare_runtime",
    "resolve",
    "resolve_runtime",
    "strategic_merge",
]
