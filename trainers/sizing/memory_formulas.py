"""Memory anatomy of a training step per rank, predicted from the shapes (plain Python).

Five categories, in bytes per rank:

* **parameters**: the fp32 parameters (the master weights under bf16 autocast or FSDP's bf16
  policy, which casts copies for compute);
* **gradients**: fp32, one per parameter;
* **optimizer**: AdamW's two fp32 moments per parameter and a 4-byte step per tensor;
* **activations**: what autograd holds at the end of forward for backward, per micro-batch,
  counted tensor by tensor from the model's code (see :func:`block_activation_bytes`);
* **gathered**: whole parameters that FSDP holds at the end of forward besides its shards.

Sharding divides them over ``dp`` ranks: ZeRO-1 the optimizer state; ZeRO-2, which is FSDP
without resharding after forward, also the gradients and the parameters at rest, but holds
every parameter whole from forward to backward; ZeRO-3, FSDP, reshards each block after its
forward and keeps only the root (embeddings, final norm, tied head) whole. Tensor parallelism
divides each
block's matmul weights and the activations inside its column/row-parallel regions by ``tp``;
pipeline parallelism gives each stage ``1/pp`` of the blocks (the first stage also holds the
embeddings, the last the final norm and head, a copy of the tied embedding). The formulas
were derived from the tensors autograd saves and are checked against a live-tensor
measurement in ``tests/integration/test_memory.py``.

LoRA (:class:`Adapters`, ``--lora-rank``) changes the states: the frozen base has no gradients
and no optimizer state, and under bf16 its linear layers are held in bf16
(``trainers/models/lora.py``; embeddings and norms stay fp32), sharded as the base is; the
adapters (``rank x (in + out)`` per targeted linear layer) carry fp32 weights, gradients and
AdamW's two moments.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainers.errors import ConfigError
from trainers.sizing.shapes import FAMILIES, ModelConfig

FP32 = 4
BF16 = 2
# How data-parallel replicas share the training state: not at all (ddp) or ZeRO stage 1-3.
SHARDINGS = ("ddp", "zero1", "zero2", "zero3")


@dataclass(frozen=True)
class Anatomy:
    """Bytes per rank of each category. ``activations`` are one micro-batch's (a pipeline's:
    its last stage's, the output side included); ``total`` is the state and one micro-batch's
    activations, the rest is what a peak adds."""

    params: int
    grads: int
    optimizer: int
    activations: int
    gathered: int = 0
    peak: int = 0  # measured only: the step's peak of everything allocated
    # Predicted only: the block activation checkpointing recomputes in backward (held briefly),
    # and a pipeline's other stages' activations per micro-batch (no output side).
    recompute: int = 0
    stage_activations: int = 0

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.activations + self.gathered


@dataclass(frozen=True)
class Layout:
    """How a job is split: the sharding of its data-parallel replicas and the parallel degrees."""

    sharding: str = "ddp"
    dp: int = 1
    tp: int = 1
    pp: int = 1

    def __post_init__(self) -> None:
        if self.sharding not in SHARDINGS:
            raise ValueError(f"unknown sharding {self.sharding!r}; use one of {SHARDINGS}")


# Shape family -> the linear layers --lora-targets defaults to (PEFT's defaults: GPT-2's c_attn
# is our wq, wk, wv; Llama's q_proj, v_proj); trainers/models/lora.py applies them.
LORA_DEFAULT_TARGETS = {"gpt": ("wq", "wk", "wv"), "llama": ("wq", "wv"),
                        "hf": ("q_proj", "v_proj")}
# Hugging Face's names of the llama family's linear layers (hf:DIR models).
HF_LINEARS = {"q_proj": "wq", "k_proj": "wk", "v_proj": "wv", "o_proj": "wo",
              "gate_proj": "gate", "up_proj": "up", "down_proj": "down", "lm_head": "head"}


def parse_targets(targets: str) -> tuple[str, ...]:
    """``--lora-targets`` as a tuple of names (empty: the family's default)."""
    return tuple(t.strip() for t in targets.split(",") if t.strip())


@dataclass(frozen=True)
class Adapters:
    """LoRA's adapters: rank ``rank`` on the linear layers ``targets`` names (last name parts,
    ours or Hugging Face's; empty: the family's default)."""

    rank: int
    targets: tuple[str, ...] = ()

    @classmethod
    def of(cls, lora_rank: int, lora_targets: str) -> Adapters | None:
        """The adapters ``--lora-rank``/``--lora-targets`` ask for (None: rank 0, every
        parameter trains)."""
        return cls(lora_rank, parse_targets(lora_targets)) if lora_rank else None


def linear_sizes(shape: ModelConfig) -> dict[str, tuple[int, int]]:
    """(in, out) features of each linear layer of a block of ``shape`` (gpt or llama family) by
    its last name part, and of the head."""
    d, ffn, kv = shape.d_model, shape.d_ff, shape.kv_heads * shape.head_dim
    if shape.family == "gpt":
        kv = d
    mlp = {"up": (d, ffn), "down": (ffn, d)}
    if shape.family == "llama":
        mlp["gate"] = (d, ffn)
    return {"wq": (d, d), "wk": (d, kv), "wv": (d, kv), "wo": (d, d), **mlp,
            "head": (d, shape.vocab_size)}


def adapter_params(shape: ModelConfig, adapters: Adapters, pp: int = 1) -> tuple[int, int]:
    """(adapter parameters, adapter tensors) on the heaviest stage of ``pp`` (its ``1/pp`` of
    the blocks, and the head's adapter when targeted). ConfigError for a target the family
    lacks."""
    sizes = linear_sizes(shape)
    targets = [HF_LINEARS.get(t, t) for t in
               adapters.targets or LORA_DEFAULT_TARGETS[shape.family]]
    unknown = [t for t in targets if t not in sizes]
    if unknown:
        raise ConfigError(f"--lora-targets {','.join(unknown)} matches no linear layer of a "
                          f"{shape.family} model; pass some of {','.join(sorted(sizes))}")
    per_layer = [sizes[t] for t in targets if t != "head"]
    params = shape.n_layers // pp * sum(adapters.rank * (i + o) for i, o in per_layer)
    tensors = shape.n_layers // pp * 2 * len(per_layer)
    if "head" in targets:
        params, tensors = params + adapters.rank * (shape.d_model + shape.vocab_size), tensors + 2
    return params, tensors


def _outside_blocks(shape: ModelConfig, pp: int) -> tuple[int, int]:
    """(parameters, parameter tensors) outside the blocks on the heaviest pipeline stage: all
    of them without a pipeline; else the first stage's embeddings or the last stage's final
    norm and head (with a copy of a tied head), whichever is larger. Under ZeRO-3 these stay
    whole from forward to backward (FSDP's root)."""
    gpt = shape.family == "gpt"
    embeddings, first_tensors = shape.embedding_params(), 2 if gpt else 1
    output, last_tensors = shape.output_params(), (2 if gpt else 1) + (0 if shape.tied else 1)
    if pp == 1:
        return embeddings + output, first_tensors + last_tensors
    tied_copy = shape.vocab_size * shape.d_model if shape.tied else 0
    return max((embeddings, first_tensors),
               (output + tied_copy, last_tensors + (1 if shape.tied else 0)))


def _split_params(shape: ModelConfig, tp: int, pp: int) -> tuple[int, int]:
    """(parameters, parameter tensors) held by the heaviest pipeline stage of one TP rank."""
    layers = shape.n_layers // pp
    # Matmuls split by tp, norms whole; everything outside the blocks whole.
    block = shape.block_matmul_params() // tp + shape.block_norm_params()
    outside, outside_tensors = _outside_blocks(shape, pp)
    return layers * block + outside, layers * shape.block_tensors() + outside_tensors


def frozen_base_bytes(shape: ModelConfig, layout: Layout, dtype: str) -> int:
    """Bytes of a LoRA run's frozen base on the heaviest stage of one rank, before sharding:
    its linear layers (the blocks' matmuls, an untied head) in the compute dtype, the rest
    (embeddings, norms, a tied head) in fp32."""
    params = _split_params(shape, layout.tp, layout.pp)[0]
    linears = shape.n_layers // layout.pp * shape.block_matmul_params() // layout.tp + (
        0 if shape.tied else shape.vocab_size * shape.d_model)
    return params * FP32 - linears * (FP32 - (BF16 if dtype == "bf16" else FP32))


def state_bytes(shape: ModelConfig, layout: Layout, dtype: str = "fp32",
                adapters: Adapters | None = None) -> tuple[int, int, int]:
    """Bytes per rank of (parameters, gradients, optimizer state) at rest; with ``adapters``
    (LoRA, a gpt or llama family shape) only the adapters train (:func:`frozen_base_bytes`)."""
    dp = layout.dp
    shards = {"ddp": (1, 1, 1), "zero1": (1, 1, dp), "zero2": (dp, dp, dp),
              "zero3": (dp, dp, dp)}[layout.sharding]
    if adapters is not None and shape.family in FAMILIES:
        trained, tensors = adapter_params(shape, adapters, layout.pp)
        held = frozen_base_bytes(shape, layout, dtype) + trained * FP32
    else:
        trained, tensors = _split_params(shape, layout.tp, layout.pp)
        held = trained * FP32
    return (held // shards[0], trained * FP32 // shards[1],
            2 * trained * FP32 // shards[2] + FP32 * tensors)


def gathered_bytes(shape: ModelConfig, layout: Layout, dtype: str) -> int:
    """Whole parameters FSDP holds at the end of forward besides its shards (all-gathered in
    bf16 under its bf16 policy)."""
    width = BF16 if dtype == "bf16" else FP32
    if layout.sharding == "zero2":
        return _split_params(shape, layout.tp, layout.pp)[0] * width
    if layout.sharding == "zero3":
        return _outside_blocks(shape, layout.pp)[0] * width
    return 0


def block_activation_bytes(shape: ModelConfig, micro_batch: int, seq: int, precision: str,
                           tp: int = 1, adapters: Adapters | None = None) -> int:
    """Bytes one block holds for backward at the end of forward, per micro-batch.

    With ``e = batch x seq x d_model`` elements and ``n = batch x seq`` tokens, fp32 holds
    (8 e + m) x 4 bytes: the normed input of attention, q, k and v (key/value heads repeated
    to the query heads), the attention output, the residual after attention, the normed input
    of the MLP and the block's output, and the MLP's ``m``: its up projection and GELU (4 e
    each) in the gpt family, gate, SiLU, up and their product (n x ffn each) in the llama
    family, whose RMSNorms (composite ops computing in fp32) also keep their normalized input
    in fp32 and, for a bf16 input, its fp32 copy (:func:`rms_norm_bytes`); plus the norms'
    statistics (LayerNorm's mean and rstd, RMSNorm's rstd: 4 bytes
    per token each) and the attention's log-sum-exp (heads x n x 4). ``precision`` ``bf16``
    is autocast: the matmuls' inputs and outputs are bf16 copies (a norm's output is cast once
    for each matmul reading it: 4 casts in gpt, 5 in llama) while the residual stream stays
    fp32, and each weight's bf16 cast is held. ``bf16-params`` is FSDP's bf16 policy:
    parameters, and so every activation, are bf16, and no weight copies. Tensor parallelism
    divides what lies inside its column/row-parallel regions by ``tp``. With LoRA's
    ``adapters``, less :func:`lora_block_savings`.
    """
    n, heads = micro_batch * seq, shape.n_heads
    e = n * shape.d_model
    llama = shape.family == "llama"
    inner = 4 * e + (4 * n * shape.d_ff if llama else 8 * e)  # q, k, v, attention | MLP
    weights = 0
    if precision == "fp32":
        replicated, split = 4 * e * FP32, inner * FP32  # x_mid, 2 norms, out | inner
    elif precision == "bf16":
        casts = 5 if llama else 4
        replicated = 2 * e * FP32 + casts * e * BF16  # x_mid, out fp32 | norm casts
        split = inner * BF16
        weights = shape.block_matmul_params() * BF16 // tp
    elif precision == "bf16-params":
        replicated, split = 4 * e * BF16, inner * BF16
    else:
        raise ValueError(f"unknown precision {precision!r}; use fp32, bf16 or bf16-params")
    norm_stats = 1 if llama else 2
    stats = 2 * norm_stats * n * FP32 + heads // tp * n * FP32
    norms = 2 * rms_norm_bytes(e, precision) if llama else 0
    savings = (0 if adapters is None or shape.family not in FAMILIES
               else lora_block_savings(shape, n, precision, adapters))
    return replicated + norms + split // tp + weights + stats + attention_score_bytes(
        shape, micro_batch, seq, tp) - savings


def _lora_targets(shape: ModelConfig, adapters: Adapters) -> set[str]:
    """The linear layers (our names) ``adapters`` targets in a model of ``shape``."""
    return {HF_LINEARS.get(t, t) for t in adapters.targets or LORA_DEFAULT_TARGETS[shape.family]}


def lora_block_savings(shape: ModelConfig, tokens: int, precision: str,
                       adapters: Adapters) -> int:
    """What one block of a LoRA run holds for backward less than full training does (measured
    tensor by tensor), for ``tokens`` tokens: a frozen layer needs no gradient of its weight, so
    a frozen linear layer's input is kept only when an adapter (whose ``lora_A`` reads the same
    input) or another operation keeps it (the attention's input when none of wq, wk, wv is a
    target, the MLP's when none of its input layers is, the down projection's when it is not);
    a frozen RMSNorm keeps nothing in fp32 (:func:`rms_norm_bytes`; under FSDP's bf16 policy
    one fp32 copy of a block's input stays, measured); under autocast each frozen layer's input cast
    is not kept and its weight is already bf16 (no cast), while each adapter keeps its own
    input cast and weight casts. Each adapter adds its ``lora_B``'s input (tokens x rank)."""
    targets, llama = _lora_targets(shape, adapters), shape.family == "llama"
    e = tokens * shape.d_model
    width = FP32 if precision == "fp32" else BF16  # the matmuls' inputs
    mlp_inputs = {"gate", "up"} if llama else {"up"}
    saved = 0
    if precision == "bf16":  # casts of the norms' outputs, one per reading layer; weights
        readers = {"wq", "wk", "wv"} | mlp_inputs
        saved += len(readers - targets) * e * BF16 + shape.block_matmul_params() * BF16
        saved -= adapter_params(shape, adapters)[0] // shape.n_layers * BF16
    else:  # the norms' outputs, kept once for all their readers
        saved += (not targets & {"wq", "wk", "wv"}) * e * width
        saved += (not targets & mlp_inputs) * e * width
    if "down" not in targets:  # SwiGLU's product, or GELU's output
        saved += (tokens * shape.d_ff if llama else 4 * e) * width
    if llama:  # the RMSNorms' fp32 normalized inputs and copies of a bf16 input, but one
        # such copy per block (measured under FSDP's bf16 policy)
        saved += 2 * rms_norm_bytes(e, precision) - (e * FP32 if precision == "bf16-params"
                                                     else 0)
    block_targets = len(targets - {"head"})
    return saved - block_targets * tokens * adapters.rank * width


def lora_output_savings(shape: ModelConfig, tokens: int, precision: str,
                        adapters: Adapters) -> int:
    """What the output side of a LoRA run holds less than full training: a frozen head keeps
    no input (nor, held in bf16, a cast of its weight), a frozen RMSNorm nothing in fp32."""
    e = tokens * shape.d_model
    saved = rms_norm_bytes(e, precision) if shape.family == "llama" else 0
    if "head" not in _lora_targets(shape, adapters):
        saved += e * (FP32 if precision == "fp32" else BF16)
        if precision == "bf16" and not shape.tied:
            saved += shape.vocab_size * shape.d_model * BF16
    return saved


def rms_norm_bytes(elements: int, precision: str) -> int:
    """What an RMSNorm of ``elements`` keeps beyond its input and output: its normalized input
    in fp32, and under FSDP's bf16 policy (a bf16 input) the input's fp32 copy too (torch's
    composite ``rms_norm`` computes in fp32)."""
    return (2 if precision == "bf16-params" else 1) * elements * FP32


# The attention implementations' tiles (trainers/models/attention.py): sliding_window's query block,
# linear attention's chunk.
WINDOW_BLOCK = 128
LINEAR_CHUNK = 64


def attention_score_bytes(shape: ModelConfig, micro_batch: int, seq: int, tp: int = 1) -> int:
    """Attention probabilities one block keeps for backward beyond sdpa's, by
    ``shape.attention``: naive the whole ``seq x seq`` matrix per head, sliding_window a band
    of ``window + block`` keys per query, linear a chunk of scores per query, its feature maps
    and the running states (approximate: within 15%); sdpa and tiled keep only the row
    log-sum-exp (counted with the statistics)."""
    rows = micro_batch * shape.n_heads // tp * seq  # query rows on this rank
    if shape.attention == "naive":
        return rows * seq * FP32
    if shape.attention == "sliding_window":
        return rows * min(seq, WINDOW_BLOCK + shape.attention_window - 1) * FP32
    if shape.attention == "linear":  # chunk scores, feature maps, numerators, chunk states
        head = shape.head_dim
        return rows * (LINEAR_CHUNK + 5 * head + head * head // LINEAR_CHUNK) * FP32
    return 0


def activation_bytes(shape: ModelConfig, micro_batch: int, seq: int, precision: str,
                     checkpointing: bool, tp: int = 1, pp: int = 1,
                     output_side: bool = True, adapters: Adapters | None = None) -> int:
    """Bytes held for backward at the end of forward by one rank, per micro-batch in flight.

    Besides its ``1/pp`` of the blocks a rank holds their input (the embedding output, or
    the activation a pipeline stage receives; with activation checkpointing the first block
    holds it) and, on the output side (without a pipeline, or its last stage;
    ``output_side`` False: a pipeline's other stages), the final norm's input and output
    (with the head weight's cast under autocast; an RMSNorm's normalized input too) and
    statistics and the fp32 log-probabilities of the loss (batch x seq x vocab x 4).
    With activation checkpointing each block keeps only its input; backward recomputes one
    block at a time (:func:`block_activation_bytes` more, briefly). LoRA's ``adapters``:
    less what frozen layers need not keep (:func:`lora_block_savings`,
    :func:`lora_output_savings`).
    """
    n, e = micro_batch * seq, micro_batch * seq * shape.d_model
    layers = shape.n_layers // pp
    stream = BF16 if precision == "bf16-params" else FP32  # the residual stream's width
    per_block = e * stream if checkpointing else block_activation_bytes(
        shape, micro_batch, seq, precision, tp, adapters)
    head = {"fp32": e * FP32, "bf16": e * BF16 + shape.vocab_size * shape.d_model * BF16,
            "bf16-params": e * BF16}[precision]
    llama = shape.family == "llama"
    norm = (rms_norm_bytes(e, precision) + n * FP32) if llama else 2 * n * FP32  # stats
    # Unless checkpointed, the blocks hold their outputs, so their first input (the embedding
    # output or the activation received) comes beside; checkpointed they hold their inputs,
    # so the last block's output (the final norm's input) comes on the output side.
    stream_copy = e * stream if output_side or not checkpointing else 0
    output = head + norm + n * shape.vocab_size * FP32 if output_side else 0
    if output_side and adapters is not None and shape.family in FAMILIES:
        output -= lora_output_savings(shape, n, precision, adapters)
    return layers * per_block + stream_copy + output


def precision(dtype: str, layout: Layout) -> str:
    """How ``dtype`` computes under ``layout``: bf16 is autocast, except under FSDP (ZeRO-2/3),
    whose bf16 policy makes the parameters themselves bf16."""
    if dtype not in ("fp32", "bf16"):
        raise ValueError(f"unknown dtype {dtype!r}; use fp32 or bf16")
    return "bf16-params" if dtype == "bf16" and layout.sharding in ("zero2", "zero3") else dtype


def predict(shape: ModelConfig, micro_batch: int, seq: int, dtype: str, checkpointing: bool,
            layout: Layout, adapters: Adapters | None = None) -> Anatomy:
    """The anatomy of one rank for one micro-batch in flight (with LoRA's ``adapters``): all
    a peak is made of (:func:`trainers.planning.planner.peak_bytes` adds the micro-batches in
    flight and the runtime)."""
    params, grads, optimizer = state_bytes(shape, layout, dtype, adapters)
    compute = precision(dtype, layout)
    activations = activation_bytes(shape, micro_batch, seq, compute, checkpointing, layout.tp,
                                   layout.pp, adapters=adapters)
    return Anatomy(params, grads, optimizer, activations, gathered_bytes(shape, layout, dtype),
                   recompute=(block_activation_bytes(shape, micro_batch, seq, compute, layout.tp,
                                                     adapters) if checkpointing else 0),
                   stage_activations=(activation_bytes(
                       shape, micro_batch, seq, compute, checkpointing, layout.tp, layout.pp,
                       output_side=False, adapters=adapters) if layout.pp > 1 else activations))


def _gib(value: int) -> str:
    return f"{value / 2**30:8.2f}"


def anatomy_table(shape: ModelConfig, micro_batch: int, seq: int, dtype: str,
                  checkpointing: bool, devices: int, tp: int = 1, pp: int = 1,
                  adapters: Adapters | None = None) -> str:
    """Per-rank GiB of every category under DDP and ZeRO-1/2/3 over the ``devices / (tp x
    pp)`` data-parallel ranks of ``devices`` (a pipeline's: its heaviest stage's), training
    every parameter or LoRA's ``adapters``."""
    dp = devices // (tp * pp)
    degrees = "".join(f", {name} {value}" for name, value in (("tp", tp), ("pp", pp))
                      if value > 1)
    lines = [f"{'sharding':8} {'params':>8} {'grads':>8} {'AdamW':>8} {'activ.':>8} "
             f"{'gathered':>8} {'total':>8}   (GiB per rank, {devices} ranks{degrees})"]
    for sharding in SHARDINGS:
        a = predict(shape, micro_batch, seq, dtype, checkpointing,
                    Layout(sharding, dp=dp, tp=tp, pp=pp), adapters)
        lines.append(f"{sharding:8} {_gib(a.params)} {_gib(a.grads)} {_gib(a.optimizer)} "
                     f"{_gib(a.activations)} {_gib(a.gathered)} {_gib(a.total)}")
    return "\n".join(lines)
