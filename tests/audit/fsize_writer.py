"""A writer process under RLIMIT_FSIZE: the kernel refuses to grow the segment (EFBIG) until the
limit is raised again. Prints a JSON summary on stdout."""

from __future__ import annotations

import json
import resource
import signal
import sys

from mpigate.audit import AuditLog, AuditWriteError, HmacSigner


def main() -> None:
    directory, secret = sys.argv[1], sys.argv[2].encode()
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG from write() instead of dying
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    log = AuditLog.open(directory, chain="fsize", source="webhook", signer=HmacSigner(secret))
    acked = [log.append({"source": "webhook", "stage": "validate", "i": i}).seq for i in range(3)]
    segment = log.directory / "00000000000000000001.jsonl"
    resource.setrlimit(resource.RLIMIT_FSIZE, (segment.stat().st_size + 1000, hard))
    failures = []
    for i in range(3):
        try:
            log.append({"source": "webhook", "stage": "validate", "i": 100 + i, "blob": "y" * 4000})
        except AuditWriteError as exc:
            failures.append(exc.reason)
    size_after_failures = segment.stat().st_size
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    acked.append(log.append({"source": "webhook", "stage": "validate", "i": 200, "blob": "y" * 4000}).seq)
    log.close()
    print(json.dumps({"failures": failures, "acked": acked, "size_after_failures": size_after_failures}))


if __name__ == "__main__":
    main()
