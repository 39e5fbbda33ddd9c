"""The ``model_parallel`` component.

``torchx run components/model_parallel.py:model_parallel --gpu 2 -- --devices cuda:0,cuda:1``
"""

from typing import Dict, List, Optional

from torchx import specs

from components.launch import DEFAULT_IMAGE, launch_options, trainer_app
from trainers.config import TrainConfig
from trainers.errors import ConfigError


@launch_options
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
    rdzv_port: int = 0,
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
    """
    return trainer_app("trainers.model_parallel", **locals(),
                       check=lambda cfg, nproc: _check_placement(cfg, nproc, gpu))


def _check_placement(cfg: TrainConfig, nproc_per_node: int, gpus: int) -> None:
    """One process per node, and every listed GPU among the node's ``gpus``."""
    if nproc_per_node != 1:
        raise ConfigError(f"model_parallel runs one process per node over --devices; pass "
                          f"-j <nodes>x1, not {nproc_per_node} processes per node")
    needed = max((int(name[5:]) + 1 for name in cfg.devices.split(",")
                  if name.startswith("cuda:")), default=0)
    if needed > gpus:
        raise ConfigError(f"--devices {cfg.devices} needs --gpu {needed} or more, not --gpu "
                          f"{gpus}; pass --gpu {needed}")
