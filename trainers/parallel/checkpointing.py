"""Activation checkpointing: recompute each block's activations in backward."""

from __future__ import annotations

from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    checkpoint_wrapper,
)

from trainers.core.model import Transformer


def apply_activation_checkpointing(model: Transformer) -> None:
    """Recompute each block's activations in backward (non-reentrant checkpointing).

    The wrapper keeps parameter names unchanged in state dicts, so checkpoints written with
    and without it are interchangeable.
    """
    for name, block in list(model.blocks.items()):
        model.blocks[name] = checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
