"""What each Ray Train worker of ``python -m trainers.on_ray.train`` runs, and the one actor the
workers share across restarts of their group (:class:`Attempts`)."""

from __future__ import annotations

import dataclasses
import importlib
import math
import os
import threading
from pathlib import Path
from typing import Any

from trainers.config.parsing import parse_config
from trainers.options.trainer_table import TRAINERS
from trainers.runs.log_setup import configure_logging

# Read by the loop's restart count (trainers.runs.faults.restart_count), as torchrun's
# TORCHELASTIC_RESTART_COUNT and Slurm's SLURM_RESTART_COUNT are.
RESTART_VAR = "TRAINERS_RAY_RESTART_COUNT"
# The key of a Tune trial's reports that names its workers' placement group (its id in hex).
PLACEMENT_GROUP = "ray_placement_group"


class Attempts:
    """Counts the worker groups a run started: Ray Train 2.60's ``TrainContext`` has no
    attempt number, so the launcher creates one of these as a Ray actor on its own node (where
    Ray Train's controller lives too) and rank 0 of each group asks it which attempt it is."""

    def __init__(self) -> None:
        self.started = 0

    def start(self) -> int:
        """Record a new worker group; return how many started before it."""
        self.started += 1
        return self.started - 1


def attempts_actor() -> Any:
    """A new :class:`Attempts` actor on this driver's node, using no CPU."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    return ray.remote(num_cpus=0, scheduling_strategy=here)(Attempts).remote()


def train_worker(config: dict[str, Any]) -> None:
    """The function every Ray Train worker runs: parse, join Ray's process group, build, train.

    ``config``: ``trainer``, its ``argv``, ``report_every``, ``trial`` and the run's ``attempts``
    actor. Every rank calls ``ray.train.report`` at the same steps (checkpoint steps, every
    ``report_every``-th and, in a Tune ``trial``, every evaluation step); rank 0 attaches the
    committed checkpoint directory. A trial reports from its first evaluation on, each report
    with the newest eval loss (one that is not finite as infinite: a search then ranks a
    diverged run last), and the workers' placement group
    (:data:`PLACEMENT_GROUP`), which ``trainers.tune`` removes when Tune stops the trial. A
    restarted worker group resumes from the checkpoint Ray hands back. When Ray reports that a
    node of the group is being drained (a preemption notice, ``ray.train.get_preemption_info``)
    every rank saves the step they agree on, reports it and waits for Ray to replace the
    group."""
    import ray
    import ray.train
    import ray.train.torch
    import ray.util
    from ray.train import Checkpoint, CheckpointUploadMode

    from trainers.core.entry import train_in_group

    configure_logging()
    name = config["trainer"]
    module = importlib.import_module(TRAINERS[name].module)
    context = ray.train.get_context()
    rank = context.get_world_rank()
    cfg = parse_config(config["argv"], name, world_sizes=[context.get_world_size()],
                       check_paths=False)
    reported = ray.train.get_checkpoint()
    if reported is not None:
        cfg = dataclasses.replace(cfg, resume=reported.path)
    if rank == 0:
        os.environ[RESTART_VAR] = str(ray.get(config["attempts"].start.remote()))
    every, trial = config["report_every"], config["trial"]
    group = ray.util.get_current_placement_group()
    trial_facts = {PLACEMENT_GROUP: group.id.hex()} if trial and group is not None else {}

    last_eval: list[float] = []  # a trial's newest eval loss

    def report(step: int, metrics: dict[str, float], checkpoint: Path | None) -> None:
        evaluated = trial and "eval_loss" in metrics
        if evaluated:
            loss = metrics["eval_loss"]
            last_eval[:] = [loss if math.isfinite(loss) else math.inf]
        if checkpoint is None and not (every and step % every == 0) and not evaluated:
            return
        if trial:  # Tune wants the metric in every report: none before the first evaluation
            if not last_eval:
                return
            metrics = {**metrics, "eval_loss": last_eval[0]}
        attach = Checkpoint.from_directory(str(checkpoint)) if checkpoint and rank == 0 else None
        ray.train.report({"step": step, **metrics, **trial_facts}, checkpoint=attach,
                         checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD)

    def node_drained() -> bool:  # a collective of Ray's: every rank asks after every step
        return ray.train.get_preemption_info() is not None

    device = ray.train.torch.get_device()
    try:
        train_in_group(cfg, name, module.build, device if device.type == "cuda" else None,
                       report, node_drained, argv=config["argv"])
    except SystemExit:
        # Preempted (the loop's only SystemExit): the step is saved and reported. Ray Train
        # 2.60 ends the run when a worker function returns, even during a preemption, and
        # charges a raised error to --max-failures (ray-project/ray#64360 chose "keep training
        # after the just-in-time checkpoint"), so the worker stays alive until Ray tears the
        # group down at the drain's deadline and restarts it on the preemption budget
        # (FailureConfig.max_preemption_failures).
        threading.Event().wait()
