"""What one node of a job asks its scheduler for, and the GPUs the memory pre-flight knows.

Standard library only: the components and the planner (``python -m trainers.plan``) both
read it, so the commands the planner prints ask for what a component would.

A CPU job's node asks for :data:`CPU_JOB_CPUS` CPUs and :data:`CPU_JOB_MEM_MB` MB (a laptop
default); a GPU job's for :data:`CPUS_PER_GPU` CPUs and :data:`MEM_MB_PER_GPU` MB per GPU,
which fits the common 4- and 8-GPU nodes (e.g. AWS p4d/p5, GCP a2/a3, DGX A100/H100, AWS
g5.12xlarge). ``--cpu`` and ``--memMB`` override either.
"""

from __future__ import annotations

import difflib

from trainers.torchfree.errors import ConfigError

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
