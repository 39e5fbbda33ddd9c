"""Run the pods of a rendered Volcano Job as local containers, as Volcano would start them.

``torchx run --dryrun -s kubernetes`` prints a Volcano ``batch.volcano.sh/v1alpha1`` Job. This
module turns each task replica into one :class:`~tests.support.pod_runner.Pod` with what the Job's
plugins give a pod in a cluster, and runs them with :func:`tests.support.pod_runner.run_pods`:

* svc plugin: hostname ``<job>-<task>-<index>``, reachable as ``<job>-<task>-<index>.<job>``;
  ``VC_<TASK>_HOSTS`` (those names, comma-separated) and ``VC_<TASK>_NUM`` for every task;
* env plugin: ``VK_TASK_INDEX`` and ``VC_TASK_INDEX``, the replica's index in its task.

The svc plugin's /etc/volcano host files are not reproduced. The Job's lifecycle policies apply
as Volcano's job controller applies them (a task's policies before the job's; ``RestartJob``
fails the job once the restarts reach ``maxRetry``: Volcano counts the restart it is about to
make); ``exitCode`` policies raise UnsupportedPod.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tests.support.pod_runner import (
    Eviction,
    JobResult,
    Pod,
    UnsupportedPod,
    dryrun_request,
    pod_from_spec,
    run_pods,
)

# Volcano's maxRetry when the job sets none.
DEFAULT_MAX_RETRY = 3


def scheduler_request(dryrun_output: str) -> dict[str, Any]:
    """The Volcano Job printed after ``=== SCHEDULER REQUEST ===`` by ``torchx run --dryrun``."""
    job = dryrun_request(dryrun_output)
    if not isinstance(job, dict) or job.get("kind") != "Job" \
            or not str(job.get("apiVersion", "")).startswith("batch.volcano.sh/"):
        raise ValueError("the scheduler request is not a Volcano batch.volcano.sh Job")
    return job


def _env_name(task: str) -> str:
    return re.sub(r"[^A-Za-z0-9]", "_", task).upper()


def _policies(*levels: list[dict[str, Any]]) -> dict[str, str]:
    """event -> action of the given policy lists, the first list's first (a task's policies
    are Volcano's before the job's)."""
    actions: dict[str, str] = {}
    for policy in (p for level in reversed(levels) for p in reversed(level)):
        if "exitCode" in policy:
            raise UnsupportedPod("exitCode policies are not reproduced locally")
        for event in policy.get("events") or [policy["event"]]:
            actions[event] = policy["action"]
    return actions


def pods(job: dict[str, Any]) -> list[Pod]:
    """Every task replica of ``job`` as a Pod, with the svc and env plugins' names and env."""
    job_name = job["metadata"]["name"]
    tasks = job["spec"]["tasks"]
    plugins = job["spec"].get("plugins") or {}
    hosts_env: dict[str, str] = {}
    if "svc" in plugins:
        for task in tasks:
            names = [f"{job_name}-{task['name']}-{i}.{job_name}" for i in range(task["replicas"])]
            hosts_env[f"VC_{_env_name(task['name'])}_HOSTS"] = ",".join(names)
            hosts_env[f"VC_{_env_name(task['name'])}_NUM"] = str(task["replicas"])
    result = []
    for task in tasks:
        spec = task["template"]["spec"]
        policies = _policies(task.get("policies") or [], job["spec"].get("policies") or [])
        for index in range(task["replicas"]):
            name = f"{job_name}-{task['name']}-{index}"
            env = dict(hosts_env)
            if "env" in plugins:
                env.update(VK_TASK_INDEX=str(index), VC_TASK_INDEX=str(index))
            result.append(pod_from_spec(name, f"{name}.{job_name}", spec, env, policies))
    return result


def run_job(engine: str, job: dict[str, Any], network: str, claims: Path,
            binds: dict[str, Path] | None = None, timeout: float = 600,
            eviction: Eviction | None = None) -> JobResult:
    """Run the pods of Volcano Job ``job`` under its policies until it ends
    (:func:`tests.support.pod_runner.run_pods`, with the job's ``maxRetry``)."""
    return run_pods(engine, pods(job), job["spec"].get("maxRetry") or DEFAULT_MAX_RETRY,
                    network, claims, binds, timeout, eviction)
