"""What every trainer's ``main`` does: parse, join the process group, build, train.

A trainer supplies only ``build(cfg, env) -> Strategy``: its mesh, its wrapping or splitting
of the shared model. Bad arguments and errors found while starting exit with one line;
running out of memory prints the anatomy of the job and what to try next.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch

from trainers.config import TrainConfig, exit_on_config_error, parse_or_exit
from trainers.distributed import DistEnv, init_distributed
from trainers.loop import StepHook, Strategy, train
from trainers.oom import explain_out_of_memory

StrategyBuilder = Callable[[TrainConfig, DistEnv], Strategy]


def run(prog: str, build: StrategyBuilder, argv: Sequence[str] | None = None) -> None:
    """Train with the strategy ``build`` makes, as trainer ``prog`` (e.g. ``trainers.ddp``)."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    cfg = parse_or_exit(argv, prog)
    with exit_on_config_error(prog):
        train_in_group(cfg, prog, build)


def train_in_group(cfg: TrainConfig, prog: str, build: StrategyBuilder,
                   device: torch.device | None = None, on_step: StepHook | None = None) -> None:
    """Join (or form) the process group, build the strategy and train; an out-of-memory error
    is explained. ``device`` and ``on_step`` are for launchers that own the process group
    (see :func:`trainers.distributed.init_distributed` and :func:`trainers.loop.train`)."""
    with init_distributed(cfg, device) as env, explain_out_of_memory(cfg, prog, env.device):
        train(cfg, env, build(cfg, env), on_step)
