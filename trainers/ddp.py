"""DistributedDataParallel trainer: ``python -m trainers.ddp --help``.

Under torchrun every rank holds the whole model and a shard of each batch; DDP all-reduces
gradients during backward, except on non-final accumulation micro-steps (``no_sync``). Run as a
plain process it trains on its own without DDP.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from trainers.config import exit_on_config_error, parse_or_exit
from trainers.distributed import init_distributed
from trainers.loop import prepare_model, train
from trainers.oom import explain_out_of_memory
from trainers.parallelize import DDPStrategy, apply_activation_checkpointing

PROG = "trainers.ddp"


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    cfg = parse_or_exit(argv, PROG)
    with exit_on_config_error(PROG), init_distributed(cfg) as env, \
            explain_out_of_memory(cfg, PROG, env.device):
        model = prepare_model(cfg, env.device)
        if cfg.activation_checkpointing:
            apply_activation_checkpointing(model)
        train(cfg, env, DDPStrategy(model, env))


if __name__ == "__main__":
    main()
