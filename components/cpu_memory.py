"""A CPU job's memory pre-flight, priced by where the scheduler runs it.

A GPU job is checked by its component against one device's memory (a GPU's memory is the same
on every scheduler). A CPU job's ranks share their node's memory, and whether the node's
request (``--memMB``, default 4096 MB) is a real limit depends on the scheduler, which a
component does not know: Slurm and Kubernetes enforce it (a job over it is killed), local_cwd
enforces nothing (its processes share the submitting host's memory), and local_docker enforces
it as the container's memory limit only when it is positive.

So a component notes what a CPU job needs in its role (:class:`CpuMemory`, in the role's
metadata under :data:`CPU_MEMORY`), and the role is a :class:`TrainerRole`, whose ``pre_proc``
(TorchX calls it from every scheduler's ``submit_dryrun``, so for ``torchx run``, ``--dryrun``
and TorchX's Python runner alike, before anything is submitted) prices it:

- against the host's available memory on a scheduler that enforces no request (local_cwd, and
  local_docker without a positive ``--memMB``), all the job's processes together, since every
  node of a local job runs on this host;
- against the node's request everywhere else, refusing with the one line the component made
  (:attr:`CpuMemory.request_refusal`).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from torchx import specs
from torchx.schedulers.api import AppDryRunInfo

from components.errors import ComponentArgumentError
from trainers.planning.planner import GIB, USABLE

# Role metadata key: the CPU job's memory (:class:`CpuMemory`, as a dict).
CPU_MEMORY = "torchx_templates/cpu_memory"


@dataclass(frozen=True)
class CpuMemory:
    """What a CPU job's rank needs (``rank_bytes``, the planner's peak) for the job ``trainer``
    of ``model``, with ``ranks_per_node`` processes a node; ``request_refusal`` is the one-line
    refusal when that does not fit the node's request (None: it fits)."""

    trainer: str
    model: str
    rank_bytes: int
    ranks_per_node: int
    request_refusal: str | None


def host_available_bytes() -> int:
    """Memory this host can give new processes: /proc/meminfo's MemAvailable on Linux, else
    (macOS) the physical memory."""
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def enforces_request(backend: str, role: specs.Role) -> bool:
    """Whether scheduler ``backend`` holds ``role``'s nodes to their memory request."""
    if backend == "local":
        return False
    if backend == "docker":
        return role.resource.memMB > 0  # TorchX's container memory limit
    return True


def check_cpu_memory(backend: str, role: specs.Role) -> None:
    """ComponentArgumentError (one line naming the fix) when ``role``'s noted
    :class:`CpuMemory` does not fit where scheduler ``backend`` runs it."""
    noted = role.metadata.get(CPU_MEMORY)
    if noted is None:
        return
    memory = CpuMemory(**json.loads(noted))
    if enforces_request(backend, role):
        if memory.request_refusal is not None:
            raise ComponentArgumentError(memory.request_refusal)
        return
    ranks = memory.ranks_per_node * role.num_replicas
    need, available = memory.rank_bytes * ranks, host_available_bytes()
    if need > USABLE * available:
        raise ComponentArgumentError(
            f"trainers.{memory.trainer}: --model {memory.model} needs "
            f"{memory.rank_bytes / GIB:.2f} GiB per rank, {need / GIB:.2f} GiB for the job's "
            f"{ranks} processes on this host, which has {available / GIB:.2f} GiB available "
            f"({USABLE * available / GIB:.2f} usable); pass fewer processes (-j), a smaller "
            "--batch-size or --model, or free memory")


class TrainerRole(specs.Role):
    """A trainer's role: TorchX's Role whose ``pre_proc`` runs :func:`check_cpu_memory` for the
    scheduler that renders it."""

    def pre_proc(self, scheduler: str, dryrun_info: AppDryRunInfo[Any]) -> AppDryRunInfo[Any]:
        check_cpu_memory(scheduler, self)
        return dryrun_info


def note_cpu_memory(role: specs.Role, memory: CpuMemory) -> None:
    """Note ``memory`` in ``role``'s metadata for :func:`check_cpu_memory` (as JSON: metadata
    is printed by ``--dryrun`` and copied by TorchX)."""
    role.metadata[CPU_MEMORY] = json.dumps(asdict(memory))
