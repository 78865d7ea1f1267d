"""Orgs of 1,000 and 5,000 teams (issue 25 item 4): render time, the config bundle's size plain and
compressed against the API server's ConfigMap limit, and what the webhook pays to load it.

Each org is ``mpigate init``'s starter tree with its team (``TeamQuota``, ``TeamAccess``,
``TeamNetwork``: about 1.1 KB, the "minimal team") cloned under new names, every clone with a
nominal quota of 0 GPUs (so that the flavor's capacity holds any number of teams). Per org size,
each step in a fresh process (so that its peak RSS is its own):

- ``check``: ``mpigate.config.load`` of the tree (what ``mpigate check`` and CI pay);
- ``render``: :func:`mpigate.render.render` (the bundle, every team's objects, the size checks);
- the bundle: files and bytes, the plain size (keys and values), what the compressed ConfigMap
  stores (the archive) and that as a share of the 1 MiB ConfigMap limit, bytes per team;
- ``load bundle``: the rendered ConfigMap mounted as the kubelet mounts it (``..data`` link), loaded
  through the webhook's :class:`~mpigate.admission.reload.ConfigStore` — what a replica pays at
  start and on every new revision; next to it the same files as a plain directory (the baseline).

    .venv/bin/python benchmarks/org_scale.py [--teams 1000,5000]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TEAM_FILES = ("quotas", "rbac", "networkpolicies")


def generate(target: Path, teams: int) -> None:
    """``mpigate init``'s tree with its one team cloned to ``teams`` teams."""
    subprocess.run(
        [sys.executable, "-m", "mpigate", "init", str(target), "--org", "acme", "--team", "team-0000"],
        check=True,
        capture_output=True,
    )
    shutil.rmtree(target / "policies" / "tests")  # PolicyTests stay out of the bundle anyway
    texts = {folder: (target / folder / "team-0000.yaml").read_text() for folder in TEAM_FILES}
    texts["quotas"] = texts["quotas"].replace("nominal: 8", "nominal: 0")
    for i in range(teams):
        name = f"team-{i:04d}"
        for folder, text in texts.items():
            (target / folder / f"{name}.yaml").write_text(text.replace("team-0000", name))


def mount(configmap: dict[str, Any], volume: Path) -> None:
    """The ConfigMap's keys as the kubelet writes them: a timestamped directory, ``..data``, links."""
    stamp = volume / "..2026_11_25_00_00_00.000000000"
    stamp.mkdir(parents=True)
    files = {k: v.encode() for k, v in (configmap.get("data") or {}).items()}
    files.update({k: base64.b64decode(v) for k, v in (configmap.get("binaryData") or {}).items()})
    for name, data in files.items():
        (stamp / name).write_bytes(data)
        (volume / name).symlink_to(f"..data/{name}")
    (volume / "..data").symlink_to(stamp.name)


def step(kind: str, tree: Path, out: Path) -> dict[str, Any]:
    """One measured step, run in this (fresh) process."""
    from mpigate.config import load

    t0 = time.perf_counter()
    result: dict[str, Any] = {}
    if kind == "check":
        config = load(tree, revision="bench")
        result["teams"] = len(config.teams)
    elif kind == "render":
        from mpigate.render import collect_bundle, render
        from mpigate.render.tree import write_tree

        config = load(tree, revision="bench")
        t0 = time.perf_counter()
        rendering = render(config)
        result["seconds_render"] = time.perf_counter() - t0
        write_tree(rendering, out / "deploy")
        bundle = collect_bundle(config)
        cm = next(
            o.data for o in rendering.objects if o.key.kind == "ConfigMap" and o.key.name == "mpigate-config"
        )
        (out / "bundle.json").write_text(json.dumps(cm))
        result.update(
            files=len(bundle.files),
            plain=bundle.size,
            stored=bundle.stored,
            compressed=bundle.archive is not None,
            json=len(json.dumps(cm, separators=(",", ":"))),
            warnings=list(rendering.size_warnings),
        )
    elif kind in ("load-bundle", "load-plain"):
        from mpigate.admission.reload import ConfigStore

        cm = json.loads((out / "bundle.json").read_text())
        volume = out / kind
        if kind == "load-bundle":
            mount(cm, volume)
        else:
            from mpigate.config.bundle import bundle_files

            volume.mkdir()
            for key, text in (bundle_files(cm) or {}).items():
                (volume / key).write_text(text)
        t0 = time.perf_counter()
        loaded = asyncio.run(ConfigStore(volume).load_now())
        assert loaded is not None, "the bundle did not load"
        result["teams"] = len(loaded.config.teams)
        result["revision"] = loaded.revision
    result["seconds"] = time.perf_counter() - t0
    result["rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result


def run_step(kind: str, tree: Path, out: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--step", kind, str(tree), str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{kind} failed: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--teams", default="1000,5000")
    args = parser.parse_args()
    from mpigate.config.bundle import CONFIGMAP_DATA_LIMIT

    print(f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}; each step in a fresh process")
    rows = []
    for teams in (int(t) for t in args.teams.split(",")):
        with tempfile.TemporaryDirectory(prefix="mpigate-org-") as tmp:
            tree, out = Path(tmp) / "org", Path(tmp) / "out"
            out.mkdir()
            generate(tree, teams)
            check = run_step("check", tree, out)
            rendered = run_step("render", tree, out)
            plain = run_step("load-plain", tree, out)
            bundle = run_step("load-bundle", tree, out)
            assert check["teams"] == bundle["teams"] == plain["teams"] == teams, (check, bundle, plain)
            assert bundle["revision"] == "bench"
            rows.append((teams, check, rendered, plain, bundle))
    print()
    print(
        f"{'teams':>6} {'check s':>8} {'render s':>9} {'files':>6} {'plain KiB':>10} {'stored KiB':>11} "
        f"{'of 1 MiB':>9} {'B/team':>7} {'load plain s':>13} {'load bundle s':>14} {'RSS MiB':>8}"
    )
    for teams, check, rendered, plain, bundle in rows:
        print(
            f"{teams:>6} {check['seconds']:>8.1f} {rendered['seconds_render']:>9.1f} {rendered['files']:>6} "
            f"{rendered['plain'] / 1024:>10.0f} {rendered['stored'] / 1024:>11.0f} "
            f"{rendered['stored'] / CONFIGMAP_DATA_LIMIT:>9.0%} {rendered['plain'] / teams:>7.0f} "
            f"{plain['seconds']:>13.1f} {bundle['seconds']:>14.1f} {bundle['rss_mib']:>8.0f}"
        )
    print()
    for teams, _, rendered, _, _ in rows:
        state = "compressed" if rendered["compressed"] else "plain keys"
        print(
            f"{teams} teams: the bundle ConfigMap is {state}, {rendered['json'] / 1024:.0f} KiB as JSON; "
            f"size warnings: {rendered['warnings'] or 'none'}"
        )
    print(
        f"load average after the run: {', '.join(f'{x:.2f}' for x in os.getloadavg())} "
        "(other processes share the CPUs: times are upper bounds)"
    )


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--step":
        print(json.dumps(step(sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]))))
    else:
        main()
