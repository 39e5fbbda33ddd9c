"""The one training loop every strategy uses, and the :class:`Strategy` contract it runs on.

A strategy (DDP, FSDP, ...) wraps the model and overrides only what differs: how gradient
sync is suppressed on non-final micro-steps, how a step's forward and backward run, how the
gradient norm is taken. The loop owns the rest: data, accumulation, clipping, AdamW with
warm-up and cosine decay, autocast, evaluation, checkpoints, metrics and the summary.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from trainers.checkpoint import Checkpointer
from trainers.config import TrainConfig
from trainers.data import Batch, BatchStream, MarkovChainDataset, build_datasets, eval_batches
from trainers.distributed import DistEnv
from trainers.faults import kill_point, maybe_kill, restart_count
from trainers.metrics import (
    MetricsWriter,
    format_line,
    measure_peak_flops,
    peak_memory_bytes,
    write_summary,
)
from trainers.model import Transformer, build_model
from trainers.shapes import MODEL_SIZES


def prepare_model(cfg: TrainConfig, device: torch.device) -> Transformer:
    """The configured model on ``device``, identical on every rank (seeded from ``--seed``)."""
    torch.manual_seed(cfg.seed)
    return build_model(cfg.model, cfg.dropout, cfg.attention, cfg.attention_window).to(device)


class Strategy:
    """A parallelism strategy as the loop sees it; the default is plain single-replica training.

    ``model`` is the (wrapped) module whose parameters are trained and checkpointed;
    ``dp_rank``/``dp_size`` place this process among the data-parallel replicas and
    ``dp_group`` is their process group (None: the default group).
    """

    def __init__(self, model: nn.Module, dp_rank: int, dp_size: int,
                 dp_group: dist.ProcessGroup | None = None) -> None:
        self.model = model
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self.dp_group = dp_group

    def no_sync(self) -> contextlib.AbstractContextManager[None]:
        """Context in which backward does not synchronise gradients across replicas."""
        return contextlib.nullcontext()

    def autocast(self, dtype: str, device: torch.device) -> contextlib.AbstractContextManager:
        """The compute-dtype context of forward passes: bf16 autocast when asked for."""
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == "bf16")

    def loss(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy of one micro-batch."""
        logits = self.model(inputs)
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.to(logits.device).flatten())

    def forward_backward(self, micro_batches: Sequence[Batch],
                         autocast: contextlib.AbstractContextManager[None]) -> torch.Tensor:
        """Accumulate gradients of the step's mean loss; return that loss (local, detached).

        Each micro-batch loss is scaled by 1/N; gradients synchronise only on the last one.
        """
        total = torch.zeros((), device=micro_batches[0][0].device)
        count = len(micro_batches)
        for index, (inputs, targets) in enumerate(micro_batches):
            sync = contextlib.nullcontext() if index == count - 1 else self.no_sync()
            with sync:
                with autocast:
                    loss = self.loss(inputs, targets)
                (loss / count).backward()
            total += loss.detach()
        return total / count

    @torch.no_grad()
    def eval_loss(self, batches: Sequence[Batch],
                  autocast: contextlib.AbstractContextManager[None]) -> torch.Tensor:
        """Mean loss over ``batches`` (local) in eval mode."""
        self.model.eval()
        with autocast:
            losses = [self.loss(inputs, targets) for inputs, targets in batches]
        self.model.train()
        return torch.stack(losses).mean()

    def norm_grads(self) -> list[torch.Tensor]:
        """The gradients whose norm is the model's: each parameter counted once."""
        return [p.grad for p in self.model.parameters() if p.grad is not None]

    def norm_group(self) -> dist.ProcessGroup | None:
        """Ranks holding disjoint parts of the model whose squared norms add up (None: none)."""
        return None

    def clip_grad_norm(self, max_norm: float) -> float:
        """Global gradient norm before clipping to ``max_norm`` (0: measure only).

        Gradients may be local tensors or DTensors sharded over any mesh: each group of equal
        placement is reduced to a full norm once, then summed over :meth:`norm_group`, so the
        result is the norm of the whole unsharded gradient on every rank.
        """
        groups: dict[Any, list[torch.Tensor]] = {}
        for grad in self.norm_grads():
            key = (grad.device_mesh, grad.placements) if isinstance(grad, DTensor) else None
            groups.setdefault(key, []).append(grad)
        squares = torch.zeros((), dtype=torch.float32)
        for grads in groups.values():
            norm = nn.utils.get_total_norm(grads, foreach=True)
            if isinstance(norm, DTensor):
                norm = norm.full_tensor()
            squares = squares.to(norm.device) + norm.float() ** 2
        if self.norm_group() is not None:
            dist.all_reduce(squares, group=self.norm_group())
        total = squares.sqrt().item()
        if max_norm and total > max_norm:
            scale = max_norm / (total + 1e-6)
            for param in self.model.parameters():
                if param.grad is not None:
                    param.grad.mul_(scale)
        return total

    def mean_over_replicas(self, value: torch.Tensor) -> float:
        """``value`` averaged over the data-parallel replicas."""
        if self.dp_size > 1:
            value = value.clone()
            dist.all_reduce(value, group=self.dp_group)
            value /= self.dp_size
        return value.item()


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


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """LR multiplier after ``step`` optimizer steps: linear warm-up, then cosine decay."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


# Called on every rank after each step with (step, metrics, the checkpoint that step wrote or
# None); a launcher's metrics sink, e.g. ray.train.report. Every rank calls it equally often.
StepHook = Callable[[int, dict[str, float], Path | None], None]


def train(cfg: TrainConfig, env: DistEnv, strategy: Strategy,
          on_step: StepHook | None = None) -> dict[str, Any]:
    """Run ``cfg.steps`` optimizer steps (resuming if asked); return the summary (all ranks).

    ``on_step`` (optional) receives every step's metrics on every rank after the step and its
    checkpoint, if any, are done, with the committed checkpoint directory at checkpoint steps.
    """
    run_dir = Path(cfg.output_dir)
    model_cfg = MODEL_SIZES[cfg.model]
    train_set, val_set = build_datasets(cfg, model_cfg.vocab_size)
    micro = cfg.micro_batch(strategy.dp_size)
    stream = BatchStream(train_set, micro, strategy.dp_rank, strategy.dp_size, cfg.seed,
                         cfg.num_workers, cfg.prefetch_factor, env.device.type == "cuda")
    val = (eval_batches(val_set, micro, strategy.dp_rank, strategy.dp_size, cfg.eval_batches)
           if cfg.eval_every else [])
    optimizer = build_optimizer(strategy.model, cfg)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, cfg))
    kill_at = kill_point()
    checkpointer = Checkpointer(run_dir, cfg.keep_checkpoints, env, cfg.model, kill_at)
    loop_state: dict[str, Any] = {"step": 0, "data": stream.state_dict(),
                                  "scheduler": scheduler.state_dict()}
    torch.manual_seed(cfg.seed + env.rank)  # each rank its own dropout stream
    resume_from = checkpointer.choose(cfg.resume)
    if resume_from is not None:
        checkpointer.load(resume_from, strategy.model, optimizer, loop_state)
        stream.load_state_dict(loop_state["data"])
        scheduler.load_state_dict(loop_state["scheduler"])
    start_step = loop_state["step"]

    writer = MetricsWriter(run_dir, env.is_main, cfg.tensorboard, start_step)
    if resume_from is not None:
        writer.print(f"resumed from {resume_from} at step {start_step}")
    compute_dtype = torch.bfloat16 if cfg.dtype == "bf16" else torch.float32
    peak_flops = (cfg.peak_tflops * 1e12 or measure_peak_flops(env.device, compute_dtype))
    # MFU = tokens/s x model FLOPs per token / (peak FLOP/s per device x devices)
    mfu_per_token_per_s = model_cfg.flops_per_token(cfg.seq_len) / (peak_flops * env.world_size)
    tokens_per_step = cfg.batch_size * cfg.seq_len
    autocast = strategy.autocast(cfg.dtype, env.device)
    history: list[dict[str, float]] = []
    wall_start = time.perf_counter()
    for step in range(start_step + 1, cfg.steps + 1):
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
        lr = scheduler.get_last_lr()[0]
        optimizer.step()
        scheduler.step()
        metrics = {"loss": strategy.mean_over_replicas(loss), "grad_norm": grad_norm, "lr": lr}
        elapsed = time.perf_counter() - step_start
        metrics.update(
            step_time_s=elapsed, tokens_per_s=tokens_per_step / elapsed,
            mfu=tokens_per_step / elapsed * mfu_per_token_per_s,
            peak_memory_bytes=float(peak_memory_bytes(env.device)), data_share=data_time / elapsed)
        if val and (step % cfg.eval_every == 0 or step == cfg.steps):
            metrics["eval_loss"] = strategy.mean_over_replicas(strategy.eval_loss(val, autocast))
        history.append(metrics)
        writer.write(step, metrics)
        if step % cfg.log_every == 0 or step in (start_step + 1, cfg.steps):
            writer.print(format_line(step, cfg.steps, metrics))
        maybe_kill(kill_at, "step", env.rank, step, run_dir)
        saved = None
        if step == cfg.steps or (cfg.checkpoint_every and step % cfg.checkpoint_every == 0):
            loop_state.update(step=step, data=stream.state_dict(),
                              scheduler=scheduler.state_dict())
            saved = checkpointer.save(step, strategy.model, optimizer, loop_state)
        if on_step is not None:
            on_step(step, metrics, saved)
    writer.close()
    summary = _summarize(cfg, env, history, start_step, time.perf_counter() - wall_start,
                         train_set, mfu_per_token_per_s)
    summary.update(restarts=restart_count(), steps_lost=writer.steps_redone)
    if env.is_main and history:
        write_summary(run_dir, summary)
        writer.print("summary: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else
                                             f"{k}={v}" for k, v in summary.items()))
    return summary


def _summarize(cfg: TrainConfig, env: DistEnv, history: list[dict[str, float]],
               start_step: int, wall_time: float, train_set: Any,
               mfu_per_token_per_s: float) -> dict[str, Any]:
    """Final figures; throughput and MFU from the mean step time after 3 warm-up steps."""
    if not history:
        return {"steps": start_step, "note": "already complete"}
    timed = history[3:] or history
    step_time = sum(m["step_time_s"] for m in timed) / len(timed)
    tokens_per_s = cfg.batch_size * cfg.seq_len / step_time
    summary: dict[str, Any] = {
        "model": cfg.model, "params": MODEL_SIZES[cfg.model].num_params(),
        "world_size": env.world_size,
        "steps": cfg.steps, "resumed_from_step": start_step,
        "first_loss": history[0]["loss"], "final_loss": history[-1]["loss"],
        "tokens_per_s": tokens_per_s,
        "mfu": tokens_per_s * mfu_per_token_per_s,
        "peak_memory_bytes": int(max(m["peak_memory_bytes"] for m in history)),
        "data_share": sum(m["data_share"] for m in timed) / len(timed),
        "wall_time_s": wall_time,
    }
    evals = [m["eval_loss"] for m in history if "eval_loss" in m]
    if evals:
        summary["final_eval_loss"] = evals[-1]
    if isinstance(train_set, MarkovChainDataset):
        summary["loss_floor"] = train_set.entropy_rate()
    return summary
