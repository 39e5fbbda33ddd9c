"""Render a TorchX AppDef as a JobSet (``jobset.x-k8s.io/v1alpha2``) for Kueue to admit.

:func:`app_to_jobset` makes one replicatedJob per role: a single Indexed Job whose
``completions`` and ``parallelism`` are the role's replicas (``-j N``), each pod built by
TorchX's own ``role_to_pod`` (so resources, ports, mounts and env are TorchX's). Every pod of a
role shares one template, so TorchX's per-replica macro ``${replica_id}`` becomes the Job's
``$(JOB_COMPLETION_INDEX)``, which Kubernetes expands in the command, args and env.

Rendezvous: JobSet publishes every pod as ``<jobset>-<replicatedJob>-<jobIndex>-<podIndex>`` in
the JobSet's headless service (the subdomain, the JobSet's name; not-ready addresses published),
and :data:`RANK0_ENV` names the first pod of the first role in every pod, the first pod
included, so torchrun's c10d endpoint is that pod for all of them.

Restarts (:func:`failure_policy`): each Job has ``backoffLimit: 0``, so any failed or evicted
pod fails its Job (reason ``BackoffLimitExceeded``); the JobSet then recreates every Job
(``RestartJobSet``, strategy ``Recreate``) while fewer than ``maxRestarts`` (``--max_retries``)
restarts have been made, and fails otherwise. A suspension by Kueue (preemption in the queue) is
no failure: the pods are deleted and created again on readmission, without counting.
"""

from __future__ import annotations

from typing import Any, cast

from torchx.schedulers.kubernetes_scheduler import (
    LABEL_REPLICA_ID,
    pod_labels,
    role_to_pod,
    sanitize_for_serialization,
)
from torchx.specs import AppDef, macros
from torchx.util.strings import normalize_str

API_GROUP = "jobset.x-k8s.io"
API_VERSION = "v1alpha2"
PLURAL = "jobsets"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
# Labels JobSet puts on its Jobs and their pods, and the Job controller's index label.
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
RESTART_ATTEMPT_LABEL = "jobset.sigs.k8s.io/restart-attempt"
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
RANK0_ENV = "TORCHX_RANK0_HOST"
REPLICA_ID = "$(JOB_COMPLETION_INDEX)"


def replicated_job_name(role_name: str) -> str:
    """The replicatedJob (and container) name of a role: TorchX's normalized role name."""
    return normalize_str(role_name)


def pod_hostname(jobset: str, role_name: str, index: int) -> str:
    """The host name JobSet gives replica ``index`` of a role (the only Job of its
    replicatedJob, job index 0)."""
    return f"{jobset}-{replicated_job_name(role_name)}-0-{index}"


def rank0_host(jobset: str, app: AppDef) -> str:
    """The first pod of the first role, as every pod reaches it through the headless service."""
    return f"{pod_hostname(jobset, app.roles[0].name, 0)}.{jobset}"


def failure_policy(max_retries: int) -> dict[str, Any]:
    """The JobSet ``failurePolicy`` of ``--max_retries`` (module docstring).

    No rules: every Job failure takes JobSet's default action, ``RestartJobSet``, counted
    against ``maxRestarts``, evictions included (as the ``kubernetes`` scheduler's PodEvicted
    policy counts them); ``RestartJobSetAndIgnoreMaxRestarts`` for evictions would let a
    cluster that keeps evicting restart a job forever. At 0 the first failure fails the JobSet.
    """
    return {"maxRestarts": max_retries, "restartStrategy": "Recreate"}


def app_to_jobset(app: AppDef, name: str, local_queue: str, service_account: str | None,
                  priority_class: str | None, workload_priority_class: str | None,
                  ) -> dict[str, Any]:
    """The JobSet ``name`` that runs ``app``, labelled for Kueue's LocalQueue ``local_queue``
    (and WorkloadPriorityClass ``workload_priority_class``); pods carry the Kubernetes
    PriorityClass ``priority_class``. Pod templates are plain data, not yet hardened."""
    replicated_jobs = []
    host = rank0_host(name, app)
    for role_idx, role in enumerate(app.roles):
        values = macros.Values(img_root="", app_id=name, replica_id=REPLICA_ID,
                               rank0_env=RANK0_ENV)
        replica_role = values.apply(role)
        replica_role.env[RANK0_ENV] = host
        rj_name = replicated_job_name(role.name)
        pod = cast(dict[str, Any],
                   sanitize_for_serialization(role_to_pod(rj_name, replica_role, service_account)))
        labels = pod_labels(app=app, role_idx=role_idx, role=role, replica_id=0, app_id=name)
        del labels[LABEL_REPLICA_ID]  # one template for every replica: the Job's index label
        pod["metadata"].setdefault("labels", {}).update(labels)
        if priority_class:
            pod["spec"]["priorityClassName"] = priority_class
        replicas = role.num_replicas
        replicated_jobs.append({"name": rj_name, "replicas": 1, "template": {"spec": {
            "completionMode": "Indexed", "completions": replicas, "parallelism": replicas,
            "backoffLimit": 0, "template": pod}}})
    labels = {QUEUE_LABEL: local_queue}
    if workload_priority_class:
        labels[PRIORITY_LABEL] = workload_priority_class
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": "JobSet",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True,
                        "subdomain": name},
            "failurePolicy": failure_policy(min(role.max_retries for role in app.roles)),
            "replicatedJobs": replicated_jobs,
        },
    }
