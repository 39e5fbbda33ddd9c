"""Model shapes: the built-in sizes and the arithmetic on them (parameters, FLOPs per token).

A :class:`ModelConfig` is the shape facts of any model the trainers train: the built-in GPT-2-
and Llama-style families, a user's model spec (``MODULE:ATTR``) or a Hugging Face model
(``hf:DIR``). The planner, the memory anatomy, MFU and the pre-flight checks read only these
facts. Plain Python without torch, so components can validate arguments without importing it.
"""

from __future__ import annotations

from dataclasses import dataclass

# Model families whose layers the memory anatomy counts tensor by tensor; any other family
# (a user's model) is priced from its parameter count with the GPT family's activations.
FAMILIES = ("gpt", "llama")


@dataclass(frozen=True)
class ModelConfig:
    """Shape facts of a decoder-only transformer.

    ``family`` ``gpt``: LayerNorm, learned positions, GELU MLP of ``4 d``, head tied to the
    embedding. ``llama``: RMSNorm, rotary positions (``rope_theta``), SwiGLU MLP of
    ``ffn_dim``, ``n_kv_heads`` key/value heads (grouped-query attention), untied head. Any
    other family declares its exact parameter count in ``params``. ``tensor_parallel`` and
    ``pipeline`` say whether the model's spec has a tensor-parallel plan and can be split into
    pipeline stages (or spread over devices).
    """

    vocab_size: int
    n_layers: int
    n_heads: int
    d_model: int
    max_seq_len: int
    dropout: float = 0.0
    # Attention implementation (a name in trainers.models.attention.ATTENTIONS) and, for
    # sliding_window, the keys each query sees (its own included). Neither changes the shape.
    attention: str = "sdpa"
    attention_window: int = 256
    family: str = "gpt"
    n_kv_heads: int = 0  # 0: n_heads (multi-head attention)
    ffn_dim: int = 0  # 0: the family's default (4 d)
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5
    params: int = 0  # exact parameter count of a model outside FAMILIES
    tied_head: bool = False  # a llama-family head sharing the embedding (gpt's always does)
    tensor_parallel: bool = True
    pipeline: bool = True

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def d_ff(self) -> int:
        return self.ffn_dim or 4 * self.d_model

    @property
    def tied(self) -> bool:
        """Whether the head shares the token embedding's weight."""
        return self.family == "gpt" or self.tied_head

    def num_params(self) -> int:
        """Exact parameter count (a tied head counted once)."""
        d, vocab = self.d_model, self.vocab_size
        if self.family == "gpt":
            block = 4 * d * d + 2 * d * self.d_ff + 4 * d  # attention, MLP, two LayerNorms
            return vocab * d + self.max_seq_len * d + self.n_layers * block + 2 * d
        if self.family == "llama":
            kv = self.kv_heads * self.head_dim
            block = 2 * d * d + 2 * d * kv + 3 * d * self.d_ff + 2 * d  # q, o, k, v, SwiGLU, norms
            return (1 if self.tied else 2) * vocab * d + self.n_layers * block + d
        return self.params

    def block_matmul_params(self) -> int:
        """Matmul weights of one block (what tensor parallelism splits)."""
        d = self.d_model
        if self.family == "llama":
            return 2 * d * d + 2 * d * self.kv_heads * self.head_dim + 3 * d * self.d_ff
        if self.family == "gpt":
            return 4 * d * d + 2 * d * self.d_ff
        return (self.num_params() - self.embedding_params() - self.output_params()
                - self.n_layers * self.block_norm_params()) // self.n_layers

    def block_norm_params(self) -> int:
        """Norm parameters of one block (two LayerNorms with biases, or two RMSNorms)."""
        return 2 * self.d_model if self.family == "llama" else 4 * self.d_model

    def block_tensors(self) -> int:
        """Parameter tensors of one block."""
        return 9 if self.family == "llama" else 10

    def embedding_params(self) -> int:
        """Parameters of the input side (token and, for gpt, positional embeddings)."""
        positions = self.max_seq_len * self.d_model if self.family == "gpt" else 0
        return self.vocab_size * self.d_model + positions

    def output_params(self) -> int:
        """Parameters of the output side: the final norm and, untied, the head."""
        norm = self.d_model if self.family == "llama" else 2 * self.d_model
        return norm + (0 if self.tied else self.vocab_size * self.d_model)

    def flops_per_token(self, seq_len: int, adapters: int = 0) -> int:
        """Training FLOPs per token (forward + backward = 3x forward).

        ``6 N`` for every matmul weight (all parameters but the input embedding of an untied
        model and the positional embedding; norms included as a rounding error) plus
        ``12 L d T`` for the attention scores and weighted sum, the PaLM / nanoGPT convention
        (causal masking not discounted). ``adapters`` > 0: a LoRA run training that many
        adapter parameters on a frozen base, whose weights need no gradient: ``4 N`` (forward
        and the inputs' gradients) plus ``6`` per adapter parameter.
        """
        lookups = self.max_seq_len * self.d_model if self.family == "gpt" else (
            0 if self.tied else self.vocab_size * self.d_model)
        per_weight = 4 if adapters else 6
        return (per_weight * (self.num_params() - lookups) + 6 * adapters
                + 12 * self.n_layers * self.d_model * seq_len)


MODEL_SIZES: dict[str, ModelConfig] = {
    # CI: trains in seconds on one CPU core.
    "tiny": ModelConfig(vocab_size=256, n_layers=4, n_heads=4, d_model=64, max_seq_len=64),
    # The "baby GPT" shape (nanoGPT shakespeare-char) with a byte-level vocabulary: ~10.8M.
    "small": ModelConfig(vocab_size=256, n_layers=6, n_heads=6, d_model=384, max_seq_len=256),
    # GPU shapes: GPT-2 small, a 1.1B and a 6.6B model with GPT-2's padded vocabulary.
    "125m": ModelConfig(vocab_size=50304, n_layers=12, n_heads=12, d_model=768, max_seq_len=1024),
    "1b": ModelConfig(vocab_size=50304, n_layers=20, n_heads=16, d_model=2048, max_seq_len=2048),
    "7b": ModelConfig(vocab_size=50304, n_layers=32, n_heads=32, d_model=4096, max_seq_len=2048),
    # The Llama family. CI: seconds on one core, grouped-query attention (2 heads per kv head).
    "llama-tiny": ModelConfig(vocab_size=256, n_layers=4, n_heads=4, n_kv_heads=2, d_model=64,
                              ffn_dim=176, max_seq_len=64, family="llama"),
    # CPU demos with a trained BPE vocabulary of 4,096 (examples/stdlib_code): ~6.5M parameters.
    "llama-small": ModelConfig(vocab_size=4096, n_layers=6, n_heads=4, n_kv_heads=2,
                               d_model=256, ffn_dim=704, max_seq_len=256, family="llama"),
    # Llama 3.2 1B's shape (its head untied) and Llama 3 8B's.
    "llama-1b": ModelConfig(vocab_size=128256, n_layers=16, n_heads=32, n_kv_heads=8,
                            d_model=2048, ffn_dim=8192, max_seq_len=8192, family="llama"),
    "llama-8b": ModelConfig(vocab_size=128256, n_layers=32, n_heads=32, n_kv_heads=8,
                            d_model=4096, ffn_dim=14336, max_seq_len=8192, family="llama"),
}
