"""The mutating webhooks a TrainJob passes on CREATE, replayed in the order the API server applies
them, and Kueue's writes on admission, preemption and resume judged by mpigate's UPDATE rules.

What is replayed, from the upstream code (not from mpigate's own description of it):

* The API server runs mutating webhook *configurations* sorted by name and the webhooks of one
  configuration in order (k8s.io/apiserver pkg/admission/plugin/webhook/generic/webhook.go
  ``(*Webhook).Dispatch`` over ``hookSource.Webhooks()``, whose configurations the
  configuration manager sorts by name: pkg/admission/configuration/
  mutating_webhook_manager.go ``mergeMutatingWebhookConfigurations``). After a webhook changed
  the object, every webhook with ``reinvocationPolicy: IfNeeded`` that ran *before* it is called
  once more, and so are all of them when the re-run of the in-tree admission plugins changed the
  object (pkg/admission/plugin/webhook/mutating/dispatcher.go ``(*mutatingDispatcher).Dispatch``
  and reinvocationcontext.go).
* Configuration names: Trainer v2.3.0 ``defaulter.trainer.kubeflow.org``
  (manifests/base/webhook/patch_mutating.yaml; charts/kubeflow-trainer _helpers.tpl
  ``trainer.webhook.mutatingWebhookConfiguration.name``), Kueue v0.19.2
  ``kueue-mutating-webhook-configuration`` (config/components/webhook/manifests.yaml
  ``mutating-webhook-configuration`` with ``namePrefix: kueue-`` in config/default/
  kustomization.yaml), mpigate's from its install base (webhooks/base). Neither Trainer nor Kueue
  sets a reinvocationPolicy (default ``Never``); mpigate's is ``IfNeeded``.
* Trainer v2.3.0 pkg/webhooks/trainjob_webhook.go ``(*TrainJobDefaulter).Default``: on CREATE,
  every ``runtimePatches`` entry without ``time`` gets the current time; on UPDATE an entry that
  changed (``time`` aside) gets a new time, an unchanged one keeps the old.
* Kueue v0.19.2 pkg/controller/jobs/trainjob/trainjob_webhook.go ``(*TrainJobWebhook).Default``:
  the namespace's ``default`` LocalQueue when the label is absent
  (``ApplyDefaultLocalQueueWithManagedJobsNamespaceSelector``), ``suspend: true`` only when
  ``jobframework.WorkloadShouldBeSuspended`` says so (the queue label is present, or
  ``manageJobsWithoutQueueName``), and its own ``runtimePatches`` entry (manager
  ``kueue.x-k8s.io/manager``) appended on every call.
* Kueue v0.19.2 trainjob_controller.go ``(*TrainJob).RunWithPodSetsInfo`` (an Update that fills
  its entry with each pod set's flavor node labels and tolerations while suspended; then
  jobframework reconciler.go ``startJob`` patches ``suspend: false``) and ``(*TrainJob).Stop`` /
  ``RestorePodSetsInfo`` (suspend, then empty its entry again).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from mpigate.config import Config
from mpigate.policy import AdmissionInput, UserInfo, apply_patch, judge, mutations
from mpigate.policy.context import QUEUE_LABEL
from mpigate.trainjob.resolve import MPIGATE_MANAGER
from tests.conftest import REPO
from tests.policy.helpers import NOW, decide, example_org, read, trainjob

KUEUE_MANAGER = "kueue.x-k8s.io/manager"  # Kueue trainjob_controller.go runtimePatchManagerName
KUEUE_SA = "system:serviceaccount:kueue-system:kueue-controller-manager"
TRAINER_CONFIGURATION = "defaulter.trainer.kubeflow.org"
KUEUE_CONFIGURATION = "kueue-mutating-webhook-configuration"
CREATED = "2026-11-22T12:00:00Z"
ADMITTED = "2026-11-22T12:05:00Z"

Object = dict[str, Any]


@pytest.fixture(scope="module")
def org() -> Config:
    return example_org()


def _mpigate_configuration() -> tuple[str, str]:
    """(name, reinvocationPolicy) of mpigate's MutatingWebhookConfiguration in the install base."""
    docs = yaml.safe_load_all((REPO / "webhooks/base/webhookconfigurations.yaml").read_text(encoding="utf-8"))
    mutating = next(d for d in docs if d and d["kind"] == "MutatingWebhookConfiguration")
    (hook,) = mutating["webhooks"]
    return mutating["metadata"]["name"], hook.get("reinvocationPolicy", "Never")


# -- the webhooks ----------------------------------------------------------------------------------


def trainer_defaulter(obj: Object, old: Object | None, now: str) -> Object:
    out = copy.deepcopy(obj)
    patches = out["spec"].get("runtimePatches") or []
    if old is None:
        for patch in patches:
            patch.setdefault("time", now)
        return out
    before = {p["manager"]: p for p in old["spec"].get("runtimePatches") or []}
    for patch in patches:
        previous = before.get(patch["manager"])
        if previous is not None:
            same = {k: v for k, v in previous.items() if k != "time"} == {
                k: v for k, v in patch.items() if k != "time"
            }
            if not same:
                patch["time"] = now
            elif "time" in previous:  # the old time; a nil pointer stays absent
                patch["time"] = previous["time"]
            else:
                patch.pop("time", None)
        else:
            patch.setdefault("time", now)
    return out


@dataclass
class KueueDefaulter:
    """Kueue's TrainJob defaulter for one namespace's state."""

    default_local_queue: bool = False
    manage_jobs_without_queue_name: bool = False

    def __call__(self, obj: Object, old: Object | None, now: str) -> Object:
        out = copy.deepcopy(obj)
        labels = out["metadata"].setdefault("labels", {})
        if self.default_local_queue and not labels.get(QUEUE_LABEL):
            labels[QUEUE_LABEL] = "default"
        if labels.get(QUEUE_LABEL) or self.manage_jobs_without_queue_name:
            out["spec"]["suspend"] = True
        out["spec"].setdefault("runtimePatches", []).append(
            {"manager": KUEUE_MANAGER, "trainingRuntimeSpec": {"template": {"spec": {}}}}
        )
        return out


def mpigate_webhook(config: Config) -> Callable[[Object, Object | None, str], Object]:
    def call(obj: Object, old: Object | None, now: str) -> Object:
        meta = obj["metadata"]
        request = AdmissionInput(
            "CREATE", "TrainJob", meta["namespace"], meta["name"], obj, user=UserInfo("maria@acme.example")
        )
        decision = mutations(config, request, None, NOW)
        assert decision.allowed, decision.message
        out = apply_patch(obj, decision.patch)
        assert isinstance(out, dict)
        return out

    return call


@dataclass
class Hook:
    configuration: str
    reinvocation: str
    call: Callable[[Object, Object | None, str], Object]


@dataclass
class Admission:
    """The stored object and which configurations were called, in order."""

    obj: Object
    calls: list[str] = field(default_factory=list)


def admit_create(
    obj: Object,
    hooks: list[Hook],
    *,
    in_tree_reinvocation: Callable[[Object], Object] | None = None,
) -> Admission:
    """The API server's mutating phase of a CREATE (see the module docstring)."""
    ordered = sorted(hooks, key=lambda h: h.configuration)
    result = Admission(copy.deepcopy(obj))
    previously: set[str] = set()  # invoked reinvocable webhooks, since the last change
    reinvoke: set[str] = set()
    should_reinvoke = False

    def run(hook: Hook) -> bool:
        before = result.obj
        result.obj = hook.call(result.obj, None, CREATED)
        result.calls.append(hook.configuration)
        return result.obj != before

    for hook in ordered:
        if run(hook):
            reinvoke |= previously
            previously = set()
            should_reinvoke = True
        if hook.reinvocation == "IfNeeded":
            previously.add(hook.configuration)
    if not should_reinvoke:
        return result
    last_webhook_output = result.obj
    # The admission chain runs once more: the in-tree mutating plugins first, then the webhooks.
    if in_tree_reinvocation is not None:
        result.obj = in_tree_reinvocation(result.obj)
    if result.obj != last_webhook_output:
        reinvoke |= previously
    for hook in ordered:
        if hook.configuration in reinvoke:
            run(hook)
    return result


def hooks(config: Config, kueue: KueueDefaulter | None = None, *extra: Hook) -> list[Hook]:
    name, policy = _mpigate_configuration()
    return [
        Hook(name, policy, mpigate_webhook(config)),
        Hook(KUEUE_CONFIGURATION, "Never", kueue or KueueDefaulter()),
        Hook(TRAINER_CONFIGURATION, "Never", trainer_defaulter),
        *extra,
    ]


def sdk_job() -> Object:
    """What the kubeflow SDK 0.5.0 sends (``KubernetesBackend.train``): no queue label, no suspend;
    labels only those passed with ``options`` (here the org's required cost center)."""
    job = trainjob(name="sdk-job")
    job["metadata"]["labels"] = {"mpigate.io/cost-center": "cc-4711"}
    return job


def validated(config: Config, obj: Object) -> None:
    meta = obj["metadata"]
    request = AdmissionInput(
        "CREATE", "TrainJob", meta["namespace"], meta["name"], obj, user=UserInfo("maria@acme.example")
    )
    decision = judge(config, request, None, NOW)
    assert decision.allowed, decision.message
    assert not decision.violations, [v.rule for v in decision.violations]


def managers(obj: Object) -> list[str]:
    return [p["manager"] for p in obj["spec"].get("runtimePatches") or []]


# -- CREATE ----------------------------------------------------------------------------------------


def test_configurations_run_trainer_kueue_mpigate(org: Config) -> None:
    name, policy = _mpigate_configuration()
    assert sorted([name, KUEUE_CONFIGURATION, TRAINER_CONFIGURATION]) == [
        TRAINER_CONFIGURATION,
        KUEUE_CONFIGURATION,
        name,
    ]
    assert policy == "IfNeeded"


@pytest.mark.parametrize(
    "job",
    [
        sdk_job(),
        read("trainjobs/minimal.yaml"),
        read("trainjobs/llm-finetune.yaml"),
        read("trainjobs/cv-large.yaml"),
    ],
    ids=["sdk", "minimal", "llm-finetune", "cv-large"],
)
def test_every_job_is_stored_suspended_and_queued(org: Config, job: Object) -> None:
    """With or without the queue label (cv-large carries it, the others do not)."""
    stored = admit_create(job, hooks(org))
    team = org.team_for_namespace(job["metadata"]["namespace"])
    assert team is not None
    assert stored.obj["spec"]["suspend"] is True
    assert stored.obj["metadata"]["labels"][QUEUE_LABEL] in team.queues
    # Kueue's entry (appended by its defaulter, before mpigate's) and mpigate's, once each.
    assert managers(stored.obj)[-2:] == [KUEUE_MANAGER, MPIGATE_MANAGER]
    assert managers(stored.obj).count(KUEUE_MANAGER) == 1
    # mpigate changed the object, but nothing reinvocable ran before it: no webhook runs twice.
    assert stored.calls == [TRAINER_CONFIGURATION, KUEUE_CONFIGURATION, _mpigate_configuration()[0]]
    validated(org, stored.obj)


def test_kueue_alone_would_store_the_job_running(org: Config) -> None:
    """The bug: Kueue suspends only jobs that carry the queue label when its defaulter runs."""
    kueue_only = [h for h in hooks(org) if h.configuration != _mpigate_configuration()[0]]
    stored = admit_create(sdk_job(), kueue_only)
    assert "suspend" not in stored.obj["spec"]


def test_reinvocation_keeps_one_entry_each_and_the_job_suspended(org: Config) -> None:
    """A later webhook (and, separately, an in-tree plugin on the re-run) changes the object:
    mpigate is called again, finds its work done, and changes nothing."""

    def sidecar_injector(obj: Object, old: Object | None, now: str) -> Object:
        out = copy.deepcopy(obj)
        out["metadata"].setdefault("annotations", {})["example.com/injected"] = "true"
        return out

    later = Hook("zz-injector", "Never", sidecar_injector)
    stored = admit_create(sdk_job(), hooks(org, None, later))
    name = _mpigate_configuration()[0]
    assert stored.calls == [TRAINER_CONFIGURATION, KUEUE_CONFIGURATION, name, "zz-injector", name]
    assert stored.obj["spec"]["suspend"] is True
    assert managers(stored.obj).count(MPIGATE_MANAGER) == 1
    assert managers(stored.obj).count(KUEUE_MANAGER) == 1
    validated(org, stored.obj)

    def in_tree(obj: Object) -> Object:
        out = copy.deepcopy(obj)
        out["metadata"].setdefault("annotations", {})["example.com/in-tree"] = "true"
        return out

    stored = admit_create(sdk_job(), hooks(org), in_tree_reinvocation=in_tree)
    assert stored.calls == [TRAINER_CONFIGURATION, KUEUE_CONFIGURATION, name, name]
    assert stored.obj["spec"]["suspend"] is True
    assert managers(stored.obj).count(MPIGATE_MANAGER) == 1
    validated(org, stored.obj)


def test_a_labelled_job_is_suspended_by_kueue_and_stays_so(org: Config) -> None:
    job = sdk_job()
    job["metadata"]["labels"][QUEUE_LABEL] = "nlp-team"
    stored = admit_create(job, hooks(org))
    assert stored.obj["spec"]["suspend"] is True
    validated(org, stored.obj)


def test_an_explicit_suspend_false_is_overridden(org: Config) -> None:
    job = sdk_job()
    job["spec"]["suspend"] = False
    stored = admit_create(job, hooks(org))
    assert stored.obj["spec"]["suspend"] is True


def test_a_create_that_reaches_validation_unsuspended_is_refused(org: Config) -> None:
    """The validating webhook judges what will be stored: if the mutation was skipped or undone,
    the job would run before Kueue admits it."""
    stored = admit_create(sdk_job(), hooks(org)).obj
    stored["spec"]["suspend"] = False
    meta = stored["metadata"]
    decision = judge(
        org, AdmissionInput("CREATE", "TrainJob", meta["namespace"], meta["name"], stored), None, NOW
    )
    assert not decision.allowed
    assert [(v.rule, v.path) for v in decision.violations if v.denies] == [("MPG-Q005", "spec.suspend")]


def test_unmanaged_namespaces_are_not_queued(org: Config) -> None:
    """mpigate queues only team namespaces; elsewhere (with unmanaged: allow) it adds no label and no
    suspend, as Kueue would not manage the job either."""
    import dataclasses

    relaxed = dataclasses.replace(org, org=dataclasses.replace(org.org, unmanaged_namespaces="allow"))
    job = sdk_job()
    job["metadata"]["namespace"] = "sandbox"
    decision = decide(relaxed, job)
    assert decision.allowed
    assert not any(p["path"] in ("/spec/suspend", "/metadata/labels") for p in decision.patch)


# -- Kueue's writes after CREATE -------------------------------------------------------------------


def _flavor_node_selector(config: Config, team_name: str, gpu_flavor: str | None) -> dict[str, str]:
    team = config.teams[team_name]
    labels = dict(config.org.regions[team.region].node_labels)
    if gpu_flavor is not None:
        flavor = config.flavors[gpu_flavor]
        labels.update(config.org.regions[flavor.region].node_labels)
        labels.update(flavor.node_labels)
    return labels


def run_with_pod_sets_info(config: Config, stored: Object) -> Object:
    """Kueue's first write on admission: its entry gets each pod set's flavor node labels and
    tolerations (the suspended job may still change its runtimePatches)."""
    team_name = stored["metadata"]["namespace"]
    team = config.team_for_namespace(team_name)
    assert team is not None
    gpu_flavor = sorted(team.gpus)[0]
    decision = decide(config, stored)
    assert decision.demand is not None
    jobs = []
    for job in decision.demand.jobs:
        flavor = gpu_flavor if job.gpus_per_pod else None
        spec: dict[str, Any] = {"nodeSelector": _flavor_node_selector(config, team.name, flavor)}
        tolerations = [dict(t) for t in config.flavors[flavor].tolerations] if flavor else []
        if tolerations:
            spec["tolerations"] = tolerations
        jobs.append({"name": job.name, "template": {"spec": {"template": {"metadata": {}, "spec": spec}}}})
    out = copy.deepcopy(stored)
    for patch in out["spec"]["runtimePatches"]:
        if patch["manager"] == KUEUE_MANAGER:
            patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"] = jobs
    return out


def kueue_update(config: Config, old: Object, new: Object) -> Object:
    """An UPDATE by Kueue's controller: Trainer's defaulter, then mpigate's validation."""
    defaulted = trainer_defaulter(new, old, ADMITTED)
    decision = decide(config, defaulted, operation="UPDATE", old=old, user=KUEUE_SA)
    assert decision.allowed, decision.message
    assert not [v for v in decision.violations if v.mode != "audit"], [
        (v.rule, v.path, v.message) for v in decision.violations
    ]
    return defaulted


@pytest.mark.parametrize(
    "job",
    [sdk_job(), read("trainjobs/llm-finetune.yaml"), read("trainjobs/cv-large.yaml")],
    ids=["sdk", "llm-finetune", "cv-large"],
)
def test_admission_resume_preemption_are_kueues_to_write(org: Config, job: Object) -> None:
    stored = admit_create(job, hooks(org)).obj
    validated(org, stored)
    # Admission: the entry first, still suspended; then suspend: false.
    with_flavors = kueue_update(org, stored, run_with_pod_sets_info(org, stored))
    running = copy.deepcopy(with_flavors)
    running["spec"]["suspend"] = False
    running = kueue_update(org, with_flavors, running)
    # Preemption or eviction: suspend, then the entry emptied (RestorePodSetsInfo).
    stopped = copy.deepcopy(running)
    stopped["spec"]["suspend"] = True
    stopped = kueue_update(org, running, stopped)
    restored = copy.deepcopy(stopped)
    for patch in restored["spec"]["runtimePatches"]:
        if patch["manager"] == KUEUE_MANAGER:
            patch["trainingRuntimeSpec"]["template"]["spec"].pop("replicatedJobs", None)
    kueue_update(org, stopped, restored)


def test_kueue_admission_keeps_mpigates_entry_and_the_region(org: Config) -> None:
    """Kueue's node labels are the flavors' (region + GPU product): they agree with the region
    mpigate pins, so the merged pod still lands in the team's region."""
    stored = admit_create(sdk_job(), hooks(org)).obj
    admitted = run_with_pod_sets_info(org, stored)
    own = next(p for p in admitted["spec"]["runtimePatches"] if p["manager"] == MPIGATE_MANAGER)
    region = org.org.regions[org.teams["nlp-team"].region].node_labels
    for job in own["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
        assert job["template"]["spec"]["template"]["spec"]["nodeSelector"] == dict(region)
    kueue = next(p for p in admitted["spec"]["runtimePatches"] if p["manager"] == KUEUE_MANAGER)
    for job in kueue["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
        selector: Mapping[str, str] = job["template"]["spec"]["template"]["spec"]["nodeSelector"]
        assert all(selector[k] == v for k, v in region.items())


def test_kueue_default_local_queue_must_be_one_of_the_teams(org: Config) -> None:
    """With a LocalQueue named ``default`` in the namespace, Kueue labels the job first; mpigate then
    judges that label like any other (MPG-Q005)."""
    stored = admit_create(sdk_job(), hooks(org, KueueDefaulter(default_local_queue=True))).obj
    assert stored["metadata"]["labels"][QUEUE_LABEL] == "default"
    assert stored["spec"]["suspend"] is True
    meta = stored["metadata"]
    decision = judge(
        org, AdmissionInput("CREATE", "TrainJob", meta["namespace"], meta["name"], stored), None, NOW
    )
    assert [v.rule for v in decision.violations if v.denies] == ["MPG-Q005"]


def test_times_are_set_by_trainer_on_user_entries_only(org: Config) -> None:
    job = sdk_job()
    job["spec"]["runtimePatches"] = [
        {"manager": "acme.example/tuning", "trainingRuntimeSpec": {"template": {"spec": {}}}}
    ]
    stored = admit_create(job, hooks(org)).obj
    times = {p["manager"]: p.get("time") for p in stored["spec"]["runtimePatches"]}
    assert times == {"acme.example/tuning": CREATED, KUEUE_MANAGER: None, MPIGATE_MANAGER: None}
