"""The ``fsdp`` component: ``torchx run components/fsdp.py:fsdp -j 1x2 -- --model tiny``."""

from typing import Dict, List, Optional

from torchx import specs

from components.launch import DEFAULT_IMAGE, launch_options, trainer_app


@launch_options
def fsdp(
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
    """Fully sharded data parallel training with FSDP2 (``python -m trainers.fsdp``).

    Each rank stores 1/N of the parameters, gradients and optimizer state and trains on its
    shard of each global batch: for models that do not fit on one device. Trainer options of
    its own: ``--reshard-after-forward true|false`` (ZeRO-3 / ZeRO-2), ``--cpu-offload``,
    ``--dtype bf16`` (bf16 compute, fp32 reduction). The trainer arguments are validated with
    the trainer's own parser before the job is scheduled; see ``python -m trainers.fsdp --help``.

    Args:
        script_args: trainer arguments, e.g. ``--model 1b --dtype bf16``
    """
    return trainer_app("fsdp", script_args, j=j, image=image, cpu=cpu, gpu=gpu,
                       memMB=memMB, h=h, env=env, max_retries=max_retries,
                       rdzv_port=rdzv_port, mounts=mounts, check_paths=check_paths,
                       device_memory_gb=device_memory_gb, gpu_type=gpu_type)
