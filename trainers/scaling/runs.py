"""The runs of a ``trainers.scaling`` measurement: its options, the sizes it runs at and each
run's trainer arguments, checked by the trainer's own parser before anything runs (the
``scaling`` component checks them at submission). Plain Python without torch.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

from trainers.config.parsing import OneLineParser, parse_config, without_option
from trainers.errors import ConfigError
from trainers.options.train_config import TrainConfig
from trainers.runs.storage import location

PROG = "trainers.scaling"
# The trainers measured: each also runs on 1 process (a pipeline needs 2 stages or more).
MEASURED = ("ddp", "fsdp", "tensor_parallel")
# Options the measurement sets for every run: given after -- they are refused.
OWNED = ("--steps", "--profile-steps", "--output-dir", "--resume", "--checkpoint-every",
         "--eval-every")
WARMUP_STEPS = 3  # the trainer's summary also skips these


@dataclass(frozen=True)
class Options:
    """The measurement's options (``--help``)."""

    trainer: str
    nproc: int
    nodes: int
    node_rank: int
    rdzv_endpoint: str
    run_id: str
    steps: int
    profile_steps: int
    output_dir: str


@dataclass(frozen=True)
class Size:
    """One run of the measurement: ``nodes`` x ``nproc`` processes, in ``dirname``."""

    name: str
    nodes: int
    nproc: int
    dirname: str

    @property
    def world(self) -> int:
        return self.nodes * self.nproc


def build_parser(description: str = "") -> argparse.ArgumentParser:
    """The measurement's own options (before ``--``)."""
    parser = OneLineParser(prog=PROG, description=description)
    parser.add_argument("--trainer", default="ddp", choices=MEASURED,
                        help="the trainer to measure (default ddp)")
    parser.add_argument("--nproc", type=int, default=0,
                        help="processes per node in the larger runs (0: the visible GPUs, "
                             "else 2)")
    parser.add_argument("--nodes", type=int, default=1,
                        help="nodes of the largest run (the scaling component sets it)")
    parser.add_argument("--node-rank", type=int, default=0,
                        help="this node's rank among --nodes; node 0 runs every size and "
                             "reports, the others join the multi-node run only")
    parser.add_argument("--rdzv-endpoint", default="",
                        help="HOST:PORT of the multi-node run's c10d rendezvous (--nodes > 1)")
    parser.add_argument("--run-id", default="scaling",
                        help="the multi-node run's rendezvous id (the same on every node)")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps per run")
    parser.add_argument("--profile-steps", type=int, default=5,
                        help="the last steps of each run that torch.profiler records")
    parser.add_argument("--output-dir", default="outputs/scaling",
                        help="where the runs, scaling.json and scaling.png go (a path or "
                             "bucket URL; shared by the nodes)")
    return parser


def check_options(opts: Options) -> None:
    """ConfigError (one line naming the fix) for options that cannot measure anything."""
    if opts.nproc < 1:
        raise ConfigError(f"--nproc must be positive, got {opts.nproc}")
    if opts.nodes < 1 or not 0 <= opts.node_rank < opts.nodes:
        raise ConfigError(f"--nodes {opts.nodes} --node-rank {opts.node_rank}: pass --nodes "
                          ">= 1 and a --node-rank below it")
    if opts.nproc * opts.nodes < 2:
        raise ConfigError("1 process is the baseline: pass --nproc 2 (or more), or --nodes 2")
    if opts.nodes > 1 and not opts.rdzv_endpoint:
        raise ConfigError(f"--nodes {opts.nodes}: pass --rdzv-endpoint HOST:PORT of node 0 "
                          "(the scaling component passes it)")
    if opts.profile_steps < 1:
        raise ConfigError(f"--profile-steps must be positive, got {opts.profile_steps}; pass "
                          "e.g. 5")
    least = WARMUP_STEPS + 2 + opts.profile_steps + 1
    if opts.steps < least:
        raise ConfigError(f"--steps {opts.steps} leaves no timed steps besides {WARMUP_STEPS} "
                          f"warm-up, the profiler's warm-up and {opts.profile_steps} profiled "
                          f"ones; pass --steps {least} or more")


def sizes(opts: Options) -> list[Size]:
    """The runs in the order node 0 makes them: the multi-node one first (the other nodes wait
    for no one), then 1 process, then ``--nproc`` processes."""
    runs = []
    if opts.nodes > 1:
        runs.append(Size(f"{opts.nodes} nodes x {opts.nproc}", opts.nodes, opts.nproc,
                         f"nodes{opts.nodes}x{opts.nproc}"))
    runs.append(Size("1 process", 1, 1, "nproc1"))
    if opts.nproc > 1:
        runs.append(Size(f"{opts.nproc} processes", 1, opts.nproc, f"nproc{opts.nproc}"))
    return runs


def run_args(trainer_args: Sequence[str], cfg: TrainConfig, size: Size, largest: Size,
             opts: Options) -> list[str]:
    """The trainer's arguments for ``size``: the user's, its batch (the largest run's per
    data-parallel replica), and the measurement's own options."""
    per_replica = cfg.batch_size // cfg.dp_size(largest.world)
    args = without_option(trainer_args, "--batch-size")
    if size.world == 1:  # no model parallelism in the baseline
        args = without_option(args, "--tp", "--pp", "--dp")
    dp = 1 if size.world == 1 else cfg.dp_size(size.world)
    return args + ["--batch-size", str(per_replica * dp), "--steps", str(opts.steps),
                   "--profile-steps", str(opts.profile_steps), "--output-dir",
                   str(location(opts.output_dir) / size.dirname), "--resume", "none",
                   "--checkpoint-every", "0", "--eval-every", "0"]


def check_runs(opts: Options, trainer_args: Sequence[str], check_paths: bool = True
               ) -> tuple[TrainConfig, dict[Size, list[str]]]:
    """The trainer's configuration for the largest run, and every run's arguments, each
    checked by the trainer's own parser at its size (ConfigError, one line, before anything
    runs); ``check_paths``: also the data and output directory on this machine."""
    for arg in trainer_args:
        if arg.split("=")[0] in OWNED:
            raise ConfigError(f"{arg.split('=')[0]} is set by {PROG} for each run; pass "
                              f"{PROG}'s own --steps, --profile-steps or --output-dir before "
                              "--, and drop it from the trainer's options")
    runs = sizes(opts)
    largest = max(runs, key=lambda s: s.world)
    cfg = parse_config(trainer_args, opts.trainer, world_sizes=[largest.world],
                       check_paths=check_paths, reach_stores=check_paths)
    if cfg.batch_size % cfg.dp_size(largest.world):
        raise ConfigError(f"--batch-size {cfg.batch_size} does not divide over "
                          f"{cfg.dp_size(largest.world)} replicas")
    checked = {}
    for size in runs:
        args = run_args(trainer_args, cfg, size, largest, opts)
        try:
            parse_config(args, opts.trainer, world_sizes=[size.world], check_paths=check_paths,
                         reach_stores=check_paths)
        except ConfigError as err:
            raise ConfigError(f"the {size.name} run cannot run: {err}") from None
        checked[size] = args
    return cfg, checked
