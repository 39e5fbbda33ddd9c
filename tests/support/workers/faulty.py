"""Workers that fail on purpose, for the tests of the test harness and of torchrun's summary.

- ``python -m tests.support.workers.faulty hang``: under a launcher every rank joins the
  process group; rank 0 then waits in a barrier that rank 1 never reaches (it sleeps), so the
  run hangs until a deadline aborts it.
- ``--model tests.support.workers.faulty:RAISES_ON_RANK_1``: the tiny model's spec, whose
  build raises on global rank 1 (``RuntimeError: rank 1 was told to fail``), so a trainer
  under torchrun fails on that rank alone.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time

from trainers.models import ModelSpec
from trainers.models.registry import resolve_spec

MESSAGE = "rank 1 was told to fail"


def _build_or_raise(build):
    def build_model():
        if os.environ.get("RANK") == "1":
            raise RuntimeError(MESSAGE)
        return build()
    return build_model


_TINY = resolve_spec("tiny")
RAISES_ON_RANK_1: ModelSpec = dataclasses.replace(_TINY, build=_build_or_raise(_TINY.build))


def hang(argv: list[str]) -> None:
    """Rank 0 in a barrier, rank 1 asleep: every rank stuck (``argv``: trainer options, such
    as ``--pg-timeout``, that the process group is formed with)."""
    import torch.distributed as dist

    from trainers.config.parsing import parse_config
    from trainers.core.distributed import init_distributed

    with init_distributed(parse_config(["--device", "cpu", *argv], "ddp")) as env:
        print(f"rank {env.rank} joined", flush=True)
        if env.rank == 1:
            time.sleep(3600)
        dist.barrier()


if __name__ == "__main__" and sys.argv[1:2] == ["hang"]:
    hang(sys.argv[2:])
