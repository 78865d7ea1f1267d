"""Issue 21 item 1, the audit key trap: a key that does not suit the org's signing method is refused
where it is loaded (serve, controller), `keygen --config` makes the one the org needs, and `verify
--key` takes the signing key whatever its method."""

from __future__ import annotations

from pathlib import Path

import pytest
import trustme
from click.testing import CliRunner, Result

from mpigate.audit import AuditKeyError, AuditLog, generate_key, load_signer
from mpigate.cli import cli
from tests.admission.conftest import write_cert

from .conftest import entry


def _run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """The example org (which signs with ed25519)."""
    root = tmp_path / "org"
    assert _run("init", str(root), "--example").exit_code == 0
    return root


def _with_method(tree: Path, method: str) -> Path:
    org = tree / "policies" / "org.yaml"
    text = org.read_text(encoding="utf-8")
    assert "method: ed25519" in text
    org.write_text(text.replace("method: ed25519", f"method: {method}"), encoding="utf-8")
    return tree


def _serve(tree: Path, key: Path, tmp_path: Path) -> Result:
    cert, tls_key = write_cert(trustme.CA(), tmp_path / "certs")
    return _run(
        "serve", "--config", str(tree), "--tls-cert", str(cert), "--tls-key", str(tls_key),
        "--host", "127.0.0.1", "--port", "0", "--no-live",
        "--audit-dir", str(tmp_path / "audit"), "--audit-key", str(key),
    )  # fmt: skip


def test_serve_refuses_a_pem_key_as_an_hmac_secret(tree: Path, tmp_path: Path) -> None:
    _with_method(tree, "hmac-sha256")
    key = tmp_path / "audit.key"
    assert _run("audit", "keygen", str(key), "--public", str(tmp_path / "audit.pub")).exit_code == 0
    result = _serve(tree, key, tmp_path)
    assert result.exit_code == 2, result.output
    assert "holds a PEM key" in result.output and "the signing method is hmac-sha256" in result.output
    assert "spec.audit.signing.method: ed25519" in result.output  # and how to fix it
    assert not (tmp_path / "audit").exists() or not any((tmp_path / "audit").iterdir())


def test_serve_refuses_an_hmac_secret_as_an_ed25519_key(tree: Path, tmp_path: Path) -> None:
    key = tmp_path / "audit.key"
    assert _run("audit", "keygen", "--method", "hmac-sha256", str(key)).exit_code == 0
    result = _serve(tree, key, tmp_path)
    assert result.exit_code == 2, result.output
    assert "is no PEM key (an HMAC secret?), but the signing method is ed25519" in result.output


def test_load_signer_refuses_the_wrong_kind_of_key(tmp_path: Path) -> None:
    pem, _ = generate_key("ed25519")
    secret, _ = generate_key("hmac-sha256")
    (tmp_path / "pem").write_bytes(pem)
    (tmp_path / "secret").write_bytes(secret)
    with pytest.raises(AuditKeyError, match="holds a PEM key"):
        load_signer("hmac-sha256", tmp_path / "pem")
    with pytest.raises(AuditKeyError, match="is no PEM key"):
        load_signer("ed25519", tmp_path / "secret")
    assert load_signer("ed25519", tmp_path / "pem").alg == "ed25519"
    assert load_signer("hmac-sha256", tmp_path / "secret").alg == "hmac-sha256"


@pytest.mark.parametrize("method", ["ed25519", "hmac-sha256"])
def test_keygen_takes_the_method_from_the_config(tree: Path, tmp_path: Path, method: str) -> None:
    _with_method(tree, method) if method != "ed25519" else tree
    key = tmp_path / "audit.key"
    result = _run("audit", "keygen", str(key), "--config", str(tree))
    assert result.exit_code == 0, result.output
    assert f"wrote {method} key to {key}" in result.output
    assert load_signer(method, key).alg == method  # what serve will load
    assert (Path(f"{key}.pub").exists()) == (method == "ed25519")


def test_keygen_refuses_a_method_that_contradicts_the_config(tree: Path, tmp_path: Path) -> None:
    result = _run("audit", "keygen", str(tmp_path / "k"), "--config", str(tree), "--method", "hmac-sha256")
    assert result.exit_code == 2
    assert "contradicts the OrgPolicy" in result.output and "signs with ed25519" in result.output
    assert not (tmp_path / "k").exists()


def test_keygen_with_a_broken_config_says_why(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    result = _run("audit", "keygen", str(tmp_path / "k"), "--config", str(tmp_path / "empty"))
    assert result.exit_code == 2 and "not an mpigate config tree" in result.output
    assert not (tmp_path / "k").exists()


def test_verify_takes_the_ed25519_signing_key_with_key(tmp_path: Path) -> None:
    key = tmp_path / "audit.key"
    assert _run("audit", "keygen", str(key)).exit_code == 0
    with AuditLog.open(tmp_path / "audit", chain="c", signer=load_signer("ed25519", key)) as log:
        log.append(entry(1))
    for option in ("--key", "--public-key"):
        path = key if option == "--key" else Path(f"{key}.pub")
        result = _run("audit", "verify", str(tmp_path / "audit"), option, str(path))
        assert result.exit_code == 0, result.output
        assert "signatures:      verified" in result.output
