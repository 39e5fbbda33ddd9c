"""The slurm scheduler: TorchX's, with this package's options, pre-flight, job directories,
job script, states and logs (see components/schedulers/slurm/__init__.py).

It overrides the methods TorchX's Scheduler API defines for implementers: ``_run_opts``,
``_submit_dryrun``, ``schedule`` (as ``schedule_checked``, after the object-store check of
:class:`~components.schedulers.submit.SubmitChecks`), ``describe``, ``list``, ``log_iter`` and
the workspace builder's ``build_workspace_and_update_role``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from torchx.schedulers.api import AppDryRunInfo, DescribeAppResponse, ListAppResponse, Stream
from torchx.specs import AppDef, CfgVal, Role, runopts

from components.schedulers.run_options import StrictRunOptions
from components.schedulers.slurm.job_dir import (
    make_job_dir,
    new_job_dir,
    remove_job_dir,
    snapshot_workspace,
)
from components.schedulers.slurm.logs import replica_log
from components.schedulers.slurm.options import (
    NAME,
    add_run_options,
    added_sbatch_opts,
    slurm_error,
)
from components.schedulers.slurm.preflight import preflight
from components.schedulers.slurm.script import COLOCATED, JobRequest, job_request
from components.schedulers.slurm.states import (
    describe_accounted,
    describe_queued,
    group_attempts,
    latest,
    records_state,
    sacct_jobs,
    squeue_lines,
)
from components.schedulers.submit import SubmitChecks
from components.schedulers.torchx_workarounds.releases import replace_cfg
from components.schedulers.torchx_workarounds.slurm import SlurmSchedulerBase, record_job_dir

# Role metadata key: the workspace that schedule() snapshots into the role's image (job dir).
_SNAPSHOT_OF = "torchx_templates/slurm/snapshot_of"


class ExtendedSlurmScheduler(SubmitChecks, StrictRunOptions, SlurmSchedulerBase):
    """TorchX's slurm scheduler with accounts, QoS, per-job directories, a cluster pre-flight
    and cancelled-job states."""

    registered_as = NAME
    _sacct_jobs = staticmethod(sacct_jobs)
    _squeue = staticmethod(squeue_lines)

    def _run_opts(self) -> runopts:
        return add_run_options(super()._run_opts())

    def build_workspace_and_update_role(self, role: Role, workspace: str,
                                        cfg: Mapping[str, CfgVal]) -> None:
        """Name a new directory under ``job_dir`` for the job and note the workspace to snapshot
        into it; nothing is written here, because TorchX calls this for ``--dryrun`` too.
        :meth:`schedule` makes the snapshot (``role.image`` carries the directory's path, as in
        TorchX's DirWorkspaceMixin)."""
        if cfg.get("job_dir") is None:
            return
        preflight(cfg, role.num_replicas)
        role.image = new_job_dir(str(cfg["job_dir"]), role.name)
        role.metadata[_SNAPSHOT_OF] = workspace

    def _submit_dryrun(self, app: AppDef, cfg: Mapping[str, Any]) -> AppDryRunInfo[JobRequest]:
        parent = cfg.get("job_dir")
        workspace = app.roles[0].metadata.get(_SNAPSHOT_OF)
        colocated = tuple(f"{role.name}-0" for role in app.roles
                          if role.metadata.get(COLOCATED) and role.num_replicas == 1)
        if workspace is None:  # with a workspace, the pre-flight ran before it was noted
            preflight(cfg, sum(role.num_replicas for role in app.roles) - len(colocated))
        if parent is not None:
            cfg = replace_cfg(cfg, job_dir=app.roles[0].image if workspace is not None
                              else new_job_dir(parent, app.roles[0].name))
        info = super()._submit_dryrun(app, cfg)  # type: ignore[arg-type]
        request = job_request(info.request, cfg, added_sbatch_opts(super()._run_opts()),
                              workspace, parent, colocated)
        return AppDryRunInfo(request, repr)

    def schedule_checked(self, dryrun_info: AppDryRunInfo[JobRequest]) -> str:
        """Make the job's directory (with the workspace snapshot, if any), write the sbatch
        script into it and submit; a refused job leaves no directory behind."""
        req = dryrun_info.request
        job_dir = req.job_dir
        with tempfile.TemporaryDirectory() as scratch:
            if job_dir is not None:
                existed = make_job_dir(job_dir, str(req.jobs_parent or job_dir))
                req.cmd += [f"--chdir={job_dir}"]
            try:
                if job_dir is not None and req.workspace is not None:
                    snapshot_workspace(req.workspace, job_dir,
                                       skip=[str(req.jobs_parent or job_dir), job_dir])
                path = os.path.join(job_dir or scratch, "torchx-sbatch.sh")
                req.cmd += [path]
                with open(path, "w") as f:
                    f.write(req.materialize())
                proc = subprocess.run(req.cmd, capture_output=True, text=True)
                if proc.returncode != 0:
                    said = (proc.stderr.strip() or proc.stdout.strip() or "no output")
                    raise slurm_error(
                        f"sbatch refused the job ({said.splitlines()[-1]}); use -cfg "
                        "options and -j/--gpu/--memMB sizes this cluster accepts (torchx "
                        "runopts slurm lists the options, sinfo -N -l the nodes)")
            except BaseException:
                if job_dir is not None:
                    remove_job_dir(job_dir, existed)
                raise
        if proc.stderr.strip():  # sbatch's warnings
            print(proc.stderr.strip(), file=sys.stderr)
        job_id = proc.stdout.strip().split(";", 1)[0]
        if job_dir is not None:
            record_job_dir(job_id, job_dir)
        return job_id

    def log_iter(self, app_id: str, role_name: str, k: int = 0, regex: str | None = None,
                 since: datetime | None = None, until: datetime | None = None,
                 should_tail: bool = False, streams: Stream | None = None) -> Iterable[str]:
        """The replica's log (:func:`components.schedulers.slurm.logs.replica_log`)."""
        return replica_log(self, app_id, role_name, k, regex, should_tail, streams)

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        """The job's state from ``sacct --json``, or from ``squeue`` while accounting does not
        know it yet (components/schedulers/slurm/states.py)."""
        apps = group_attempts(self._sacct_jobs("-j", app_id))
        if app_id not in apps:  # accounting may not know a job submitted a moment ago
            return describe_queued(app_id, self._squeue(app_id))
        return describe_accounted(app_id, apps[app_id])

    def list(self, cfg: Mapping[str, CfgVal] | None = None) -> list[ListAppResponse]:
        """Every job slurmdbd knows, one entry per job (not per heterogeneous component);
        ``cfg`` (which TorchX main passes, and 0.7.0 does not) is not needed."""
        apps = group_attempts(self._sacct_jobs("-S1970-01-01-00:00:01"))
        return [ListAppResponse(app_id=app_id, state=records_state(latest(attempts)))
                for app_id, attempts in apps.items()]
