"""What every component shares: check the trainer's arguments, then build the AppDef that runs
the trainer under torchrun.

Each component is one ``def`` (TorchX reads its signature and docstring) that passes its
arguments to :func:`trainer_app` with the name of its trainer in the table of trainers
(:mod:`trainers.options.trainer_table`). :func:`trainer_app` checks them first
(:mod:`components.checks`: the trainers' own parser at every data-parallel size the job's node
range allows, the placement, the memory pre-flight), so a bad argument fails here, in one line,
before anything is scheduled. :func:`torchrun_app` then builds the AppDef itself: one role
running ``torchrun`` with TorchX's rendezvous macros, as TorchX's own ``dist.ddp`` (torchx
0.7.0) and ``dist.torchrun`` (TorchX main) do, plus torchrun's in-place restarts and the
trainers' preemption signals; the same AppDef on both TorchX versions.
"""

from __future__ import annotations

import os
import random
import shlex
import signal
import socket
from collections.abc import Callable, Mapping, Sequence

from torchx import specs
from torchx.components.structured_arg import StructuredNameArgument
from torchx.specs import macros

from components.checks import check_launch_specs, check_trainer, node_range
from components.cpu_memory import TrainerRole, note_cpu_memory
from components.errors import ComponentArgumentError
from components.schedulers.submit import note_stores
from trainers.options import trainer_table
from trainers.runs.preemption_signals import parse_signals
from trainers.sizing.resources import node_request

# The image that container schedulers (kubernetes, local_docker) run; local_cwd ignores it.
DEFAULT_IMAGE = "torchx-templates:cpu"


# Where a rendezvous port picked for a multi-node job comes from: below the ephemeral ranges
# (Linux's default 32768-60999, the IANA 49152-65535) that a node's bind(0) and outgoing
# connections draw from, as torchrun's default 29500 is: a port there that is free when the
# job is submitted can be taken on its first node by any process before the job starts (a job
# may wait in the queue), and the node's torchrun would then find it in use.
RENDEZVOUS_PORTS = range(20000, 32768)


def rendezvous_port(port: int, max_nodes: int) -> int:
    """The c10d rendezvous port of a job that may span ``max_nodes`` nodes.

    ``port`` 0 on a multi-node job picks a port of :data:`RENDEZVOUS_PORTS` at random that is
    free on the submitting machine now, so that concurrent multi-node jobs sharing a host
    (``local_cwd``, whose "nodes" are all this machine, or Slurm nodes shared between jobs)
    each host their own store instead of joining the first job's store on a fixed port and
    failing when it exits. A single-node job gets ``port`` unchanged (:func:`torchrun_command`
    then rendezvouses on a free port of its own host).
    """
    if not 0 <= port <= 65535:
        raise ComponentArgumentError(
            f"--rdzv_port {port}: not a TCP port; pass 1-65535, or 0 for a free port")
    if port or max_nodes == 1:
        return port
    for candidate in random.sample(RENDEZVOUS_PORTS, 64):
        with socket.socket() as probe:
            try:
                probe.bind(("", candidate))
            except OSError:
                continue
            return candidate
    raise ComponentArgumentError(
        f"--rdzv_port 0: no free port among 64 tried in {RENDEZVOUS_PORTS.start}-"
        f"{RENDEZVOUS_PORTS.stop - 1} on this machine; pass --rdzv_port <a port free on the "
        "job's first node>")


# The Args lines of the options every component shares (TorchX reads a component's help from
# its docstring at run time, so :func:`launch_options` appends them to each).
LAUNCH_ARGS = """\
        j: [min_nodes:]nodes x processes per node, e.g. 1x2, 2x8 or 1:2x8 (elastic)
        image: container image for container schedulers (ignored by local_cwd)
        cpu: CPUs per node (0: 2 on CPU nodes, 8 per GPU on GPU nodes)
        gpu: GPUs per node; a GPU job runs one process per GPU (-j NxG --gpu G)
        memMB: memory per node in MB (0: 4096 on CPU nodes, 32768 per GPU on GPU nodes)
        h: a registered named resource (takes precedence over cpu, gpu and memMB)
        env: extra environment variables, e.g. OMP_NUM_THREADS=1,NCCL_DEBUG=WARN
        max_retries: restarts after a failure: torchrun restarts lost workers in place (any
            scheduler) and Slurm/Kubernetes retry the job after a lost node; either way the
            run resumes from its newest checkpoint
        rdzv_port: port of the c10d rendezvous on the first node of a multi-node job (0: one
            that is free on the submitting machine, so concurrent jobs do not collide)
        mounts: mounts for the workers, e.g. type=bind,src=/data,dst=/data
        check_paths: check --data and --output-dir on the submitting machine (a bucket when
            the job is submitted, never for --dryrun); turn off when they exist, or the
            bucket answers, only where the job runs
        device_memory_gb: GB of one GPU: the job is refused when the memory planner says a rank
            needs more (a GPU job names this or gpu_type; CPU jobs are checked against
            memMB shared by the node's processes)
        gpu_type: the GPU model instead of device_memory_gb, e.g. a100-80gb, h100, h200
            (python -m trainers.planning.plan --help lists them)
"""


def launch_options(component: Callable[..., specs.AppDef]) -> Callable[..., specs.AppDef]:
    """Append the shared options' Args lines to ``component``'s docstring."""
    component.__doc__ = component.__doc__.rstrip() + "\n" + LAUNCH_ARGS
    return component


def trainer_app(
    trainer: str,
    script_args: tuple[str, ...],
    *,
    j: str,
    image: str,
    cpu: int,
    gpu: int,
    memMB: int,
    h: str | None,
    env: dict[str, str] | None,
    max_retries: int,
    rdzv_port: int,
    mounts: list[str] | None,
    check_paths: bool,
    device_memory_gb: float,
    gpu_type: str | None,
    run_args: Sequence[str] = (),
) -> specs.AppDef:
    """The AppDef that runs trainer ``trainer`` (``python -m trainers.<trainer> <script_args>``)
    under torchrun (:func:`torchrun_app`), once its arguments are checked. ``run_args`` follow
    them unchecked: words only the node's shell knows (:class:`ShellExpanded`), whose checked
    stand-ins ``script_args`` holds.

    Without ``--output-dir`` the run writes to ``outputs/<app id>``, so a scheduler retry of
    the same job resumes from its own checkpoints (the trainers default to ``--resume auto``).
    The nodes ask for the named resource ``h`` when given, else for ``cpu`` and ``memMB``
    (0: the per-node defaults of :func:`trainers.sizing.resources.node_request`) and
    ``gpu``; :func:`check_trainer` checks the trainer's arguments against them.
    ``max_retries`` is both torchrun's in-place restarts and the scheduler's retries.
    Object-store URLs among the arguments are checked for their scheme here and, with
    ``check_paths``, reached by the scheduler when it submits
    (:mod:`components.schedulers.submit`), never for a dry run.
    """
    min_nodes, max_nodes, nproc = node_range(j)
    gpus, resource = node_resource(h, mounts, cpu, gpu, memMB)
    args = with_output_dir(script_args)
    cfg, cpu_memory = check_trainer(trainer, args, nodes=range(min_nodes, max_nodes + 1),
                                    nproc=nproc, gpus=gpus, node_mb=resource.memMB, env=env,
                                    check_paths=check_paths,
                                    device_memory_gb=device_memory_gb, gpu_type=gpu_type)
    app = torchrun_app(trainer_table.trainer(trainer).module, *args, *run_args, name=trainer, j=j,
                       image=image, resource=resource, env=env, max_retries=max_retries,
                       rdzv_port=rdzv_port, mounts=mounts,
                       signals=parse_signals(cfg.preemption_signals))
    if check_paths:
        note_stores(app.roles[0], cfg)
    if cpu_memory is not None:
        note_cpu_memory(app.roles[0], cpu_memory)
    return app


def node_resource(h: str | None, mounts: list[str] | None, cpu: int, gpu: int,
                  memMB: int) -> tuple[int, specs.Resource]:
    """A node's GPUs and what it asks the scheduler for: the named resource ``h`` when given,
    else ``cpu``, ``gpu`` and ``memMB`` (0: the per-node defaults of
    :func:`trainers.sizing.resources.node_request`); ``h`` and ``mounts`` checked first."""
    named = check_launch_specs(h, mounts)
    gpus = named.gpu if named is not None else gpu
    cpu, memMB = node_request(gpus, cpu, memMB)
    return gpus, named or specs.resource(cpu=cpu, gpu=gpu, memMB=memMB)


def with_output_dir(script_args: Sequence[str]) -> list[str]:
    """The trainer's arguments, with ``--output-dir outputs/<app id>`` when they name none (so
    that a scheduler's retry of the job resumes from its own checkpoints)."""
    args = list(script_args)
    if not any(a == "--output-dir" or a.startswith("--output-dir=") for a in args):
        args += ["--output-dir", f"outputs/{macros.app_id}"]
    return args


def torchrun_app(module: str, *args: str, j: str, name: str | None = None,
                 image: str = DEFAULT_IMAGE, resource: specs.Resource | None = None,
                 env: Mapping[str, str] | None = None, max_retries: int = 0, rdzv_port: int = 0,
                 mounts: list[str] | None = None,
                 signals: Sequence[signal.Signals] = ()) -> specs.AppDef:
    """The AppDef ``name`` (default: the module's last part) of one role, as many nodes as
    ``j`` (``[min_nodes:]NODESxPROCS``, see :func:`node_range`) asks for, each running
    ``python -m module *args`` in ``image`` under torchrun (:func:`torchrun_command`).

    ``resource`` is each node's (default: a CPU node of
    :func:`trainers.sizing.resources.node_request`); ``mounts`` are TorchX's mount specs;
    ``port_map`` names the rendezvous port (:func:`rendezvous_port`). A failed worker is
    restarted in place by torchrun ``max_retries`` times, and the role as a whole as often by
    the scheduler (TorchX's APPLICATION retry policy). The environment is :func:`torchrun_env`.
    """
    min_nodes, max_nodes, nproc = node_range(j)
    port = rendezvous_port(rdzv_port, max_nodes)
    role_name = module.rpartition(".")[2]
    command = torchrun_command(module, args, nodes=(min_nodes, max_nodes), nproc=nproc,
                               rdzv_port=port, max_restarts=max_retries)
    if resource is None:
        cpu, mem_mb = node_request(0, 0, 0)
        resource = specs.resource(cpu=cpu, memMB=mem_mb)
    role = TrainerRole(
        name=role_name,
        image=image,
        entrypoint="bash",
        args=["-c", shell_line(command)],
        env=torchrun_env(env, name or role_name, module, signals),
        min_replicas=min_nodes,
        num_replicas=max_nodes,
        resource=resource,
        port_map={"c10d": port},
        max_retries=max_retries,
        retry_policy=specs.RetryPolicy.APPLICATION,
        mounts=specs.parse_mounts(mounts) if mounts else [],
    )
    return specs.AppDef(name=name or role_name, roles=[role])


def torchrun_command(module: str, args: Sequence[str], *, nodes: tuple[int, int], nproc: int,
                     rdzv_port: int, max_restarts: int) -> list[str]:
    """``torchrun ... -m module *args`` for ``nodes`` (min, max) nodes of ``nproc`` workers.

    The c10d rendezvous store is on the first node, at the host in the variable the scheduler
    names by TorchX's ``rank0_env`` macro (localhost where it is unset or empty: some
    schedulers set it on every node but the first), which the shell expands
    (:class:`ShellExpanded`); a single node rendezvouses on a free port of its own
    (``localhost:0``). The rendezvous id is the app id, so restarted nodes rejoin their own job.
    ``--tee 3`` copies each worker's stdout and stderr to the node's; ``--role ''`` as TorchX.
    """
    min_nodes, max_nodes = nodes
    endpoint = (ShellExpanded(f"$${{{macros.rank0_env}:=localhost}}:{rdzv_port}")
                if max_nodes > 1 else "localhost:0")
    return ["torchrun", "--max_restarts", str(max_restarts),
            "--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint, "--rdzv_id", macros.app_id,
            "--nnodes", f"{min_nodes}:{max_nodes}" if min_nodes < max_nodes else str(max_nodes),
            "--nproc_per_node", str(nproc), "--tee", "3", "--role", "",
            "-m", module, *args]


class ShellExpanded(str):
    """A word of a command that the shell expands when it runs: :func:`shell_line` leaves it
    unquoted."""


def shell_line(words: Sequence[str]) -> str:
    """``words`` as one command line for ``bash -c``: each quoted (``shlex.quote``) but the
    :class:`ShellExpanded` ones."""
    return " ".join(w if isinstance(w, ShellExpanded) else shlex.quote(w) for w in words)


# Signals torchrun forwards to its workers by default (torch.distributed.run --signals-to-handle).
TORCHRUN_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
# Seconds torchrun waits for its workers to save and exit after forwarding a signal before it
# kills them; the scheduler's own grace period (Slurm signal_grace, Kubernetes
# termination_grace_s) is the bound that matters, so this only has to exceed it.
TORCHRUN_SHUTDOWN_S = 900


def torchrun_env(env: Mapping[str, str] | None, name: str, module: str,
                 signals: Sequence[signal.Signals]) -> dict[str, str]:
    """``env`` and what TorchX's ``dist`` components add: the run and experiment names of
    TorchX's trackers (from the app ``name``), and ``LOGLEVEL`` (the submitter's, else WARNING);
    plus what makes torchrun forward the trainers' preemption ``signals`` to its workers (it
    forwards only SIGTERM, SIGINT, SIGHUP and SIGQUIT by default and dies of SIGUSR1) and wait
    for them to save (``PET_SIGNALS_TO_HANDLE``, ``PET_SHUTDOWN_TIMEOUT``). A value the user set
    in ``env`` is kept, but for the tracker names."""
    names = StructuredNameArgument.parse_from(name=name, m=module)
    signal_names = [*TORCHRUN_SIGNALS, *(s.name for s in signals if s.name not in TORCHRUN_SIGNALS)]
    env = {**(env or {}), "TORCHX_TRACKING_EXPERIMENT_NAME": names.experiment_name,
           "TORCHX_TRACKING_RUN_NAME": names.run_name}
    env.setdefault("LOGLEVEL", os.getenv("LOGLEVEL", "WARNING"))
    env.setdefault("PET_SIGNALS_TO_HANDLE", ",".join(signal_names))
    env.setdefault("PET_SHUTDOWN_TIMEOUT", str(TORCHRUN_SHUTDOWN_S))
    return env
