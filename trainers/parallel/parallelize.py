"""One way to parallelize a model or a pipeline stage: tensor parallel, block options, FSDP2.

The fsdp, tensor_parallel and pipeline trainers all build their model (or each of their
stages) with :func:`parallelize`, so a stage of a 3-D run is parallelized exactly as the
2-D trainer parallelizes a whole model.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from trainers.models import ModelSpec, materialize
from trainers.options.train_config import TrainConfig
from trainers.parallel.compile import apply_block_options
from trainers.parallel.fsdp import apply_fsdp
from trainers.parallel.tensor_parallel import apply_tensor_parallel


def parallelize(model: nn.Module, spec: ModelSpec, cfg: TrainConfig, device: torch.device,
                tp_mesh: DeviceMesh | None = None, dp_mesh: DeviceMesh | None = None) -> None:
    """Parallelize ``model`` (on the meta device) in place and allocate what this rank holds.

    In torchtitan's order: tensor parallelism over ``tp_mesh`` (None: none) with the spec's
    plan and ``--sequence-parallel``; ``--compile`` and ``--activation-checkpointing`` per
    block; FSDP2 over ``dp_mesh`` (None: none) with ``--reshard-after-forward`` (ZeRO-3 or
    ZeRO-2), ``--dtype bf16`` as its mixed-precision policy and ``--cpu-offload``; then the
    weights are materialized on ``device``, or in CPU memory when FSDP offloads them.
    """
    if tp_mesh is not None:
        apply_tensor_parallel(model, spec, tp_mesh, cfg.sequence_parallel)
    apply_block_options(model, spec, cfg)
    offload = dp_mesh is not None and cfg.cpu_offload
    if dp_mesh is not None:
        apply_fsdp(model, spec, dp_mesh, cfg.reshard_after_forward, cfg.dtype == "bf16",
                   cfg.cpu_offload)
    # Offloaded shards live in CPU memory, where FSDP's CPUOffloadPolicy expects them.
    materialize(model, torch.device("cpu") if offload else device, cfg.seed, spec)
