"""Will scaling pay: a job's step time, tokens/s per device, MFU and device-hours per billion
tokens on N devices, projected from its shape, layout, batch, GPU and fabric.

The cost model (docs/benchmarks.md, "Projection against published tables"):

- **compute**: the step's FLOPs per device (``flops_per_token``, plus the forward that
  activation checkpointing recomputes) over ``peak x matmul_efficiency``, and the work that is
  not matmuls (norms, activations, residual adds, softmax, the loss: memory-bound) at the
  device's HBM bandwidth: ``non_matmul_passes`` passes over the activations a block saves for
  backward (:func:`non_matmul_bytes`). Its bytes per token grow as ``d``, the matmuls' FLOPs
  as ``d^2``, so its share falls as models grow (part of why Megatron-LM's per-GPU throughput
  rises with model size);
- **collectives** by their ring costs, ``(n-1)/n x bytes / bandwidth`` for an all-gather or
  a reduce-scatter and twice that for an all-reduce, plus ``latency_s`` per ring step (an
  all-reduce takes NCCL's tree where its ``2 log2 n`` steps are fewer). A group inside one
  node runs at the intra-node bandwidth; a group spanning nodes with ``g`` members per node
  at ``min(intra, g x inter)`` (NCCL runs one ring per NIC, so each member's NIC carries
  ``1/g`` of the traffic that crosses nodes). Both times ``link_efficiency``;
- **overlap as the trainers overlap**: DDP all-reduces gradient buckets during the last
  micro-batch's backward (the last bucket after it); FSDP2 prefetches each block's
  all-gather behind the previous block's compute and reduce-scatters behind the next block's
  backward (first all-gather and last reduce-scatter exposed), reducing once per step
  (``no_sync`` on the other micro-batches); tensor parallelism's all-reduces are on the
  critical path (``tp_overlap`` hides a share of them, 0 for our trainers); a pipeline adds
  the bubble ``(p-1)/v`` micro-batch times (``v`` virtual stages per rank, 1 for GPipe and
  1F1B) and its point-to-point sends while it fills and drains.

Ranks are ordered as the trainers' meshes are, ``(pp, dp, tp)`` with tp innermost: a tp group
is contiguous, a dp group strides by tp, a pipeline by dp x tp. Every constant that is an
assumption is a field of :class:`Assumptions`. Plain Python without torch.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from trainers.errors import ConfigError
from trainers.sizing.memory_formulas import Layout, activation_bytes
from trainers.sizing.shapes import ModelConfig

GB = 1e9
RECOMPUTES = ("none", "selective", "full")
SCHEDULES = ("gpipe", "1f1b", "interleaved")
# The default achieved matmul efficiency (the matmuls' own: the work that is not matmuls is
# priced at the HBM bandwidth beside them): the value that makes the projection reproduce
# torchtitan's Llama 3.1 8B FSDP row on 8 H100s (bench/published_scaling.csv; recomputed by
# tests/unit/test_projection.py). Measure yours on 1-2 devices and pass it instead.
DEFAULT_MATMUL_EFFICIENCY = 0.387


@dataclass(frozen=True)
class Hardware:
    """One GPU type and its fabric: ``peak_flops`` dense bf16 FLOP/s per device, GB/s per
    device one direction inside a node (``intra_node_gbps``) and to other nodes
    (``inter_node_gbps``), ``devices_per_node``, and GB/s of its HBM (``hbm_gbps``; 0: the
    work that is not matmuls is not priced)."""

    peak_flops: float
    intra_node_gbps: float
    inter_node_gbps: float
    devices_per_node: int = 8
    hbm_gbps: float = 0.0


@dataclass(frozen=True)
class Assumptions:
    """The projection's assumptions, each overridable (``trainers.planning.plan``'s flags in
    brackets).

    ``matmul_efficiency`` [--matmul-efficiency]: the share of peak the model's matmuls reach
    on one device; ``link_efficiency`` [--link-efficiency]: the share of the line rate a large
    collective reaches (NCCL's bus bandwidth); ``latency_s`` [--collective-latency-us]: per
    ring or tree step; ``ddp_bucket_bytes``: DDP's gradient bucket (torch's 25 MiB);
    ``tp_overlap``: the share of tensor-parallel communication hidden behind compute (0: our
    trainers; Megatron's ``--tp-comm-overlap`` hides most of it); ``param_bytes``,
    ``grad_bytes``: what FSDP gathers (bf16) and what gradients are reduced in (fp32, the
    trainers' reduce dtype); ``distributed_optimizer``: data parallelism as Megatron-LM's
    distributed optimizer with ``--overlap-grad-reduce --overlap-param-gather`` (gradients
    reduce-scattered during the last backward, parameters all-gathered during the next
    forward) instead of DDP's all-reduce (False: our trainers); ``overlap_grad_reduce``: DDP
    reduces during the last backward (True: our trainers, torch's DDP) or after it (False:
    Megatron-LM 2021's ``--DDP-impl local``); ``non_matmul_passes``: HBM passes over the
    activations a block saves (:func:`non_matmul_bytes`; 4: written in the forward, read in the
    backward, their gradients written and read); ``sequence_parallel``: the norms, dropout and
    residual adds split over the tensor-parallel group as the matmuls are (Megatron-LM's
    ``--sequence-parallel``; False: our trainers, which replicate them).
    """

    matmul_efficiency: float = DEFAULT_MATMUL_EFFICIENCY
    link_efficiency: float = 0.8
    latency_s: float = 5e-6
    ddp_bucket_bytes: int = 25 * 2**20
    tp_overlap: float = 0.0
    param_bytes: int = 2
    grad_bytes: int = 4
    distributed_optimizer: bool = False
    overlap_grad_reduce: bool = True
    non_matmul_passes: float = 4.0
    sequence_parallel: bool = False


@dataclass(frozen=True)
class Job:
    """What one step does: ``global_batch`` sequences of ``seq`` tokens split over
    ``layout`` in micro-batches of ``micro_batch`` sequences per data-parallel rank;
    ``recompute`` none, selective (the attention core, Korthikanti et al. 2022) or full
    (every block's forward again); a pipeline's ``schedule`` and ``virtual_stages``."""

    shape: ModelConfig
    seq: int
    global_batch: int
    layout: Layout
    micro_batch: int
    recompute: str = "none"
    schedule: str = "1f1b"
    virtual_stages: int = 1

    @property
    def devices(self) -> int:
        return self.layout.dp * self.layout.tp * self.layout.pp

    @property
    def micro_batches(self) -> int:
        """Micro-batches per step on each data-parallel rank (a pipeline's m)."""
        return self.global_batch // (self.layout.dp * self.micro_batch)


@dataclass(frozen=True)
class Projection:
    """One step on ``devices`` devices: its time, what makes it up (seconds per step: compute,
    of which ``non_matmul_s`` is the work that is not matmuls, the bubble, the exposed
    communication), and the figures a plan compares."""

    devices: int
    step_s: float
    compute_s: float
    bubble_s: float
    exposed_s: dict[str, float] = field(default_factory=dict)
    tokens_per_s_per_device: float = 0.0
    mfu: float = 0.0
    non_matmul_s: float = 0.0

    @property
    def device_hours_per_billion_tokens(self) -> float:
        return 1e9 / self.tokens_per_s_per_device / 3600

    def line(self) -> str:
        """The line a script reads (``trainers.planning.plan``)."""
        return (f"projected: {self.tokens_per_s_per_device:,.0f} tokens/s per device, MFU "
                f"{self.mfu:.3f}, {self.device_hours_per_billion_tokens:,.1f} device-hours per "
                "billion tokens")


def ring_all_gather_s(n: int, nbytes: float, gbps: float, latency_s: float = 0.0) -> float:
    """A ring all-gather (or reduce-scatter) of ``nbytes`` in all over ``n`` ranks at
    ``gbps`` GB/s per rank: ``(n-1)/n x nbytes / bandwidth + (n-1) x latency``."""
    if n <= 1:
        return 0.0
    return (n - 1) / n * nbytes / (gbps * GB) + (n - 1) * latency_s


ring_reduce_scatter_s = ring_all_gather_s


def all_reduce_s(n: int, nbytes: float, gbps: float, latency_s: float = 0.0) -> float:
    """An all-reduce of ``nbytes`` over ``n`` ranks: a reduce-scatter and an all-gather,
    ``2(n-1)/n x nbytes / bandwidth``, with the ring's ``2(n-1)`` latency steps or the
    tree's ``2 ceil(log2 n)`` when fewer (NCCL picks the tree at scale; its bandwidth term is
    taken as the ring's)."""
    if n <= 1:
        return 0.0
    steps = min(2 * (n - 1), 2 * math.ceil(math.log2(n)))
    return 2 * (n - 1) / n * nbytes / (gbps * GB) + steps * latency_s


def group_gbps(size: int, stride: int, hw: Hardware, link_efficiency: float) -> float:
    """The bus bandwidth (GB/s per rank) of a group of ``size`` ranks ``stride`` apart:
    intra-node when it fits one node, else ``min(intra, g x inter)`` with ``g`` members per
    node; times ``link_efficiency``."""
    if size * stride <= hw.devices_per_node:
        return hw.intra_node_gbps * link_efficiency
    per_node = min(size, max(1, hw.devices_per_node // stride))
    return min(hw.intra_node_gbps, per_node * hw.inter_node_gbps) * link_efficiency


def recompute_factor(shape: ModelConfig, seq: int, recompute: str) -> float:
    """Executed FLOPs over model FLOPs: 1 without recomputation, ``4/3`` of the blocks' share
    with full (a second forward), and for selective the attention core's forward (``4 L d s``
    FLOPs per token) again."""
    fpt = shape.flops_per_token(seq)
    if recompute == "none":
        return 1.0
    if recompute == "selective":
        return 1 + 4 * shape.n_layers * shape.d_model * seq / fpt
    if recompute == "full":
        head = 0 if shape.tied else 6 * shape.vocab_size * shape.d_model
        return 1 + (fpt - head) / 3 / fpt
    raise ConfigError(f"recompute {recompute!r} is not one of {', '.join(RECOMPUTES)}; pick one")


def non_matmul_passes(job: Job, assume: Assumptions) -> float:
    """HBM passes over the saved activations per micro-batch: ``non_matmul_passes``, one more
    for a full recomputation (its forward writes them again)."""
    return assume.non_matmul_passes + (job.recompute == "full")


def non_matmul_bytes(job: Job, assume: Assumptions) -> float:
    """HBM bytes one device moves per micro-batch for the work that is not matmuls: the
    activations its blocks and the output side (final norm, log-probabilities of the loss;
    with a pipeline, the last stage's) save for backward in a 16-bit model
    (:func:`activation_bytes`, tensor by tensor; the attention's scores too when
    ``shape.attention`` keeps them), times :func:`non_matmul_passes`. Tensor parallelism splits
    what its regions split, everything with ``sequence_parallel``."""
    tp, sp = job.layout.tp, assume.sequence_parallel
    saved = activation_bytes(job.shape, job.micro_batch, job.seq, "bf16-params",
                             checkpointing=False, tp=1 if sp else tp, pp=job.layout.pp)
    return saved / (tp if sp else 1) * non_matmul_passes(job, assume)


def check_job(job: Job) -> None:
    """ConfigError (one line naming the fix) for a job the projection cannot price."""
    lay = job.layout
    if job.micro_batch <= 0 or job.global_batch % (lay.dp * job.micro_batch):
        raise ConfigError(f"global batch {job.global_batch} is not a multiple of dp {lay.dp} x "
                          f"micro-batch {job.micro_batch}; pick a batch divisible by them")
    if job.shape.n_layers % (lay.pp * job.virtual_stages):
        raise ConfigError(f"{job.shape.n_layers} layers do not split into pp {lay.pp} x "
                          f"{job.virtual_stages} virtual stages; pick degrees that divide them")
    if job.schedule not in SCHEDULES:
        raise ConfigError(f"schedule {job.schedule!r} is not one of {', '.join(SCHEDULES)}")
    if lay.pp > 1 and job.micro_batches < lay.pp:
        raise ConfigError(f"{job.micro_batches} micro-batches cannot fill {lay.pp} pipeline "
                          "stages; raise the global batch or lower the micro-batch")


def project(job: Job, hw: Hardware, assume: Assumptions = Assumptions()) -> Projection:
    """One step of ``job`` on ``hw`` under ``assume`` (see the module docstring)."""
    check_job(job)
    shape, lay, a = job.shape, job.layout, assume
    fpt = shape.flops_per_token(job.seq)
    tokens_micro = job.micro_batch * job.seq
    m = job.micro_batches
    flops_rate = hw.peak_flops * a.matmul_efficiency
    # One micro-batch on one device: its forward, and its backward with any recomputation;
    # the work that is not matmuls at the HBM bandwidth, one of its passes in the forward.
    memory_s = non_matmul_bytes(job, a) / (hw.hbm_gbps * GB) if hw.hbm_gbps else 0.0
    micro_s = fpt * tokens_micro * recompute_factor(shape, job.seq, job.recompute) / (
        lay.tp * lay.pp) / flops_rate + memory_s
    forward_s = (fpt * tokens_micro / 3 / (lay.tp * lay.pp) / flops_rate
                 + memory_s / non_matmul_passes(job, a))
    backward_s = micro_s - forward_s
    layers = shape.n_layers // lay.pp
    exposed: dict[str, float] = {}

    # Tensor parallelism: two all-reduces of the activations per block in the forward, two in
    # the backward, two more for a full recomputation; on the critical path.
    if lay.tp > 1:
        act = tokens_micro * shape.d_model * a.param_bytes
        per = 6 if job.recompute == "full" else 4
        tp_s = per * layers * all_reduce_s(lay.tp, act, group_gbps(lay.tp, 1, hw,
                                                                   a.link_efficiency),
                                           a.latency_s)
        exposed["tp"] = m * tp_s * (1 - a.tp_overlap)

    # Data parallelism over dp ranks lay.tp apart, on each device's share of the parameters.
    if lay.dp > 1:
        gbps = group_gbps(lay.dp, lay.tp, hw, a.link_efficiency)
        params = shape.num_params() / (lay.tp * lay.pp)
        grads = params * a.grad_bytes
        if lay.sharding == "ddp" and a.distributed_optimizer:
            scatter = ring_reduce_scatter_s(lay.dp, grads, gbps, a.latency_s)
            last = ring_reduce_scatter_s(lay.dp, min(a.ddp_bucket_bytes, grads), gbps,
                                         a.latency_s)
            exposed["dp reduce-scatter"] = max(scatter - backward_s, last)
            exposed["dp param all-gather"] = max(0.0, ring_all_gather_s(
                lay.dp, params * a.param_bytes, gbps, a.latency_s) - forward_s)
        elif lay.sharding == "ddp":
            total = all_reduce_s(lay.dp, grads, gbps, a.latency_s)
            last = all_reduce_s(lay.dp, min(a.ddp_bucket_bytes, grads), gbps, a.latency_s)
            exposed["dp all-reduce"] = (max(total - backward_s, last) if a.overlap_grad_reduce
                                        else total)
        else:
            block = shape.block_matmul_params() / lay.tp + shape.block_norm_params()
            root = max(params - layers * block, 0.0)
            gather = ring_all_gather_s(lay.dp, block * a.param_bytes, gbps, a.latency_s)
            scatter = ring_reduce_scatter_s(lay.dp, block * a.grad_bytes, gbps, a.latency_s)
            f_block, b_block = forward_s / layers, backward_s / layers
            back = gather if lay.sharding == "zero3" else 0.0  # ZeRO-3 gathers again
            # Every micro-batch: the root's and the first block's all-gathers up front, the
            # others behind the previous block's forward; ZeRO-3's backward gathers behind
            # the next block's backward.
            exposed["fsdp gathers"] = (
                m * (ring_all_gather_s(lay.dp, root * a.param_bytes, gbps, a.latency_s)
                     + gather + (layers - 1) * max(0.0, gather - f_block))
                + (m - 1) * layers * max(0.0, back - b_block))
            # The last micro-batch also reduce-scatters each block behind the next block's
            # backward; the last block's and the root's after the backward ends.
            exposed["fsdp reduce-scatter"] = (
                (layers - 1) * max(0.0, back + scatter - b_block) + max(0.0, back - b_block)
                + scatter + ring_reduce_scatter_s(lay.dp, root * a.grad_bytes, gbps,
                                                  a.latency_s))

    bubble_s = 0.0
    if lay.pp > 1:
        stages = job.virtual_stages if job.schedule == "interleaved" else 1
        bubble_s = (lay.pp - 1) / stages * (micro_s + exposed.get("tp", 0.0) / m)
        act = tokens_micro * shape.d_model * a.param_bytes
        gbps = group_gbps(2, lay.dp * lay.tp, hw, a.link_efficiency)
        exposed["pp send/recv"] = 2 * (lay.pp - 1) * (act / (gbps * GB) + a.latency_s)

    compute_s = m * micro_s
    step_s = compute_s + bubble_s + sum(exposed.values())
    tokens_per_device = job.global_batch * job.seq / job.devices / step_s
    return Projection(job.devices, step_s, compute_s, bubble_s, exposed, tokens_per_device,
                      tokens_per_device * fpt / hw.peak_flops, m * memory_s)


SCALES = (8, 16, 32, 64, 128, 256, 512, 1024)


def at_scale(job: Job, devices: int) -> Job:
    """``job`` weak-scaled to ``devices``: more data-parallel replicas, each with the same
    micro-batch and accumulation (the global batch grows with them); ConfigError when
    ``devices`` is not a multiple of its tp x pp."""
    lay = job.layout
    if devices % (lay.tp * lay.pp):
        raise ConfigError(f"{devices} devices do not split into tp {lay.tp} x pp {lay.pp}; "
                          "pick a multiple of their product")
    dp = devices // (lay.tp * lay.pp)
    sharding = lay.sharding if dp > 1 or lay.sharding == "ddp" else "ddp"
    return dataclasses.replace(job, layout=Layout(sharding, dp=dp, tp=lay.tp, pp=lay.pp),
                               global_batch=job.global_batch // lay.dp * dp)


def calibrate(job: Job, hw: Hardware, tokens_per_s_per_device: float,
              assume: Assumptions = Assumptions()) -> float:
    """The matmul efficiency at which ``job`` on ``hw`` runs at ``tokens_per_s_per_device``
    (bisection; step time falls as efficiency rises). ConfigError when no efficiency in
    (0, 1] reaches it."""
    def rate(eff: float) -> float:
        return project(job, hw, dataclasses.replace(assume, matmul_efficiency=eff)
                       ).tokens_per_s_per_device

    low, high = 1e-4, 1.0
    if rate(high) < tokens_per_s_per_device:
        raise ConfigError(f"{tokens_per_s_per_device:,.0f} tokens/s per device needs more than "
                          "the peak; check the GPU's peak or the row's shape and batch")
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if rate(mid) < tokens_per_s_per_device else (low, mid)
    return (low + high) / 2

