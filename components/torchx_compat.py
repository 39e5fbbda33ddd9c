"""What differs between the TorchX releases this repository runs on, in one place.

The components and schedulers work on torchx 0.7.0 (pyproject.toml's pin) and on TorchX's
current main (PyPI's ``torchx-nightly``; ``.ci/nightly-env`` builds that environment). Each
difference is detected by the feature, not by a version number:

* Schedulers receive their run options as a typed dataclass on main (``StructuredOpts``, read as
  ``cfg.option`` by the built-in schedulers) and as a plain dict on 0.7.0: :func:`replace_cfg`
  changes options and keeps the type.
* A dry run's resolved options are ``AppDryRunInfo.cfg`` on main and ``._cfg`` on 0.7.0:
  :func:`dryrun_cfg` reads either.

The Slurm scheduler's differences (main's workspace builders) are in
components/schedulers/slurm/torchx_internals.py, with what it uses of TorchX's internals.

Where main does what an extension adds, the extension defers to it by asking the base class
(e.g. ``runopts.get``), not this module: see components/schedulers/slurm/options.py and
kubernetes_volcano.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TypeVar

from torchx import specs
from torchx.specs import CfgVal

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
