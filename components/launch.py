"""What every component shares: validate the trainer's arguments, then build on ``dist.torchrun``
(``dist.ddp`` on torchx 0.7.0; :mod:`components.torchx_compat`).

Each component is one ``def`` (TorchX reads its signature and docstring) that passes its
arguments to :func:`trainer_app` with the name of its trainer in the table of trainers
(:mod:`trainers.torchfree.trainer_table`). Validation uses the trainers' own parser
(:func:`trainers.torchfree.config.parse_config`) for every data-parallel size the job's node range
allows, so a bad argument fails here, in one line, before anything is scheduled.
"""

from __future__ import annotations

import signal
import socket
from collections.abc import Callable

from torchx import specs
from torchx.components import dist
from torchx.specs.api import macros

from components.errors import ComponentArgumentError
from components.torchx_compat import torchrun_app
from trainers.torchfree import faults, trainer_table
from trainers.torchfree.config import parse_config
from trainers.torchfree.errors import ConfigError, MissingPathError
from trainers.torchfree.model_names import model_kind
from trainers.torchfree.planner import GIB, check_fits
from trainers.torchfree.preemption_signals import parse_signals
from trainers.torchfree.resources import GPU_MEMORY_GB, gpu_memory_gb, node_request

# The image that container schedulers (kubernetes, local_docker) run; local_cwd ignores it.
DEFAULT_IMAGE = "torchx-templates:cpu"


def node_range(j: str) -> tuple[int, int, int]:
    """``[min:]NxM`` as (min_nodes, max_nodes, nproc_per_node), checked."""
    try:
        min_nodes, max_nodes, nproc, _ = dist.parse_nnodes(j)
    except (ValueError, IndexError):
        raise ComponentArgumentError(
            f"-j {j}: expected [min_nodes:]NODESxPROCS_PER_NODE, e.g. 1x2 or 1:2x4") from None
    if nproc < 1:
        raise ComponentArgumentError(f"-j {j}: nproc_per_node must be >= 1; pass e.g. -j 1x2")
    if max_nodes < 1 or min_nodes < 1 or min_nodes > max_nodes:
        raise ComponentArgumentError(
            f"-j {j}: need 1 <= min_nodes <= nodes; pass e.g. -j 2x2 or -j 1:2x2")
    return min_nodes, max_nodes, nproc


def check_launch_specs(h: str | None, mounts: list[str] | None) -> specs.Resource | None:
    """The named resource ``h`` (None without one); ComponentArgumentError (one line) for a
    named resource TorchX does not know or a ``--mounts`` spec it cannot parse, where TorchX
    itself would end in a traceback."""
    resource = None
    if h is not None:
        try:
            resource = specs.resource(h=h)  # named_resources[h] warns on TorchX main
        except KeyError as err:
            raise ComponentArgumentError(f"-h {h}: {err.args[0]}") from None
    if mounts:
        try:
            specs.parse_mounts(mounts)
        except (KeyError, ValueError) as err:
            detail = f"no {err.args[0]}=" if err.args[0] in ("src", "dst") else err.args[0]
            raise ComponentArgumentError(
                f"--mounts {','.join(mounts)}: {detail}; expected "
                "type=bind|volume|device,src=SOURCE,dst=/PATH[,readonly], e.g. "
                "type=volume,src=my-claim,dst=/data") from None
    return resource


def check_kill_point(env: dict[str, str] | None, world_size: int) -> None:
    """Raise ConfigError for a ``TRAINERS_KILL_AT`` in ``env`` that does not parse or names a
    rank the job never has (at most ``world_size`` ranks), so it would never fire."""
    value = (env or {}).get(faults.ENV_VAR, "")
    point = faults.kill_point(value)
    if point is not None and point.rank >= world_size:
        raise ConfigError(f"{faults.ENV_VAR}={value} names rank {point.rank}, but the job has "
                          f"ranks 0-{world_size - 1}; pass a rank below {world_size}")


def rendezvous_port(port: int, max_nodes: int) -> int:
    """The c10d rendezvous port of a job that may span ``max_nodes`` nodes.

    ``port`` 0 on a multi-node job picks a port that is free on the submitting machine now, so
    that concurrent multi-node jobs sharing a host (``local_cwd``, whose "nodes" are all this
    machine, or Slurm nodes shared between jobs) each host their own store instead of joining
    the first job's store on a fixed port and failing when it exits. A single-node job gets
    ``port`` unchanged (``dist.torchrun`` then rendezvouses on a free port of its own host).
    """
    if not 0 <= port <= 65535:
        raise ComponentArgumentError(
            f"--rdzv_port {port}: not a TCP port; pass 1-65535, or 0 for a free port")
    if port or max_nodes == 1:
        return port
    with socket.socket() as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])


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
        check_paths: check --data and --output-dir on the submitting machine; turn off when
            they exist only where the job runs
        device_memory_gb: GB of one GPU: the job is refused when the memory planner says a rank
            needs more (a GPU job names this or gpu_type; CPU jobs are checked against
            memMB shared by the node's processes)
        gpu_type: the GPU model instead of device_memory_gb, e.g. a100-80gb, h100, h200
            (python -m trainers.plan --help lists them)
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
) -> specs.AppDef:
    """The AppDef that runs trainer ``trainer`` (``python -m trainers.<trainer> <script_args>``)
    under torchrun via dist.torchrun (dist.ddp on torchx 0.7.0).

    Without ``--output-dir`` the run writes to ``outputs/<app id>``, so a scheduler retry of
    the same job resumes from its own checkpoints (the trainers default to ``--resume auto``).
    The trainer's placement check (its ``check_placement``: one process per
    GPU, or model_parallel's one process per node) sees the processes and GPUs per node (those
    of the named resource ``h`` when given); ``cpu`` and ``memMB`` of 0 take the per-node
    defaults of :func:`trainers.torchfree.resources.node_request`; a ``TRAINERS_KILL_AT`` in
    ``env`` is checked as the trainers will read it.
    ``max_retries`` is both torchrun's in-place restarts and the scheduler's retries.
    The memory pre-flight (:func:`trainers.torchfree.planner.check_fits`) runs against one device
    of ``device_memory_gb`` or of ``gpu_type`` (a GPU job must name one), or on CPU-only jobs
    against the node's memory shared by its processes; models in files (``hf:DIR``,
    ``MODULE:ATTR``) are not checked with ``check_paths`` false.
    """
    min_nodes, max_nodes, nproc = node_range(j)
    resource = check_launch_specs(h, mounts)
    args = list(script_args)
    if not any(a == "--output-dir" or a.startswith("--output-dir=") for a in args):
        args += ["--output-dir", f"outputs/{macros.app_id}"]
    world_sizes = [nodes * nproc for nodes in range(min_nodes, max_nodes + 1)]
    gpus = resource.gpu if resource is not None else gpu
    cpu, memMB = node_request(gpus, cpu, memMB)
    try:
        entry = trainer_table.trainer(trainer)
        cfg = parse_config(args, trainer, world_sizes=world_sizes, check_paths=check_paths)
        entry.check_placement(cfg, nproc, gpus)
        check_kill_point(env, world_sizes[-1])
        node_mb = resource.memMB if resource is not None else memMB
        memory, more = rank_memory(nproc, gpus, node_mb, device_memory_gb, gpu_type)
        # A model in files (hf:DIR, MODULE:ATTR) is read only where the paths are checked.
        if check_paths or model_kind(cfg.model) == "builtin":
            try:
                check_fits(cfg, trainer, world_sizes[0], nproc, min_nodes, memory,
                           "cuda" if gpus > 0 else "cpu")
            except ConfigError as err:
                raise ConfigError(f"{err}; or {more}") from None
    except MissingPathError as err:
        raise ComponentArgumentError(
            f"trainers.{trainer}: {err}; if it exists only where the job runs, pass "
            "--check_paths False") from None
    except ConfigError as err:
        raise ComponentArgumentError(f"trainers.{trainer}: {err}") from None
    app = torchrun_app(*args, m=entry.module, image=image, name=trainer, h=h,
                       cpu=cpu, gpu=gpu, memMB=memMB, j=j, env=env, max_retries=max_retries,
                       rdzv_port=rendezvous_port(rdzv_port, max_nodes), mounts=mounts)
    if max_retries:
        restart_in_place(app, max_retries)
    forward_preemption(app, parse_signals(cfg.preemption_signals))
    return app


# Signals torchrun forwards to its workers by default (torch.distributed.run --signals-to-handle).
TORCHRUN_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
# Seconds torchrun waits for its workers to save and exit after forwarding a signal before it
# kills them; the scheduler's own grace period (Slurm signal_grace, Kubernetes
# termination_grace_s) is the bound that matters, so this only has to exceed it.
TORCHRUN_SHUTDOWN_S = 900


def forward_preemption(app: specs.AppDef, signals: tuple[signal.Signals, ...]) -> None:
    """Make torchrun forward the trainers' preemption ``signals`` to its workers (it forwards
    only SIGTERM, SIGINT, SIGHUP and SIGQUIT by default and dies of SIGUSR1) and wait for them
    to save (``PET_SIGNALS_TO_HANDLE``, ``PET_SHUTDOWN_TIMEOUT``); a value the user set in
    ``env`` is kept."""
    names = list(TORCHRUN_SIGNALS) + [s.name for s in signals if s.name not in TORCHRUN_SIGNALS]
    for role in app.roles:
        role.env.setdefault("PET_SIGNALS_TO_HANDLE", ",".join(names))
        role.env.setdefault("PET_SHUTDOWN_TIMEOUT", str(TORCHRUN_SHUTDOWN_S))


def rank_memory(nproc: int, gpus: int, node_mb: int, device_memory_gb: float,
                gpu_type: str | None) -> tuple[int, str]:
    """(bytes one rank may use, how to give it more) for the memory pre-flight.

    A GPU job's rank has one device: of ``device_memory_gb`` or ``gpu_type``, exactly one of
    which it must name; a CPU job's ranks share the node's ``node_mb``.
    """
    if device_memory_gb < 0:
        raise ConfigError(f"--device_memory_gb {device_memory_gb:g} is negative; pass the GB of "
                          "one GPU, e.g. --device_memory_gb 80")
    if gpus == 0:
        if gpu_type is not None or device_memory_gb:
            given = "--gpu_type" if gpu_type is not None else "--device_memory_gb"
            raise ConfigError(f"{given} describes GPUs, but the job asks for none; pass --gpu N "
                              f"(one per process), or drop {given}")
        return (node_mb * 2**20 // nproc,
                f"pass more --memMB (now {node_mb} MB per node, shared by {nproc} processes)")
    if gpu_type is not None and device_memory_gb:
        raise ConfigError(f"--gpu_type {gpu_type} and --device_memory_gb {device_memory_gb:g} "
                          "both give the GPUs' memory; pass one of them")
    if gpu_type is None and not device_memory_gb:
        raise ConfigError(f"--gpu {gpus}: name the GPUs so the job is checked to fit before it "
                          f"is scheduled; pass --gpu_type (one of {', '.join(GPU_MEMORY_GB)}) "
                          "or --device_memory_gb N (GB of one GPU)")
    gb = device_memory_gb or gpu_memory_gb(str(gpu_type))
    return int(gb * GIB), "use GPUs with more memory (--gpu_type or --device_memory_gb)"


def restart_in_place(app: specs.AppDef, max_restarts: int) -> None:
    """Let torchrun restart failed workers ``max_restarts`` times (``--max_restarts``, which
    dist.torchrun does not expose): its command is the ``bash -c`` script of every role."""
    for role in app.roles:
        script = role.args[-1]
        if not script.startswith("torchrun "):
            raise AssertionError(f"dist.torchrun's script no longer starts with torchrun: {script}")
        role.args[-1] = script.replace("torchrun ", f"torchrun --max_restarts {max_restarts} ", 1)
