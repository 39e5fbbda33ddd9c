"""The one training loop every strategy uses.

A strategy (:class:`trainers.core.strategy.Strategy`) supplies the model and what differs
between parallelisms; the loop owns the rest: data, accumulation, clipping, AdamW with warm-up
and cosine decay, autocast, evaluation, checkpoints, metrics and the summary.
"""

from __future__ import annotations

import contextlib
import math
import signal
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from trainers.core.checkpoint import Checkpointer
from trainers.core.checkpoint_state import ModelAndOptimizer, Progress, RankRNG
from trainers.core.data import BatchStream, MarkovChainDataset, build_datasets, eval_batches
from trainers.core.distributed import DistEnv
from trainers.core.metrics import (
    MetricsWriter,
    bf16_matmul_hardware,
    format_line,
    measure_peak_flops,
    peak_memory_bytes,
    write_summary,
)
from trainers.core.preemption import Notice, PreemptionWatch
from trainers.core.strategy import Strategy
from trainers.torchfree.checkpoint_files import saved_manifest, step_of
from trainers.torchfree.config import TrainConfig
from trainers.torchfree.faults import kill_point, maybe_kill, restart_count
from trainers.torchfree.model_names import model_shape
from trainers.torchfree.preemption_signals import exit_status, parse_signals
from trainers.torchfree.run_record import changed_options


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
StepHook = Callable[[int, dict[str, float], Path | None], None]


def train(cfg: TrainConfig, env: DistEnv, strategy: Strategy,
          on_step: StepHook | None = None, notice: Notice | None = None) -> dict[str, Any]:
    """Run ``cfg.steps`` optimizer steps (resuming if asked); return the summary (all ranks).

    ``on_step`` (optional) receives every step's metrics on every rank after the step and its
    checkpoint, if any, are done, with the checkpoint directory committed at that step, if any.
    Periodic checkpoints are written in the background (``--async-checkpoint``) during the
    next step and committed after it; the final and the preemption checkpoint are synchronous
    and commit the save still in flight, if any, first.
    A preemption signal (``--preemption-signals``), or ``notice`` (a launcher's own preemption
    notice, asked after every step) returning True on any rank, ends the run after the step
    all ranks agree on, with a checkpoint of it; the summary's ``preempted`` names the signal.
    """
    run_dir = Path(cfg.output_dir)
    model_cfg = model_shape(cfg.model)
    train_set, val_set = build_datasets(cfg, env)
    micro = cfg.micro_batch(strategy.dp_size)
    stream = BatchStream(train_set, micro, strategy.dp_rank, strategy.dp_size, cfg.seed,
                         cfg.num_workers, cfg.prefetch_factor, env.device.type == "cuda")
    val = (eval_batches(val_set, micro, strategy.dp_rank, strategy.dp_size, cfg.eval_batches)
           if cfg.eval_every else [])
    optimizer = build_optimizer(strategy.model, cfg)
    kill_at = kill_point()
    progress = Progress()
    # What the run keeps across attempts, in every checkpoint's manifest: the length of its LR
    # schedule (the first attempt's --steps) and its first loss (for the summary).
    facts: dict[str, Any] = {"schedule_steps": cfg.steps}
    checkpointer = Checkpointer(
        run_dir, cfg.keep_checkpoints, env, cfg.to_dict(),
        state={"train": ModelAndOptimizer(strategy.model, optimizer), "progress": progress,
               "data": stream},
        rank_state={"rng": RankRNG()}, kill_at=kill_at, facts=facts)
    torch.manual_seed(cfg.seed + env.rank)  # each rank its own dropout stream
    resume_from = checkpointer.choose(cfg.resume)
    saved: dict[str, Any] | None = None
    if resume_from is not None:
        checkpointer.load(resume_from)
        saved = saved_manifest(resume_from)
        facts.update({"schedule_steps": saved["config"]["steps"], **saved.get("run", {})})
    start_step = progress.step

    writer = MetricsWriter(run_dir, env.is_main, cfg.tensorboard, start_step, cfg.steps)
    writer.print(f"run directory: {run_dir.resolve()}")
    if saved is not None:
        writer.print(f"resumed from {resume_from} at step {start_step}")
        for line in resume_notes(saved["config"], cfg, start_step, facts["schedule_steps"]):
            writer.print(line)
    compute_dtype = torch.bfloat16 if cfg.dtype == "bf16" else torch.float32
    if cfg.dtype == "bf16" and bf16_matmul_hardware(env.device) is None:
        writer.print(f"warning: this {env.device.type} has no bf16 matmul hardware (AMX, "
                     "AVX512-BF16 or an Ampere GPU): bf16 is converted in software and slower "
                     "than fp32; --dtype fp32 trains faster here")
    peak_flops = (cfg.peak_tflops * 1e12 or measure_peak_flops(env.device, compute_dtype))
    # MFU = tokens/s x model FLOPs per token / (peak FLOP/s per device x devices)
    mfu_per_token_per_s = model_cfg.flops_per_token(cfg.seq_len) / (peak_flops * env.world_size)
    tokens_per_step = cfg.batch_size * cfg.seq_len
    autocast = strategy.autocast(cfg.dtype, env.device)
    history: list[dict[str, float]] = []

    def one_step(step: int) -> dict[str, float]:
        """Optimizer step ``step``: its metrics, with the eval loss at evaluation steps."""
        step_start = time.perf_counter()
        data_time = 0.0
        micro_batches = []
        for _ in range(cfg.grad_accum):
            fetch_start = time.perf_counter()
            inputs, targets = next(stream)
            data_time += time.perf_counter() - fetch_start
            micro_batches.append((inputs.to(env.device, non_blocking=True),
                                  targets.to(env.device, non_blocking=True)))
        optimizer.zero_grad(set_to_none=True)
        loss = strategy.forward_backward(micro_batches, autocast)
        grad_norm = strategy.clip_grad_norm(cfg.grad_clip)
        lr = cfg.lr * lr_factor(step - 1, cfg, facts["schedule_steps"])
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.step()
        metrics = {"loss": strategy.mean_over_replicas(loss), "grad_norm": grad_norm, "lr": lr}
        elapsed = time.perf_counter() - step_start
        metrics.update(
            step_time_s=elapsed, tokens_per_s=tokens_per_step / elapsed,
            mfu=tokens_per_step / elapsed * mfu_per_token_per_s,
            peak_memory_bytes=float(peak_memory_bytes(env.device)), data_share=data_time / elapsed)
        if val and (step % cfg.eval_every == 0 or step == cfg.steps):
            metrics["eval_loss"] = strategy.mean_over_replicas(strategy.eval_loss(val, autocast))
        return metrics

    preempted: signal.Signals | None = None
    saved_step: int | None = None
    wall_start = time.perf_counter()
    with PreemptionWatch(parse_signals(cfg.preemption_signals), env, notice) as watch, \
            contextlib.closing(checkpointer):
        for step in range(start_step + 1, cfg.steps + 1):
            metrics = one_step(step)
            history.append(metrics)
            facts.setdefault("first_loss", metrics["loss"])
            writer.write(step, metrics)
            if (step % cfg.log_every == 0 or step in (start_step + 1, cfg.steps)
                    or "eval_loss" in metrics):
                elapsed = time.perf_counter() - wall_start
                eta = elapsed / (step - start_step) * (cfg.steps - step)
                writer.print(format_line(step, cfg.steps, metrics, elapsed, eta))
            maybe_kill(kill_at, "step", env.rank, step, run_dir)
            progress.step = step
            preempted = watch.agreed() if step < cfg.steps else None
            periodic = bool(cfg.checkpoint_every and step % cfg.checkpoint_every == 0)
            last = step == cfg.steps or preempted is not None
            saved = checkpointer.commit_pending()
            if last or periodic:
                # The final and the preemption save are synchronous: the job ends after them.
                saved = checkpointer.save(step, asynchronous=cfg.async_checkpoint and not last) \
                    or saved
            if saved is not None:
                saved_step = step_of(saved)
            if on_step is not None:
                on_step(step, metrics, saved)
            if preempted is not None:
                writer.print(f"preempted by {preempted.name} after step {step}: saved {saved}; "
                             f"exiting {exit_status(preempted)} for the scheduler to restart the "
                             "job, which resumes from it (--resume auto)")
                break
    writer.close()
    summary = _summarize(cfg, env, history, start_step, time.perf_counter() - wall_start,
                         train_set, mfu_per_token_per_s, model_cfg.num_params(),
                         facts.get("first_loss"))
    summary.update(restarts=restart_count(), steps_lost=writer.steps_redone, tf32=env.tf32,
                   preempted=preempted.name if preempted else None, saved_step=saved_step)
    if env.is_main and history:
        write_summary(run_dir, summary)
        writer.print(f"run directory: {run_dir.resolve()} (plot it: python -m trainers.plot "
                     f"{run_dir})")
        writer.print("summary: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else
                                             f"{k}={v}" for k, v in summary.items()))
    return summary


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


def _summarize(cfg: TrainConfig, env: DistEnv, history: list[dict[str, float]],
               start_step: int, wall_time: float, train_set: Any,
               mfu_per_token_per_s: float, params: int,
               first_loss: float | None) -> dict[str, Any]:
    """Final figures; throughput and MFU from the mean step time after 3 warm-up steps of this
    attempt; ``first_loss``: the run's first step's (its first attempt's, when resumed)."""
    if not history:
        return {"steps": start_step, "note": "already complete"}
    timed = history[3:] or history
    step_time = sum(m["step_time_s"] for m in timed) / len(timed)
    tokens_per_s = cfg.batch_size * cfg.seq_len / step_time
    summary: dict[str, Any] = {
        "model": cfg.model, "params": params,
        "world_size": env.world_size,
        "steps": cfg.steps, "resumed_from_step": start_step,
        "first_loss": history[0]["loss"] if first_loss is None else first_loss,
        "final_loss": history[-1]["loss"],
        "tokens_per_s": tokens_per_s,
        "mfu": tokens_per_s * mfu_per_token_per_s,
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
    if isinstance(train_set, MarkovChainDataset):
        summary["loss_floor"] = train_set.entropy_rate()
    return summary
