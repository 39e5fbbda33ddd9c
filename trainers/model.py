"""A decoder-only transformer in plain PyTorch; it knows nothing about parallelism.

Pre-norm blocks (LayerNorm -> causal self-attention -> residual, LayerNorm -> GELU MLP ->
residual), learned positional embeddings and a head tied to the token embedding. Attention
projections are separate ``wq``/``wk``/``wv``/``wo`` and the MLP is ``up``/``down`` so that tensor
parallelism can shard them column- and row-wise; attention infers the number of local heads
from the projection width, so it runs unchanged on a sharded block.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the transformer."""

    vocab_size: int
    n_layers: int
    n_heads: int
    d_model: int
    max_seq_len: int
    dropout: float = 0.0

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def d_ff(self) -> int:
        return 4 * self.d_model

    def num_params(self) -> int:
        """Exact parameter count of :class:`Transformer` (the tied head counted once)."""
        d = self.d_model
        block = 4 * d * d + 2 * d * self.d_ff + 4 * d  # attention, MLP, two LayerNorms
        return self.vocab_size * d + self.max_seq_len * d + self.n_layers * block + 2 * d

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs per token (forward + backward = 3x forward).

        ``6 N`` for every matmul weight (all parameters but the positional embedding, LayerNorms
        included as a rounding error) plus ``12 L d T`` for the attention scores and weighted
        sum, the PaLM / nanoGPT convention (causal masking not discounted).
        """
        matmul_params = self.num_params() - self.max_seq_len * self.d_model
        return 6 * matmul_params + 12 * self.n_layers * self.d_model * seq_len


MODEL_SIZES: dict[str, ModelConfig] = {
    # CI: trains in seconds on one CPU core.
    "tiny": ModelConfig(vocab_size=256, n_layers=4, n_heads=4, d_model=64, max_seq_len=64),
    # The "baby GPT" shape (nanoGPT shakespeare-char) with a byte-level vocabulary: ~10.8M.
    "small": ModelConfig(vocab_size=256, n_layers=6, n_heads=6, d_model=384, max_seq_len=256),
    # GPU shapes: GPT-2 small, a 1.1B and a 6.6B model with GPT-2's padded vocabulary.
    "125m": ModelConfig(vocab_size=50304, n_layers=12, n_heads=12, d_model=768, max_seq_len=1024),
    "1b": ModelConfig(vocab_size=50304, n_layers=20, n_heads=16, d_model=2048, max_seq_len=2048),
    "7b": ModelConfig(vocab_size=50304, n_layers=32, n_heads=32, d_model=4096, max_seq_len=2048),
}


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
    """Token ids ``(batch, seq)`` -> logits ``(batch, seq, vocab)``."""

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

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.emb_dropout(self.tok_emb(tokens) + self.pos_emb(positions))
        for block in self.blocks.values():
            x = block(x)
        return self.head(self.norm(x))


def build_model(name: str, dropout: float = 0.0) -> Transformer:
    """The named size with ``dropout``; initialised from the current torch seed."""
    return Transformer(dataclasses.replace(MODEL_SIZES[name], dropout=dropout))
