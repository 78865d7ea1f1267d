"""The image's CycloneDX SBOM: the Python part from cyclonedx-bom (`cyclonedx-py environment` over the
image's venv), plus the Debian packages the image keeps (its /var/lib/dpkg/status) and the image
itself as the described component.

Usage: python sbom.py PYTHON_SBOM ROOTFS NAME VERSION DIGEST CREATED > image.cdx.json
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from urllib.parse import quote

DEBIAN_RELEASE = "12"


def debian_packages(status: str) -> list[dict[str, str]]:
    """(package, version, architecture) of every installed package, from a dpkg status file."""
    packages = []
    for stanza in status.split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in stanza.splitlines() if ": " in line and not line.startswith(" ")
        )
        if "install ok installed" in fields.get("Status", ""):
            packages.append(
                {"name": fields["Package"], "version": fields["Version"], "arch": fields["Architecture"]}
            )
    return sorted(packages, key=lambda p: p["name"])


def merge(python_sbom: dict, root: Path, name: str, version: str, digest: str, created: str) -> dict:
    debs = debian_packages((root / "var/lib/dpkg/status").read_text(encoding="utf-8"))
    os_version = (root / "etc/debian_version").read_text(encoding="utf-8").strip()
    os_ref = f"debian@{os_version}"
    components = list(python_sbom.get("components", []))
    components.append(
        {"type": "operating-system", "bom-ref": os_ref, "name": "debian", "version": os_version}
    )
    for deb in debs:
        purl = (
            f"pkg:deb/debian/{deb['name']}@{quote(deb['version'], safe='')}"
            f"?arch={deb['arch']}&distro=debian-{DEBIAN_RELEASE}"
        )
        components.append(
            {
                "type": "library",
                "bom-ref": purl,
                "name": deb["name"],
                "version": deb["version"],
                "publisher": "Debian",
                "purl": purl,
            }
        )
    image = name.rpartition("/")[2]
    image_ref = (
        f"pkg:oci/{image}@{quote(digest, safe='')}?repository_url={quote(name, safe='/')}&tag={version}"
    )
    python_refs = [c["bom-ref"] for c in python_sbom.get("components", []) if "bom-ref" in c]
    sbom = dict(python_sbom)
    sbom["serialNumber"] = f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, image_ref)}"
    sbom["metadata"] = {
        "timestamp": created,
        "component": {
            "type": "container",
            "bom-ref": image_ref,
            "name": name,
            "version": version,
            "purl": image_ref,
            "hashes": [{"alg": "SHA-256", "content": digest.removeprefix("sha256:")}],
        },
        "tools": python_sbom.get("metadata", {}).get("tools", {}),
    }
    sbom["components"] = components
    dependencies = [d for d in python_sbom.get("dependencies", []) if d.get("ref") != image_ref]
    deb_refs = [c["bom-ref"] for c in components if c["bom-ref"].startswith("pkg:deb/")]
    dependencies.append({"ref": image_ref, "dependsOn": sorted([os_ref, *python_refs, *deb_refs])})
    sbom["dependencies"] = dependencies
    return sbom


def main(argv: list[str]) -> None:
    if len(argv) != 6:
        raise SystemExit(__doc__)
    python_sbom_path, root, name, version, digest, created = argv
    python_sbom = json.loads(Path(python_sbom_path).read_text(encoding="utf-8"))
    sbom = merge(python_sbom, Path(root), name, version, digest, created)
    json.dump(sbom, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(sys.argv[1:])
