"""Process group and device for this rank: cuda+nccl when GPUs are visible, else cpu+gloo.

Under torchrun the rank, world size and rendezvous come from its environment; run as a plain
process, the trainer becomes a world of one with an in-memory store, so every code path
(collectives, DCP) is the same in both cases. Under a launcher that forms the process group
itself (Ray Train), the trainer joins that group and leaves it to the launcher.
"""

from __future__ import annotations

import dataclasses
import gc
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from trainers.errors import ConfigError
from trainers.options.train_config import TrainConfig


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in the job."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str
    tf32: bool = False  # fp32 matmuls and cuDNN convolutions run in TF32 (configure_tf32)

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def select_device(requested: str, local_rank: int) -> torch.device:
    """``auto`` picks ``cuda:<local_rank>`` when a GPU is visible, else the CPU."""
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("--device cuda: no GPU is visible; pass --device cpu or auto")
        if local_rank >= torch.cuda.device_count():
            raise ConfigError(f"local rank {local_rank} has no GPU ({torch.cuda.device_count()} "
                              "visible); lower nproc_per_node to the GPUs per node")
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def select_backend(requested: str, device: torch.device) -> str:
    """``auto`` picks nccl for CUDA devices and gloo otherwise."""
    if requested == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    if requested == "nccl" and device.type != "cuda":
        raise ConfigError("--backend nccl needs CUDA devices; pass --backend gloo or auto")
    return requested


def tf32_applies(requested: bool, device_type: str, capability: tuple[int, int] | None,
                 rocm: bool = False) -> bool:
    """Whether fp32 matmuls and cuDNN convolutions should run in TensorFloat-32: asked for
    (``--tf32``, the default) on an NVIDIA CUDA device of compute capability 8.0 (Ampere) or
    newer. ROCm reports its own architecture numbers as ``capability``, so it never counts."""
    return (requested and device_type == "cuda" and not rocm and capability is not None
            and tuple(capability) >= (8, 0))


def configure_tf32(requested: bool, device: torch.device) -> bool:
    """Set this process's fp32 precision of CUDA matmuls and cuDNN convolutions to ``tf32`` where
    :func:`tf32_applies`, else to ``ieee`` (full fp32; cuDNN convolutions would otherwise
    default to TF32); return whether TF32 is on. On the CPU (or ROCm) nothing is changed.

    The settings are process-wide, so the device of the rank decides for every device the
    process drives (``model_parallel``'s ``--devices``)."""
    rocm = torch.version.hip is not None
    if device.type != "cuda" or rocm:
        return False
    on = tf32_applies(requested, device.type, torch.cuda.get_device_capability(device), rocm)
    precision = "tf32" if on else "ieee"
    # The per-backend API of torch >= 2.9. Its predecessors (allow_tf32,
    # set_float32_matmul_precision) warn that they are deprecated on CUDA builds, and after
    # this API is used torch's legacy getters raise: use only this one.
    torch.backends.cuda.matmul.fp32_precision = precision
    torch.backends.cudnn.conv.fp32_precision = precision
    return on


def attempt_store(world_size: int) -> dist.Store:
    """A client of the launcher's store (``MASTER_ADDR:MASTER_PORT``) whose keys are private to
    this attempt of the run (``TORCHELASTIC_RESTART_COUNT``).

    torchrun keeps one agent store across in-place restarts, and with gloo the restarted
    workers otherwise read the dead workers' addresses and fail in connectFullMesh (torch 2.13;
    new groups and point-to-point pairs are keyed under the default group's store).
    Without torchrun's agent store (plain ``MASTER_ADDR`` launches) rank 0 hosts the store.
    """
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                          is_master=not agent and int(os.environ.get("RANK", "0")) == 0,
                          timeout=timedelta(minutes=10), multi_tenant=not agent)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"attempt_{attempt}/", store)


def pg_timeout(cfg: TrainConfig) -> timedelta | None:
    """How long a collective may wait before the process group raises: ``--pg-timeout``
    seconds, or None (torch's default for the backend) when it is 0.

    Set, it also becomes the default of every group formed later in this process (device
    mesh dimensions, pipeline stage pairs, the checkpointer's gloo group), which
    ``new_group`` would otherwise give torch's backend default rather than the world's."""
    if not cfg.pg_timeout:
        return None
    timeout = timedelta(seconds=cfg.pg_timeout)
    c10d = dist.distributed_c10d
    c10d.default_pg_timeout = c10d.default_pg_nccl_timeout = timeout
    return timeout


@contextmanager
def init_distributed(cfg: TrainConfig, device: torch.device | None = None) -> Iterator[DistEnv]:
    """Join (or form) the process group for the run and leave it on exit.

    If the default group already exists (a launcher such as Ray Train formed it), this joins
    it: rank, world size and backend are the group's, ``device`` is the launcher's choice for
    this process (None: chosen from ``--device`` and ``LOCAL_RANK`` as under torchrun), and
    the group is left initialised on exit for its owner to destroy.
    """
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if dist.is_initialized():
        env = _existing_group(cfg, device or select_device(cfg.device, local_rank), local_rank)
        if env.device.type == "cuda":
            torch.cuda.set_device(env.device)
        yield dataclasses.replace(env, tf32=configure_tf32(cfg.tf32, env.device))
        return
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    device = device or select_device(cfg.device, local_rank)
    backend = select_backend(cfg.backend, device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    tf32 = configure_tf32(cfg.tf32, device)
    if "MASTER_ADDR" in os.environ:
        dist.init_process_group(backend, store=attempt_store(world_size), rank=rank,
                                world_size=world_size, timeout=pg_timeout(cfg),
                                device_id=device if device.type == "cuda" else None)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield DistEnv(rank, world_size, local_rank, device, backend, tf32)
    finally:
        leave_process_group()


def _existing_group(cfg: TrainConfig, device: torch.device, local_rank: int) -> DistEnv:
    """This process's place in the default group someone else initialised; ConfigError if
    ``--backend`` or ``device`` contradicts the group's backend."""
    backend = str(dist.get_backend())
    if cfg.backend != "auto" and cfg.backend != backend:
        raise ConfigError(f"--backend {cfg.backend}: the launcher's process group uses {backend}; "
                          f"pass --backend auto or {backend}")
    if backend == "nccl" and device.type != "cuda":
        raise ConfigError(f"the launcher's process group uses nccl, but this rank's device is "
                          f"{device}; give the workers GPUs or pass --device auto")
    return DistEnv(dist.get_rank(), dist.get_world_size(), local_rank, device, backend)


def leave_process_group() -> None:
    """Destroy the process groups once nothing holds their work. Models, optimizers and FSDP
    state in reference cycles keep gloo's pending work objects (and their tensors) alive until
    the garbage collector runs; collected at interpreter exit, gloo's threads release those
    tensors without a live interpreter and the process aborts ("terminate called without an
    active exception"). Collecting first releases them while the group and the interpreter
    are alive."""
    gc.collect()
    dist.destroy_process_group()
