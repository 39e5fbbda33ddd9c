"""Naive model parallelism: one process spreads the blocks over several devices."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from trainers.core.model_spec import ModelSpec
from trainers.spec.errors import ConfigError


def _move_inputs(device: torch.device) -> Callable:
    """A forward pre-hook that moves a module's tensor arguments to ``device``."""
    def hook(module: nn.Module, args: tuple) -> tuple:
        return tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)
    return hook


class SpreadModel(nn.Module):
    """``model`` (on the meta device) with its blocks allocated on ``devices`` in contiguous
    groups, its ``first`` modules on the first device and its ``last`` ones with the last
    block, except a module holding a weight shared with one elsewhere (a tied head), which
    runs where that weight lives. Same parameters, names and outputs (logits on the first
    device). The parameters are allocated, not yet initialized
    (:func:`trainers.core.materialize.materialize` with no device fills them in place)."""

    def __init__(self, model: nn.Module, spec: ModelSpec, devices: Sequence[torch.device]
                 ) -> None:
        super().__init__()
        blocks = [block for _, block in spec.named_blocks(model)]
        per_device = -(-len(blocks) // len(devices))  # ceil
        placement = {id(b): devices[i // per_device] for i, b in enumerate(blocks)}
        owners = {alias.rpartition(".")[0]: target.rpartition(".")[0]
                  for alias, target in spec.shared_parameters.items()}
        places = {name: devices[0] for name in spec.first}
        places.update({name: placement[id(blocks[-1])] for name in spec.last})
        for name in spec.last:
            if name in owners:
                places[name] = places.get(owners[name], devices[0])
        for block in blocks:
            self._place(block, placement[id(block)])
        for name, device in places.items():
            self._place(model.get_submodule(name), device)
        self.input_device = devices[0]
        self.model = model

    @staticmethod
    def _place(module: nn.Module, device: torch.device) -> None:
        module.to_empty(device=device)
        module.register_forward_pre_hook(_move_inputs(device))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(tokens.to(self.input_device)).to(self.input_device)


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
