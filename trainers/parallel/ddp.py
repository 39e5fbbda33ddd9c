"""DistributedDataParallel: every rank a whole replica, gradients all-reduced in backward."""

from __future__ import annotations

import contextlib

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainers.core.distributed import DistEnv
from trainers.core.strategy import Strategy


class DDPStrategy(Strategy):
    """Every rank a data-parallel replica of the whole model (which may span several devices:
    DDP then places nothing itself)."""

    def __init__(self, model: nn.Module, env: DistEnv) -> None:
        if env.world_size > 1:
            on_one_gpu = ({p.device for p in model.parameters()} == {env.device}
                          and env.device.type == "cuda")
            device_ids = [env.device.index] if on_one_gpu else None
            model = DistributedDataParallel(model, device_ids=device_ids,
                                            gradient_as_bucket_view=True)
        super().__init__(model, dp_rank=env.rank, dp_size=env.world_size)

    def no_sync(self) -> contextlib.AbstractContextManager[None]:
        if isinstance(self.model, DistributedDataParallel):
            return self.model.no_sync()
        return contextlib.nullcontext()
