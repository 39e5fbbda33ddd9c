"""The ``fsdp`` component: ``torchx run components/fsdp.py:fsdp -j 1x2 -- --model tiny``."""

from typing import Dict, List, Optional

from torchx import specs

from components.launch import DEFAULT_IMAGE, trainer_app


def fsdp(
    *script_args: str,
    j: str = "1x2",
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
    """Fully sharded data parallel training with FSDP2 (``python -m trainers.fsdp``).

    Each rank stores 1/N of the parameters, gradients and optimizer state and trains on its
    shard of each global batch: for models that do not fit on one device. Trainer options of
    its own: ``--reshard-after-forward true|false`` (ZeRO-3 / ZeRO-2), ``--cpu-offload``,
    ``--dtype bf16`` (bf16 compute, fp32 reduction). The trainer arguments are validated with
    the trainer's own parser before the job is scheduled; see ``python -m trainers.fsdp --help``.

    Args:
        script_args: trainer arguments, e.g. ``--model 1b --dtype bf16``
        j: [min_nodes:]nodes x processes per node, e.g. 1x2, 2x8 or 1:2x8 (elastic)
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
    return trainer_app("trainers.fsdp", script_args, j=j, image=image, cpu=cpu, gpu=gpu,
                       memMB=memMB, h=h, env=env, max_retries=max_retries, rdzv_port=rdzv_port,
                       mounts=mounts, check_paths=check_paths,
                       device_memory_gb=device_memory_gb)
