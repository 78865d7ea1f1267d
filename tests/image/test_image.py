"""The image `make image` builds (build/image/), run as the install base runs it.

Its layer is unpacked (blob digests checked) and started in a mount namespace with `chroot`: the
root file system read-only, the config bundle `mpigate render` writes, the serving certificate, the
audit key and the audit volume mounted where webhooks/base mounts them, the StatefulSet's command
and arguments, the image's user and environment. Building the image takes minutes, so `make test`
does not; `make test-image` builds it (when its inputs changed) and runs this module. Without a
built image, or without root (chroot, mount), these tests are skipped and say why.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import http.client
import io
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tarfile
import time
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml
from click.testing import CliRunner

from mpigate.admission import routes
from mpigate.admission.client import make_review
from mpigate.audit import generate_key
from mpigate.cli import cli
from mpigate.policy import apply_patch
from tests.admission.conftest import as_mutated
from tests.conftest import REPO

IMAGE = REPO / "build" / "image"
LAYOUT = IMAGE / "oci"
SERVICE_DNS = "mpigate-webhook.mpigate-system.svc"
DEADLINE = 120.0


@dataclass(frozen=True)
class Image:
    root: Path
    config: dict[str, Any]  # the OCI image config's "config" (User, Env, Entrypoint, Labels)
    tag: str


def _blob(digest: str) -> bytes:
    algorithm, _, value = digest.partition(":")
    data = (LAYOUT / "blobs" / algorithm / value).read_bytes()
    assert hashlib.sha256(data).hexdigest() == value, f"blob {digest} does not match its digest"
    return data


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Image:
    if not (LAYOUT / "index.json").is_file():
        pytest.skip(
            f"no image in {LAYOUT}: `make image` builds it (about 2.5 minutes), "
            "`make test-image` builds it and runs these tests"
        )
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("chroot"):
        pytest.skip("running the image's rootfs needs root, unshare and chroot (a mount namespace)")
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"no mount namespace here (unshare --mount: {probe.stderr.strip()})")
    (entry,) = json.loads((LAYOUT / "index.json").read_text(encoding="utf-8"))["manifests"]
    manifest = json.loads(_blob(entry["digest"]))
    config = json.loads(_blob(manifest["config"]["digest"]))
    root = tmp_path_factory.mktemp("image") / "rootfs"
    root.mkdir()
    for layer in manifest["layers"]:
        assert layer["mediaType"] == "application/vnd.oci.image.layer.v1.tar+gzip"
        with tarfile.open(fileobj=io.BytesIO(gzip.decompress(_blob(layer["digest"]))), mode="r:") as tar:
            # our own artifact, owners kept: fully trusted. extractall's filter argument exists
            # from Python 3.11.4 on (Debian bookworm's 3.11.2, which the Makefile's venvs use, has
            # none and extracts fully trusted anyway); later Pythons warn or filter without it.
            trusted = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}
            tar.extractall(root, **trusted)
    stale = _first_difference(root)
    if stale:
        pytest.skip(
            f"build/image was built from other sources than this checkout ({stale}): "
            "`make test-image` rebuilds it"
        )
    return Image(root, config["config"], entry["annotations"]["org.opencontainers.image.ref.name"])


def _first_difference(root: Path) -> str | None:
    """Where the mpigate package in the image differs from this checkout's sources (the wheel's
    layout: src/mpigate, and the data directories pyproject force-includes), or None."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    include = project["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"]
    (site,) = (root / "opt/mpigate/venv/lib").glob("python3.*/site-packages")
    pairs = [(REPO / "src" / "mpigate", site / "mpigate", {"_data"})]
    pairs += [(REPO / source, site / target, set()) for source, target in include.items()]

    def files(base: Path, skip: set[str]) -> dict[str, Path]:
        return {
            str(p.relative_to(base)): p
            for p in base.rglob("*")
            if p.is_file()
            and "__pycache__" not in p.parts
            and p.suffix not in (".pyc", ".so")
            and p.relative_to(base).parts[0] not in skip
        }

    for source, target, skip in pairs:
        ours, theirs = files(source, skip), files(target, skip)
        only = sorted(ours.keys() ^ theirs.keys())
        if only:
            where = "the checkout" if only[0] in ours else "the image"
            return f"{source.relative_to(REPO)}/{only[0]} is only in {where}"
        for name in sorted(ours):
            if ours[name].read_bytes() != theirs[name].read_bytes():
                return f"{source.relative_to(REPO)}/{name} differs"
    return None


def _wheel() -> tuple[Path, str]:
    """The wheel installed in the image, and its version."""
    (wheel,) = IMAGE.glob("mpigate-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        text = archive.read(metadata).decode()
    return wheel, next(line.split(": ", 1)[1] for line in text.splitlines() if line.startswith("Version: "))


def _run_in_image(
    image: Image, argv: list[str], mounts: dict[str, tuple[Path, bool]] | None = None, **popen: Any
) -> subprocess.Popen[bytes]:
    """ARGV in the image as the kubelet would start it: read-only root, MOUNTS (container path →
    (host path, read-only)), the image's user and environment, /proc and /dev from the host."""
    root = image.root
    script = ["set -e", f"mount --bind '{root}' '{root}'"]
    for target in ("proc", "dev"):
        script.append(f"mount --rbind /{target} '{root}/{target}'")
    for target in sorted(mounts or {}):
        (root / target.lstrip("/")).mkdir(parents=True, exist_ok=True)
    script.append(f"mount -o remount,bind,ro '{root}'")  # readOnlyRootFilesystem: true
    for target, (source, read_only) in sorted((mounts or {}).items()):
        path = f"{root}/{target.lstrip('/')}"
        script.append(f"mount --bind '{source}' '{path}'")
        if read_only:
            script.append(f"mount -o remount,bind,ro '{path}'")
    user = image.config["User"]
    env = " ".join(f"'{e}'" for e in image.config.get("Env", []))
    chroot = shutil.which("chroot")
    script.append(f"exec env -i {env} {chroot} --userspec={user} '{root}' \"$@\"")
    return subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", "\n".join(script), "sh", *argv],
        **popen,
    )


def test_the_image_is_labelled_runs_as_non_root_and_reports_the_wheels_version(image: Image) -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    version = project["project"]["version"]
    labels = image.config["Labels"]
    wheel, wheel_version = _wheel()
    assert wheel_version == version == image.tag == labels["org.opencontainers.image.version"]
    assert labels["org.opencontainers.image.source"] == project["project"]["urls"]["Source"]
    assert len(labels["org.opencontainers.image.revision"].removesuffix("-dirty")) == 40
    assert image.config["User"] == "65532:65532"
    assert image.config["Entrypoint"] == ["/opt/mpigate/venv/bin/mpigate"]
    # no shell at run time: the entrypoint is exec'd, and there is none to fall back on
    for shell in ("bin/sh", "bin/bash", "bin/dash", "usr/bin/sh", "usr/bin/bash"):
        assert not (image.root / shell).exists(), shell
    process = _run_in_image(image, [*image.config["Entrypoint"], "--version"], stdout=subprocess.PIPE)
    out, _ = process.communicate(timeout=DEADLINE)
    assert process.returncode == 0
    assert out.decode().startswith(f"mpigate, version {wheel_version} ")
    # the mypyc-compiled wheel by default (IMAGE_BUILD=pure: the pure-Python one)
    compiled = not wheel.name.endswith("-py3-none-any.whl")
    assert f"(compiled: {'yes' if compiled else 'no'})" in out.decode()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def served(image: Image, tmp_path: Path) -> Iterator[tuple[int, ssl.SSLContext, Path, Path]]:
    """The webhook container of webhooks/base, on a free loopback port."""
    # the volumes of the StatefulSet: the rendered config bundle (one file per ConfigMap key, as the
    # kubelet mounts it), the serving certificate, the audit key, the audit volume, /tmp
    rendered = tmp_path / "deploy"
    result = CliRunner().invoke(cli, ["render", str(REPO), "-o", str(rendered)])
    assert result.exit_code == 0, result.output
    (bundle,) = yaml.safe_load_all((rendered / "mpigate" / "config-bundle.yaml").read_text(encoding="utf-8"))
    config = tmp_path / "config"
    config.mkdir()
    for key, text in bundle["data"].items():
        (config / key).write_text(text, encoding="utf-8")
    ca = trustme.CA()
    tls = tmp_path / "tls"
    tls.mkdir()
    issued = ca.issue_cert(SERVICE_DNS)
    issued.cert_chain_pems[0].write_to_path(str(tls / "tls.crt"))
    issued.private_key_pem.write_to_path(str(tls / "tls.key"))
    key_dir = tmp_path / "audit-key"
    key_dir.mkdir()
    private, public = generate_key("ed25519")
    assert public is not None
    (key_dir / "key").write_bytes(private)
    (tmp_path / "audit.pub").write_bytes(public)
    audit, scratch = tmp_path / "audit", tmp_path / "tmp"
    for path in (tls / "tls.key", key_dir / "key"):
        os.chown(path, 0, 65532)  # Secret volumes: defaultMode 0440, group fsGroup
        path.chmod(0o440)
    for writable in (audit, scratch):
        writable.mkdir()
        os.chown(writable, 65532, 65532)
    statefulset = next(
        o
        for o in yaml.safe_load_all((REPO / "webhooks" / "base" / "webhook.yaml").read_text(encoding="utf-8"))
        if o["kind"] == "StatefulSet"
    )
    container = statefulset["spec"]["template"]["spec"]["containers"][0]
    sources = {"config": config, "tls": tls, "audit-key": key_dir, "audit": audit, "tmp": scratch}
    mounts = {
        m["mountPath"]: (sources[m["name"]], m.get("readOnly", False)) for m in container["volumeMounts"]
    }
    assert len(mounts) == len(sources)
    port = _free_port()
    args = list(container["args"])
    args[args.index("--port") + 1] = str(port)
    command = [*container["command"], *args, "--host", "127.0.0.1"]
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        process = _run_in_image(image, command, mounts, stdout=out, stderr=subprocess.STDOUT)
    context = ssl.create_default_context(cafile=None)
    ca.configure_trust(context)
    try:
        deadline = time.monotonic() + DEADLINE
        while True:
            assert process.poll() is None, f"mpigate serve exited: {log.read_text(errors='replace')}"
            try:
                if _request(port, context, "GET", routes.READYZ_PATH)[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, (
                f"not ready in {DEADLINE} s: {log.read_text(errors='replace')}"
            )
            time.sleep(0.2)
        yield port, context, audit, tmp_path / "audit.pub"
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    assert process.returncode == 0, log.read_text(errors="replace")


def _request(port: int, context: ssl.SSLContext, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=30)
    connection.sock = context.wrap_socket(
        socket.create_connection(("127.0.0.1", port), timeout=30), server_hostname=SERVICE_DNS
    )
    try:
        payload = None if body is None else json.dumps(body).encode()
        connection.request(method, path, body=payload, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        data = response.read()
        return response.status, (json.loads(data) if data and method == "POST" else data)
    finally:
        connection.close()


def _trainjob(name: str) -> dict[str, Any]:
    return yaml.safe_load((REPO / "examples" / "trainjobs" / name).read_text(encoding="utf-8"))


def _admit(port: int, context: ssl.SSLContext, obj: dict[str, Any], uid: str) -> tuple[dict, dict]:
    """What the API server does with a CREATE: /mutate, apply the patch, /validate the result.
    Returns (the mutated object, the validating response)."""
    status, answer = _request(port, context, "POST", routes.MUTATE_PATH, make_review(obj, uid=f"{uid}-m"))
    assert status == 200 and answer["response"]["uid"] == f"{uid}-m" and answer["response"]["allowed"]
    patch = answer["response"].get("patch")
    mutated = apply_patch(obj, json.loads(base64.b64decode(patch))) if patch else obj
    status, answer = _request(port, context, "POST", routes.VALIDATE_PATH, make_review(mutated, uid=uid))
    assert status == 200 and answer["response"]["uid"] == uid
    return mutated, answer["response"]


def test_the_image_serves_admission_reviews_as_the_install_base_runs_it(
    served: tuple[int, ssl.SSLContext, Path, Path],
) -> None:
    port, context, audit, public_key = served
    minimal = _trainjob("minimal.yaml")
    mutated, response = _admit(port, context, minimal, "image-allowed")
    # the image's engine mutates as this checkout's does, and admits the result
    assert mutated == as_mutated(minimal, REPO) != minimal
    assert response["allowed"] is True, response
    _, response = _admit(port, context, _trainjob("deny-over-quota.yaml"), "image-denied")
    assert response["allowed"] is False and response["status"]["code"] == 403
    message = response["status"]["message"]
    assert message.startswith("mpigate denied TrainJob nlp-team/llm-pretrain-huge:"), message
    assert "[MPG-Q001] spec.trainer: asks 32 nvidia.com/gpu" in message, message
    # every review is in the replica's chain on the audit volume, signed with the mounted key
    (chain,) = [p for p in audit.iterdir() if p.is_dir()]
    records = b"".join(p.read_bytes() for p in sorted(chain.glob("*.jsonl")))
    for uid in ("image-allowed-m", "image-allowed", "image-denied-m", "image-denied"):
        assert f'"{uid}"'.encode() in records, uid
    verify = CliRunner().invoke(cli, ["audit", "verify", str(audit), "--public-key", str(public_key)])
    assert verify.exit_code == 0, verify.output


def test_the_sbom_lists_what_the_image_holds(image: Image) -> None:
    (sbom_path,) = IMAGE.glob("mpigate-*.cdx.json")
    sbom = json.loads(sbom_path.read_text(encoding="utf-8"))
    digest = (IMAGE / "digest").read_text(encoding="utf-8").strip()
    described = sbom["metadata"]["component"]
    assert described["type"] == "container" and described["version"] == image.tag
    assert described["hashes"] == [{"alg": "SHA-256", "content": digest.removeprefix("sha256:")}]
    listed = {(c["name"], c["version"]) for c in sbom["components"]}
    status = (image.root / "var/lib/dpkg/status").read_text(encoding="utf-8")
    debs = {
        (fields["Package"], fields["Version"])
        for stanza in status.split("\n\n")
        if stanza.strip()
        for fields in [dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line[:40])]
    }
    assert "python3.11" in {name for name, _ in debs} and "bash" not in {name for name, _ in debs}
    assert debs <= listed
    (site,) = (image.root / "opt/mpigate/venv/lib").glob("python3.*/site-packages")
    dists = set()
    for info in site.glob("*.dist-info"):
        metadata = (info / "METADATA").read_text(encoding="utf-8")
        fields = dict(line.split(": ", 1) for line in metadata.split("\n\n")[0].splitlines() if ": " in line)
        dists.add((fields["Name"], fields["Version"]))
    assert ("mpigate", image.tag) in dists and not {d for d in dists if d[0] in ("pip", "setuptools")}
    assert dists <= listed
