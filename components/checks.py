"""The checks every component runs on its arguments before it builds an AppDef: each raises
ComponentArgumentError (or the trainers' ConfigError, which :func:`check_trainer` turns into
one) with one line naming the fix, where TorchX or the job would otherwise fail later."""

from __future__ import annotations

from torchx import specs
from torchx.components import dist

from components.cpu_memory import CpuMemory
from components.errors import ComponentArgumentError
from trainers.config.parsing import parse_config
from trainers.errors import ConfigError, MissingPathError
from trainers.options import trainer_table
from trainers.options.model_names import in_store, model_kind
from trainers.options.train_config import TrainConfig
from trainers.planning.planner import GIB, check_fits, job_candidate
from trainers.runs import faults
from trainers.sizing.resources import GPU_MEMORY_GB, gpu_memory_gb


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


def check_trainer(trainer: str, args: list[str], *, nodes: range, nproc: int, gpus: int,
                  node_mb: int, env: dict[str, str] | None, check_paths: bool,
                  device_memory_gb: float, gpu_type: str | None
                  ) -> tuple[TrainConfig, CpuMemory | None]:
    """Trainer ``trainer``'s configuration from ``args``, checked for a job of ``nodes`` nodes
    (any number in the range) of ``nproc`` processes, ``gpus`` GPUs and ``node_mb`` MB each;
    ComponentArgumentError (one line naming the fix) when it cannot run there. With it, a CPU
    job's memory for the scheduler to price (:mod:`components.cpu_memory`; None for a GPU job
    or a model not read).

    The trainer's own parser checks ``args`` at every data-parallel size the range allows; its
    placement check (``check_placement``: one process per GPU, or model_parallel's one process
    per node) sees ``nproc`` and ``gpus``; a ``TRAINERS_KILL_AT`` in ``env`` is checked as the
    trainers will read it; the memory pre-flight (:func:`trainers.planning.planner.check_fits`)
    runs here against one device of ``device_memory_gb`` or of ``gpu_type`` (a GPU job must
    name one); a CPU job's against ``node_mb`` shared by the node's processes (see
    :func:`rank_memory`) is made here and raised by the schedulers that enforce the request.
    Models in files (``hf:DIR``, ``MODULE:ATTR``) are read, and so checked for memory, only
    with ``check_paths``, and never from a bucket (``hf:s3://``). URLs are checked for their
    scheme only (the scheduler reaches the bucket when it submits).
    """
    cpu_memory = None
    world_sizes = [n * nproc for n in nodes]
    try:
        entry = trainer_table.trainer(trainer)
        # Buckets are reached at submit (the scheduler's pre-flight), never for a dry run.
        cfg = parse_config(args, trainer, world_sizes=world_sizes, check_paths=check_paths,
                           reach_stores=False)
        entry.check_placement(cfg, nproc, gpus)
        check_kill_point(env, world_sizes[-1])
        memory, more = rank_memory(nproc, gpus, node_mb, device_memory_gb, gpu_type)
        if (check_paths and not in_store(cfg.model)) or model_kind(cfg.model) == "builtin":
            refusal = None
            try:
                check_fits(cfg, trainer, world_sizes[0], nproc, nodes[0], memory,
                           "cuda" if gpus > 0 else "cpu")
            except ConfigError as err:
                if gpus > 0:
                    raise ConfigError(f"{err}; or {more}") from None
                refusal = f"trainers.{trainer}: {err}; or {more}"
            if gpus == 0:
                rank_bytes = job_candidate(cfg, trainer, world_sizes[0], "cpu").peak_bytes
                cpu_memory = CpuMemory(trainer, cfg.model, rank_bytes, nproc, refusal)
    except MissingPathError as err:
        raise ComponentArgumentError(
            f"trainers.{trainer}: {err}; if it exists only where the job runs, pass "
            "--check_paths False") from None
    except ConfigError as err:
        raise ComponentArgumentError(f"trainers.{trainer}: {err}") from None
    return cfg, cpu_memory


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
