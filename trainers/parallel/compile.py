"""Per-block ``torch.compile``: each repeated block's forward compiled on its own.

Blocks are identical, so one compiled graph serves them all (parameters are graph inputs),
which keeps compile time to that of one block; the embeddings, the head and the loss stay
eager. Only ``forward`` is compiled, not the module call: hooks that wrappers register on the
block (FSDP's all-gather and reshard) run eagerly around the compiled region, and parameter
names, hence checkpoints, are those of the eager model.
"""

from __future__ import annotations

import torch
from torch import nn

from trainers.models import ModelSpec
from trainers.options.train_config import TrainConfig
from trainers.parallel.checkpointing import apply_activation_checkpointing


def apply_compile(model: nn.Module, spec: ModelSpec) -> None:
    """Replace the forward of each of ``spec``'s blocks by its ``torch.compile``d self
    (``fullgraph``: a graph break in a block is an error, not a silent slowdown).

    Apply after tensor parallelism, before activation checkpointing and FSDP.
    """
    for _, block in spec.named_blocks(model):
        block.forward = torch.compile(block.forward, fullgraph=True)


def apply_block_options(model: nn.Module, spec: ModelSpec, cfg: TrainConfig) -> None:
    """What ``cfg`` asks of every block: compilation (``--compile``), then activation
    checkpointing (``--activation-checkpointing``) around the compiled forward, which backward
    runs again. (Compiling the checkpointed block instead fails under tensor parallelism in
    torch 2.13: AOT autograd refuses the DeviceMesh that DTensor's recomputation saves.)"""
    if cfg.compile:
        apply_compile(model, spec)
    if cfg.activation_checkpointing:
        apply_activation_checkpointing(model, spec)
