"""Activation checkpointing: recompute each block's activations in backward."""

from __future__ import annotations

from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    checkpoint_wrapper,
)

from trainers.models import ModelSpec


def apply_activation_checkpointing(model: nn.Module, spec: ModelSpec) -> None:
    """Recompute each of ``spec``'s blocks' activations in backward (non-reentrant).

    The wrapper keeps parameter names unchanged in state dicts, so checkpoints written with
    and without it are interchangeable.
    """
    container = spec.block_container(model)
    for name, block in spec.named_blocks(model):
        wrapped = checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
        if isinstance(container, nn.ModuleList):
            container[int(name)] = wrapped
        else:
            container[name] = wrapped
