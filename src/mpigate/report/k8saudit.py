"""Kubernetes API-server audit logs (``audit.k8s.io/v1`` ``Event`` JSON lines) as report input.

The log backend of kube-apiserver writes one ``Event`` per line; rotated files may be gzipped.
``v1beta1`` events (``timestamp`` instead of ``requestReceivedTimestamp``) and events without an
``apiVersion`` are accepted too, as are ``EventList`` lines (the webhook backend's batches).

:class:`K8sAuditReader` streams one file and yields only what a compliance report uses, as
:class:`ApiEvent` values:

- writes (create, update, patch, delete, deletecollection) of TrainJobs, TrainingRuntimes and
  ClusterTrainingRuntimes — who (user, service account, or someone impersonating them), what,
  the response code and mpigate's ``auditAnnotations`` (``<webhook name>/decision``, ...), with
  the chain positions of the decisions' audit records (``<webhook name>/record``) as
  :attr:`ApiEvent.positions`;
- requests the authorizer refused (``authorization.k8s.io/decision: forbid``) — RBAC denials.

Everything else is counted, not kept. Only the ``ResponseComplete`` and ``Panic`` stages count
(a policy that also logs ``RequestReceived`` would otherwise count each request twice). A line
that is not an audit event is counted as malformed, with the first such line's number and why;
it never stops the report.

The reader's :attr:`K8sAuditReader.witness` collects the newest chain position seen per chain and
how far the log runs: what ``mpigate audit verify --k8s-audit`` and the report check the chains
against (:mod:`mpigate.audit.witness`).
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import IO, Any, NamedTuple, cast

from mpigate.audit._canonical import format_time, parse_time
from mpigate.audit.reader import parse_json_object
from mpigate.audit.witness import POSITION_ANNOTATION, Position, Witness

__all__ = [
    "TRAINER_RESOURCES",
    "WRITE_VERBS",
    "ApiEvent",
    "K8sAuditReader",
    "K8sAuditStats",
    "actor_kind",
    "exempt_from_webhook",
    "normalize_time",
]

TRAINER_GROUP = "trainer.kubeflow.org"
TRAINER_RESOURCES: Mapping[str, str] = MappingProxyType(
    {
        "trainjobs": "TrainJob",
        "trainingruntimes": "TrainingRuntime",
        "clustertrainingruntimes": "ClusterTrainingRuntime",
    }
)
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
_COUNTED_STAGES = frozenset({"ResponseComplete", "Panic", ""})
_API_VERSIONS = frozenset({"audit.k8s.io/v1", "audit.k8s.io/v1beta1", "audit.k8s.io/v1alpha1", ""})
# mpigate's auditAnnotations as the API server records them: "<webhook name>/<key>" (the webhook
# names end in .mpigate.io, see webhooks/base/webhookconfigurations.yaml); "mpigate.io/<key>"
# after the webhook name is accepted too.
_MPIGATE_ANNOTATION = re.compile(
    r"^(?P<webhook>[^/]*mpigate[^/]*)/(?:mpigate\.io/)?"
    r"(?P<key>decision|rules|revision|exceptions|dry-run|patch|record)$"
)
_FAST_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.(\d+))?Z$")
_MAX_REASON = 200


def normalize_time(text: str) -> str:
    """An RFC 3339 time as mpigate records write it (UTC, milliseconds), so that API-server
    events and audit records compare as strings. ValueError when it is not a time."""
    match = _FAST_TIME.match(text)
    if len(text) == 10:  # a date: midnight UTC
        return format_time(parse_time(text))
    if match:  # the API server's own format: only the fraction needs adjusting
        fraction = (match.group(1) or "")[:3].ljust(3, "0")
        return f"{text[:19]}.{fraction}Z"
    return format_time(parse_time(text))


def actor_kind(username: str) -> str:
    """``serviceaccount``, ``node``, ``system`` (other ``system:`` identities) or ``user``."""
    if username.startswith("system:serviceaccount:"):
        return "serviceaccount"
    if username.startswith("system:node:"):
        return "node"
    if username.startswith("system:"):
        return "system"
    return "user"


# Identities the validating webhooks' matchConditions leave out on purpose (nodes, system
# identities, kube-system, and the controllers that update TrainJobs after admission) — keep in
# step with webhooks/base/webhookconfigurations.yaml.
_EXEMPT_SA_PREFIXES = tuple(
    f"system:serviceaccount:{ns}:"
    for ns in ("kube-system", "kueue-system", "kubeflow-system", "mpigate-system")
)


def exempt_from_webhook(username: str, groups: tuple[str, ...]) -> bool:
    """Whether mpigate's webhooks do not judge requests of this identity by design."""
    if "system:nodes" in groups:
        return True
    if username.startswith("system:") and not username.startswith("system:serviceaccount:"):
        return True
    return username.startswith(_EXEMPT_SA_PREFIXES)


class ApiEvent(NamedTuple):
    """One API-server request a report uses. ``username``/``groups`` are who authenticated;
    ``impersonated`` is who they acted as (the effective identity, when set). A named tuple: a
    cluster's audit log has millions of events and tuples are the cheapest to build."""

    time: str
    audit_id: str
    verb: str
    username: str
    groups: tuple[str, ...]
    impersonated: str | None
    impersonated_groups: tuple[str, ...]
    resource: str
    subresource: str
    api_group: str
    namespace: str | None
    name: str | None
    code: int | None
    authorization: str
    authorization_reason: str
    mpigate: Mapping[str, str]
    file: str
    line: int
    # the audit records of mpigate's decisions on this request (mutate and validate), from the
    # ``<webhook name>/record`` annotations
    positions: tuple[Position, ...] = ()

    @property
    def actor(self) -> str:
        """The effective identity: the impersonated user, else the authenticated one."""
        return self.impersonated or self.username

    @property
    def actor_groups(self) -> tuple[str, ...]:
        return self.impersonated_groups if self.impersonated else self.groups

    @property
    def kind(self) -> str:
        return TRAINER_RESOURCES.get(self.resource, self.resource)

    @property
    def is_trainer_write(self) -> bool:
        return (
            self.api_group == TRAINER_GROUP
            and self.resource in TRAINER_RESOURCES
            and self.verb in WRITE_VERBS
            and not self.subresource
        )

    @property
    def rbac_denied(self) -> bool:
        return self.authorization == "forbid"

    @property
    def succeeded(self) -> bool:
        return self.code is not None and self.code < 400

    @property
    def mpigate_decision(self) -> str | None:
        return self.mpigate.get("decision")


@dataclass(slots=True)
class K8sAuditStats:
    """What was read from one file."""

    file: str
    lines: int = 0
    events: int = 0
    used: int = 0
    other: int = 0
    other_stages: int = 0
    malformed: int = 0
    first_malformed_line: int | None = None
    first_malformed_reason: str | None = None
    unreadable: str | None = None
    first_time: str | None = None
    last_time: str | None = None
    witness: Witness = field(default_factory=Witness, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "lines": self.lines,
            "events": self.events,
            "used": self.used,
            "other": self.other,
            "otherStages": self.other_stages,
            "malformed": self.malformed,
            "firstMalformed": (
                {"line": self.first_malformed_line, "reason": self.first_malformed_reason}
                if self.first_malformed_line is not None
                else None
            ),
            "unreadable": self.unreadable,
            "from": self.first_time,
            "to": self.last_time,
        }


def _groups(value: Any) -> tuple[str, ...]:
    return tuple(map(str, value)) if type(value) is list else ()


class K8sAuditReader:
    """Iterate the events of one audit log file that a report uses; ``stats`` is complete after
    the iteration. Memory does not grow with the file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._file = str(self.path)
        self.stats = K8sAuditStats(file=self._file)
        self.witness = self.stats.witness
        self._latest = ""  # the newest event time seen (as written)

    def _malformed(self, line: int, reason: str) -> None:
        stats = self.stats
        stats.malformed += 1
        if stats.first_malformed_line is None:
            stats.first_malformed_line = line
            stats.first_malformed_reason = reason[:_MAX_REASON]

    def _open(self) -> IO[bytes]:
        with self.path.open("rb") as probe:
            magic = probe.read(2)
        if magic == b"\x1f\x8b":
            return cast(IO[bytes], gzip.open(self.path, "rb"))
        return self.path.open("rb")

    def __iter__(self) -> Iterator[ApiEvent]:
        stats = self.stats
        try:
            fh = self._open()
        except OSError as exc:
            stats.unreadable = f"cannot read: {exc.strerror or exc}"
            return
        with fh:
            try:
                for lineno, raw in enumerate(fh, start=1):
                    stats.lines = lineno
                    body = raw.strip()
                    if not body:
                        continue
                    data = parse_json_object(body)
                    if data is None:
                        self._malformed(lineno, "not a JSON object")
                        continue
                    if data.get("kind") == "EventList" and isinstance(data.get("items"), list):
                        items = data["items"]
                    else:
                        items = [data]
                    for item in items:
                        event = self._event(item, lineno)
                        if event is not None:
                            yield event
            except (OSError, EOFError, gzip.BadGzipFile) as exc:
                stats.unreadable = f"read error after line {stats.lines}: {exc}"
        if self._latest:
            self.witness.saw(normalize_time(self._latest))

    def _event(self, data: Any, lineno: int) -> ApiEvent | None:
        # The hot path of a cluster-wide log: most events are reads of other resources, so they
        # are recognised and counted with a few dict lookups before anything else is built.
        stats = self.stats
        if type(data) is not dict:
            self._malformed(lineno, "an EventList item is not an object")
            return None
        get = data.get
        api_version = get("apiVersion", "")
        kind = get("kind", "Event")
        if kind != "Event" or api_version not in _API_VERSIONS:
            self._malformed(lineno, f"not an audit.k8s.io Event (apiVersion {api_version!r}, kind {kind!r})")
            return None
        verb = get("verb")
        user = get("user")
        stamp = get("requestReceivedTimestamp") or get("timestamp") or get("stageTimestamp")
        if type(verb) is not str or type(user) is not dict or type(stamp) is not str:
            self._malformed(lineno, "an audit event needs verb, user and requestReceivedTimestamp")
            return None
        if not _FAST_TIME.match(stamp):  # not the API server's own format: must still be a time
            try:
                stamp = normalize_time(stamp)
            except ValueError:
                self._malformed(lineno, f"bad timestamp {stamp!r}")
                return None
        if stamp > self._latest:
            self._latest = stamp
        stats.events += 1
        if get("stage", "") not in _COUNTED_STAGES:
            stats.other_stages += 1
            return None
        ref = get("objectRef")
        if type(ref) is not dict:
            ref = {}
        annotations = get("annotations")
        if type(annotations) is not dict:
            annotations = {}
        authorization = annotations.get("authorization.k8s.io/decision", "")
        resource = ref.get("resource", "")
        trainer_write = resource in TRAINER_RESOURCES and verb in WRITE_VERBS and not ref.get("subresource")
        if authorization != "forbid" and not (trainer_write and ref.get("apiGroup") == TRAINER_GROUP):
            stats.other += 1
            return None
        time = normalize_time(stamp)
        stats.used += 1
        if stats.first_time is None or time < stats.first_time:
            stats.first_time = time
        if stats.last_time is None or time > stats.last_time:
            stats.last_time = time
        status = get("responseStatus")
        code = status.get("code") if type(status) is dict else None
        impersonated = get("impersonatedUser")
        if type(impersonated) is not dict:
            impersonated = {}
        mpigate: dict[str, str] = {}
        positions: list[Position] = []
        for key, value in annotations.items():
            if "mpigate" not in key:
                continue
            match = _MPIGATE_ANNOTATION.match(key)
            if match:
                name = match.group("key")
                if name == POSITION_ANNOTATION:  # every webhook's record is a witnessed position
                    position = self.witness.add(str(value), time, self._file, lineno)
                    if position is not None:
                        positions.append(position)
                # the validating webhook's verdict wins over the mutating one's (which has none)
                if name not in mpigate or match.group("webhook").startswith("validate"):
                    mpigate[name] = str(value)
        namespace = ref.get("namespace")
        name = ref.get("name")
        return ApiEvent(
            time,
            str(get("auditID", "")),
            verb,
            str(user.get("username", "")),
            _groups(user.get("groups")),
            str(impersonated["username"]) if impersonated.get("username") else None,
            _groups(impersonated.get("groups")),
            str(resource),
            str(ref.get("subresource", "")),
            str(ref.get("apiGroup", "")),
            str(namespace) if namespace else None,
            str(name) if name else None,
            code if type(code) is int else None,
            str(authorization),
            str(annotations.get("authorization.k8s.io/reason", ""))[:_MAX_REASON],
            mpigate,
            self._file,
            lineno,
            tuple(positions),
        )
