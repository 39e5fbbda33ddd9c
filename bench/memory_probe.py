"""The measured memory of a real training step and its tensors (docs/memory.md).

Each distinct storage counts once, at its full size (a DTensor by its local shard), so DDP's
gradient buckets and FSDP's padded shards count as allocated.
"""

import contextlib
from collections import OrderedDict
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.tensor import DTensor
from torch.utils.hooks import RemovableHandle

from trainers.sizing.memory_formulas import Anatomy


class Tally:
    """Bytes of a set of tensors (DTensors: their local shards): logical (elements x element
    size of each tensor) and storage (each distinct storage once, at its full size)."""

    def __init__(self, tensors: Iterable[torch.Tensor | None] = ()) -> None:
        local = [t.to_local() if isinstance(t, DTensor) else t for t in tensors if t is not None]
        self.tensors, self.numel = len(local), sum(t.numel() for t in local)
        self.logical = sum(t.numel() * t.element_size() for t in local)
        self.storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                         for t in local}
        self.storage = sum(self.storages.values())

    def as_dict(self) -> dict[str, int]:
        return {"storage_bytes": self.storage, "logical_bytes": self.logical,
                "numel": self.numel, "tensors": self.tensors, "storages": len(self.storages)}


def union(*tallies: Tally) -> int:
    """Storage bytes of several tallies together, a storage they share once."""
    return sum({ptr: size for t in tallies for ptr, size in t.storages.items()}.values())


class FrozenAwareTracker(MemTracker):
    """torch's ``MemTracker``, which also works on a model with frozen parameters (LoRA's
    base): it registers a gradient hook on every parameter a module's forward reads (under
    FSDP the unsharded ones of that moment), which raises for one that does not require
    gradients; this one gives such a parameter handles that remove nothing, so it is skipped."""

    def _track_module_params_and_buffers(self, module: nn.Module,
                                         install_grad_hooks: bool = True) -> tuple[int, int]:
        none = RemovableHandle(OrderedDict())
        for param in module.parameters():
            if not param.requires_grad:
                self._param_to_grad_hook_handles.setdefault(param, (none, none))
        return super()._track_module_params_and_buffers(module, install_grad_hooks)


def measure_step(model: nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor,
                 targets: torch.Tensor,
                 autocast: contextlib.AbstractContextManager | None = None) -> Anatomy:
    """Run one training step and return what it held: parameters, gradients and optimizer
    state by storage; activations, what ``MemTracker`` sees alive after forward and loss that
    was not before them; gathered parameters, the parameter bytes alive then beyond those at
    rest; the peak, CUDA's ``max_memory_allocated`` or the tracker's peak on the CPU. Call it
    after two steps: the optimizer state exists after the first, and DDP rebuilds its gradient
    buckets in the second forward."""
    device = inputs.device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    tracker = FrozenAwareTracker()
    tracker.track_external(model, optimizer)
    with tracker:
        before = tracker.get_tracker_snapshot()[device]
        with autocast or contextlib.nullcontext():
            logits = model(inputs)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        del logits  # freed as a module's forward would free it
        after = tracker.get_tracker_snapshot()[device]
        loss.backward()
        grads = Tally(p.grad for p in model.parameters()).storage
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    peak = (torch.cuda.max_memory_allocated(device) if device.type == "cuda"
            else tracker.get_tracker_snapshot("peak")[device]["Total"])
    optimizer_state = Tally(t for state in optimizer.state.values()
                            for t in state.values() if isinstance(t, torch.Tensor)).storage
    return Anatomy(Tally(model.parameters()).storage, grads, optimizer_state,
                   after["Activation"] - before["Activation"],
                   max(0, after["Parameter"] - before["Parameter"]), peak)
