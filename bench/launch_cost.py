"""What launching costs the tests: a short tiny-model run started cold versus forked.

The same trainer run (``trainers.ddp``, the tiny model, a few steps) on 1 and 2 ranks, started
the way a user starts it (``python -m``, ``torchrun`` for 2 ranks) and forked from the tests'
preloaded process (``tests.support.processes.run_forked``: torch and the trainers already
imported; the process is started by an untimed run first), in rotating order over ``rounds``.
Reports the median wall time of each and the ratio cold/forked, with the steps' own share (the
trainer's summed step times), and checks that both launchers train the same losses bit for bit.

    python -m bench.launch_cost            # 3 rounds
    python -m bench.launch_cost --quick    # 1 round, smoke check
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import harness
from tests.support.processes import log_root, run_forked

QUICK = {"rounds": 1, "steps": 4}
OVERRIDES = {"rounds": 1, "steps": 2}
LAUNCHERS = ("cold", "forked")
STRICT = True  # a loss that differs between the launchers fails the run


@dataclass
class Plan:
    model: str = "tiny"
    steps: int = 8
    nprocs: tuple[int, ...] = (1, 2)
    rounds: int = 3
    timeout_s: float = 300.0


def trainer_args(plan: Plan) -> list[str]:
    return [*harness.trainer_args(plan.model, 8, plan.steps, 1e12, train_samples=256),
            "--device", "cpu", "--log-every", "1"]


def run_once(plan: Plan, launcher: str, nproc: int, scratch: Path, tag: str) -> dict[str, Any]:
    """One run: its wall time, the trainer's summed step time and its losses by step."""
    run_dir = scratch / tag
    if launcher == "cold":
        result = harness.run_trainer("trainers.ddp", trainer_args(plan), nproc, scratch, tag,
                                     plan.timeout_s, keep=True)
        wall = result["wall_s"]
    else:
        harness.progress(tag)
        start = time.perf_counter()
        run_forked("trainers.ddp", [*trainer_args(plan), "--output-dir", str(run_dir)], nproc,
                   timeout=plan.timeout_s)
        wall = time.perf_counter() - start
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {"wall_s": wall, "steps_s": sum(r["step_time_s"] for r in records),
            "losses": [r["loss"] for r in records]}


def run(plan: Plan, scratch: Path) -> dict[str, Any]:
    """A forked run first, untimed among the rest: it starts the preloaded process (a test
    session's one-time cost, reported apart); then every launcher and size per round."""
    preload_s = run_once(plan, "forked", 1, scratch, "preload")["wall_s"]
    names = [f"{launcher}-x{nproc}" for nproc in plan.nprocs for launcher in LAUNCHERS]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for index, name in harness.rotations(names, plan.rounds):
        launcher, nproc = name.split("-x")
        runs[name].append(run_once(plan, launcher, int(nproc), scratch,
                                   f"round{index}-{name}"))
    rows = []
    for nproc in plan.nprocs:
        cold, forked = (runs[f"{launcher}-x{nproc}"] for launcher in LAUNCHERS)
        cold_s, forked_s = (harness.median([r["wall_s"] for r in rs]) for rs in (cold, forked))
        rows.append({"nproc": nproc, "cold_s": cold_s, "forked_s": forked_s,
                     "ratio": cold_s / forked_s,
                     "steps_s": harness.median([r["steps_s"] for r in cold + forked]),
                     "same_losses": all(r["losses"] == cold[0]["losses"] for r in cold + forked)})
    shutil.rmtree(log_root(), ignore_errors=True)  # the forked runs' outputs
    return {"preload_s": preload_s, "rows": rows}


def checks(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"name": f"{row['nproc']} rank(s): forked losses equal cold ones",
             "value": row["same_losses"], "target": True, "pass": row["same_losses"]}
            for row in report["rows"]]


def table(report: dict[str, Any]) -> str:
    plan = report["plan"]
    header = [("ranks", "cold (s)", "forked (s)", "cold/forked", "steps (s)", "same losses")]
    rows = [(str(r["nproc"]), f"{r['cold_s']:.2f}", f"{r['forked_s']:.2f}",
             f"{r['ratio']:.1f}x", f"{r['steps_s']:.2f}", "yes" if r["same_losses"] else "NO")
            for r in report["rows"]]
    return "\n".join([f"{plan['model']}, {plan['steps']} steps, median of {plan['rounds']} "
                      "round(s); cold: python -m (1 rank) or torchrun; forked: the tests' "
                      "preloaded process", "", harness.columns(header + rows), "",
                      f"starting the preloaded process (once a session, with its first run): "
                      f"{report['preload_s']:.2f} s"])


if __name__ == "__main__":
    raise SystemExit(harness.main())
