"""The ``model_parallel`` component.

``torchx run components/model_parallel.py:model_parallel --gpu 2 -- --devices cuda:0,cuda:1``
"""

from typing import Dict, List, Optional

from torchx import specs

from components.launch import DEFAULT_IMAGE, launch_options, trainer_app


@launch_options
def model_parallel(
    *script_args: str,
    j: str = "1x1",
    image: str = DEFAULT_IMAGE,
    cpu: int = 0,
    gpu: int = 0,
    memMB: int = 0,
    h: Optional[str] = None,
    env: Optional[Dict[str, str]] = None,
    max_retries: int = 0,
    rdzv_port: int = 0,
    mounts: Optional[List[str]] = None,
    check_paths: bool = True,
    device_memory_gb: float = 0.0,
    gpu_type: Optional[str] = None,
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
    return trainer_app("model_parallel", script_args, j=j, image=image, cpu=cpu, gpu=gpu,
                       memMB=memMB, h=h, env=env, max_retries=max_retries,
                       rdzv_port=rdzv_port, mounts=mounts, check_paths=check_paths,
                       device_memory_gb=device_memory_gb, gpu_type=gpu_type)
