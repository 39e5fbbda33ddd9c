"""DistributedDataParallel trainer: ``python -m trainers.ddp --help``.

Under torchrun every rank holds the whole model and a shard of each batch; DDP all-reduces
gradients during backward, except on non-final accumulation micro-steps (``no_sync``). Run as a
plain process it trains on its own without DDP.
"""

from __future__ import annotations

from collections.abc import Sequence

from trainers.core.distributed import DistEnv
from trainers.core.entry import run
from trainers.core.strategy import Strategy
from trainers.models import ModelSpec, materialize
from trainers.options.train_config import TrainConfig
from trainers.parallel.compile import apply_block_options
from trainers.parallel.ddp import DDPStrategy
from trainers.parallel.fault_tolerant import join_replica_groups


def build(cfg: TrainConfig, env: DistEnv, spec: ModelSpec) -> Strategy:
    """The whole model on every rank, wrapped in DDP; with ``--fault-tolerant`` one replica
    group of several (:mod:`trainers.parallel.fault_tolerant`)."""
    model = spec.meta_model()
    apply_block_options(model, spec, cfg)
    materialize(model, env.device, cfg.seed, spec)
    strategy = DDPStrategy(model, env, cfg.grad_reduce_dtype)
    return join_replica_groups(cfg, env, strategy) if cfg.fault_tolerant else strategy


def main(argv: Sequence[str] | None = None) -> None:
    run("ddp", build, argv)


if __name__ == "__main__":
    main()
