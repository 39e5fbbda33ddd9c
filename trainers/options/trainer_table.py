"""The one table of trainers: what the config, planner, OOM report, components and Ray read.

Each :class:`Trainer` entry names its entry module (``python -m trainers.<name>``, whose
``build(cfg, env, spec)`` makes the runtime strategy), the options only it serves, its checks of
a configuration, how it splits a job for the memory planner, what to try when it runs out of
memory, and whether Ray Train can run it. Adding a trainer is one entry here plus one entry
module (docs/architecture.md). Plain Python without torch.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainers.errors import ConfigError
from trainers.options.train_config import SCHEDULE_STAGES
from trainers.sizing.memory_formulas import Layout
from trainers.sizing.shapes import ModelConfig

if TYPE_CHECKING:
    from trainers.options.train_config import TrainConfig

DEVICE_PATTERN = re.compile(r"^(cpu|cuda:\d+)$")


@dataclass(frozen=True)
class Split:
    """How one rank of a job holds the model and its batch, as the memory planner prices it."""

    layout: Layout
    micro_batch: int  # sequences per forward pass
    grad_accum: int  # forward passes per optimizer step
    in_flight: int = 1  # micro-batches whose activations one rank holds at once


def check_one_process_per_gpu(cfg: TrainConfig, nproc_per_node: int, gpus: int) -> None:
    """On GPU nodes (``gpus`` > 0) one process drives each GPU: as many processes as GPUs."""
    if gpus and nproc_per_node != gpus:
        raise ConfigError(f"{nproc_per_node} processes per node with --gpu {gpus}: each process "
                          f"drives one GPU; pass -j <nodes>x{gpus}, or --gpu {nproc_per_node}")


@dataclass(frozen=True)
class Trainer:
    """One trainer: its entry module and everything the layers above ask about it.

    ``check(cfg, world, shape)`` raises ConfigError when ``cfg`` cannot run at ``world`` ranks
    (``shape``: the model's shape facts, None when the model's files are not read here);
    ``check_placement(cfg, nproc_per_node, gpus)`` when it cannot run with that many processes
    and GPUs per node (components call it); ``split(cfg, world)`` is the job's per-rank split
    for the planner. ``ray`` is None when Ray Train runs the trainer, else why it cannot and
    what to use instead.
    """

    name: str
    summary: str
    when: str  # when to choose it: the second paragraph of its --help
    options: frozenset[str]
    split: Callable[[TrainConfig, int], Split]
    check: Callable[[TrainConfig, int, ModelConfig | None], None] | None = None
    check_placement: Callable[[TrainConfig, int, int], None] = check_one_process_per_gpu
    sharded: bool = False  # data-parallel replicas shard the state (the planner shows ZeRO-n)
    accumulate_flag: str = "--grad-accum"  # the flag that sets micro-batches per step
    oom_hints: tuple[str, ...] = ()
    ray: str | None = None

    @property
    def module(self) -> str:
        """The entry module: ``python -m trainers.<name>``."""
        return f"trainers.{self.name}"

    @property
    def component(self) -> str:
        """The TorchX component that launches it."""
        return f"components/{self.name}.py:{self.name}"


def _fsdp_sharding(cfg: TrainConfig) -> str:
    return "zero3" if cfg.reshard_after_forward else "zero2"


def _replicated_split(cfg: TrainConfig, world: int) -> Split:
    dp = cfg.dp_size(world)
    return Split(Layout("ddp", dp=dp), cfg.micro_batch(cfg.replicas(world)), cfg.grad_accum)


def _fsdp_split(cfg: TrainConfig, world: int) -> Split:
    dp = cfg.dp_size(world)  # under --fault-tolerant, FSDP shards over one replica group
    return Split(Layout(_fsdp_sharding(cfg), dp=dp), cfg.micro_batch(cfg.replicas(world)),
                 cfg.grad_accum)


def _tensor_parallel_split(cfg: TrainConfig, world: int) -> Split:
    dp = cfg.dp_size(world)
    sharding = _fsdp_sharding(cfg) if dp > 1 else "ddp"  # FSDP only across several groups
    return Split(Layout(sharding, dp=dp, tp=cfg.tp), cfg.micro_batch(dp), cfg.grad_accum)


def _pipeline_split(cfg: TrainConfig, world: int) -> Split:
    dp = cfg.dp_size(world)
    sharding = _fsdp_sharding(cfg) if dp > 1 else "ddp"  # FSDP only across several pipelines
    in_flight = cfg.microbatches if cfg.schedule == "gpipe" else min(cfg.microbatches, cfg.pp)
    return Split(Layout(sharding, dp=dp, tp=cfg.tp, pp=cfg.pp),
                 cfg.micro_batch(dp) // cfg.microbatches, cfg.microbatches, in_flight)


def _model_parallel_split(cfg: TrainConfig, world: int) -> Split:
    # The blocks are split over distinct devices; CPU places share one memory.
    pp = len(set(cfg.devices.split(","))) if cfg.devices != "auto" else 1
    dp = cfg.dp_size(world)
    return Split(Layout("ddp", dp=dp, pp=pp), cfg.micro_batch(dp), cfg.grad_accum)


def tensor_parallel_sizes(shape: ModelConfig) -> tuple[tuple[str, int], ...]:
    """The sizes a tensor-parallel degree must divide: query and key/value heads, width."""
    return (("heads", shape.n_heads), ("key/value heads", shape.kv_heads),
            ("hidden size", shape.d_model))


def check_tensor_parallel(cfg: TrainConfig, world: int, shape: ModelConfig | None) -> None:
    """A model with a tensor-parallel plan and a degree (>= 1, checked for every trainer)
    that splits its query and key/value heads and its width."""
    if cfg.sequence_parallel and cfg.tp == 1:
        raise ConfigError("--sequence-parallel needs --tp > 1")
    if shape is None or cfg.tp == 1:
        return
    if not shape.tensor_parallel:
        raise ConfigError(f"--model {cfg.model} has no tensor-parallel plan; pass --tp 1 (e.g. "
                          "trainers.fsdp) or give its ModelSpec a tp_plan")
    for what, size in tensor_parallel_sizes(shape):
        if size % cfg.tp:
            raise ConfigError(f"--tp {cfg.tp} does not divide the {cfg.model} model's {what} "
                              f"({size}); pass a --tp that divides {size}")


def check_tensor_parallel_inside_node(cfg: TrainConfig, nproc_per_node: int) -> None:
    """Every tensor-parallel group inside one node: the meshes put tp innermost, so ``--tp``
    must divide the processes per node, unless ``--allow-cross-node-tp``."""
    if nproc_per_node % cfg.tp and not cfg.allow_cross_node_tp:
        raise ConfigError(f"--tp {cfg.tp} does not divide the {nproc_per_node} processes per "
                          f"node, so a tensor-parallel group would span nodes; pass a --tp that "
                          f"divides {nproc_per_node} (PP and DP span nodes), or "
                          "--allow-cross-node-tp if your fabric between nodes is as fast")


def check_tensor_parallel_placement(cfg: TrainConfig, nproc_per_node: int, gpus: int) -> None:
    """One process per GPU, and every tensor-parallel group inside one node."""
    check_one_process_per_gpu(cfg, nproc_per_node, gpus)
    check_tensor_parallel_inside_node(cfg, nproc_per_node)


def check_stages(cfg: TrainConfig, shape: ModelConfig | None, trainer: str) -> None:
    """A model that can be split into stages (pipeline) or spread over devices."""
    if shape is not None and not shape.pipeline:
        raise ConfigError(f"--model {cfg.model} cannot be split into stages (its spec has no "
                          f"first/last modules); use trainers.fsdp or trainers.ddp, not "
                          f"trainers.{trainer}")


def check_pipeline(cfg: TrainConfig, world: int, shape: ModelConfig | None) -> None:
    """Degrees, schedule and micro-batches that torch.distributed.pipelining can run, and a
    tensor-parallel degree the model's stages split by."""
    check_stages(cfg, shape, "pipeline")
    check_tensor_parallel(cfg, world, shape)
    if cfg.pp < 2:
        raise ConfigError(f"--pp {cfg.pp}: a pipeline needs 2 or more stages ranks; pass --pp 2 "
                          "or more, or use trainers.ddp")
    if cfg.grad_accum != 1:
        raise ConfigError("--grad-accum: under trainers.pipeline the micro-batches are "
                          "--microbatches; pass --grad-accum 1")
    several = SCHEDULE_STAGES[cfg.schedule] == "several"
    if cfg.virtual_stages < 1 or several != (cfg.virtual_stages >= 2):
        wanted = "--virtual-stages 2 or more" if several else "--virtual-stages 1"
        runs = "several stages" if several else "one stage"
        raise ConfigError(f"--schedule {cfg.schedule} runs {runs} per rank; pass {wanted}")
    stages = cfg.pp * cfg.virtual_stages
    blocks = shape.n_layers if shape is not None else stages
    if blocks % stages:
        raise ConfigError(f"--pp {cfg.pp} x --virtual-stages {cfg.virtual_stages} = {stages} "
                          f"stages do not divide the {cfg.model} model's {blocks} blocks; pick "
                          "degrees whose product divides them")
    replica_batch = cfg.micro_batch(cfg.dp_size(world))
    if cfg.microbatches < 1 or replica_batch % cfg.microbatches:
        raise ConfigError(f"each pipeline's batch of {replica_batch} sequences does not split "
                          f"into --microbatches {cfg.microbatches}; pass a divisor of it")
    if cfg.schedule == "1f1b" and cfg.microbatches < cfg.pp:
        raise ConfigError(f"--schedule 1f1b needs --microbatches >= --pp ({cfg.pp}), got "
                          f"{cfg.microbatches}; pass more micro-batches or --schedule gpipe")
    rounds = max(1, cfg.microbatches // cfg.pp)
    if several and cfg.microbatches % rounds:
        raise ConfigError(f"--schedule {cfg.schedule} needs --microbatches a multiple of "
                          f"{rounds} (micro-batches // pp); pass e.g. {cfg.pp * rounds}")


def check_devices(cfg: TrainConfig, world: int, shape: ModelConfig | None) -> None:
    """A model that can be spread, and ``--devices`` listing cpu or cuda:N entries (whether
    they exist is checked on the rank)."""
    check_stages(cfg, shape, "model_parallel")
    if cfg.devices == "auto":
        return
    for name in cfg.devices.split(","):
        if not DEVICE_PATTERN.match(name):
            raise ConfigError(f"--devices {cfg.devices}: {name!r} is not a device; list cpu or "
                              "cuda:N entries, e.g. cuda:0,cuda:1")


def check_one_process_per_node(cfg: TrainConfig, nproc_per_node: int, gpus: int) -> None:
    """One process per node driving every listed device: each GPU among the node's ``gpus``,
    and some GPU on GPU nodes."""
    if nproc_per_node != 1:
        raise ConfigError(f"model_parallel runs one process per node over --devices; pass "
                          f"-j <nodes>x1, not {nproc_per_node} processes per node")
    needed = max((int(name[5:]) + 1 for name in cfg.devices.split(",")
                  if name.startswith("cuda:")), default=0)
    if needed > gpus:
        raise ConfigError(f"--devices {cfg.devices} needs --gpu {needed} or more, not --gpu "
                          f"{gpus}; pass --gpu {needed}")
    if gpus and not needed:
        devices = ",".join(f"cuda:{i}" for i in range(gpus))
        raise ConfigError(f"--gpu {gpus}, but --devices {cfg.devices} uses no GPU; pass "
                          f"--devices {devices}")


# LoRA's options (docs/finetuning.md): the trainers that build one whole model per replica
# serve them; tensor_parallel and pipeline refuse them.
_LORA = frozenset({"lora_rank", "lora_alpha", "lora_dropout", "lora_targets"})
# torchft replica groups around the trainers whose replicas hold the whole state or shard it
_FAULT_TOLERANT = frozenset({"fault_tolerant", "replica_groups", "replica_group", "lighthouse",
                             "min_replicas", "quorum_timeout"})

_SHARD_HINT = "trainers.fsdp (shards parameters, gradients and optimizer state)"

TRAINERS: dict[str, Trainer] = {t.name: t for t in (
    Trainer("ddp", "data parallel with DistributedDataParallel: every rank a whole replica",
            "Use it when the model, its gradients and AdamW state fit on one device: the "
            "simplest and usually fastest choice; otherwise trainers.fsdp.",
            options=frozenset({"grad_reduce_dtype"}) | _LORA | _FAULT_TOLERANT,
            split=_replicated_split,
            oom_hints=(_SHARD_HINT,)),
    Trainer("fsdp", "FSDP2 fully_shard: each rank holds 1/N of parameters, gradients and "
            "optimizer state",
            "Use it when the model and its training state do not fit on one device but each "
            "block does: memory per rank falls with the number of ranks.",
            options=frozenset({"reshard_after_forward", "cpu_offload"}) | _LORA | _FAULT_TOLERANT,
            split=_fsdp_split,
            sharded=True),
    Trainer("tensor_parallel", "tensor parallel (DTensor) inside groups of --tp ranks, FSDP2 "
            "across groups",
            "Use it when one block's matmuls are too large or slow for one device, inside a "
            "node with fast links (NVLink); --tp divides the heads and the width.",
            options=frozenset({"tp", "dp", "sequence_parallel", "reshard_after_forward",
                               "allow_cross_node_tp"}),
            split=_tensor_parallel_split, check=check_tensor_parallel,
            check_placement=check_tensor_parallel_placement, sharded=True),
    Trainer("pipeline", "pipeline parallel (torch.distributed.pipelining) over --pp ranks, "
            "tensor parallel inside --tp, FSDP2 across pipelines: 3-D",
            "Use it across nodes with slow links when the model does not fit a node: stages "
            "exchange only activations; --microbatches hides the bubble. Add --tp inside a "
            "node when a stage's blocks are too large or slow for one device.",
            options=frozenset({"dp", "pp", "virtual_stages", "schedule", "microbatches",
                               "record_timeline", "tp", "sequence_parallel",
                               "reshard_after_forward", "cpu_offload", "allow_cross_node_tp"}),
            split=_pipeline_split, check=check_pipeline,
            check_placement=check_tensor_parallel_placement, sharded=True,
            accumulate_flag="--microbatches"),
    Trainer("model_parallel", "naive model parallel: one process spreads the blocks over "
            "--devices, DDP across processes",
            "Use it to spread a model too large for one GPU over a node's GPUs without "
            "collectives, e.g. for a first try; the devices take turns (no overlap).",
            options=frozenset({"devices"}) | _LORA, split=_model_parallel_split,
            check=check_devices,
            check_placement=check_one_process_per_node, oom_hints=(_SHARD_HINT,),
            ray="it spreads one process's blocks over several devices, while Ray Train runs "
                "one process per device; run it with `torchx run "
                "components/model_parallel.py:model_parallel` or `python -m "
                "trainers.model_parallel`"),
)}


def trainer(name: str) -> Trainer:
    """The entry for ``name``; ConfigError naming the trainers there are."""
    if name not in TRAINERS:
        raise ConfigError(f"{name!r} is not a trainer; pass one of {', '.join(TRAINERS)}")
    return TRAINERS[name]


def serving(option: str) -> list[str]:
    """The trainers that serve ``option`` (a TrainConfig field only some trainers own)."""
    return [t.name for t in TRAINERS.values() if option in t.options]
