"""The slurm scheduler's run options, its errors, and Slurm's time limits.

:func:`add_run_options` adds to TorchX's options (``partition``, ``time``, ``comment``, ...) the
ones this scheduler renders: ``account`` and ``qos`` (where TorchX lacks them: 0.7.0; main has
both and renders them itself), ``exclusive``, ``container_image`` / ``container_mounts``
(pyxis/enroot), ``signal_grace`` (:mod:`components.schedulers.slurm.requeue`) and ``job_dir``
as the parent of per-job directories (:mod:`components.schedulers.slurm.job_dir`).
"""

from __future__ import annotations

import re

from torchx.specs import runopts

from components.errors import ComponentArgumentError

NAME = "slurm"  # the scheduler's name in pyproject.toml's torchx.schedulers table

# sbatch options this scheduler adds where TorchX's lacks them (0.7.0; TorchX main has both).
SBATCH_OPTS = {"account": "the account the job is charged to (sbatch --account)",
               "qos": "the quality of service (sbatch --qos)"}

# sbatch --time: minutes, minutes:seconds, hours:minutes:seconds, days-hours,
# days-hours:minutes, days-hours:minutes:seconds.
_TIME = re.compile(r"^(?:(?P<d>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?"
                   r"|(?P<a>\d+)(?::(?P<b>\d+)(?::(?P<c>\d+))?)?)$")
_UNLIMITED = {"UNLIMITED", "INFINITE"}


def slurm_error(message: str) -> ComponentArgumentError:
    """The one-line error of this scheduler: ``slurm: <message>``."""
    return ComponentArgumentError(f"{NAME}: {message}")


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


def added_sbatch_opts(native: runopts) -> list[str]:
    """The :data:`SBATCH_OPTS` this scheduler renders: those TorchX's own options lack."""
    return [key for key in SBATCH_OPTS if native.get(key) is None]


def add_run_options(opts: runopts) -> runopts:
    """``opts`` (TorchX's slurm options) with this scheduler's added."""
    for name in added_sbatch_opts(opts):
        opts.add(name, type_=str, default=None, help=SBATCH_OPTS[name])
    opts.add("exclusive", type_=bool, default=False,
             help="take whole nodes, shared with no other job (sbatch --exclusive)")
    opts.add("container_image", type_=str, default=None,
             help="run every replica in this image with pyxis/enroot (srun --container-image)")
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
