"""The stall a checkpoint adds to a training step, asynchronous against synchronous saves
(docs/benchmarks.md, "Checkpoint stall")."""

import bisect
import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import harness, throughput
from bench.harness import WORKER, BenchError, median, trainer_args
from bench.throughput import iterations
from trainers.core.checkpoint import Checkpointer

NPROC = 2
VARIANTS = {"none": ["--checkpoint-every", "0"],
            "sync": ["--no-async-checkpoint"],
            "async": ["--async-checkpoint"]}
STEP_LINE = re.compile(r"\bstep\s+(\d+)/\d+")
COMMIT_LINE = re.compile(r"checkpoint \S+step_(\d+) committed")
GOAL = 0.10  # async stall at most this share of the sync stall
OVERRIDES = {"rounds": 1, "every": 2, "checkpoints": 1, "warmup": 1}
QUICK = {"model": "tiny", "every": 2, "checkpoints": 2, "warmup": 1, "rounds": 1,
         "timeout_s": 180.0}


@dataclass
class Plan:
    model: str = "small"
    micro_batch: int = 8  # sequences per rank per step
    warmup: int = 2  # leading steps, before the first checkpoint, left out
    every: int = 3  # --checkpoint-every
    checkpoints: int = 4  # timed checkpoints per run (the final, untimed save comes after)
    rounds: int = 1  # each round runs none, sync and async once, the order rotating
    train_samples: int = 1024
    timeout_s: float = 1200.0  # per run


def steps_of(plan: Plan) -> int:
    """Steps per run: ``checkpoints`` timed saves at every ``every``-th step after the warm-up,
    then ``every`` steps more (the last one's save is the final, untimed one)."""
    return plan.every * (plan.checkpoints + 1 + plan.warmup // plan.every)


def worker(prefix: str, argv: Sequence[str]) -> None:
    """:func:`bench.throughput.worker` (the DDP trainer, a time stamp at the end of every step)
    that also times every call of ``Checkpointer.save`` and ``Checkpointer.commit_pending`` from
    the loop: ``<prefix>.blocked.rank<R>.json`` gets ``[start, seconds]`` of each, the time the
    checkpoint held the training loop."""
    calls: list[list[float]] = []
    depth = [0]

    def timed(method: Callable[..., Any]) -> Callable[..., Any]:
        def call(self: Checkpointer, *args: Any, **kwargs: Any) -> Any:
            depth[0] += 1
            start = time.perf_counter()
            try:
                return method(self, *args, **kwargs)
            finally:
                depth[0] -= 1
                if not depth[0]:  # save's own commit_pending counts once, inside save
                    calls.append([start, time.perf_counter() - start])
        return call

    Checkpointer.save = timed(Checkpointer.save)  # type: ignore[method-assign]
    Checkpointer.commit_pending = timed(Checkpointer.commit_pending)  # type: ignore[method-assign]
    try:
        throughput.worker(prefix, argv)
    finally:
        harness.write_rank(f"{prefix}.blocked", calls)


def commits(log: Path) -> dict[int, int]:
    """Checkpoint step -> the step after which it was committed in the background, from the
    trainer's log (rank 0's ``step N/M`` lines and its ``committed`` log lines)."""
    found, step = {}, 0
    for line in log.read_text().splitlines():
        if match := STEP_LINE.search(line):
            step = int(match.group(1))
        elif match := COMMIT_LINE.search(line):
            found[int(match.group(1))] = step
    return found


def run_variant(plan: Plan, variant: str, tag: str, scratch: Path) -> dict[str, Any]:
    """Train ``variant`` on two ranks with per-step stamps; every iteration time (from the end
    of step s-1 to the end of step s, so the one ending step s+1 holds step s's save) and which
    iterations hold a save or a background commit."""
    total, out = steps_of(plan), scratch / tag
    args = [*trainer_args(plan.model, plan.micro_batch * NPROC, total, 1e12, plan.train_samples),
            "--log-every", "1", "--keep-checkpoints", "2", "--checkpoint-every", str(plan.every),
            *VARIANTS[variant]]
    run = harness.run_trainer("bench.checkpoint_stall", [WORKER, f"{out}.stamps", *args], NPROC,
                              scratch, tag, plan.timeout_s)
    stamps = json.loads(Path(f"{out}.stamps.rank0.json").read_text())
    if len(stamps) != total:
        raise BenchError(f"{tag}: expected {total} step stamps, got {len(stamps)}")
    periods = dict(enumerate(iterations(stamps, 0, first_step=2), start=2))
    blocked: dict[int, float] = {}
    for start, seconds in json.loads(Path(f"{out}.stamps.blocked.rank0.json").read_text()):
        # a call after step s's stamp lies in the iteration that ends with step s + 1
        step = bisect.bisect_right(stamps, start) + 1
        blocked[step] = blocked.get(step, 0.0) + seconds
    saves = [s for s in range(plan.every, total, plan.every) if variant != "none"]
    committed = commits(scratch / f"{tag}.log")
    return {"tag": tag, "variant": variant, "command": run["command"], "wall_s": run["wall_s"],
            "iteration_s": periods, "blocked_s": blocked, "saves": saves,
            "committed_after": committed, "final_loss": run["summary"]["final_loss"]}


def split(result: dict[str, Any], warmup: int, field: str) -> dict[str, list[float]]:
    """A run's per-iteration ``field`` (``iteration_s`` or ``blocked_s``) after the warm-up:
    the iterations holding a save, those holding a background commit (not also a save), and
    the others."""
    periods = {s: result[field].get(s, 0.0) for s in result["iteration_s"] if s > warmup}
    save = {s + 1 for s in result["saves"]}
    commit = {s + 1 for s in result["committed_after"].values()} - save
    return {"save": [t for s, t in periods.items() if s in save],
            "commit": [t for s, t in periods.items() if s in commit],
            "other": [t for s, t in periods.items() if s not in save | commit]}


def summarize(plan: Plan, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per variant, pooled over rounds: the median iteration without a save; the time the
    checkpoint calls held the loop in an iteration with a save and in one with a background
    commit (medians; the stall, measured directly); the same stall as a difference of
    iteration times (the definition, but as noisy as the machine); the whole cost of a
    checkpoint against the run without any (extra time per checkpoint, background contention
    included); and after how many steps each background save was committed."""
    def pooled(field: str) -> dict[str, dict[str, list[float]]]:
        out: dict[str, dict[str, list[float]]] = {}
        for result in runs:
            for kind, values in split(result, plan.warmup, field).items():
                out.setdefault(result["variant"], {}).setdefault(kind, []).extend(values)
        return out

    times, blocked = pooled("iteration_s"), pooled("blocked_s")
    baseline = median(times["none"]["other"])
    out: dict[str, Any] = {}
    for variant, kinds in times.items():
        everything = [t for values in kinds.values() for t in values]
        normal, saves = median(kinds["other"]), len(kinds["save"])
        out[variant] = {
            "normal_s": normal,
            "blocked_save_s": median(blocked[variant]["save"]) if saves else None,
            "blocked_commit_s": median(blocked[variant]["commit"])
            if blocked[variant]["commit"] else 0.0,
            "save_stall_s": median(kinds["save"]) - normal if saves else None,
            "cost_per_checkpoint_s": (sum(everything) - baseline * len(everything)) / saves
            if saves else None,
            "commit_lag_steps": sorted({c - s for r in runs if r["variant"] == variant
                                        for s, c in r["committed_after"].items()
                                        if s in r["saves"]})}
    sync = out["sync"]["blocked_save_s"]
    asyn = out["async"]["blocked_save_s"] + out["async"]["blocked_commit_s"]
    return {"variants": out, "stall_ratio": asyn / sync, "goal": GOAL,
            "goal_met": asyn <= GOAL * sync,
            "iteration_stall_ratio": out["async"]["save_stall_s"] / out["sync"]["save_stall_s"]}


def run(plan: Plan, scratch: Path) -> dict[str, Any]:
    runs = [run_variant(plan, variant, f"{variant}-r{r}", scratch)
            for r, variant in harness.rotations(list(VARIANTS), plan.rounds)]
    return {"steps_per_run": steps_of(plan), "nproc": NPROC, "runs": runs,
            "summary": summarize(plan, runs)}


def checks(report: dict[str, Any]) -> list[dict[str, Any]]:
    summary = report["summary"]
    return [{"name": f"async stall <= {GOAL:.0%} of the sync stall (time held)",
             "pass": summary["goal_met"],
             "value": summary["stall_ratio"]}]


def table(report: dict[str, Any]) -> str:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1e3:,.0f} ms"

    rows = [("saves", "iteration", "held at the save", "held at the commit",
             "iteration stall at the save", "cost per checkpoint", "committed after")]
    for variant, row in report["summary"]["variants"].items():
        lag = row["commit_lag_steps"]
        rows.append((variant, ms(row["normal_s"]), ms(row["blocked_save_s"]),
                     ms(row["blocked_commit_s"]) if variant == "async" else "-",
                     ms(row["save_stall_s"]), ms(row["cost_per_checkpoint_s"]),
                     f"{min(lag)}-{max(lag)} steps" if lag else "-"))
    summary = report["summary"]
    return (harness.columns(rows)
            + f"\n\nasync stall (held at the save + at the commit) / sync stall = "
            f"{summary['stall_ratio']:.3f} (goal <= {summary['goal']:.2f}: "
            f"{'met' if summary['goal_met'] else 'missed'}); from iteration times: "
            f"{summary['iteration_stall_ratio']:.3f}")


if __name__ == "__main__":
    raise SystemExit(harness.main())
