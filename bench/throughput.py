"""Throughput, MFU, loop overhead and launch cost of the DDP trainer on this CPU machine.

``python -m bench.throughput`` (or ``python bench/throughput.py``) measures, in one run:

1. tokens/s of the ``small`` model in one process with one thread, and under DDP with two
   ranks via torchrun (one thread each) at the same per-rank micro-batch; scaling efficiency
   is ``tokens/s(2) / (2 x tokens/s(1))``;
2. MFU against this machine's fp32 matmul peak at one thread, measured here first and passed
   to the trainer with ``--peak-tflops``, for our loop and for a plain minimal GPT loop;
3. loop overhead: median iteration time of our loop over that of the minimal loop
   (``bench.minimal_loop``), same model, batch, sequence length and thread count, run
   alternately;
4. launch ratio: time to the first step line under ``torchx run -s local_cwd
   components/ddp.py:ddp -j 1x2`` over that under plain ``torchrun --nproc_per_node 2``.

It prints a table (measured, target, pass/miss) and writes every raw figure to
``bench/results/throughput.json`` (``--quick``: a smoke check with tiny sizes, written to
``throughput_quick.json``). See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` and `trainers` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.common import (  # noqa: E402
    REPO,
    RESULTS_DIR,
    THREADS,
    BenchError,
    child_env,
    finish,
    free_port,
    host_info,
    median,
    progress,
    run_in_scratch,
    run_streaming,
    tool,
)
from bench.peak import measure_peak  # noqa: E402
from trainers.spec.shapes import MODEL_SIZES  # noqa: E402

FIRST_STEP = re.compile(r"\bstep\s+1/\d+")  # rank 0's line after step 1: "step 1/N | loss ..."


@dataclass
class Plan:
    """Sizes and repetitions of one benchmark run."""

    model: str = "small"
    micro_batch: int = 8  # sequences per rank per step
    warmup: int = 5  # leading steps of every run left out of the medians
    steps: int = 20  # measured steps per run (each run trains warmup + steps)
    rounds: int = 3  # each round runs ours (1 proc), minimal (1 proc) and DDP (2 ranks) once
    train_samples: int = 1024
    launch_model: str = "tiny"
    launch_steps: int = 2
    launch_repeats: int = 5  # runs of each launch command
    peak_sizes: tuple[int, ...] = (1024, 2048, 4096)
    peak_seconds: float = 2.0  # timed seconds per matmul size
    timeout_s: float = 1200.0  # per subprocess

    @classmethod
    def quick(cls) -> Plan:
        return cls(model="tiny", micro_batch=8, warmup=1, steps=3, rounds=1, train_samples=256,
                   launch_steps=2, launch_repeats=1, peak_sizes=(256, 512), peak_seconds=0.2,
                   timeout_s=120.0)


def trainer_args(model: str, global_batch: int, steps: int, out_dir: Path, peak_flops: float,
                 train_samples: int) -> list[str]:
    """Trainer flags for a pure throughput run: no evaluation, TensorBoard or mid-run
    checkpoints (the trainer still saves one checkpoint after the last step, untimed)."""
    return ["--model", model, "--batch-size", str(global_batch), "--grad-accum", "1",
            "--steps", str(steps), "--eval-every", "0", "--checkpoint-every", "0",
            "--tensorboard", "false", "--resume", "none", "--output-dir", str(out_dir),
            "--peak-tflops", f"{peak_flops / 1e12:.6g}", "--train-samples", str(train_samples),
            "--val-samples", "64"]


def measured(periods: Sequence[float], warmup: int, first_step: int) -> list[float]:
    """The iteration times of steps after ``warmup``; ``periods[0]`` is step ``first_step``."""
    return list(periods[max(0, warmup + 1 - first_step):])


def run_trainer(plan: Plan, nproc: int, tag: str, scratch: Path, peak_flops: float,
                keep: bool) -> dict[str, Any]:
    """One trainer run (``bench.timed_trainer``: the trainer plus per-step time stamps)."""
    run_dir = scratch / tag
    prefix = scratch / f"{tag}.stamps"
    total = plan.warmup + plan.steps
    args = trainer_args(plan.model, plan.micro_batch * nproc, total, run_dir, peak_flops,
                        plan.train_samples)
    module = ["-m", "bench.timed_trainer", str(prefix), *args]
    if nproc == 1:
        cmd = [sys.executable, *module]
    else:
        cmd = [tool("torchrun"), "--nproc_per_node", str(nproc), "--master_addr",
               "127.0.0.1", "--master_port", str(free_port()), *module]
    wall = run_streaming(cmd, plan.timeout_s, scratch / f"{tag}.log", child_env(scratch))
    stamps = json.loads(Path(f"{prefix}.rank0.json").read_text())
    if len(stamps) != total:
        raise BenchError(f"{tag}: expected {total} step stamps, got {len(stamps)}")
    periods = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]  # steps 2..total
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    if not keep:
        shutil.rmtree(run_dir, ignore_errors=True)
    return {
        "tag": tag, "nproc": nproc, "threads_per_proc": THREADS,
        "global_batch": plan.micro_batch * nproc, "steps": total, "wall_s": wall,
        "iteration_s": measured(periods, plan.warmup, first_step=2),
        "reported_step_s": [r["step_time_s"] for r in records if r["step"] > plan.warmup],
        "trainer_summary": {k: summary.get(k) for k in
                            ("tokens_per_s", "mfu", "first_loss", "final_loss", "loss_floor",
                             "data_share", "peak_memory_bytes", "world_size")},
    }


def run_minimal(plan: Plan, tag: str, scratch: Path) -> dict[str, Any]:
    """One run of the minimal loop in a fresh process."""
    out = scratch / f"{tag}.json"
    total = plan.warmup + plan.steps
    cmd = [sys.executable, "-m", "bench.minimal_loop", "--model", plan.model,
           "--batch-size", str(plan.micro_batch), "--steps", str(total),
           "--threads", str(THREADS), "--out", str(out)]
    wall = run_streaming(cmd, plan.timeout_s, scratch / f"{tag}.log", child_env(scratch))
    result = json.loads(out.read_text())
    stamps = result["stamps"]
    periods = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]  # steps 1..total
    return {"tag": tag, "nproc": 1, "threads_per_proc": result["threads"],
            "global_batch": plan.micro_batch, "steps": total, "wall_s": wall,
            "iteration_s": measured(periods, plan.warmup, first_step=1),
            "first_loss": result["first_loss"], "final_loss": result["final_loss"]}


def concurrent_peak(plan: Plan, size: int, scratch: Path) -> dict[str, Any]:
    """What two single-threaded processes reach together on one matmul size, released at the
    same moment: the machine's own ceiling for two-rank data-parallel scaling."""
    procs = []
    for rank in range(2):
        cmd = [sys.executable, "-m", "bench.peak", "--threads", str(THREADS), "--sizes",
               str(size), "--seconds", str(max(plan.peak_seconds, 1.0)), "--wait-stdin"]
        log = open(scratch / f"peak2-rank{rank}.log", "w")  # noqa: SIM115 (closed below)
        procs.append((subprocess.Popen(cmd, cwd=REPO, env=child_env(scratch), stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=log, text=True), log))
    try:
        for proc, log in procs:  # both have loaded torch and wait for "go"
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "ready":
                raise BenchError(f"concurrent matmul probe did not start; see {log.name}")
        for proc, _ in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        results = []
        for proc, log in procs:
            out, _ = proc.communicate(timeout=plan.timeout_s)
            if proc.returncode != 0:
                raise BenchError(f"concurrent matmul probe exited {proc.returncode}; "
                                 f"see {log.name}")
            results.append(json.loads(out.strip().splitlines()[-1])["by_size"][str(size)])
    finally:
        for proc, log in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
    return {"size": size, "per_process": results,
            "aggregate_median_flops": sum(r["median_flops"] for r in results)}


def time_to_first_step(name: str, cmd: Sequence[str], plan: Plan, log_path: Path,
                       env: dict[str, str]) -> dict[str, float]:
    """Seconds from spawning ``cmd`` until a ``step 1/N`` line appears in its output."""
    seen: list[float] = []

    def on_line(line: str, elapsed: float) -> None:
        if not seen and FIRST_STEP.search(line):
            seen.append(elapsed)

    exit_s = run_streaming(cmd, plan.timeout_s, log_path, env, on_line)
    if not seen:
        raise BenchError(f"{name}: no 'step 1/' line in its output; see {log_path}")
    return {"first_step_s": seen[0], "exit_s": exit_s}


def launch_commands(plan: Plan, out_dir: Path, peak_flops: float) -> dict[str, list[str]]:
    args = trainer_args(plan.launch_model, 2 * plan.micro_batch, plan.launch_steps, out_dir,
                        peak_flops, 256)
    return {
        "torchx": [tool("torchx"), "run", "-s", "local_cwd", "components/ddp.py:ddp",
                   "-j", "1x2", "--", *args],
        "torchrun": [tool("torchrun"), "--nproc_per_node", "2", "--master_port",
                     str(free_port()), "-m", "trainers.ddp", *args],
        # torchrun with the launcher flags TorchX's dist.ddp writes for a single-node job
        # (c10d rendezvous on a free port, tee of both streams): splits torchx's extra time
        # into what those flags cost and what torchx itself adds.
        "torchrun_c10d": [tool("torchrun"), "--rdzv_backend", "c10d", "--rdzv_endpoint",
                          "localhost:0", "--rdzv_id", "bench", "--nnodes", "1",
                          "--nproc_per_node", "2", "--tee", "3", "--role", "", "-m",
                          "trainers.ddp", *args],
    }


# --------------------------------------------------------------------------- the benchmark


def run_benchmark(plan: Plan, scratch: Path, keep: bool, quick: bool) -> dict[str, Any]:
    started = time.perf_counter()
    report: dict[str, Any] = {
        "benchmark": "bench.throughput", "schema": 1, "quick": quick,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": host_info(), "plan": dataclasses.asdict(plan), "threads_per_process": THREADS,
    }

    progress(f"fp32 matmul peak at {THREADS} thread, sizes {list(plan.peak_sizes)}")
    peak = measure_peak(plan.peak_sizes, plan.peak_seconds)
    peak_flops = peak["peak_flops"]
    progress(f"peak {peak_flops / 1e9:.1f} GFLOP/s (n={peak['best_size']})")
    progress("two single-threaded matmul processes at once")
    peak["two_processes"] = concurrent_peak(plan, peak["best_size"], scratch)
    report["peak"] = peak

    runs: dict[str, list[dict[str, Any]]] = {"ours": [], "minimal": [], "ddp2": []}
    order = ["ours", "minimal", "ddp2"]
    for index in range(plan.rounds):
        rotated = order[index % 3:] + order[:index % 3]
        for kind in rotated:
            tag = f"round{index + 1}-{kind}"
            progress(f"round {index + 1}/{plan.rounds}: {kind} ({plan.warmup}+{plan.steps} steps)")
            if kind == "minimal":
                run = run_minimal(plan, tag, scratch)
            else:
                run = run_trainer(plan, 2 if kind == "ddp2" else 1, tag, scratch, peak_flops,
                                  keep)
            run["round"] = index + 1
            runs[kind].append(run)
            progress(f"  median iteration {median(run['iteration_s']):.4f}s")
    report["runs"] = runs

    launches: dict[str, list[dict[str, Any]]] = {"torchx": [], "torchrun": [],
                                                 "torchrun_c10d": []}
    for index in range(plan.launch_repeats):
        names = list(launches)[index % 3:] + list(launches)[:index % 3]
        for name in names:
            out_dir = scratch / f"launch{index + 1}-{name}"
            cmd = launch_commands(plan, out_dir, peak_flops)[name]
            progress(f"launch {index + 1}/{plan.launch_repeats}: {name}")
            log_path = scratch / f"launch{index + 1}-{name}.log"
            result: dict[str, Any] = time_to_first_step(name, cmd, plan, log_path,
                                                        child_env(scratch))
            result["command"] = shlex.join(cmd)
            launches[name].append(result)
            progress(f"  first step after {result['first_step_s']:.2f}s")
            if not keep:
                shutil.rmtree(out_dir, ignore_errors=True)
    report["launch_runs"] = launches

    progress("fp32 matmul peak again (drift check)")
    report["peak_end"] = measure_peak(plan.peak_sizes, plan.peak_seconds)
    report["duration_s"] = time.perf_counter() - started
    report["results"] = summarize(plan, peak, runs, launches, report["peak_end"])
    return report


def summarize(plan: Plan, peak: dict[str, Any], runs: dict[str, list[dict[str, Any]]],
              launches: dict[str, list[dict[str, Any]]],
              peak_end: dict[str, Any]) -> dict[str, Any]:
    """The headline figures and the four targets from the raw measurements."""
    peak_flops = peak["peak_flops"]
    two = peak["two_processes"]
    cfg = MODEL_SIZES[plan.model]
    seq_len = cfg.max_seq_len
    flops_per_token = cfg.flops_per_token(seq_len)

    def figures(kind: str, nproc: int, field: str = "iteration_s") -> dict[str, float]:
        pooled = [t for run in runs[kind] for t in run[field]]
        step_s = median(pooled)
        tokens_per_s = plan.micro_batch * nproc * seq_len / step_s
        return {"median_step_s": step_s, "tokens_per_s": tokens_per_s,
                "mfu": tokens_per_s * flops_per_token / (nproc * peak_flops),
                "per_round_median_step_s": [median(run[field]) for run in runs[kind]],
                "measured_steps": len(pooled)}

    ours, minimal, ddp2 = figures("ours", 1), figures("minimal", 1), figures("ddp2", 2)
    ours_reported = figures("ours", 1, "reported_step_s")
    ddp2_reported = figures("ddp2", 2, "reported_step_s")
    torchx_s = median([r["first_step_s"] for r in launches["torchx"]])
    torchrun_s = median([r["first_step_s"] for r in launches["torchrun"]])
    torchrun_c10d_s = median([r["first_step_s"] for r in launches["torchrun_c10d"]])
    results = {
        "model": plan.model, "params": cfg.num_params(), "seq_len": seq_len,
        "micro_batch_per_rank": plan.micro_batch, "flops_per_token": flops_per_token,
        "peak_flops_per_thread": peak_flops,
        "peak_drift": peak_end["peak_flops"] / peak_flops - 1,
        # two concurrent single-threaded matmul processes over twice one alone (same size):
        # the scaling efficiency the hardware itself allows.
        "matmul_two_process_ratio": two["aggregate_median_flops"]
        / (2 * peak["by_size"][str(two["size"])]["median_flops"]),
        "single": ours, "minimal": minimal, "ddp2": ddp2,
        "single_trainer_reported": ours_reported, "ddp2_trainer_reported": ddp2_reported,
        "scaling_efficiency": ddp2["tokens_per_s"] / (2 * ours["tokens_per_s"]),
        "scaling_efficiency_trainer_reported":
            ddp2_reported["tokens_per_s"] / (2 * ours_reported["tokens_per_s"]),
        "loop_overhead": ours["median_step_s"] / minimal["median_step_s"] - 1,
        "loop_overhead_trainer_reported":
            ours_reported["median_step_s"] / minimal["median_step_s"] - 1,
        "launch_first_step_s": {"torchx": torchx_s, "torchrun": torchrun_s,
                                "torchrun_c10d": torchrun_c10d_s},
        "launch_ratio": torchx_s / torchrun_s,
        "launch_ratio_same_flags": torchx_s / torchrun_c10d_s,
    }
    results["targets"] = [
        target("scaling efficiency, 2 ranks", results["scaling_efficiency"], ">=", 0.90),
        target("MFU, our loop (1 proc, 1 thread)", ours["mfu"], ">=", 0.75),
        target("loop overhead vs minimal loop", results["loop_overhead"], "<=", 0.03,
               percent=True),
        target("launch ratio torchx / torchrun", results["launch_ratio"], "<=", 1.10),
    ]
    return results


def target(name: str, value: float, op: str, goal: float, percent: bool = False) -> dict:
    passed = value >= goal if op == ">=" else value <= goal
    return {"name": name, "value": value, "op": op, "target": goal, "percent": percent,
            "pass": passed}


# --------------------------------------------------------------------------- output


def fmt(value: float, percent: bool = False) -> str:
    return f"{100 * value:+.1f}%" if percent else f"{value:.3f}"


def table(report: dict[str, Any]) -> str:
    res = report["results"]
    peak = report["peak"]
    lines = []
    if report["quick"]:
        lines.append("QUICK SMOKE RUN: tiny sizes, few steps; the figures are not meaningful.")
    lines.append(f"{res['model']} model ({res['params'] / 1e6:.1f}M params, seq {res['seq_len']},"
                 f" micro-batch {res['micro_batch_per_rank']}/rank), {THREADS} thread/process, "
                 f"{report['host']['cpu']}")
    lines.append("")
    rows = [("target", "measured", "goal", "result")]
    for t in res["targets"]:
        goal = f"{t['op']} {fmt(t['target'], t['percent']).lstrip('+')}"
        rows.append((t["name"], fmt(t["value"], t["percent"]), goal,
                     "pass" if t["pass"] else "MISS"))
    lines += _columns(rows)
    lines.append("")
    info = [("figure", "value"),
            ("fp32 matmul peak, 1 thread", f"{peak['peak_flops'] / 1e9:.1f} GFLOP/s "
             f"(n={peak['best_size']}; drift at end {100 * res['peak_drift']:+.1f}%)"),
            ("2 matmul processes together / 2x one",
             f"{res['matmul_two_process_ratio']:.3f} (hardware ceiling for scaling)")]
    for key, label, nproc in (("single", "our loop, 1 proc", 1),
                              ("minimal", "minimal loop, 1 proc", 1),
                              ("ddp2", "our loop, DDP 2 ranks", 2)):
        f = res[key]
        info.append((label, f"{f['tokens_per_s']:,.0f} tok/s, MFU {f['mfu']:.3f}, "
                            f"{f['median_step_s'] * 1e3:.1f} ms/step ({nproc} x "
                            f"{res['micro_batch_per_rank']} seq)"))
    info.append(("overhead by trainer's own step_time_s",
                 fmt(res["loop_overhead_trainer_reported"], percent=True)))
    info.append(("scaling by trainer's own step_time_s",
                 fmt(res["scaling_efficiency_trainer_reported"])))
    launch = res["launch_first_step_s"]
    info.append(("time to step 1, torchx / torchrun",
                 f"{launch['torchx']:.2f}s / {launch['torchrun']:.2f}s (medians)"))
    info.append(("time to step 1, torchrun with dist.ddp's flags",
                 f"{launch['torchrun_c10d']:.2f}s: torchx / it = "
                 f"{res['launch_ratio_same_flags']:.3f}"))
    lines += _columns(info)
    return "\n".join(lines)


def _columns(rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows as aligned text: first and last column left-aligned, the others right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    last = len(widths) - 1
    out = []
    for index, row in enumerate(rows):
        cells = [cell.ljust(w) if i in (0, last) else cell.rjust(w)
                 for i, (cell, w) in enumerate(zip(row, widths, strict=True))]
        out.append("  ".join(cells).rstrip())
        if index == 0:
            out.append("  ".join("-" * w for w in widths))
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.throughput", description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="smoke check: tiny model, few steps, one repeat (under a minute)")
    parser.add_argument("--output", type=Path, default=None,
                        help="results JSON (default: bench/results/throughput.json, "
                             "or throughput_quick.json with --quick)")
    parser.add_argument("--rounds", type=int, help="override: rounds of the three runs")
    parser.add_argument("--steps", type=int, help="override: measured steps per run")
    parser.add_argument("--warmup", type=int, help="override: warm-up steps per run (>= 1)")
    parser.add_argument("--micro-batch", type=int, help="override: sequences per rank per step")
    parser.add_argument("--launch-repeats", type=int, help="override: runs of each launcher")
    parser.add_argument("--scratch", type=Path, default=None,
                        help="parent of the scratch directory (default: the system temp dir)")
    parser.add_argument("--keep-runs", action="store_true",
                        help="keep the scratch directory (logs, run directories)")
    parser.add_argument("--strict", action="store_true", help="exit 1 if any target is missed")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    plan = Plan.quick() if args.quick else Plan()
    for name in ("rounds", "steps", "warmup", "micro_batch", "launch_repeats"):
        value = getattr(args, name)
        if value is not None:
            if value < 1:
                raise SystemExit(f"--{name.replace('_', '-')} must be >= 1, got {value}")
            setattr(plan, name, value)
    output = args.output or RESULTS_DIR / ("throughput_quick.json" if args.quick
                                           else "throughput.json")
    torch.set_num_threads(THREADS)
    report = run_in_scratch("bench-throughput-", args.scratch, args.keep_runs,
                            lambda scratch: run_benchmark(plan, scratch, args.keep_runs,
                                                          args.quick))
    if report is None:
        return 2
    missed = [t["name"] for t in report["results"]["targets"] if not t["pass"]]
    return finish(output, report, table(report), missed, args.strict)


if __name__ == "__main__":
    sys.exit(main())
