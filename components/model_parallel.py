"""The ``model_parallel`` component.

``torchx run components/model_parallel.py:model_parallel --gpu 2 -- --devices cuda:0,cuda:1``
"""

from typing import Dict, List, Optional

from torchx import specs

from components.launch import DEFAULT_IMAGE, trainer_app
from trainers.config import TrainConfig
from trainers.errors import ConfigError


def model_parallel(
    *script_args: str,
    j: str = "1x1",
    image: str = DEFAULT_IMAGE,
    cpu: int = 2,
    gpu: int = 0,
    memMB: int = 4096,
    h: Optional[str] = None,
    env: Optional[Dict[str, str]] = None,
    max_retries: int = 0,
    rdzv_port: int = 29500,
    mounts: Optional[List[str]] = None,
    check_paths: bool = True,
    device_memory_gb: float = 0.0,
) -> specs.AppDef:
    """Naive model parallelism in one process per node (``python -m trainers.model_parallel``).

    The blocks are spread over ``--devices`` (e.g. ``cuda:0,cuda:1``; ``cpu,cpu`` on a laptop)
    and activations move across each boundary; across nodes, DDP. One process per node: use
    ``-j Nx1`` and ``--gpu`` at least the number of GPUs listed. The trainer arguments are
    validated with the trainer's own parser before the job is scheduled; see
    ``python -m trainers.model_parallel --help``.

    Args:
        script_args: trainer arguments, e.g. ``--devices cuda:0,cuda:1 --model 1b``
        j: [min_nodes:]nodes x 1, e.g. 1x1 or 2x1 (one process per node)
        image: container image for container schedulers (ignored by local_cwd)
        cpu: CPUs per node
        gpu: GPUs per node (set to the processes per node on GPU hosts)
        memMB: memory per node in MB
        h: a registered named resource (takes precedence over cpu, gpu and memMB)
        env: extra environment variables, e.g. OMP_NUM_THREADS=1,NCCL_DEBUG=WARN
        max_retries: scheduler retries; a retried job resumes from its newest checkpoint
        rdzv_port: port of the c10d rendezvous on the first node (multi-node jobs)
        mounts: mounts for the workers, e.g. type=bind,src=/data,dst=/data
        check_paths: check --data and --output-dir on the submitting machine; turn off when
            they exist only where the job runs
        device_memory_gb: memory of one device (GPU); the job is refused when the memory
            planner says a rank needs more (0: CPU jobs are checked against memMB shared by
            the node's processes, GPU jobs are not checked)
    """
    return trainer_app("trainers.model_parallel", script_args, j=j, image=image, cpu=cpu, gpu=gpu,
                       memMB=memMB, h=h, env=env, max_retries=max_retries, rdzv_port=rdzv_port,
                       mounts=mounts, check_paths=check_paths,
                       device_memory_gb=device_memory_gb,
                       check=lambda cfg, nproc: _check_placement(cfg, nproc, gpu))


def _check_placement(cfg: TrainConfig, nproc_per_node: int, gpus: int) -> None:
    """One process per node, and every listed GPU among the node's ``gpus``."""
    if nproc_per_node != 1:
        raise ConfigError(f"model_parallel runs one process per node over --devices; pass "
                          f"-j <nodes>x1, not {nproc_per_node} processes per node")
    for name in cfg.devices.split(","):
        if name.startswith("cuda:") and int(name[5:]) >= gpus:
            raise ConfigError(f"--devices {cfg.devices}: {name} does not exist with --gpu "
                              f"{gpus}; pass --gpu {int(name[5:]) + 1} or more")
