"""Fault injection: ``TRAINERS_KILL_AT=RANK:STEP[:WHERE]`` makes global rank RANK die by
SIGKILL at optimizer step STEP, once per run directory, so a restarted or requeued job that
resumes runs on to the end. WHERE is

* ``step`` (default): right after the step, before that step's checkpoint (a lost worker);
* ``save``: inside that step's checkpoint save, after the shards are written and before the
  checkpoint is committed (a crash mid-save);
* ``upload``: inside that step's checkpoint save, after the rank's own state is written and
  before its DCP shards are (a crash in the middle of an upload);
* ``node``: like ``step``, but the rank's torchrun agent is killed too (a lost node: torchrun
  cannot restart it in place, so only a scheduler retry brings the job back).

How the tests (and users rehearsing a restart policy) lose a worker:
``torchx run components/ddp.py:ddp --max_retries 1 --env TRAINERS_KILL_AT=1:6 --
--checkpoint-every 4``. The run directory keeps a marker ``fault-injected-rank<R>-step<S>``.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

from trainers.errors import ConfigError
from trainers.runs.storage import RunPath

ENV_VAR = "TRAINERS_KILL_AT"
PLACES = ("step", "save", "upload", "node")
# The places inside a checkpoint save; the others are after a step.
IN_SAVE = frozenset({"save", "upload"})


@dataclass(frozen=True)
class KillPoint:
    rank: int
    step: int
    where: str = "step"


def kill_point(value: str | None = None) -> KillPoint | None:
    """The kill point in ``TRAINERS_KILL_AT`` (or ``value``), or None when unset."""
    value = os.environ.get(ENV_VAR, "") if value is None else value
    if not value:
        return None
    rank, _, rest = value.partition(":")
    step, _, where = rest.partition(":")
    where = where or "step"
    if not rank.isdigit() or not step.isdigit() or int(step) < 1 or where not in PLACES:
        raise ConfigError(f"{ENV_VAR}={value}: expected RANK:STEP[:{'|'.join(PLACES)}] with "
                          "STEP >= 1, e.g. 1:6 or 0:8:save")
    return KillPoint(int(rank), int(step), where)


def maybe_kill(point: KillPoint | None, where: str, rank: int, step: int,
               run_dir: RunPath) -> None:
    """SIGKILL this process (and for ``node`` its torchrun agent) if this is the kill point
    (``where``: ``step``, or the place in a save) and it has not fired in ``run_dir`` before."""
    if point is None or (point.rank, point.step) != (rank, step) or \
            (point.where if point.where in IN_SAVE else "step") != where:
        return
    marker = run_dir / f"fault-injected-rank{rank}-step{step}"
    if marker.exists():
        return
    marker.write_text(f"{ENV_VAR}={rank}:{step}:{point.where}\n")
    print(f"[{rank}]: {ENV_VAR}: killing rank {rank} at step {step} ({point.where})", flush=True)
    if point.where == "node" and "TORCHELASTIC_RUN_ID" in os.environ:
        os.kill(os.getppid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


RESTART_COUNT_VARS = ("TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT",
                      "TRAINERS_RAY_RESTART_COUNT")


def restart_count() -> int:
    """How often this run was restarted: torchrun's in-place restarts, Slurm requeues and Ray
    Train worker-group restarts (``TRAINERS_RAY_RESTART_COUNT``, set by trainers.on_ray.worker)."""
    return sum(int(os.environ.get(name, "0") or 0) for name in RESTART_COUNT_VARS)
