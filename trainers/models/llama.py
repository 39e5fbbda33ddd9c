"""The Llama-style family: RMSNorm, rotary positions, SwiGLU and grouped-query attention.

Laid out as Hugging Face's ``LlamaForCausalLM`` computes (rotary on the two halves of each
head, ``rotate_half``), so a checkpoint exports to it by renaming (``trainers.tools.export``).
Attention projections are ``wq`` (``n_heads`` heads) and ``wk``/``wv`` (``n_kv_heads``
heads, each shared by ``n_heads / n_kv_heads`` query heads); the MLP is
``down(silu(gate(x)) * up(x))``. Attention infers its local head counts from the projection
widths, so it runs unchanged on a tensor-parallel shard (which needs ``--tp`` to divide the
key/value heads). The head is a separate weight. The module registers it as the ``llama``
family.
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


def rotary_tables(head_dim: int, seq: int, theta: float, device: torch.device
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos`` and ``sin`` of every position's rotation angles, ``(seq, head_dim)`` in fp32,
    the frequencies repeated over the head's two halves."""
    inverse = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device,
                                           dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inverse)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of ``x`` ``(batch, heads, seq, head_dim)``."""
    first, second = x.chunk(2, dim=-1)
    return (x * cos + torch.cat((-second, first), dim=-1) * sin).to(x.dtype)


class Attention(nn.Module):
    """Causal grouped-query self-attention with rotary positions."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.dropout > 0 and cfg.attention != "sdpa":
            raise ValueError(f"attention dropout needs the sdpa attention, not "
                             f"{cfg.attention!r}; use dropout 0 or attention 'sdpa'")
        self.head_dim, self.dropout, self.rope_theta = cfg.head_dim, cfg.dropout, cfg.rope_theta
        self.attend = attention_fn(cfg.attention, cfg.attention_window)
        kv = cfg.kv_heads * cfg.head_dim
        self.wq = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.wk = nn.Linear(cfg.d_model, kv, bias=False)
        self.wv = nn.Linear(cfg.d_model, kv, bias=False)
        self.wo = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        batch, seq, _ = x.shape
        q, k, v = (w(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
                   for w in (self.wq, self.wk, self.wv))
        cos, sin = rotary_tables(self.head_dim, seq, self.rope_theta, q.device)
        if positions is not None:  # each packed sample rotated from its own position 0
            cos, sin = cos[positions][:, None], sin[positions][:, None]
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        group = q.shape[1] // k.shape[1]  # query heads per key/value head (on this rank)
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        dropout = self.dropout if self.training else 0.0
        if positions is not None:  # packed samples: sdpa, checked by the config
            out = packed_sdpa(q, k, v, positions, dropout_p=dropout)
        elif dropout > 0:  # sdpa, checked in __init__
            out = sdpa(q, k, v, dropout_p=dropout)
        else:
            out = self.attend(q, k, v)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


class MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.up = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.down = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.mlp = MLP(cfg)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.dropout(self.attn(self.attn_norm(x), positions=positions))
        return x + self.dropout(self.mlp(self.mlp_norm(x)))


class Llama(nn.Module):
    """Token ids ``(batch, seq)`` -> logits ``(batch, seq, vocab)``; with ``positions``
    ``(batch, seq)``, packed samples (rotary positions restart at 0 where a sample starts, and
    attention stays within the sample).

    A pipeline stage is this module with some blocks deleted and ``tok_emb`` or the output
    (``norm``, ``head``) set to None; its forward then takes or returns hidden states.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleDict({str(i): Block(cfg) for i in range(cfg.n_layers)})
        self.norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tied_head:
            self.head.weight = self.tok_emb.weight

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        if self.tok_emb is not None:
            x = self.tok_emb(x)
        for block in self.blocks.values():
            x = block(x, positions=positions)
        return x if self.head is None else self.head(self.norm(x))


def llama_tp_plan(sequence_parallel: bool) -> dict[str, object]:
    """The block plan of :func:`trainers.models.common.block_tp_plan` with SwiGLU's ``gate`` and
    ``up`` column-wise; key/value heads split like the query heads (``--tp`` divides both)."""
    return block_tp_plan(sequence_parallel, mlp=("gate", "up"))


def llama_spec(name: str, shape: ModelConfig) -> ModelSpec:
    """The spec of the Llama-family model of ``shape`` (``--model name``)."""
    return ModelSpec(shape=shape, build=lambda: Llama(shape),
                     init_parameter=scaled_init(shape.n_layers),
                     shared_parameters={"head.weight": "tok_emb.weight"} if shape.tied_head
                     else {},
                     tp_plan=llama_tp_plan, first=("tok_emb",), last=("norm", "head"))


register_family("llama", llama_spec)
