"""A decoder-only transformer in plain PyTorch; it knows nothing about parallelism.

Pre-norm blocks (LayerNorm -> causal self-attention -> residual, LayerNorm -> GELU MLP ->
residual), learned positional embeddings and a head tied to the token embedding. Attention
projections are separate ``wq``/``wk``/``wv``/``wo`` and the MLP is ``up``/``down`` so that tensor
parallelism can shard them column- and row-wise; attention infers the number of local heads
from the projection width, so it runs unchanged on a sharded block.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from trainers.core.attention import attention_fn, sdpa
from trainers.core.materialize import materialize
from trainers.spec.config import TrainConfig
from trainers.spec.shapes import MODEL_SIZES, ModelConfig


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

    A part of the model is this module with some blocks deleted and the embeddings
    (``tok_emb``, ``pos_emb``, ``emb_dropout``) or the output (``norm``, ``head``) set to None:
    its forward then takes or returns hidden states, and parameter names stay those of the
    whole model. Built on the meta device, it is given its weights by
    :func:`trainers.core.materialize.materialize` through :meth:`init_parameter`.
    """

    # Parameters that are another one under a second name (the tied head), by that name.
    shared_parameters: ClassVar[dict[str, str]] = {"head.weight": "tok_emb.weight"}

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

    def init_parameter(self, name: str, value: torch.Tensor, generator: torch.Generator) -> None:
        """Fill ``value``, the whole parameter ``name``, with its initial value (GPT-2's):
        N(0, 0.02) for matrices and embeddings, residual projections scaled by 1/sqrt(2 L),
        LayerNorm weights 1 and biases 0."""
        if value.dim() < 2:
            value.fill_(1.0 if name.endswith("weight") else 0.0)
            return
        std = 0.02
        if name.endswith(("wo.weight", "down.weight")):
            std /= (2 * self.cfg.n_layers) ** 0.5
        value.normal_(mean=0.0, std=std, generator=generator)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token plus positional embeddings: ``(batch, seq)`` -> ``(batch, seq, d_model)``."""
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.emb_dropout(self.tok_emb(tokens) + self.pos_emb(positions))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tok_emb is not None:
            x = self.embed(x)
        for block in self.blocks.values():
            x = block(x)
        return x if self.head is None else self.head(self.norm(x))


def build_model(name: str, dropout: float = 0.0, attention: str = "sdpa",
                attention_window: int = 256, seed: int | None = None,
                device: torch.device | str = "cpu") -> Transformer:
    """The named size with ``dropout`` and the ``attention`` implementation (``attention_window``
    keys per query for ``sliding_window``), built on the meta device and materialized on
    ``device`` with the weights every trainer gives it for ``seed`` (default: the seed torch
    was last seeded with); see :mod:`trainers.core.materialize`.

    Raises ValueError for an unknown attention, a window < 1, or dropout > 0 with an attention
    other than ``sdpa``.
    """
    model = build_meta_model(name, dropout, attention, attention_window)
    materialize(model, torch.device(device),
                torch.initial_seed() if seed is None else seed)
    return model


def meta_model(cfg: TrainConfig) -> Transformer:
    """The model ``cfg`` configures, on the meta device (the trainers' starting point)."""
    return build_meta_model(cfg.model, cfg.dropout, cfg.attention, cfg.attention_window)


def build_meta_model(name: str, dropout: float = 0.0, attention: str = "sdpa",
                     attention_window: int = 256) -> Transformer:
    """The named size on the meta device: shapes only, no memory; see :func:`build_model`."""
    with torch.device("meta"):
        return Transformer(dataclasses.replace(MODEL_SIZES[name], dropout=dropout,
                                               attention=attention,
                                               attention_window=attention_window))
