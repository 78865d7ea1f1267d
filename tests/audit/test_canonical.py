"""Properties of the hash chain: whatever JSON an entry carries, the line on disk is its canonical
encoding, its hash verifies by re-encoding, and the chain links."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mpigate.audit import AuditLog, HmacSigner, WriterOptions
from mpigate.audit._canonical import canonical_bytes, format_time, parse_time, record_hash
from mpigate.audit.reader import verify_chain

from .conftest import HMAC_SECRET, QUIET

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**60), 2**60)
    | st.text(max_size=20)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
payload_keys = st.text(min_size=1, max_size=10).filter(
    lambda k: k not in {"v", "seq", "time", "chain", "prev", "hash", "source", "stage"}
)
entries = st.dictionaries(payload_keys, json_values, max_size=5).map(
    lambda d: {"source": "webhook", "stage": "evidence", **d}
)


def test_lines_are_canonical_and_chained(tmp_path: Path, keyring) -> None:
    # No age checkpoint between the appends (a stall of a busy machine past the 10 s interval
    # added one, and the next record's prev was the checkpoint's hash).
    log = AuditLog.open(
        tmp_path / "audit",
        chain="prop",
        signer=HmacSigner(HMAC_SECRET),
        options=WriterOptions(checkpoint_interval_seconds=QUIET),
    )
    previous = [log.head[1]]

    @settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(entry=entries)
    def check(entry: dict[str, Any]) -> None:
        written = log.append(entry)
        line = (log.directory / written.segment).read_bytes().splitlines()[written.line - 1]
        record = json.loads(line)
        assert line == canonical_bytes(record)
        assert record_hash(record) == record["hash"] == written.hash
        assert record["prev"] == previous[0]
        assert {k: v for k, v in record.items() if k in entry} == json.loads(json.dumps(entry))
        previous[0] = written.hash

    check()
    log.close()
    report = verify_chain(tmp_path / "audit" / "prop", keyring)
    assert report.ok, report.problems


@given(st.datetimes(timezones=st.just(__import__("datetime").UTC)))
def test_time_round_trips_to_the_millisecond(moment) -> None:  # type: ignore[no-untyped-def]
    text = format_time(moment)
    assert text.endswith("Z") and len(text) == 24
    back = parse_time(text)
    assert abs((back - moment).total_seconds()) < 0.001
