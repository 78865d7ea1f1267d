"""The controller's durable state (pure): pod facts in the job's annotation, the ledger ConfigMap,
and what the API shows of container restarts. Hostile or broken values read as absent, never as
a crash."""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import gzip
import json
import secrets
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mpigate.controller.jobstate import decode_pods, encode_pods, seal_payload
from mpigate.controller.ledger import LEDGER_KEY, MAX_LEDGER_BYTES, LedgerEntry, decode, encode
from mpigate.controller.usage import PodFacts, charge, container_runs, split_by_day

T0 = dt.datetime(2026, 11, 22, 10, 0, tzinfo=dt.UTC)


def at(minutes: float) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes)


FACTS = [
    PodFacts("u1", "job-node-0-0-a", "node", "gpu-eu-1", 8, start=at(1), end=at(31), ended="finished"),
    PodFacts(
        "u2",
        "job-launcher-0-0-b",
        "launcher",
        "gpu-eu-2",
        8,
        spec_gpus=4,
        start=at(0),
        start_range=(at(0), at(3)),
        end=at(20),
        end_range=(at(10), at(20)),
        ended="segment-closed",
        gone=True,
        not_ready_at=at(19),
    ),
    PodFacts("u3", "job-node-0-1-c", "node", None, 8),
]


def test_pod_facts_round_trip_through_the_annotation() -> None:
    text = encode_pods(FACTS, at(40))
    pods, seen = decode_pods(text)
    assert seen == at(40)
    assert pods == {p.uid: p for p in FACTS}
    assert len(text) < 600  # it lives in an annotation


@pytest.mark.parametrize(
    "text",
    [
        None,
        "",
        "not json",
        "[1, 2]",
        '{"pods": 3}',
        '{"pods": {"u": "x"}}',
        '{"pods": {"u": {"n": "p"}}}',  # no GPUs
        '{"pods": {"u": {"n": "p", "g": -1}}}',
        '{"pods": {"u": {"n": "p", "g": true}}}',
        '{"pods": {"u": {"n": 5, "g": 8}}}',
    ],
)
def test_unreadable_pod_facts_are_left_out(text: Any) -> None:
    assert decode_pods(text)[0] == {}


def test_odd_values_inside_a_pod_entry_read_as_absent() -> None:
    text = json.dumps(
        {
            "seen": "yesterday",
            "pods": {
                "u": {"n": "p", "g": 8, "s": 12, "e": "2026-13-01", "er": ["x"], "h": "evicted", "x": "yes"}
            },
        }
    )
    pods, seen = decode_pods(text)
    assert seen is None
    assert pods == {"u": PodFacts("u", "p", gpus=8)}


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda c: st.lists(c) | st.dictionaries(st.text(), c),
)


@given(JSON)
def test_any_json_in_the_annotation_never_raises(value: Any) -> None:
    decode_pods(json.dumps(value))
    decode_pods(json.dumps({"pods": {"u": value}}))


def test_the_seal_covers_the_uid_and_every_state_annotation() -> None:
    values = {"mpigate.io/lifecycle": "admitted@2026-11-22T10:00:00Z", "mpigate.io/pods": "{}"}
    base = seal_payload("uid-1", values)
    assert seal_payload("uid-2", values) != base
    assert seal_payload("uid-1", {**values, "mpigate.io/evidence": "p"}) != base
    assert seal_payload("uid-1", {**values, "mpigate.io/pods": None}) != base
    assert seal_payload("uid-1", {**values, "other": "x"}) == base


def entry(uid: str, pods: str = "") -> LedgerEntry:
    return LedgerEntry(
        kind="TrainJob",
        namespace="nlp-team",
        name=f"job-{uid}",
        uid=uid,
        team="nlp-team",
        labels={"mpigate.io/cost-center": "cc-4711"},
        gpus=16,
        history="admitted@2026-11-22T10:00:00Z",
        pods=pods,
        evidence="a,b",
    )


def test_the_ledger_round_trips_and_keeps_each_entrys_own_time() -> None:
    old = dataclasses.replace(entry("u2"), seen=at(5))
    data, dropped = encode([entry("u1", encode_pods(FACTS, at(9))), old], at(10))
    assert dropped == 0
    found, written = decode({"binaryData": data})
    assert written == at(10)
    assert found["u1"] == dataclasses.replace(entry("u1", encode_pods(FACTS, at(9))), seen=at(10))
    assert found["u2"].seen == at(5)  # not confirmed again just because the ledger was rewritten


def test_a_ledger_too_large_leaves_out_the_largest_pods_first() -> None:
    # incompressible pod facts, so that the compressed ledger exceeds a ConfigMap
    big = [entry(f"u{i}", secrets.token_hex(60_000)) for i in range(12)]
    data, dropped = encode([*big, entry("small", "{}")], at(10))
    assert 0 < dropped < 12
    assert len(base64.b64decode(data[LEDGER_KEY])) <= MAX_LEDGER_BYTES
    found, _ = decode({"binaryData": data})
    assert len(found) == 13 and found["small"].pods == "{}"  # every job is still named


@pytest.mark.parametrize(
    "configmap",
    [
        None,
        {},
        {"binaryData": {LEDGER_KEY: "not base64!"}},
        {"binaryData": {LEDGER_KEY: base64.b64encode(b"not gzip").decode()}},
        {"binaryData": {LEDGER_KEY: base64.b64encode(gzip.compress(b"[1]")).decode()}},
        {"binaryData": {LEDGER_KEY: base64.b64encode(gzip.compress(b'{"version": 2, "jobs": {}}')).decode()}},
        {
            "binaryData": {
                LEDGER_KEY: base64.b64encode(
                    gzip.compress(
                        json.dumps({"version": 1, "jobs": {"u": {"kind": "TrainJob"}, "v": 3}}).encode()
                    )
                ).decode()
            }
        },
    ],
)
def test_an_unreadable_ledger_reads_as_empty(configmap: Any) -> None:
    assert decode(configmap)[0] == {}


def test_a_ledger_bomb_is_not_inflated() -> None:
    bomb = gzip.compress(b'{"version": 1, "jobs": {' + b" " * (80 * 1024 * 1024) + b"}}")
    assert decode({"binaryData": {LEDGER_KEY: base64.b64encode(bomb).decode()}}) == ({}, None)


def status(*containers: Any) -> Any:
    return {"status": {"containerStatuses": list(containers)}}


def test_restarts_the_api_no_longer_shows() -> None:
    run = {"startedAt": "2026-11-22T10:10:00Z"}
    last = {"terminated": {"startedAt": "2026-11-22T10:05:00Z", "finishedAt": "2026-11-22T10:09:50Z"}}
    # one restart: both runs are shown
    assert container_runs(status({"restartCount": 1, "state": {"running": run}, "lastState": last}))[3] == 0
    # three restarts: four runs, two shown
    assert container_runs(status({"restartCount": 3, "state": {"running": run}, "lastState": last}))[3] == 2
    # in back-off after the second run: the last run shown, the first not
    assert container_runs(status({"restartCount": 1, "state": {"waiting": {}}, "lastState": last}))[3] == 1
    # never ran
    assert container_runs(status({"restartCount": 0, "state": {"waiting": {}}}))[3] == 0
    assert container_runs({"status": "odd"}) == ([], [], False, 0)


def test_split_by_day_cuts_at_utc_midnight() -> None:
    start = dt.datetime(2026, 11, 22, 23, 0, tzinfo=dt.UTC)
    assert split_by_day(start, start + dt.timedelta(hours=26)) == [
        ("2026-11-22", 3600.0),
        ("2026-11-23", 86400.0),
        ("2026-11-24", 3600.0),
    ]
    assert split_by_day(start, start) == []


def test_charge_ranges_and_steps() -> None:
    used = charge(FACTS, None, at(30))
    # u1: 8 × 29 min; u2: 8 × 20 min charged, between 8 × 7 and 8 × 20; u3 never ran
    assert used.gpu_seconds == 8 * 29 * 60 + 8 * 20 * 60
    assert (used.minimum, used.maximum) == (8 * 29 * 60 + 8 * 7 * 60, 8 * 29 * 60 + 8 * 20 * 60)
    assert used.basis == "inferred" and used.pods == 2
    assert used.usage == ((at(0), 8), (at(1), 16), (at(20), 8), (at(30), 0))
    assert used.spec_mismatches == (("job-launcher-0-0-b", 8, 4),)
