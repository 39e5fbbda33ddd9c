"""What the training loop (:mod:`trainers.core.loop`) works with, typed: the parts of a run it
builds once (:class:`Run`), what it carries from step to step (:class:`RunState`), a step whose
metrics have not reached the host yet (:class:`PendingStep`), what a run keeps across attempts
(:class:`RunFacts`), and the figures made of them: the notes of a resume (:func:`resume_notes`)
and the summary (:func:`summarize`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import Dataset

from trainers.core.batch_stream import BatchStream
from trainers.core.checkpoint import Checkpointer
from trainers.core.checkpoint_state import Progress
from trainers.core.data import Batch, MarkovChainDataset, dataset_samples
from trainers.core.distributed import DistEnv
from trainers.core.metrics import MetricsWriter, bf16_matmul_hardware, measure_peak_flops
from trainers.core.strategy import Strategy
from trainers.options.train_config import TrainConfig
from trainers.runs.faults import KillPoint
from trainers.runs.run_record import changed_options
from trainers.runs.storage import RunPath
from trainers.sizing.memory_formulas import Adapters, adapter_params
from trainers.sizing.shapes import FAMILIES, ModelConfig


@dataclass
class RunFacts:
    """What a run keeps across attempts, in every checkpoint's manifest (``run``)."""

    schedule_steps: int  # the LR schedule's length: the first attempt's --steps
    first_loss: float | None = None  # the loss of the run's first step (of its first attempt)

    def for_manifest(self) -> dict[str, Any]:
        """The facts as a checkpoint's manifest holds them (only those known)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    def restore(self, manifest: dict[str, Any]) -> None:
        """Take the facts of the run a checkpoint with ``manifest`` belongs to."""
        run = manifest.get("run", {})
        self.schedule_steps = run.get("schedule_steps", manifest["config"]["steps"])
        self.first_loss = run.get("first_loss")


@dataclass(frozen=True)
class Throughput:
    """What turns a step's time and tokens into tokens/s and MFU."""

    # MFU = tokens/s x model FLOPs per token / (peak FLOP/s per device x devices)
    mfu_per_token_per_s: float

    @classmethod
    def measured(cls, cfg: TrainConfig, env: DistEnv, shape: ModelConfig,
                 say: Callable[[str], None]) -> Throughput:
        """Against ``--peak-tflops``, or a matmul probe of this device in the run's dtype;
        ``say`` gets a warning where bf16 has no hardware here."""
        compute_dtype = torch.bfloat16 if cfg.dtype == "bf16" else torch.float32
        if cfg.dtype == "bf16" and bf16_matmul_hardware(env.device) is None:
            say(f"warning: this {env.device.type} has no bf16 matmul hardware (AMX, "
                "AVX512-BF16 or an Ampere GPU): bf16 is converted in software and slower "
                "than fp32; --dtype fp32 trains faster here")
        peak_flops = cfg.peak_tflops * 1e12 or measure_peak_flops(env.device, compute_dtype)
        return cls(model_flops_per_token(cfg, shape) / (peak_flops * env.world_size))

    def of_step(self, seconds: float, tokens: float) -> dict[str, float]:
        """``step_time_s``, ``tokens_per_s`` and ``mfu`` of a step that took ``seconds`` and
        computed ``tokens`` input tokens over all replicas (padding a batch was cut to
        included)."""
        return {"step_time_s": seconds, "tokens_per_s": tokens / seconds,
                "mfu": tokens / seconds * self.mfu_per_token_per_s}


def model_flops_per_token(cfg: TrainConfig, shape: ModelConfig) -> int:
    """The FLOPs per token MFU counts for ``cfg``'s run: a LoRA run's (``--lora-rank``) with
    the base frozen (4 per base weight and 6 per adapter parameter) where the family's linear
    layers are known (gpt, llama), else full training's 6 per parameter."""
    adapters = Adapters.of(cfg.lora_rank, cfg.lora_targets)
    if adapters is None or shape.family not in FAMILIES:
        return shape.flops_per_token(cfg.seq_len)
    return shape.flops_per_token(cfg.seq_len, adapter_params(shape, adapters)[0])


@dataclass
class Run:
    """The parts of one attempt of a run, built once by :func:`trainers.core.loop.start_run`;
    the step is ``progress.step`` (checkpointed with the model, optimizer and ``stream``)."""

    cfg: TrainConfig
    env: DistEnv
    strategy: Strategy
    optimizer: torch.optim.Optimizer
    stream: BatchStream
    val: list[Batch]  # this rank's evaluation micro-batches (none: no evaluation)
    train_set: Dataset[Batch]
    progress: Progress
    checkpointer: Checkpointer
    writer: MetricsWriter
    autocast: contextlib.AbstractContextManager[None]
    throughput: Throughput
    params: int  # the model's parameter count
    kill_at: KillPoint | None  # an injected fault (tests), or None
    run_dir: RunPath  # --output-dir, resolved once


@dataclass
class PendingStep:
    """A step trained and not yet flushed (:func:`trainers.core.loop.flush`): what the device
    holds of its metrics, left there (reading it would wait for the device), and what the host
    measured."""

    step: int
    loss: torch.Tensor  # this replica's share of the step's loss (0-dim, on the device)
    grad_norm: torch.Tensor  # the global gradient norm before clipping (0-dim, on the device)
    lr: float
    seconds: float  # the step's host time (a flush adds its wait for the device)
    data_seconds: float  # of which fetching batches
    tokens: float  # input tokens: this replica's (``replica_tokens``) or all replicas'
    replica_tokens: bool  # whether ``tokens`` still needs the sum over the replicas
    peak_memory_bytes: float
    eval_loss: torch.Tensor | None = None  # this replica's share, at evaluation steps


@dataclass
class RunState:
    """What the loop carries from step to step of one attempt."""

    facts: RunFacts
    start_step: int  # the step the attempt starts after (0, or the step resumed at)
    wall_start: float  # time.perf_counter() when its first step began
    history: list[dict[str, float]] = field(default_factory=list)  # each step's metrics
    saved_step: int | None = None  # the step of the newest checkpoint committed
    preempted: signal.Signals | None = None  # the signal all ranks agreed to stop on
    pending: list[PendingStep] = field(default_factory=list)  # steps since the last flush
    flushed: list[tuple[int, dict[str, float]]] = field(default_factory=list)  # for the hook
    save_in_flight: bool = False  # a background save commits at the next step


def resume_notes(saved: dict[str, Any], cfg: TrainConfig, start_step: int,
                 schedule_steps: int) -> list[str]:
    """What a resume at ``start_step`` of a run saved with options ``saved`` should tell the
    user: every option changed (one warning), the LR rule past ``schedule_steps``, and a run
    that has nothing left to train."""
    notes = []
    changes = changed_options(saved, cfg.to_dict())
    if changes:
        notes.append("warning: resuming with changed options (they apply from step "
                     f"{start_step + 1}): " + "; ".join(changes))
    if cfg.steps > schedule_steps and start_step < cfg.steps:
        notes.append(f"--steps {cfg.steps} extends the run's {schedule_steps}-step schedule: "
                     f"the learning rate stays at its final value after step {schedule_steps}")
    if start_step >= cfg.steps:
        notes.append(f"the run is already complete at step {start_step} (--steps {cfg.steps}); "
                     f"to train further pass --steps N > {start_step} (the learning rate stays "
                     "at its final value), or start a new run with another --output-dir")
    return notes


def summarize(run: Run, state: RunState, wall_time: float) -> dict[str, Any]:
    """Final figures; throughput and MFU from the tokens and time of the steps after 3 warm-up
    steps of this attempt; the first loss is the run's (its first attempt's, when resumed);
    with instruction data, the samples skipped (``--long-samples skip``)."""
    cfg, history = run.cfg, state.history
    if not history:
        return {"steps": state.start_step, "note": "already complete"}
    timed = history[3:] or history
    step_time = sum(m["step_time_s"] for m in timed) / len(timed)
    tokens_per_s = sum(m["tokens_per_s"] * m["step_time_s"] for m in timed) / (
        step_time * len(timed))
    summary: dict[str, Any] = {
        "model": cfg.model, "params": run.params,
        "world_size": run.env.world_size,
        "steps": cfg.steps, "resumed_from_step": state.start_step,
        "first_loss": history[0]["loss"] if state.facts.first_loss is None
        else state.facts.first_loss,
        "final_loss": history[-1]["loss"],
        "tokens_per_s": tokens_per_s,
        "mfu": tokens_per_s * run.throughput.mfu_per_token_per_s,
        "peak_memory_bytes": int(max(m["peak_memory_bytes"] for m in history)),
        "data_share": sum(m["data_share"] for m in timed) / len(timed),
        "wall_time_s": wall_time,
    }
    if cfg.compile:
        # Blocks compile during the first step of each attempt: its time beyond a compiled step.
        summary["compile_time_s"] = history[0]["step_time_s"] - statistics.median(
            m["step_time_s"] for m in timed)
    evals = [m["eval_loss"] for m in history if "eval_loss" in m]
    if evals:
        summary["final_eval_loss"] = evals[-1]
    if isinstance(run.train_set, MarkovChainDataset):
        summary["loss_floor"] = run.train_set.entropy_rate()
    samples = dataset_samples(run.train_set)
    if samples is not None:
        summary["skipped_samples"] = samples.skipped.count if samples.skipped else 0
    return summary
