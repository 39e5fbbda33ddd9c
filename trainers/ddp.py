"""DistributedDataParallel trainer: ``python -m trainers.ddp --help``.

Under torchrun every rank holds the whole model and a shard of each batch; DDP all-reduces
gradients during backward, except on non-final accumulation micro-steps (``no_sync``). Run as a
plain process it trains on its own without DDP.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainers.config import exit_on_config_error, parse_or_exit
from trainers.distributed import DistEnv, init_distributed
from trainers.loop import Strategy, prepare_model, train
from trainers.parallelize import apply_activation_checkpointing

PROG = "trainers.ddp"


class DDPStrategy(Strategy):
    """Every rank a data-parallel replica of the whole model."""

    def __init__(self, model: nn.Module, env: DistEnv) -> None:
        if env.world_size > 1:
            device_ids = [env.device.index] if env.device.type == "cuda" else None
            model = DistributedDataParallel(model, device_ids=device_ids,
                                            gradient_as_bucket_view=True)
        super().__init__(model, dp_rank=env.rank, dp_size=env.world_size)

    def no_sync(self) -> contextlib.AbstractContextManager[None]:
        if isinstance(self.model, DistributedDataParallel):
            return self.model.no_sync()
        return contextlib.nullcontext()


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    cfg = parse_or_exit(argv, PROG)
    with exit_on_config_error(PROG), init_distributed(cfg) as env:
        model = prepare_model(cfg, env.device)
        if cfg.activation_checkpointing:
            apply_activation_checkpointing(model)
        train(cfg, env, DDPStrategy(model, env))


if __name__ == "__main__":
    main()
