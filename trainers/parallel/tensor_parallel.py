"""Tensor parallelism: every block's matmuls split Megatron-style over a DTensor mesh."""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from trainers.core.model import Transformer


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
