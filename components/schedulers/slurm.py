"""TorchX's slurm scheduler, extended: registered as ``slurm`` in pyproject.toml.

What it adds to torchx 0.7.0's :class:`~torchx.schedulers.slurm_scheduler.SlurmScheduler`:

* ``account``, ``qos`` and ``exclusive`` run options (sbatch ``--account``, ``--qos``,
  ``--exclusive`` on every heterogeneous component; TorchX main has its own ``account`` and
  ``qos``, which this scheduler then uses), and pyxis/enroot ``container_image`` /
  ``container_mounts`` (srun ``--container-image`` / ``--container-mounts``).
* ``job_dir`` names a parent directory: each job gets its own new directory under it (a
  snapshot of the workspace, the sbatch script, the logs and, by default, the run's outputs),
  so one profile serves every job. TorchX's own ``job_dir`` must not exist beforehand.
* A pre-flight against the cluster before anything is submitted: the partition exists, the
  time limit parses and fits the partition's, the job's nodes fit the partition, the job
  directory can be written, the account and QoS are the user's. Each failure is one line
  that names the fix (:class:`components.launch.ComponentArgumentError`).
* ``describe``/``list`` read ``sacct --json`` and normalise Slurm's states, so a cancelled job
  reports CANCELLED (0.7.0 crashes on ``CANCELLED by 0``).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping
from typing import Any

from torchx.schedulers.api import AppDryRunInfo, DescribeAppResponse, ListAppResponse
from torchx.schedulers.slurm_scheduler import (
    SLURM_STATES,
    SlurmBatchRequest,
)
from torchx.specs import AppDef, AppState, CfgVal, ReplicaStatus, Role, RoleStatus, runopts

from components.errors import ComponentArgumentError
from components.schedulers.run_options import StrictRunOptions
from components.torchx_compat import SlurmSchedulerBase, replace_cfg

# sbatch --time: minutes, minutes:seconds, hours:minutes:seconds, days-hours,
# days-hours:minutes, days-hours:minutes:seconds.
_TIME = re.compile(r"^(?:(?P<d>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?"
                   r"|(?P<a>\d+)(?::(?P<b>\d+)(?::(?P<c>\d+))?)?)$")
_UNLIMITED = {"UNLIMITED", "INFINITE"}
# sbatch options this scheduler adds where TorchX's lacks them (0.7.0; TorchX main has both).
_SBATCH_OPTS = {"account": "the account the job is charged to (sbatch --account)",
                "qos": "the quality of service (sbatch --qos)"}

# Components with more than one state are reported by the first state of this list they have.
_STATE_PRECEDENCE = [AppState.FAILED, AppState.CANCELLED, AppState.RUNNING, AppState.PENDING,
                     AppState.SUCCEEDED]


def time_limit_seconds(value: str) -> float:
    """Seconds in a Slurm time limit (``inf`` for UNLIMITED); ValueError when it does not parse."""
    if value.upper() in _UNLIMITED:
        return float("inf")
    match = _TIME.match(value.strip())
    if not match:
        raise ValueError(value)
    g = {k: int(v) for k, v in match.groupdict().items() if v is not None}
    if "d" in g:
        return g["d"] * 86400 + g["dh"] * 3600 + g.get("dm", 0) * 60 + g.get("ds", 0)
    if "c" in g:
        return g["a"] * 3600 + g["b"] * 60 + g["c"]
    return g["a"] * 60 + g.get("b", 0)


def slurm_state(state: str | list[str]) -> AppState:
    """TorchX's state for Slurm's: ``CANCELLED by 0`` is CANCELLED; a list (Slurm >= 23.02
    JSON) is read by its first entry; an unknown state is UNKNOWN rather than a crash."""
    if isinstance(state, list):
        state = state[0] if state else ""
    return SLURM_STATES.get(state.split(" ", 1)[0].strip(), AppState.UNKNOWN)


def _number(value: Any) -> Any:
    """An integer of ``sacct --json``: plain up to Slurm 23.02, ``{"set", "number"}`` after."""
    return value.get("number") if isinstance(value, dict) else value


def _partitions() -> dict[str, dict[str, str]] | None:
    """``scontrol show partition`` as {name: fields}; None where Slurm's tools are absent."""
    if shutil.which("scontrol") is None:
        return None
    proc = subprocess.run(["scontrol", "show", "partition", "-o"], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise ComponentArgumentError(
            f"slurm: cannot reach the Slurm controller ({proc.stderr.strip()}); "
            "check that slurmctld is up with `scontrol ping`")
    parts = {}
    for line in proc.stdout.splitlines():
        fields = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        if "PartitionName" in fields:
            parts[fields["PartitionName"]] = fields
    return parts


def _associations(user: str) -> list[tuple[str, set[str]]] | None:
    """The user's (account, allowed QoS) pairs from slurmdbd; None without sacctmgr."""
    if shutil.which("sacctmgr") is None:
        return None
    proc = subprocess.run(["sacctmgr", "-n", "-P", "show", "assoc", f"user={user}",
                           "format=account,qos"], capture_output=True, text=True)
    if proc.returncode != 0:
        return None
    pairs = []
    for line in proc.stdout.splitlines():
        account, _, qos = line.partition("|")
        pairs.append((account, set(filter(None, qos.split(",")))))
    return pairs


def slurm_user() -> str:
    return os.environ.get("USER") or os.environ.get("LOGNAME") or "root"


class ExtendedSlurmScheduler(StrictRunOptions, SlurmSchedulerBase):
    """TorchX's slurm scheduler with accounts, QoS, per-job directories, a cluster pre-flight
    and cancelled-job states (see the module docstring)."""

    registered_as = "slurm"

    def _run_opts(self) -> runopts:
        opts = super()._run_opts()
        for name, help_ in _SBATCH_OPTS.items():
            if opts.get(name) is None:  # TorchX main has both, and renders them itself
                opts.add(name, type_=str, default=None, help=help_)
        opts.add("exclusive", type_=bool, default=False,
                 help="take whole nodes, shared with no other job (sbatch --exclusive)")
        opts.add("container_image", type_=str, default=None,
                 help="run every replica in this image with pyxis/enroot "
                      "(srun --container-image)")
        opts.add("container_mounts", type_=str, default=None,
                 help="pyxis mounts, SRC:DST[,SRC:DST...] (srun --container-mounts)")
        opts.add("job_dir", type_=str, default=None,
                 help="parent directory of the jobs: each job runs in its own new directory "
                      "under it, holding the workspace snapshot, the sbatch script, the logs "
                      "and the outputs")
        return opts

    # -- pre-flight -----------------------------------------------------------------------

    def _preflight(self, cfg: Mapping[str, CfgVal], nodes: int) -> None:
        """Raise ComponentArgumentError for options this cluster cannot run."""
        limit = cfg.get("time")
        seconds = float("inf")
        if limit is not None:
            try:
                seconds = time_limit_seconds(str(limit))
            except ValueError:
                raise ComponentArgumentError(
                    f"slurm: time={limit} is not a Slurm time limit; use minutes (30), "
                    "HH:MM:SS (2:00:00) or D-HH:MM:SS (1-12:00:00)") from None
        job_dir = cfg.get("job_dir")
        if job_dir is not None:
            self._check_writable(str(job_dir))
        partitions = _partitions()
        if partitions is not None:
            self._check_partition(partitions, cfg.get("partition"), nodes, limit, seconds)
        self._check_association(cfg.get("account"), cfg.get("qos"))

    @staticmethod
    def _check_writable(job_dir: str) -> None:
        """Probe the nearest existing ancestor of ``job_dir`` with a scratch directory (root
        passes ``os.access`` even where the file system refuses, e.g. under /proc)."""
        parent = os.path.abspath(job_dir)
        while not os.path.exists(parent):
            parent = os.path.dirname(parent)
        try:
            os.rmdir(tempfile.mkdtemp(prefix=".torchx-probe-", dir=parent))
        except OSError as err:
            raise ComponentArgumentError(
                f"slurm: job_dir={job_dir} cannot be written ({parent}: {err.strerror}); "
                "pass -cfg job_dir=<a directory you can write>") from None

    @staticmethod
    def _check_partition(partitions: dict[str, dict[str, str]], name: CfgVal, nodes: int,
                         limit: CfgVal, seconds: float) -> None:
        """The partition (or the default one) exists, has the nodes, and allows the time
        limit; without a limit Slurm applies the partition's own default."""
        if name is None:
            default = [p for p, f in partitions.items() if f.get("Default") == "YES"]
            if not default:
                raise ComponentArgumentError(
                    "slurm: the cluster has no default partition; pass -cfg partition=<one of "
                    f"{', '.join(sorted(partitions))}>")
            name = default[0]
        fields = partitions.get(str(name))
        if fields is None:
            raise ComponentArgumentError(
                f"slurm: partition={name} does not exist; pass -cfg partition=<one of "
                f"{', '.join(sorted(partitions))}>")
        total = int(fields.get("TotalNodes", "0"))
        if nodes > total:
            raise ComponentArgumentError(
                f"slurm: the job needs {nodes} nodes (one per replica) but partition {name} has "
                f"{total}; lower the nodes in -j (e.g. -j {total}xN) or pick a bigger partition")
        max_time = fields.get("MaxTime", "UNLIMITED")
        if limit is not None and seconds > time_limit_seconds(max_time):
            raise ComponentArgumentError(
                f"slurm: time={limit} exceeds partition {name}'s limit {max_time}; "
                f"pass -cfg time=<at most {max_time}>")

    @staticmethod
    def _check_association(account: CfgVal, qos: CfgVal) -> None:
        if account is None and qos is None:
            return
        assoc = _associations(slurm_user())
        if assoc is None:
            return
        if account is not None:
            accounts = sorted({a for a, _ in assoc})
            if account not in accounts:
                raise ComponentArgumentError(
                    f"slurm: account={account} is not one of user {slurm_user()}'s accounts; pass "
                    f"-cfg account=<one of {', '.join(accounts) or '(none)'}>")
        if qos is not None:
            allowed = sorted(set().union(*(q for a, q in assoc
                                           if account is None or a == account)))
            if qos not in allowed:
                raise ComponentArgumentError(
                    f"slurm: qos={qos} is not allowed for user {slurm_user()}"
                    f"{f' in account {account}' if account else ''}; pass -cfg qos=<one of "
                    f"{', '.join(allowed) or '(none)'}>")

    # -- submission -----------------------------------------------------------------------

    @staticmethod
    def _new_job_dir(parent: str, name: str) -> str:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        return os.path.join(os.path.abspath(parent), f"{name}-{stamp}-{secrets.token_hex(2)}")

    def build_workspace_and_update_role(self, role: Role, workspace: str,
                                        cfg: Mapping[str, CfgVal]) -> None:
        """Snapshot the workspace into a new directory under ``job_dir`` (``role.image``
        carries its path to :meth:`_submit_dryrun`, as in TorchX's DirWorkspaceMixin)."""
        if cfg.get("job_dir") is None:
            return
        self._preflight(cfg, role.num_replicas)
        job_dir = self._new_job_dir(str(cfg["job_dir"]), role.name)
        os.makedirs(os.path.dirname(job_dir), exist_ok=True)
        super().build_workspace_and_update_role(role, workspace, {**cfg, "job_dir": job_dir})

    def _submit_dryrun(self, app: AppDef, cfg: Mapping[str, Any]
                       ) -> AppDryRunInfo[SlurmBatchRequest]:
        parent = cfg.get("job_dir")
        image = app.roles[0].image
        snapshot = (parent is not None and os.path.dirname(image) == os.path.abspath(parent)
                    and os.path.isdir(image))
        if not snapshot:  # a workspace snapshot ran the pre-flight before it was made
            self._preflight(cfg, sum(role.num_replicas for role in app.roles))
        if parent is not None:
            cfg = replace_cfg(cfg, job_dir=image if snapshot
                              else self._new_job_dir(parent, app.roles[0].name))
        info = super()._submit_dryrun(app, cfg)  # type: ignore[arg-type]
        native = super()._run_opts()
        ours = [key for key in _SBATCH_OPTS if native.get(key) is None]  # TorchX main's renders
        for replica in info.request.replicas.values():
            for key in ours:
                if cfg.get(key):
                    replica.sbatch_opts[key] = str(cfg[key])
            if cfg.get("exclusive"):
                replica.sbatch_opts["exclusive"] = None
            if cfg.get("container_image"):
                replica.srun_opts["container-image"] = str(cfg["container_image"])
                if cfg.get("container_mounts"):
                    replica.srun_opts["container-mounts"] = str(cfg["container_mounts"])
        return info

    def schedule(self, dryrun_info: AppDryRunInfo[SlurmBatchRequest]) -> str:
        """Create the job's directory (when no workspace snapshot made it), then sbatch."""
        if dryrun_info.request.job_dir is not None:
            os.makedirs(dryrun_info.request.job_dir, exist_ok=True)
        return super().schedule(dryrun_info)

    # -- state ----------------------------------------------------------------------------

    @staticmethod
    def _sacct_jobs(*args: str) -> list[dict[str, Any]]:
        proc = subprocess.run(["sacct", "--json", *args], capture_output=True, text=True,
                              check=True)
        return json.loads(proc.stdout)["jobs"]

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        """The job's state from ``sacct --json``: one replica per heterogeneous component
        (named ``<role>-<replica id>``), each at its latest attempt; ``num_restarts`` counts
        requeues."""
        apps = _group_attempts(self._sacct_jobs("-j", app_id))
        if app_id not in apps:
            return None
        attempts = apps[app_id]
        latest = _latest(attempts)
        roles: dict[str, Role] = {}
        statuses: dict[str, RoleStatus] = {}
        for job in latest:
            role_name, _, replica = job["name"].rpartition("-")
            if not role_name or not replica.isdigit():
                continue
            role = roles.setdefault(role_name, Role(name=role_name, image="", num_replicas=0))
            role.num_replicas += 1
            statuses.setdefault(role_name, RoleStatus(role_name, [])).replicas.append(
                ReplicaStatus(id=int(replica), role=role_name,
                              state=slurm_state(job["state"]["current"]),
                              hostname=job.get("nodes", "")))
        return DescribeAppResponse(
            app_id=app_id, state=_app_state(latest), msg=_describe_msg(latest),
            num_restarts=max(len(jobs) for jobs in attempts.values()) - 1,
            roles=list(roles.values()), roles_statuses=list(statuses.values()))

    def list(self, cfg: Mapping[str, CfgVal] | None = None) -> list[ListAppResponse]:
        """Every job slurmdbd knows, one entry per job (not per heterogeneous component);
        ``cfg`` (which TorchX main passes, and 0.7.0 does not) is not needed."""
        apps = _group_attempts(self._sacct_jobs("-S1970-01-01-00:00:01"))
        return [ListAppResponse(app_id=app_id, state=_app_state(_latest(attempts)))
                for app_id, attempts in apps.items()]


def _group_attempts(jobs: Iterable[dict[str, Any]]) -> dict[str, dict[int, list[dict[str, Any]]]]:
    """sacct's records as {app id: {heterogeneous offset: [one record per attempt]}}."""
    apps: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for job in jobs:
        het = job.get("het") or {}
        app_id = str(_number(het.get("job_id")) or job["job_id"])
        offset = _number(het.get("job_offset")) or 0
        apps.setdefault(app_id, {}).setdefault(offset, []).append(job)
    return apps


def _latest(attempts: dict[int, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each component's most recent attempt, in component order."""
    return [max(jobs, key=lambda j: _number(j["time"]["submission"]))
            for _, jobs in sorted(attempts.items())]


def _app_state(components: Iterable[dict[str, Any]]) -> AppState:
    """FAILED if any component failed, else CANCELLED if any was cancelled, else RUNNING or
    PENDING while any is, else SUCCEEDED."""
    states = {slurm_state(job["state"]["current"]) for job in components}
    return next((s for s in _STATE_PRECEDENCE if s in states), AppState.UNKNOWN)


def _describe_msg(components: Iterable[dict[str, Any]]) -> str:
    """``<name>: <state> (exit <code>)`` per component, e.g. ``ddp-0: FAILED (exit 1)``."""
    parts = []
    for job in components:
        state = job["state"]["current"]
        state = state[0] if isinstance(state, list) and state else state
        code = _number(job.get("exit_code", {}).get("return_code"))
        parts.append(f"{job['name']}: {state}" + (f" (exit {code})" if code else ""))
    return "; ".join(parts)


def create_scheduler(session_name: str, **kwargs: Any) -> ExtendedSlurmScheduler:
    """The entry point TorchX calls for ``-s slurm``."""
    return ExtendedSlurmScheduler(session_name=session_name)
