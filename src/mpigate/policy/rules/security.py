"""MPG-SEC-* (Pod Security Standards on every effective pod), MPG-SEC-SECRETS (credential-looking
literal env values) and MPG-SA-001 (service accounts in runtime patches)."""

from __future__ import annotations

import hashlib
import itertools
import math
import re
from collections.abc import Iterator, Mapping
from functools import cache, lru_cache
from types import MappingProxyType
from typing import Any

from mpigate.catalogue import all_rules
from mpigate.config import Config
from mpigate.config.model import SecurityPolicy
from mpigate.config.mpienv import IMPLEMENTATIONS
from mpigate.policy import pss
from mpigate.policy.context import JobContext, as_mapping, as_str
from mpigate.policy.findings import Finding
from mpigate.policy.prepared import memoized, prepared_runtime
from mpigate.policy.requester import personas_of, service_account_personas, usable_service_accounts
from mpigate.trainjob import EffectiveJob, Resolution, parse_path
from mpigate.trainjob.resolve import resolve

__all__ = [
    "PSS_FIXES",
    "check_pod_security",
    "check_secrets",
    "check_service_accounts",
    "config_credential_reasons",
    "credential_reason",
    "value_digest",
]

# How to fix each upstream check, in the words of a pod spec.
PSS_FIXES: Mapping[str, str] = {
    "hostNamespaces": "Remove hostNetwork, hostPID and hostIPC (or set them to false).",
    "privileged": "Remove securityContext.privileged (or set it to false).",
    "capabilities_baseline": "Add only default capabilities (e.g. NET_BIND_SERVICE); IPC_LOCK, SYS_PTRACE, "
    "NET_ADMIN and friends are not allowed.",
    "hostPathVolumes": "Replace hostPath volumes with emptyDir, a PersistentVolumeClaim or a CSI volume.",
    "hostPorts": "Remove hostPort from the container ports (a containerPort is enough inside the "
    "pod network).",
    "hostProbesAndHostLifecycle": "Remove host from probes and lifecycle handlers (they target the "
    "pod itself).",
    "appArmorProfile": "Use the RuntimeDefault or a Localhost AppArmor profile, not Unconfined.",
    "seLinuxOptions": "Remove seLinuxOptions user/role and use an allowed type (container_t, "
    "container_init_t, "
    "container_kvm_t, container_engine_t).",
    "procMount": "Remove securityContext.procMount (or set it to Default).",
    "seccompProfile_baseline": "Use seccompProfile type RuntimeDefault or Localhost, not Unconfined.",
    "sysctls": "Only safe sysctls (e.g. net.ipv4.ip_local_port_range) may be set in the pod securityContext.",
    "windowsHostProcess": "Remove windowsOptions.hostProcess.",
    "restrictedVolumes": "Use only configMap, csi, downwardAPI, emptyDir, ephemeral, image, "
    "persistentVolumeClaim, "
    "projected and secret volumes.",
    "allowPrivilegeEscalation": "Set securityContext.allowPrivilegeEscalation: false on every container.",
    "runAsNonRoot": "Set securityContext.runAsNonRoot: true (pod or every container) and use an image with a "
    "non-root USER.",
    "runAsUser": "Do not run as UID 0: remove runAsUser: 0 or set a non-zero UID.",
    "seccompProfile_restricted": "Set securityContext.seccompProfile.type: RuntimeDefault (pod or "
    "every container).",
    "capabilities_restricted": "Set securityContext.capabilities.drop: [ALL] and add at most "
    "NET_BIND_SERVICE.",
    "procMount_restricted": "Remove securityContext.procMount (or set it to Default).",
}


@cache
def _rule_by_check() -> Mapping[str, str]:
    return {info.pss_check: info.id for info in all_rules().values() if info.pss_check}


def check_pod_security(
    security: SecurityPolicy, jobs: tuple[EffectiveJob, ...], *, pods_note: bool = True
) -> Iterator[Finding]:
    """Every effective pod against ``restricted``/``baseline`` exactly as pod-security-admission."""
    level = security.level
    if level == "privileged":
        return
    rules = _rule_by_check()
    for job in jobs:
        findings = pss.evaluate_pod(job.metadata, job.spec, level, security.version)
        for found in findings:
            rule_id = found.rule if found.rule in all_rules() else rules.get(found.check)
            if rule_id is None:  # pragma: no cover - the catalogue lists every upstream check
                continue
            paths: list[str] = []
            for raw in found.paths or ("spec",):
                origin = job.origin(_parse(raw))
                if origin not in paths:
                    paths.append(origin)
            also = f" Also at: {'; '.join(paths[1:])}." if len(paths) > 1 else ""
            where = (
                f"replicated job {job.name} ({job.pods} pod{'s' if job.pods != 1 else ''})"
                if pods_note
                else (f"replicated job {job.name}")
            )
            detail = f" ({found.detail})" if found.detail else ""
            yield Finding(
                rule_id,
                paths[0],
                f'{found.reason}{detail} violates PodSecurity "{level}:{security.version}" in {where}.{also}',
                PSS_FIXES.get(found.check, ""),
                f"{found.reason}{detail} ({job.name})",
            )


def _parse(raw: str) -> tuple[str | int, ...]:
    return parse_path(raw)


# Names that say "credential": whole words of an env var name (so TOKENIZERS_PARALLELISM is not a token).
_SECRET_WORDS = frozenset(
    {
        "PASSWORD",
        "PASSWD",
        "PASS",
        "PWD",
        "SECRET",
        "TOKEN",
        "APIKEY",
        "CREDENTIAL",
        "CREDENTIALS",
        "PASSPHRASE",
        "PRIVATEKEY",
        "ACCESSKEY",
        "SECRETKEY",
        "AUTHKEY",
        "SESSIONKEY",
        "CLIENTSECRET",
        "SASL",
    }
)
_SECRET_PAIRS = frozenset(
    {
        ("API", "KEY"),
        ("ACCESS", "KEY"),
        ("PRIVATE", "KEY"),
        ("SECRET", "KEY"),
        ("AUTH", "KEY"),
        ("SESSION", "KEY"),
        ("CLIENT", "SECRET"),
        ("SIGNING", "KEY"),
        ("ENCRYPTION", "KEY"),
        ("MASTER", "KEY"),
    }
)
# Shapes of well-known credentials (never echoed; only the kind is named).
_SHAPES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("an AWS access key id", re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("a GitHub token", re.compile(r"\bgh[pousr]_[A-Za-z0-9]{36,}\b|\bgithub_pat_[A-Za-z0-9_]{50,}\b")),
    ("a Slack token", re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}")),
    ("a Hugging Face token", re.compile(r"\bhf_[A-Za-z0-9]{30,}\b")),
    ("an OpenAI-style API key", re.compile(r"\bsk-[A-Za-z0-9_-]{20,}\b")),
    ("a Google API key", re.compile(r"\bAIza[0-9A-Za-z_-]{35}\b")),
    ("a private key", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")),
    ("a JSON Web Token", re.compile(r"\beyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}")),
    ("credentials in a URI", re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]+:[^/\s@]+@")),
)
# Any of the shapes (which one is then found in the list's order).
_ANY_SHAPE = re.compile("|".join(f"(?:{pattern.pattern})" for _, pattern in _SHAPES))
_NON_WORD = re.compile(r"[^A-Z0-9]+")
_HIGH_ENTROPY = re.compile(r"^[A-Za-z0-9+/=_-]{32,}$")
_REFERENCE = re.compile(r"^\$\([A-Za-z_][A-Za-z0-9_]*\)$")
_HARMLESS = frozenset({"true", "false", "yes", "no", "on", "off", "none", "null", "", "0", "1"})


def _entropy(text: str) -> float:
    counts: dict[str, int] = {}
    for ch in text:
        counts[ch] = counts.get(ch, 0) + 1
    return -sum(c / len(text) * math.log2(c / len(text)) for c in counts.values())


# Env var names recur in every job (the values, which may be secrets, are never cached).
@lru_cache(maxsize=4096)
def _credential_name(name: str) -> bool:
    """Whether a word (or pair of words) of the env var name says "credential"."""
    words = [w for w in _NON_WORD.split(name.upper()) if w]
    return any(w in _SECRET_WORDS for w in words) or any(
        pair in _SECRET_PAIRS for pair in itertools.pairwise(words)
    )


def credential_reason(name: str, value: str) -> str | None:
    """Why a literal env value looks like a credential (``None`` when it does not). Never the value."""
    stripped = value.strip()
    if stripped.lower() in _HARMLESS or _REFERENCE.match(stripped):
        return None
    if _ANY_SHAPE.search(stripped):  # one search for the common case: no shape at all
        for kind, pattern in _SHAPES:
            if pattern.search(stripped):
                return f"the value has the shape of {kind}"
    if len(stripped) >= 6 and _credential_name(name):
        return f"the name {name} says it is a credential"
    if _HIGH_ENTROPY.match(stripped) and not stripped.isdigit() and _entropy(stripped) >= 4.2:
        return "the value is a long random-looking string"
    return None


def value_digest(value: str) -> str:
    """What identifies a hidden value in :attr:`Finding.identity` (a truncated SHA-256; the value
    itself is never kept): on UPDATE, a credential swapped for another of the same length is a new
    finding, not a grandfathered one."""
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def config_credential_reasons(config: Config) -> Mapping[tuple[str, str], str | None]:
    """:func:`credential_reason` of every literal env entry ``(name, value)`` of the config's
    runtimes on their own (their containers' env and what Trainer's plugins add) and of the pinned
    port environment mpigate injects (each network profile, each MPI implementation), computed once
    per config: most env entries of a job's pods are its runtime's or mpigate's, and the answer is a
    function of the pair alone."""

    def build() -> Mapping[tuple[str, str], str | None]:
        out: dict[tuple[str, str], str | None] = {}
        for runtime in config.runtimes.values():
            for job in resolve(None, prepared_runtime(config, runtime)).jobs:
                for _, _, _, var in job.env():
                    value = var.get("value")
                    if isinstance(value, str):
                        name = as_str(var.get("name")) or "?"
                        if (name, value) not in out:
                            out[(name, value)] = credential_reason(name, value)
        for profile in config.network_profiles.values():
            for implementation in IMPLEMENTATIONS:
                for name, value in profile.pinned_env(implementation):
                    if (name, value) not in out:
                        out[(name, value)] = credential_reason(name, value)
        return MappingProxyType(out)

    found: Mapping[tuple[str, str], str | None] = memoized(config, ("policy.credential_reasons",), build)
    return found


def check_secrets(
    jobs: tuple[EffectiveJob, ...], known: Mapping[tuple[str, str], str | None] | None = None
) -> Iterator[Finding]:
    """MPG-SEC-SECRETS on every container's literal env values (the values are never echoed).
    ``known``: :func:`credential_reason` of pairs answered in advance (the config's runtimes)."""
    seen: set[str] = set()
    for job in jobs:
        for list_field, index, e_index, var in job.env():
            value = var.get("value")
            if not isinstance(value, str):
                continue
            name = as_str(var.get("name")) or "?"
            pair = (name, value)
            if known is not None and pair in known:
                reason = known[pair]
            else:
                reason = credential_reason(name, value)
            if reason is None:
                continue
            path = job.origin(("spec", list_field, index, "env", e_index))
            if path in seen or (path.startswith("runtime ") and "spec.mlPolicy.mpi" in path):
                continue
            seen.add(path)
            yield Finding(
                "MPG-SEC-SECRETS",
                path,
                f"env {name} has a literal value that looks like a credential: {reason} "
                f"({len(value)} characters; the value is not shown).",
                "Store it in a Secret and reference it: valueFrom: {secretKeyRef: {name: <secret>, key: "
                "<key>}}. Rotate the credential: it is now in the object's history.",
                f"env {name} looks like a literal credential; use valueFrom.secretKeyRef",
                value=value_digest(value),
            )


def check_service_accounts(ctx: JobContext, resolution: Resolution) -> Iterator[Finding]:
    """MPG-SA-001: a runtime patch may only name a service account the requester's personas may
    use (Personas ``serviceAccountsFrom``, TeamAccess), or ``default``. The requester comes from the
    AdmissionReview's userInfo, which a tenant cannot choose."""
    team = ctx.team
    if team is None:
        return
    config = ctx.config
    # The requester's personas and accounts are looked up only for a patch that names an account
    # (most name none): the same answers, without the config lookups on every request.
    held: frozenset[str] | None = None
    usable: frozenset[str] = frozenset()
    team_accounts: frozenset[str] = frozenset()
    who = ctx.requester.username or "the requester"
    seen: set[str] = set()
    for job in resolution.jobs:
        for layer in job.layers:
            if layer.kind != "patch" or layer.manager in ctx.trusted_managers:
                continue
            spec = as_mapping(layer.template.get("spec"))
            for field_name in ("serviceAccountName", "serviceAccount"):
                account: Any = spec.get(field_name)
                if account is None or account == "default":
                    continue
                if held is None:
                    held = personas_of(config, team, ctx.requester)
                    usable = usable_service_accounts(config, team, held)
                    team_accounts = config.service_accounts_of(team.name)
                if account in usable:
                    continue
                path = layer.display(("spec", field_name))
                if path in seen:
                    continue
                seen.add(path)
                mine = ", ".join(sorted(usable)) or "none but default"
                if account in team_accounts:
                    bound = ", ".join(service_account_personas(config, team, str(account)))
                    roles = ", ".join(sorted(held)) or f"no persona of {team.name}"
                    yield Finding(
                        "MPG-SA-001",
                        path,
                        f"service account {account} is bound to {team.name}'s {bound} persona; {who} "
                        f"({roles}) may run jobs only as: {mine}. Pods would act with a more privileged "
                        "persona's permissions.",
                        f"Remove {field_name} or use one of: {mine}; let someone holding {bound} (or the "
                        "pipeline itself) submit the job, or ask the security team to add "
                        "serviceAccountsFrom to your persona in rbac/personas.yaml.",
                        f"{who} may not run jobs as {account} ({bound})",
                    )
                    continue
                names = ", ".join(sorted(team_accounts)) or "none"
                yield Finding(
                    "MPG-SA-001",
                    path,
                    f"service account {account} is not one of {team.name}'s ({names}); pods would act with "
                    "another identity's permissions.",
                    f"Use one of {team.name}'s service accounts you may use ({mine}) or remove "
                    f"{field_name}; ask the team admin to add it to rbac/ if it should be one.",
                    f"service account {account} does not belong to {team.name}",
                )
