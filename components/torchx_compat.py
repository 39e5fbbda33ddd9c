"""What differs between the TorchX releases this repository runs on, in one place.

The components and schedulers work on torchx 0.7.0 (pyproject.toml's pin) and on TorchX's
current main (PyPI's ``torchx-nightly``; ``.ci/nightly-env`` builds that environment). Each
difference is detected by the feature, not by a version number:

* Schedulers receive their run options as a typed dataclass on main (``StructuredOpts``, read as
  ``cfg.option`` by the built-in schedulers) and as a plain dict on 0.7.0: :func:`replace_cfg`
  changes options and keeps the type.
* A dry run's resolved options are ``AppDryRunInfo.cfg`` on main and ``._cfg`` on 0.7.0:
  :func:`dryrun_cfg` reads either.
* Main's Slurm scheduler picks a workspace builder per job (``workspace_type``) and builds
  through the builder, so a subclass's ``build_workspace_and_update_role`` is never called:
  :class:`SlurmSchedulerBase` routes the ``dir`` builder through it again, as on 0.7.0.

Where main does what an extension adds, the extension defers to it by asking the base class
(e.g. ``runopts.get``), not this module: see components/schedulers/slurm.py and
kubernetes_volcano.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

from torchx import specs
from torchx.specs import CfgVal, Role

Cfg = TypeVar("Cfg", bound=Mapping[str, CfgVal])


def replace_cfg(cfg: Cfg, **changes: CfgVal) -> Cfg:
    """``cfg`` with ``changes``, of the same type: a copy of TorchX main's options dataclass
    (``changes`` must name its fields), or a new dict for 0.7.0's plain mapping."""
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return dataclasses.replace(cfg, **changes)  # type: ignore[return-value]
    return {**cfg, **changes}  # type: ignore[return-value]


def dryrun_cfg(info: specs.AppDryRunInfo) -> Mapping[str, CfgVal]:
    """The run options ``info`` (a scheduler's dry run) was resolved with."""
    return info.cfg if hasattr(info, "cfg") else info._cfg  # type: ignore[attr-defined]


def _slurm_scheduler_base() -> type:
    """TorchX's ``SlurmScheduler`` on 0.7.0; on main, a subclass building ``dir`` workspaces
    through ``build_workspace_and_update_role`` (which subclasses extend) as 0.7.0 does."""
    from torchx.schedulers.slurm_scheduler import SlurmScheduler

    if not hasattr(SlurmScheduler, "workspace_builders"):
        return SlurmScheduler  # torchx 0.7.0: the scheduler is its own (directory) builder
    from torchx.workspace.api import WorkspaceMixin
    from torchx.workspace.dir_workspace import DirWorkspaceMixin

    class SlurmSchedulerBase(SlurmScheduler):
        def caching_build_workspace_and_update_role(
                self, role: Role, cfg: Mapping[str, CfgVal],
                build_cache: dict[object, object]) -> None:
            if isinstance(self.workspace_builder(cfg)[1], DirWorkspaceMixin):
                # WorkspaceMixin's default: merge a multi-directory workspace, then call
                # self.build_workspace_and_update_role
                WorkspaceMixin.caching_build_workspace_and_update_role(
                    self, role, cfg, build_cache)
            else:
                super().caching_build_workspace_and_update_role(role, cfg, build_cache)

        def build_workspace_and_update_role(self, role: Role, workspace: str,
                                            cfg: Mapping[str, CfgVal]) -> None:
            self.workspace_builder(cfg)[1].build_workspace_and_update_role(role, workspace, cfg)

    return SlurmSchedulerBase


def __getattr__(name: str) -> Any:
    """``SlurmSchedulerBase`` (:func:`_slurm_scheduler_base`), made on first use: TorchX's Slurm
    scheduler takes a quarter of a second to import, which launching a component on another
    scheduler should not pay."""
    if name != "SlurmSchedulerBase":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    base = globals()[name] = _slurm_scheduler_base()
    return base
