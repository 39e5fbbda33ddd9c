"""Under torchrun: the measured anatomy of a DDP or FSDP step next to the prediction.

``python -m torch.distributed.run --nproc_per_node 2 -m tests.workers.memory_anatomy
ddp|zero2|zero3 MODEL`` prints one JSON line per rank: {"measured": {...}, "predicted": {...}}.
"""

from __future__ import annotations

import dataclasses
import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from trainers.config import parse_config
from trainers.distributed import DistEnv
from trainers.loop import build_optimizer
from trainers.memory import Layout, predict
from trainers.memory_probe import measure_step
from trainers.model import build_model
from trainers.parallelize import DDPStrategy, apply_fsdp


def main() -> None:
    strategy, name = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    cfg = parse_config(["--model", name], "trainers.ddp", world_sizes=[world], check_paths=False)
    torch.manual_seed(0)
    model = build_model(name)
    if strategy == "ddp":
        env = DistEnv(rank, world, rank, torch.device("cpu"), "gloo")
        model = DDPStrategy(model, env).model
    else:
        mesh = init_device_mesh("cpu", (world,))
        apply_fsdp(model, mesh, reshard_after_forward=strategy == "zero3", bf16=False,
                   cpu_offload=False)
    optimizer = build_optimizer(model, cfg)
    batch, seq = 4, cfg.seq_len
    inputs, targets = torch.randint(0, 256, (2, batch, seq),
                                    generator=torch.Generator().manual_seed(rank))
    for _ in range(2):
        measure_step(model, optimizer, inputs, targets)
    measured = measure_step(model, optimizer, inputs, targets)
    shape = build_model(name).cfg
    predicted = predict(shape, batch, seq, "fp32", False, Layout(strategy, dp=world))
    print(json.dumps({"rank": rank, "measured": dataclasses.asdict(measured),
                      "predicted": dataclasses.asdict(predicted)}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
