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
  reports CANCELLED (0.7.0 crashes on ``CANCELLED by 0``); a job accounting does not know yet
  (the first second or so after ``sbatch``) is read from ``squeue``, so it reports PENDING.
* The workspace snapshot is made by :meth:`schedule`, so ``torchx run --dryrun`` writes nothing;
  it never copies the jobs' own parent directory.
* Every attempt of a requeued job appends to the same logs (srun and sbatch
  ``--open-mode=append``) after a line ``==== torchx: job <id> attempt <n> ... ====``.
* ``signal_grace`` (seconds): the job saves a checkpoint before its time limit, or when sent
  ``scancel --batch --signal=USR1``, requeues itself and resumes
  (:mod:`components.schedulers.slurm_preemption`).
* ``torchx log`` reads stdout by default, where the trainers write (``--streams stderr`` for
  stderr; ``combined`` gives stdout, then stderr).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import posixpath
import re
import secrets
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import fsspec
from torchx.schedulers.api import (
    AppDryRunInfo,
    DescribeAppResponse,
    ListAppResponse,
    Stream,
    filter_regex,
    split_lines_iterator,
)
from torchx.schedulers.local_scheduler import LogIterator
from torchx.schedulers.slurm_scheduler import (
    SLURM_STATES,
    SlurmBatchRequest,
    SlurmReplicaRequest,
    _get_job_dirs,
    _save_job_dir,
)
from torchx.specs import AppDef, AppState, CfgVal, ReplicaStatus, Role, RoleStatus, runopts
from torchx.workspace.api import walk_workspace

from components.errors import ComponentArgumentError
from components.schedulers.run_options import StrictRunOptions
from components.schedulers.slurm_preemption import (
    check_signal_grace,
    requeue_on_signal,
    sbatch_signal,
)
from components.torchx_compat import SlurmSchedulerBase, replace_cfg
from trainers.torchfree.paths import existing_ancestor, unwritable_reason

_log = logging.getLogger(__name__)

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

# States squeue shows that sacct (and so torchx's table) does not: a job whose nodes are still
# booting, or whose processes are being cleaned up.
_QUEUE_STATES = {"CONFIGURING": AppState.PENDING, "COMPLETING": AppState.RUNNING}

# Role metadata key: the workspace that schedule() snapshots into the role's image (job dir).
_SNAPSHOT_OF = "torchx_templates/slurm/snapshot_of"


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
    name = state.split(" ", 1)[0].strip()
    return SLURM_STATES.get(name) or _QUEUE_STATES.get(name, AppState.UNKNOWN)


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
        opts.add("signal_grace", type_=int, default=None,
                 help="seconds before the time limit at which the job saves a checkpoint, "
                      "requeues itself and resumes (sbatch --signal=B:USR1@N; also on scancel "
                      "--batch --signal=USR1); off by default")
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
        grace = cfg.get("signal_grace")
        if grace is not None:
            check_signal_grace(int(grace), seconds, f"time={limit}")
        job_dir = cfg.get("job_dir")
        if job_dir is not None:
            self._check_writable(str(job_dir))
        partitions = _partitions()
        if partitions is not None:
            self._check_partition(partitions, cfg.get("partition"), nodes, limit, seconds,
                                  None if grace is None else int(grace))
        self._check_association(cfg.get("account"), cfg.get("qos"))

    @staticmethod
    def _check_writable(job_dir: str) -> None:
        """Refuse a ``job_dir`` that cannot be created and written, without writing anything
        (a dry run writes nothing): :func:`trainers.torchfree.paths.unwritable_reason`."""
        reason = unwritable_reason(Path(job_dir))
        if reason is not None:
            raise ComponentArgumentError(_unwritable(job_dir, str(reason[0]), reason[1]))

    @staticmethod
    def _check_partition(partitions: dict[str, dict[str, str]], name: CfgVal, nodes: int,
                         limit: CfgVal, seconds: float, grace: int | None) -> None:
        """The partition (or the default one) exists, has the nodes, and allows the time
        limit; without a limit Slurm applies the partition's own default (DefaultTime, else
        MaxTime), which a ``signal_grace`` must then lie below."""
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
        if grace is not None and limit is None:
            field = "DefaultTime" if fields.get("DefaultTime", "NONE") != "NONE" else "MaxTime"
            check_signal_grace(grace, time_limit_seconds(fields.get(field, "UNLIMITED")),
                               f"partition {name}'s {field} {fields.get(field, 'UNLIMITED')}, "
                               "as no -cfg time is given")

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
        """Name a new directory under ``job_dir`` for the job and note the workspace to snapshot
        into it; nothing is written here, because TorchX calls this for ``--dryrun`` too.
        :meth:`schedule` makes the snapshot (``role.image`` carries the directory's path, as in
        TorchX's DirWorkspaceMixin)."""
        if cfg.get("job_dir") is None:
            return
        self._preflight(cfg, role.num_replicas)
        role.image = self._new_job_dir(str(cfg["job_dir"]), role.name)
        role.metadata[_SNAPSHOT_OF] = workspace

    def _submit_dryrun(self, app: AppDef, cfg: Mapping[str, Any]
                       ) -> AppDryRunInfo[SlurmBatchRequest]:
        parent = cfg.get("job_dir")
        workspace = app.roles[0].metadata.get(_SNAPSHOT_OF)
        if workspace is None:  # with a workspace, the pre-flight ran before it was noted
            self._preflight(cfg, sum(role.num_replicas for role in app.roles))
        if parent is not None:
            cfg = replace_cfg(cfg, job_dir=app.roles[0].image if workspace is not None
                              else self._new_job_dir(parent, app.roles[0].name))
        info = super()._submit_dryrun(app, cfg)  # type: ignore[arg-type]
        request = JobRequest(**{f.name: getattr(info.request, f.name)
                                for f in dataclasses.fields(SlurmBatchRequest)},
                             workspace=workspace, jobs_parent=parent,
                             signal_grace=cfg.get("signal_grace"))
        # A requeued job appends to the logs of its earlier attempts instead of truncating
        # them: the batch script's own log and (srun) every replica's.
        request.cmd.append("--open-mode=append")
        native = super()._run_opts()
        ours = [key for key in _SBATCH_OPTS if native.get(key) is None]  # TorchX main's renders
        for replica in request.replicas.values():
            replica.srun_opts["open-mode"] = "append"
            _env_with_commas_on_command_line(replica)
            for key in ours:
                if cfg.get(key):
                    replica.sbatch_opts[key] = str(cfg[key])
            if cfg.get("exclusive"):
                replica.sbatch_opts["exclusive"] = None
            if request.signal_grace is not None:
                replica.sbatch_opts["signal"] = sbatch_signal(request.signal_grace)
            if cfg.get("container_image"):
                replica.srun_opts["container-image"] = str(cfg["container_image"])
                if cfg.get("container_mounts"):
                    replica.srun_opts["container-mounts"] = str(cfg["container_mounts"])
        return AppDryRunInfo(request, repr)

    def schedule(self, dryrun_info: AppDryRunInfo[SlurmBatchRequest]) -> str:
        """Make the job's directory (with the workspace snapshot, if any), write the sbatch
        script into it and submit; a refused job leaves no directory behind."""
        req = dryrun_info.request
        job_dir = req.job_dir
        option = getattr(req, "jobs_parent", None) or job_dir
        workspace = getattr(req, "workspace", None)
        with tempfile.TemporaryDirectory() as scratch:
            if job_dir is not None:
                existed = _make_job_dir(job_dir, str(option))
                req.cmd += [f"--chdir={job_dir}"]
            try:
                if job_dir is not None and workspace is not None:
                    snapshot_workspace(workspace, job_dir, skip=[str(option), job_dir])
                path = os.path.join(job_dir or scratch, "torchx-sbatch.sh")
                req.cmd += [path]
                with open(path, "w") as f:
                    f.write(req.materialize())
                proc = subprocess.run(req.cmd, capture_output=True, text=True)
                if proc.returncode != 0:
                    said = (proc.stderr.strip() or proc.stdout.strip() or "no output")
                    raise ComponentArgumentError(
                        f"slurm: sbatch refused the job ({said.splitlines()[-1]}); use -cfg "
                        "options and -j/--gpu/--memMB sizes this cluster accepts (torchx "
                        "runopts slurm lists the options, sinfo -N -l the nodes)")
            except BaseException:
                if job_dir is not None:
                    _remove_job_dir(job_dir, existed)
                raise
        if proc.stderr.strip():  # sbatch's warnings
            print(proc.stderr.strip(), file=sys.stderr)
        job_id = proc.stdout.strip().split(";", 1)[0]
        if job_dir is not None:
            _save_job_dir(job_id, job_dir)
        return job_id

    def log_iter(self, app_id: str, role_name: str, k: int = 0, regex: str | None = None,
                 since: datetime | None = None, until: datetime | None = None,
                 should_tail: bool = False, streams: Stream | None = None) -> Iterable[str]:
        """The replica's log: stdout unless ``streams`` says otherwise (TorchX's Slurm scheduler
        defaults to stderr, where the trainers write nothing); ``combined`` is stdout, then
        stderr (Slurm keeps them in two files)."""
        if streams is None:
            _log.info("slurm: showing stdout, where the trainers write; errors and tracebacks "
                      "are in stderr: --streams stderr")
        if streams == Stream.COMBINED:
            names = ["out", "err"]
        else:
            names = ["err" if streams == Stream.STDERR else "out"]
        job_dirs = _get_job_dirs()
        paths = [os.path.join(job_dirs.get(app_id, ""), f"slurm-{app_id}-{role_name}-{k}.{ext}")
                 for ext in names]
        lines: Iterable[str] = _log_lines(app_id, paths, self, should_tail,
                                          app_id in job_dirs)
        lines = split_lines_iterator(lines)
        return filter_regex(regex, lines) if regex else lines

    # -- state ----------------------------------------------------------------------------

    @staticmethod
    def _sacct_jobs(*args: str) -> list[dict[str, Any]]:
        proc = subprocess.run(["sacct", "--json", *args], capture_output=True, text=True,
                              check=True)
        return json.loads(proc.stdout)["jobs"]

    @staticmethod
    def _squeue(app_id: str) -> str:
        """``squeue``'s ``ID|NAME|STATE|NODES`` lines for the job (one per heterogeneous
        component); empty once the controller has forgotten it (or never knew it)."""
        proc = subprocess.run(["squeue", "-h", "-j", app_id, "-o", "%i|%j|%T|%N"],
                              capture_output=True, text=True)
        return proc.stdout if proc.returncode == 0 else ""

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        """The job's state from ``sacct --json``: one replica per heterogeneous component
        (named ``<role>-<replica id>``), each at its latest attempt; ``num_restarts`` counts
        requeues."""
        apps = _group_attempts(self._sacct_jobs("-j", app_id))
        if app_id not in apps:  # accounting may not know a job submitted a moment ago
            return _describe_queued(app_id, self._squeue(app_id))
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


def _env_with_commas_on_command_line(replica: SlurmReplicaRequest) -> None:
    """Move the replica's environment variables whose value has a comma from srun's
    ``--export=ALL,K=V,...`` (which splits at every comma, so
    ``PET_SIGNALS_TO_HANDLE=SIGTERM,SIGUSR1`` arrived as ``SIGTERM`` and torchrun died of the
    SIGUSR1 it was meant to forward) to an ``env K=V ...`` prefix of the replica's command."""
    commas = {key: value for key, value in replica.env.items() if "," in value}
    if not commas:
        return
    replica.args = [*(f"{key}={value}" for key, value in commas.items()), replica.entrypoint,
                    *replica.args]
    replica.entrypoint = "env"
    for key in commas:
        del replica.env[key]


def _describe_queued(app_id: str, squeue: str) -> DescribeAppResponse | None:
    """The job as ``squeue -o '%i|%j|%T|%N'`` shows it (``squeue`` text: ``1234+0|ddp-0|PENDING|``
    per heterogeneous component, ``1234|ddp-0|...`` for a job of one); None if it is not there."""
    roles: dict[str, Role] = {}
    statuses: dict[str, RoleStatus] = {}
    states, parts = set(), []
    for line in squeue.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 4 or fields[0].split("+", 1)[0] != app_id:
            continue
        _, name, slurm, nodes = fields
        state = slurm_state(slurm)
        states.add(state)
        parts.append(f"{name}: {slurm}")
        role_name, _, replica = name.rpartition("-")
        if not role_name or not replica.isdigit():
            continue
        role = roles.setdefault(role_name, Role(name=role_name, image="", num_replicas=0))
        role.num_replicas += 1
        statuses.setdefault(role_name, RoleStatus(role_name, [])).replicas.append(
            ReplicaStatus(id=int(replica), role=role_name, state=state, hostname=nodes))
    if not parts:
        return None
    return DescribeAppResponse(
        app_id=app_id, state=next((s for s in _STATE_PRECEDENCE if s in states), AppState.UNKNOWN),
        msg="; ".join(parts) + " (from squeue: not in accounting yet)",
        roles=list(roles.values()), roles_statuses=list(statuses.values()))


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


@dataclasses.dataclass(repr=False)
class JobRequest(SlurmBatchRequest):
    """TorchX's sbatch request plus what :meth:`ExtendedSlurmScheduler.schedule` does first:
    snapshot ``workspace`` into ``job_dir`` (leaving out ``jobs_parent``, the ``job_dir``
    option, when it lies inside the workspace). Its script writes a line
    ``==== torchx: job <id> attempt <n> started <UTC time> ====`` into every replica's logs
    before each attempt, so the attempts of a requeued job stay apart in the appended logs.
    With ``signal_grace`` its script requeues the job once the tasks saved on SIGUSR1
    (:func:`components.schedulers.slurm_preemption.requeue_on_signal`)."""

    workspace: str | None = None
    jobs_parent: str | None = None
    signal_grace: int | None = None

    def materialize(self) -> str:
        script = super().materialize()
        logs = " ".join(f'"slurm-$SLURM_JOB_ID-"{shlex.quote(f"{name}.{ext}")}'
                        for name in self.replicas for ext in ("out", "err"))
        separator = ('attempt="==== torchx: job $SLURM_JOB_ID attempt '
                     '$((${SLURM_RESTART_COUNT:-0} + 1)) started '
                     '$(date -u +%Y-%m-%dT%H:%M:%SZ) ===="\n'
                     f'for log in {logs}; do echo "$attempt" >>"$log"; done\n')
        anchor = "\nset +e\nsrun "
        if anchor not in script:  # a TorchX other than 0.7.0 wrote another script
            raise RuntimeError(f"slurm: no {anchor!r} in TorchX's sbatch script:\n{script}")
        script = script.replace(anchor, "\n" + separator + anchor, 1)
        return script if self.signal_grace is None else requeue_on_signal(script)

    def __repr__(self) -> str:
        text = super().__repr__()
        if self.workspace is not None:
            text += (f"\n# At submission: {self.job_dir} is made with a snapshot of "
                     f"{self.workspace} (minus .torchxignore)\n")
        return text


def _unwritable(job_dir: str, parent: str, strerror: str) -> str:
    return (f"slurm: job_dir={job_dir} cannot be written ({parent}: {strerror}); "
            "pass -cfg job_dir=<a directory you can write>")


def _make_job_dir(path: str, option: str) -> str:
    """Create the job's new directory and its missing parents; return the directory that
    existed before. ``option`` is the ``job_dir`` the user passed, for the one-line error."""
    existed = str(existing_ancestor(Path(path)))
    try:
        os.makedirs(path)
    except OSError as err:
        raise ComponentArgumentError(_unwritable(option, existed, err.strerror)) from None
    return existed


def _remove_job_dir(path: str, existed: str) -> None:
    """Undo :func:`_make_job_dir`: remove the job's directory, then its parents below
    ``existed`` while they are empty (another job may have put its own there since)."""
    shutil.rmtree(path, ignore_errors=True)
    parent = os.path.dirname(os.path.abspath(path))
    while parent != existed and parent.startswith(existed.rstrip("/") + "/"):
        try:
            os.rmdir(parent)
        except OSError:
            break
        parent = os.path.dirname(parent)


def snapshot_workspace(workspace: str, target: str, skip: Iterable[str] = ()) -> None:
    """Copy ``workspace`` (a path or fsspec URL) into the existing directory ``target``, minus
    what its ``.torchxignore`` lists and minus the ``skip`` directories (local paths: the jobs'
    parent, so a ``job_dir`` inside the workspace never copies the earlier jobs). File modes
    are kept (scripts stay executable)."""
    fs, root = fsspec.core.url_to_fs(workspace)
    skipped = [os.path.abspath(d).rstrip("/") + "/" for d in skip]
    for dirpath, _, files in walk_workspace(fs, root):
        rel = posixpath.relpath(dirpath, root)
        for name, info in files.items():
            src = info["name"]
            if any((src + "/").startswith(d) for d in skipped):
                continue
            dest = os.path.join(target, name if rel == "." else os.path.join(rel, name))
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with fs.open(src, "rb") as fin, open(dest, "wb") as fout:
                shutil.copyfileobj(fin, fout)
            if isinstance(info.get("mode"), int):
                os.chmod(dest, stat.S_IMODE(info["mode"]))


def _log_lines(app_id: str, paths: list[str], scheduler: ExtendedSlurmScheduler, should_tail: bool,
               known_dir: bool) -> Iterator[str]:
    """The files' lines one after the other (TorchX's LogIterator on each); a file the job never
    wrote is one line naming why."""
    for path in paths:
        try:
            yield from LogIterator(app_id, path, scheduler, should_tail=should_tail)
        except RuntimeError as err:
            if "finished without writing" not in str(err):
                raise
            if known_dir:
                batch_log = os.path.join(os.path.dirname(path), f"slurm-{app_id}.out")
                raise ComponentArgumentError(
                    f"slurm: job {app_id} wrote no {path}: it ended before that replica started;"
                    f" torchx status gives its state and {batch_log} its batch script's "
                    "log") from None
            raise ComponentArgumentError(
                f"slurm: no {path} in {os.getcwd()} and job {app_id} is not in its "
                ".torchxslurmjobdirs; run torchx log from the directory you submitted the job "
                "from") from None


def create_scheduler(session_name: str, **kwargs: Any) -> ExtendedSlurmScheduler:
    """The entry point TorchX calls for ``-s slurm``."""
    return ExtendedSlurmScheduler(session_name=session_name)
