"""What differs between the TorchX releases this repository runs on, in one place.

The components and schedulers work on torchx 0.7.0 (pyproject.toml's pin) and on TorchX's
current main (PyPI's ``torchx-nightly``; ``.ci/nightly-env`` builds that environment). Each
difference is detected by the feature, not by a version number:

* Schedulers receive their run options as a typed dataclass on main (``StructuredOpts``, read as
  ``cfg.option`` by the built-in schedulers) and as a plain dict on 0.7.0: :func:`replace_cfg`
  changes options and keeps the type.

* A dry-run result (``AppDryRunInfo``, set by ``Scheduler.submit_dryrun``) keeps its AppDef as
  the public ``app`` on main (where ``Runner.schedule`` reads it too) and the private ``_app``
  on 0.7.0: :func:`dryrun_app` reads either.

What each scheduler uses of TorchX's internals where TorchX has no public hook is in the modules
beside this one, with the releases they hold for: :mod:`.slurm` (with main's workspace
builders), :mod:`.k8s`, :mod:`.local` and :mod:`.local_docker`.

Where main does what an extension adds, the extension defers to it by asking the base class
(e.g. ``runopts.get``), not this module: see components/schedulers/slurm/options.py and
components/schedulers/k8s/volcano.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

from torchx.schedulers.api import AppDryRunInfo
from torchx.specs import AppDef, CfgVal

Cfg = TypeVar("Cfg", bound=Mapping[str, CfgVal])


def replace_cfg(cfg: Cfg, **changes: CfgVal) -> Cfg:
    """``cfg`` with ``changes``, of the same type: a copy of TorchX main's options dataclass
    (``changes`` must name its fields), or a new dict for 0.7.0's plain mapping."""
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return dataclasses.replace(cfg, **changes)  # type: ignore[return-value]
    return {**cfg, **changes}  # type: ignore[return-value]


def dryrun_app(dryrun_info: AppDryRunInfo[Any]) -> AppDef | None:
    """The AppDef a dry-run result was made of (None for one not made by ``submit_dryrun``):
    ``app`` on TorchX main, ``_app`` in torchx 0.7.0."""
    return getattr(dryrun_info, "app", None) or getattr(dryrun_info, "_app", None)
