"""Tensor-parallel trainer, 2-D with FSDP: ``python -m trainers.tensor_parallel --tp 2 --help``.

The ranks form a (dp x tp) mesh. Inside each group of ``--tp`` ranks every block's attention
and MLP matmuls are split Megatron-style (DTensor ``parallelize_module``; optionally sequence
parallel); across the ``dp`` groups (when there are more than one) the model is sharded with
FSDP2 and each group trains on its own shard of the batch. Put the tp ranks of a group on one
node: they communicate twice per block in forward and backward.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch.distributed.device_mesh import init_device_mesh

from trainers.core.distributed import DistEnv
from trainers.core.entry import run
from trainers.core.strategy import Strategy
from trainers.models import ModelSpec
from trainers.options.train_config import TrainConfig
from trainers.parallel.fsdp import ShardedStrategy
from trainers.parallel.parallelize import parallelize


def build(cfg: TrainConfig, env: DistEnv, spec: ModelSpec) -> Strategy:
    """Tensor parallel over the mesh's ``tp`` dimension, FSDP over ``dp`` when it has more
    than one group."""
    dp = cfg.dp_size(env.world_size)
    mesh = init_device_mesh(env.device.type, (dp, cfg.tp), mesh_dim_names=("dp", "tp"))
    model = spec.meta_model()
    parallelize(model, spec, cfg, env.device, tp_mesh=mesh["tp"],
                dp_mesh=mesh["dp"] if dp > 1 else None)
    if dp == 1:
        return Strategy(model, dp_rank=0, dp_size=1)
    return ShardedStrategy(model, dp_rank=mesh["dp"].get_local_rank(), dp_size=dp,
                           dp_group=mesh["dp"].get_group())


def main(argv: Sequence[str] | None = None) -> None:
    run("tensor_parallel", build, argv)


if __name__ == "__main__":
    main()
