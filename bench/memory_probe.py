"""Measured memory anatomy of a real training step, to hold the formulas of
:mod:`trainers.memory` to.

Parameters, gradients and optimizer state are counted from the live tensors (local shards of
DTensors; each storage once, at its full size, so DDP's gradient buckets and FSDP's padded
shards count as allocated). Activations are what ``torch.distributed._tools.mem_tracker``
sees alive at the end of forward (loss included) that was not alive before it; gathered
parameters, the parameter bytes alive then beyond the parameters at rest. The step's peak is
the CUDA caching allocator's ``max_memory_allocated`` on GPUs and the tracker's peak of live
storage on the CPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker, _ModState
from torch.distributed.tensor import DTensor

from trainers.spec.memory import Anatomy


def storage_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (DTensors: their local shards)."""
    seen: dict[int, int] = {}
    for tensor in tensors:
        if tensor is None:
            continue
        if isinstance(tensor, DTensor):
            tensor = tensor.to_local()
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


class _StepLoss(nn.Module):
    """Forward and loss as one module, so the tracker can snapshot around both."""

    def __init__(self, model: nn.Module, autocast: contextlib.AbstractContextManager) -> None:
        super().__init__()
        self.model = model
        self.autocast = autocast

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        with self.autocast:
            logits = self.model(inputs)
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def measure_step(model: nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor,
                 targets: torch.Tensor,
                 autocast: contextlib.AbstractContextManager | None = None) -> Anatomy:
    """Run one training step and return what it held.

    Call it after two steps: the optimizer state exists after the first, and DDP rebuilds its
    gradient buckets in the second forward.
    """
    step = _StepLoss(model, autocast or contextlib.nullcontext())
    device = inputs.device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    tracker = MemTracker()
    tracker.track_external(step, optimizer)
    with tracker:
        loss = step(inputs, targets)
        loss.backward()
        grads = storage_bytes(p.grad for p in model.parameters())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    snapshots = tracker.memory_tracking[step].snapshots
    peak = (torch.cuda.max_memory_allocated(device) if device.type == "cuda"
            else tracker.get_tracker_snapshot("peak")[device]["Total"])
    before, after = (snapshots[state][-1][device] for state in (_ModState.PRE_FW,
                                                                  _ModState.POST_FW))
    params = storage_bytes(model.parameters())
    optimizer_state = storage_bytes(t for state in optimizer.state.values()
                                    for t in state.values() if isinstance(t, torch.Tensor))
    return Anatomy(params, grads, optimizer_state,
                   after["Activation"] - before["Activation"],
                   max(0, after["Parameter"] - before["Parameter"]), peak)
