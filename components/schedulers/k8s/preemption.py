"""What preempting, evicting or losing one pod does to a job of either Kubernetes scheduler.

When Kubernetes takes a pod away (eviction, preemption by a higher-priority job, a drained
node) the kubelet sends the container SIGTERM and, ``terminationGracePeriodSeconds`` later,
SIGKILL. torchrun forwards the SIGTERM to the trainers (``PET_SIGNALS_TO_HANDLE``), every rank
finishes its step, saves it and exits ``128 + 15``; the grace period must therefore cover a
step and a checkpoint save to the shared claim (:data:`DEFAULT_TERMINATION_GRACE_S`).

The job then restarts as a whole, resuming from the checkpoint, at most ``--max_retries``
times: a Volcano Job through its policies (:func:`restart_policy`), a JobSet through its
failure policy (:func:`failure_policy`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torchx.specs import RetryPolicy, Role

from components.schedulers.k8s.options import refuse

# Kubernetes' own default is 30 s: too short to finish a step and write the checkpoint of a
# large model. A 7B model with Adam state is ~112 GB (16 bytes a parameter) written by the whole
# job, e.g. ~14 GB a node on 8 nodes: at ~200 MB/s a node to a network file system about 70 s,
# plus the step in flight and the ranks' agreement. 300 s leaves room for that; a spot node's
# notice (AWS 2 min, GCP 30 s) can still cut it shorter.
DEFAULT_TERMINATION_GRACE_S = 300
TERMINATION_GRACE_HELP = (
    f"seconds from SIGTERM to SIGKILL when a pod is evicted or preempted (the pod's "
    f"terminationGracePeriodSeconds; default {DEFAULT_TERMINATION_GRACE_S}, Kubernetes' own "
    "is 30): the trainers finish their step and save a checkpoint in it, so it must cover a "
    "step plus writing a checkpoint to checkpoint_pvc")
# Volcano events of a pod taken away (deleted: evicted, preempted, drained) or ended in failure
# (the trainers' exit after a preemption save, a crash, a lost node).
EVENTS = ("PodEvicted", "PodFailed")
# The JobSet failure-policy rule of replicatedJobs that restart their pods alone (JobSet's
# webhook wants ^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$).
RESTART_ALONE_RULE = "ReplicaRetriesExhausted"


def check_termination_grace(scheduler: str, value: int, shutdown_timeout: str | None) -> None:
    """Raise ComponentArgumentError (one line, named ``scheduler``) unless ``value``
    (termination_grace_s) gives the trainers time to save and torchrun waits for them that long
    (``shutdown_timeout``: the role's ``PET_SHUTDOWN_TIMEOUT``, if set)."""
    if value <= 0:
        what = ("is negative" if value < 0 else "kills an evicted or preempted pod at once, "
                "before the trainers can save a checkpoint")
        raise refuse(
            scheduler, f"termination_grace_s={value} {what}; pass the seconds a step plus a "
            f"checkpoint save take, e.g. termination_grace_s={DEFAULT_TERMINATION_GRACE_S}")
    if shutdown_timeout is not None and shutdown_timeout.isdigit() \
            and value > int(shutdown_timeout):
        raise refuse(
            scheduler, f"termination_grace_s={value} exceeds torchrun's PET_SHUTDOWN_TIMEOUT="
            f"{shutdown_timeout}, after which it kills the trainers mid-save; lower "
            f"termination_grace_s or pass --env PET_SHUTDOWN_TIMEOUT={value}")


def restarts_alone(role: Role) -> bool:
    """Whether a failed or evicted replica of ``role`` restarts alone (TorchX's REPLICA retry
    policy, e.g. a replica group of the ``fault_tolerant`` component) rather than the job."""
    return role.retry_policy == RetryPolicy.REPLICA and role.max_retries > 0


def job_retries(roles: Sequence[Role]) -> int:
    """The job's restarts: the fewest ``max_retries`` of the roles that restart the job (none:
    0), as TorchX counts them."""
    return min((r.max_retries for r in roles if not restarts_alone(r)), default=0)


def restart_policy(max_retries: int, replica_restarts: int = 0) -> dict[str, Any]:
    """The Volcano Job (``kubernetes``) ``spec`` fields that restart the job ``max_retries`` times.

    Each PodEvicted or PodFailed restarts the job (``RestartJob``) while restarts remain. Volcano
    counts the restart it is about to make and fails the job once that count reaches
    ``maxRetry``, so ``max_retries`` restarts need ``maxRetry: max_retries + 1`` (TorchX renders
    ``max_retries``: one restart fewer, none at 1). With ``max_retries`` 0 the job is ended
    instead (``TerminateJob``: the other pods get SIGTERM and save too); its checkpoint stays on
    the claim for a resubmission with ``--output-dir outputs/<job name>``. Without these
    policies Volcano would create an evicted pod again on its own, into a job whose other ranks
    have stopped.

    A replica that restarts alone (:func:`restarts_alone`) has task-level policies instead
    (:func:`task_restart_policy`), which Volcano applies before the job's; but Volcano v1.15
    counts each such ``RestartTask`` in the job's one ``retryCount`` against the job's
    ``maxRetry`` too (its task-level ``maxRetry`` only bounds in-place container restarts), so
    ``replica_restarts`` (the sum of those replicas' ``max_retries``) is added to it: every
    replica gets its own restarts, and one that needs more can use another's share.
    """
    action = "RestartJob" if max_retries > 0 else "TerminateJob"
    return {"maxRetry": max_retries + replica_restarts + 1,
            "policies": [{"event": event, "action": action} for event in EVENTS]}


def task_restart_policy(max_retries: int) -> dict[str, Any]:
    """The Volcano task fields of a replica that restarts alone (:func:`restarts_alone`): a
    PodEvicted or PodFailed restarts that task only (``RestartTask``), the other tasks keep
    running; its ``max_retries`` are counted in the job's ``maxRetry`` (:func:`restart_policy`).
    """
    return {"maxRetry": max_retries,
            "policies": [{"event": event, "action": "RestartTask"} for event in EVENTS]}


def failure_policy(max_retries: int, restart_alone: Sequence[str] = ()) -> dict[str, Any]:
    """The JobSet (``kubernetes_jobset``) ``failurePolicy`` of ``--max_retries``.

    Each Job has ``backoffLimit: 0``, so any failed or evicted pod fails its Job (reason
    ``BackoffLimitExceeded``); the JobSet then recreates every Job (``RestartJobSet``, strategy
    ``Recreate``) while fewer than ``maxRestarts`` restarts have been made, and fails otherwise.
    No rules: every Job failure takes that default action, counted against ``maxRestarts``,
    evictions included (as :func:`restart_policy` counts PodEvicted);
    ``RestartJobSetAndIgnoreMaxRestarts`` for evictions would let a cluster that keeps evicting
    restart a job forever. At 0 the first failure fails the JobSet. A suspension by Kueue
    (preemption in the queue) is no failure: the pods are deleted and created again on
    readmission, without counting.

    ``restart_alone``: the replicatedJobs whose replicas restart alone (:func:`restarts_alone`):
    their Jobs' ``backoffLimit`` is their role's ``max_retries``, so the Job controller replaces
    a failed or evicted pod (same index, same host name) without the JobSet noticing; a Job
    that fails anyway has spent its own retries and fails the JobSet (rule
    :data:`RESTART_ALONE_RULE`) rather than restarting the other replicatedJobs.
    """
    policy: dict[str, Any] = {"maxRestarts": max_retries, "restartStrategy": "Recreate"}
    if restart_alone:
        policy["rules"] = [{"name": RESTART_ALONE_RULE, "action": "FailJobSet",
                            "targetReplicatedJobs": list(restart_alone)}]
    return policy
