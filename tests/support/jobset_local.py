"""Run the pods of a rendered JobSet as local containers, as JobSet and the Job controller
would start them.

``torchx run --dryrun -s kubernetes_jobset`` prints a ``jobset.x-k8s.io/v1alpha2`` JobSet. This
module turns every pod of its Indexed Jobs into one :class:`~tests.support.pod_runner.Pod` with
what a pod gets in a cluster, and runs them with :func:`tests.support.pod_runner.run_pods`:

* JobSet (``network.enableDNSHostnames``): host name ``<jobset>-<replicatedJob>-<jobIndex>-
  <podIndex>``, reachable as ``<hostname>.<subdomain>`` (the JobSet's headless service);
* the Job controller (Indexed completion mode): ``JOB_COMPLETION_INDEX``, the pod's index, and
  Kubernetes' expansion of ``$(VAR)`` references in the command and args from the env.

The failure policy applies as JobSet applies it: a failed or evicted pod fails its Job
(``backoffLimit`` 0 is required; anything else raises UnsupportedPod) and the JobSet recreates
every pod (``RestartJobSet``) until ``maxRestarts`` restarts have been made, then fails.
Failure policy rules and more than one Job per replicatedJob raise UnsupportedPod.
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

_REF = re.compile(r"\$\$|\$\(([-._a-zA-Z][-._a-zA-Z0-9]*)\)")


def scheduler_request(dryrun_output: str) -> dict[str, Any]:
    """The JobSet printed after ``=== SCHEDULER REQUEST ===`` by ``torchx run --dryrun``."""
    jobset = dryrun_request(dryrun_output)
    if not isinstance(jobset, dict) or jobset.get("kind") != "JobSet":
        raise ValueError("the scheduler request is not a JobSet")
    return jobset


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' expansion of ``text``: ``$(VAR)`` becomes VAR's value when ``env`` defines
    it (else stays), ``$$`` becomes ``$``."""
    def sub(match: re.Match[str]) -> str:
        if match[0] == "$$":
            return "$"
        return env.get(match[1], match[0])

    return _REF.sub(sub, text)


def pods(jobset: dict[str, Any]) -> list[Pod]:
    """Every pod of ``jobset`` as a Pod, with JobSet's host names and the Job's index."""
    name = jobset["metadata"]["name"]
    spec = jobset["spec"]
    network = spec.get("network") or {}
    if not network.get("enableDNSHostnames", True):
        raise UnsupportedPod("network.enableDNSHostnames is false: pods have no stable names")
    subdomain = network.get("subdomain") or name
    policy = spec.get("failurePolicy") or {}
    if policy.get("rules"):
        raise UnsupportedPod("failurePolicy rules are not reproduced locally")
    result = []
    for rj in spec["replicatedJobs"]:
        job = rj["template"]["spec"]
        if rj.get("replicas", 1) != 1 or job.get("completionMode") != "Indexed" \
                or job.get("backoffLimit") != 0:
            raise UnsupportedPod(f"replicatedJob {rj['name']}: only one Indexed Job with "
                                 "backoffLimit 0 is reproduced locally")
        for index in range(job["completions"]):
            host = f"{name}-{rj['name']}-0-{index}"
            policies = {"PodFailed": "RestartJobSet", "PodEvicted": "RestartJobSet"}
            result.append(pod_from_spec(host, f"{host}.{subdomain}", job["template"]["spec"],
                                        {"JOB_COMPLETION_INDEX": str(index)}, policies, expand))
    return result


def run_jobset(engine: str, jobset: dict[str, Any], network: str, claims: Path,
               binds: dict[str, Path] | None = None, timeout: float = 600,
               eviction: Eviction | None = None) -> JobResult:
    """Run the pods of ``jobset`` under its failure policy until it ends
    (:func:`tests.support.pod_runner.run_pods`: ``maxRestarts`` restarts, then Failed)."""
    max_restarts = (jobset["spec"].get("failurePolicy") or {}).get("maxRestarts", 0)
    return run_pods(engine, pods(jobset), max_restarts + 1, network, claims, binds, timeout,
                    eviction)
