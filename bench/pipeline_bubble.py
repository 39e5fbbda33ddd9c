"""The pipeline bubble, measured: ``python -m bench.pipeline_bubble``.

Runs the real pipeline trainer (``trainers.pipeline --record-timeline``, 2 stages on 2 ranks,
one thread each) and reads back, per stage and micro-batch, when each forward and backward
started and ended. From those intervals it computes each stage's busy share of the step and
the pipeline's efficiency (their mean), for GPipe at m = 1, 2, 4, 8 micro-batches next to the
formula m / (m + s - 1), and for 1F1B at the largest m; it compares the peak activation memory
(bytes saved for backward, per stage) of GPipe and 1F1B at that m, and draws two PNGs: the
timelines of GPipe and 1F1B, and efficiency against m. Writes
``bench/results/pipeline_bubble.json`` and ``docs/img/pipeline_*.png``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` and `trainers` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (  # noqa: E402
    REPO,
    RESULTS_DIR,
    child_env,
    host_info,
    progress,
    run_in_scratch,
    run_streaming,
    tool,
    write_json,
)
from trainers.parallel.pipeline_timeline import efficiency  # noqa: E402

STAGES = 2
IMAGES = REPO / "docs" / "img"


@dataclass
class Plan:
    model: str = "small"
    microbatch_size: int = 2  # sequences per micro-batch, the same at every m
    microbatches: tuple[int, ...] = (1, 2, 4, 8)
    steps: int = 6
    warmup: int = 2  # leading steps left out
    timeout_s: float = 1200.0

    @classmethod
    def quick(cls) -> Plan:
        return cls(model="tiny", microbatches=(1, 2, 4), steps=3, warmup=1, timeout_s=120.0)


def run_schedule(plan: Plan, schedule: str, m: int, scratch: Path) -> dict[str, Any]:
    """Train ``plan.steps`` steps with ``schedule`` at ``m`` micro-batches; per-step records."""
    out = scratch / f"{schedule}-m{m}"
    cmd = [tool("torchrun"), "--nproc_per_node", str(STAGES), "--rdzv_backend", "c10d",
           "--rdzv_endpoint", "localhost:0", "-m", "trainers.pipeline",
           "--pp", str(STAGES), "--schedule", schedule, "--microbatches", str(m),
           "--model", plan.model, "--batch-size", str(plan.microbatch_size * m),
           "--steps", str(plan.steps), "--record-timeline", "--eval-every", "0",
           "--checkpoint-every", "0", "--tensorboard", "false", "--resume", "none",
           "--peak-tflops", "1", "--train-samples", "512", "--output-dir", str(out)]
    progress(f"{schedule}, m={m}")
    run_streaming(cmd, plan.timeout_s, scratch / f"{schedule}-m{m}.log", child_env(scratch))
    by_step: dict[int, list[dict[str, Any]]] = {}
    for rank in range(STAGES):
        for line in (out / f"timeline.rank{rank}.jsonl").read_text().splitlines():
            record = json.loads(line)
            by_step.setdefault(record["step"], []).extend(record["stages"])
    steps = []
    for step, stages in sorted(by_step.items()):
        intervals = [i for stage in stages for i in stage["intervals"]]
        steps.append({"step": step, **efficiency(intervals), "intervals": intervals,
                      "activation_peak_bytes": {s["stage"]: s["activation_peak_bytes"]
                                                for s in stages}})
    measured = steps[plan.warmup:]
    return {"schedule": schedule, "m": m, "command": " ".join(cmd), "steps": steps,
            "efficiency": statistics.median(s["efficiency"] for s in measured),
            "activation_peak_bytes": {
                stage: max(s["activation_peak_bytes"][stage] for s in measured)
                for stage in measured[0]["activation_peak_bytes"]}}


def run_benchmark(plan: Plan, scratch: Path) -> dict[str, Any]:
    runs = [run_schedule(plan, "gpipe", m, scratch) for m in plan.microbatches]
    m_max = plan.microbatches[-1]
    runs.append(run_schedule(plan, "1f1b", m_max, scratch))
    for run in runs:
        run["formula"] = run["m"] / (run["m"] + STAGES - 1)
    return {"host": host_info(), "plan": plan.__dict__, "stages": STAGES, "runs": runs}


def draw(report: dict[str, Any], images: Path) -> list[Path]:
    """The timeline of GPipe and 1F1B at the largest m, and efficiency against m."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = report["runs"]
    m_max = max(r["m"] for r in runs)
    pair = [r for r in runs if r["m"] == m_max]
    fig, axes = plt.subplots(len(pair), 1, figsize=(11, 1.6 + 1.3 * len(pair)), sharex=False)
    for ax, run in zip(axes, pair, strict=True):
        step = run["steps"][-1]
        origin = min(i["start"] for i in step["intervals"])
        for i in step["intervals"]:
            color = "#4C72B0" if i["kind"] == "F" else "#DD8452"
            ax.barh(i["stage"], (i["end"] - i["start"]) * 1e3, left=(i["start"] - origin) * 1e3,
                    color=color, edgecolor="black", height=0.6)
            ax.text((i["start"] + i["end"]) / 2 * 1e3 - origin * 1e3, i["stage"],
                    f"{i['kind']}{i['microbatch']}", ha="center", va="center", fontsize=7,
                    color="white")
        ax.set_yticks(range(report["stages"]), [f"stage {s}" for s in range(report["stages"])])
        ax.invert_yaxis()
        ax.set_title(f"{run['schedule']}, m={run['m']}: efficiency {run['efficiency']:.2f} "
                     f"(formula {run['formula']:.2f})", fontsize=10)
        ax.set_xlabel("ms since the step's first forward (F: forward, B: backward)")
    fig.tight_layout()
    images.mkdir(parents=True, exist_ok=True)
    timeline = images / "pipeline_timeline.png"
    fig.savefig(timeline, dpi=110)
    plt.close(fig)

    gpipe = sorted((r for r in runs if r["schedule"] == "gpipe"), key=lambda r: r["m"])
    fig, ax = plt.subplots(figsize=(6, 4))
    ms = [r["m"] for r in gpipe]
    ax.plot(ms, [r["efficiency"] for r in gpipe], "o-", label="GPipe, measured")
    ax.plot(ms, [r["formula"] for r in gpipe], "s--", label="m / (m + s - 1), s = 2")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ms, [str(m) for m in ms])
    ax.set_ylim(0, 1)
    ax.set_xlabel("micro-batches m")
    ax.set_ylabel("pipeline efficiency (mean busy share)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    curve = images / "pipeline_efficiency.png"
    fig.savefig(curve, dpi=110)
    plt.close(fig)
    return [timeline, curve]


def table(report: dict[str, Any]) -> str:
    lines = [f"{'schedule':9} {'m':>2} {'efficiency':>10} {'formula':>8} "
             f"{'busy stage 0':>12} {'busy stage 1':>12} {'act. peak 0':>12} {'act. peak 1':>12}"]
    for run in report["runs"]:
        busy = [statistics.median(s["busy_share"][stage] for s in run["steps"])
                for stage in range(report["stages"])]
        peaks = [run["activation_peak_bytes"][stage] for stage in range(report["stages"])]
        lines.append(f"{run['schedule']:9} {run['m']:>2} {run['efficiency']:>10.3f} "
                     f"{run['formula']:>8.3f} "
                     + " ".join(f"{b:>12.3f}" for b in busy) + " "
                     + " ".join(f"{p / 2**20:>8.2f} MiB" for p in peaks))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.pipeline_bubble",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model, smoke check")
    parser.add_argument("--keep-runs", action="store_true", help="keep the scratch directory")
    parser.add_argument("--scratch", help="parent of the scratch directory")
    args = parser.parse_args(argv)
    plan = Plan.quick() if args.quick else Plan()
    report = run_in_scratch("bench-pipeline-", args.scratch, args.keep_runs,
                            lambda scratch: run_benchmark(plan, scratch))
    if report is None:
        return 2
    name = "pipeline_bubble_quick" if args.quick else "pipeline_bubble"
    output = RESULTS_DIR / f"{name}.json"
    write_json(output, report)
    images = draw(report, IMAGES if not args.quick else RESULTS_DIR / "quick_img")
    print(table(report))
    print(f"\nwrote {output} and {', '.join(str(p) for p in images)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
