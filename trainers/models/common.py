"""Pieces the families share: parameter initializations and the tensor-parallel plan of a
pre-norm transformer block."""

from __future__ import annotations

import torch
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
)

from trainers.models.protocol import ParameterInit


def normal_init(std: float) -> ParameterInit:
    """N(0, std) for matrices and embeddings, 1 for norm weights and 0 for biases: a
    reasonable ``init_parameter`` for a model of linear layers, embeddings and norms."""
    def init(name: str, value: torch.Tensor, generator: torch.Generator) -> None:
        if value.dim() >= 2:
            value.normal_(mean=0.0, std=std, generator=generator)
        else:
            value.fill_(0.0 if name.endswith("bias") else 1.0)
    return init


def scaled_init(n_layers: int) -> ParameterInit:
    """GPT-2's initialization, which both built-in families use: N(0, 0.02) for matrices and
    embeddings, the residual projections (``wo``, ``down``) scaled by 1/sqrt(2 L), norm
    weights 1 and biases 0."""
    def init(name: str, value: torch.Tensor, generator: torch.Generator) -> None:
        if value.dim() < 2:
            value.fill_(1.0 if name.endswith("weight") else 0.0)
            return
        std = 0.02
        if name.endswith(("wo.weight", "down.weight")):
            std /= (2 * n_layers) ** 0.5
        value.normal_(mean=0.0, std=std, generator=generator)
    return init


def block_tp_plan(sequence_parallel: bool, mlp: tuple[str, ...] = ("up",)) -> dict[str, object]:
    """Megatron-style plan of one pre-norm block (``attn_norm``, ``attn.wq/wk/wv/wo``,
    ``mlp_norm``, ``mlp.<in>/down``): q, k, v and the MLP's input projections ``mlp``
    column-wise (each rank computes its share of the heads), ``wo`` and ``down`` row-wise, one
    all-reduce after each. With ``sequence_parallel`` the residual stream between those regions
    stays sharded along the sequence: norms run on 1/tp of the tokens and each all-reduce
    becomes a reduce-scatter plus an all-gather."""
    residual = Shard(1) if sequence_parallel else Replicate()
    plan: dict[str, object] = {
        "attn.wq": ColwiseParallel(), "attn.wk": ColwiseParallel(), "attn.wv": ColwiseParallel(),
        "attn.wo": RowwiseParallel(output_layouts=residual,
                                   use_local_output=not sequence_parallel),
        "mlp.down": RowwiseParallel(output_layouts=residual,
                                    use_local_output=not sequence_parallel),
    }
    plan.update({f"mlp.{name}": ColwiseParallel() for name in mlp})
    if sequence_parallel:
        gather = PrepareModuleInput(input_layouts=(Shard(1),),
                                    desired_input_layouts=(Replicate(),))
        plan.update({"attn_norm": SequenceParallel(), "mlp_norm": SequenceParallel(),
                     "attn": gather, "mlp": gather})
    return plan
