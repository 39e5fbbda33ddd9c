"""What every component shares: validate the trainer's arguments, then build on ``dist.ddp``.

Each component is one ``def`` (TorchX reads its signature and docstring) that passes its
arguments to :func:`trainer_app` with the name of its trainer in the table of trainers
(:mod:`trainers.spec.registry`). Validation uses the trainers' own parser
(:func:`trainers.spec.config.parse_config`) for every data-parallel size the job's node range
allows, so a bad argument fails here, in one line, before anything is scheduled.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

from torchx import specs
from torchx.components import dist
from torchx.specs.api import macros

from components.errors import ComponentArgumentError
from trainers.spec import faults, registry
from trainers.spec.config import parse_config
from trainers.spec.errors import ConfigError
from trainers.spec.models import model_kind
from trainers.spec.planner import GIB, check_fits

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


def check_launch_specs(h: str | None, mounts: list[str] | None) -> None:
    """Raise ComponentArgumentError (one line) for a named resource TorchX does not know or a
    ``--mounts`` spec it cannot parse, where TorchX itself would end in a traceback."""
    if h is not None and h not in specs.named_resources:
        try:
            specs.named_resources[h]
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
    ``port`` unchanged (``dist.ddp`` then rendezvouses on a free port of its own host).
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
        cpu: CPUs per node
        gpu: GPUs per node (set to the processes per node on GPU hosts)
        memMB: memory per node in MB
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
        device_memory_gb: memory of one device (GPU); the job is refused when the memory
            planner says a rank needs more (0: CPU jobs are checked against memMB shared by
            the node's processes, GPU jobs are not checked)
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
) -> specs.AppDef:
    """The AppDef that runs trainer ``trainer`` (``python -m trainers.<trainer> <script_args>``)
    under torchrun via dist.ddp.

    Without ``--output-dir`` the run writes to ``outputs/<app id>``, so a scheduler retry of
    the same job resumes from its own checkpoints (the trainers default to ``--resume auto``).
    The trainer's placement check (its registry entry's ``check_placement``) sees the
    processes and GPUs per node; a ``TRAINERS_KILL_AT`` in ``env`` is checked as the trainers
    will read it.
    ``max_retries`` is both torchrun's in-place restarts and the scheduler's retries.
    The memory pre-flight (:func:`trainers.spec.planner.check_fits`) runs against
    ``device_memory_gb`` per rank, or on CPU-only jobs against the node's ``memMB`` shared by
    its processes; GPU jobs without ``device_memory_gb`` (or with a named resource ``h``) are
    not checked, nor are models in files (``hf:DIR``, ``MODULE:ATTR``) with
    ``check_paths`` false.
    """
    min_nodes, max_nodes, nproc = node_range(j)
    args = list(script_args)
    if not any(a == "--output-dir" or a.startswith("--output-dir=") for a in args):
        args += ["--output-dir", f"outputs/{macros.app_id}"]
    world_sizes = [nodes * nproc for nodes in range(min_nodes, max_nodes + 1)]
    try:
        entry = registry.trainer(trainer)
        cfg = parse_config(args, trainer, world_sizes=world_sizes, check_paths=check_paths)
        if entry.check_placement is not None:
            entry.check_placement(cfg, nproc, gpu)
        check_kill_point(env, world_sizes[-1])
        memory = (device_memory_gb * GIB if device_memory_gb > 0
                  else memMB * 2**20 / nproc if gpu == 0 and h is None else 0)
        # A model in files (hf:DIR, MODULE:ATTR) is read only where the paths are checked.
        if memory and (check_paths or model_kind(cfg.model) == "builtin"):
            check_fits(cfg, trainer, world_sizes[0], nproc, min_nodes,
                       int(memory), "cuda" if gpu > 0 else "cpu")
    except ConfigError as err:
        raise ComponentArgumentError(f"trainers.{trainer}: {err}") from None
    check_launch_specs(h, mounts)
    app = dist.ddp(*args, m=entry.module, image=image, name=trainer, h=h,
                   cpu=cpu, gpu=gpu, memMB=memMB, j=j, env=env, max_retries=max_retries,
                   rdzv_port=rendezvous_port(rdzv_port, max_nodes), mounts=mounts)
    if max_retries:
        restart_in_place(app, max_retries)
    return app


def restart_in_place(app: specs.AppDef, max_restarts: int) -> None:
    """Let torchrun restart failed workers ``max_restarts`` times (``--max_restarts``, which
    dist.ddp does not expose): its command is the ``bash -c`` script of every role."""
    for role in app.roles:
        script = role.args[-1]
        if not script.startswith("torchrun "):
            raise AssertionError(f"dist.ddp's command no longer starts with torchrun: {script}")
        role.args[-1] = script.replace("torchrun ", f"torchrun --max_restarts {max_restarts} ", 1)
