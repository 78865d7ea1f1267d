"""docs/getting-started.md's `check` examples are what `check` prints for the edits it describes."""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from mpigate.cli import cli
from tests.conftest import REPO

GUIDE = REPO / "docs" / "getting-started.md"


def _blocks_after(marker: str) -> list[str]:
    """The lines of the first fenced block after ``marker`` in the guide."""
    text = GUIDE.read_text(encoding="utf-8")
    after = text.split(marker, 1)[1]
    block = re.search(r"```\n(.*?)```", after, re.S)
    assert block is not None, marker
    return block.group(1).splitlines()


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    runner = CliRunner()
    root = tmp_path / "acme-config"
    for args in (["--org", "acme", "--team", "nlp-team"], ["--team", "cv-team", "--namespace", "cv-team"]):
        result = runner.invoke(cli, ["init", str(root), *args])
        assert result.exit_code == 0, result.output
    return root


def _check(root: Path) -> list[str]:
    result = CliRunner().invoke(cli, ["check", str(root)])
    assert result.exit_code == 1, result.output
    return [line.replace(f"{root}/", "") for line in result.output.splitlines()]


def test_schema_mistakes_example(tree: Path) -> None:
    quota = tree / "quotas" / "cv-team.yaml"
    _edit(quota, "{nominal: 8,", '{nominal: "16",')
    _edit(quota, "maxNodesPerJob:", "maxNodesPerJb:")
    _edit(tree / "rbac" / "cv-team.yaml", "team: cv-team", "team: cv-teem")
    assert _check(tree) == _blocks_after("and `check` says:")


def test_namespace_clash_example(tree: Path) -> None:
    _edit(tree / "quotas" / "cv-team.yaml", "namespaces: [cv-team]", "namespaces: [cv-team, nlp-team]")
    expected = _blocks_after("adding `nlp-team` to cv-team's namespaces shows:")
    assert expected and all(line in _check(tree) for line in expected)


def _commands(marker: str) -> list[list[str]]:
    """The shell commands of the first ```bash block after ``marker``: continuation lines joined,
    comments dropped."""
    text = GUIDE.read_text(encoding="utf-8").split(marker, 1)[1]
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block is not None, marker
    joined = block.group(1).replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in joined.splitlines() if line.strip()]


def _listening_url(log: Path, server: subprocess.Popen[bytes]) -> str:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
            if '"listening"' in line:
                return str(json.loads(line)["url"])
        assert server.poll() is None, log.read_text(encoding="utf-8")
        time.sleep(0.1)
    raise AssertionError(f"the webhook did not start: {log.read_text(encoding='utf-8')}")


def test_the_local_webhook_by_hand_leaves_a_verified_trail(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 21 item 1: the guide's commands, run as written (only the port is chosen at run time
    and the server listens on loopback), give a trail that `audit verify` calls verified."""
    monkeypatch.chdir(tmp_path)
    commands = _commands("example. By hand:")
    assert [c[:3] for c in commands if c[0] == "mpigate"][1] == ["mpigate", "audit", "keygen"]
    runner = CliRunner()
    server: subprocess.Popen[bytes] | None = None
    url = ""
    try:
        for argv in commands:
            if argv == ["kill", "%1"]:
                assert server is not None
                server.send_signal(signal.SIGTERM)
                assert server.wait(60) == 0
                continue
            assert argv[0] == "mpigate", argv
            args = argv[1:]
            if args[-1] == "&":
                log = tmp_path / "serve.log"
                with log.open("wb") as sink:
                    server = subprocess.Popen(
                        [sys.executable, "-m", "mpigate", *args[:-1], "--host", "127.0.0.1", "--port", "0"],
                        stdout=subprocess.DEVNULL,
                        stderr=sink,
                    )
                url = _listening_url(log, server)
                continue
            args = [url if a == "https://127.0.0.1:8443" else a for a in args]
            result = runner.invoke(cli, args)
            if args[0] == "review":
                assert result.exit_code in (0, 1), result.output  # allowed or denied: judged
            else:
                assert result.exit_code == 0, (args, result.output)
    finally:
        if server is not None and server.poll() is None:
            server.kill()
            server.wait(30)
    assert args[:2] == ["audit", "verify"], "the block ends by verifying the trail"
    assert "all verified" in result.output and "sealed by its shutdown checkpoint" in result.output
    assert "signatures:      verified" in result.output
