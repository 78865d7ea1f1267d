"""The JSON log line's time field: written without a datetime per record, exactly as
``datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")`` writes it."""

from __future__ import annotations

import datetime as dt
import json
import logging

from hypothesis import given
from hypothesis import strategies as st

from mpigate.admission.logjson import JsonFormatter, fields


def _record(created: float) -> logging.LogRecord:
    record = logging.LogRecord("mpigate.admission", logging.INFO, __file__, 1, "%s done", ("review",), None)
    record.created = created
    record.fields = {"event": "review", "msg": "not this one"}
    return record


@given(st.floats(min_value=0, max_value=4e9, allow_nan=False, allow_infinity=False))
def test_the_time_is_the_datetime_text_of_the_record(created: float) -> None:
    line = json.loads(JsonFormatter().format(_record(created)))
    assert line["time"] == dt.datetime.fromtimestamp(created, dt.UTC).isoformat(timespec="milliseconds")


def test_records_within_a_second_and_across_seconds_keep_their_own_time() -> None:
    formatter = JsonFormatter()
    # rounding to microseconds carries into the next second, as datetime does
    for created in (1764122711.25, 1764122711.9999996, 1764122712.0004995, 1764122711.5, 1137795672.1649995):
        line = json.loads(formatter.format(_record(created)))
        assert line["time"] == dt.datetime.fromtimestamp(created, dt.UTC).isoformat(timespec="milliseconds")
        # the record's own fields never replace the line's
        assert (line["msg"], line["event"], line["level"]) == ("review done", "review", "info")


def test_fields_are_the_extra_of_a_log_call() -> None:
    assert fields(a=1) == {"fields": {"a": 1}}
