"""Image references: normalisation like distribution/reference, registry matching, mirrors."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpigate.policy.images import (
    ImageRef,
    ImageRefError,
    mirror_image,
    parse_image,
    registry_allowed,
    split_registry_prefix,
    unmirror_image,
)

SHA = "sha256:" + "0123456789abcdef" * 4


@pytest.mark.parametrize(
    ("text", "registry", "repository", "tag", "digest"),
    [
        ("python", "docker.io", "library/python", None, None),
        ("python:3.11", "docker.io", "library/python", "3.11", None),
        ("acme/trainer:v2", "docker.io", "acme/trainer", "v2", None),
        ("docker.io/python", "docker.io", "library/python", None, None),
        ("index.docker.io/acme/x:1", "docker.io", "acme/x", "1", None),
        ("index.docker.io/python", "docker.io", "library/python", None, None),
        ("localhost/x", "localhost", "x", None, None),
        ("localhost:5000/team/x:dev", "localhost:5000", "team/x", "dev", None),
        ("localhost:5000", "docker.io", "library/localhost", "5000", None),  # no "/": a Hub name + tag
        ("[::1]:5000/x:1", "[::1]:5000", "x", "1", None),
        ("[2001:db8::1]/mpi/openmpi", "[2001:db8::1]", "mpi/openmpi", None, None),
        ("192.168.1.10:5000/x", "192.168.1.10:5000", "x", None, None),
        ("registry.acme.internal/mpi/openmpi:5.0", "registry.acme.internal", "mpi/openmpi", "5.0", None),
        (
            "registry.acme.internal.evil.com/mpi/openmpi",
            "registry.acme.internal.evil.com",
            "mpi/openmpi",
            None,
            None,
        ),
        ("Registry.Acme.Internal/x", "Registry.Acme.Internal", "x", None, None),
        ("Uppercase/x", "Uppercase", "x", None, None),  # an upper-case first component is a host
        (f"nvcr.io/nvidia/pytorch@{SHA}", "nvcr.io", "nvidia/pytorch", None, SHA),
        (f"nvcr.io/nvidia/pytorch:24.01-py3@{SHA}", "nvcr.io", "nvidia/pytorch", "24.01-py3", SHA),
        ("x" * 10 + ":" + "T" * 128, "docker.io", "library/" + "x" * 10, "T" * 128, None),
        ("a.b-c/f_g.h__i---j:_tag", "a.b-c", "f_g.h__i---j", "_tag", None),
        ("docker.io/a__b/c--d", "docker.io", "a__b/c--d", None, None),
        (f"x@sha512:{'ab' * 64}", "docker.io", "library/x", None, f"sha512:{'ab' * 64}"),
    ],
)
def test_parse_normalises(
    text: str, registry: str, repository: str, tag: str | None, digest: str | None
) -> None:
    ref = parse_image(text)
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == (registry, repository, tag, digest)
    assert ref.original == text
    assert parse_image(str(ref)) == ref


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "the name is empty"),
        ("Python", "repository name 'library/Python' must be lowercase"),
        ("acme/Trainer:1", "repository name 'acme/Trainer' must be lowercase"),
        ("registry.acme.internal/Team/x", "repository name 'Team/x' must be lowercase"),
        ("x:", "malformed tag ''"),
        ("x:.hidden", "malformed tag '.hidden'"),
        ("x:-dash", "malformed tag '-dash'"),
        ("x:" + "t" * 129, "malformed tag"),
        ("x:a+b", "malformed tag 'a+b'"),
        ("x@sha256:abc", "malformed digest 'sha256:abc'"),
        ("x@sha256:" + "A" * 64, "sha256 digest must be 64 lower-case hex characters"),
        ("x@sha256:" + "a" * 63 + "0a", "sha256 digest must be 64 lower-case hex characters"),
        ("x@md5:" + "a" * 32, "unsupported digest algorithm 'md5'"),
        ("x@", "malformed digest ''"),
        ("0123456789abcdef" * 4, "a 64-character hex string is an image ID"),
        ("-x", "malformed repository name"),
        ("x-", "malformed repository name"),
        ("a//b", "malformed repository name"),
        ("a/b/", "malformed repository name"),
        ("x___y", "malformed repository name"),
        ("registry.acme.internal:port/x", "malformed registry host 'registry.acme.internal:port'"),
        ("-bad.host/x", "malformed registry host '-bad.host'"),
        ("my_registry.io/x", "malformed registry host 'my_registry.io'"),
        ("[::1/x", "malformed registry host"),
        ("host.io/" + "x" * 250, "longer than 255 characters"),
        (" python", "malformed repository name"),
        ("python ", "malformed repository name"),
        ("pythön", "malformed repository name"),
        ("http://registry.acme.internal/x", "invalid image reference"),
        ("x" * 2000, "longer than 1024 characters"),
    ],
)
def test_invalid_references_are_image_ref_errors(text: str, message: str) -> None:
    with pytest.raises(
        ImageRefError, match=message.replace("[", r"\[").replace(".", r"\.").replace("+", r"\+")
    ):
        parse_image(text)


@pytest.mark.parametrize(
    ("text", "latest"),
    [("python", True), ("python:latest", True), ("python:3.11", False), (f"python@{SHA}", False)],
)
def test_is_latest(text: str, latest: bool) -> None:
    assert parse_image(text).is_latest is latest


def test_name_and_canonical_string() -> None:
    ref = parse_image(f"acme/x:1@{SHA}")
    assert ref.name == "docker.io/acme/x"
    assert str(ref) == f"docker.io/acme/x:1@{SHA}"
    assert parse_image("python") == parse_image("docker.io/library/python")


# --- registry allow-lists -----------------------------------------------------------------------

ALLOWED = ["registry.acme.internal", "quay.io/acme", "docker.io/library", "localhost:5000"]


@pytest.mark.parametrize(
    ("text", "entry"),
    [
        ("registry.acme.internal/mpi/openmpi:5.0", "registry.acme.internal"),
        ("REGISTRY.acme.internal/x", "registry.acme.internal"),
        ("registry.acme.internal.evil.com/mpi/openmpi", None),
        ("registry.acme.internal:5000/x", None),
        ("evil.com/registry.acme.internal/x", None),
        ("quay.io/acme/trainer", "quay.io/acme"),
        ("quay.io/acme", "quay.io/acme"),
        ("quay.io/acmecorp/trainer", None),
        ("quay.io/other/acme", None),
        ("python:3.11", "docker.io/library"),
        ("index.docker.io/library/python", "docker.io/library"),
        ("acme/python", None),
        ("localhost:5000/x", "localhost:5000"),
        ("localhost/x", None),
    ],
)
def test_registry_allowed(text: str, entry: str | None) -> None:
    assert registry_allowed(parse_image(text), ALLOWED) == entry


def test_the_most_specific_entry_wins_and_entries_are_normalised() -> None:
    ref = parse_image("quay.io/acme/x")
    assert registry_allowed(ref, ["quay.io", "quay.io/acme/", "Quay.IO"]) == "quay.io/acme/"
    assert registry_allowed(parse_image("python"), ["index.docker.io"]) == "index.docker.io"
    # Malformed entries never match (configuration validation reports them).
    assert registry_allowed(ref, ["", "quay", "http://quay.io", "quay.io/Acme"]) is None


@pytest.mark.parametrize(
    ("entry", "split"),
    [
        ("registry.acme.internal", ("registry.acme.internal", "")),
        ("Registry.Acme.internal:5000/team/", ("registry.acme.internal:5000", "team")),
        ("index.docker.io/library", ("docker.io", "library")),
        ("localhost", ("localhost", "")),
        ("[::1]:5000/a/b", ("[::1]:5000", "a/b")),
    ],
)
def test_split_registry_prefix(entry: str, split: tuple[str, str]) -> None:
    assert split_registry_prefix(entry) == split


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("", "empty"),
        ("/", "empty"),
        ("acme", "'acme' is not a registry host"),
        ("quay.io/Acme", "malformed repository path 'Acme'"),
        ("https://quay.io", "malformed registry host 'https:'"),
        ("quay.io//x", "malformed repository path"),
    ],
)
def test_split_registry_prefix_rejects(entry: str, message: str) -> None:
    with pytest.raises(ImageRefError, match=message.replace(".", r"\.")):
        split_registry_prefix(entry)


# --- mirrors --------------------------------------------------------------------------------------

MIRRORS = {
    "docker.io": "registry.acme.internal/mirror/docker.io",
    "docker.io/nvidia": "registry.acme.internal/nvidia-hub",
    "nvcr.io": "registry.acme.internal/mirror/nvcr.io",
    "quay.io/acme": "registry.acme.internal",
}


@pytest.mark.parametrize(
    ("text", "mirrored"),
    [
        ("python:3.11", "registry.acme.internal/mirror/docker.io/library/python:3.11"),
        ("index.docker.io/acme/x", "registry.acme.internal/mirror/docker.io/acme/x"),
        ("nvidia/cuda:12.4.1-base", "registry.acme.internal/nvidia-hub/cuda:12.4.1-base"),
        ("nvidiax/cuda:1", "registry.acme.internal/mirror/docker.io/nvidiax/cuda:1"),
        (
            f"nvcr.io/nvidia/pytorch:24.01-py3@{SHA}",
            f"registry.acme.internal/mirror/nvcr.io/nvidia/pytorch:24.01-py3@{SHA}",
        ),
        ("quay.io/acme/trainer:2", "registry.acme.internal/trainer:2"),
        ("quay.io/other/x:1", None),
        ("registry.acme.internal/mpi/openmpi:5.0", None),
    ],
)
def test_mirror_image(text: str, mirrored: str | None) -> None:
    result = mirror_image(parse_image(text), MIRRORS)
    assert (str(result) if result is not None else None) == mirrored
    if result is not None:
        assert result.original == text


@pytest.mark.parametrize(
    ("text", "upstream"),
    [
        ("registry.acme.internal/mirror/docker.io/library/python:3.11", "docker.io/library/python:3.11"),
        ("registry.acme.internal/mirror/docker.io/evil/miner:1", "docker.io/evil/miner:1"),
        ("registry.acme.internal/nvidia-hub/cuda:12.4.1-base", "docker.io/nvidia/cuda:12.4.1-base"),
        (f"registry.acme.internal/mirror/nvcr.io/nvidia/x@{SHA}", f"nvcr.io/nvidia/x@{SHA}"),
        # quay.io/acme's mirror is the bare host: what no longer prefix matches is quay.io/acme's
        ("registry.acme.internal/mirrorx/docker.io/a:1", "quay.io/acme/mirrorx/docker.io/a:1"),
        ("registry.acme.internal/mpi/openmpi:5.0", "quay.io/acme/mpi/openmpi:5.0"),
        ("registry.acme.internal:5000/mirror/docker.io/a:1", None),  # another port, another host
        ("python:3.11", None),
    ],
)
def test_unmirror_image_names_what_a_mirror_serves(text: str, upstream: str | None) -> None:
    """A mirror is transport, not approval: MPG-IMG-001 judges a mirrored image by its upstream."""
    result = unmirror_image(parse_image(text), MIRRORS)
    assert (str(result) if result is not None else None) == upstream


@given(st.sampled_from(["python:3.11", "acme/x:1", "nvidia/cuda:12", f"nvcr.io/nvidia/pytorch@{SHA}"]))
def test_unmirror_undoes_mirror(text: str) -> None:
    ref = parse_image(text)
    mirrored = mirror_image(ref, MIRRORS)
    assert mirrored is not None
    assert unmirror_image(mirrored, MIRRORS) == ref


def test_mirror_that_leaves_no_repository_is_an_error() -> None:
    with pytest.raises(ImageRefError, match="leaves no repository name"):
        mirror_image(parse_image("quay.io/acme:1"), {"quay.io/acme": "registry.acme.internal"})


def test_malformed_mirror_value_is_an_error() -> None:
    with pytest.raises(ImageRefError, match="not a registry host"):
        mirror_image(parse_image("python"), {"docker.io": "mirror"})


def test_with_registry() -> None:
    ref = parse_image(f"acme/x:1@{SHA}")
    moved = ref.with_registry("registry.acme.internal:5000/hub/")
    assert (moved.registry, moved.repository, moved.tag, moved.digest) == (
        "registry.acme.internal:5000",
        "hub/acme/x",
        "1",
        SHA,
    )
    assert ref.with_registry("docker.io") == ref
    with pytest.raises(ImageRefError, match="longer than 255"):
        ref.with_registry("registry.acme.internal/" + "p" * 250)


# --- properties -----------------------------------------------------------------------------------

COMPONENT = st.from_regex(r"[a-z0-9]{1,5}(?:(?:[._]|__|-{1,3})[a-z0-9]{1,5}){0,2}", fullmatch=True)
HOST_LABEL = st.from_regex(r"[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,6}[a-zA-Z0-9])?", fullmatch=True)
HOST = st.one_of(
    st.lists(HOST_LABEL, min_size=2, max_size=3).map(".".join),
    st.just("localhost"),
    st.from_regex(r"\[[0-9a-f]{1,4}(?::[0-9a-f]{0,4}){1,5}\]", fullmatch=True),
)
DOMAIN = st.tuples(HOST, st.none() | st.integers(1, 65535)).map(
    lambda hp: hp[0] + (f":{hp[1]}" if hp[1] else "")
)
TAG = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,20}", fullmatch=True)
DIGEST = st.from_regex(r"[0-9a-f]{64}", fullmatch=True).map(lambda hexa: f"sha256:{hexa}")


@st.composite
def references(draw: st.DrawFn) -> tuple[str, str | None, str, str | None, str | None]:
    domain = draw(st.none() | DOMAIN)
    components = draw(st.lists(COMPONENT, min_size=1, max_size=3))
    if domain is None and len(components) > 1 and "." in components[0]:
        # Such a first component would be read as a registry host; keep it a Docker Hub path.
        components[0] = components[0].replace(".", "-")
    path = "/".join(components)
    tag = draw(st.none() | TAG)
    digest = draw(st.none() | DIGEST)
    text = (f"{domain}/" if domain else "") + path
    text += f":{tag}" if tag else ""
    text += f"@{digest}" if digest else ""
    return text, domain, path, tag, digest


@settings(max_examples=400)
@given(references())
def test_generated_valid_references_parse(
    generated: tuple[str, str | None, str, str | None, str | None],
) -> None:
    text, domain, path, tag, digest = generated
    ref = parse_image(text)
    assert (ref.tag, ref.digest) == (tag, digest)
    if domain is not None and domain != "index.docker.io":
        assert (ref.registry, ref.repository) == (domain, path)
    else:
        assert ref.registry == "docker.io"
        assert ref.repository in (path, f"library/{path}")


@settings(max_examples=400)
@given(references())
def test_canonical_form_round_trips(generated: tuple[str, str | None, str, str | None, str | None]) -> None:
    ref = parse_image(generated[0])
    again = parse_image(str(ref))
    assert again == ref
    assert str(again) == str(ref)


@settings(max_examples=500)
@given(st.text(alphabet=st.sampled_from("aZ09._-/:@[]é \x00") | st.characters(), max_size=60))
def test_any_text_parses_or_raises_image_ref_error(text: str) -> None:
    try:
        ref = parse_image(text)
    except ImageRefError as error:
        message = str(error)
    else:
        assert isinstance(ref, ImageRef)
        assert parse_image(str(ref)) == ref
        return
    assert message.startswith("invalid image reference")


@settings(max_examples=200)
@given(references(), st.sampled_from([".", "A", " ", "//", "@", ":"]), st.integers(0, 200))
def test_corrupted_references_never_raise_anything_else(
    generated: tuple[str, str | None, str, str | None, str | None], junk: str, position: int
) -> None:
    text = generated[0]
    position %= len(text) + 1
    corrupted = text[:position] + junk + text[position:]
    with contextlib.suppress(ImageRefError):
        parse_image(corrupted)
