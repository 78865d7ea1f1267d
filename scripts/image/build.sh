#!/usr/bin/env bash
# `make image`: the mpigate OCI image, built without a container daemon (docs/operations.md#the-image).
#
#   1. the project's wheel (hatchling, SOURCE_DATE_EPOCH) and its dependencies' wheels (pip download,
#      pinned by constraints.txt) on this machine;
#   2. a Debian bookworm rootfs with mmdebstrap: the essential set, python3.11 (the interpreter the
#      wheel's cp311 dependencies target), python3.11-venv, ca-certificates, netbase;
#   3. a venv in /opt/mpigate/venv inside it (chroot: the image's own Python) with the wheels,
#      byte-compiled (checked-hash .pyc under SOURCE_DATE_EPOCH), pip and setuptools removed;
#   4. the user mpigate (65532), and everything that only installing needed removed
#      (scripts/image/slim_rootfs.py: no shell, coreutils, dpkg or perl at run time);
#   5. one layer, a reproducible tar (sorted, mtimes clamped to SOURCE_DATE_EPOCH, numeric owners),
#      turned into an OCI image with umoci (config, labels, entrypoint), and an oci-archive tarball;
#   6. the CycloneDX SBOM (cyclonedx-bom for the venv, the Debian packages from the image's dpkg
#      status) next to it.
#
# Output: build/image/oci (OCI layout, tag = the project's version), build/image/mpigate-VERSION.oci.tar
# (oci-archive), build/image/mpigate-VERSION.cdx.json (SBOM), build/image/digest (manifest digest).
# IMAGE_WHEEL=path installs that wheel instead of building the pure-Python one from this checkout.
# Needs root (mmdebstrap --mode=root, chroot), mmdebstrap, umoci, GNU tar; the Makefile installs them.
set -euo pipefail
cd "$(dirname "$0")/../.."

PY=${PY:-.venv/bin/python}
TOOLS=${IMAGE_TOOLS:-build/image-tools}
OUT=${IMAGE_OUT:-build/image}
DEBIAN_SUITE=bookworm
# DEBIAN_SNAPSHOT=20251125T000000Z pins the Debian archive to snapshot.debian.org (a rebuild later
# then installs the same package versions); by default the live mirrors with security updates.
if [ -n "${DEBIAN_SNAPSHOT:-}" ]; then
  MIRRORS=("deb http://snapshot.debian.org/archive/debian/$DEBIAN_SNAPSHOT $DEBIAN_SUITE main"
           "deb http://snapshot.debian.org/archive/debian/$DEBIAN_SNAPSHOT $DEBIAN_SUITE-updates main"
           "deb http://snapshot.debian.org/archive/debian-security/$DEBIAN_SNAPSHOT $DEBIAN_SUITE-security main")
else
  MIRRORS=("deb ${DEBIAN_MIRROR:-http://deb.debian.org/debian} $DEBIAN_SUITE $DEBIAN_SUITE-updates main"
           "deb ${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security} $DEBIAN_SUITE-security main")
fi
VENV=/opt/mpigate/venv
IMAGE_UID=65532

read -r NAME VERSION SOURCE < <("$PY" -c '
import tomllib
p = tomllib.load(open("pyproject.toml", "rb"))
print(p["tool"]["mpigate"]["image"]["name"], p["project"]["version"], p["project"]["urls"]["Source"])')
REVISION=$(git rev-parse HEAD)
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then REVISION="$REVISION-dirty"; fi
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}
CREATED=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
started=$(date +%s)
step() { echo "image: [$(( $(date +%s) - started ))s] $*"; }

WORK=$OUT/work
ROOT=$WORK/rootfs
rm -rf "$OUT"
mkdir -p "$WORK/wheels"

step "wheels: mpigate $VERSION (SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH) and its dependencies"
if [ -n "${IMAGE_WHEEL:-}" ]; then
  # a wheel built elsewhere, e.g. the mypyc-compiled one of `make compiled` (docs/building.md)
  cp "$IMAGE_WHEEL" "$WORK/wheels/"
  WHEEL=$WORK/wheels/$(basename "$IMAGE_WHEEL")
else
  "$PY" -m hatchling build -t wheel -d "$WORK/wheels" >/dev/null
  WHEEL=$WORK/wheels/mpigate-$VERSION-py3-none-any.whl
fi
"$PY" -m pip download -q --disable-pip-version-check --only-binary=:all: -c constraints.txt \
  -d "$WORK/wheels" "$WHEEL" 2> >(grep -v "^WARNING: Location" >&2)

step "rootfs: mmdebstrap $DEBIAN_SUITE"
mmdebstrap --quiet --mode=root --variant=essential \
  --include=python3.11,python3.11-venv,libstdc++6,ca-certificates,netbase \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/lintian/*' \
  --customize-hook='rm -f "$1/etc/resolv.conf" "$1/etc/hostname"' \
  "$DEBIAN_SUITE" "$ROOT" "${MIRRORS[@]}"

step "venv: $VENV"
mkdir -p "$ROOT/tmp/wheels"
cp "$WORK"/wheels/*.whl "$ROOT/tmp/wheels/"
in_root() { chroot "$ROOT" /usr/bin/env -i PATH=/usr/bin:/bin SOURCE_DATE_EPOCH="$SOURCE_DATE_EPOCH" \
  PYTHONHASHSEED=0 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 "$@"; }
in_root /usr/bin/python3.11 -m venv "$VENV"
in_root "$VENV/bin/python" -m pip install -q --no-index --find-links /tmp/wheels \
  "/tmp/wheels/$(basename "$WHEEL")"
in_root "$VENV/bin/python" -m pip uninstall -q -y pip setuptools
rm -rf "$ROOT/tmp/wheels"

step "SBOM (Python part): cyclonedx-py environment"
# cyclonedx-py asks the environment's interpreter for its sys.path; the image's interpreter runs in
# the chroot, so a shim answers with the same paths as seen from here.
shim=$WORK/image-python
cat > "$shim" <<SHIM
#!/bin/sh
exec chroot "$ROOT" $VENV/bin/python -c 'import json, sys; json.dump(["$ROOT" + p for p in sys.path if p], sys.stdout)'
SHIM
chmod +x "$shim"
"$TOOLS/bin/cyclonedx-py" environment --output-reproducible --of JSON --sv 1.6 \
  -o "$WORK/python.cdx.json" "$shim"

step "user $IMAGE_UID, runtime-only packages"
grep -q "^mpigate:" "$ROOT/etc/passwd" ||
  echo "mpigate:x:$IMAGE_UID:$IMAGE_UID:mpigate:/nonexistent:/usr/sbin/nologin" >> "$ROOT/etc/passwd"
grep -q "^mpigate:" "$ROOT/etc/group" || echo "mpigate:x:$IMAGE_UID:" >> "$ROOT/etc/group"
"$PY" scripts/image/slim_rootfs.py "$ROOT" "$VENV" > "$WORK/debian-packages.txt"

step "layer and OCI image (umoci)"
tar --sort=name --format=pax --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
  --mtime="@$SOURCE_DATE_EPOCH" --clamp-mtime --numeric-owner --exclude='./dev/*' \
  -C "$ROOT" -cf "$WORK/layer.tar" .
LAYOUT=$OUT/oci
umoci init --layout "$LAYOUT"
umoci new --image "$LAYOUT:$VERSION"
umoci raw add-layer --image "$LAYOUT:$VERSION" --history.created "$CREATED" \
  --history.created_by "make image: Debian $DEBIAN_SUITE (mmdebstrap), mpigate $VERSION in $VENV" \
  "$WORK/layer.tar"
labels=(
  "org.opencontainers.image.title=mpigate"
  "org.opencontainers.image.description=Governance and admission control for MPI training jobs (Kubeflow Trainer v2)"
  "org.opencontainers.image.version=$VERSION"
  "org.opencontainers.image.revision=$REVISION"
  "org.opencontainers.image.source=$SOURCE"
  "org.opencontainers.image.created=$CREATED"
  "org.opencontainers.image.licenses=Apache-2.0"
  "org.opencontainers.image.base.name=debian:$DEBIAN_SUITE"
)
label_args=(); for l in "${labels[@]}"; do label_args+=(--config.label "$l" --manifest.annotation "$l"); done
umoci config --image "$LAYOUT:$VERSION" --no-history --created "$CREATED" \
  --os linux --architecture amd64 --author "mpigate maintainers" \
  --config.user "$IMAGE_UID:$IMAGE_UID" --config.workingdir / \
  --config.env "PATH=$VENV/bin:/usr/bin:/bin" --config.env "PYTHONDONTWRITEBYTECODE=1" \
  --config.entrypoint "$VENV/bin/mpigate" --clear=config.cmd "${label_args[@]}"
umoci gc --layout "$LAYOUT"
ARCHIVE=$OUT/mpigate-$VERSION.oci.tar
tar --sort=name --format=pax --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
  --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner -C "$LAYOUT" -cf "$ARCHIVE" .
DIGEST=$("$PY" -c '
import json, sys
index = json.load(open(sys.argv[1] + "/index.json"))
(manifest,) = index["manifests"]
print(manifest["digest"])' "$LAYOUT")
echo "$DIGEST" > "$OUT/digest"

step "SBOM: $OUT/mpigate-$VERSION.cdx.json"
"$PY" scripts/image/sbom.py "$WORK/python.cdx.json" "$ROOT" "$NAME" "$VERSION" "$DIGEST" "$CREATED" \
  > "$OUT/mpigate-$VERSION.cdx.json"
cp "$WHEEL" "$OUT/"
rm -rf "$WORK"
step "done: $NAME:$VERSION $DIGEST"
echo "  OCI layout   $LAYOUT (tag $VERSION)"
echo "  oci-archive  $ARCHIVE"
echo "  push         skopeo copy oci-archive:$ARCHIVE docker://$NAME:$VERSION"
