"""Your own model as a model spec: a causal convolutional language model.

Train it with any data-parallel or pipeline trainer by naming the spec, from the repository
root (or anywhere this module is importable)::

    python -m trainers.ddp --model examples.custom_model.conv_lm:SPEC --steps 100
    torchx run components/fsdp.py:fsdp -j 1x2 -- --model examples.custom_model.conv_lm:SPEC

Nothing here is a transformer, and nothing in the trainers knows this model: the spec tells
them how to build it on the meta device, where its repeated blocks are (FSDP units,
activation checkpointing, pipeline stages), how to initialize each parameter, and which
modules belong to the first and the last pipeline stage. It has no tensor-parallel plan, so
``--tp 2`` is refused in one line.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trainers.models import ModelSpec, normal_init
from trainers.sizing.shapes import ModelConfig


class Block(nn.Module):
    """Pre-norm residual block: a depthwise causal convolution over ``kernel`` positions, then
    a gated linear unit."""

    def __init__(self, width: int, kernel: int) -> None:
        super().__init__()
        self.kernel = kernel
        self.norm = nn.RMSNorm(width)
        self.mix = nn.Conv1d(width, width, kernel, groups=width)
        self.gate = nn.Linear(width, 2 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x).transpose(1, 2)  # (batch, width, seq)
        h = self.mix(F.pad(h, (self.kernel - 1, 0))).transpose(1, 2)  # sees only the past
        value, gate = self.gate(h).chunk(2, dim=-1)
        return x + self.out(value * torch.sigmoid(gate))


class ConvLM(nn.Module):
    """Token ids -> logits. A pipeline stage sets ``embed`` or ``norm``/``head`` to None and
    then takes or returns hidden states."""

    def __init__(self, shape: ModelConfig, kernel: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(shape.vocab_size, shape.d_model)
        self.blocks = nn.ModuleDict({str(i): Block(shape.d_model, kernel)
                                     for i in range(shape.n_layers)})
        self.norm = nn.RMSNorm(shape.d_model)
        self.head = nn.Linear(shape.d_model, shape.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for block in self.blocks.values():
            x = block(x)
        return x if self.head is None else self.head(self.norm(x))


# The shape facts the planner and MFU read; params is counted from the model when left 0.
SHAPE = ModelConfig(vocab_size=256, n_layers=4, n_heads=1, d_model=64, max_seq_len=64,
                    family="conv")
SPEC = ModelSpec(shape=SHAPE, build=lambda: ConvLM(SHAPE), init_parameter=normal_init(0.02),
                 first=("embed",), last=("norm", "head"))
