"""The :class:`Strategy` contract the one training loop runs on.

A strategy (DDP, FSDP, ...; their classes are in :mod:`trainers.parallel`) wraps the model and
overrides only what differs: how gradient sync is suppressed on non-final micro-steps, how a
step's forward and backward run, how the gradient norm is taken. The loop
(:mod:`trainers.core.loop`) owns the rest. What the loop calls every step stays on the device:
only the one-off :meth:`Strategy.clip_grad_norm` and :meth:`Strategy.mean_over_replicas` read
a tensor to the host.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.tensor import DTensor

from trainers.core.data import Batch
from trainers.core.loss import counted_tokens, cross_entropy
from trainers.runs.storage import RunPath


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

    def attach_run(self, run_dir: RunPath) -> None:
        """Where the run writes, given once before its first step; a strategy that writes
        records of its own keeps it (the pipeline's timeline). The default writes nothing."""

    def share_state(self, state: dict[str, Stateful]) -> None:
        """The run's state (what its checkpoints hold), given once before it resumes; a
        strategy that hands it to peers keeps it (replica groups healing each other). The
        default keeps nothing."""

    def begin_step(self, step: int) -> int:
        """Before the step that follows ``step - 1``: the step to take now. Plain strategies
        take ``step``; replica groups agree on a quorum first and a group that was behind
        continues at the live groups' step (:mod:`trainers.parallel.fault_tolerant`)."""
        return step

    def commit(self) -> bool:
        """After a step's backward: whether its optimizer step applies (else the step is taken
        again). Always, but where replica groups may have lost a peer during the step."""
        return True

    def close(self) -> None:
        """Release what the strategy started beside the model (the end of the run)."""

    def no_sync(self) -> contextlib.AbstractContextManager[None]:
        """Context in which backward does not synchronise gradients across replicas."""
        return contextlib.nullcontext()

    def autocast(self, dtype: str, device: torch.device) -> contextlib.AbstractContextManager:
        """The compute-dtype context of forward passes: bf16 autocast when asked for."""
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == "bf16")

    def loss(self, batch: Batch, normalizer: torch.Tensor) -> torch.Tensor:
        """Summed next-token cross-entropy of one micro-batch's counted targets over
        ``normalizer`` (:func:`trainers.core.loss.cross_entropy`); packed samples' positions
        go to the model."""
        inputs, targets, *positions = batch
        return cross_entropy(self.model(inputs, *positions), targets, normalizer)

    def normalizer(self, batches: Sequence[Batch]) -> torch.Tensor:
        """The counted targets of ``batches`` summed over the data-parallel replicas, per
        replica: each replica dividing its loss sums by it, the replicas' mean (DDP's and
        FSDP's gradient average) is the mean over every counted token of the global batch,
        however prompts and padding fall on micro-batches and ranks."""
        count = sum(counted_tokens(batch[1]) for batch in batches).to(batches[0][0].device)
        if self.dp_size > 1:
            dist.all_reduce(count, group=self.dp_group)
        return count.clamp_min(1) / self.dp_size

    def forward_backward(self, micro_batches: Sequence[Batch],
                         autocast: contextlib.AbstractContextManager[None]) -> torch.Tensor:
        """Accumulate gradients of the step's loss (:meth:`normalizer`); return this replica's
        share of it (local, detached: :meth:`mean_over_replicas` of it is the step's loss).
        Gradients synchronise only on the last micro-batch."""
        normalizer = self.normalizer(micro_batches)
        total = torch.zeros((), device=micro_batches[0][0].device)
        count = len(micro_batches)
        for index, batch in enumerate(micro_batches):
            sync = contextlib.nullcontext() if index == count - 1 else self.no_sync()
            with sync:
                with autocast:
                    loss = self.loss(batch, normalizer)
                loss.backward()
            total += loss.detach()
        return total

    @torch.no_grad()
    def eval_loss(self, batches: Sequence[Batch],
                  autocast: contextlib.AbstractContextManager[None]) -> torch.Tensor:
        """This replica's share of the loss over ``batches`` in eval mode (as
        :meth:`forward_backward`'s)."""
        normalizer = self.normalizer(batches)
        self.model.eval()
        with autocast:
            losses = [self.loss(batch, normalizer) for batch in batches]
        self.model.train()
        return torch.stack(losses).sum()

    def norm_grads(self) -> list[torch.Tensor]:
        """The gradients whose norm is the model's: each parameter counted once."""
        return [p.grad for p in self.model.parameters() if p.grad is not None]

    def norm_group(self) -> dist.ProcessGroup | None:
        """Ranks holding disjoint parts of the model whose squared norms add up (None: none)."""
        return None

    def clip_grads(self, max_norm: float) -> torch.Tensor:
        """Clip the gradients to global norm ``max_norm`` (0: measure only) on the device; return
        the norm before clipping, a 0-dim fp32 tensor on the device (no host read: the loop
        reads it with the step's loss at its next flush).

        Gradients may be local tensors or DTensors sharded over any mesh: each group of equal
        placement is reduced to a full norm once, then summed over :meth:`norm_group`, so the
        norm is the whole unsharded gradient's on every rank. The gradients are scaled by
        ``max_norm / (norm + 1e-6)`` only where the norm exceeds ``max_norm`` (else by 1), the
        rule of the host comparison this replaced: a NaN norm leaves them as they are, an
        infinite one scales them by 0.
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
        total = squares.sqrt()
        if max_norm:
            # in float64 where the device has it, as the host did with the norm it read
            wide = total.double() if total.device.type != "mps" else total
            scale = torch.where(wide > max_norm, max_norm / (wide + 1e-6),
                                torch.ones_like(wide)).float()
            by_kind: dict[Any, list[torch.Tensor]] = {}
            for param in self.model.parameters():
                if param.grad is not None:
                    grad = param.grad
                    key = ((grad.device_mesh, grad.placements) if isinstance(grad, DTensor)
                           else None, grad.device, grad.dtype)
                    by_kind.setdefault(key, []).append(grad)
            for (_, device, _), grads in by_kind.items():
                torch._foreach_mul_(grads, scale.to(device))
        return total

    def clip_grad_norm(self, max_norm: float) -> float:
        """:meth:`clip_grads`, the norm read to the host (a device sync: for one-off callers;
        the loop keeps the tensor)."""
        return self.clip_grads(max_norm).item()

    def means_over_replicas(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` (any shape) averaged over the data-parallel replicas in one all-reduce,
        on the device (no host read)."""
        if self.dp_size > 1:
            values = values.clone()
            dist.all_reduce(values, group=self.dp_group)
            values /= self.dp_size
        return values

    def mean_over_replicas(self, value: torch.Tensor) -> float:
        """``value`` averaged over the data-parallel replicas, read to the host (a device
        sync: for one-off callers; the loop reduces a flush's values together)."""
        return self.means_over_replicas(value).item()
