"""DistributedDataParallel: every rank a whole replica, gradients all-reduced in backward.

(No ``from __future__ import annotations`` here: DDP reads a comm hook's annotations at run
time and refuses them as strings.)
"""

import contextlib

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook
from torch.nn.parallel import DistributedDataParallel

from trainers.core.distributed import DistEnv
from trainers.core.strategy import Strategy


def bf16_reduce_hook(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """PyTorch's ``bf16_compress_hook`` under another name: DDP refuses to register a hook of
    that name unless CUDA with NCCL 2.10+ (or XPU) is there, a check made for NCCL versions
    without bf16; gloo reduces bf16 too, so the hook serves CPU jobs as well."""
    return bf16_compress_hook(state, bucket)


class DDPStrategy(Strategy):
    """Every rank a data-parallel replica of the whole model (which may span several devices:
    DDP then places nothing itself). ``reduce_dtype`` bf16 all-reduces the gradient buckets in
    bf16 (PyTorch's ``bf16_compress_hook``: each bucket cast to bf16 and divided by the world
    size, reduced, cast back into the fp32 gradients); fp32, the default, reduces them as they
    are."""

    def __init__(self, model: nn.Module, env: DistEnv, reduce_dtype: str = "fp32") -> None:
        if env.world_size > 1:
            on_one_gpu = ({p.device for p in model.parameters()} == {env.device}
                          and env.device.type == "cuda")
            device_ids = [env.device.index] if on_one_gpu else None
            model = DistributedDataParallel(model, device_ids=device_ids,
                                            gradient_as_bucket_view=True)
            if reduce_dtype == "bf16":
                model.register_comm_hook(None, bf16_reduce_hook)
        super().__init__(model, dp_rank=env.rank, dp_size=env.world_size)

    def no_sync(self) -> contextlib.AbstractContextManager[None]:
        if isinstance(self.model, DistributedDataParallel):
            return self.model.no_sync()
        return contextlib.nullcontext()
