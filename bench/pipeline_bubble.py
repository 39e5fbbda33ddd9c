"""The pipeline bubble, measured: GPipe and 1F1B on two stages (docs/benchmarks.md)."""

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import harness
from trainers.parallel.pipeline_timeline import efficiency
from trainers.tools.plot import draw_timeline

STAGES = 2
QUICK = {"model": "tiny", "microbatches": (1, 2, 4), "steps": 3, "warmup": 1, "timeout_s": 120.0}


@dataclass
class Plan:
    model: str = "small"
    microbatch_size: int = 2  # sequences per micro-batch, the same at every m
    microbatches: tuple[int, ...] = (1, 2, 4, 8)
    steps: int = 6
    warmup: int = 2  # leading steps left out
    timeout_s: float = 1200.0


def run_schedule(plan: Plan, schedule: str, m: int, scratch: Path) -> dict[str, Any]:
    """Train ``plan.steps`` steps with ``schedule`` at ``m`` micro-batches: per-step records,
    the median efficiency after the warm-up next to m / (m + s - 1), activation peaks."""
    args = [*harness.trainer_args(plan.model, plan.microbatch_size * m, plan.steps, 1e12, 512),
            "--pp", str(STAGES), "--schedule", schedule, "--microbatches", str(m),
            "--record-timeline"]
    result = harness.run_trainer("trainers.pipeline", args, STAGES, scratch, f"{schedule}-m{m}",
                                 plan.timeout_s, keep=True)
    by_step: dict[int, list[dict[str, Any]]] = {}
    for rank in range(STAGES):
        timeline = (result["run_dir"] / f"timeline.rank{rank}.jsonl").read_text().splitlines()
        for record in map(json.loads, timeline):
            by_step.setdefault(record["step"], []).extend(record["stages"])
    steps = []
    for step, stages in sorted(by_step.items()):
        intervals = [i for stage in stages for i in stage["intervals"]]
        steps.append({"step": step, **efficiency(intervals), "intervals": intervals,
                      "activation_peak_bytes": {s["stage"]: s["activation_peak_bytes"]
                                                for s in stages}})
    measured = steps[plan.warmup:]
    return {"schedule": schedule, "m": m, "formula": m / (m + STAGES - 1),
            "command": result["command"], "steps": steps,
            "efficiency": statistics.median(s["efficiency"] for s in measured),
            "activation_peak_bytes": {
                stage: max(s["activation_peak_bytes"][stage] for s in measured)
                for stage in measured[0]["activation_peak_bytes"]}}


def run(plan: Plan, scratch: Path) -> dict[str, Any]:
    """GPipe at every m, then 1F1B at the largest."""
    runs = [run_schedule(plan, "gpipe", m, scratch) for m in plan.microbatches]
    return {"stages": STAGES,
            "runs": [*runs, run_schedule(plan, "1f1b", plan.microbatches[-1], scratch)]}


def draw(report: dict[str, Any], images: Path) -> list[Path]:
    """The timeline of GPipe and 1F1B at the largest m, and efficiency against m."""
    runs = report["runs"]
    pair = [r for r in runs if r["m"] == max(r["m"] for r in runs)]
    paths = [images / "pipeline_timeline.png", images / "pipeline_efficiency.png"]
    with harness.figure(paths[0], len(pair), 1, figsize=(11, 1.6 + 1.3 * len(pair))) as axes:
        for ax, result in zip(axes, pair, strict=True):
            draw_timeline(ax, result["steps"][-1]["intervals"])
            ax.set_title(f"{result['schedule']}, m={result['m']}: efficiency "
                         f"{result['efficiency']:.2f} (formula {result['formula']:.2f})",
                         fontsize=10)
    gpipe = sorted((r for r in runs if r["schedule"] == "gpipe"), key=lambda r: r["m"])
    with harness.figure(paths[1], figsize=(6, 4)) as ax:
        harness.chart(ax, [r["m"] for r in gpipe],
                      {"GPipe, measured": ([r["efficiency"] for r in gpipe], "o-"),
                       "m / (m + s - 1), s = 2": ([r["formula"] for r in gpipe], "s--")},
                      "micro-batches m", "pipeline efficiency (mean busy share)")
        ax.set_ylim(0, 1)
    return paths


def table(report: dict[str, Any]) -> str:
    stages = range(report["stages"])
    rows = [("schedule", "m", "efficiency", "formula", *(f"busy stage {s}" for s in stages),
             *(f"act. peak {s}" for s in stages))]
    for result in report["runs"]:
        busy = [statistics.median(s["busy_share"][stage] for s in result["steps"])
                for stage in stages]
        rows.append((result["schedule"], str(result["m"]), f"{result['efficiency']:.3f}",
                     f"{result['formula']:.3f}", *(f"{b:.3f}" for b in busy),
                     *(f"{result['activation_peak_bytes'][s] / 2**20:.2f} MiB" for s in stages)))
    return harness.columns(rows)


if __name__ == "__main__":
    raise SystemExit(harness.main())
