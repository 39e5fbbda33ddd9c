"""TorchX's slurm scheduler, extended: registered as ``slurm`` in pyproject.toml
(:func:`create_scheduler`).

What it adds to TorchX's :class:`~torchx.schedulers.slurm_scheduler.SlurmScheduler`, module by
module:

* ``options``: the ``account``, ``qos`` and ``exclusive`` run options (sbatch ``--account``,
  ``--qos``, ``--exclusive`` on every heterogeneous component; TorchX main has its own
  ``account`` and ``qos``, which this scheduler then uses), pyxis/enroot ``container_image`` /
  ``container_mounts`` (srun ``--container-image`` / ``--container-mounts``), Slurm's time
  limits, and the scheduler's one-line errors (``slurm: ...``).
* ``preflight``: the options checked against the cluster before anything is submitted (the
  partition, the time limit, the nodes, the job directory, the account and QoS).
* ``job_dir``: ``job_dir`` names a parent directory; each job gets its own new directory under
  it with a snapshot of the workspace, made at submission, so ``torchx run --dryrun`` writes
  nothing (TorchX's own ``job_dir`` must not exist beforehand).
* ``script``: the sbatch request and job script, rendered from TorchX's request data: every
  attempt of a requeued job appends to the same logs after a line
  ``==== torchx: job <id> attempt <n> ... ====``.
* ``requeue``: ``signal_grace`` (seconds): the job saves a checkpoint before its time limit, or
  when sent ``scancel --batch --signal=USR1``, requeues itself and resumes.
* ``states``: ``describe``/``list`` read ``sacct --json`` and normalise Slurm's states, so a
  cancelled job reports CANCELLED (0.7.0 crashes on ``CANCELLED by 0``); a job accounting
  does not know yet is read from ``squeue``, so it reports PENDING.
* ``logs``: ``torchx log`` reads stdout by default, where the trainers write (``--streams
  stderr`` for stderr; ``combined`` gives stdout, then stderr).
* ``scheduler``: the scheduler class that ties them together.

What TorchX has no public hook for is in :mod:`components.schedulers.torchx_workarounds.slurm`.
"""

from __future__ import annotations

from typing import Any

from components.schedulers.slurm.scheduler import ExtendedSlurmScheduler


def create_scheduler(session_name: str, **kwargs: Any) -> ExtendedSlurmScheduler:
    """The entry point TorchX calls for ``-s slurm``."""
    return ExtendedSlurmScheduler(session_name=session_name)
