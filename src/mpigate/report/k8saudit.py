"""Kubernetes API-server audit logs (``audit.k8s.io/v1`` ``Event`` JSON lines) as report input.

The log backend of kube-apiserver writes one ``Event`` per line; rotated files may be gzipped.
``v1beta1`` events (``timestamp`` instead of ``requestReceivedTimestamp``) and events without an
``apiVersion`` are accepted too, as are ``EventList`` lines (the webhook backend's batches).

:class:`K8sAuditReader` streams one file and yields, as :class:`ApiEvent` values, the events a
compliance report uses, each with the *categories* (record kinds of the control catalogues) it
falls in:

- ``k8s-activity``: writes (create, update, patch, delete, deletecollection) of TrainJobs,
  TrainingRuntimes and ClusterTrainingRuntimes — who (user, service account, or someone
  impersonating them), what, the response code and mpigate's ``auditAnnotations``
  (``<webhook name>/decision``, ``…/record``, ...);
- ``k8s-rbac-denied``: requests the authorizer refused;
- ``k8s-workload``: pods and workloads (Deployments, Jobs, JobSets, …) created or replaced, with
  their ``requestObject`` when the policy logs it;
- ``k8s-exec``: exec, attach and port-forward into pods;
- ``k8s-rbac-write``: writes of Roles, ClusterRoles and their bindings (with ``requestObject``);
- ``k8s-secret``: any access to Secrets;
- ``k8s-anonymous``: writes by ``system:anonymous`` / ``system:unauthenticated``;
- ``k8s-impersonation``: requests made as another identity.

Everything else is counted by why it was not used (:attr:`K8sAuditStats.skipped`). Each request
counts once: at ``ResponseComplete`` (or ``Panic``), except exec/attach/port-forward, which count
at ``ResponseStarted`` when the connection was upgraded (their ``ResponseComplete`` comes much
later and repeats the request). A line that is not an audit event is counted as malformed, with
the first such line's number and why; it never stops the report. The SHA-256 of the file's bytes
is computed while reading.

The reader's :attr:`K8sAuditReader.witness` collects the newest chain position seen per chain
(the ``<webhook name>/record`` annotations) and how far the log runs: what ``mpigate audit verify
--k8s-audit`` and the report check the chains against (:mod:`mpigate.audit.witness`).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import IO, Any, NamedTuple, cast

from mpigate.audit._canonical import format_time, parse_time
from mpigate.audit.reader import parse_json_object
from mpigate.audit.witness import POSITION_ANNOTATION, Position, Witness

from .completeness import Span

__all__ = [
    "CATEGORIES",
    "JUDGED_RESOURCES",
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
# Everything mpigate's webhooks judge, by (API group, resource): Trainer's objects and the MPI
# Operator's MPIJobs (webhooks/base/webhookconfigurations.yaml routes every version of each).
JUDGED_RESOURCES: Mapping[tuple[str, str], str] = MappingProxyType(
    {
        **{(TRAINER_GROUP, resource): kind for resource, kind in TRAINER_RESOURCES.items()},
        ("kubeflow.org", "mpijobs"): "MPIJob",
    }
)
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
_READ_VERBS = frozenset({"get", "list", "watch"})
_COUNTED_STAGES = frozenset({"ResponseComplete", "Panic", ""})
# What a report takes from the API server's log (record kinds of the control catalogues).
CATEGORIES: Mapping[str, str] = MappingProxyType(
    {
        "k8s-activity": "Writes of the objects mpigate judges (TrainJobs, training runtimes, MPIJobs)",
        "k8s-rbac-denied": "Requests the authorizer refused",
        "k8s-workload": "Pods and workloads created or replaced",
        "k8s-exec": "Exec, attach and port-forward into pods",
        "k8s-rbac-write": "Writes of RBAC roles and bindings",
        "k8s-secret": "Access to Secrets",
        "k8s-anonymous": "Writes by unauthenticated (anonymous) clients",
        "k8s-impersonation": "Requests made as another identity (impersonation)",
    }
)
# Workloads whose pods Pod Security judges, with their API groups (core, apps, batch; extensions
# served Deployments, ReplicaSets and DaemonSets until Kubernetes 1.16, and old logs carry it;
# JobSet, which Trainer creates).
_WORKLOAD_GROUPS: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        "pods": frozenset({""}),
        "podtemplates": frozenset({""}),
        "replicationcontrollers": frozenset({""}),
        "deployments": frozenset({"apps", "extensions"}),
        "replicasets": frozenset({"apps", "extensions"}),
        "daemonsets": frozenset({"apps", "extensions"}),
        "statefulsets": frozenset({"apps"}),
        "jobs": frozenset({"batch"}),
        "cronjobs": frozenset({"batch"}),
        "jobsets": frozenset({"jobset.x-k8s.io"}),
    }
)
_EXEC_SUBRESOURCES = frozenset({"exec", "attach", "portforward"})
_RBAC_GROUP = "rbac.authorization.k8s.io"
_RBAC_RESOURCES = frozenset({"roles", "clusterroles", "rolebindings", "clusterrolebindings"})
# The authorizer's own refusal text (k8s.io/apiserver pkg/endpoints/handlers/responsewriters
# errors.go forbiddenMessage: 'User "bob" cannot list resource ...'), for logs written before the
# authorization.k8s.io/decision annotation existed (pkg/endpoints/filters/authorization.go).
_FORBIDDEN_MESSAGE = re.compile(r'\bUser "[^"]*" cannot ')
_SKIP_STAGE = "another stage of a request counted at ResponseComplete (RequestReceived, ResponseStarted)"
_SKIP_READ = "read of a resource without security relevance (get, list, watch)"
_SKIP_WRITE = "write of a resource without security relevance"
_SKIP_NONRESOURCE = "non-resource request (/healthz, /metrics, /version, ...)"

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
    categories: tuple[str, ...] = ()
    obj: Any = None  # requestObject of workload and RBAC writes, when logged
    source_ip: str = ""
    user_agent: str = ""
    reason: str = ""  # responseStatus message (why a request failed)
    # (webhook name, chain position) of the audit record of every mpigate webhook that judged the
    # request (mutate and validate), from the ``<webhook name>/record`` annotations
    records: tuple[tuple[str, Position], ...] = ()

    @property
    def positions(self) -> tuple[Position, ...]:
        """The chain positions the webhooks annotated (mutate and validate)."""
        return tuple(position for _, position in self.records)

    @property
    def actor(self) -> str:
        """The effective identity: the impersonated user, else the authenticated one."""
        return self.impersonated or self.username

    @property
    def actor_groups(self) -> tuple[str, ...]:
        return self.impersonated_groups if self.impersonated else self.groups

    @property
    def kind(self) -> str:
        return JUDGED_RESOURCES.get((self.api_group, self.resource), self.resource)

    @property
    def is_trainer_write(self) -> bool:
        """A write of an object mpigate's webhooks judge (TrainJob, runtime, MPIJob)."""
        return (
            (self.api_group, self.resource) in JUDGED_RESOURCES
            and self.verb in WRITE_VERBS
            and not self.subresource
        )

    @property
    def rbac_denied(self) -> bool:
        """Refused by the authorizer (the decision annotation, or a 403 with its message)."""
        return "k8s-rbac-denied" in self.categories

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
    span: Span = field(default_factory=lambda: Span(None))  # every event, used or not
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> events not used
    sha256: str = ""
    bytes: int = 0

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "sha256": self.sha256,
            "bytes": self.bytes,
            "lines": self.lines,
            "events": self.events,
            "used": self.used,
            "other": self.other,
            "otherStages": self.other_stages,
            "notUsed": [{"reason": r, "events": n} for r, n in sorted(self.skipped.items())],
            "malformed": self.malformed,
            "firstMalformed": (
                {"line": self.first_malformed_line, "reason": self.first_malformed_reason}
                if self.first_malformed_line is not None
                else None
            ),
            "unreadable": self.unreadable,
            "from": self.first_time,
            "to": self.last_time,
            "firstEvent": normalize_time(self.span.first) if self.span.first else None,
            "lastEvent": normalize_time(self.span.last) if self.span.last else None,
        }


def _groups(value: Any) -> tuple[str, ...]:
    return tuple(map(str, value)) if type(value) is list else ()


class K8sAuditReader:
    """Iterate the events of one audit log file that a report uses; ``stats`` is complete after
    the iteration. Memory does not grow with the file."""

    def __init__(self, path: str | Path, heartbeat: float | None = None) -> None:
        self.path = Path(path)
        self._file = str(self.path)
        self.stats = K8sAuditStats(file=self._file, span=Span(heartbeat))
        self.witness = self.stats.witness

    def _malformed(self, line: int, reason: str) -> None:
        stats = self.stats
        stats.malformed += 1
        if stats.first_malformed_line is None:
            stats.first_malformed_line = line
            stats.first_malformed_reason = reason[:_MAX_REASON]

    def __iter__(self) -> Iterator[ApiEvent]:
        stats = self.stats
        digest = hashlib.sha256()
        try:
            raw_file = self.path.open("rb")
        except OSError as exc:
            stats.unreadable = f"cannot read: {exc.strerror or exc}"
            return
        with raw_file:
            try:
                packed = raw_file.read(2) == b"\x1f\x8b"
                raw_file.seek(0)
            except OSError as exc:
                stats.unreadable = f"cannot read: {exc.strerror or exc}"
                return
            hashing = _HashingReader(raw_file, digest)
            # gzip: the compressed bytes are hashed as GzipFile reads them; plain: line by line
            fh: IO[bytes] = cast(IO[bytes], gzip.GzipFile(fileobj=hashing, mode="rb")) if packed else raw_file
            try:
                for lineno, raw in enumerate(fh, start=1):
                    stats.lines = lineno
                    if not packed:
                        hashing.update(raw)
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
            try:
                hashing.finish()  # the digest is of the whole file, also when reading stopped early
            except OSError as exc:
                stats.unreadable = stats.unreadable or f"read error: {exc.strerror or exc}"
            stats.sha256 = digest.hexdigest()
            stats.bytes = hashing.size
        if stats.span.last:
            self.witness.saw(normalize_time(stats.span.last))

    def _event(self, data: Any, lineno: int) -> ApiEvent | None:
        # The hot path of a cluster-wide log: most events are reads of other resources by the
        # cluster's own components, so they are recognised and counted with a few dict lookups
        # before anything else is built.
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
        stats.events += 1
        # the API server's own format compares and parses as it is; others are normalised
        stats.span.add(stamp if len(stamp) == 27 and stamp[19] == "." else normalize_time(stamp))
        ref = get("objectRef")
        if type(ref) is not dict:
            ref = {}
        resource = ref.get("resource", "")
        subresource = ref.get("subresource", "")
        stage = get("stage", "")
        status = get("responseStatus")
        code = status.get("code") if type(status) is dict else None
        if stage not in _COUNTED_STAGES:
            # exec/attach/port-forward count when the connection is upgraded (their
            # ResponseComplete arrives when the session ends and repeats the request)
            if not (stage == "ResponseStarted" and subresource in _EXEC_SUBRESOURCES and resource == "pods"):
                stats.other_stages += 1
                stats.skip(_SKIP_STAGE)
                return None
        elif code == 101 and subresource in _EXEC_SUBRESOURCES:
            stats.other_stages += 1
            stats.skip(_SKIP_STAGE)
            return None
        impersonated = get("impersonatedUser")
        annotations = get("annotations")
        if type(annotations) is not dict:
            annotations = {}
        authorization = annotations.get("authorization.k8s.io/decision", "")
        if (
            verb in _READ_VERBS
            and resource != "secrets"
            and not impersonated
            and code != 403
            and authorization != "forbid"
        ):
            stats.other += 1
            stats.skip(_SKIP_READ if resource else _SKIP_NONRESOURCE)
            return None
        categories = self._categories(
            verb, user, impersonated, ref, resource, subresource, code, authorization, status
        )
        if not categories:
            stats.other += 1
            stats.skip(_SKIP_WRITE if resource else _SKIP_NONRESOURCE)
            return None
        time = normalize_time(stamp)
        stats.used += 1
        if stats.first_time is None or time < stats.first_time:
            stats.first_time = time
        if stats.last_time is None or time > stats.last_time:
            stats.last_time = time
        if type(impersonated) is not dict:
            impersonated = {}
        mpigate: dict[str, str] = {}
        records: list[tuple[str, Position]] = []
        for key, value in annotations.items():
            if "mpigate" not in key:
                continue
            match = _MPIGATE_ANNOTATION.match(key)
            if match:
                name = match.group("key")
                if name == POSITION_ANNOTATION:  # every webhook's record is a witnessed position
                    position = self.witness.add(str(value), time, self._file, lineno)
                    if position is not None:
                        records.append((match.group("webhook"), position))
                # the validating webhook's verdict wins over the mutating one's (which has none)
                if name not in mpigate or match.group("webhook").startswith("validate"):
                    mpigate[name] = str(value)
        namespace = ref.get("namespace")
        name = ref.get("name")
        obj = None
        if ("k8s-workload" in categories or "k8s-rbac-write" in categories) and verb != "delete":
            candidate = get("requestObject")
            if type(candidate) is dict:
                obj = candidate
        ips = get("sourceIPs")
        message = status.get("message", "") if type(status) is dict else ""
        return ApiEvent(
            time,
            str(get("auditID", "")),
            verb,
            str(user.get("username", "")),
            _groups(user.get("groups")),
            str(impersonated["username"]) if impersonated.get("username") else None,
            _groups(impersonated.get("groups")),
            str(resource),
            str(subresource),
            str(ref.get("apiGroup", "")),
            str(namespace) if namespace else None,
            str(name) if name else None,
            code if type(code) is int else None,
            str(authorization),
            str(annotations.get("authorization.k8s.io/reason", ""))[:_MAX_REASON],
            mpigate,
            self._file,
            lineno,
            categories,
            obj,
            str(ips[0]) if type(ips) is list and ips else "",
            str(get("userAgent", ""))[:_MAX_REASON],
            str(message)[:_MAX_REASON],
            tuple(records),
        )

    @staticmethod
    def _categories(
        verb: str,
        user: dict[str, Any],
        impersonated: Any,
        ref: dict[str, Any],
        resource: str,
        subresource: str,
        code: Any,
        authorization: str,
        status: Any,
    ) -> tuple[str, ...]:
        """The record kinds an event counts for (empty: not used)."""
        group = ref.get("apiGroup") or ""
        write = verb in WRITE_VERBS
        out: list[str] = []
        if write and not subresource and (group, resource) in JUDGED_RESOURCES:
            out.append("k8s-activity")
        if authorization == "forbid" or (
            code == 403
            and not authorization
            and type(status) is dict
            and _FORBIDDEN_MESSAGE.search(str(status.get("message", "")))
        ):
            out.append("k8s-rbac-denied")
        if resource in _WORKLOAD_GROUPS and group in _WORKLOAD_GROUPS[resource]:
            if verb in ("create", "update", "patch") and (
                not subresource or (resource == "pods" and subresource == "ephemeralcontainers")
            ):
                out.append("k8s-workload")
            elif resource == "pods" and subresource in _EXEC_SUBRESOURCES:
                out.append("k8s-exec")
        if resource in _RBAC_RESOURCES and group == _RBAC_GROUP and write:
            out.append("k8s-rbac-write")
        if resource == "secrets" and not group:
            out.append("k8s-secret")
        if write:
            username = user.get("username")
            groups = user.get("groups")
            if username == "system:anonymous" or (
                type(groups) is list and "system:unauthenticated" in groups
            ):
                out.append("k8s-anonymous")
        if type(impersonated) is dict and impersonated.get("username"):
            out.append("k8s-impersonation")
        return tuple(out)


class _HashingReader(io.RawIOBase):
    """A binary file that hashes what is read from it (the compressed bytes of a gzip file)."""

    def __init__(self, raw: IO[bytes], digest: Any) -> None:
        self._raw = raw
        self._digest = digest
        self.size = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._raw.read(len(buffer))
        n = len(data)
        buffer[:n] = data
        self._digest.update(data)
        self.size += n
        return n

    def update(self, data: bytes) -> None:
        """Hash bytes the caller read from the file itself."""
        self._digest.update(data)
        self.size += len(data)

    def finish(self) -> None:
        """Hash what was not read yet."""
        while chunk := self._raw.read(1 << 20):
            self._digest.update(chunk)
            self.size += len(chunk)
