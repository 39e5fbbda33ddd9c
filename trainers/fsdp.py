"""FSDP2 trainer: ``python -m trainers.fsdp --help``.

Every block, then the root, is wrapped with ``fully_shard`` on a 1-D mesh over all ranks, so
each rank stores 1/N of the parameters, gradients and optimizer state and all-gathers a block's
parameters just for its forward and backward. ``--reshard-after-forward false`` keeps them
gathered from forward to backward (ZeRO-2-like: one all-gather less per block, more memory);
``true`` frees them (ZeRO-3). ``--dtype bf16`` computes in bf16 with fp32 gradient reduction
and master weights; ``--cpu-offload`` keeps the sharded state in CPU memory.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch.distributed.device_mesh import init_device_mesh

from trainers.config import TrainConfig
from trainers.distributed import DistEnv
from trainers.entry import run
from trainers.loop import Strategy, prepare_model
from trainers.parallelize import ShardedStrategy, apply_activation_checkpointing, apply_fsdp

PROG = "trainers.fsdp"


def build(cfg: TrainConfig, env: DistEnv) -> Strategy:
    """The model sharded with FSDP2 over a 1-D mesh of every rank."""
    mesh = init_device_mesh(env.device.type, (env.world_size,), mesh_dim_names=("dp",))
    model = prepare_model(cfg, env.device)
    if cfg.activation_checkpointing:
        apply_activation_checkpointing(model)
    apply_fsdp(model, mesh, cfg.reshard_after_forward, cfg.dtype == "bf16", cfg.cpu_offload)
    return ShardedStrategy(model, dp_rank=env.rank, dp_size=env.world_size)


def main(argv: Sequence[str] | None = None) -> None:
    run(PROG, build, argv)


if __name__ == "__main__":
    main()
