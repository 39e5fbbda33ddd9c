"""``kubernetes_jobset``: TorchX jobs as JobSets that Kueue admits, with the same pods as
``kubernetes``.

Registered as ``kubernetes_jobset`` under the ``torchx.schedulers`` entry points
(pyproject.toml). ``_submit_dryrun`` renders the AppDef with
:func:`components.schedulers.jobset.app_to_jobset` and hardens every pod template with
:func:`components.schedulers.k8s_pod.customize_pod`, from the same run options as the
``kubernetes`` scheduler (:mod:`components.schedulers.k8s_common`), plus ``local_queue``
(required: the Kueue LocalQueue, a DNS-1123 label) and ``workload_priority_class``.
``describe``, ``log_iter``, ``list`` and ``cancel`` use the Kubernetes API (the ``kubernetes``
client, kube config as for ``kubernetes``); states come from
:mod:`components.schedulers.jobset_status`.

Elastic ``-j MIN:MAX``: JobSet has no minimum size, so the JobSet runs MAX pods, admitted by
Kueue as one gang; torchrun keeps ``--nnodes MIN:MAX``, so training starts once MIN pods have
joined and re-forms when the rest join. A one-line warning says so before submission.
Bad options raise :class:`components.errors.ComponentArgumentError` before anything is
submitted; ``torchx run`` prints that one line and exits 1.
"""

from __future__ import annotations

import codecs
import logging
from collections.abc import Iterable, Iterator, Mapping
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
from torchx.schedulers.kubernetes_scheduler import KubernetesScheduler as _TorchXKubernetes
from torchx.specs import AppDef, CfgVal, ReplicaStatus, Role, RoleStatus, runopts
from torchx.util.strings import normalize_str

from components.errors import ComponentArgumentError
from components.schedulers import k8s_options as opt
from components.schedulers.jobset import (
    API_GROUP,
    API_VERSION,
    COMPLETION_INDEX_LABEL,
    JOBSET_NAME_LABEL,
    PLURAL,
    REPLICATED_JOB_LABEL,
    app_to_jobset,
    pod_hostname,
)
from components.schedulers.jobset_status import app_state, current_pods, replica_state
from components.schedulers.k8s_common import (
    HardenedPods,
    check_derived_names,
    check_object_names,
    pod_options,
)
from components.schedulers.k8s_pod import customize_pod
from components.schedulers.run_options import StrictRunOptions
from components.torchx_compat import dryrun_cfg

NAME = "kubernetes_jobset"
logger = logging.getLogger(__name__)


@dataclass
class JobSetRequest:
    """What ``schedule`` submits: the JobSet and the images to push first."""

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
        raise ComponentArgumentError(
            f"{NAME}: no Kueue LocalQueue given; pass -cfg local_queue=torchx-templates (the "
            "LocalQueue k8s/overlays/kueue creates; kubectl get localqueues -n NAMESPACE lists "
            f"others) or set local_queue in .torchxconfig's [{NAME}] section")
    opt.check_label("local_queue", queue)
    if cfg.get("workload_priority_class"):
        opt.check_subdomain("workload_priority_class", cfg["workload_priority_class"])
    check_object_names(cfg)
    return queue


def check_names(jobset: dict[str, Any]) -> None:
    """Raise unless every pod host name JobSet derives is a DNS-1123 label with any id TorchX
    may append (:func:`check_derived_names`)."""
    name = jobset["metadata"]["name"]
    hosts = [("pod hostname",
              pod_hostname(name, rj["name"], rj["template"]["spec"]["completions"] - 1))
             for rj in jobset["spec"]["replicatedJobs"]]
    check_derived_names(NAME, name, hosts)


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


def log_lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """The lines (each with its newline) of a UTF-8 byte stream, as they complete."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending = ""
    for chunk in chunks:
        pending += decoder.decode(chunk)
        *done, pending = pending.split("\n")
        yield from (line + "\n" for line in done)
    pending += decoder.decode(b"", final=True)
    if pending:
        yield pending


class KubernetesJobSetScheduler(StrictRunOptions, HardenedPods, _TorchXKubernetes,
                                Scheduler[Mapping[str, CfgVal]]):
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
        with self.errors_named():
            queue = check_cfg(raw)
            pods = pod_options(raw, app)
            warn_elastic(app)
            images_to_push = self.dryrun_push_images(app, cfg)
            name = normalize_str(make_unique(app.name))
            jobset = app_to_jobset(app, name, queue, raw.get("service_account"),
                                   raw.get("priority_class"), raw.get("workload_priority_class"))
            check_names(jobset)
            for rj in jobset["spec"]["replicatedJobs"]:
                job = rj["template"]["spec"]
                job["template"] = customize_pod(job["template"], pods)
            if raw.get("validate_spec"):
                self.validate_on_server(jobset, raw.get("namespace") or "default",
                                        group=API_GROUP, version=API_VERSION, plural=PLURAL)
        return AppDryRunInfo(JobSetRequest(images_to_push, jobset), repr)

    def schedule(self, dryrun_info: AppDryRunInfo[JobSetRequest]) -> str:
        from kubernetes.client.rest import ApiException

        namespace = dryrun_cfg(dryrun_info).get("namespace") or "default"
        self.push_images(dryrun_info.request.images_to_push)
        try:
            resp = self._custom_objects_api().create_namespaced_custom_object(
                group=API_GROUP, version=API_VERSION, namespace=namespace, plural=PLURAL,
                body=dryrun_info.request.resource)
        except ApiException as err:
            if err.status == 404:
                raise ComponentArgumentError(
                    f"{NAME}: the cluster has no JobSet API ({API_GROUP}/{API_VERSION}); "
                    "install JobSet v0.12.0 and Kueue v0.19.2 (docs/kubernetes.md)") from None
            raise
        return f"{namespace}:{resp['metadata']['name']}"

    def _pods(self, namespace: str, name: str, selector: str = "") -> list[dict[str, Any]]:
        """The JobSet's pods (all restart attempts) as plain data, oldest first."""
        from kubernetes import client

        api = self._api_client()
        labels = ",".join(filter(None, [f"{JOBSET_NAME_LABEL}={name}", selector]))
        resp = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=labels)
        pods = [cast(dict[str, Any], api.sanitize_for_serialization(p)) for p in resp.items]
        return sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp") or "")

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        from kubernetes.client.rest import ApiException

        namespace, name = app_id.split(":")
        try:
            jobset = self._custom_objects_api().get_namespaced_custom_object(
                group=API_GROUP, version=API_VERSION, namespace=namespace, plural=PLURAL,
                name=name)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        pods = self._pods(namespace, name)
        state, msg = app_state(jobset, pods)
        roles: dict[str, Role] = {}
        statuses: dict[str, RoleStatus] = {}
        for rj in jobset["spec"]["replicatedJobs"]:
            roles[rj["name"]] = Role(name=rj["name"], image="",
                                     num_replicas=rj["template"]["spec"]["completions"])
            statuses[rj["name"]] = RoleStatus(rj["name"], [])
        for pod in current_pods(jobset, pods):
            labels = pod["metadata"].get("labels") or {}
            role = labels.get(REPLICATED_JOB_LABEL)
            if role in statuses:
                spec = pod.get("spec") or {}
                statuses[role].replicas.append(ReplicaStatus(
                    id=int(labels.get(COMPLETION_INDEX_LABEL, 0)), role=role,
                    state=replica_state(pod),
                    hostname=f"{spec.get('hostname', '')}.{spec.get('subdomain', '')}"))
        return DescribeAppResponse(
            app_id=app_id, state=state, msg=msg, roles=list(roles.values()),
            roles_statuses=list(statuses.values()),
            num_restarts=(jobset.get("status") or {}).get("restarts", 0))

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
        selector = (f"{REPLICATED_JOB_LABEL}={normalize_str(role_name)},"
                    f"{COMPLETION_INDEX_LABEL}={k}")
        pods = self._pods(namespace, name, selector)
        if not pods:
            raise ValueError(f"{NAME}: {app_id} has no pod {k} of role {role_name} (yet)")
        args: dict[str, Any] = {"name": pods[-1]["metadata"]["name"], "namespace": namespace,
                                "timestamps": True, "follow": should_tail}
        if since is not None:
            args["since_seconds"] = int((datetime.now() - since).total_seconds())
        # the raw response: kubernetes 36 returns a log as the repr of its bytes, and its Watch
        # asks for watch=True instead of follow=True (kubernetes-client/python#2596)
        resp = client.CoreV1Api(self._api_client()).read_namespaced_pod_log(
            **args, _preload_content=False)
        lines = log_lines(resp.stream(4096)) if should_tail else split_lines(
            resp.data.decode("utf-8", errors="replace"))
        return filter_regex(regex, lines) if regex else lines

    def list(self) -> list[ListAppResponse]:
        namespace = self._get_active_context()["context"].get("namespace") or "default"
        resp = self._custom_objects_api().list_namespaced_custom_object(
            group=API_GROUP, version=API_VERSION, namespace=namespace, plural=PLURAL,
            timeout_seconds=30)
        return [ListAppResponse(app_id=f"{namespace}:{item['metadata']['name']}",
                                state=app_state(item)[0]) for item in resp["items"]]

    def _cancel_existing(self, app_id: str) -> None:
        namespace, name = app_id.split(":")
        self._custom_objects_api().delete_namespaced_custom_object(
            group=API_GROUP, version=API_VERSION, namespace=namespace, plural=PLURAL, name=name,
            propagation_policy="Foreground")


def create_scheduler(session_name: str, **kwargs: Any) -> KubernetesJobSetScheduler:
    """The entry point TorchX calls (``client``/``docker_client`` pass through, for tests)."""
    return KubernetesJobSetScheduler(session_name, client=kwargs.get("client"),
                                     docker_client=kwargs.get("docker_client"))

