"""TorchX states of a ``kubernetes_jobset`` job (a JobSet and its pods), and its logs' lines,
read from the objects the Kubernetes API returns (``kubernetes`` jobs' states are TorchX's).

Inputs are plain data (a JobSet custom object as ``CustomObjectsApi`` returns it; pods as
``ApiClient.sanitize_for_serialization`` gives them). :func:`describe_response` answers
``torchx status`` from them; :func:`app_state` decides the job's state, :func:`replica_state`
each pod's:

* the JobSet's ``terminalState`` (or its ``Completed``/``Failed`` condition) ends the job;
* a pod whose image cannot be pulled (``ErrImagePull``, ``ImagePullBackOff``,
  ``InvalidImageName``, ``ErrImageNeverPull``) fails the job at once, with a message naming the
  pod and image: Kubernetes would retry the pull forever and the job would stay pending;
* a JobSet suspended by Kueue (not admitted yet, or preempted) is PENDING;
* then RUNNING once a pod of the current restart attempt runs, else PENDING.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Iterator
from typing import Any

from torchx.schedulers.api import DescribeAppResponse
from torchx.specs import AppState, ReplicaStatus, Role, RoleStatus

# Kueue's label of the LocalQueue a JobSet is submitted to; the labels JobSet puts on its Jobs
# and their pods, and the Job controller's index label.
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
RESTART_ATTEMPT_LABEL = "jobset.sigs.k8s.io/restart-attempt"
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"

Obj = dict[str, Any]
IMAGE_PULL_FAILURES = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName",
                       "ErrImageNeverPull")
POD_PHASES = {"Pending": AppState.PENDING, "Running": AppState.RUNNING,
              "Succeeded": AppState.SUCCEEDED, "Failed": AppState.FAILED,
              "Unknown": AppState.UNKNOWN}


def _condition(obj: Obj, kind: str) -> Obj | None:
    """``obj``'s status condition of type ``kind`` when it is True."""
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return cond
    return None


def current_pods(jobset: Obj, pods: Iterable[Obj]) -> list[Obj]:
    """The pods of the JobSet's current restart attempt (older ones are being deleted)."""
    attempt = str((jobset.get("status") or {}).get("restarts", 0))
    return [p for p in pods
            if (p["metadata"].get("labels") or {}).get(RESTART_ATTEMPT_LABEL, "0") == attempt]


def image_pull_failure(pod: Obj) -> str | None:
    """One line naming the pod, image and reason when a container's image cannot be pulled."""
    status_of = pod.get("status") or {}
    statuses = [*(status_of.get("initContainerStatuses") or []),
                *(status_of.get("containerStatuses") or [])]
    for status in statuses:
        waiting = (status.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in IMAGE_PULL_FAILURES:
            detail = " ".join(str(waiting.get("message", "")).split())
            return (f"pod {pod['metadata']['name']}: image {status.get('image')} cannot be "
                    f"pulled ({waiting['reason']}{': ' + detail if detail else ''}); check "
                    "--image and image_pull_secrets, then torchx cancel this job and run again")
    return None


def replica_state(pod: Obj) -> AppState:
    """A pod's state: its phase, FAILED when its image cannot be pulled."""
    if image_pull_failure(pod):
        return AppState.FAILED
    return POD_PHASES.get((pod.get("status") or {}).get("phase", "Pending"), AppState.UNKNOWN)


def app_state(jobset: Obj, pods: Iterable[Obj] = ()) -> tuple[AppState, str]:
    """The job's state and a one-line message (empty when there is nothing to add)."""
    status = jobset.get("status") or {}
    terminal = status.get("terminalState")
    if terminal == "Completed" or _condition(jobset, "Completed"):
        return AppState.SUCCEEDED, ""
    failed = _condition(jobset, "Failed")
    if terminal == "Failed" or failed:
        reason = failed or {}
        return AppState.FAILED, " ".join(
            f"{reason.get('reason', '')}: {reason.get('message', '')}".split()).strip(": ")
    live = current_pods(jobset, pods)
    for pod in live:
        problem = image_pull_failure(pod)
        if problem:
            return AppState.FAILED, problem
    suspended = _condition(jobset, "Suspended")
    if suspended or (jobset.get("spec") or {}).get("suspend"):
        queue = (jobset["metadata"].get("labels") or {}).get(QUEUE_LABEL)
        return AppState.PENDING, (f"suspended until Kueue admits it (LocalQueue {queue}; "
                                  "kubectl get workloads lists why it waits)")
    if any(replica_state(p) == AppState.RUNNING for p in live):
        return AppState.RUNNING, ""
    return AppState.PENDING, ""


def describe_response(app_id: str, jobset: Obj, pods: Iterable[Obj]) -> DescribeAppResponse:
    """``torchx status`` of ``app_id``: the JobSet's state, its roles (one a replicatedJob) and
    the pods of the current restart attempt as their replicas."""
    pods = list(pods)
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
