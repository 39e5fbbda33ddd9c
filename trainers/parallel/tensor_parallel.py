"""Tensor parallelism: every block's matmuls split over a DTensor mesh by the spec's plan."""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    PrepareModuleInput,
    PrepareModuleOutput,
    parallelize_module,
)

from trainers.errors import ConfigError
from trainers.models import ModelSpec


def apply_tensor_parallel(model: nn.Module, spec: ModelSpec, tp_mesh: DeviceMesh,
                          sequence_parallel: bool) -> None:
    """Shard every block over ``tp_mesh`` with ``spec.tp_plan(sequence_parallel)`` (e.g.
    Megatron-style: column-wise projections into each region, row-wise out of it). With
    ``sequence_parallel`` the residual stream enters the first block sharded along the sequence
    and leaves the last one whole. Everything outside the blocks stays replicated.
    ConfigError when the spec has no plan.
    """
    if spec.tp_plan is None:
        raise ConfigError("this model's spec has no tensor-parallel plan; pass --tp 1 or give "
                          "its ModelSpec a tp_plan")
    blocks = [block for _, block in spec.named_blocks(model)]
    for block in blocks:
        parallelize_module(block, tp_mesh, spec.tp_plan(sequence_parallel))
    if sequence_parallel:
        parallelize_module(blocks[0], tp_mesh, PrepareModuleInput(
            input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),)))
        parallelize_module(blocks[-1], tp_mesh, PrepareModuleOutput(
            output_layouts=(Shard(1),), desired_output_layouts=(Replicate(),),
            use_local_output=True))
