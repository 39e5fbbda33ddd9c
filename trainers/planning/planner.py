"""Will it fit, and how to split it: the planner behind ``python -m trainers.planning.plan``.

The planner prices every configuration with :mod:`trainers.sizing.memory_formulas` and follows the
decision guide: a model that fits one device trains fastest as DDP; when the batch does not fit, a
smaller micro-batch with gradient accumulation, then activation checkpointing; when the model does
not fit, FSDP (ZeRO-2, then ZeRO-3); when even that does not fit, tensor parallelism inside a node,
then pipeline parallelism across nodes with FSDP over the pipelines, then with tensor parallelism
inside each stage too (3-D; its degree divides the devices per node, the pipeline's the nodes). It
prints the memory per rank of each and recommends the first that fits, with the micro-batch and the
accumulation steps that reach the requested global batch. A LoRA job (:class:`Adapters`) is priced
with its frozen base and adapters, among the trainers that serve LoRA (ddp, fsdp). Components call
:func:`check_fits` before scheduling a job. Plain Python without torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from trainers.errors import ConfigError
from trainers.options.model_names import model_shape
from trainers.options.train_config import TrainConfig
from trainers.options.trainer_table import TRAINERS, tensor_parallel_sizes
from trainers.sizing.memory_formulas import (
    Adapters,
    Anatomy,
    Layout,
    predict,
)
from trainers.sizing.projection import Job, Projection
from trainers.sizing.shapes import ModelConfig

GIB = 2**30
# What a process holds besides the training state: the framework, kernels, CUDA context.
RUNTIME_OVERHEAD = {"cuda": 1 * GIB, "cpu": GIB // 2}
# A plan fills at most this share of a device: allocator fragmentation, communication buffers.
USABLE = 0.9


@dataclass(frozen=True)
class Candidate:
    """One configuration and what it needs per rank."""

    trainer: str
    layout: Layout
    checkpointing: bool
    micro_batch: int
    grad_accum: int
    in_flight: int  # micro-batches whose activations one rank holds at once
    anatomy: Anatomy
    peak_bytes: int

    def describe(self, batch: bool = True) -> str:
        sharding = f" {self.layout.sharding}" if TRAINERS[self.trainer].sharded else ""
        degrees = [f"{name} {value}" for name, value in
                   (("dp", self.layout.dp), ("tp", self.layout.tp), ("pp", self.layout.pp))
                   if value > 1]
        text = self.trainer + sharding + (f" ({', '.join(degrees)})" if degrees else "")
        if batch:
            text += f", micro-batch {self.micro_batch} x {self.grad_accum} accumulation"
        return text + (", activation checkpointing" if self.checkpointing else "")

    def flags(self) -> str:
        """The trainer flags that select this configuration."""
        flags = [f"{TRAINERS[self.trainer].accumulate_flag} {self.grad_accum}"]
        flags += [f"--{name.replace('_', '-')} {value}"
                  for name, value in layout_options(self.layout).items()]
        if self.checkpointing:
            flags.append("--activation-checkpointing")
        return " ".join(flags)


def candidate_job(candidate: Candidate, shape: ModelConfig, seq: int,
                  global_batch: int = 0) -> Job:
    """The step ``candidate`` runs, as the projection prices it: ``global_batch`` sequences
    (0: its micro-batch x accumulation x dp), full recomputation with activation
    checkpointing, a pipeline on 1F1B (the planner's schedule)."""
    return Job(shape, seq, global_batch or candidate.micro_batch * candidate.grad_accum
               * candidate.layout.dp, candidate.layout, candidate.micro_batch,
               "full" if candidate.checkpointing else "none", "1f1b")


def last_stage_in_flight(schedule: str, in_flight: int) -> int:
    """Micro-batches a pipeline's last stage holds at once when its first holds
    ``in_flight``: under 1F1B one (it runs each micro-batch's backward right after its
    forward); the other schedules are priced at ``in_flight`` (GPipe holds them all there,
    the interleaved and zero-bubble ones fewer)."""
    return 1 if schedule == "1f1b" else in_flight


def peak_bytes(anatomy: Anatomy, layout: Layout, in_flight: int, last_in_flight: int,
               device: str) -> int:
    """Per-rank peak of a predicted ``anatomy``: states, the activations in flight, the block
    that activation checkpointing recomputes, and the runtime's own memory. A pipeline's
    heaviest rank holds the larger of its first stage's ``in_flight`` micro-batches (without
    the output side: ``anatomy.stage_activations``) and its last stage's ``last_in_flight``
    (with it: ``anatomy.activations``)."""
    held = last_in_flight * anatomy.activations
    if layout.pp > 1:
        held = max(held, in_flight * anatomy.stage_activations)
    return (anatomy.params + anatomy.grads + anatomy.optimizer + anatomy.gathered
            + held + anatomy.recompute + RUNTIME_OVERHEAD[device])


def _candidate(trainer: str, layout: Layout, shape: ModelConfig, seq: int, dtype: str,
               checkpointing: bool, micro_batch: int, grad_accum: int, in_flight: int,
               device: str, last_in_flight: int | None = None,
               adapters: Adapters | None = None) -> Candidate:
    """``last_in_flight``: a pipeline's last stage's (None: ``in_flight``); ``adapters``:
    LoRA's."""
    anatomy = predict(shape, micro_batch, seq, dtype, checkpointing, layout, adapters)
    last = in_flight if last_in_flight is None else last_in_flight
    return Candidate(trainer, layout, checkpointing, micro_batch, grad_accum, in_flight, anatomy,
                     peak_bytes(anatomy, layout, in_flight, last, device))


def layout_options(layout: Layout) -> dict[str, str]:
    """The trainer options (TrainConfig field: value) that select ``layout``, beyond the
    accumulation; a trainer can run the layout only if it serves all of them."""
    options = {}
    if layout.tp > 1:
        options["tp"] = str(layout.tp)
    if layout.pp > 1:
        options["pp"] = str(layout.pp)
    if layout.sharding == "zero2":
        options["reshard_after_forward"] = "false"
    return options


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidates(shape: ModelConfig, seq: int, global_batch: int, devices_per_node: int,
               nodes: int, dtype: str, device: str,
               adapters: Adapters | None = None) -> Iterator[Candidate]:
    """Every configuration in the decision guide's order of preference, the largest
    micro-batch first within each; with LoRA's ``adapters``, only those of trainers that
    serve LoRA."""
    world = devices_per_node * nodes
    steps = []
    for checkpointing in (False, True):
        steps.append(("ddp", "ddp", 1, 1, checkpointing))
    for sharding in ("zero2", "zero3"):
        for checkpointing in (False, True):
            steps.append(("fsdp", sharding, 1, 1, checkpointing))
    # TP inside a node: its degree divides the devices per node (and the heads and width).
    tps = [t for t in _divisors(devices_per_node)
           if t > 1 and all(size % t == 0 for _, size in tensor_parallel_sizes(shape))]
    for tp in tps:
        steps.append(("tensor_parallel", "zero3", tp, 1, True))
    # PP across nodes: its stages are whole nodes; FSDP (ZeRO-2, then ZeRO-3) over the
    # pipelines, TP inside each stage (3-D).
    pps = [p for p in _divisors(nodes) if p > 1 and shape.n_layers % p == 0]
    for pp in pps:
        for tp in [1, *tps]:
            for sharding in ("zero2", "zero3"):
                steps.append(("pipeline", sharding, tp, pp, True))
    seen = set()
    for trainer, sharding, tp, pp, checkpointing in steps:
        dp = world // (tp * pp)
        sharding = sharding if dp > 1 else "ddp"  # one replica shards nothing
        if global_batch % dp or (trainer, sharding, tp, pp, checkpointing) in seen:
            continue
        if adapters is not None and "lora_rank" not in TRAINERS[trainer].options:
            continue
        seen.add((trainer, sharding, tp, pp, checkpointing))
        per_replica = global_batch // dp
        for micro in sorted(_divisors(per_replica), reverse=True):
            accum = per_replica // micro
            layout = Layout(sharding, dp=dp, tp=tp, pp=pp)
            if not TRAINERS[trainer].options >= layout_options(layout).keys():
                continue  # a layout the trainer does not serve
            if trainer == "pipeline":
                # 1F1B: --microbatches >= pp, and the first stage holds pp of them at once.
                if accum < pp:
                    continue
                yield _candidate(trainer, layout, shape, seq, dtype, checkpointing, micro, accum,
                                 pp, device, last_stage_in_flight("1f1b", pp), adapters)
            else:
                yield _candidate(trainer, layout, shape, seq, dtype, checkpointing, micro, accum,
                                 1, device, adapters=adapters)


def recommend(shape: ModelConfig, seq: int, global_batch: int, devices_per_node: int,
              nodes: int, device_memory: int, dtype: str, device: str,
              adapters: Adapters | None = None) -> Candidate:
    """The first configuration of the decision guide whose peak fits ``USABLE`` of
    ``device_memory`` bytes (with LoRA's ``adapters``: among the trainers that serve it).

    Raises ConfigError naming the smallest configuration and what it would need otherwise.
    """
    smallest = None
    for candidate in candidates(shape, seq, global_batch, devices_per_node, nodes, dtype,
                                device, adapters):
        if candidate.peak_bytes <= USABLE * device_memory:
            return candidate
        if smallest is None or candidate.peak_bytes < smallest.peak_bytes:
            smallest = candidate
    if smallest is None:
        raise ConfigError(f"no configuration splits a global batch of {global_batch} over "
                          f"{devices_per_node * nodes} devices; pick a batch divisible by them")
    raise ConfigError(
        f"no configuration fits {device_memory / GIB:.1f} GiB per device: the smallest, "
        f"{smallest.describe()}, needs {smallest.peak_bytes / USABLE / GIB:.1f} GiB devices; use "
        "devices with at least that much memory or more nodes")


def job_candidate(cfg: TrainConfig, trainer: str, world: int, device: str) -> Candidate:
    """What the job ``cfg`` of ``trainer`` on ``world`` ranks needs per rank."""
    shape = dataclasses.replace(model_shape(cfg.model), attention=cfg.attention,
                                attention_window=cfg.attention_window)
    split = TRAINERS[trainer].split(cfg, world)
    return _candidate(trainer, split.layout, shape, cfg.seq_len, cfg.dtype,
                      cfg.activation_checkpointing, split.micro_batch, split.grad_accum,
                      split.in_flight, device,
                      last_stage_in_flight(cfg.schedule, split.in_flight),
                      Adapters.of(cfg.lora_rank, cfg.lora_targets))


def check_fits(cfg: TrainConfig, trainer: str, world: int, devices_per_node: int, nodes: int,
               device_memory: int, device: str) -> None:
    """Raise a one-line ConfigError when the job cannot fit ``device_memory`` bytes per rank,
    naming a configuration that would (or the smallest device that would do)."""
    job = job_candidate(cfg, trainer, world, device)
    if job.peak_bytes <= USABLE * device_memory:
        return
    need = (f"{job.peak_bytes / GIB:.2f} GiB per rank, devices have {device_memory / GIB:.2f} "
            f"({USABLE * device_memory / GIB:.2f} usable)")
    try:
        better = recommend(model_shape(cfg.model), cfg.seq_len, cfg.batch_size,
                           devices_per_node, nodes, device_memory, cfg.dtype, device,
                           Adapters.of(cfg.lora_rank, cfg.lora_targets))
    except ConfigError as err:
        raise ConfigError(f"--model {cfg.model} needs {need}; {err}") from None
    raise ConfigError(f"--model {cfg.model} needs {need}; try trainers.{better.trainer} "
                      f"{better.flags()} ({better.peak_bytes / GIB:.1f} GiB)")


def table(shape: ModelConfig, seq: int, dtype: str, devices: int, device: str,
          adapters: Adapters | None = None,
          projection: Callable[[Job], Projection] | None = None, global_batch: int = 0) -> str:
    """GiB per rank at micro-batch 1 for DDP and each FSDP sharding, as the planner prices them
    (with LoRA's ``adapters``); with ``projection``, each one's projected tokens/s per device
    and MFU at ``global_batch`` sequences per step ("-" where the batch does not split)."""
    head = f"{'configuration, micro-batch 1':44} {'states':>7} {'activ.':>7} {'peak':>7}"
    lines = [head + (f" {'tok/s/dev':>9} {'MFU':>5}  (GiB per rank; projected)"
                     if projection else "  (GiB per rank)")]
    rows = [("ddp", Layout("ddp", dp=devices), False), ("ddp", Layout("ddp", dp=devices), True),
            ("fsdp", Layout("zero2", dp=devices), False),
            ("fsdp", Layout("zero3", dp=devices), False),
            ("fsdp", Layout("zero3", dp=devices), True)]
    for trainer, layout, checkpointing in rows:
        c = _candidate(trainer, layout, shape, seq, dtype, checkpointing, 1, 1, 1, device,
                       adapters=adapters)
        states = c.anatomy.params + c.anatomy.grads + c.anatomy.optimizer + c.anatomy.gathered
        line = (f"{c.describe(batch=False):44} {states / GIB:7.2f} "
                f"{c.anatomy.activations / GIB:7.2f} {c.peak_bytes / GIB:7.2f}")
        if projection:
            try:
                p = projection(candidate_job(c, shape, seq, global_batch))
                line += f" {p.tokens_per_s_per_device:9,.0f} {p.mfu:5.3f}"
            except ConfigError:
                line += f" {'-':>9} {'-':>5}"
        lines.append(line)
    return "\n".join(lines)


def custom_shape(base: ModelConfig, layers: int, heads: int, hidden: int, vocab: int,
                 context: int) -> ModelConfig:
    """``base`` with the given sizes (0: keep base's); ConfigError for an impossible shape."""
    sizes = {"n_layers": layers, "n_heads": heads, "d_model": hidden, "vocab_size": vocab,
             "max_seq_len": context}
    for name, value in sizes.items():
        if value < 0:
            raise ConfigError(f"--{name} must be positive, got {value}")
    shape = dataclasses.replace(base, **{k: v for k, v in sizes.items() if v})
    if shape.d_model % shape.n_heads:
        raise ConfigError(f"--heads {shape.n_heads} does not divide the hidden size "
                          f"{shape.d_model}; pick heads that divide it")
    return shape
