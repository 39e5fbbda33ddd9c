"""A decoder-only transformer in plain PyTorch; it knows nothing about parallelism.

Pre-norm blocks (LayerNorm -> causal self-attention -> residual, LayerNorm -> GELU MLP ->
residual), learned positional embeddings and a head tied to the token embedding. Attention
projections are separate ``wq``/``wk``/``wv``/``wo`` and the MLP is ``up``/``down`` so that tensor
parallelism can shard them column- and row-wise; attention infers the number of local heads
from the projection width, so it runs unchanged on a sharded block.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from trainers.shapes import MODEL_SIZES, ModelConfig


class Attention(nn.Module):
    """Causal multi-head self-attention through ``scaled_dot_product_attention``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.head_dim = cfg.head_dim
        self.dropout = cfg.dropout
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
        out = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
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
    whole model.
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
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2 initialisation: N(0, 0.02), residual projections scaled by 1/sqrt(2 L)."""
        for name, param in self.named_parameters():
            if param.dim() < 2:
                continue
            std = 0.02
            if name.endswith(("wo.weight", "down.weight")):
                std /= (2 * self.cfg.n_layers) ** 0.5
            nn.init.normal_(param, mean=0.0, std=std)
        for module in self.modules():
            if isinstance(module, nn.LayerNorm):
                module.reset_parameters()

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


def build_model(name: str, dropout: float = 0.0) -> Transformer:
    """The named size with ``dropout``; initialised from the current torch seed."""
    return Transformer(dataclasses.replace(MODEL_SIZES[name], dropout=dropout))
