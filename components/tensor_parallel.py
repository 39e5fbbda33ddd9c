"""The ``tensor_parallel`` component.

``torchx run components/tensor_parallel.py:tensor_parallel -j 1x4 -- --tp 2`` (2 x 2 mesh).
"""

from typing import Dict, List, Optional

from torchx import specs

from components.launch import DEFAULT_IMAGE, launch_options, trainer_app


@launch_options
def tensor_parallel(
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
    """Tensor parallel inside groups of ``--tp`` ranks, FSDP across them
    (``python -m trainers.tensor_parallel``).

    For very large layers on fast intra-node links: keep ``--tp`` at or below the processes
    per node, so each tensor-parallel group sits on one node, with data parallelism across.
    ``--tp`` must divide the heads, the hidden size and the world size; ``--dp`` (0: the rest)
    x ``--tp`` must equal the world size; ``--sequence-parallel`` shards norms by sequence.
    The trainer arguments are validated with the trainer's own parser before the job is
    scheduled; see ``python -m trainers.tensor_parallel --help``.

    Args:
        script_args: trainer arguments, e.g. ``--tp 2 --sequence-parallel --model small``
    """
    return trainer_app("tensor_parallel", script_args, j=j, image=image, cpu=cpu, gpu=gpu,
                       memMB=memMB, h=h, env=env, max_retries=max_retries,
                       rdzv_port=rdzv_port, mounts=mounts, check_paths=check_paths,
                       device_memory_gb=device_memory_gb, gpu_type=gpu_type)
