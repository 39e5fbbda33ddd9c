"""DistributedDataParallel trainer: ``python -m trainers.ddp --help``.

Under torchrun every rank holds the whole model and a shard of each batch; DDP all-reduces
gradients during backward, except on non-final accumulation micro-steps (``no_sync``). Run as a
plain process it trains on its own without DDP.
"""

from __future__ import annotations

from collections.abc import Sequence

from trainers.config import TrainConfig
from trainers.distributed import DistEnv
from trainers.entry import run
from trainers.loop import Strategy, prepare_model
from trainers.parallelize import DDPStrategy, apply_activation_checkpointing

PROG = "trainers.ddp"


def build(cfg: TrainConfig, env: DistEnv) -> Strategy:
    """The whole model on every rank, wrapped in DDP."""
    model = prepare_model(cfg, env.device)
    if cfg.activation_checkpointing:
        apply_activation_checkpointing(model)
    return DDPStrategy(model, env)


def main(argv: Sequence[str] | None = None) -> None:
    run(PROG, build, argv)


if __name__ == "__main__":
    main()
