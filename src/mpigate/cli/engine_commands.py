"""``mpigate explain`` (what the webhook would answer) and ``mpigate test`` (PolicyTest suites)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click
import yaml

from mpigate.config import Config, ConfigError, Document, load, parse_quantity
from mpigate.config.queueing import kueue_amount
from mpigate.policy import AdmissionInput, Decision, LiveContext, UserInfo, apply_patch, evaluate
from mpigate.policytest import junit_xml, parse_time, run_suites

from ._inputs import read_objects, unrouted
from ._output import OUTPUT_OPTION, dump, echo_config_failure, echo_problems
from ._root import config_root

__all__ = ["explain_command", "test_command"]


def _load_config(path: Path, point_at: str) -> Config:
    try:
        return load(path)
    except ConfigError as exc:
        echo_config_failure(path, exc.problems, point_at=point_at)
        sys.exit(2)


def _documents(path: Path) -> list[Document]:
    documents, problems = read_objects(path)
    if problems:
        echo_problems(problems, err=True)
        sys.exit(2)
    return documents


def _runtimes(files: tuple[Path, ...]) -> dict[tuple[str, str | None, str], Mapping[str, Any]]:
    """``--runtime`` manifests keyed as ``LiveContext.runtimes`` is."""
    out: dict[tuple[str, str | None, str], Mapping[str, Any]] = {}
    for path in files:
        for document in _documents(path):
            data = document.data
            kind = data.get("kind") if isinstance(data, Mapping) else None
            meta = data.get("metadata") if isinstance(data, Mapping) else None
            name = meta.get("name") if isinstance(meta, Mapping) else None
            if kind not in ("ClusterTrainingRuntime", "TrainingRuntime") or not isinstance(name, str):
                raise click.BadParameter(
                    f"{document.file}:{document.line}: expected a ClusterTrainingRuntime or TrainingRuntime "
                    "with metadata.name",
                    param_hint="--runtime",
                )
            namespace = meta.get("namespace") if kind == "TrainingRuntime" else None  # type: ignore[union-attr]
            out[(str(kind), namespace if isinstance(namespace, str) else None, name)] = data
    return out


def _parse_live(
    config: Config, active_jobs: int | None, gpus: tuple[str, ...], queues: tuple[str, ...]
) -> LiveContext | None:
    if active_jobs is None and not gpus and not queues:
        return None
    in_use: dict[str, int] = {}
    for item in gpus:
        flavor, sep, count = item.partition("=")
        if not sep or not count.isdigit():
            raise click.BadParameter(
                f"{item!r}: expected FLAVOR=COUNT (e.g. a100-eu=15)", param_hint="--gpus-in-use"
            )
        in_use[flavor] = int(count)
    usage: dict[str, dict[str, dict[str, int]]] = {}
    for item in queues:
        where, sep, quantity = item.partition("=")
        parts = where.split(":", 2)
        gpu_flavor = config.flavors.get(parts[1]) if len(parts) > 1 else None
        resource = parts[2] if len(parts) == 3 else (gpu_flavor.gpu_resource if gpu_flavor else "")
        try:
            amount = kueue_amount(resource, parse_quantity(quantity)) if sep and resource else None
        except ValueError:
            amount = None
        if amount is None or amount < 0 or len(parts) < 2:
            raise click.BadParameter(
                f"{item!r}: expected QUEUE:FLAVOR[:RESOURCE]=QUANTITY (e.g. research-team:a100-eu=4, "
                "nlp-team:region-eu:cpu=200); RESOURCE defaults to a GPU flavor's GPU resource",
                param_hint="--queue-usage",
            )
        usage.setdefault(parts[0], {}).setdefault(parts[1], {})[resource] = amount
    return LiveContext(
        active_jobs=active_jobs,
        gpus_in_use=in_use or None,
        queue_usage=usage or None,
        source="the command line",
    )


@click.command("explain")
@click.argument(
    "files", nargs=-1, required=True, type=click.Path(path_type=Path, dir_okay=False, exists=True)
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path),
    help="The config tree (or bundle) to judge with. Default: the tree at or above the working "
    "directory, else at or above the first file (as git finds its repository).",
)
@click.option(
    "-n",
    "--namespace",
    help="Namespace of objects that name none (as kubectl apply -n); an object in another "
    "namespace is an error, as with kubectl.",
)
@click.option("--user", default="explain", show_default=True, help="Username of the requester.")
@click.option("--group", "groups", multiple=True, help="Group of the requester (repeatable).")
@click.option(
    "--operation", type=click.Choice(["CREATE", "UPDATE", "DELETE"]), default="CREATE", show_default=True
)
@click.option(
    "--old",
    "old_file",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="The stored object for UPDATE/DELETE (matched by kind, namespace and name).",
)
@click.option("--now", "now_text", help="Evaluation time, RFC 3339 (exception expiry). Default: now.")
@click.option(
    "--runtime",
    "runtime_files",
    multiple=True,
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="Manifest of a runtime approved as external, as the cluster has it (repeatable); the webhook "
    "reads these from the cluster.",
)
@click.option(
    "--active-jobs",
    type=int,
    help="Simulated live context: active TrainJobs and MPIJobs of the team (MPG-Q007).",
)
@click.option(
    "--gpus-in-use",
    "gpus_in_use",
    multiple=True,
    metavar="FLAVOR=N",
    help="Simulated live context: GPUs in use per flavor (MPG-Q008), repeatable.",
)
@click.option(
    "--queue-usage",
    "queue_usage",
    multiple=True,
    metavar="QUEUE:FLAVOR[:RESOURCE]=QTY",
    help="Simulated live context: quota reserved in a ClusterQueue of the cohort (what it cannot lend; "
    "MPG-Q008), repeatable.",
)
@OUTPUT_OPTION
def explain_command(
    files: tuple[Path, ...],
    config_path: Path | None,
    namespace: str | None,
    user: str,
    groups: tuple[str, ...],
    operation: str,
    old_file: Path | None,
    now_text: str | None,
    runtime_files: tuple[Path, ...],
    active_jobs: int | None,
    gpus_in_use: tuple[str, ...],
    queue_usage: tuple[str, ...],
    output: str,
) -> None:
    """Show what the admission webhook would answer for TrainJobs and training runtimes.

    Every violation with its path and fix, the warnings kubectl would print, and on CREATE the
    mutation as a JSONPatch and as the resulting object. Multi-document files are fine.

    \b
    Examples:
      mpigate explain examples/trainjobs/deny-over-quota.yaml
      mpigate explain job.yaml --operation UPDATE --old stored.yaml -o json
      mpigate explain job.yaml --active-jobs 5 --gpus-in-use a100-eu=15
      mpigate explain sdk-job.yaml --namespace nlp-team   # an object that names no namespace
      mpigate explain job.yaml --gpus-in-use a100-eu=4 --queue-usage research-team:a100-eu=8

    Exit status: 0 every object allowed, 1 any object denied, 2 usage or config error (also an
    input file that is not valid YAML or holds no document: it is reported as file:line:col and
    the other files are still explained; 2 wins over 1).
    """
    config = _load_config(config_root(config_path, files), "pass one with --config PATH")
    try:
        now = parse_time(now_text) if now_text else None
    except ValueError:
        raise click.BadParameter(f"{now_text!r} is not an RFC 3339 time", param_hint="--now") from None
    live = _parse_live(config, active_jobs, gpus_in_use, queue_usage)
    runtimes = _runtimes(runtime_files)
    if runtimes:
        live = dataclasses.replace(live or LiveContext(source="the command line"), runtimes=runtimes)
    old_docs = [d for d in _documents(old_file) if isinstance(d.data, Mapping)] if old_file else []
    results: list[dict[str, Any]] = []
    denied = False
    unreadable = 0
    for path in files:
        documents, problems = read_objects(path)
        if problems:  # judged not at all (as review does); the other files still are
            echo_problems(problems, err=True)
            unreadable += 1
            continue
        for document in documents:
            data = document.data
            skipped = unrouted(document)
            if skipped is not None or not isinstance(data, Mapping):
                click.echo(f"{document.file}:{document.line}: {skipped}", err=True)
                continue
            if namespace is not None:
                data = _in_namespace(data, namespace, f"{document.file}:{document.line}")
            meta: Mapping[str, Any] = data["metadata"] if isinstance(data.get("metadata"), Mapping) else {}
            old = _match_old(old_docs, data)
            if operation in ("UPDATE",) and old is None:
                raise click.UsageError(
                    f"{document.file}:{document.line}: UPDATE needs --old with the stored object"
                )
            request = AdmissionInput(
                operation=operation,  # type: ignore[arg-type]
                kind=str(data["kind"]),
                namespace=meta.get("namespace") if isinstance(meta.get("namespace"), str) else None,
                name=str(meta.get("name", "")),
                obj=None if operation == "DELETE" else data,
                old_obj=old if old is not None else (data if operation == "DELETE" else None),
                user=UserInfo(user, groups),
            )
            decision = evaluate(config, request, live, now)
            denied = denied or not decision.allowed
            mutated = apply_patch(data, decision.patch) if decision.patch else None
            results.append({"document": document, "decision": decision, "mutated": mutated})
    if output == "text":
        for item in results:
            _print_text(item["document"], item["decision"], item["mutated"])
    else:
        payload = [
            {
                "file": r["document"].file,
                "line": r["document"].line,
                "decision": r["decision"].to_dict(),
                "mutated": r["mutated"],
            }
            for r in results
        ]
        click.echo(dump(payload, output), nl=False)
    if unreadable:
        click.secho(
            f"{unreadable} input file{'s' if unreadable != 1 else ''} not judged (see the errors above)",
            fg="red",
            err=True,
        )
        sys.exit(2)
    sys.exit(1 if denied else 0)


def _in_namespace(data: Mapping[str, Any], namespace: str, where: str) -> Mapping[str, Any]:
    """``data`` as the API server stores it when applied with ``-n namespace``: a namespaced
    object without a namespace gets it; one in another namespace is refused (kubectl: "the
    namespace from the provided object does not match the namespace sent on the request")."""
    if data.get("kind") == "ClusterTrainingRuntime":
        return data  # cluster-scoped
    meta = data.get("metadata")
    current = meta.get("namespace") if isinstance(meta, Mapping) else None
    if current and current != namespace:
        raise click.UsageError(
            f"{where}: the object's namespace {current!r} does not match --namespace {namespace!r}"
        )
    return {**data, "metadata": {**(meta if isinstance(meta, Mapping) else {}), "namespace": namespace}}


def _match_old(old_docs: list[Document], data: Mapping[str, Any]) -> Mapping[str, Any] | None:
    def key(obj: Mapping[str, Any]) -> tuple[Any, Any, Any]:
        meta: Mapping[str, Any] = obj["metadata"] if isinstance(obj.get("metadata"), Mapping) else {}
        return obj.get("kind"), meta.get("namespace"), meta.get("name")

    for doc in old_docs:
        if key(doc.data) == key(data):
            return doc.data  # type: ignore[no-any-return]
    return old_docs[0].data if len(old_docs) == 1 else None


def _print_text(document: Document, decision: Decision, mutated: Any) -> None:
    where = f"{decision.namespace}/{decision.name}" if decision.namespace else decision.name
    verdict = {"denied": "DENIED", "allowed-with-warnings": "ALLOWED with warnings", "allowed": "ALLOWED"}[
        decision.outcome
    ]
    color = {"denied": "red", "allowed-with-warnings": "yellow", "allowed": "green"}[decision.outcome]
    team = f"team {decision.team}" if decision.team else "no team"
    click.secho(f"{decision.kind} {where} ({document.file}:{document.line}): {verdict}", fg=color, bold=True)
    click.echo(f"  {decision.operation}, {team}, config revision {decision.revision}")
    demand = decision.demand
    if demand is not None:
        jobs = ", ".join(
            f"{j.name} {j.pods}"
            + (f" × {'+'.join(f'{n} {r}' for r, n in j.gpus_per_pod.items())}" if j.gpus_per_pod else "")
            for j in demand.jobs
        )
        extra = "".join(f", {v} {k}" for k, v in (("CPU", demand.cpu), ("memory", demand.memory)) if v)
        gpus = ", ".join(f"{n} {r}" for r, n in demand.gpus.items()) or "no GPUs"
        click.echo(f"  demand: {demand.pods} pods ({jobs}), {gpus}{extra}, region {demand.region or '-'}")
    for v in decision.violations:
        state = f"waived by {v.waived_by}" if v.waived_by else v.mode
        click.secho(f"  [{v.rule}] ({state}) {v.path}", fg="red" if v.denies else "yellow")
        click.echo(f"      {v.message}")
        if v.fix:
            click.echo(f"      fix: {v.fix}")
    for e in decision.exceptions:
        click.echo(
            f"  exception {e.name}: {', '.join(e.rules)} until {e.expires} (approver {e.approver}, "
            f"ticket {e.ticket})"
        )
    if decision.warnings:
        click.echo("  warnings (kubectl prints these):")
        for w in decision.warnings:
            click.echo(f"    Warning: {w}")
    if decision.patch:
        click.echo("  patch (JSONPatch):")
        for line in yaml.safe_dump(
            [dict(p) for p in decision.patch], sort_keys=False, width=110
        ).splitlines():
            click.echo(f"    {line}")
        click.echo("  mutated object:")
        for line in yaml.safe_dump(mutated, sort_keys=False, width=110).splitlines():
            click.echo(f"    {line}")
    click.echo()


@click.command("test")
@click.argument("path", required=False, type=click.Path(path_type=Path, exists=True))
@click.option(
    "-n", "--namespace", help="Namespace of cases whose case and object name none (as kubectl apply -n)."
)
@click.option(
    "--junit",
    "junit_file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Also write JUnit XML to this file (for CI).",
)
@OUTPUT_OPTION
def test_command(path: Path | None, namespace: str | None, junit_file: Path | None, output: str) -> None:
    """Run the PolicyTest suites of a config tree (policies/tests/*.yaml by convention).

    Each case is evaluated exactly as the webhook would and compared with its `expect`.

    \b
    Example:
      $ mpigate test .
      policies/tests/quota.yaml (nlp-team-quota)
        PASS over quota is denied
        FAIL defaults are injected (policies/tests/quota.yaml:18:7)
             patched: /metadata/labels/kueue.x-k8s.io~1queue-name is 'x', expected 'nlp-team'
      1 of 2 cases failed

    Without PATH, the tree at or above the working directory (as git finds its repository).

    Exit status: 0 all cases pass, 1 any case fails, 2 config error.
    """
    path = config_root(path)
    config = _load_config(path, "pass its path (`mpigate test PATH`)")
    started = dt.datetime.now(dt.UTC)
    results = run_suites(config, namespace=namespace)
    elapsed = (dt.datetime.now(dt.UTC) - started).total_seconds()
    total = sum(len(s.cases) for s in results)
    failed = sum(s.failed for s in results)
    if junit_file is not None:
        junit_file.write_text(junit_xml(results), encoding="utf-8")
    if output != "text":
        data = {
            "ok": failed == 0,
            "cases": total,
            "failed": failed,
            "suites": [
                {
                    "name": s.name,
                    "file": s.file,
                    "cases": [
                        {
                            "name": c.name,
                            "location": c.location,
                            "passed": c.passed,
                            "differences": list(c.differences),
                            "error": c.error,
                            "decision": c.decision.outcome if c.decision else None,
                            "rules": list(c.decision.rule_ids) if c.decision else [],
                        }
                        for c in s.cases
                    ],
                }
                for s in results
            ],
        }
        click.echo(dump(data, output), nl=False)
    else:
        for suite in results:
            click.echo(f"{suite.file} ({suite.name})")
            for case in suite.cases:
                if case.passed:
                    click.secho(f"  PASS {case.name}", fg="green")
                    continue
                click.secho(f"  FAIL {case.name} ({case.location})", fg="red")
                for line in [case.error] if case.error else list(case.differences):
                    click.echo(f"       {line}")
        if not results:
            click.echo(f"{path}: no PolicyTest suites found (put them in policies/tests/)")
        summary = f"{failed} of {total} cases failed" if failed else f"all {total} cases passed"
        click.echo(f"{summary} in {len(results)} suites ({elapsed:.2f}s)", err=bool(failed))
    sys.exit(1 if failed else 0)
