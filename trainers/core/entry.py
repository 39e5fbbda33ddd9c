"""What every trainer's ``main`` does: parse, join the process group, build, train.

A trainer supplies only ``build(cfg, env, spec) -> Strategy``: its mesh, and its parallelism
applied to the model built on the meta device from ``spec`` (the model's spec, resolved here
once); the loop trains that spec. Bad arguments and errors found while starting exit with one
line; running out of memory prints the anatomy of the job and what to try next.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Sequence

import torch
from torch.distributed.elastic.multiprocessing.errors import record

from trainers.config.parsing import exit_on_config_error, parse_or_exit
from trainers.core.distributed import DistEnv, init_distributed
from trainers.core.loop import StepHook, train
from trainers.core.oom import explain_out_of_memory
from trainers.core.preemption import Notice
from trainers.core.strategy import Strategy
from trainers.models import ModelSpec, spec_of
from trainers.options.tracker_names import check_trackers
from trainers.options.train_config import TrainConfig
from trainers.options.trainer_table import trainer
from trainers.runs.log_setup import configure_logging
from trainers.runs.preemption_signals import exit_status
from trainers.runs.replica_groups import RunFinishedElsewhere, group_run_dir, report_finished
from trainers.runs.run_record import run_record, write_config
from trainers.runs.storage import location

StrategyBuilder = Callable[[TrainConfig, DistEnv, ModelSpec], Strategy]


@record
def run(name: str, build: StrategyBuilder, argv: Sequence[str] | None = None) -> None:
    """Train with the strategy ``build`` makes, as trainer ``name`` of the table of trainers.

    Under torchrun an error that ends a rank is written to the rank's error file (torch's
    elastic ``record``), so torchrun's failure summary names the first failing rank and shows
    its traceback."""
    configure_logging()
    argv = list(sys.argv[1:] if argv is None else argv)
    cfg = parse_or_exit(argv, name)
    with exit_on_config_error(trainer(name).module):
        train_in_group(cfg, name, build, argv=argv)


def train_in_group(cfg: TrainConfig, name: str, build: StrategyBuilder,
                   device: torch.device | None = None, on_step: StepHook | None = None,
                   notice: Notice | None = None, argv: Sequence[str] = ()) -> None:
    """Join (or form) the process group, record the run in ``<output-dir>/config.json``
    (``argv``: the trainer's arguments), build trainer ``name``'s strategy and train; an
    out-of-memory error is explained. ``device``, ``on_step`` and ``notice`` are for launchers
    that own the process group (see :func:`trainers.core.distributed.init_distributed` and
    :func:`trainers.core.loop.train`).

    A run stopped by a preemption signal (its checkpoint saved) leaves the process group and
    exits ``128 + signal`` (:func:`trainers.runs.preemption_signals.exit_status`). A replica
    group's rank 0 that trained to the end tells the lighthouse
    (:meth:`trainers.parallel.fault_tolerant.ReplicaGroupStrategy.close`); so does one that
    finds, starting or later alone in its quorum, that another group trained to the end: it
    stops there (exit 0, nothing more trained; its metrics as it found them).
    The chosen trackers' packages are checked first: where the trainer runs, not where a
    component submits it."""
    check_trackers(cfg.tracker, cfg.tensorboard, packages=True)
    with init_distributed(cfg, device) as env, explain_out_of_memory(cfg, name, env.device):
        spec = spec_of(cfg)  # a model it cannot resolve (or adapt) is refused first
        run_dir = location(cfg.output_dir)
        if cfg.fault_tolerant:  # each replica group writes a run of its own
            run_dir = group_run_dir(run_dir, cfg.replica_group)
        if env.is_main:
            write_config(run_dir, run_record(cfg.to_dict(), name, argv, env.world_size))
        try:
            summary = train(cfg, env, build(cfg, env, spec), spec, run_dir, on_step, notice)
            stopped = False
        except RunFinishedElsewhere as finished:  # no live group to heal from, no step left
            if env.is_main:
                print(finished, flush=True)
            summary, stopped = {}, env.is_main
    if summary.get("preempted"):
        raise SystemExit(exit_status(signal.Signals[summary["preempted"]]))
    if stopped:  # the lighthouse stops once every replica group is done
        report_finished(cfg.lighthouse, cfg.replica_group, cfg.steps)
