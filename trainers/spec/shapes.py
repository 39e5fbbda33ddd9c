"""Model shapes: the named sizes and the arithmetic on them (parameters, FLOPs per token).

Plain Python without torch, so components can validate arguments without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the transformer."""

    vocab_size: int
    n_layers: int
    n_heads: int
    d_model: int
    max_seq_len: int
    dropout: float = 0.0
    # Attention implementation (a name in trainers.core.attention.ATTENTIONS) and, for
    # sliding_window, the keys each query sees (its own included). Neither changes the shape.
    attention: str = "sdpa"
    attention_window: int = 256

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
