"""The one place the slurm scheduler reaches into TorchX where TorchX has no public hook.

* The job-directory table ``.torchxslurmjobdirs`` (``<job id> = <job dir>`` lines in the
  directory a job was submitted from, where ``torchx log`` looks for a job's logs): TorchX
  writes and reads it with its private ``_save_job_dir`` and ``_get_job_dirs``
  (``torchx.schedulers.slurm_scheduler``, the same on 0.7.0 and main). :func:`record_job_dir`
  and :func:`job_dirs` call them, so the table keeps TorchX's own format and place.
* Main's ``SlurmScheduler`` picks a workspace builder per job (``workspace_builders``,
  ``workspace_type``) and builds through it, so a subclass's ``build_workspace_and_update_role``
  is never called; :class:`SlurmSchedulerBase` routes the ``dir`` builder through it again, as
  0.7.0 (where the scheduler is its own directory builder) does. On 0.7.0 it is TorchX's
  ``SlurmScheduler`` itself.
"""

from __future__ import annotations

from collections.abc import Mapping

from torchx.schedulers import slurm_scheduler
from torchx.schedulers.slurm_scheduler import SlurmScheduler
from torchx.specs import CfgVal, Role
from torchx.workspace.api import WorkspaceMixin
from torchx.workspace.dir_workspace import DirWorkspaceMixin


def record_job_dir(job_id: str, job_dir: str) -> None:
    """Add the job's directory to ``.torchxslurmjobdirs`` in the current directory."""
    slurm_scheduler._save_job_dir(job_id, job_dir)


def job_dirs() -> Mapping[str, str]:
    """``.torchxslurmjobdirs`` of the current directory as {job id: job dir}."""
    return slurm_scheduler._get_job_dirs()


class _DirBuilderThroughSubclass(SlurmScheduler):
    """TorchX main's Slurm scheduler, building ``dir`` workspaces through
    ``build_workspace_and_update_role`` (which subclasses extend)."""

    def caching_build_workspace_and_update_role(
            self, role: Role, cfg: Mapping[str, CfgVal],
            build_cache: dict[object, object]) -> None:
        if isinstance(self.workspace_builder(cfg)[1], DirWorkspaceMixin):
            # WorkspaceMixin's default: merge a multi-directory workspace, then call
            # self.build_workspace_and_update_role
            WorkspaceMixin.caching_build_workspace_and_update_role(self, role, cfg, build_cache)
        else:
            super().caching_build_workspace_and_update_role(role, cfg, build_cache)

    def build_workspace_and_update_role(self, role: Role, workspace: str,
                                        cfg: Mapping[str, CfgVal]) -> None:
        self.workspace_builder(cfg)[1].build_workspace_and_update_role(role, workspace, cfg)


SlurmSchedulerBase: type[SlurmScheduler] = (
    _DirBuilderThroughSubclass if hasattr(SlurmScheduler, "workspace_builders")
    else SlurmScheduler)
