"""The one training loop every strategy uses.

A strategy (:class:`trainers.core.strategy.Strategy`) supplies the model and what differs
between parallelisms; the loop owns the rest: data, accumulation, clipping, AdamW with warm-up
and cosine decay, autocast, evaluation, checkpoints, metrics and the summary.

:func:`train` reads top to bottom: :func:`start_run` builds the run (data, optimizer,
checkpointer, resume, metrics) into a :class:`Run` and its :class:`RunState`; each step is
:func:`train_step`, :func:`log_step`, :func:`save_step` and the caller's hook, until the last
step or an agreed preemption; :func:`finish` writes the summary. Metrics reach the host every
step (the loss and gradient norm: ``metrics.jsonl`` holds every step); the console line is
printed at log steps.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from trainers.core.batch_stream import BatchStream, eval_batches
from trainers.core.checkpoint import Checkpointer
from trainers.core.checkpoint_state import ModelAndOptimizer, Progress, RankRNG
from trainers.core.data import InstructionDataset, build_datasets
from trainers.core.distributed import DistEnv
from trainers.core.metrics import (
    MetricsWriter,
    format_line,
    peak_memory_bytes,
    write_summary,
)
from trainers.core.preemption import Notice, PreemptionWatch
from trainers.core.profiling import StepProfiler
from trainers.core.run_state import Run, RunFacts, RunState, Throughput, resume_notes, summarize
from trainers.core.strategy import Strategy
from trainers.models import ModelSpec
from trainers.models.lora import check_resumable
from trainers.torchfree.checkpoint_files import saved_manifest, step_of
from trainers.torchfree.faults import kill_point, maybe_kill, restart_count
from trainers.torchfree.preemption_signals import exit_status, parse_signals
from trainers.torchfree.shapes import ModelConfig
from trainers.torchfree.storage import RunPath, location
from trainers.torchfree.tracker_names import chosen_trackers
from trainers.torchfree.train_config import TrainConfig


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW (fused kernel) with weight decay on matrices and embeddings, none on norms.

    DTensors and plain tensors (tensor parallelism leaves embeddings and norms unsharded) go
    to separate parameter groups: the fused kernel takes one kind per call.
    """
    groups: dict[tuple[bool, bool], list[nn.Parameter]] = {}
    for param in model.parameters():
        if param.requires_grad:
            groups.setdefault((param.dim() >= 2, isinstance(param, DTensor)), []).append(param)
    return torch.optim.AdamW(
        [{"params": params, "weight_decay": cfg.weight_decay if decay else 0.0}
         for (decay, _), params in sorted(groups.items())],
        lr=cfg.lr, betas=(0.9, 0.95), fused=True)


def lr_factor(step: int, cfg: TrainConfig, schedule_steps: int) -> float:
    """LR multiplier after ``step`` optimizer steps: linear warm-up, then cosine decay towards
    ``--min-lr-ratio`` over ``schedule_steps`` steps (the run's first ``--steps``), constant
    after them, so a resume with more ``--steps`` continues at the final rate without a jump."""
    step = min(step, schedule_steps - 1)  # past the schedule: the rate of its last step
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    span = max(1, schedule_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


# Called on every rank after each step with (step, metrics, the checkpoint committed at that
# step or None: an asynchronous save commits at a later step than its own); a launcher's
# metrics sink, e.g. ray.train.report. Every rank calls it equally often.
StepHook = Callable[[int, dict[str, float], RunPath | None], None]


def train(cfg: TrainConfig, env: DistEnv, strategy: Strategy, spec: ModelSpec,
          on_step: StepHook | None = None, notice: Notice | None = None) -> dict[str, Any]:
    """Run ``cfg.steps`` optimizer steps of ``strategy``'s model, built from ``spec`` (resuming
    if asked); return the summary (all ranks).

    ``on_step`` (optional) receives every step's metrics on every rank after the step and its
    checkpoint, if any, are done, with the checkpoint directory committed at that step, if any.
    Periodic checkpoints are written in the background (``--async-checkpoint``) during the
    next step and committed after it; the final and the preemption checkpoint are synchronous
    and commit the save still in flight, if any, first.
    A preemption signal (``--preemption-signals``), or ``notice`` (a launcher's own preemption
    notice, asked after every step) returning True on any rank, ends the run after the step
    all ranks agree on, with a checkpoint of it; the summary's ``preempted`` names the signal.
    """
    run, state = start_run(cfg, env, strategy, spec.shape)
    with PreemptionWatch(parse_signals(cfg.preemption_signals), env, notice) as watch, \
            contextlib.closing(run.checkpointer), contextlib.closing(run.writer), \
            StepProfiler(cfg.profile_steps, state.start_step + 1, cfg.steps,
                         env.device) as profiler:
        for step in range(state.start_step + 1, cfg.steps + 1):
            metrics = train_step(run, step, state.facts.schedule_steps)
            profiler.step()
            log_step(run, state, step, metrics)
            maybe_kill(run.kill_at, "step", env.rank, step, run.run_dir)
            run.progress.step = step
            state.preempted = watch.agreed() if step < cfg.steps else None
            saved = save_step(run, state, step)
            if saved is not None:
                run.writer.sync()
            if on_step is not None:
                on_step(step, metrics, saved)
            if state.preempted is not None:
                run.writer.print(f"preempted by {state.preempted.name} after step {step}: saved "
                                 f"{saved}; exiting {exit_status(state.preempted)} for the "
                                 "scheduler to restart the job, which resumes from it "
                                 "(--resume auto)")
                break
        profiler.report(run.run_dir, env.rank, run.writer.print)
        return finish(run, state)


def start_run(cfg: TrainConfig, env: DistEnv, strategy: Strategy,
              shape: ModelConfig) -> tuple[Run, RunState]:
    """Data, optimizer and checkpointer of ``strategy``'s model; the checkpoint resumed, if
    any; the metrics sink and what MFU is measured against."""
    run_dir = location(cfg.output_dir)
    train_set, val_set = build_datasets(cfg, env)
    micro = cfg.micro_batch(strategy.dp_size)
    stream = BatchStream(train_set, micro, strategy.dp_rank, strategy.dp_size, cfg.seed,
                         cfg.num_workers, cfg.prefetch_factor, env.device.type == "cuda",
                         global_batch=cfg.batch_size)
    val = (eval_batches(val_set, micro, strategy.dp_rank, strategy.dp_size, cfg.eval_batches)
           if cfg.eval_every else [])
    optimizer = build_optimizer(strategy.model, cfg)
    kill_at = kill_point()
    progress = Progress()
    facts = RunFacts(schedule_steps=cfg.steps)
    checkpointer = Checkpointer(
        run_dir, cfg.keep_checkpoints, env, cfg.to_dict(),
        state={"train": ModelAndOptimizer(strategy.model, optimizer), "progress": progress,
               "data": stream},
        rank_state={"rng": RankRNG()}, kill_at=kill_at, facts=facts.for_manifest)
    torch.manual_seed(cfg.seed + env.rank)  # each rank its own dropout stream
    resume_from = checkpointer.choose(cfg.resume)
    saved: dict[str, Any] | None = None
    if resume_from is not None:
        saved = saved_manifest(resume_from)
        check_resumable(saved["config"], cfg.to_dict(), str(resume_from))
        checkpointer.load(resume_from)
        facts.restore(saved)
    writer = MetricsWriter(run_dir, env.is_main, chosen_trackers(cfg.tracker, cfg.tensorboard),
                           progress.step, cfg.steps)
    writer.print(f"run directory: {run_dir.resolve()}")
    if saved is not None:
        writer.print(f"resumed from {resume_from} at step {progress.step}")
        for line in resume_notes(saved["config"], cfg, progress.step, facts.schedule_steps):
            writer.print(line)
    run = Run(cfg=cfg, env=env, strategy=strategy, optimizer=optimizer, stream=stream, val=val,
              train_set=train_set, progress=progress, checkpointer=checkpointer, writer=writer,
              autocast=strategy.autocast(cfg.dtype, env.device),
              throughput=Throughput.measured(cfg, env, shape, writer.print),
              params=shape.num_params(), kill_at=kill_at)
    return run, RunState(facts=facts, start_step=progress.step, wall_start=time.perf_counter())


def train_step(run: Run, step: int, schedule_steps: int) -> dict[str, float]:
    """Optimizer step ``step`` (of an LR schedule of ``schedule_steps``): its metrics, with
    the eval loss at evaluation steps."""
    cfg, strategy, optimizer = run.cfg, run.strategy, run.optimizer
    step_start = time.perf_counter()
    data_time = 0.0
    micro_batches = []
    for _ in range(cfg.grad_accum):
        fetch_start = time.perf_counter()
        batch = next(run.stream)
        data_time += time.perf_counter() - fetch_start
        micro_batches.append(tuple(t.to(run.env.device, non_blocking=True) for t in batch))
    optimizer.zero_grad(set_to_none=True)
    loss = strategy.forward_backward(micro_batches, run.autocast)
    grad_norm = strategy.clip_grad_norm(cfg.grad_clip)
    lr = cfg.lr * lr_factor(step - 1, cfg, schedule_steps)
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.step()
    metrics = {"loss": strategy.mean_over_replicas(loss), "grad_norm": grad_norm, "lr": lr}
    elapsed = time.perf_counter() - step_start
    tokens = sum(batch[0].numel() for batch in micro_batches)
    if isinstance(run.train_set, InstructionDataset):  # batches cut to their samples
        tokens = strategy.mean_over_replicas(torch.tensor(float(tokens))) * strategy.dp_size
    else:
        tokens *= strategy.dp_size
    metrics.update(run.throughput.of_step(elapsed, tokens),
                   peak_memory_bytes=float(peak_memory_bytes(run.env.device)),
                   data_share=data_time / elapsed)
    if run.val and (step % cfg.eval_every == 0 or step == cfg.steps):
        metrics["eval_loss"] = strategy.mean_over_replicas(strategy.eval_loss(run.val,
                                                                              run.autocast))
    return metrics


def log_step(run: Run, state: RunState, step: int, metrics: dict[str, float]) -> None:
    """Keep step ``step``'s ``metrics``, write them (metrics.jsonl, TensorBoard) and print the
    console line at log steps, the first and last step of the attempt and evaluation steps."""
    cfg = run.cfg
    state.history.append(metrics)
    if state.facts.first_loss is None:
        state.facts.first_loss = metrics["loss"]
    run.writer.write(step, metrics)
    if (step % cfg.log_every == 0 or step in (state.start_step + 1, cfg.steps)
            or "eval_loss" in metrics):
        elapsed = time.perf_counter() - state.wall_start
        eta = elapsed / (step - state.start_step) * (cfg.steps - step)
        run.writer.print(format_line(step, cfg.steps, metrics, elapsed, eta))


def save_step(run: Run, state: RunState, step: int) -> RunPath | None:
    """Commit the save in flight, if any, then save step ``step`` if it is due: periodic ones
    in the background (``--async-checkpoint``), the final and the preemption save synchronously
    (the job ends after them). Returns the checkpoint committed now, if any (collective)."""
    cfg = run.cfg
    periodic = bool(cfg.checkpoint_every and step % cfg.checkpoint_every == 0)
    last = step == cfg.steps or state.preempted is not None
    saved = run.checkpointer.commit_pending()
    if last or periodic:
        saved = run.checkpointer.save(step, asynchronous=cfg.async_checkpoint and not last) \
            or saved
    if saved is not None:
        state.saved_step = step_of(saved)
    return saved


def finish(run: Run, state: RunState) -> dict[str, Any]:
    """The run's summary (every rank); rank 0 writes summary.json and prints it."""
    summary = summarize(run, state, time.perf_counter() - state.wall_start)
    summary.update(restarts=restart_count(), steps_lost=run.writer.steps_redone,
                   tf32=run.env.tf32,
                   preempted=state.preempted.name if state.preempted else None,
                   saved_step=state.saved_step)
    if run.env.is_main and state.history:
        write_summary(run.run_dir, summary)
        run.writer.log_summary(summary)
        run.writer.print(f"run directory: {run.run_dir.resolve()} (plot it: python -m "
                         f"trainers.plot {run.run_dir})")
        run.writer.print("summary: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else
                                                 f"{k}={v}" for k, v in summary.items()))
    return summary

