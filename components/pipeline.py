"""The ``pipeline`` component: ``torchx run components/pipeline.py:pipeline -j 1x2 -- --pp 2``
(3-D: ``-j 2x4 -- --pp 2 --tp 2``)."""

from typing import Dict, List, Optional

from torchx import specs

from components.launch import DEFAULT_IMAGE, launch_options, trainer_app


@launch_options
def pipeline(
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
    """Pipeline-parallel training (``python -m trainers.pipeline``).

    ``--pp`` ranks each hold consecutive blocks and pass activations along; a schedule
    (``--schedule gpipe|1f1b|interleaved1f1b|zerobubble``) runs ``--microbatches`` per step to
    keep them busy. For models that do not fit one device, across nodes. With ``--tp`` each
    stage is also tensor parallel inside a node (``--tp`` divides the processes per node) and
    FSDP2-sharded over the ``dp`` pipelines: 3-D, world = pp x dp x tp.
    The trainer arguments are validated with the trainer's own parser before the job is
    scheduled; see ``python -m trainers.pipeline --help``.

    Args:
        script_args: trainer arguments, e.g. ``--pp 2 --tp 4 --schedule 1f1b --microbatches 8``
    """
    return trainer_app("pipeline", script_args, j=j, image=image, cpu=cpu, gpu=gpu,
                       memMB=memMB, h=h, env=env, max_retries=max_retries,
                       rdzv_port=rdzv_port, mounts=mounts, check_paths=check_paths,
                       device_memory_gb=device_memory_gb, gpu_type=gpu_type)
