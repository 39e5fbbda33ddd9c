"""The GPT-2-style family: a decoder-only transformer in plain PyTorch, and its model spec.

Pre-norm blocks (LayerNorm -> causal self-attention -> residual, LayerNorm -> GELU MLP ->
residual), learned positional embeddings and a head tied to the token embedding. Attention
projections are separate ``wq``/``wk``/``wv``/``wo`` and the MLP is ``up``/``down`` so that tensor
parallelism can shard them column- and row-wise; attention infers the number of local heads
from the projection width, so it runs unchanged on a sharded block. :func:`gpt_spec` tells the
trainers how to build, initialize and parallelize it (:mod:`trainers.core.model_spec`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
)

from trainers.core.attention import attention_fn, sdpa
from trainers.core.model_spec import ModelSpec, ParameterInit
from trainers.torchfree.shapes import ModelConfig


class Attention(nn.Module):
    """Causal multi-head self-attention; ``cfg.attention`` picks the implementation.

    The implementations are in :mod:`trainers.core.attention`; the default, ``sdpa``, is
    ``scaled_dot_product_attention``. Attention dropout (``cfg.dropout``, in training) exists
    only for ``sdpa``: any other implementation with ``cfg.dropout > 0`` raises ValueError
    (the residual and MLP dropout would apply, the attention dropout silently not).
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.dropout > 0 and cfg.attention != "sdpa":
            raise ValueError(f"attention dropout needs the sdpa attention, not "
                             f"{cfg.attention!r}; use dropout 0 or attention 'sdpa'")
        self.head_dim = cfg.head_dim
        self.dropout = cfg.dropout
        self.attend = attention_fn(cfg.attention, cfg.attention_window)
        self.wq = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.wk = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.wv = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.wo = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        # -1 heads: the local head count, which is n_heads / tp under tensor parallelism.
        q, k, v = (w(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
                   for w in (self.wq, self.wk, self.wv))
        if self.training and self.dropout > 0:  # sdpa, checked in __init__
            out = sdpa(q, k, v, dropout_p=self.dropout)
        else:
            out = self.attend(q, k, v)
        out = out.transpose(1, 2).reshape(batch, seq, -1)
        return self.resid_dropout(self.wo(out))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.up = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.down = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.down(F.gelu(self.up(x))))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg)
        self.mlp_norm = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):
    """Token ids ``(batch, seq)`` -> logits ``(batch, seq, vocab)``.

    A part of the model (a pipeline stage) is this module with some blocks deleted and the
    embeddings (``tok_emb``, ``pos_emb``, ``emb_dropout``) or the output (``norm``, ``head``)
    set to None: its forward then takes or returns hidden states, and parameter names stay
    those of the whole model. The head shares the token embedding's weight.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.max_seq_len, cfg.d_model)
        self.emb_dropout = nn.Dropout(cfg.dropout)
        # A ModuleDict keyed by layer index keeps parameter names stable when a pipeline stage
        # deletes the blocks it does not own.
        self.blocks = nn.ModuleDict({str(i): Block(cfg) for i in range(cfg.n_layers)})
        self.norm = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tok_emb is not None:
            positions = torch.arange(x.shape[1], device=x.device)
            x = self.emb_dropout(self.tok_emb(x) + self.pos_emb(positions))
        for block in self.blocks.values():
            x = block(x)
        return x if self.head is None else self.head(self.norm(x))


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


def gpt_spec(shape: ModelConfig) -> ModelSpec:
    """The spec of the GPT-family model of ``shape``."""
    return ModelSpec(shape=shape, build=lambda: Transformer(shape),
                     init_parameter=scaled_init(shape.n_layers),
                     shared_parameters={"head.weight": "tok_emb.weight"},
                     tp_plan=block_tp_plan,
                     first=("tok_emb", "pos_emb", "emb_dropout"), last=("norm", "head"))
