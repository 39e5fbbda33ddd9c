"""The ``scaling`` component: will scaling pay (``python -m trainers.scaling``) as one job.

``torchx run -s slurm components/scaling.py:scaling --trainer fsdp -j 2x8 --gpu 8 -- --model
hf:/data/my-llama --data /data/corpus --batch-size 64``
"""

from typing import Dict, List, Optional

from torchx import specs
from torchx.specs import macros

from components.checks import node_range
from components.errors import ComponentArgumentError
from components.launch import (
    DEFAULT_IMAGE,
    ShellExpanded,
    node_resource,
    rendezvous_port,
    shell_line,
)
from trainers.errors import ConfigError
from trainers.options.trainer_table import check_one_process_per_gpu
from trainers.scaling.runs import MEASURED, PROG, Options, check_options, check_runs


def scaling(
    *script_args: str,
    trainer: str = "ddp",
    steps: int = 20,
    profile_steps: int = 5,
    output_dir: str = "",
    j: str = "1x2",
    image: str = DEFAULT_IMAGE,
    cpu: int = 0,
    gpu: int = 0,
    memMB: int = 0,
    h: Optional[str] = None,
    env: Optional[Dict[str, str]] = None,
    rdzv_port: int = 0,
    mounts: Optional[List[str]] = None,
) -> specs.AppDef:
    """Will scaling pay: ``trainer`` on your model and data briefly at 1 process, at G
    processes and, with ``-j NxG`` and N > 1, at N nodes x G (``python -m trainers.scaling``);
    prints tokens/s, the scaling efficiency, each step split into compute, exposed
    communication, data wait and host overhead, and the pitfalls with their fixes; writes
    ``scaling.json`` and ``scaling.png`` into ``output_dir``.

    Node 0 runs every size and reports; the other nodes join the multi-node run only. The
    runs are checked with the trainer's own parser at each size before the job is scheduled.

    Args:
        script_args: trainer options for the largest run, e.g. ``--model small --batch-size 32``
        trainer: the trainer to measure: ddp, fsdp or tensor_parallel
        steps: optimizer steps per run
        profile_steps: the last steps of each run that torch.profiler records
        output_dir: where the runs and the report go, shared by the nodes (default
            outputs/<app id>/scaling)
        j: NODESxPROCS: the largest run, e.g. 1x2, 1x8 or 2x8
        image: container image for container schedulers (ignored by local_cwd)
        cpu: CPUs per node (0: 2 on CPU nodes, 8 per GPU on GPU nodes)
        gpu: GPUs per node; a GPU job runs one process per GPU (-j NxG --gpu G)
        memMB: memory per node in MB (0: 4096 on CPU nodes, 32768 per GPU on GPU nodes)
        h: a registered named resource (takes precedence over cpu, gpu and memMB)
        env: extra environment variables, e.g. NCCL_DEBUG=WARN
        rdzv_port: port of the multi-node run's rendezvous on node 0 (0: one that is free on
            the submitting machine)
        mounts: mounts, e.g. type=bind,src=/data,dst=/data
    """
    min_nodes, nodes, nproc = node_range(j)
    if min_nodes != nodes:
        raise ComponentArgumentError(f"-j {j}: a measurement runs on a fixed number of nodes; "
                                     f"pass -j {nodes}x{nproc}")
    gpus, resource = node_resource(h, mounts, cpu, gpu, memMB)
    port = rendezvous_port(rdzv_port, nodes)
    endpoint = ShellExpanded(f"$${{{macros.rank0_env}:=localhost}}:{port}")
    opts = Options(trainer=trainer, nproc=nproc, nodes=nodes, node_rank=0,
                   rdzv_endpoint=endpoint if nodes > 1 else "", run_id=macros.app_id,
                   steps=steps, profile_steps=profile_steps,
                   output_dir=output_dir or f"outputs/{macros.app_id}/scaling")
    try:
        if trainer not in MEASURED:
            raise ConfigError(f"--trainer {trainer}: pass one of {', '.join(MEASURED)} (a "
                              "pipeline has no 1-process run to compare with)")
        check_options(opts)
        cfg, _ = check_runs(opts, script_args, check_paths=False)
        check_one_process_per_gpu(cfg, nproc, gpus)
    except ConfigError as err:
        raise ComponentArgumentError(f"{PROG}: {err}") from None
    command = ["python", "-m", "trainers.scaling", "--trainer", trainer, "--nproc", str(nproc),
               "--nodes", str(nodes), "--node-rank", macros.replica_id, "--run-id",
               macros.app_id, "--steps", str(steps), "--profile-steps", str(profile_steps),
               "--output-dir", opts.output_dir]
    if nodes > 1:
        command += ["--rdzv-endpoint", endpoint]
    role = specs.Role(
        name="scaling", image=image, entrypoint="bash",
        args=["-c", shell_line([*command, "--", *script_args])],
        env=dict(env or {}), num_replicas=nodes, min_replicas=nodes, resource=resource,
        port_map={"c10d": port}, mounts=specs.parse_mounts(mounts) if mounts else [])
    return specs.AppDef(name="scaling", roles=[role])
