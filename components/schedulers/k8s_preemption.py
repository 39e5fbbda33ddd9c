"""What preempting, evicting or losing one pod does to a Volcano Job of this repository.

When Kubernetes takes a pod away (eviction, preemption by a higher-priority job, a drained
node) the kubelet sends the container SIGTERM and, ``terminationGracePeriodSeconds`` later,
SIGKILL. torchrun forwards the SIGTERM to the trainers (``PET_SIGNALS_TO_HANDLE``), every rank
finishes its step, saves it and exits ``128 + 15``; the grace period must therefore cover a
step and a checkpoint save to the shared claim (:data:`DEFAULT_TERMINATION_GRACE_S`).

The job's policies then restart the whole job (Volcano's ``RestartJob``: every pod deleted
and created again, resuming from the checkpoint) at most ``--max_retries`` times
(:func:`restart_policy`).
"""

from __future__ import annotations

from typing import Any

from components.schedulers.k8s_options import PodOptionError

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


def check_termination_grace(value: int, shutdown_timeout: str | None) -> None:
    """Raise PodOptionError (one line) unless ``value`` (termination_grace_s) gives the
    trainers time to save and torchrun waits for them that long (``shutdown_timeout``: the
    role's ``PET_SHUTDOWN_TIMEOUT``, if set)."""
    if value <= 0:
        what = ("is negative" if value < 0 else "kills an evicted or preempted pod at once, "
                "before the trainers can save a checkpoint")
        raise PodOptionError(
            f"termination_grace_s={value} {what}; pass the seconds a step plus a "
            f"checkpoint save take, e.g. termination_grace_s={DEFAULT_TERMINATION_GRACE_S}")
    if shutdown_timeout is not None and shutdown_timeout.isdigit() \
            and value > int(shutdown_timeout):
        raise PodOptionError(
            f"termination_grace_s={value} exceeds torchrun's PET_SHUTDOWN_TIMEOUT="
            f"{shutdown_timeout}, after which it kills the trainers mid-save; lower "
            f"termination_grace_s or pass --env PET_SHUTDOWN_TIMEOUT={value}")


def restart_policy(max_retries: int) -> dict[str, Any]:
    """The Volcano Job ``spec`` fields that restart the job ``max_retries`` times.

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
