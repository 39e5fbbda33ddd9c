"""The ``fault_tolerant`` component rendered by ``torchx run --dryrun`` for Volcano
(``-s kubernetes``) and JobSet (``-s kubernetes_jobset``): the lighthouse first, with its ports;
one task or replicatedJob per replica group that restarts alone (never the job), with its own
retries; every group's ``--lighthouse`` URL naming the first role's first pod. The pods are
validated against the Kubernetes schema, each object against its CRD schema (read from
``VOLCANO_CRD_DIR`` / ``JOBSET_CRD_DIR``; unset, those tests skip, which fails under CI=true)."""

from __future__ import annotations

import re

from components.schedulers.k8s.jobset import RANK0_ENV
from components.schedulers.k8s.preemption import RESTART_ALONE_RULE
from tests.support.k8s import (
    jobset_pods,
    pod_of,
    render,
    validate_core,
    validate_jobset,
    validate_volcano,
)

GROUPS = 3
RETRIES = 2
PORT = 29650
ARGS = ["--model", "tiny", "--steps", "30", "--batch-size", "12"]
OPTIONS = ("--groups", str(GROUPS), "--lighthouse_port", str(PORT), "--max_retries",
           str(RETRIES))
LIGHTHOUSE_URL = re.compile(r"--lighthouse http://\$\{(\w+):=localhost\}:(\d+)")


def render_volcano() -> dict:
    """The Volcano Job of 3 groups of 2 ranks, 2 retries each."""
    return render("fault_tolerant", "1x2", ARGS, options=OPTIONS)


def render_jobset() -> dict:
    """The JobSet of the same component."""
    return render("fault_tolerant", "1x2", ARGS, options=OPTIONS, scheduler="kubernetes_jobset")


def _ports(container: dict) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container.get("ports", [])}


def test_volcano_job_runs_the_lighthouse_first_and_restarts_each_group_alone():
    job = render_volcano()
    tasks = job["spec"]["tasks"]
    assert [t["name"] for t in tasks] == ["lighthouse-0", *(f"replicagroup{g}-0"
                                                           for g in range(GROUPS))]
    lighthouse = tasks[0]["template"]["spec"]["containers"][0]
    assert lighthouse["command"][:3] == ["python", "-m", "trainers.tools.lighthouse"]
    assert f"--port {PORT}" in " ".join(lighthouse["command"])
    assert _ports(lighthouse) == {"lighthouse": PORT, "finished": PORT + 1}
    # the lighthouse's failure restarts the job (its retries); a group's restarts its task only
    assert "policies" not in tasks[0] and "maxRetry" not in tasks[0]
    assert job["spec"]["policies"] == [{"event": "PodEvicted", "action": "RestartJob"},
                                       {"event": "PodFailed", "action": "RestartJob"}]
    for task in tasks[1:]:
        assert task["maxRetry"] == RETRIES
        assert task["policies"] == [{"event": "PodEvicted", "action": "RestartTask"},
                                    {"event": "PodFailed", "action": "RestartTask"}]
    # Volcano counts every restart (task or job) in the job's one retryCount: room for each
    # group's retries and the lighthouse's (restart_policy)
    assert job["spec"]["maxRetry"] == RETRIES + GROUPS * RETRIES + 1
    for task in tasks:
        validate_core(pod_of(job, task))


def test_volcano_groups_reach_the_lighthouse_pod():
    """TorchX's rank0 env of Volcano is VC_<first task>_HOSTS, which the svc plugin sets in
    every pod to the first task's host; the lighthouse itself needs none."""
    job = render_volcano()
    for g, task in enumerate(job["spec"]["tasks"][1:]):
        command = task["template"]["spec"]["containers"][0]["command"][-1]
        env, port = LIGHTHOUSE_URL.search(command).groups()
        assert (env, int(port)) == ("VC_LIGHTHOUSE_0_HOSTS", PORT)
        assert f"--replica-group {g} " in command and f"--replica-groups {GROUPS} " in command
        assert "--rdzv_endpoint localhost:0 " in command  # each group: one node, its own
    assert "svc" in job["spec"]["plugins"]


def test_jobset_runs_the_lighthouse_first_and_restarts_each_group_alone():
    jobset = render_jobset()
    rjs = jobset["spec"]["replicatedJobs"]
    groups = [f"replicagroup{g}" for g in range(GROUPS)]
    assert [rj["name"] for rj in rjs] == ["lighthouse", *groups]
    lighthouse = rjs[0]["template"]["spec"]["template"]["spec"]["containers"][0]
    assert lighthouse["command"][:3] == ["python", "-m", "trainers.tools.lighthouse"]
    assert _ports(lighthouse) == {"lighthouse": PORT, "finished": PORT + 1}
    # the lighthouse's Job fails at once and the JobSet restarts (its retries); a group's Job
    # replaces its failed pod itself, RETRIES times, and only then fails the JobSet
    assert rjs[0]["template"]["spec"]["backoffLimit"] == 0
    assert [rj["template"]["spec"]["backoffLimit"] for rj in rjs[1:]] == [RETRIES] * GROUPS
    assert jobset["spec"]["failurePolicy"] == {
        "maxRestarts": RETRIES, "restartStrategy": "Recreate",
        "rules": [{"name": RESTART_ALONE_RULE, "action": "FailJobSet",
                   "targetReplicatedJobs": groups}]}
    assert "successPolicy" not in jobset["spec"]  # JobSet's default: every Job completes
    for pod in jobset_pods(jobset):
        validate_core(pod)


def test_jobset_groups_reach_the_lighthouse_pod():
    jobset = render_jobset()
    name = jobset["metadata"]["name"]
    for g, rj in enumerate(jobset["spec"]["replicatedJobs"][1:]):
        container = rj["template"]["spec"]["template"]["spec"]["containers"][0]
        env_name, port = LIGHTHOUSE_URL.search(container["command"][-1]).groups()
        assert (env_name, int(port)) == (RANK0_ENV, PORT)
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env[RANK0_ENV] == f"{name}-lighthouse-0-0.{name}"
        assert f"--replica-group {g} " in container["command"][-1]


def test_fault_tolerant_volcano_job_matches_the_crd():
    """The lighthouse task and the replica groups' own task policies (RestartTask)."""
    validate_volcano(render_volcano())


def test_fault_tolerant_jobset_matches_the_crd():
    """The replica groups' backoffLimit and the FailJobSet rule naming them."""
    validate_jobset(render_jobset())
