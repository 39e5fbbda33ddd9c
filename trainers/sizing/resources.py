"""What one node of a job asks its scheduler for, and the GPUs the memory pre-flight knows.

Standard library only: the components and the planner (``python -m trainers.planning.plan``) both
read it, so the commands the planner prints ask for what a component would.

A CPU job's node asks for :data:`CPU_JOB_CPUS` CPUs and :data:`CPU_JOB_MEM_MB` MB (a laptop
default); a GPU job's for :data:`CPUS_PER_GPU` CPUs and :data:`MEM_MB_PER_GPU` MB per GPU,
which fits the common 4- and 8-GPU nodes (e.g. AWS p4d/p5, GCP a2/a3, DGX A100/H100, AWS
g5.12xlarge). ``--cpu`` and ``--memMB`` override either.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from trainers.errors import ConfigError

CPU_JOB_CPUS = 2
CPU_JOB_MEM_MB = 4096
CPUS_PER_GPU = 8
MEM_MB_PER_GPU = 32 * 1024

# Memory of one device in GB as the vendor states it (the pre-flight keeps a margin of it
# free), by the names `--gpu_type` accepts.
GPU_MEMORY_GB: dict[str, float] = {
    "t4": 16, "v100-16gb": 16, "v100-32gb": 32, "a10g": 24, "l4": 24, "l40s": 48,
    "a100-40gb": 40, "a100-80gb": 80, "h100": 80, "h100-nvl": 94, "gh200": 96, "h200": 141,
    "b200": 180, "mi250x": 64, "mi300x": 192,
}


@dataclass(frozen=True)
class GpuPerf:
    """What the step-time projection (:mod:`trainers.sizing.projection`) reads of a GPU.

    ``peak_tflops``: dense bf16 tensor-core TFLOP/s (no sparsity), the vendor's figure.
    ``intra_node_gbps``: GB/s one GPU sends to the others of its node, one direction (NVLink or
    Infinity Fabric). ``inter_node_gbps``: GB/s one GPU sends to other nodes, one direction (its
    share of the node's InfiniBand/RoCE NICs, one NIC per GPU in the systems named). Line rates:
    what a collective achieves of them is the projection's ``link_efficiency``. ``hbm_gbps``:
    GB/s of the device's own memory (HBM), the vendor's figure; the projection prices the work
    that is not matmuls (norms, activations, residual adds, softmax, loss) at it.
    """

    peak_tflops: float
    intra_node_gbps: float
    inter_node_gbps: float
    hbm_gbps: float


# The GPUs whose peak and fabric the projection knows (`trainers.planning.plan --gpu-type`); any
# other GPU takes --peak-tflops, --intra-node-gbps and --inter-node-gbps. Sources:
# - a100-*: NVIDIA A100 datasheet (bf16 312 TFLOP/s dense; NVLink 3 600 GB/s per GPU, both
#   directions; HBM2 1,555 GB/s for the 40GB SXM, HBM2e 2,039 GB/s for the 80GB SXM); DGX
#   A100: 8 x 200 Gb/s HDR InfiniBand for 8 GPUs (25 GB/s per GPU).
# - h100, h200: NVIDIA H100 / H200 SXM datasheets (bf16 1,979 TFLOP/s with sparsity, 989.4
#   dense; NVLink 4 900 GB/s both directions; HBM3 3.35 TB/s, H200's HBM3e 4.8 TB/s); DGX
#   H100/H200: 8 x 400 Gb/s ConnectX-7 for 8 GPUs (50 GB/s per GPU).
# - b200: NVIDIA DGX B200 datasheet (72 PFLOP/s FP8 training with sparsity on 8 GPUs: 2.25
#   PFLOP/s dense bf16 per GPU; NVLink 5 1.8 TB/s both directions; 64 TB/s HBM3e on 8 GPUs:
#   8 TB/s each; 8 x 400 Gb/s ConnectX-7).
# - mi300x: AMD Instinct MI300X datasheet (bf16 1,307.4 TFLOP/s dense; 896 GB/s Infinity Fabric
#   peer bandwidth both directions; HBM3 5.3 TB/s); 400 Gb/s NIC per GPU as in the 8-GPU
#   platforms.
GPU_PERF: dict[str, GpuPerf] = {
    "a100-40gb": GpuPerf(312.0, 300.0, 25.0, 1555.0),
    "a100-80gb": GpuPerf(312.0, 300.0, 25.0, 2039.0),
    "h100": GpuPerf(989.4, 450.0, 50.0, 3350.0),
    "h200": GpuPerf(989.4, 450.0, 50.0, 4800.0),
    "b200": GpuPerf(2250.0, 900.0, 50.0, 8000.0),
    "mi300x": GpuPerf(1307.4, 448.0, 50.0, 5300.0),
}


def gpu_perf(gpu_type: str) -> GpuPerf:
    """The peak and fabric of ``gpu_type``; ConfigError naming the known types and the flags
    that stand in for the table."""
    try:
        return GPU_PERF[gpu_type.lower()]
    except KeyError:
        raise ConfigError(f"--gpu-type {gpu_type}: its peak and fabric are not in the table "
                          f"({', '.join(GPU_PERF)}); pass --peak-tflops T --intra-node-gbps B "
                          "--inter-node-gbps B") from None


def node_request(gpus: int, cpu: int, mem_mb: int) -> tuple[int, int]:
    """(CPUs, memory in MB) one node asks for: ``cpu`` and ``mem_mb`` when positive, else the
    defaults for a node of ``gpus`` GPUs (see the module docstring)."""
    if gpus > 0:
        return cpu or CPUS_PER_GPU * gpus, mem_mb or MEM_MB_PER_GPU * gpus
    return cpu or CPU_JOB_CPUS, mem_mb or CPU_JOB_MEM_MB


def gpu_memory_gb(gpu_type: str) -> float:
    """The memory of one ``gpu_type`` device in GB; ConfigError naming the known types."""
    try:
        return GPU_MEMORY_GB[gpu_type.lower()]
    except KeyError:
        close = ([name for name in GPU_MEMORY_GB if name.startswith(gpu_type.lower())]
                 or difflib.get_close_matches(gpu_type.lower(), list(GPU_MEMORY_GB), n=1))
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        raise ConfigError(f"--gpu_type {gpu_type} is not a GPU this repository knows; {hint}pass "
                          f"one of {', '.join(GPU_MEMORY_GB)}, or --device_memory_gb N (GB of "
                          "one device)") from None
