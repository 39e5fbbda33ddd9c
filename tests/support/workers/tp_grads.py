"""Under torchrun: a tensor-parallel model's outputs and gradients equal the unsharded model's,
without and with sequence parallel.

For each, every rank builds the same model twice (same seed), shards one with
:func:`trainers.parallel.tensor_parallel.apply_tensor_parallel` over all ranks, runs forward and
backward on the same batch through both and compares the logits and every parameter's full
gradient. Prints ``max relative difference`` per layout and exits 1 if one exceeds 1e-5.
"""

from __future__ import annotations

import copy
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from trainers.core.distributed import leave_process_group
from trainers.models import build_model, resolve_spec
from trainers.parallel.tensor_parallel import apply_tensor_parallel


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()


def check(mesh, sequence_parallel: bool) -> float:
    """The largest relative difference of the logits and full gradients."""
    torch.manual_seed(0)
    reference = build_model("tiny")
    sharded = copy.deepcopy(reference)
    apply_tensor_parallel(sharded, resolve_spec("tiny"), mesh, sequence_parallel)
    tokens, targets = torch.randint(0, 256, (2, 4, 32), generator=torch.Generator().manual_seed(1))
    outputs = []
    for model in (reference, sharded):
        logits = model(tokens)
        F.cross_entropy(logits.flatten(0, 1), targets.flatten()).backward()
        outputs.append(logits.detach())
    worst = relative(outputs[1], outputs[0])
    sharded_params = dict(sharded.named_parameters())
    checked = 0
    for name, param in reference.named_parameters():
        grad = sharded_params[name].grad
        if isinstance(grad, DTensor):
            grad = grad.full_tensor()
        worst = max(worst, relative(grad, param.grad))
        checked += 1
    if dist.get_rank() == 0:
        print(f"sequence parallel {sequence_parallel}: checked logits and {checked} gradients: "
              f"max relative difference {worst:.2e}")
    return worst


def main() -> None:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
    worst = max(check(mesh, sequence_parallel) for sequence_parallel in (False, True))
    leave_process_group()
    sys.exit(0 if worst <= 1e-5 else 1)


if __name__ == "__main__":
    main()
