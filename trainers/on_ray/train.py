"""The trainers under Ray Train: ``python -m trainers.on_ray.train --help``.

``python -m trainers.on_ray.train --trainer ddp --workers 2 [--address HOST:PORT] -- --model tiny``

Ray Train's ``TorchTrainer`` starts one worker process per rank, places them on the cluster,
forms the process group (gloo on CPU, nccl with ``--gpus-per-worker 1``) and, after a failure,
restarts the whole worker group up to ``--max-failures`` times. Inside each worker the
trainer's own ``build`` wraps the model and the shared loop trains, as under torchrun: the
trainer joins Ray's process group (:func:`trainers.core.distributed.init_distributed`), and each
committed DCP checkpoint is reported with its step's metrics through ``ray.train.report`` as a
``ray.train.Checkpoint`` where it lies (no copy); ``--report-every K`` also reports the metrics
of every K-th step. (Each report is a barrier that waits for Ray's controller, which collects
one report per worker every 2 s, and Ray keeps only the metrics attached to checkpoints; every
step's metrics are in the run's metrics.jsonl and TensorBoard events as under torchrun.)
The run directory (``--output-dir``) is Ray's experiment directory, so it must be on storage
every node mounts; a restarted worker group resumes from the last reported checkpoint, and a
rerun of the same command from the newest one.

Trainers: ``ddp``, ``fsdp``, ``tensor_parallel`` and ``pipeline`` (each rank one process on
one device, as Ray places workers). ``model_parallel`` drives several devices from one process,
which Ray's one-device-per-worker model does not fit: run it with TorchX or torchrun.

Without ``--address`` a local cluster is started in this process (``--num-cpus`` CPUs) and
stopped at the end; ``--address auto`` joins the cluster this machine belongs to (e.g. inside a
KubeRay head pod), ``HOST:PORT`` the one whose head listens there. Environment variables
``TRAINERS_*`` (e.g. ``TRAINERS_KILL_AT`` for fault injection) are passed on to the workers.

Here: the options and the launch; joining and checking the cluster is
:mod:`trainers.on_ray.cluster`, what each worker runs :mod:`trainers.on_ray.worker`.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from trainers.config.checks import check_locations
from trainers.config.parsing import (
    OneLineParser,
    exit_on_config_error,
    parse_config,
    split_at_dashes,
)
from trainers.errors import ConfigError
from trainers.on_ray.cluster import check_resources, connect, host_port
from trainers.on_ray.worker import attempts_actor, train_worker
from trainers.options.train_config import TrainConfig
from trainers.options.trainer_table import TRAINERS
from trainers.runs.log_setup import configure_logging
from trainers.runs.storage import is_url

PROG = "trainers.on_ray.train"
# The trainers Ray Train runs: those whose registry entry has no reason it cannot.
SERVED = [name for name, entry in TRAINERS.items() if entry.ray is None]


@dataclass(frozen=True)
class LaunchOptions:
    """The launcher's own options (before ``--``)."""

    trainer: str
    workers: int
    address: str | None
    num_cpus: int | None
    cpus_per_worker: float
    gpus_per_worker: int
    max_failures: int
    report_every: int
    skip_resource_check: bool


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog=PROG, description=__doc__.splitlines()[0],
                           usage=f"python -m {PROG} --trainer {'|'.join(SERVED)} --workers N "
                                 "[options] -- <trainer options>",
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_launch_arguments(parser)
    return parser


def add_launch_arguments(parser: argparse.ArgumentParser) -> None:
    """The options that place a run's workers on a Ray cluster (``trainers.tune``'s too)."""
    parser.add_argument("--trainer", required=True,
                        help=f"trainer to run: {' or '.join(SERVED)}")
    parser.add_argument("--workers", type=int, required=True, help="Ray Train workers (ranks)")
    parser.add_argument("--address", default=None,
                        help="Ray cluster to join: HOST:PORT of its head (GCS), ray://HOST:PORT, "
                             "or auto; omitted, a local cluster is started for the run")
    parser.add_argument("--num-cpus", type=int, default=None,
                        help="CPUs of the local cluster started without --address "
                             "(default: all of this machine's)")
    parser.add_argument("--cpus-per-worker", type=float, default=1.0,
                        help="CPUs Ray reserves for each worker")
    parser.add_argument("--gpus-per-worker", type=int, default=0, choices=[0, 1],
                        help="GPUs per worker: 0 trains on CPUs with gloo, 1 on a GPU with nccl")
    parser.add_argument("--max-failures", type=int, default=0,
                        help="worker-group restarts after a failure (-1: no limit); each resumes "
                             "from the last checkpoint")
    parser.add_argument("--report-every", type=int, default=0,
                        help="also report every K-th step's metrics to Ray, not only those of "
                             "checkpoint steps (0: only those)")
    parser.add_argument("--skip-resource-check", action="store_true",
                        help="submit even if the cluster cannot place the workers now (for "
                             "clusters that autoscale)")


def parse_args(argv: Sequence[str]) -> tuple[LaunchOptions, TrainConfig, list[str]]:
    """Split ``argv`` at ``--`` and validate both halves; return the launcher's options, the
    trainer's config and the trainer arguments the workers get (``--output-dir`` absolute).

    Raises :class:`ConfigError` (one line) for anything that cannot run.
    """
    launcher_args, trainer_args = split_at_dashes(argv)
    return check_launch(build_parser().parse_args(launcher_args), trainer_args)


def check_launch(ns: argparse.Namespace,
                 trainer_args: list[str]) -> tuple[LaunchOptions, TrainConfig, list[str]]:
    """Validate the launcher's parsed options ``ns`` (:func:`add_launch_arguments`) and the
    trainer's arguments; return what :func:`parse_args` returns."""
    if ns.trainer not in TRAINERS:
        raise ConfigError(f"--trainer {ns.trainer} is not a trainer; pass " + " or ".join(SERVED))
    if TRAINERS[ns.trainer].ray is not None:
        raise ConfigError(f"--trainer {ns.trainer} cannot run under Ray Train: "
                          f"{TRAINERS[ns.trainer].ray}")
    if ns.workers < 1:
        raise ConfigError(f"--workers must be positive, got {ns.workers}; pass 1 or more")
    if not 0 < ns.cpus_per_worker < math.inf:
        raise ConfigError(f"--cpus-per-worker must be positive, got {ns.cpus_per_worker:g}; "
                          "pass a positive number such as 1")
    if ns.max_failures < -1:
        raise ConfigError(f"--max-failures must be -1 (no limit) or >= 0, got {ns.max_failures}; "
                          "pass one of those")
    if ns.report_every < 0:
        raise ConfigError(f"--report-every must be >= 0, got {ns.report_every}; pass 0 (only "
                          "checkpoint steps) or K")
    if ns.address not in (None, "auto"):
        host_port(ns.address)
    if ns.num_cpus is not None and (ns.address is not None or ns.num_cpus < 1):
        raise ConfigError("--num-cpus sizes the local cluster started without --address; pass a "
                          "positive --num-cpus without --address, or drop it")
    options = LaunchOptions(ns.trainer, ns.workers, ns.address, ns.num_cpus, ns.cpus_per_worker,
                            ns.gpus_per_worker, ns.max_failures, ns.report_every,
                            ns.skip_resource_check)
    cfg = parse_config(trainer_args, options.trainer, world_sizes=[options.workers],
                       reach_stores=False)
    if cfg.device == "cuda" and not options.gpus_per_worker:
        raise ConfigError("--device cuda: the Ray workers get no GPU; pass --gpus-per-worker 1 "
                          "before --")
    if is_url(cfg.output_dir):
        raise ConfigError(f"--output-dir {cfg.output_dir}: Ray Train keeps its experiment "
                          "directory on a file system every node mounts; pass a shared path, or "
                          "run on the bucket with torchx/torchrun")
    if check_locations(cfg):  # the buckets, now that the run is one Ray can serve
        cfg = parse_config(trainer_args, options.trainer, world_sizes=[options.workers])
    run_dir = str(Path(cfg.output_dir).resolve())
    return options, replace(cfg, output_dir=run_dir), [*trainer_args, "--output-dir", run_dir]


def launch(options: LaunchOptions, cfg: TrainConfig, trainer_args: list[str]) -> Any:
    """Run the job on the connected cluster; return Ray's ``Result``."""
    return torch_trainer(options, Path(cfg.output_dir), trainer_args).fit()


def torch_trainer(options: LaunchOptions, run_dir: Path, trainer_args: list[str], *,
                  trial: bool = False, callbacks: Sequence[Any] = ()) -> Any:
    """The ``TorchTrainer`` of one run in ``run_dir`` (its Ray experiment directory) whose
    workers run ``trainer_args``. A Tune ``trial`` also reports every evaluation step's metrics
    and the workers' placement group (:func:`trainers.on_ray.worker.train_worker`); ``callbacks``
    are Ray Train's (``trainers.tune`` passes Tune's report callback)."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    env_vars = {k: v for k, v in os.environ.items() if k.startswith("TRAINERS_")}
    return TorchTrainer(
        train_worker,
        train_loop_config={"trainer": options.trainer, "argv": trainer_args,
                           "report_every": options.report_every, "trial": trial,
                           "attempts": attempts_actor()},
        scaling_config=ScalingConfig(
            num_workers=options.workers, use_gpu=options.gpus_per_worker > 0,
            resources_per_worker={"CPU": options.cpus_per_worker,
                                  "GPU": options.gpus_per_worker}),
        torch_config=TorchConfig(backend="nccl" if options.gpus_per_worker else "gloo"),
        run_config=RunConfig(
            name=run_dir.name, storage_path=str(run_dir.parent),
            # Preemptions restart the group without limit, apart from --max-failures.
            failure_config=FailureConfig(max_failures=options.max_failures,
                                         max_preemption_failures=-1),
            # trainers.core.checkpoint keeps the newest --keep-checkpoints; Ray deletes none.
            checkpoint_config=CheckpointConfig(num_to_keep=None),
            worker_runtime_env={"env_vars": env_vars} if env_vars else None,
            callbacks=list(callbacks)),
    )


def _failure_line(err: BaseException, max_failures: int) -> str:
    """The one line to show for a failed run: a worker's ConfigError as the trainer would
    print it; else the first line of the failure of a rank whose process died (the others'
    errors are their collectives breaking), or of the first rank that failed."""
    failures: dict[int, BaseException] = dict(getattr(err, "worker_failures", None) or {})
    for failure in failures.values():
        cause: BaseException | None = failure
        while cause is not None:
            if isinstance(cause, ConfigError):
                return str(cause)
            cause = getattr(cause, "cause", None) or cause.__cause__
    if not failures:
        lines = str(err).strip().splitlines()
        return f"training failed: {lines[-1] if lines else type(err).__name__}"
    died = [rank for rank, failure in failures.items() if _process_died(failure)]
    rank = min(died or failures)
    lines = str(failures[rank]).strip().splitlines() or [type(failures[rank]).__name__]
    hint = ("" if max_failures else "; pass --max-failures N to have Ray restart the workers "
            "from the last checkpoint")
    return f"training failed: rank {rank}: {lines[0].strip()}{hint}"


def _process_died(failure: BaseException) -> bool:
    """Whether ``failure`` is Ray's report of a worker process that is gone."""
    from ray.exceptions import ActorDiedError, ActorUnavailableError

    return isinstance(failure, (ActorDiedError, ActorUnavailableError)) or \
        isinstance(getattr(failure, "cause", None), (ActorDiedError, ActorUnavailableError))


@contextlib.contextmanager
def on_cluster(options: LaunchOptions) -> Iterator[None]:
    """Join (or start) the Ray cluster of ``options`` and check that it can place the workers
    (unless ``--skip-resource-check``); Ray is shut down on the way out. ConfigError (one line)
    when Ray Train is not installed, there is no cluster, or it cannot place the workers."""
    try:
        import ray
        import ray.train  # noqa: F401 (the extra's package: ray[train])
    except ImportError:
        raise ConfigError("Ray Train is not installed; pip install -e '.[ray]' "
                          "-c constraints/cpu.txt") from None
    connect(options.address, options.num_cpus)
    try:
        if not options.skip_resource_check:
            check_resources(options.workers, options.cpus_per_worker, options.gpus_per_worker,
                            ray.nodes())
        yield
    finally:
        ray.shutdown()  # first, so that no forwarded log line lands after the caller's


def main(argv: Sequence[str] | None = None) -> None:
    configure_logging()
    with exit_on_config_error(PROG):
        options, cfg, trainer_args = parse_args(sys.argv[1:] if argv is None else argv)
        failure = ""
        with on_cluster(options):
            from ray.train import TrainingFailedError

            try:
                result = launch(options, cfg, trainer_args)
            except TrainingFailedError as err:
                failure = _failure_line(err, options.max_failures)
        if failure:
            sys.stderr.write(f"{PROG}: error: {failure}\n")
            raise SystemExit(1)
    checkpoint = result.checkpoint.path if result.checkpoint else None
    metrics = result.metrics or {}
    print(f"{PROG}: finished: step {metrics.get('step')}, loss {metrics.get('loss')}, "
          f"checkpoint {checkpoint}", flush=True)


if __name__ == "__main__":
    main()
