"""``kubernetes_jobset``: TorchX jobs as JobSets (``jobset.x-k8s.io/v1alpha2``) that Kueue
admits, with the same hardened pods and pod options as ``kubernetes``
(:mod:`components.schedulers.k8s.base`), plus ``local_queue`` (required: the Kueue LocalQueue,
a DNS-1123 label) and ``workload_priority_class``. ``describe``, ``log_iter``, ``list`` and
``cancel`` use the Kubernetes API (TorchX's client, as ``kubernetes``); states come from
:mod:`components.schedulers.k8s.states`, restarts from
:func:`components.schedulers.k8s.preemption.failure_policy`.

:func:`app_to_jobset` makes one replicatedJob per role: an Indexed Job whose ``completions``
and ``parallelism`` are the role's replicas, each pod built by TorchX's ``role_to_pod``. One
template serves every pod of a role, so TorchX's ``${replica_id}`` becomes the Job's
``$(JOB_COMPLETION_INDEX)``. JobSet publishes each pod as
``<jobset>-<replicatedJob>-0-<index>`` in the JobSet's headless service (not-ready addresses
included), and :data:`RANK0_ENV` names the first pod of the first role in every pod, itself
included: torchrun's c10d endpoint. Elastic ``-j MIN:MAX``: JobSet has no minimum size, so MAX
pods run, admitted as one gang; torchrun keeps ``--nnodes MIN:MAX`` (a one-line warning says
so). A role with TorchX's REPLICA retry policy (the ``fault_tolerant`` component's replica
groups) restarts its pods alone (:func:`components.schedulers.k8s.preemption.failure_policy`).
Bad options raise :class:`components.errors.ComponentArgumentError` before anything is
submitted; ``torchx run`` prints that one line and exits 1.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

import yaml
from torchx.schedulers.api import (
    AppDryRunInfo,
    DescribeAppResponse,
    ListAppResponse,
    Scheduler,
    Stream,
    filter_regex,
    split_lines,
)
from torchx.schedulers.ids import make_unique
from torchx.schedulers.kubernetes_scheduler import (
    LABEL_REPLICA_ID,
    pod_labels,
    role_to_pod,
    sanitize_for_serialization,
)
from torchx.specs import AppDef, CfgVal, macros, runopts
from torchx.util.strings import normalize_str

from components.schedulers.k8s import options, states
from components.schedulers.k8s.base import HardenedKubernetesScheduler
from components.schedulers.k8s.pod import customize_pod, pod_options, processes_per_pod
from components.schedulers.k8s.preemption import failure_policy, job_retries, restarts_alone

NAME = "kubernetes_jobset"
API_GROUP = "jobset.x-k8s.io"
API_VERSION = "v1alpha2"
PLURAL = "jobsets"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
RANK0_ENV = "TORCHX_RANK0_HOST"
REPLICA_ID = "$(JOB_COMPLETION_INDEX)"
logger = logging.getLogger(__name__)


def pod_hostname(jobset: str, role_name: str, index: int) -> str:
    """The host name JobSet gives replica ``index`` of a role (the only Job of its
    replicatedJob, job index 0; the replicatedJob is named after the normalized role)."""
    return f"{jobset}-{normalize_str(role_name)}-0-{index}"


def app_to_jobset(app: AppDef, name: str, local_queue: str, cfg: Mapping[str, Any]
                  ) -> dict[str, Any]:
    """The JobSet ``name`` that runs ``app``, labelled for Kueue's LocalQueue ``local_queue``
    (and ``cfg``'s WorkloadPriorityClass); pods carry ``cfg``'s service account and Kubernetes
    PriorityClass. Pod templates are plain data, not yet hardened."""
    replicated_jobs = []
    host = f"{pod_hostname(name, app.roles[0].name, 0)}.{name}"  # via the headless service
    for role_idx, role in enumerate(app.roles):
        values = macros.Values(img_root="", app_id=name, replica_id=REPLICA_ID,
                               rank0_env=RANK0_ENV)
        replica_role = values.apply(role)
        replica_role.env[RANK0_ENV] = host
        rj_name = normalize_str(role.name)
        pod = cast(dict[str, Any], sanitize_for_serialization(
            role_to_pod(rj_name, replica_role, cfg.get("service_account"))))
        labels = pod_labels(app=app, role_idx=role_idx, role=role, replica_id=0, app_id=name)
        del labels[LABEL_REPLICA_ID]  # one template for every replica: the Job's index label
        pod["metadata"].setdefault("labels", {}).update(labels)
        if cfg.get("priority_class"):
            pod["spec"]["priorityClassName"] = cfg["priority_class"]
        replicas = role.num_replicas
        # a failed pod fails its Job (and the JobSet restarts), unless it restarts alone
        backoff = role.max_retries if restarts_alone(role) else 0
        replicated_jobs.append({"name": rj_name, "replicas": 1, "template": {"spec": {
            "completionMode": "Indexed", "completions": replicas, "parallelism": replicas,
            "backoffLimit": backoff, "template": pod}}})
    labels = {states.QUEUE_LABEL: local_queue}
    if cfg.get("workload_priority_class"):
        labels[PRIORITY_LABEL] = cfg["workload_priority_class"]
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": "JobSet",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True,
                        "subdomain": name},
            "failurePolicy": failure_policy(job_retries(app.roles), [
                normalize_str(role.name) for role in app.roles if restarts_alone(role)]),
            "replicatedJobs": replicated_jobs,
        },
    }


@dataclass
class JobSetRequest:
    """What ``schedule`` submits: the JobSet, the namespace it goes to and the images to push
    first; printed (``--dryrun``) as the JobSet."""

    namespace: str
    images_to_push: dict[str, tuple[str, str]]
    resource: dict[str, Any]

    def __str__(self) -> str:
        return yaml.dump(self.resource, sort_keys=False)

    def __repr__(self) -> str:
        return str(self)


def check_cfg(cfg: Mapping[str, Any]) -> str:
    """The LocalQueue of ``cfg`` once it and the other object names are valid; else raise."""
    queue = cfg.get("local_queue")
    if not queue:
        raise options.refuse(
            NAME, "no Kueue LocalQueue given; pass -cfg local_queue=torchx-templates (the "
            "LocalQueue k8s/overlays/kueue creates; kubectl get localqueues -n NAMESPACE lists "
            f"others) or set local_queue in .torchxconfig's [{NAME}] section")
    options.check_label(NAME, "local_queue", queue)
    if cfg.get("workload_priority_class"):
        options.check_subdomain(NAME, "workload_priority_class", cfg["workload_priority_class"])
    options.check_object_names(NAME, cfg)
    return queue


def check_names(jobset: dict[str, Any]) -> None:
    """Raise unless every pod host name JobSet derives is a DNS-1123 label with any id TorchX
    may append (:func:`components.schedulers.k8s.options.check_derived_names`)."""
    name = jobset["metadata"]["name"]
    hosts = [("pod hostname",
              pod_hostname(name, rj["name"], rj["template"]["spec"]["completions"] - 1))
             for rj in jobset["spec"]["replicatedJobs"]]
    options.check_derived_names(NAME, name, hosts)


def warn_elastic(app: AppDef) -> None:
    """One warning line per elastic role: JobSet runs its maximum (module docstring)."""
    for role in app.roles:
        if role.min_replicas is not None and role.min_replicas < role.num_replicas:
            logger.warning(
                "%s: -j %d:%d: JobSet has no minimum size, so all %d pods of role %s are "
                "created and admitted together; torchrun keeps --nnodes %d:%d (training starts "
                "once %d have joined); pass -j %d for a fixed size", NAME, role.min_replicas,
                role.num_replicas, role.num_replicas, role.name, role.min_replicas,
                role.num_replicas, role.min_replicas, role.num_replicas)


class KubernetesJobSetScheduler(HardenedKubernetesScheduler, Scheduler[Mapping[str, CfgVal]]):
    """JobSet + Kueue with the ``kubernetes`` scheduler's pod options and hardening.

    Its run options are a plain mapping on both TorchX versions (the ``Scheduler[...]`` base:
    TorchX main would otherwise convert them to its Volcano options, which require a queue).
    """

    registered_as = NAME

    def __init__(self, session_name: str, client: Any = None, docker_client: Any = None) -> None:
        super().__init__(session_name, client=client, docker_client=docker_client)
        self.backend = NAME

    def _run_opts(self) -> runopts:
        opts = runopts()
        opts.add("namespace", type_=str, default="default",
                 help="Kubernetes namespace to create the JobSet in")
        # Checked in _submit_dryrun instead, so a missing queue is one line, not a usage dump.
        opts.add("local_queue", type_=str,
                 help="Kueue LocalQueue of the namespace to submit to (required), e.g. "
                      "torchx-templates (k8s/overlays/kueue)")
        opts.add("workload_priority_class", type_=str,
                 help="Kueue WorkloadPriorityClass (queueing and preemption order in Kueue), "
                      "e.g. training-preemptible")
        opts.add("service_account", type_=str,
                 help="the service account name to set on the pod specs")
        opts.add("priority_class", type_=str,
                 help="the Kubernetes PriorityClass of the pods (the kube-scheduler's order)")
        self.add_pod_opts(opts)
        return opts

    def _submit_dryrun(self, app: AppDef, cfg: Any) -> AppDryRunInfo[JobSetRequest]:
        raw = cast(Mapping[str, Any], cfg)
        queue = check_cfg(raw)
        pods = pod_options(NAME, raw, app)
        warn_elastic(app)
        images_to_push = self.dryrun_push_images(app, cfg)
        jobset = app_to_jobset(app, normalize_str(make_unique(app.name)), queue, raw)
        check_names(jobset)
        for role, rj in zip(app.roles, jobset["spec"]["replicatedJobs"], strict=True):
            job = rj["template"]["spec"]
            job["template"] = customize_pod(job["template"], pods, processes_per_pod(role))
        namespace = raw.get("namespace") or "default"
        if raw.get("validate_spec"):
            self.validate_on_server(jobset, namespace, group=API_GROUP, version=API_VERSION,
                                    plural=PLURAL)
        return AppDryRunInfo(JobSetRequest(namespace, images_to_push, jobset), repr)

    def schedule_checked(self, dryrun_info: AppDryRunInfo[JobSetRequest]) -> str:
        from kubernetes.client.rest import ApiException

        namespace = dryrun_info.request.namespace
        self.push_images(dryrun_info.request.images_to_push)
        try:
            resp = self.custom_objects_api().create_namespaced_custom_object(
                group=API_GROUP, version=API_VERSION, namespace=namespace, plural=PLURAL,
                body=dryrun_info.request.resource)
        except ApiException as err:
            if err.status == 404:
                raise options.refuse(
                    NAME, f"the cluster has no JobSet API ({API_GROUP}/{API_VERSION}); install "
                    "JobSet v0.12.0 and Kueue v0.19.2 (docs/kubernetes.md)") from None
            raise
        return f"{namespace}:{resp['metadata']['name']}"

    def jobset_pods(self, namespace: str, name: str, selector: str = ""
                    ) -> list[dict[str, Any]]:
        """The JobSet's pods (all restart attempts) as plain data, oldest first."""
        from kubernetes import client

        api = self.api_client()
        labels = ",".join(filter(None, [f"{states.JOBSET_NAME_LABEL}={name}", selector]))
        resp = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=labels)
        pods = [cast(dict[str, Any], api.sanitize_for_serialization(p)) for p in resp.items]
        return sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp") or "")

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        from kubernetes.client.rest import ApiException

        namespace, name = app_id.split(":")
        try:
            jobset = self.custom_objects_api().get_namespaced_custom_object(
                group=API_GROUP, version=API_VERSION, namespace=namespace, plural=PLURAL,
                name=name)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return states.describe_response(app_id, jobset, self.jobset_pods(namespace, name))

    def log_iter(self, app_id: str, role_name: str, k: int = 0, regex: str | None = None,
                 since: datetime | None = None, until: datetime | None = None,
                 should_tail: bool = False, streams: Stream | None = None) -> Iterable[str]:
        """The log of replica ``k`` of ``role_name`` (its newest pod: the current attempt)."""
        from kubernetes import client

        if until is not None:
            raise ValueError(f"{NAME}: the Kubernetes API cannot end logs at a time (until)")
        if streams not in (None, Stream.COMBINED):
            raise ValueError(f"{NAME}: only the combined log stream is available")
        namespace, name = app_id.split(":")
        selector = (f"{states.REPLICATED_JOB_LABEL}={normalize_str(role_name)},"
                    f"{states.COMPLETION_INDEX_LABEL}={k}")
        pods = self.jobset_pods(namespace, name, selector)
        if not pods:
            raise ValueError(f"{NAME}: {app_id} has no pod {k} of role {role_name} (yet)")
        args: dict[str, Any] = {"name": pods[-1]["metadata"]["name"], "namespace": namespace,
                                "timestamps": True, "follow": should_tail}
        if since is not None:
            args["since_seconds"] = int((datetime.now() - since).total_seconds())
        # the raw response: kubernetes 36 returns a log as the repr of its bytes, and its Watch
        # asks for watch=True instead of follow=True (kubernetes-client/python#2596)
        resp = client.CoreV1Api(self.api_client()).read_namespaced_pod_log(
            **args, _preload_content=False)
        lines = states.log_lines(resp.stream(4096)) if should_tail else split_lines(
            resp.data.decode("utf-8", errors="replace"))
        return filter_regex(regex, lines) if regex else lines

    def list(self) -> list[ListAppResponse]:
        namespace = self.context_namespace()
        resp = self.custom_objects_api().list_namespaced_custom_object(
            group=API_GROUP, version=API_VERSION, namespace=namespace, plural=PLURAL,
            timeout_seconds=30)
        return [ListAppResponse(app_id=f"{namespace}:{item['metadata']['name']}",
                                state=states.app_state(item)[0]) for item in resp["items"]]

    def _cancel_existing(self, app_id: str) -> None:
        namespace, name = app_id.split(":")
        self.custom_objects_api().delete_namespaced_custom_object(
            group=API_GROUP, version=API_VERSION, namespace=namespace, plural=PLURAL, name=name,
            propagation_policy="Foreground")


def create_scheduler(session_name: str, **kwargs: Any) -> KubernetesJobSetScheduler:
    """The entry point TorchX calls (``client``/``docker_client`` pass through, for tests)."""
    return KubernetesJobSetScheduler(session_name, client=kwargs.get("client"),
                                     docker_client=kwargs.get("docker_client"))
