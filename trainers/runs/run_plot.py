"""The figure of one or more runs, drawn from their run directories: ``trainers.tools.plot`` writes
it where asked, and a run's trackers (MLflow, W&B) get it as an artifact at the end of the run.

Against the step: the training and evaluation loss, the learning rate, tokens/s and peak
memory of every run (its ``metrics.jsonl``), one colour per run and a legend from each run's
``config.json`` (the options in which the runs differ); a pipeline run recorded with
``--record-timeline`` also gets its last step's timeline. matplotlib is imported only to draw.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trainers.errors import ConfigError
from trainers.runs.run_record import read_config
from trainers.runs.storage import RunPath, check_store

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# The panels against the step: (metrics.jsonl key, y-axis label, scale).
PANELS = (("loss", "loss (solid: train, dots: eval)", 1.0), ("lr", "learning rate", 1.0),
          ("tokens_per_s", "tokens/s", 1.0), ("peak_memory_bytes", "peak memory (GiB)", 2**-30))
_FORWARD, _BACKWARD = "#4C72B0", "#DD8452"


@dataclass
class Run:
    """One run directory's records: ``metrics`` (metrics.jsonl, in step order), ``config``
    (config.json, empty if the run wrote none) and ``timeline`` (the intervals of the last
    step recorded by ``--record-timeline``, empty without one)."""

    path: RunPath
    metrics: list[dict[str, float]]
    config: dict[str, Any] = field(default_factory=dict)
    timeline: list[dict[str, Any]] = field(default_factory=list)


def load_run(path: RunPath) -> Run:
    """Read run directory ``path`` (a local path or a bucket URL's); ConfigError when it holds
    no step's metrics, or its bucket cannot be read."""
    check_store(path, "RUN", write=False)
    metrics_file = path / "metrics.jsonl"
    if not metrics_file.is_file():
        raise ConfigError(f"{path} holds no metrics.jsonl; pass a run directory (a trainer's "
                          "--output-dir, e.g. outputs/ddp)")
    metrics = []
    for line in metrics_file.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut short by a crash
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            metrics.append(record)
    if not metrics:
        raise ConfigError(f"{metrics_file} holds no step's metrics; pass a run that has trained "
                          "a step")
    by_step: dict[int, list[dict[str, Any]]] = {}
    for rank_file in sorted(path.glob("timeline.rank*.jsonl")):
        for line in rank_file.read_text().splitlines():
            record = json.loads(line)
            for stage in record["stages"]:
                by_step.setdefault(record["step"], []).extend(stage["intervals"])
    timeline = by_step[max(by_step)] if by_step else []
    return Run(path, sorted(metrics, key=lambda m: m["step"]), read_config(path) or {},
               timeline)


def labels(runs: Sequence[Run]) -> list[str]:
    """A legend entry per run: its trainer and the options in which the runs differ (one run:
    its trainer and model), with its directory's name where that leaves two alike; a run
    without config.json: its directory."""
    options = [run.config.get("options", {}) for run in runs]
    names = sorted({k for o in options for k in o if k not in ("output_dir", "resume")})
    differing = [k for k in names if len({json.dumps(o.get(k)) for o in options}) > 1]
    if len(runs) == 1:
        differing = ["model"]
    result = []
    for run, opts in zip(runs, options, strict=True):
        if not run.config:
            result.append(str(run.path))
            continue
        parts = [run.config["trainer"], *(f"--{k.replace('_', '-')} {opts.get(k)}"
                                          for k in differing)]
        if len(runs) > 1 and len({r.config.get("world_size") for r in runs}) > 1:
            parts.append(f"{run.config['world_size']} ranks")
        result.append(" ".join(parts))
    if len(set(result)) < len(result):  # runs alike in every option: tell them by directory
        result = [f"{label} ({run.path.name})" for label, run in zip(result, runs, strict=True)]
    return result


def draw_timeline(ax: Axes, intervals: Sequence[dict[str, Any]]) -> None:
    """One pipeline step's forward (F) and backward (B) intervals, a row per stage, in ms from
    the step's first forward."""
    origin = min(i["start"] for i in intervals)
    stages = sorted({i["stage"] for i in intervals})
    for i in intervals:
        start, end = ((t - origin) * 1e3 for t in (i["start"], i["end"]))
        ax.barh(i["stage"], end - start, left=start, height=0.6, edgecolor="black",
                color=_FORWARD if i["kind"] == "F" else _BACKWARD)
        ax.text((start + end) / 2, i["stage"], f"{i['kind']}{i['microbatch']}", ha="center",
                va="center", fontsize=7, color="white")
    ax.set(yticks=stages, yticklabels=[f"stage {s}" for s in stages],
           xlabel="ms since the step's first forward (F: forward, B: backward)")
    ax.invert_yaxis()


def draw(runs: Sequence[Run]) -> Figure:
    """The figure: the panels of :data:`PANELS` for every run, then a timeline per pipeline run
    that recorded one."""
    from matplotlib.figure import Figure

    timed = [(run, label) for run, label in zip(runs, labels(runs), strict=True)
             if run.timeline]
    fig = Figure(figsize=(12, 7 + 2 * len(timed)), layout="constrained")
    grid = fig.add_gridspec(2 + len(timed), 2, height_ratios=[3, 3] + [2] * len(timed))
    for index, (key, ylabel, scale) in enumerate(PANELS):
        ax = fig.add_subplot(grid[index // 2, index % 2])
        for n, (run, label) in enumerate(zip(runs, labels(runs), strict=True)):
            rows = [m for m in run.metrics if key in m]
            ax.plot([m["step"] for m in rows], [m[key] * scale for m in rows],
                    color=f"C{n}", label=label)
            if key == "loss":
                evals = [m for m in run.metrics if "eval_loss" in m]
                ax.plot([m["step"] for m in evals], [m["eval_loss"] for m in evals], "o:",
                        color=f"C{n}")
        ax.set(xlabel="step", ylabel=ylabel)
        ax.grid(alpha=0.3)
        if index == 0:
            ax.legend(fontsize=8)
    for row, (run, label) in enumerate(timed, start=2):
        ax = fig.add_subplot(grid[row, :])
        draw_timeline(ax, run.timeline)
        ax.set_title(f"{label}: pipeline timeline of the last recorded step", fontsize=10)
    return fig


def render(runs: Sequence[Run], image_format: str = "png") -> bytes:
    """The figure of ``runs`` (:func:`draw`) as an image file's bytes."""
    image = io.BytesIO()
    draw(runs).savefig(image, dpi=110, format=image_format)
    return image.getvalue()
