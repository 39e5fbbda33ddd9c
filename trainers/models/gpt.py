"""The GPT-2-style family: a decoder-only transformer in plain PyTorch, and its model spec.

Pre-norm blocks (LayerNorm -> causal self-attention -> residual, LayerNorm -> GELU MLP ->
residual), learned positional embeddings and a head tied to the token embedding. Attention
projections are separate ``wq``/``wk``/``wv``/``wo`` and the MLP is ``up``/``down`` so that tensor
parallelism can shard them column- and row-wise; attention infers the number of local heads
from the projection width, so it runs unchanged on a sharded block. :func:`gpt_spec` tells the
trainers how to build, initialize and parallelize it (:mod:`trainers.models.protocol`); the
module registers it as the ``gpt`` family.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trainers.models.attention import attention_fn, packed_sdpa, sdpa
from trainers.models.common import block_tp_plan, scaled_init
from trainers.models.protocol import ModelSpec
from trainers.models.registry import register_family
from trainers.sizing.shapes import ModelConfig


class Attention(nn.Module):
    """Causal multi-head self-attention; ``cfg.attention`` picks the implementation.

    The implementations are in :mod:`trainers.models.attention`; the default, ``sdpa``, is
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

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        batch, seq, _ = x.shape
        # -1 heads: the local head count, which is n_heads / tp under tensor parallelism.
        q, k, v = (w(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
                   for w in (self.wq, self.wk, self.wv))
        dropout = self.dropout if self.training else 0.0
        if positions is not None:  # packed samples: sdpa, checked by the config
            out = packed_sdpa(q, k, v, positions, dropout_p=dropout)
        elif dropout > 0:  # sdpa, checked in __init__
            out = sdpa(q, k, v, dropout_p=dropout)
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

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), positions=positions)
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):
    """Token ids ``(batch, seq)`` -> logits ``(batch, seq, vocab)``; with ``positions``
    ``(batch, seq)``, packed samples (positions restart at 0 where a sample starts: its
    position embeddings, and attention within the sample).

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

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        if self.tok_emb is not None:
            where = torch.arange(x.shape[1], device=x.device) if positions is None else positions
            x = self.emb_dropout(self.tok_emb(x) + self.pos_emb(where))
        for block in self.blocks.values():
            x = block(x, positions=positions)
        return x if self.head is None else self.head(self.norm(x))


def gpt_spec(name: str, shape: ModelConfig) -> ModelSpec:
    """The spec of the GPT-family model of ``shape`` (``--model name``)."""
    return ModelSpec(shape=shape, build=lambda: Transformer(shape),
                     init_parameter=scaled_init(shape.n_layers),
                     shared_parameters={"head.weight": "tok_emb.weight"},
                     tp_plan=block_tp_plan,
                     first=("tok_emb", "pos_emb", "emb_dropout"), last=("norm", "head"))


register_family("gpt", gpt_spec)
