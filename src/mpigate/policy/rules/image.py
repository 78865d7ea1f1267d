"""MPG-IMG-001 (allowed registries) and MPG-IMG-002 (tags and digests) on every image of every
effective pod: trainer, runtime, initializers, init and ephemeral containers."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from collections.abc import Set as AbstractSet

from mpigate.config import Config
from mpigate.config.model import ImagePolicy
from mpigate.policy import images
from mpigate.policy.findings import Finding
from mpigate.policy.prepared import config_image_refs, memoized
from mpigate.trainjob import EffectiveJob, is_mapping
from mpigate.trainjob.model import DATASET_INITIALIZER

__all__ = ["check_image_ref", "check_images", "config_clean_images"]


def image_fields(job: EffectiveJob) -> Iterator[tuple[tuple[str | int, ...], object]]:
    """Every image reference of a job's pod, as ``(pod path, value)``: the image of every init,
    regular and ephemeral container, every OCI image volume (``volumes[].image.reference``) and the
    image the cache dataset initializer starts (``CACHE_IMAGE``, pkg/initializers/dataset/cache.py).
    A value of ``None`` means a field that must be set but is missing (an ephemeral container's
    image); missing optional fields are not listed."""
    for list_field, index, container in job.containers():
        image = container.get("image")
        if image is not None or list_field == "ephemeralContainers":
            yield ("spec", list_field, index, "image"), image
    volumes = job.spec.get("volumes")
    if isinstance(volumes, list):
        for index, volume in enumerate(volumes):
            source = volume.get("image") if is_mapping(volume) else None
            if is_mapping(source) and source.get("reference") is not None:
                yield ("spec", "volumes", index, "image", "reference"), source["reference"]
    if job.ancestor == DATASET_INITIALIZER:
        for list_field, index, e_index, var in job.env():
            if var.get("name") == CACHE_IMAGE and list_field == "containers":
                value_from = var.get("valueFrom")
                yield (
                    ("spec", list_field, index, "env", e_index),
                    (var.get("value") if value_from is None else FROM_SOURCE),
                )


CACHE_IMAGE = "CACHE_IMAGE"


class _FromSource:
    """An image reference the pod takes from a Secret, ConfigMap or field (``valueFrom``)."""

    __slots__ = ()


FROM_SOURCE = _FromSource()


def check_images(
    policy: ImagePolicy,
    jobs: tuple[EffectiveJob, ...],
    *,
    require_digest: bool,
    digest_reason: str,
    known: Mapping[str, images.ImageRef | images.ImageRefError] | None = None,
    clean: AbstractSet[tuple[str, bool]] | None = None,
) -> Iterator[Finding]:
    """Both image rules on every image reference of every job (:func:`image_fields`), once per
    field (a field that several pods share is reported once). ``known`` holds images parsed in
    advance (the config's runtimes); ``clean``, ``(image, require_digest)`` pairs known to break
    neither rule under ``policy`` (:func:`config_clean_images`)."""
    seen: set[str] = set()
    parsed: dict[str, images.ImageRef | images.ImageRefError] = {}
    # Whether an image has findings does not depend on its path, and the path is an origin lookup
    # (the costly part): it is computed only for images with findings. ``unnamed`` holds the
    # fields before them whose paths are not known yet — a field is skipped when an earlier one
    # has the same path.
    unnamed: list[tuple[EffectiveJob, tuple[str | int, ...]]] = []
    for job in jobs:
        for pod_path, image in image_fields(job):
            if clean is not None and type(image) is str and (image, require_digest) in clean:
                unnamed.append((job, pod_path))
                continue
            if not any(
                check_image_ref(
                    policy,
                    image,
                    "",
                    require_digest=require_digest,
                    digest_reason="",
                    parsed=parsed,
                    known=known,
                )
            ):
                unnamed.append((job, pod_path))
                continue
            seen.update(j.origin(p) for j, p in unnamed)
            unnamed.clear()
            path = job.origin(pod_path)
            if path in seen:
                continue
            seen.add(path)
            yield from check_image_ref(
                policy,
                image,
                path,
                require_digest=require_digest,
                digest_reason=digest_reason,
                patchable=path == "spec.trainer.image",
                parsed=parsed,
                known=known,
            )


def config_clean_images(config: Config) -> AbstractSet[tuple[str, bool]]:
    """``(image, require_digest)`` for every image of the config's runtimes
    (:func:`mpigate.policy.prepared.config_image_refs`) that breaks neither image rule under the
    org's image policy with that ``require_digest``, computed once per config: whether an image
    has findings depends on nothing else (the path and the reason only word them)."""

    def build() -> frozenset[tuple[str, bool]]:
        known = config_image_refs(config)
        policy = config.org.images
        return frozenset(
            (image, require_digest)
            for image in known
            for require_digest in (False, True)
            if not any(
                check_image_ref(
                    policy, image, "", require_digest=require_digest, digest_reason="", known=known
                )
            )
        )

    found: frozenset[tuple[str, bool]] = memoized(config, ("policy.image.clean",), build)
    return found


def check_image_ref(
    policy: ImagePolicy,
    image: object,
    path: str,
    *,
    require_digest: bool,
    digest_reason: str,
    patchable: bool = False,
    parsed: dict[str, images.ImageRef | images.ImageRefError] | None = None,
    known: Mapping[str, images.ImageRef | images.ImageRefError] | None = None,
) -> Iterator[Finding]:
    """Both image rules for one reference (``parsed`` memoises parsing across the pods of a job;
    ``known`` holds images parsed in advance, read through rather than copied into ``parsed``)."""
    allowed = policy.allowed_registries
    if image is FROM_SOURCE:
        yield Finding(
            "MPG-IMG-001",
            path,
            "the image reference comes from valueFrom (a Secret, ConfigMap or field), which mpigate "
            "cannot read, so its registry cannot be checked.",
            "Write the image reference as a literal value.",
            "image reference from valueFrom cannot be checked",
        )
        return
    if not isinstance(image, str):
        yield Finding(
            "MPG-IMG-001",
            path,
            f"image must be a string reference, got {type(image).__name__}.",
            "Write the image as registry/repository:tag.",
            "image is not a string",
        )
        return
    cached = parsed.get(image) if parsed is not None else None
    if cached is None and known is not None:
        cached = known.get(image)
    try:
        if cached is None:
            try:
                cached = images.parse_image(image)
            except images.ImageRefError as error:
                cached = error
            if parsed is not None:
                parsed[image] = cached
        if isinstance(cached, images.ImageRefError):
            raise cached
        ref = cached
    except images.ImageRefError as exc:
        yield Finding(
            "MPG-IMG-001",
            path,
            f"{image!r} is not a valid image reference: {exc}.",
            "Write the image as registry/repository:tag (e.g. registry.acme.internal/team/app:1.2.3).",
            "invalid image reference",
        )
        return
    # A mirror serves what it mirrors: an image under a mirror prefix is judged by its upstream.
    upstream = images.unmirror_image(ref, policy.mirrors) if policy.mirrors else None
    judged = upstream if upstream is not None else ref
    if allowed and images.registry_allowed(judged, allowed) is None:
        where = (
            f"{judged.registry}/{judged.repository} through the mirror {ref.registry}"
            if upstream is not None
            else ref.registry
        )
        fix = (
            f"Push the image to an allowed registry and reference it there (e.g. {allowed[0]}/"
            f"{ref.repository.rsplit('/', 1)[-1]}:<tag>)."
            if patchable
            else f"Use a runtime whose images come from an allowed registry ({', '.join(allowed)})."
        )
        if upstream is not None:
            fix += (
                f" A mirror admits only what allowedRegistries allows upstream (e.g. {judged.registry}/"
                f"{judged.repository.split('/', 1)[0]}, if the security team approves it)."
            )
        yield Finding(
            "MPG-IMG-001",
            path,
            f"image {image} is pulled from {where}, which is not an allowed registry ({', '.join(allowed)}).",
            fix,
            f"image from {judged.registry} is not from an allowed registry",
        )
    if policy.forbid_latest and ref.digest is None and ref.is_latest:
        what = "has no tag (which means :latest)" if ref.tag is None else "uses the mutable :latest tag"
        yield Finding(
            "MPG-IMG-002",
            path,
            f"image {image} {what}; the job would not be reproducible and the image can change under it.",
            f"Pin a version tag (e.g. {ref.name}:1.4.2) or a digest ({ref.name}@sha256:...).",
            f"image {image} {what}",
        )
    elif require_digest and ref.digest is None:
        yield Finding(
            "MPG-IMG-002",
            path,
            f"image {image} has no digest, but {digest_reason} requires images by digest.",
            f"Reference the image by digest: {ref.name}@sha256:<digest> (tag optional).",
            f"image {image} needs a digest ({digest_reason})",
        )
