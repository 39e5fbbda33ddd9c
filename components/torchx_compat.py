"""What differs between the TorchX releases this repository runs on, in one place.

The components and schedulers work on torchx 0.7.0 (pyproject.toml's pin) and on TorchX's
current main (PyPI's ``torchx-nightly``; ``.ci/nightly-env`` builds that environment). Each
difference is detected by the feature, not by a version number:

* Schedulers receive their run options as a typed dataclass on main (``StructuredOpts``, read as
  ``cfg.option`` by the built-in schedulers) and as a plain dict on 0.7.0: :func:`replace_cfg`
  changes options and keeps the type.

Each scheduler package keeps what it uses of TorchX's internals where TorchX has no public hook
in its torchx_private modules, with the versions they hold for:
components/schedulers/slurm/torchx_private.py (with main's workspace builders),
components/schedulers/k8s/torchx_private.py and components/schedulers/local/torchx_private.py
and torchx_private_docker.py.

Where main does what an extension adds, the extension defers to it by asking the base class
(e.g. ``runopts.get``), not this module: see components/schedulers/slurm/options.py and
components/schedulers/k8s/volcano.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TypeVar

from torchx.specs import CfgVal

Cfg = TypeVar("Cfg", bound=Mapping[str, CfgVal])


def replace_cfg(cfg: Cfg, **changes: CfgVal) -> Cfg:
    """``cfg`` with ``changes``, of the same type: a copy of TorchX main's options dataclass
    (``changes`` must name its fields), or a new dict for 0.7.0's plain mapping."""
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return dataclasses.replace(cfg, **changes)  # type: ignore[return-value]
    return {**cfg, **changes}  # type: ignore[return-value]
