"""A real writer process for the kill -9 test: appends under load from several threads and
prints ``ACK <seq> <hash>`` for every acknowledged record (after append returned)."""

from __future__ import annotations

import sys
import threading

from mpigate.audit import AuditLog, HmacSigner, WriterOptions


def main() -> None:
    directory, secret, payload = sys.argv[1], sys.argv[2].encode(), int(sys.argv[3])
    log = AuditLog.open(
        directory,
        chain="crash",
        source="webhook",
        signer=HmacSigner(secret),
        options=WriterOptions(checkpoint_every=50, rotate_max_bytes=8 * 1024 * 1024),
    )
    out_lock = threading.Lock()

    def worker(n: int) -> None:
        i = 0
        while True:
            i += 1
            written = log.append(
                {"source": "webhook", "stage": "validate", "worker": n, "i": i, "blob": "x" * payload}
            )
            with out_lock:
                sys.stdout.write(f"ACK {written.seq} {written.hash}\n")
                sys.stdout.flush()

    for n in range(8):
        threading.Thread(target=worker, args=(n,), daemon=True).start()
    threading.Event().wait()


if __name__ == "__main__":
    main()
