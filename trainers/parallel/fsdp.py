"""FSDP2: ``fully_shard`` on each block and the root, and the strategy of a sharded model."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)

from trainers.core.strategy import Strategy
from trainers.models import ModelSpec


def apply_fsdp(model: nn.Module, spec: ModelSpec, dp_mesh: DeviceMesh,
               reshard_after_forward: bool, bf16: bool, cpu_offload: bool) -> None:
    """FSDP2 ``fully_shard`` on each of ``spec``'s blocks, then on the root (the rest:
    embeddings, norm, head).

    ``reshard_after_forward`` applies to the blocks; the root is never resharded after
    forward, since backward starts with it (the head) at once.
    ``bf16``: parameters all-gathered and computed in bf16, gradients reduced in fp32, the
    sharded fp32 parameters kept as master weights. ``cpu_offload``: shards, gradients and
    optimizer state live in CPU memory (pinned only on CUDA; pinning needs a GPU).
    """
    mp_policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
                 if bf16 else MixedPrecisionPolicy())
    offload = (CPUOffloadPolicy(pin_memory=dp_mesh.device_type == "cuda") if cpu_offload
               else OffloadPolicy())
    for _, block in spec.named_blocks(model):
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard_after_forward,
                    mp_policy=mp_policy, offload_policy=offload)
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=False, mp_policy=mp_policy,
                offload_policy=offload)


class ShardedStrategy(Strategy):
    """A model whose root is an FSDP module: FSDP's own gradient-sync switch and precision."""

    model: FSDPModule

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        self.model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            self.model.set_requires_gradient_sync(True)

    def autocast(self, dtype: str, device: torch.device) -> contextlib.AbstractContextManager:
        """No autocast: FSDP's MixedPrecisionPolicy casts parameters for bf16."""
        return contextlib.nullcontext()
