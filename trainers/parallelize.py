"""Parallelism applied to the plain model by small functions, and the sharded strategy.

Order matters and is the one torchtitan uses: tensor parallelism first (it addresses modules by
their names), then activation checkpointing (it wraps whole blocks), then FSDP (it shards
whatever parameters it finds, DTensors from tensor parallelism included).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    checkpoint_wrapper,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.nn.parallel import DistributedDataParallel

from trainers.distributed import DistEnv
from trainers.loop import Strategy
from trainers.model import Transformer


def apply_activation_checkpointing(model: Transformer) -> None:
    """Recompute each block's activations in backward (non-reentrant checkpointing).

    The wrapper keeps parameter names unchanged in state dicts, so checkpoints written with
    and without it are interchangeable.
    """
    for name, block in list(model.blocks.items()):
        model.blocks[name] = checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT)


def apply_tensor_parallel(model: Transformer, tp_mesh: DeviceMesh,
                          sequence_parallel: bool) -> None:
    """Shard every block's matmuls over ``tp_mesh`` (Megatron-style).

    Attention: ``wq``/``wk``/``wv`` column-wise (each rank computes n_heads / tp heads), ``wo``
    row-wise; MLP: ``up`` column-wise, ``down`` row-wise; one all-reduce after each. With
    ``sequence_parallel`` the residual stream between those regions stays sharded along the
    sequence (norms and dropout run on 1/tp of the tokens) and the all-reduces become a
    reduce-scatter plus an all-gather. Embeddings, the final norm and the tied head stay
    replicated.
    """
    residual = Shard(1) if sequence_parallel else Replicate()
    for block in model.blocks.values():
        plan = {
            "attn.wq": ColwiseParallel(), "attn.wk": ColwiseParallel(),
            "attn.wv": ColwiseParallel(),
            "attn.wo": RowwiseParallel(output_layouts=residual,
                                       use_local_output=not sequence_parallel),
            "mlp.up": ColwiseParallel(),
            "mlp.down": RowwiseParallel(output_layouts=residual,
                                        use_local_output=not sequence_parallel),
        }
        if sequence_parallel:
            gather = PrepareModuleInput(input_layouts=(Shard(1),),
                                        desired_input_layouts=(Replicate(),))
            plan.update({"attn_norm": SequenceParallel(), "mlp_norm": SequenceParallel(),
                         "attn": gather, "mlp": gather})
        parallelize_module(block, tp_mesh, plan)
    if sequence_parallel:
        blocks = list(model.blocks.values())
        parallelize_module(blocks[0], tp_mesh, PrepareModuleInput(
            input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),)))
        parallelize_module(blocks[-1], tp_mesh, PrepareModuleOutput(
            output_layouts=(Shard(1),), desired_output_layouts=(Replicate(),),
            use_local_output=True))


def apply_fsdp(model: Transformer, dp_mesh: DeviceMesh, reshard_after_forward: bool,
               bf16: bool, cpu_offload: bool) -> None:
    """FSDP2 ``fully_shard`` on each block, then on the root (embeddings, norm, head).

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
    for block in model.blocks.values():
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
