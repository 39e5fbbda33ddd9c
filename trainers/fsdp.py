"""FSDP2 trainer: ``python -m trainers.fsdp --help``.

Every block, then the root, is wrapped with ``fully_shard`` on a 1-D mesh over all ranks, so
each rank stores 1/N of the parameters, gradients and optimizer state and all-gathers a block's
parameters just for its forward and backward. ``--reshard-after-forward false`` keeps them
gathered from forward to backward (ZeRO-2-like: one all-gather less per block, more memory);
``true`` frees them (ZeRO-3). ``--dtype bf16`` computes in bf16 with fp32 gradient reduction
and master weights; ``--cpu-offload`` keeps the sharded state in CPU memory. The model is
sharded on the meta device, so a rank only ever allocates its shards.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch.distributed.device_mesh import init_device_mesh

from trainers.core.distributed import DistEnv
from trainers.core.entry import run
from trainers.core.strategy import Strategy
from trainers.models import ModelSpec
from trainers.options.train_config import TrainConfig
from trainers.parallel.fault_tolerant import join_replica_groups
from trainers.parallel.fsdp import ShardedStrategy
from trainers.parallel.parallelize import parallelize


def build(cfg: TrainConfig, env: DistEnv, spec: ModelSpec) -> Strategy:
    """The model sharded with FSDP2 over a 1-D mesh of every rank (of the replica group, with
    ``--fault-tolerant``: :mod:`trainers.parallel.fault_tolerant`)."""
    mesh = init_device_mesh(env.device.type, (env.world_size,), mesh_dim_names=("dp",))
    model = spec.meta_model()
    parallelize(model, spec, cfg, env.device, dp_mesh=mesh)
    strategy = ShardedStrategy(model, dp_rank=env.rank, dp_size=env.world_size)
    return join_replica_groups(cfg, env, strategy) if cfg.fault_tolerant else strategy


def main(argv: Sequence[str] | None = None) -> None:
    run("fsdp", build, argv)


if __name__ == "__main__":
    main()
