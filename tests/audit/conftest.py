"""Fixtures for the audit trail tests: keys, writers and small chains."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mpigate.audit import AuditLog, HmacSigner, KeyRing, WriterOptions, generate_key, load_signer

HMAC_SECRET = b"0123456789abcdef0123456789abcdef"
# No age checkpoint in tests that count records: a stall of the machine must not add one.
QUIET = 24 * 3600.0


@pytest.fixture
def hmac_key_file(tmp_path: Path) -> Path:
    path = tmp_path / "keys" / "hmac.key"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(HMAC_SECRET + b"\n")
    return path


@pytest.fixture
def ed25519_files(tmp_path: Path) -> tuple[Path, Path]:
    private, public = generate_key("ed25519")
    assert public is not None
    keys = tmp_path / "keys"
    keys.mkdir(exist_ok=True)
    (keys / "ed.pem").write_bytes(private)
    (keys / "ed.pub").write_bytes(public)
    return keys / "ed.pem", keys / "ed.pub"


@pytest.fixture
def signer() -> HmacSigner:
    return HmacSigner(HMAC_SECRET)


@pytest.fixture
def keyring(hmac_key_file: Path) -> KeyRing:
    return KeyRing.load([hmac_key_file])


def entry(i: int, **extra: Any) -> dict[str, Any]:
    """A small validate entry numbered ``i``."""
    return {
        "source": "webhook",
        "stage": "validate",
        "team": "nlp-team" if i % 2 == 0 else "cv-team",
        "object": {"kind": "TrainJob", "namespace": "nlp-team", "name": f"job-{i}"},
        "decision": "allowed",
        "violations": [],
        "i": i,
        **extra,
    }


@pytest.fixture
def make_log(tmp_path: Path, signer: HmacSigner) -> Iterator[Callable[..., AuditLog]]:
    """Open writers on ``tmp_path/audit`` (closed at teardown if the test did not)."""
    opened: list[AuditLog] = []

    def factory(chain: str = "test-0", directory: Path | None = None, **options: Any) -> AuditLog:
        sign = options.pop("signer", signer)
        metrics = options.pop("metrics", None)
        options.setdefault("checkpoint_interval_seconds", QUIET)
        log = AuditLog.open(
            directory or tmp_path / "audit",
            chain=chain,
            source="webhook",
            signer=sign,
            options=WriterOptions(**options),
            metrics=metrics,
        )
        opened.append(log)
        return log

    yield factory
    for log in opened:
        log.close()


def write_chain(
    directory: Path,
    records: int,
    *,
    chain: str = "test-0",
    make: Callable[[int], dict[str, Any]] | None = None,
    **options: Any,
) -> Path:
    """A closed chain of ``records`` entries (``make(i)``, default :func:`entry`, plus genesis and
    checkpoints); returns the chain dir."""
    make = make or entry
    signer = options.pop("signer", HmacSigner(HMAC_SECRET))
    options.setdefault("checkpoint_interval_seconds", QUIET)
    with AuditLog.open(
        directory, chain=chain, source="webhook", signer=signer, options=WriterOptions(**options)
    ) as log:
        for i in range(records):
            log.append(make(i))
    return directory / chain


def ed_signer(path: Path) -> Any:
    return load_signer("ed25519", path)


def lines_of(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)
