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

from typing import Any

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


def restart_policy(max_retries: int) -> dict[str, Any]:
    """The Volcano Job (``kubernetes``) ``spec`` fields that restart the job ``max_retries`` times.

    Each PodEvicted or PodFailed restarts the job (``RestartJob``) while restarts remain. Volcano
    counts the restart it is about to make and fails the job once that count reaches
    ``maxRetry``, so ``max_retries`` restarts need ``maxRetry: max_retries + 1`` (TorchX renders
    ``max_retries``: one restart fewer, none at 1). With ``max_retries`` 0 the job is ended
    instead (``TerminateJob``: the other pods get SIGTERM and save too); its checkpoint stays on
    the claim for a resubmission with ``--output-dir outputs/<job name>``. Without these
    policies Volcano would create an evicted pod again on its own, into a job whose other ranks
    have stopped.
    """
    action = "RestartJob" if max_retries > 0 else "TerminateJob"
    return {"maxRetry": max_retries + 1,
            "policies": [{"event": event, "action": action} for event in EVENTS]}


def failure_policy(max_retries: int) -> dict[str, Any]:
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
    """
    return {"maxRestarts": max_retries, "restartStrategy": "Recreate"}
