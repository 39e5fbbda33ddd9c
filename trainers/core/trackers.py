"""Experiment trackers behind one interface: TensorBoard, MLflow, W&B (``--tracker``).

Rank 0's :class:`~trainers.core.metrics.MetricsWriter` opens the trackers the config chooses
(:func:`open_trackers`) and gives each the figures it writes to metrics.jsonl, at the same
steps; the run's resolved options as parameters and its directory and git commit as tags when
the tracker's run is new; ``summary.json`` as final metrics and the run's plot
(:mod:`trainers.runs.run_plot`) as an artifact at the end (trackers in
:data:`PLOT_TRACKERS`). A tracker's package is
imported only when it is chosen. Where and under which project a run is reported comes from the
trackers' own environment variables (``MLFLOW_TRACKING_URI``, ``MLFLOW_EXPERIMENT_NAME``,
``WANDB_PROJECT``, ``WANDB_MODE``, ``WANDB_API_KEY``; docs/tracking.md).

A resumed run continues the same tracker run: each tracker's run id is kept in the run
directory's ``trackers.json``. A tracker that fails (a server down, an outage) never stops
training: every call goes through :class:`Guarded`, which logs one warning at the first
failure and drops the tracker for the rest of the attempt; metrics.jsonl stays complete.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

IDS_FILE = "trackers.json"
# The trackers that keep the run's plot as a file (TensorBoard draws the curves itself).
PLOT_TRACKERS = ("mlflow", "wandb")


class Tracker(Protocol):
    """What the metrics writer asks of a tracker; ``run_id`` is kept for a resume."""

    run_id: str | None

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        """Record ``metrics`` at optimizer step ``step``."""

    def log_summary(self, summary: dict[str, Any]) -> None:
        """Record the run's ``summary.json`` contents as final metrics."""

    def log_plot(self, path: Path) -> None:
        """Keep the run's plot (a PNG file at ``path``) with the run."""

    def flush(self) -> None:
        """Make what was recorded so far durable (the writer calls this at checkpoints)."""

    def close(self) -> None:
        """End this attempt's connection to the tracker run (a resume reopens it)."""


class TensorBoardTracker:
    """Events under ``<run>/tensorboard``; every attempt appends a new events file."""

    run_id: str | None = None

    def __init__(self, local: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._tb = SummaryWriter(log_dir=str(local / "tensorboard"))

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self._tb.add_scalar(key, value, step)

    def log_summary(self, summary: dict[str, Any]) -> None:
        """TensorBoard has no run summary: summary.json sits next to its events."""

    def log_plot(self, path: Path) -> None:
        """TensorBoard draws the curves itself."""

    def flush(self) -> None:
        self._tb.flush()

    def close(self) -> None:
        self._tb.close()


class MLflowTracker:
    """An MLflow run in the experiment ``MLFLOW_EXPERIMENT_NAME`` (MLflow's default
    experiment if unset) of the server ``MLFLOW_TRACKING_URI``; ``run_id`` resumes one."""

    def __init__(self, run_id: str | None, name: str, params: dict[str, Any],
                 tags: dict[str, str]) -> None:
        import mlflow

        self._mlflow = mlflow
        run = mlflow.start_run(run_id=run_id, run_name=None if run_id else name)
        self.run_id = run.info.run_id
        if run_id is None:
            mlflow.log_params(params)
            mlflow.set_tags(tags)

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self._mlflow.log_metrics(metrics, step=step)

    def log_summary(self, summary: dict[str, Any]) -> None:
        self._mlflow.log_metrics({f"summary/{key}": value for key, value in _numbers(summary)})
        self._mlflow.log_dict(summary, "summary.json")

    def log_plot(self, path: Path) -> None:
        self._mlflow.log_artifact(str(path))

    def flush(self) -> None:
        """MLflow's calls are synchronous: nothing waits."""

    def close(self) -> None:
        self._mlflow.end_run()


class WandbTracker:
    """A W&B run in ``WANDB_PROJECT`` (``WANDB_MODE=offline``: files under ``<run>/wandb``,
    for ``wandb sync``); ``run_id`` resumes one."""

    def __init__(self, run_id: str | None, name: str, params: dict[str, Any],
                 tags: dict[str, str], local: Path) -> None:
        import wandb
        from wandb.sdk.lib.runid import generate_id

        self._run = wandb.init(id=run_id or generate_id(), resume="allow",
                               name=name, dir=str(local), config={**params, **tags})
        self.run_id = self._run.id

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self._run.log(metrics, step=step)

    def log_summary(self, summary: dict[str, Any]) -> None:
        self._run.summary.update(dict(_numbers(summary)))

    def log_plot(self, path: Path) -> None:
        """A file of the run (in offline mode: its ``files/``, which ``wandb sync`` uploads)."""
        self._run.save(str(path), base_path=str(path.parent), policy="now")

    def flush(self) -> None:
        """W&B writes in its own process: nothing waits."""

    def close(self) -> None:
        self._run.finish()


class Guarded:
    """``tracker`` (named ``name``) whose first failure is told through ``say`` in one line
    and switches it off."""

    def __init__(self, name: str, tracker: Tracker | None, say: Callable[[str], None]) -> None:
        self.name = name
        self.tracker = tracker
        self._say = say

    def call(self, method: str, *args: Any) -> None:
        """``tracker.<method>(*args)``; after a failure, a warning and nothing more."""
        if self.tracker is None:
            return
        try:
            getattr(self.tracker, method)(*args)
        except Exception as err:  # noqa: BLE001 (any tracker failure: training goes on)
            self.tracker = None
            self._say(warning(self.name, method, err))


def warning(name: str, doing: str, err: BaseException) -> str:
    """The one line told when tracker ``name`` fails while ``doing``."""
    lines = str(err).strip().splitlines()
    return (f"warning: tracker {name} failed ({doing}: {type(err).__name__}: "
            f"{lines[0] if lines else ''}); training goes on without it, metrics.jsonl has "
            "every step")


def open_trackers(names: Sequence[str], local: Path, record: dict[str, Any] | None,
                  name: str, tags: dict[str, str], say: Callable[[str], None]) -> list[Guarded]:
    """The trackers ``names``, each started (or resumed from ``local/trackers.json``) with the
    run's ``record`` (config.json: its options become parameters), display ``name`` and
    ``tags``; one that cannot start is told about through ``say`` once and left out. Saves the
    run ids."""
    ids_path = local / IDS_FILE
    ids = json.loads(ids_path.read_text()) if ids_path.exists() else {}
    params = dict((record or {}).get("options", {}))
    starts: dict[str, Callable[[], Tracker]] = {
        "tensorboard": lambda: TensorBoardTracker(local),
        "mlflow": lambda: MLflowTracker(ids.get("mlflow"), name, params, tags),
        "wandb": lambda: WandbTracker(ids.get("wandb"), name, params, tags, local),
    }
    opened = []
    for tracker_name in names:
        try:
            tracker: Tracker | None = starts[tracker_name]()
        except Exception as err:  # noqa: BLE001 (a tracker that cannot start: training goes on)
            say(warning(tracker_name, "start", err))
            tracker = None
        opened.append(Guarded(tracker_name, tracker, say))
        if tracker is not None and tracker.run_id:
            ids[tracker_name] = tracker.run_id
    if ids:
        ids_path.write_text(json.dumps(ids, indent=2) + "\n")
    return opened


def _numbers(summary: dict[str, Any]) -> list[tuple[str, float]]:
    """The finite numbers of ``summary`` (booleans as 0/1), as trackers take metrics."""
    return [(key, float(value)) for key, value in summary.items()
            if isinstance(value, (int, float)) and math.isfinite(value)]
