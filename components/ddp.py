"""The ``ddp`` component: ``torchx run components/ddp.py:ddp -j 1x2 -- --model tiny``."""

from typing import Dict, List, Optional

from torchx import specs

from components.launch import DEFAULT_IMAGE, launch_options, trainer_app


@launch_options
def ddp(
    *script_args: str,
    j: str = "1x2",
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
    """Data-parallel training with DistributedDataParallel (``python -m trainers.ddp``).

    Every rank holds the whole model and trains on its shard of each global batch.
    The trainer arguments are validated with the trainer's own parser before the job is
    scheduled; see ``python -m trainers.ddp --help`` for them.

    Args:
        script_args: trainer arguments, e.g. ``--model small --steps 200 --batch-size 64``
    """
    return trainer_app("ddp", script_args, j=j, image=image, cpu=cpu, gpu=gpu,
                       memMB=memMB, h=h, env=env, max_retries=max_retries,
                       rdzv_port=rdzv_port, mounts=mounts, check_paths=check_paths,
                       device_memory_gb=device_memory_gb, gpu_type=gpu_type)
