"""Under torchrun on 8 ranks: the measured anatomy of 3-D pipeline stages next to the formulas.

``python -m torch.distributed.run --nproc_per_node 8 -m tests.support.workers.pipeline_memory
MODEL SHARDING:DTYPE ...`` (sharding ddp, zero2 or zero3; dtype fp32 or bf16) builds each
rank's stage as ``trainers.pipeline`` does, on a (pp 2, dp 2, tp 2) mesh: split into 2 stages,
tensor parallel over tp and, under zero2/zero3, FSDP2 over dp (under ddp the two dp replicas
are independent pipelines of dp 1), with activation checkpointing. Each rank measures one
micro-batch's forward and backward through its stage alone (the schedule only decides how many
micro-batches are in flight), the smallest of three steps, and rank 0 prints one JSON line
per case and rank: {"case", "rank", "stage": "first"|"last", "measured": {...},
"predicted": {...}}.
"""

from __future__ import annotations

import dataclasses
import json
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from bench.memory_probe import measure_step
from trainers.config.parsing import parse_config
from trainers.core.distributed import leave_process_group
from trainers.core.loop import build_optimizer
from trainers.models import resolve_spec
from trainers.parallel.parallelize import parallelize
from trainers.parallel.pipeline import split_stage
from trainers.sizing.memory_formulas import Layout, activation_bytes, precision, predict

PP, DP, TP = 2, 2, 2
BATCH, SEQ = 4, 64  # one micro-batch; a short sequence keeps it fast


class MeasuredStage(nn.Module):
    """A stage as ``measure_step`` drives a whole model (tokens or hidden states in, logits
    out): the first stage's output summed to one logit per token (its gradient reaches every
    element and the sum holds nothing), the last stage's input copied inside the step, as the
    pipeline allocates the activation it receives."""

    def __init__(self, part: nn.Module, first: bool) -> None:
        super().__init__()
        self.part, self.first = part, first

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            return self.part(x).sum(-1, keepdim=True)
        return self.part(x.clone())


def measure_case(name: str, sharding: str, dtype: str) -> dict:
    rank = dist.get_rank()
    spec = resolve_spec(name)
    shape = spec.shape
    reshard = "false" if sharding == "zero2" else "true"
    cfg = parse_config(["--model", name, "--pp", str(PP), "--tp", str(TP), "--dtype", dtype,
                        "--reshard-after-forward", reshard, "--activation-checkpointing",
                        "--microbatches", str(PP), "--batch-size", str(BATCH * PP * DP)],
                       "pipeline", world_sizes=[PP * DP * TP], check_paths=False)
    mesh = init_device_mesh("cpu", (PP, DP, TP), mesh_dim_names=("pp", "dp", "tp"))
    stage = mesh["pp"].get_local_rank()
    torch.manual_seed(0)
    part = split_stage(spec.meta_model(), spec, stage, PP)
    parallelize(part, spec, cfg, torch.device("cpu"), tp_mesh=mesh["tp"],
                dp_mesh=None if sharding == "ddp" else mesh["dp"])
    model = MeasuredStage(part, first=stage == 0)
    optimizer = build_optimizer(model, cfg)
    generator = torch.Generator().manual_seed(mesh["dp"].get_local_rank())
    inputs = (torch.randint(0, shape.vocab_size, (BATCH, SEQ), generator=generator)
              if stage == 0 else torch.randn(BATCH, SEQ, shape.d_model, generator=generator))
    targets = torch.randint(0, 1 if stage == 0 else shape.vocab_size, (BATCH, SEQ),
                            generator=generator)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16,
                              enabled=dtype == "bf16" and sharding == "ddp")
    measure_step(model, optimizer, inputs, targets, autocast)  # makes the optimizer state
    # The smallest of three steps, category by category: now and then a collective's buffer
    # (the size of a stage's output) is still alive at the end of forward on one rank.
    steps = [dataclasses.asdict(measure_step(model, optimizer, inputs, targets, autocast))
             for _ in range(3)]
    measured = {category: min(step[category] for step in steps) for category in steps[0]}
    layout = Layout(sharding, dp=1 if sharding == "ddp" else DP, tp=TP, pp=PP)
    predicted = predict(shape, BATCH, SEQ, dtype, True, layout)
    if stage == 0:  # the last stage's anatomy is the heaviest; the first holds no output side
        predicted = dataclasses.replace(predicted, activations=activation_bytes(
            shape, BATCH, SEQ, precision(dtype, layout), True, TP, PP, output_side=False))
    return {"case": f"{sharding} {name} {dtype} pp{PP} dp{layout.dp} tp{TP}", "rank": rank,
            "stage": "first" if stage == 0 else "last",
            "measured": measured, "predicted": dataclasses.asdict(predicted)}


def main() -> None:
    name, cases = sys.argv[1], [case.split(":") for case in sys.argv[2:]]
    dist.init_process_group("gloo")
    for sharding, dtype in cases:
        records = [None] * dist.get_world_size()
        dist.all_gather_object(records, measure_case(name, sharding, dtype))
        if dist.get_rank() == 0:
            print("\n".join(json.dumps(r) for r in records), flush=True)
    dist.barrier()
    leave_process_group()


if __name__ == "__main__":
    main()
