"""FSDP2 trainer: ``python -m trainers.fsdp --help``.

Every block, then the root, is wrapped with ``fully_shard`` on a 1-D mesh over all ranks, so
each rank stores 1/N of the parameters, gradients and optimizer state and all-gathers a block's
parameters just for its forward and backward. ``--reshard-after-forward false`` keeps them
gathered from forward to backward (ZeRO-2-like: one all-gather less per block, more memory);
``true`` frees them (ZeRO-3). ``--dtype bf16`` computes in bf16 with fp32 gradient reduction
and master weights; ``--cpu-offload`` keeps the sharded state in CPU memory.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from torch.distributed.device_mesh import init_device_mesh

from trainers.config import exit_on_config_error, parse_or_exit
from trainers.distributed import init_distributed
from trainers.loop import prepare_model, train
from trainers.oom import explain_out_of_memory
from trainers.parallelize import ShardedStrategy, apply_activation_checkpointing, apply_fsdp

PROG = "trainers.fsdp"


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    cfg = parse_or_exit(argv, PROG)
    with exit_on_config_error(PROG), init_distributed(cfg) as env, \
            explain_out_of_memory(cfg, PROG, env.device):
        mesh = init_device_mesh(env.device.type, (env.world_size,), mesh_dim_names=("dp",))
        model = prepare_model(cfg, env.device)
        if cfg.activation_checkpointing:
            apply_activation_checkpointing(model)
        apply_fsdp(model, mesh, cfg.reshard_after_forward, cfg.dtype == "bf16", cfg.cpu_offload)
        train(cfg, env, ShardedStrategy(model, dp_rank=env.rank, dp_size=env.world_size))


if __name__ == "__main__":
    main()
