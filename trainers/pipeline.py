"""Pipeline-parallel trainer: ``python -m trainers.pipeline --pp 2 --help``.

The blocks are split into ``pp x virtual-stages`` stages, each rank running ``--virtual-stages``
of them, and ``torch.distributed.pipelining`` runs a schedule over ``--microbatches``
micro-batches per step: ``gpipe`` (all forwards, then all backwards), ``1f1b`` (one forward one
backward in the steady state: at most pp micro-batches of activations alive),
``interleaved1f1b`` (two or more stages per rank: a smaller bubble) or ``zerobubble`` (input
and weight gradients split to fill the bubble). With ``--tp`` > 1 each stage's matmuls are
split over ``--tp`` ranks of one node (tensor parallel, optionally sequence parallel), and with
``--dp`` > 1 (by default world / (pp x tp)) several pipelines train on shards of the batch with
every stage sharded over them by FSDP2 (ZeRO-3, or ZeRO-2 with ``--reshard-after-forward
false``; ``--dtype bf16``, ``--cpu-offload``): 3-D parallelism. Each rank builds only its own
stages.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch.distributed.device_mesh import init_device_mesh

from trainers.core.distributed import DistEnv
from trainers.core.entry import run
from trainers.core.strategy import Strategy
from trainers.models import ModelSpec
from trainers.options.train_config import TrainConfig
from trainers.parallel.parallelize import parallelize
from trainers.parallel.pipeline import PipelineStrategy, split_stage, stage_indices


def build(cfg: TrainConfig, env: DistEnv, spec: ModelSpec) -> Strategy:
    """This rank's stages on a (pp, dp, tp) mesh: tp innermost, so a tensor-parallel group is
    consecutive ranks (one node); then dp, ranks of one node holding the same stage of
    different replicas; pp outermost, so stages span nodes and only activations cross them."""
    dp = cfg.dp_size(env.world_size)
    mesh = init_device_mesh(env.device.type, (cfg.pp, dp, cfg.tp),
                            mesh_dim_names=("pp", "dp", "tp"))
    num_stages = cfg.pp * cfg.virtual_stages
    indices = stage_indices(mesh["pp"].get_local_rank(), cfg.pp, num_stages)
    parts = []
    for index in indices:
        part = split_stage(spec.meta_model(), spec, index, num_stages)
        parallelize(part, spec, cfg, env.device, tp_mesh=mesh["tp"] if cfg.tp > 1 else None,
                    dp_mesh=mesh["dp"] if dp > 1 else None)
        parts.append(part)
    return PipelineStrategy(parts, spec, indices, cfg, mesh, env.device)


def main(argv: Sequence[str] | None = None) -> None:
    run("pipeline", build, argv)


if __name__ == "__main__":
    main()
