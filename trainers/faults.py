"""Fault injection: ``TRAINERS_KILL_AT=RANK:STEP`` makes global rank RANK kill itself with
SIGKILL right after optimizer step STEP (before that step's checkpoint), once per run
directory, so a restarted or requeued job that resumes runs on to the end.

This is how the tests (and users rehearsing their restart policy) lose a worker mid-run:
``torchx run -s local_cwd components/ddp.py:ddp --max_retries 1 --env TRAINERS_KILL_AT=1:6
-- --checkpoint-every 4``. A marker file ``fault-injected-rank<R>-step<S>`` in the run
directory records that the fault fired.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from trainers.errors import ConfigError

ENV_VAR = "TRAINERS_KILL_AT"


def kill_point(value: str | None = None) -> tuple[int, int] | None:
    """The (rank, step) in ``TRAINERS_KILL_AT`` (or ``value``), or None when unset."""
    value = os.environ.get(ENV_VAR, "") if value is None else value
    if not value:
        return None
    rank, sep, step = value.partition(":")
    if not sep or not rank.isdigit() or not step.isdigit() or int(step) < 1:
        raise ConfigError(f"{ENV_VAR}={value}: expected RANK:STEP with STEP >= 1, e.g. 1:6")
    return int(rank), int(step)


def maybe_kill(point: tuple[int, int] | None, rank: int, step: int, run_dir: Path) -> None:
    """SIGKILL this process if (rank, step) is the kill point and it has not fired before."""
    if point != (rank, step):
        return
    marker = run_dir / f"fault-injected-rank{rank}-step{step}"
    if marker.exists():
        return
    marker.write_text(f"{ENV_VAR}={rank}:{step}\n")
    print(f"[{rank}]: {ENV_VAR}: killing rank {rank} after step {step}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
