"""Naive model-parallel trainer: ``python -m trainers.model_parallel --devices cuda:0,cuda:1``.

One process spreads the blocks over a list of devices in contiguous groups (the embeddings
and the tied head on the first device, the final norm with the last block) and moves the
activations across each boundary explicitly in forward; autograd carries the gradients back
through the same copies. Only one device works at a time: this is the baseline that pipeline
parallelism improves on. Under torchrun each process holds such a model and DDP averages the
gradients across processes (one process per node, each with its own devices).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from trainers.config import TrainConfig
from trainers.distributed import DistEnv
from trainers.entry import run
from trainers.errors import ConfigError
from trainers.loop import Strategy, prepare_model
from trainers.model import Transformer
from trainers.parallelize import DDPStrategy, apply_activation_checkpointing

PROG = "trainers.model_parallel"


class SpreadTransformer(nn.Module):
    """``model`` with its blocks placed on ``devices``; same parameters, names and outputs."""

    def __init__(self, model: Transformer, devices: Sequence[torch.device]) -> None:
        super().__init__()
        per_device = -(-len(model.blocks) // len(devices))  # ceil
        self.placement = [devices[index // per_device] for index in range(len(model.blocks))]
        for block, device in zip(model.blocks.values(), self.placement, strict=True):
            block.to(device)
        # The head shares the embedding's weight, so it runs where the embedding lives.
        self.input_device = self.head_device = devices[0]
        model.tok_emb.to(devices[0])
        model.pos_emb.to(devices[0])
        model.norm.to(self.placement[-1])
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


def build(cfg: TrainConfig, env: DistEnv) -> Strategy:
    """The blocks spread over ``--devices`` in this process; DDP across processes."""
    devices = parse_devices(cfg.devices)
    model = prepare_model(cfg, devices[0])
    if cfg.activation_checkpointing:
        apply_activation_checkpointing(model)
    return DDPStrategy(SpreadTransformer(model, devices), env)


def main(argv: Sequence[str] | None = None) -> None:
    run(PROG, build, argv)


if __name__ == "__main__":
    main()
