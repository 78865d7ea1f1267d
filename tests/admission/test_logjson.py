"""The JSON log line's time field: written without a datetime per record, exactly as
``datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")`` writes it."""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mpigate.admission.logjson import JsonFormatter, fields, log_fields


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


@pytest.fixture
def json_logger() -> Iterator[tuple[logging.Logger, io.StringIO, list[logging.LogRecord]]]:
    """A logger set up as ``mpigate serve`` sets up the root logger (one stream handler with the
    JSON formatter), and the LogRecords made meanwhile."""
    # not registered with logging.getLogger: pytest's log capture attaches its handlers only to
    # the loggers it knows of
    logger = logging.Logger("mpigate.tests.logjson", logging.INFO)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger.addHandler(handler)
    made: list[logging.LogRecord] = []
    factory = logging.getLogRecordFactory()

    def counting(*args: Any, **kwargs: Any) -> logging.LogRecord:
        made.append(factory(*args, **kwargs))
        return made[-1]

    logging.setLogRecordFactory(counting)
    try:
        yield logger, stream, made
    finally:
        logging.setLogRecordFactory(factory)


def _lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


REVIEW_LINE = {
    "event": "review",
    "request_id": "ab01",
    "status": 200,
    "rules": ["MPG-Q001"],
    "msg": "not this one",
}


def test_log_fields_writes_the_line_logging_writes_without_a_record(
    json_logger: tuple[logging.Logger, io.StringIO, list[logging.LogRecord]],
) -> None:
    logger, stream, made = json_logger
    log_fields(logger, logging.INFO, REVIEW_LINE, "%s %s: %s", "validate", "CREATE", "allowed")
    assert made == []  # written straight to the stream
    logger.log(logging.INFO, "%s %s: %s", "validate", "CREATE", "allowed", extra={"fields": REVIEW_LINE})
    assert len(made) == 1
    fast, logged = _lines(stream)
    assert list(fast) == list(logged)  # the same keys in the same order
    assert fast["time"][:10] == logged["time"][:10]
    del fast["time"], logged["time"]
    assert fast == logged
    assert (fast["msg"], fast["level"], fast["logger"]) == ("validate CREATE: allowed", "info", logger.name)


def test_log_fields_goes_through_logging_when_anything_else_listens(
    json_logger: tuple[logging.Logger, io.StringIO, list[logging.LogRecord]],
) -> None:
    logger, stream, made = json_logger
    seen: list[logging.LogRecord] = []

    class Listening(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    listening = Listening()
    logger.addHandler(listening)  # a second handler (a test's capture, a log shipper)
    try:
        log_fields(logger, logging.INFO, REVIEW_LINE, "%s", "one")
    finally:
        logger.removeHandler(listening)
    logger.handlers[0].addFilter(lambda record: record.getMessage() != "dropped")  # a filter decides
    log_fields(logger, logging.INFO, REVIEW_LINE, "%s", "dropped")
    log_fields(logger, logging.INFO, REVIEW_LINE, "%s", "kept")
    assert [r.getMessage() for r in seen] == ["one"]
    assert [r.getMessage() for r in made] == ["one", "dropped", "kept"]
    assert [line["msg"] for line in _lines(stream)] == ["one", "kept"]
    assert all(getattr(r, "fields", None) == REVIEW_LINE for r in made)


def test_log_fields_keeps_the_levels_and_reports_a_failed_write(
    json_logger: tuple[logging.Logger, io.StringIO, list[logging.LogRecord]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    logger, stream, _ = json_logger
    log_fields(logger, logging.DEBUG, REVIEW_LINE, "below the logger's level")
    logger.handlers[0].setLevel(logging.ERROR)
    log_fields(logger, logging.WARNING, REVIEW_LINE, "below the handler's level")
    assert stream.getvalue() == ""
    stream.close()  # writing fails: the handler reports it on stderr, as logging does, and nothing raises
    log_fields(logger, logging.ERROR, REVIEW_LINE, "%s", "lost")
    assert "--- Logging error ---" in capsys.readouterr().err


def test_log_fields_reports_a_message_that_does_not_format(
    json_logger: tuple[logging.Logger, io.StringIO, list[logging.LogRecord]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    # as logging does (the message is made in the handler's emit): reported, never raised into
    # the review that logs it
    logger, stream, _ = json_logger
    log_fields(logger, logging.INFO, REVIEW_LINE, "%d reviews", "not a number")
    assert stream.getvalue() == ""
    assert "--- Logging error ---" in capsys.readouterr().err
    log_fields(logger, logging.INFO, REVIEW_LINE, "100% literal")  # no arguments: no formatting
    assert [line["msg"] for line in _lines(stream)] == ["100% literal"]
