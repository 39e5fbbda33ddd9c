"""Naive model parallelism: one process spreads the blocks over several devices."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from trainers.core.model import Transformer
from trainers.spec.errors import ConfigError


class SpreadTransformer(nn.Module):
    """``model`` (on the meta device) with its blocks allocated on ``devices``; same
    parameters, names and outputs. The parameters are allocated, not yet initialized
    (:func:`trainers.core.materialize.materialize` with no device fills them in place)."""

    def __init__(self, model: Transformer, devices: Sequence[torch.device]) -> None:
        super().__init__()
        per_device = -(-len(model.blocks) // len(devices))  # ceil
        self.placement = [devices[index // per_device] for index in range(len(model.blocks))]
        for block, device in zip(model.blocks.values(), self.placement, strict=True):
            block.to_empty(device=device)
        # The head shares the embedding's weight (materialize ties them), so it runs where
        # the embedding lives.
        self.input_device = self.head_device = devices[0]
        model.tok_emb.to_empty(device=devices[0])
        model.pos_emb.to_empty(device=devices[0])
        model.norm.to_empty(device=self.placement[-1])
        self.model = model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.model.embed(tokens.to(self.input_device))
        for block, device in zip(self.model.blocks.values(), self.placement, strict=True):
            x = block(x.to(device))
        return self.model.head(self.model.norm(x).to(self.head_device))


def parse_devices(spec: str) -> list[torch.device]:
    """``cpu,cpu`` or ``cuda:0,cuda:1`` (every device must exist here); ``auto``: every
    visible GPU, or two CPU places without one."""
    if spec == "auto":
        count = torch.cuda.device_count()
        spec = ",".join(f"cuda:{i}" for i in range(count)) if count else "cpu,cpu"
    devices = []
    for name in spec.split(","):
        device = torch.device(name)
        if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
            raise ConfigError(f"--devices {spec}: {name} does not exist here "
                              f"({torch.cuda.device_count()} GPUs visible)")
        devices.append(device)
    return devices
