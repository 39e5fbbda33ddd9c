"""Hyperparameter search on Ray Tune: ``python -m trainers.tune --help``.

``python -m trainers.tune --trainer fsdp --workers 2 --trials 8 --search lr=loguniform:1e-4:1e-2
--search batch-size=choice:8,16 -- --model small --steps 400 --output-dir runs/search1``

Each trial is one run of the chosen trainer under Ray Train (``python -m trainers.on_ray.train``'s
path: a ``TorchTrainer`` of ``--workers`` workers), started by a driver function that Ray Tune
runs per trial (Ray Train V2's Tune integration), which passes the trial's draw of each
``--search`` expression (:mod:`trainers.tune.search_space`) to the trainer as
``--OPTION VALUE`` after the fixed trainer options given after ``--``. Every evaluation's eval
loss is reported to Tune (``ray.tune.integration.ray_train.TuneReportCallback``), where
asynchronous successive halving (ASHA) stops a trial whose eval loss at a rung (``--grace-period``
steps, then that times ``--reduction-factor`` ...) is outside the best 1/``--reduction-factor``
of those seen at that rung. ``--max-concurrent`` trials run at once.

The search directory is the trainer's ``--output-dir``: Tune's experiment is there and each
trial's run directory (checkpoints, metrics.jsonl, trackers) is ``<dir>/<trial>/run``. Rerunning
the same command on the same directory resumes the search (``Tuner.restore``): finished trials
are kept, interrupted ones resume from their newest checkpoint. At the end the trials are
printed as a table, with the best configuration as a complete ``torchx run`` command, and their
curves are drawn by ``trainers.tools.plot`` into ``<dir>/trials.png``.

The cluster options (``--address``, ``--num-cpus``, ``--cpus-per-worker``,
``--gpus-per-worker``, ``--max-failures``) are ``trainers.on_ray.train``'s, for each trial.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainers.config.parsing import (
    OneLineParser,
    exit_on_config_error,
    split_at_dashes,
    without_option,
)
from trainers.errors import ConfigError
from trainers.on_ray.train import (
    SERVED,
    LaunchOptions,
    add_launch_arguments,
    check_launch,
    on_cluster,
    torch_trainer,
)
from trainers.on_ray.worker import PLACEMENT_GROUP
from trainers.runs.log_setup import configure_logging
from trainers.tune.search_space import (
    Axis,
    SearchOptions,
    check_search,
    grid_size,
)

PROG = "trainers.tune"
METRIC = "eval_loss"
SEARCH_RECORD = "search.json"  # the command's search, to refuse resuming another one
PLOT = "trials.png"
# What each trial's driver function reserves: memory only, no CPU, so that it takes no CPU its
# workers need and can sit on a head node without CPUs (Ray's bundles cannot be empty).
DRIVER_MEMORY = 256 * 2**20


@dataclass(frozen=True)
class Search:
    """What ``python -m trainers.tune`` was asked: the cluster ``launch`` options of each
    trial, the searched ``axes``, the fixed ``trainer_args`` (without ``--output-dir``), the
    search directory and the search's own options."""

    launch: LaunchOptions
    axes: list[Axis]
    trainer_args: list[str]
    directory: Path
    options: SearchOptions
    grace_period: int
    max_steps: int
    seed: int | None

    def record(self) -> dict[str, Any]:
        """What a resumed search must agree with (``search.json``)."""
        return {"trainer": self.launch.trainer, "workers": self.launch.workers,
                "search": [axis.text() for axis in self.axes], "trials": self.options.trials,
                "trainer_args": self.trainer_args}


def build_tune_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog=PROG, description=__doc__.splitlines()[0],
                           usage=f"python -m {PROG} --trainer {'|'.join(SERVED)} --workers W "
                                 "--search OPTION=KIND:ARGS [--search ...] [options] -- "
                                 "<fixed trainer options>",
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_launch_arguments(parser)
    parser.add_argument("--search", action="append", default=[], metavar="OPTION=KIND:ARGS",
                        help="a searched trainer option: KIND loguniform:LO:HI, uniform:LO:HI, "
                             "randint:LO:HI, choice:A,B or grid:A,B (repeatable)")
    parser.add_argument("--trials", type=int, default=4,
                        help="samples of the search space (each grid multiplies them: every "
                             "grid value runs in every sample)")
    parser.add_argument("--max-concurrent", type=int, default=0,
                        help="trials running at once (0: as many as the cluster places)")
    parser.add_argument("--grace-period", type=int, default=0,
                        help="steps every trial runs before ASHA may stop it (0: the first "
                             "evaluation, --eval-every)")
    parser.add_argument("--reduction-factor", type=float, default=2.0,
                        help="ASHA keeps the best 1/F of the trials at each rung and places "
                             "rungs F times apart")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed of the search's draws (the same seed draws the same trials)")
    return parser


def parse_args(argv: Sequence[str]) -> Search:
    """The :class:`Search` of ``argv``; ConfigError (one line) for anything that cannot run."""
    launcher_args, trainer_args = split_at_dashes(argv)
    ns = build_tune_parser().parse_args(launcher_args)
    launch, cfg, _ = check_launch(ns, trainer_args)
    options = SearchOptions(ns.trials, ns.max_concurrent, ns.grace_period, ns.reduction_factor)
    axes, grace = check_search(ns.search, options, launch.trainer, trainer_args, launch.workers,
                               cfg)
    return Search(launch, axes, without_option(trainer_args, "--output-dir"), Path(cfg.output_dir),
                  options, grace, cfg.steps, ns.seed)


def trial_args(axes: Sequence[Axis], config: dict[str, Any]) -> list[str]:
    """A trial's searched options as trainer arguments."""
    return [arg for axis in axes for arg in (axis.flag, axis.render(config[axis.option]))]


def run_trial(config: dict[str, Any], search: Search) -> None:
    """The driver function Tune runs for each trial: the trainer under Ray Train on the
    trial's draw ``config``, its run directory ``<search directory>/<trial id>/run`` (inside
    the trial's directory in Tune's storage), its reports forwarded to Tune."""
    from ray import tune
    from ray.tune.integration.ray_train import TuneReportCallback

    run_dir = search.directory / tune.get_context().get_trial_id() / "run"
    argv = [*search.trainer_args, *trial_args(search.axes, config), "--output-dir", str(run_dir)]
    torch_trainer(search.launch, run_dir, argv, trial=True,
                  callbacks=[TuneReportCallback()]).fit()


def placement_group_remover() -> Any:
    """A Tune callback that removes an ended trial's worker placement group, if it is left.

    Why: when ASHA stops a trial, Tune ends the trial's actor, and with it the Ray Train
    controller it owns, before the controller can remove its workers' placement group. Ray
    Train 2.60 leaves that to a detached ``PlacementGroupCleaner``, which asks the dashboard's
    State API whether the controller is alive; without a dashboard (a cluster started without
    ``ray[default]``, as here) it never learns, and each stopped trial keeps its workers' CPUs
    reserved until the search ends, which starves the next trials. The workers report their
    placement group (:data:`trainers.on_ray.worker.PLACEMENT_GROUP`) with each evaluation."""
    from ray import tune
    from ray._raylet import PlacementGroupID  # Ray's own id type, as ray.util.placement_group
    from ray.util.placement_group import (
        PlacementGroup,
        placement_group_table,
        remove_placement_group,
    )

    class RemovePlacementGroup(tune.Callback):
        def _remove(self, trial: Any) -> None:
            group_hex = (trial.last_result or {}).get(PLACEMENT_GROUP)
            if not group_hex:
                return
            group = PlacementGroup(PlacementGroupID.from_hex(group_hex))
            if placement_group_table(group).get("state") not in (None, "REMOVED"):
                remove_placement_group(group)

        def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any,
                              **info: Any) -> None:
            self._remove(trial)

        def on_trial_error(self, iteration: int, trials: list[Any], trial: Any,
                           **info: Any) -> None:
            self._remove(trial)

    return RemovePlacementGroup()


def _domain(axis: Axis) -> Any:
    from ray import tune

    low, high = axis.values[0], axis.values[-1]
    if axis.kind == "loguniform":
        return tune.loguniform(float(low), float(high))
    if axis.kind == "uniform":
        return tune.uniform(float(low), float(high))
    if axis.kind == "randint":
        return tune.randint(int(low), int(high) + 1)  # Tune's upper end is excluded
    if axis.kind == "choice":
        return tune.choice(list(axis.values))
    return tune.grid_search(list(axis.values))


def _trial_dirname(trial: Any) -> str:
    return str(trial.trial_id)


def tuner(search: Search) -> Any:
    """A new Tuner of ``search``, or the interrupted one in its directory, restored."""
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.basic_variant import BasicVariantGenerator

    trainable = tune.with_resources(tune.with_parameters(run_trial, search=search),
                                    {"memory": DRIVER_MEMORY})
    record_file = search.directory / SEARCH_RECORD
    if tune.Tuner.can_restore(str(search.directory)):
        recorded = json.loads(record_file.read_text()) if record_file.is_file() else {}
        if recorded != search.record():
            raise ConfigError(f"--output-dir {search.directory} holds another search "
                              f"({recorded.get('search')}); pass a new --output-dir, or the "
                              "same options to resume it")
        print(f"{PROG}: resuming the search in {search.directory}", flush=True)
        return tune.Tuner.restore(str(search.directory), trainable=trainable,
                                  resume_unfinished=True)
    search.directory.mkdir(parents=True, exist_ok=True)
    record_file.write_text(json.dumps(search.record(), indent=1) + "\n")
    return tune.Tuner(
        trainable,
        param_space={axis.option: _domain(axis) for axis in search.axes},
        tune_config=tune.TuneConfig(
            metric=METRIC, mode="min", num_samples=search.options.trials,
            search_alg=BasicVariantGenerator(max_concurrent=search.options.max_concurrent,
                                             random_state=search.seed),
            scheduler=ASHAScheduler(time_attr="step", max_t=search.max_steps,
                                    grace_period=search.grace_period,
                                    reduction_factor=search.options.reduction_factor),
            trial_dirname_creator=_trial_dirname),
        run_config=tune.RunConfig(name=search.directory.name,
                                  storage_path=str(search.directory.parent), verbose=1,
                                  callbacks=[placement_group_remover()]))


@dataclass(frozen=True)
class TrialRow:
    """One line of the trials' table."""

    trial: str
    values: dict[str, str]
    steps: int
    eval_loss: float
    outcome: str
    run_dir: Path


def trial_rows(results: Any, search: Search) -> list[TrialRow]:
    """The table's rows from Tune's ``ResultGrid``, in trial order."""
    rows = []
    for result in results:
        metrics = result.metrics or {}
        step = int(metrics.get("step", 0))
        if result.error is not None:
            lines = str(result.error).strip().splitlines() or [type(result.error).__name__]
            outcome = f"failed: {lines[-1][:80]}"
        elif step < search.max_steps:
            outcome = f"stopped by ASHA at step {step}"
        else:
            outcome = "completed"
        config = result.config or {}
        rows.append(TrialRow(
            trial=Path(result.path).name,
            values={axis.option: axis.render(config[axis.option]) for axis in search.axes
                    if axis.option in config},
            steps=step, eval_loss=float(metrics.get(METRIC, math.nan)), outcome=outcome,
            run_dir=Path(result.path) / "run"))
    return sorted(rows, key=lambda row: row.trial)


def best_row(rows: Sequence[TrialRow]) -> TrialRow | None:
    """The trial with the lowest last eval loss (ties: the longer run), if any reported one."""
    ranked = [row for row in rows if math.isfinite(row.eval_loss)]
    return min(ranked, key=lambda row: (row.eval_loss, -row.steps)) if ranked else None


def table(rows: Sequence[TrialRow], axes: Sequence[Axis]) -> str:
    """The trials as a Markdown table."""
    names = [axis.option for axis in axes]
    lines = ["| trial | " + " | ".join(names) + " | steps | eval loss | outcome |",
             "| --- | " + " | ".join("---" for _ in names) + " | --- | --- | --- |"]
    for row in rows:
        values = " | ".join(row.values.get(name, "") for name in names)
        lines.append(f"| {row.trial} | {values} | {row.steps} | {row.eval_loss:.4f} | "
                     f"{row.outcome} |")
    return "\n".join(lines)


def best_command(search: Search, row: TrialRow) -> str:
    """The ``torchx run`` command that trains the best configuration on one node."""
    trainer = search.launch.trainer
    args = [*search.trainer_args,
            *(arg for axis in search.axes for arg in (axis.flag, row.values[axis.option])),
            "--output-dir", str(search.directory / "best")]
    return (f"torchx run -s local_cwd components/{trainer}.py:{trainer} "
            f"-j 1x{search.launch.workers} -- {shlex.join(args)}")


def plot_trials(rows: Sequence[TrialRow], directory: Path) -> str:
    """Draw the trials that trained with ``trainers.tools.plot`` into ``directory/trials.png``;
    return what was done (or why not) as a line."""
    runs = [str(row.run_dir) for row in rows if (row.run_dir / "metrics.jsonl").is_file()]
    if not runs:
        return "no trial wrote metrics to plot"
    from trainers.tools import plot

    try:
        plot.main([*runs, "-o", str(directory / PLOT)])
    except SystemExit as err:  # trainers.tools.plot's one-line errors (e.g. matplotlib missing)
        return f"not plotted (exit {err.code}): python -m trainers.tools.plot {' '.join(runs)}"
    return f"curves of the trials: {directory / PLOT}"


def main(argv: Sequence[str] | None = None) -> None:
    configure_logging()
    with exit_on_config_error(PROG):
        search = parse_args(sys.argv[1:] if argv is None else argv)
        with on_cluster(search.launch):
            print(f"{PROG}: {search.options.trials * grid_size(search.axes)} trials of "
                  f"trainers.{search.launch.trainer} on {search.launch.workers} worker(s) each, "
                  f"in {search.directory}", flush=True)
            results = tuner(search).fit()
    rows = trial_rows(results, search)
    print(table(rows, search.axes), flush=True)
    best = best_row(rows)
    if best is None:
        sys.stderr.write(f"{PROG}: error: no trial reported an eval loss; see the trials' "
                         f"logs in {search.directory}\n")
        raise SystemExit(1)
    values = " ".join(f"{name}={value}" for name, value in best.values.items())
    print(f"best: {best.trial} ({values}): eval loss {best.eval_loss:.4f} at step {best.steps}")
    print(f"train it: {best_command(search, best)}")
    print(plot_trials(rows, search.directory), flush=True)

