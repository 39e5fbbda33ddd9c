"""The one training loop every strategy uses.

A strategy (:class:`trainers.core.strategy.Strategy`) supplies the model and what differs
between parallelisms; the loop owns the rest: data, accumulation, clipping, AdamW with warm-up
and cosine decay, autocast, evaluation, checkpoints, metrics and the summary.

:func:`train` reads top to bottom: :func:`start_run` builds the run (data, optimizer,
checkpointer, resume, metrics) into a :class:`Run` and its :class:`RunState`; each step is
:func:`train_step`, :func:`log_step`, :func:`save_step` and the caller's hook, until the last
step or an agreed preemption; :func:`finish` writes the summary. The strategy names the step
to take (:meth:`~trainers.core.strategy.Strategy.begin_step`: replica groups may jump to their
live peers' step) and whether its optimizer step applies
(:meth:`~trainers.core.strategy.Strategy.commit`: else it is taken again).

The host waits for the device only at flush points, as nanoGPT reads its loss only when it
logs: a step leaves its loss and gradient norm on the device (clipping too stays there:
:meth:`~trainers.core.strategy.Strategy.clip_grads`) in a :class:`PendingStep`, and
:func:`flush` brings every pending step's figures to the host together: their losses averaged
over the data-parallel replicas in one all-reduce, read with the gradient norms in one host
read. The loop flushes at log steps (``--log-every``), the attempt's first and last step,
evaluation steps, the steps that save or commit a checkpoint (periodic, final, preemption) and
a fault-injection kill point's step, so ``metrics.jsonl`` (and the trackers) still get every
step, in order, with the figures an immediate read gives, and a checkpoint never holds a step
that ``metrics.jsonl`` lacks. ``--log-every 1`` flushes every step (the cadence before).
What a crash (not an injected fault) loses is the unflushed steps' lines: ``steps_lost`` of the
resumed run then counts the steps redone up to the last flush.

Step time, tokens/s and MFU stay per step as the host's timer measures them, and a flush adds
its own time (the losses' all-reduce, the wait for the device) to the step that flushes. On
the CPU a step's time is its work, as before. On a GPU (asynchronous) a step's host time is
the time its work took to queue, so a single step's figures mean little: their average over
the steps between two flushes, whose last step waits for the device, is the device's speed
(the summary's tokens/s averages over all the steps after three, ending at a flush).
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
from trainers.core.data import InstructionDataset, build_datasets, dataset_samples
from trainers.core.distributed import DistEnv
from trainers.core.metrics import (
    MetricsWriter,
    format_line,
    peak_memory_bytes,
    write_summary,
)
from trainers.core.preemption import Notice, PreemptionWatch
from trainers.core.profiling import StepProfiler
from trainers.core.run_state import (
    PendingStep,
    Run,
    RunFacts,
    RunState,
    Throughput,
    resume_notes,
    summarize,
)
from trainers.core.strategy import Strategy
from trainers.models import ModelSpec
from trainers.models.lora import check_resumable
from trainers.options.tracker_names import chosen_trackers
from trainers.options.train_config import TrainConfig
from trainers.runs.checkpoint_files import saved_manifest, step_of
from trainers.runs.faults import kill_point, maybe_kill, restart_count
from trainers.runs.preemption_signals import exit_status, parse_signals
from trainers.runs.storage import RunPath
from trainers.sizing.shapes import ModelConfig


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


# Called on every rank for every step, in order, with (step, metrics, the checkpoint committed
# at that step or None: an asynchronous save commits at a later step than its own); a
# launcher's metrics sink, e.g. ray.train.report. The calls come at the loop's flush points
# (module docstring), at the end of the flushing step, after its checkpoint, if any: one for
# each step since the previous flush, that step last (a step that commits a checkpoint always
# flushes, so only the last call can carry one). Every rank calls it equally often, at the
# same steps.
StepHook = Callable[[int, dict[str, float], RunPath | None], None]


def train(cfg: TrainConfig, env: DistEnv, strategy: Strategy, spec: ModelSpec, run_dir: RunPath,
          on_step: StepHook | None = None, notice: Notice | None = None) -> dict[str, Any]:
    """Run ``cfg.steps`` optimizer steps of ``strategy``'s model, built from ``spec`` (resuming
    if asked), writing into ``run_dir`` (``--output-dir``, resolved once by the caller); return
    the summary (all ranks).

    ``on_step`` (optional) receives every step's metrics on every rank, in order, at the flush
    points (:data:`StepHook`), with the checkpoint directory committed at that step, if any.
    Periodic checkpoints are written in the background (``--async-checkpoint``) during the
    next step and committed after it; the final and the preemption checkpoint are synchronous
    and commit the save still in flight, if any, first.
    A preemption signal (``--preemption-signals``), or ``notice`` (a launcher's own preemption
    notice, asked after every step) returning True on any rank, ends the run after the step
    all ranks agree on, with a checkpoint of it; the summary's ``preempted`` names the signal.
    """
    run, state = start_run(cfg, env, strategy, spec.shape, run_dir)
    with PreemptionWatch(parse_signals(cfg.preemption_signals), env, notice) as watch, \
            contextlib.closing(strategy), \
            contextlib.closing(run.checkpointer), contextlib.closing(run.writer), \
            StepProfiler(cfg.profile_steps, state.start_step + 1, cfg.steps,
                         env.device) as profiler:
        step = state.start_step
        while step < cfg.steps:
            step = strategy.begin_step(step + 1)
            if step > cfg.steps:  # healed from replica groups that finished the run
                break
            metrics = train_step(run, step, state.facts.schedule_steps)
            profiler.step()
            if metrics is None:  # not committed (a replica group was lost): taken again
                step -= 1
                continue
            log_step(run, state, step, metrics)
            maybe_kill(run.kill_at, "step", env.rank, step, run.run_dir)
            run.progress.step = step
            state.preempted = watch.agreed() if step < cfg.steps else None
            saved = save_step(run, state, step)
            if saved is not None:
                run.writer.sync()
            flushed, state.flushed = state.flushed, []
            if on_step is not None:
                for done, done_metrics in flushed:
                    on_step(done, done_metrics, saved if done == step else None)
            if state.preempted is not None:
                run.writer.print(f"preempted by {state.preempted.name} after step {step}: saved "
                                 f"{saved}; exiting {exit_status(state.preempted)} for the "
                                 "scheduler to restart the job, which resumes from it "
                                 "(--resume auto)")
                break
        profiler.report(run.run_dir, env.rank, run.writer.print)
        return finish(run, state)


def start_run(cfg: TrainConfig, env: DistEnv, strategy: Strategy, shape: ModelConfig,
              run_dir: RunPath) -> tuple[Run, RunState]:
    """Data, optimizer and checkpointer of ``strategy``'s model; the checkpoint resumed, if
    any; the metrics sink (which gets the line about instruction samples skipped, if any) and
    what MFU is measured against."""
    strategy.attach_run(run_dir)
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
    strategy.share_state(checkpointer.state)
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
    samples = dataset_samples(train_set)
    if samples is not None and samples.skipped is not None:
        writer.print(samples.skipped.line())
    if saved is not None:
        writer.print(f"resumed from {resume_from} at step {progress.step}")
        for line in resume_notes(saved["config"], cfg, progress.step, facts.schedule_steps):
            writer.print(line)
    run = Run(cfg=cfg, env=env, strategy=strategy, optimizer=optimizer, stream=stream, val=val,
              train_set=train_set, progress=progress, checkpointer=checkpointer, writer=writer,
              autocast=strategy.autocast(cfg.dtype, env.device),
              throughput=Throughput.measured(cfg, env, shape, writer.print),
              params=shape.num_params(), kill_at=kill_at, run_dir=run_dir)
    return run, RunState(facts=facts, start_step=progress.step, wall_start=time.perf_counter())


def train_step(run: Run, step: int, schedule_steps: int) -> PendingStep | None:
    """Optimizer step ``step`` (of an LR schedule of ``schedule_steps``), with an evaluation at
    evaluation steps: its metrics, those the device computed left there (no host read); None
    when the strategy does not commit it (:meth:`~trainers.core.strategy.Strategy.commit`)."""
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
    grad_norm = strategy.clip_grads(cfg.grad_clip)
    lr = cfg.lr * lr_factor(step - 1, cfg, schedule_steps)
    for group in optimizer.param_groups:
        group["lr"] = lr
    if not strategy.commit():
        return None
    optimizer.step()
    elapsed = time.perf_counter() - step_start
    tokens = sum(batch[0].numel() for batch in micro_batches)
    cut = isinstance(run.train_set, InstructionDataset)  # batches cut to their samples
    metrics = PendingStep(step=step, loss=loss, grad_norm=grad_norm, lr=lr, seconds=elapsed,
                          data_seconds=data_time,
                          tokens=float(tokens if cut else tokens * strategy.dp_size),
                          replica_tokens=cut,
                          peak_memory_bytes=float(peak_memory_bytes(run.env.device)))
    if run.val and (step % cfg.eval_every == 0 or step == cfg.steps):
        metrics.eval_loss = strategy.eval_loss(run.val, run.autocast)
    return metrics


def log_step(run: Run, state: RunState, step: int, metrics: PendingStep) -> None:
    """Queue step ``step``'s ``metrics``; :func:`flush` the queue at log steps, the first and
    last step of the attempt, evaluation steps and the step of a fault-injection kill point
    (:func:`save_step` flushes at the steps that save or commit a checkpoint)."""
    cfg = run.cfg
    state.pending.append(metrics)
    if (step % cfg.log_every == 0 or step in (state.start_step + 1, cfg.steps)
            or metrics.eval_loss is not None
            or (run.kill_at is not None and run.kill_at.step == step)):
        flush(run, state)


def flush(run: Run, state: RunState) -> None:
    """Bring the pending steps' metrics to the host (collective: every rank flushes at the same
    steps): their losses, eval losses and the token counts of batches cut to their samples
    averaged over the replicas in one all-reduce, read with the gradient norms in one host read
    (the values and order an immediate read per step gives); then each step's metrics, in
    order, go to :func:`record` and to the step hook's queue."""
    pending, state.pending = state.pending, []
    if not pending:
        return
    start = time.perf_counter()
    device = pending[0].loss.device
    evaluated = [p.eval_loss for p in pending if p.eval_loss is not None]
    counts = [p.tokens for p in pending if p.replica_tokens]
    shares = torch.stack([t.float().to(device) for t in [p.loss for p in pending] + evaluated])
    if counts:
        shares = torch.cat([shares, torch.tensor(counts, dtype=torch.float32, device=device)])
    norms = torch.stack([p.grad_norm.float().to(device) for p in pending])
    values = torch.cat([run.strategy.means_over_replicas(shares), norms]).tolist()
    pending[-1].seconds += time.perf_counter() - start  # the wait for the device, on a GPU
    n, e = len(pending), len(evaluated)
    losses, evals, norm_values = values[:n], iter(values[n:n + e]), values[-n:]
    mean_counts = iter(values[n + e:n + e + len(counts)])
    for p, loss, grad_norm in zip(pending, losses, norm_values, strict=True):
        tokens = next(mean_counts) * run.strategy.dp_size if p.replica_tokens else p.tokens
        metrics = {"loss": loss, "grad_norm": grad_norm, "lr": p.lr}
        metrics.update(run.throughput.of_step(p.seconds, tokens),
                       peak_memory_bytes=p.peak_memory_bytes,
                       data_share=p.data_seconds / p.seconds)
        if p.eval_loss is not None:
            metrics["eval_loss"] = next(evals)
        record(run, state, p.step, metrics)
        state.flushed.append((p.step, metrics))


def record(run: Run, state: RunState, step: int, metrics: dict[str, float]) -> None:
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
    (the job ends after them). Returns the checkpoint committed now, if any (collective). Both
    :func:`flush` first: metrics.jsonl holds every step a checkpoint holds."""
    cfg = run.cfg
    periodic = bool(cfg.checkpoint_every and step % cfg.checkpoint_every == 0)
    last = step == cfg.steps or state.preempted is not None
    if last or periodic or state.save_in_flight:
        flush(run, state)
    saved = run.checkpointer.commit_pending()
    state.save_in_flight = False
    if last or periodic:
        asynchronous = cfg.async_checkpoint and not last
        saved = run.checkpointer.save(step, asynchronous=asynchronous) or saved
        state.save_in_flight = asynchronous
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
        run.writer.print(f"run directory: {run.run_dir.resolve()} (plot it: ttx-plot "
                         f"{run.run_dir})")
        run.writer.print("summary: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else
                                                 f"{k}={v}" for k, v in summary.items()))
    return summary

