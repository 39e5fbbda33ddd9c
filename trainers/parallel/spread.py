"""Naive model parallelism: one process spreads the blocks over several devices."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from trainers.errors import ConfigError
from trainers.models import ModelSpec


def _move_inputs(device: torch.device) -> Callable:
    """A forward pre-hook (``with_kwargs``) that moves a module's tensor arguments, positional
    and keyword (packed samples' positions), to ``device``."""
    def move(value: object) -> object:
        return value.to(device) if isinstance(value, torch.Tensor) else value

    def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return tuple(map(move, args)), {key: move(v) for key, v in kwargs.items()}
    return hook


def spread_over(model: nn.Module, spec: ModelSpec, devices: Sequence[torch.device]) -> None:
    """Allocate ``model`` (on the meta device) in place with its blocks on ``devices`` in
    contiguous groups, its ``first`` modules on the first device and its ``last`` ones with the
    last block, except a module holding a weight shared with one elsewhere (a tied head), which
    runs where that weight lives. Each placed module moves its inputs to its device, and the
    model returns its logits on the first device. The model keeps its own parameter names (so a
    checkpoint's keys are those of every other trainer); the parameters are allocated, not yet
    initialized (:func:`trainers.models.materialize` with no device fills them in
    place)."""
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
        _place(block, placement[id(block)])
    for name, device in places.items():
        _place(model.get_submodule(name), device)
    model.register_forward_pre_hook(_move_inputs(devices[0]), with_kwargs=True)
    model.register_forward_hook(lambda module, args, out: out.to(devices[0]))


def _place(module: nn.Module, device: torch.device) -> None:
    module.to_empty(device=device)
    module.register_forward_pre_hook(_move_inputs(device), with_kwargs=True)


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
