"""Slurm's job states as TorchX's: ``sacct --json`` for a job accounting knows, ``squeue`` for
one submitted a moment ago (the first second or so after ``sbatch``).

A job is one heterogeneous component per replica, named ``<role>-<replica id>``; a requeued job
has one accounting record per attempt, of which the latest counts. A cancelled job reports
CANCELLED (TorchX 0.7.0 crashes on ``CANCELLED by 0``), a state TorchX does not know UNKNOWN.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable
from typing import Any

from torchx.schedulers.api import DescribeAppResponse
from torchx.schedulers.slurm_scheduler import SLURM_STATES
from torchx.specs import AppState, ReplicaStatus, Role, RoleStatus

# A job with components in more than one state is in the first state of this list they have.
_STATE_PRECEDENCE = [AppState.FAILED, AppState.CANCELLED, AppState.RUNNING, AppState.PENDING,
                     AppState.SUCCEEDED]

# States squeue shows that sacct (and so torchx's table) does not: a job whose nodes are still
# booting, or whose processes are being cleaned up.
_QUEUE_STATES = {"CONFIGURING": AppState.PENDING, "COMPLETING": AppState.RUNNING}

Record = dict[str, Any]  # one job record of ``sacct --json``


def slurm_state(state: str | list[str]) -> AppState:
    """TorchX's state for Slurm's: ``CANCELLED by 0`` is CANCELLED; a list (Slurm >= 23.02
    JSON) is read by its first entry; an unknown state is UNKNOWN rather than a crash."""
    if isinstance(state, list):
        state = state[0] if state else ""
    name = state.split(" ", 1)[0].strip()
    return SLURM_STATES.get(name) or _QUEUE_STATES.get(name, AppState.UNKNOWN)


def app_state(states: Iterable[AppState]) -> AppState:
    """The job's state from its components': FAILED if any failed, else CANCELLED if any was
    cancelled, else RUNNING or PENDING while any is, else SUCCEEDED."""
    found = set(states)
    return next((s for s in _STATE_PRECEDENCE if s in found), AppState.UNKNOWN)


def sacct_jobs(*args: str) -> list[Record]:
    """The records of ``sacct --json <args>``."""
    proc = subprocess.run(["sacct", "--json", *args], capture_output=True, text=True,
                          check=True)
    return json.loads(proc.stdout)["jobs"]


def squeue_lines(app_id: str) -> str:
    """``squeue``'s ``ID|NAME|STATE|NODES`` lines for the job (one per heterogeneous
    component); empty once the controller has forgotten it (or never knew it)."""
    proc = subprocess.run(["squeue", "-h", "-j", app_id, "-o", "%i|%j|%T|%N"],
                          capture_output=True, text=True)
    return proc.stdout if proc.returncode == 0 else ""


def group_attempts(jobs: Iterable[Record]) -> dict[str, dict[int, list[Record]]]:
    """sacct's records as {app id: {heterogeneous offset: [one record per attempt]}}."""
    apps: dict[str, dict[int, list[Record]]] = {}
    for job in jobs:
        het = job.get("het") or {}
        app_id = str(_number(het.get("job_id")) or job["job_id"])
        offset = _number(het.get("job_offset")) or 0
        apps.setdefault(app_id, {}).setdefault(offset, []).append(job)
    return apps


def latest(attempts: dict[int, list[Record]]) -> list[Record]:
    """Each component's most recent attempt, in component order."""
    return [max(jobs, key=lambda j: _number(j["time"]["submission"]))
            for _, jobs in sorted(attempts.items())]


def records_state(components: Iterable[Record]) -> AppState:
    """The job's state from its components' records (:func:`app_state`)."""
    return app_state(slurm_state(job["state"]["current"]) for job in components)


def describe_accounted(app_id: str, attempts: dict[int, list[Record]]) -> DescribeAppResponse:
    """The job from its sacct records (:func:`group_attempts`): each component at its latest
    attempt; ``num_restarts`` counts requeues. The message is ``<name>: <state> (exit <code>)``
    per component, e.g. ``ddp-0: FAILED (exit 1)``."""
    components = latest(attempts)
    replicas, parts = [], []
    for job in components:
        state = job["state"]["current"]
        replicas.append((job["name"], slurm_state(state), job.get("nodes", "")))
        state = state[0] if isinstance(state, list) and state else state
        code = _number(job.get("exit_code", {}).get("return_code"))
        parts.append(f"{job['name']}: {state}" + (f" (exit {code})" if code else ""))
    return _response(app_id, replicas, "; ".join(parts),
                     num_restarts=max(len(jobs) for jobs in attempts.values()) - 1)


def describe_queued(app_id: str, squeue: str) -> DescribeAppResponse | None:
    """The job as ``squeue -o '%i|%j|%T|%N'`` shows it (:func:`squeue_lines`:
    ``1234+0|ddp-0|PENDING|`` per heterogeneous component, ``1234|ddp-0|...`` for a job of
    one); None if it is not there."""
    replicas, parts = [], []
    for line in squeue.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 4 or fields[0].split("+", 1)[0] != app_id:
            continue
        _, name, slurm, nodes = fields
        replicas.append((name, slurm_state(slurm), nodes))
        parts.append(f"{name}: {slurm}")
    if not parts:
        return None
    return _response(app_id, replicas, "; ".join(parts) + " (from squeue: not in accounting yet)")


def _response(app_id: str, replicas: list[tuple[str, AppState, str]], msg: str,
              num_restarts: int = -1) -> DescribeAppResponse:
    """The job of these (component name, state, nodes): its roles and their replicas from the
    names ``<role>-<replica id>`` (a component named otherwise counts for the state only);
    ``num_restarts`` -1 is TorchX's "not known"."""
    roles: dict[str, Role] = {}
    statuses: dict[str, RoleStatus] = {}
    for name, state, nodes in replicas:
        role_name, _, replica = name.rpartition("-")
        if not role_name or not replica.isdigit():
            continue
        role = roles.setdefault(role_name, Role(name=role_name, image="", num_replicas=0))
        role.num_replicas += 1
        statuses.setdefault(role_name, RoleStatus(role_name, [])).replicas.append(
            ReplicaStatus(id=int(replica), role=role_name, state=state, hostname=nodes))
    return DescribeAppResponse(
        app_id=app_id, state=app_state(state for _, state, _ in replicas), msg=msg,
        num_restarts=num_restarts, roles=list(roles.values()),
        roles_statuses=list(statuses.values()))


def _number(value: Any) -> Any:
    """An integer of ``sacct --json``: plain up to Slurm 23.02, ``{"set", "number"}`` after."""
    return value.get("number") if isinstance(value, dict) else value
