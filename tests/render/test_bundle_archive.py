"""The compressed config bundle (issue 25 item 4): a large org's files go as one gzip'd tar in the
ConfigMap's binaryData; the webhook and controller load it like the plain bundle, a revision is
swapped in whole, hostile archives are refused with a message, and ``check``/``render`` warn before a
rendered object nears the API server's limits."""

from __future__ import annotations

import base64
import functools
import io
import json
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

import mpigate.render.renderer as renderer
from mpigate.admission.reload import ConfigStore
from mpigate.cli import cli
from mpigate.config import Config, check_tree, load
from mpigate.config.bundle import BUNDLE_ARCHIVE, CONFIGMAP_DATA_LIMIT, bundle_files, pack, unpack_bytes
from mpigate.config.loader import REVISION_FILE
from mpigate.policy import AdmissionInput, judge, mutations
from mpigate.render import Rendering, collect_bundle, render
from mpigate.render.diff import diff_objects
from mpigate.render.limits import bundle_size_warning, object_size_warnings
from tests.admission.test_reload import kubelet_write
from tests.conftest import REPO, TODAY
from tests.policy.helpers import NOW

from .conftest import PINNED_REVISION


def _bundle_cm(rendering: Rendering) -> dict[str, Any]:
    found = [
        o.data for o in rendering.objects if o.key.kind == "ConfigMap" and o.key.name == "mpigate-config"
    ]
    assert len(found) == 1
    return found[0]


@pytest.fixture(scope="module")
def compressed(request: pytest.FixtureRequest) -> Rendering:
    """The example org rendered with a plain limit of 0 bytes: always compressed."""
    config = load(REPO, revision=PINNED_REVISION, today=TODAY)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(renderer, "collect_bundle", functools.partial(collect_bundle, plain_limit=0))
        return render(config, today=TODAY)


def _mounted(cm: dict[str, Any]) -> dict[str, bytes]:
    files = {k: v.encode() for k, v in (cm.get("data") or {}).items()}
    files.update({k: base64.b64decode(v) for k, v in (cm.get("binaryData") or {}).items()})
    return files


def test_a_large_bundle_is_one_archive_that_loads_as_the_tree(
    compressed: Rendering, example_rendering: Rendering, example_config: Config, tmp_path: Path
) -> None:
    cm = _bundle_cm(compressed)
    assert "data" not in cm and list(cm["binaryData"]) == [BUNDLE_ARCHIVE]
    plain = _bundle_cm(example_rendering)
    # the same keys, revision included, as the plain bundle
    assert bundle_files(cm) == plain["data"]
    kubelet_write(tmp_path, _mounted(cm))
    mounted = load(tmp_path, today=TODAY)
    assert mounted.revision == PINNED_REVISION
    assert mounted.root == str(tmp_path)
    assert set(mounted.teams) == set(example_config.teams)
    assert set(mounted.runtimes) == set(example_config.runtimes)
    # and judges as the plain bundle does (messages name the bundle's keys in both)
    (tmp_path / "plain").mkdir()
    kubelet_write(tmp_path / "plain", _mounted(plain))
    reference = load(tmp_path / "plain", today=TODAY)
    for path in sorted((REPO / "examples" / "trainjobs").glob("*.yaml")):
        obj = yaml.safe_load(path.read_text())
        meta = obj["metadata"]
        request = AdmissionInput("CREATE", "TrainJob", meta.get("namespace"), meta["name"], obj)
        for engine in (mutations, judge):
            a, b = engine(mounted, request, None, NOW), engine(reference, request, None, NOW)
            assert a == b, path.name


def test_the_archive_is_the_same_bytes_for_the_same_tree(
    compressed: Rendering, example_config: Config
) -> None:
    again = render(example_config, today=TODAY)  # plain, but the files are the same
    files = bundle_files(_bundle_cm(again))
    assert files is not None
    assert base64.b64decode(_bundle_cm(compressed)["binaryData"][BUNDLE_ARCHIVE]) == pack(files)


def test_small_bundles_stay_plain_keys(example_rendering: Rendering) -> None:
    cm = _bundle_cm(example_rendering)
    assert "binaryData" not in cm and REVISION_FILE in cm["data"]


def test_a_diff_shows_the_files_in_the_archive(compressed: Rendering, example_config: Config) -> None:
    cm = _bundle_cm(compressed)
    files = bundle_files(cm)
    assert files is not None
    changed = dict(files)
    changed["quotas__nlp-team.yaml"] = changed["quotas__nlp-team.yaml"].replace("nlp-team", "nlp-team ", 1)
    changed[REVISION_FILE] = "another-revision\n"
    after = dict(cm, binaryData={BUNDLE_ARCHIVE: base64.b64encode(pack(changed)).decode()})
    changes = diff_objects([("a", cm)], [("a", after)])
    assert len(changes) == 1
    text = changes[0].diff
    assert f"{BUNDLE_ARCHIVE}/quotas__nlp-team.yaml" in text
    assert "another-revision" not in text  # the revision is left out, as for a plain bundle
    # the same content under a new revision: no change at all
    same = dict(files, **{REVISION_FILE: "another-revision\n"})
    renamed = dict(cm, binaryData={BUNDLE_ARCHIVE: base64.b64encode(pack(same)).decode()})
    assert diff_objects([("a", cm)], [("a", renamed)]) == []


async def test_a_replica_swaps_in_a_whole_revision(compressed: Rendering, tmp_path: Path) -> None:
    """A compressed bundle is one key of one ConfigMap: every reload sees one revision's files."""
    cm = _bundle_cm(compressed)
    files = bundle_files(cm)
    assert files is not None
    volume = tmp_path / "configmap"
    volume.mkdir()

    def revision(name: str) -> dict[str, bytes]:
        return {BUNDLE_ARCHIVE: pack(dict(files, **{REVISION_FILE: name + "\n"}))}

    kubelet_write(volume, revision("rev-1"))
    store = ConfigStore(volume, debounce=0.0)
    loaded = await store.load_now()
    assert loaded is not None and loaded.revision == "rev-1"
    kubelet_write(volume, revision("rev-2"))
    deadline = time.monotonic() + 30
    while (store.current is None or store.current.revision != "rev-2") and time.monotonic() < deadline:
        await store.poll()
    assert store.current is not None and store.current.revision == "rev-2"


def _tar(members: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for info, data in members:
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    import gzip

    return gzip.compress(raw.getvalue())


def _info(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    return info


@pytest.mark.parametrize(
    ("archive", "message"),
    [
        (b"not gzip at all", "not a gzip'd tar archive"),
        (_tar([(_info("../escape.yaml"), b"x")]), "is not a ConfigMap key"),
        (_tar([(_info("policies/org.yaml"), b"x")]), "is not a ConfigMap key"),
        (_tar([(_info("link.yaml", tarfile.SYMTYPE, "/etc/passwd"), b"")]), "is not a regular file"),
        (_tar([(_info("a.yaml"), b"x"), (_info("a.yaml"), b"y")]), "twice"),
    ],
    ids=["garbage", "traversal", "path", "symlink", "duplicate"],
)
def test_a_hostile_or_broken_archive_is_refused_with_a_message(
    archive: bytes, message: str, tmp_path: Path
) -> None:
    (tmp_path / BUNDLE_ARCHIVE).write_bytes(archive)
    result = check_tree(tmp_path)
    assert result.config is None
    assert len(result.problems) == 1
    assert message in result.problems[0].message
    assert not (tmp_path.parent / "escape.yaml").exists()


def test_an_archive_that_unpacks_to_too_much_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import mpigate.config.bundle as bundle

    monkeypatch.setattr(bundle, "_MAX_UNPACKED_BYTES", 64 * 1024)
    bomb = pack({"a.yaml": "#" * (10 * 1024 * 1024)})
    assert len(bomb) < 64 * 1024
    with pytest.raises(bundle.BundleArchiveError, match="unpacks to more than"):
        unpack_bytes(bomb)


def test_an_archive_beside_config_files_is_refused(compressed: Rendering, tmp_path: Path) -> None:
    cm = _bundle_cm(compressed)
    (tmp_path / BUNDLE_ARCHIVE).write_bytes(_mounted(cm)[BUNDLE_ARCHIVE])
    (tmp_path / "policies__org.yaml").write_text((REPO / "policies" / "org.yaml").read_text())
    result = check_tree(tmp_path)
    assert result.config is None
    assert "either config.tar.gz or config files, not both" in result.problems[0].message


def test_size_warnings_start_at_80_percent_of_the_limits() -> None:
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"a": "x" * 800 * 1024}}
    assert object_size_warnings(cm, "cm") == []
    cm["data"]["b"] = "x" * 40 * 1024
    (warning,) = object_size_warnings(cm, "cm")
    assert "of the 1,024 KiB the API server accepts in a ConfigMap" in warning
    binary = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}
    binary["binaryData"] = {"a": base64.b64encode(b"\0" * 900 * 1024).decode()}
    assert any("ConfigMap" in w for w in object_size_warnings(binary, "cm"))  # decoded bytes count
    big = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "x": "y" * 1300 * 1024}
    (warning,) = object_size_warnings(big, "s")
    assert "etcd stores in one object" in warning


def test_check_warns_when_the_bundle_nears_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    import mpigate.render.limits as limits

    config = load(REPO, revision=PINNED_REVISION, today=TODAY)
    stored = collect_bundle(config).stored
    assert bundle_size_warning(collect_bundle(config)) is None
    # a limit the example org's bundle is 90 % of
    monkeypatch.setattr(limits, "CONFIGMAP_DATA_LIMIT", int(stored / 0.9))
    result = CliRunner().invoke(cli, ["check", str(REPO), "-o", "json"])
    problems = json.loads(result.output)["problems"]
    sizes = [p for p in problems if p["code"] == "render.size"]
    assert len(sizes) == 1, problems
    assert "the config bundle ConfigMap nears the API server's limit" in sizes[0]["message"]
    assert "90%" in sizes[0]["message"]
    assert CONFIGMAP_DATA_LIMIT == 1024 * 1024
