"""Under torchrun: the measured anatomy of DDP or FSDP steps next to the prediction.

``python -m torch.distributed.run --nproc_per_node 2 -m tests.support.workers.memory_anatomy
MODEL SHARDING:DTYPE:CHECKPOINTING[:LORA_RANK] ...`` (sharding ddp, zero2 or zero3; dtype fp32
or bf16; checkpointing 0 or 1; a LoRA rank > 0: the model the trainers build for
``--lora-rank``, its default targets) measures one step of each case, and rank 0 prints one
JSON line per case and rank: {"case": ..., "measured": {...}, "predicted": {...}}. bf16 is
autocast under DDP and FSDP's bf16 policy under zero2/zero3, as in the trainers.
"""

from __future__ import annotations

import dataclasses
import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from bench.memory_probe import measure_step
from trainers.config.parsing import parse_config
from trainers.core.distributed import DistEnv, leave_process_group
from trainers.core.loop import build_optimizer
from trainers.models import materialize, spec_of
from trainers.parallel.checkpointing import apply_activation_checkpointing
from trainers.parallel.ddp import DDPStrategy
from trainers.parallel.fsdp import apply_fsdp
from trainers.sizing.memory_formulas import Adapters, Layout, predict


def measure_case(sharding: str, name: str, dtype: str, checkpointing: bool,
                 lora_rank: int = 0) -> dict:
    world, rank = dist.get_world_size(), dist.get_rank()
    lora = ["--lora-rank", str(lora_rank)] if lora_rank else []
    cfg = parse_config(["--model", name, "--dtype", dtype, *lora], "ddp", world_sizes=[world],
                       check_paths=False)
    torch.manual_seed(0)
    spec = spec_of(cfg)
    model = spec.meta_model()
    materialize(model, torch.device("cpu"), 0, spec)
    shape = spec.shape
    if checkpointing:
        apply_activation_checkpointing(model, spec)
    if sharding == "ddp":
        model = DDPStrategy(model, DistEnv(rank, world, rank, torch.device("cpu"), "gloo")).model
    else:
        apply_fsdp(model, spec, init_device_mesh("cpu", (world,)), sharding == "zero3",
                   bf16=dtype == "bf16", cpu_offload=False)
    optimizer = build_optimizer(model, cfg)
    batch, seq = 4, 64  # the shapes are the model's; a short sequence keeps it fast
    inputs, targets = torch.randint(0, shape.vocab_size, (2, batch, seq),
                                    generator=torch.Generator().manual_seed(rank))
    for _ in range(3):  # the optimizer state exists after one, DDP's buckets after two
        measured = measure_step(model, optimizer, inputs, targets, torch.autocast(
            "cpu", dtype=torch.bfloat16, enabled=dtype == "bf16" and sharding == "ddp"))
    predicted = predict(shape, batch, seq, dtype, checkpointing, Layout(sharding, dp=world),
                        Adapters(lora_rank) if lora_rank else None)
    return {"case": f"{sharding} {name} {dtype} ac={checkpointing} lora={lora_rank}",
            "rank": rank,
            "measured": dataclasses.asdict(measured), "predicted": dataclasses.asdict(predicted)}


def main() -> None:
    name, cases = sys.argv[1], [case.split(":") for case in sys.argv[2:]]
    dist.init_process_group("gloo")
    for sharding, dtype, checkpointing, *lora in cases:
        records = [None] * dist.get_world_size()
        dist.all_gather_object(records, measure_case(sharding, name, dtype, checkpointing == "1",
                                                     int(lora[0]) if lora else 0))
        if dist.get_rank() == 0:
            print("\n".join(json.dumps(r) for r in records), flush=True)
    dist.barrier()
    leave_process_group()


if __name__ == "__main__":
    main()
