"""Throughput, MFU (fp32, bf16, compiled), scaling, loop overhead, what deferring the host's
reads of the metrics to log steps gains, launch cost and the loss's memory: every performance
target in one run (docs/benchmarks.md).

One module of about 370 lines on purpose: the plan, its runs and the report that checks them
share the ``Plan`` and ``Variant`` types and are read together, top to bottom; the parts other
benchmarks share live in :mod:`bench.harness`."""

import dataclasses
import importlib
import json
import re
import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench import harness
from bench.harness import THREADS, WORKER, BenchError, median, trainer_args
from bench.peak import measure_peak
from trainers.core.metrics import bf16_matmul_hardware
from trainers.options.train_config import TrainConfig
from trainers.sizing.shapes import MODEL_SIZES

FIRST_STEP = re.compile(r"\bstep\s+1/\d+")  # rank 0's line after step 1: "step 1/N | loss ..."


@dataclass(frozen=True)
class Variant:
    """One way of training the plan's model: trainer, ranks and trainer flags."""

    trainer: str
    nproc: int
    flags: tuple[str, ...] = ()

    @property
    def bf16(self) -> bool:
        """Whether the variant computes in bf16 (``--dtype bf16``; its MFU is against the bf16
        peak)."""
        flags = list(self.flags)
        return "--dtype" in flags and flags[flags.index("--dtype") + 1] == "bf16"


# The trainers' --log-every: the loop's host reads the metrics at log steps (and a few others).
LOG_EVERY = next(f.default for f in dataclasses.fields(TrainConfig) if f.name == "log_every")
# "minimal" is bench/minimal_loop.py; the rest are our trainers, one thread per rank. The
# "_log1" kinds reproduce the cadence before metrics were deferred: a host read every step.
VARIANTS = {
    "ours": Variant("ddp", 1),
    "ours_log1": Variant("ddp", 1, ("--log-every", "1")),
    "compiled": Variant("ddp", 1, ("--compile",)),
    "ddp2": Variant("ddp", 2),
    "ddp2_log1": Variant("ddp", 2, ("--log-every", "1")),
    "ddp2_bf16_reduce": Variant("ddp", 2, ("--grad-reduce-dtype", "bf16")),
    "fsdp2": Variant("fsdp", 2),
    "bf16": Variant("ddp", 1, ("--dtype", "bf16")),
    "bf16_compiled": Variant("ddp", 1, ("--dtype", "bf16", "--compile")),
}
KINDS = ("ours", "minimal", *list(VARIANTS)[1:])
LAUNCHERS = ("torchx", "torchrun", "torchrun_c10d")
OVERRIDES = {"rounds": 1, "steps": 1, "warmup": 1, "micro_batch": 1, "launch_repeats": 1}
QUICK = {"model": "tiny", "warmup": 1, "steps": 3, "rounds": 1, "train_samples": 256,
         "launch_repeats": 1, "peak_sizes": (256, 512), "peak_seconds": 0.2, "loss_vocab": 4096,
         "loss_tokens": 256, "timeout_s": 300.0}


@dataclass
class Plan:
    model: str = "small"
    micro_batch: int = 8  # sequences per rank per step
    warmup: int = 5  # leading steps of every run left out of the medians (compilation included)
    steps: int = 20  # measured steps per run (each run trains warmup + steps)
    rounds: int = 3  # each round runs every kind once, in a rotating order
    train_samples: int = 1024
    launch_model: str = "tiny"
    launch_steps: int = 2
    launch_repeats: int = 5  # runs of each launch command
    peak_sizes: tuple[int, ...] = (1024, 2048, 4096)  # matrix sides of the peak probe
    peak_seconds: float = 2.0  # of probe samples per size
    loss_vocab: int = 128256  # the loss-memory check's vocabulary (llama-1b's)
    loss_tokens: int = 2048  # and its tokens per step
    timeout_s: float = 1200.0  # per subprocess


def iterations(stamps: Sequence[float], warmup: int, first_step: int) -> list[float]:
    """Differences of consecutive time stamps, the one ending step ``first_step`` first, left
    out up to step ``warmup``: the measured whole-iteration times."""
    periods = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    return periods[max(0, warmup + 1 - first_step):]


def worker(prefix: str, argv: Sequence[str]) -> None:
    """``trainers.<argv[0]>.main(argv[1:])`` with a ``time.perf_counter()`` stamp at the end of
    every ``trainers.core.loop.train_step`` (once per step, after its work; what the loop does
    between steps, its flushes of the metrics included, falls between two stamps), written to
    ``prefix`` by rank."""
    from trainers.core import loop

    stamps: list[float] = []
    train_step = loop.train_step

    def timed_step(*args: Any, **kwargs: Any) -> Any:
        metrics = train_step(*args, **kwargs)
        stamps.append(time.perf_counter())
        return metrics

    loop.train_step = timed_step  # this process only
    try:
        importlib.import_module(f"trainers.{argv[0]}").main(list(argv[1:]))
    finally:
        harness.write_rank(prefix, stamps)


def run_loop(plan: Plan, kind: str, tag: str, scratch: Path, peaks: dict[str, float]) -> dict:
    """One run of ``kind`` in fresh processes: ``minimal`` (:mod:`bench.minimal_loop`) or a
    :data:`VARIANTS` entry (the trainer with per-step stamps, :func:`worker`)."""
    variant = VARIANTS.get(kind, Variant("minimal", 1))
    nproc, total, out = variant.nproc, plan.warmup + plan.steps, scratch / tag
    result = {"tag": tag, "nproc": nproc, "threads_per_proc": THREADS,
              "global_batch": plan.micro_batch * nproc, "steps": total}
    if kind == "minimal":
        args = ["--model", plan.model, "--batch-size", str(plan.micro_batch), "--steps", str(total)]
        job = harness.run_ranks("bench.minimal_loop", args, 1, scratch, tag, plan.timeout_s)
        loop = job["ranks"][0]
        return {**result, "wall_s": job["wall_s"],
                "iteration_s": iterations(loop["stamps"], plan.warmup, first_step=1),
                "first_loss": loop["first_loss"], "final_loss": loop["final_loss"]}
    peak = peaks["bf16" if variant.bf16 else "fp32"]
    args = [*trainer_args(plan.model, plan.micro_batch * nproc, total, peak, plan.train_samples),
            *variant.flags]
    run = harness.run_trainer("bench.throughput", [WORKER, f"{out}.stamps", variant.trainer,
                                                   *args], nproc, scratch, tag, plan.timeout_s)
    stamps = json.loads(Path(f"{out}.stamps.rank0.json").read_text())
    if len(stamps) != total:
        raise BenchError(f"{tag}: expected {total} step stamps, got {len(stamps)}")
    return {**result, "wall_s": run["wall_s"],
            "iteration_s": iterations(stamps, plan.warmup, first_step=2),
            "reported_step_s": [r["step_time_s"] for r in run["records"]
                                if r["step"] > plan.warmup],
            "trainer_summary": {k: run["summary"].get(k) for k in
                                ("tokens_per_s", "mfu", "first_loss", "final_loss", "loss_floor",
                                 "data_share", "peak_memory_bytes", "world_size",
                                 "compile_time_s")}}


def loss_memory(plan: Plan, scratch: Path) -> dict[str, Any]:
    """Peak memory of one step of the loss (head, cross-entropy, backward) at ``loss_vocab``,
    chunked (:func:`trainers.core.loss.cross_entropy`) and plain (``F.cross_entropy`` on fp32
    logits), each in a fresh process (:mod:`bench.loss_memory`), fp32 and bf16 autocast."""
    out: dict[str, Any] = {}
    for dtype in ("fp32", "bf16"):
        for loss in ("chunked", "plain"):
            args = ["--vocab", str(plan.loss_vocab), "--tokens", str(plan.loss_tokens),
                    "--dtype", dtype, "--loss", loss]
            out[f"{dtype}_{loss}"] = harness.run_ranks(
                "bench.loss_memory", args, 1, scratch, f"loss-{dtype}-{loss}",
                plan.timeout_s)["ranks"][0]
    return out


def time_to_first_step(name: str, plan: Plan, scratch: Path, tag: str,
                       peak_flops: float) -> dict[str, Any]:
    """Seconds from spawning launcher ``name``'s command until a ``step 1/N`` line appears."""
    args = [*trainer_args(plan.launch_model, 2 * plan.micro_batch, plan.launch_steps,
                          peak_flops, 256), "--output-dir", str(scratch / tag)]
    cmd = {"torchx": ["torchx", "run", "-s", "local_cwd", "components/ddp.py:ddp",
                      "-j", "1x2", "--", *args],
           "torchrun": harness.launch("trainers.ddp", args, nproc=2),
           # with the torchrun flags the components write (components/launch.py): what they
           # cost apart from torchx itself
           "torchrun_c10d": ["torchrun", "--rdzv_backend", "c10d", "--rdzv_endpoint",
                             "localhost:0", "--rdzv_id", "bench", "--nnodes", "1",
                             "--nproc_per_node", "2", "--tee", "3", "--role", "", "-m",
                             "trainers.ddp", *args]}[name]
    exit_s = harness.run_logged(cmd, scratch, tag, plan.timeout_s)
    log = (scratch / f"{tag}.log").read_text().splitlines()[1:]  # "<seconds> <line>"
    seen = [float(line.split(" ", 1)[0]) for line in log if FIRST_STEP.search(line)]
    if not seen:
        raise BenchError(f"{name}: no 'step 1/' line in its output; see {scratch / tag}.log")
    return {"first_step_s": seen[0], "exit_s": exit_s, "command": shlex.join(cmd)}


def run(plan: Plan, scratch: Path) -> dict[str, Any]:
    """Peaks, the rounds of every kind, the launches, the loss's memory, the peak again; the
    figures. The bf16 kinds run only where bf16 matmuls have hardware."""
    bf16_hardware = bf16_matmul_hardware(torch.device("cpu"))
    peak = measure_peak(plan.peak_sizes, plan.peak_seconds)
    peak_bf16 = (measure_peak(plan.peak_sizes, plan.peak_seconds, torch.bfloat16)
                 if bf16_hardware else None)
    peaks = {"fp32": peak["peak_flops"], "bf16": peak_bf16["peak_flops"] if peak_bf16 else 0.0}
    # two single-threaded probe processes started together: the machine's scaling ceiling
    size, seconds = peak["best_size"], str(max(plan.peak_seconds, 1.0))
    ranks = harness.run_ranks("bench.peak", ["--sizes", str(size), "--seconds", seconds], 2,
                              scratch, "peak2", plan.timeout_s)["ranks"]
    two = [rank["by_size"][str(size)] for rank in ranks]
    peak["two_processes"] = {"size": size, "per_process": two,
                             "aggregate_median_flops": sum(p["median_flops"] for p in two)}
    kinds = [k for k in KINDS if bf16_hardware or not VARIANTS.get(k, Variant("", 1)).bf16]
    runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
    for index, kind in harness.rotations(kinds, plan.rounds):
        result = run_loop(plan, kind, f"round{index}-{kind}", scratch, peaks)
        runs[kind].append({**result, "round": index})
    launches: dict[str, list[dict[str, Any]]] = {name: [] for name in LAUNCHERS}
    for index, name in harness.rotations(LAUNCHERS, plan.launch_repeats):
        launches[name].append(time_to_first_step(name, plan, scratch, f"launch{index}-{name}",
                                                 peak["peak_flops"]))
    loss = loss_memory(plan, scratch)
    peak_end = measure_peak(plan.peak_sizes, plan.peak_seconds)  # the drift check
    return {"peak": peak, "peak_bf16": peak_bf16, "bf16_hardware": bf16_hardware, "runs": runs,
            "launch_runs": launches, "loss_memory": loss, "peak_end": peak_end,
            "results": summarize(plan, peaks, peak, runs, launches, loss, peak_end,
                                 bf16_hardware)}


def summarize(plan: Plan, peaks: dict[str, float], peak: dict, runs: dict, launches: dict,
              loss: dict, peak_end: dict, bf16_hardware: str | None) -> dict:
    """The headline figures and the targets from the raw measurements."""
    cfg = MODEL_SIZES[plan.model]
    flops_per_token = cfg.flops_per_token(cfg.max_seq_len)

    def figures(kind: str, field: str = "iteration_s") -> dict[str, Any]:
        nproc, pooled = runs[kind][0]["nproc"], [t for run in runs[kind] for t in run[field]]
        tokens_per_s = plan.micro_batch * nproc * cfg.max_seq_len / median(pooled)
        bf16 = VARIANTS.get(kind, Variant("", 1)).bf16
        compile_s = [r["trainer_summary"]["compile_time_s"] for r in runs[kind]
                     if r.get("trainer_summary", {}).get("compile_time_s") is not None]
        return {"median_step_s": median(pooled), "tokens_per_s": tokens_per_s,
                "mfu": tokens_per_s * flops_per_token / (nproc * peaks["bf16" if bf16 else "fp32"]),
                "per_round_median_step_s": [median(run[field]) for run in runs[kind]],
                "measured_steps": len(pooled),
                **({"compile_time_s": median(compile_s)} if compile_s else {})}

    def window(kind: str) -> dict[str, Any]:
        """tokens/s over the measured iterations' summed time: the interval average that holds
        the flush steps' waits too (a median of steps leaves them out)."""
        nproc, times = runs[kind][0]["nproc"], [run["iteration_s"] for run in runs[kind]]
        mean_s = sum(map(sum, times)) / sum(map(len, times))
        return {"mean_step_s": mean_s,
                "tokens_per_s": plan.micro_batch * nproc * cfg.max_seq_len / mean_s,
                "per_round_mean_step_s": [sum(t) / len(t) for t in times]}

    def deferral(kind: str) -> dict[str, Any]:
        """``kind`` (host reads at log steps) against ``kind``_log1 (a read every step), same
        rounds: the tokens/s ratio over all rounds and per round."""
        deferred, every = window(kind), window(f"{kind}_log1")
        return {"tokens_per_s": deferred["tokens_per_s"],
                "tokens_per_s_log_every_1": every["tokens_per_s"],
                "ratio": deferred["tokens_per_s"] / every["tokens_per_s"],
                "per_round_ratio": [b / a for a, b in zip(deferred["per_round_mean_step_s"],
                                                          every["per_round_mean_step_s"],
                                                          strict=True)]}

    first = {name: median([r["first_step_s"] for r in launches[name]]) for name in LAUNCHERS}
    res: dict[str, Any] = {
        "model": plan.model, "params": cfg.num_params(), "seq_len": cfg.max_seq_len,
        "micro_batch_per_rank": plan.micro_batch, "flops_per_token": flops_per_token,
        "peak_flops_per_thread": peaks["fp32"], "bf16_peak_flops_per_thread": peaks["bf16"],
        "bf16_hardware": bf16_hardware,
        "peak_drift": peak_end["peak_flops"] / peak["peak_flops"] - 1,
        "matmul_two_process_ratio": peak["two_processes"]["aggregate_median_flops"]
        / (2 * peak["by_size"][str(peak["two_processes"]["size"])]["median_flops"]),
        **{kind: figures(kind) for kind in runs},
        "single_trainer_reported": figures("ours", "reported_step_s"),
        "ddp2_trainer_reported": figures("ddp2", "reported_step_s"),
        "launch_first_step_s": first, "launch_ratio": first["torchx"] / first["torchrun"],
        "launch_ratio_same_flags": first["torchx"] / first["torchrun_c10d"],
        "loss_memory": {k: v["peak_delta_bytes"] for k, v in loss.items()}}
    res["host_sync_at_log_steps"] = {"log_every": LOG_EVERY, "single": deferral("ours"),
                                     "ddp2": deferral("ddp2")}
    res["fsdp_over_ddp"] = res["fsdp2"]["tokens_per_s"] / res["ddp2"]["tokens_per_s"]
    res["compile_speedup"] = res["ours"]["median_step_s"] / res["compiled"]["median_step_s"]
    res["single"] = res["ours"]  # the name the trainer-reported figures and older results use
    for own in ("", "_trainer_reported"):  # by our stamps, and by the trainer's step_time_s
        single, ddp2 = res[f"single{own}"], res[f"ddp2{own}"]
        res[f"scaling_efficiency{own}"] = ddp2["tokens_per_s"] / (2 * single["tokens_per_s"])
        res[f"loop_overhead{own}"] = single["median_step_s"] / res["minimal"]["median_step_s"] - 1
    res["scaling_efficiency_bf16_reduce"] = res["ddp2_bf16_reduce"]["tokens_per_s"] / (
        2 * res["single"]["tokens_per_s"])
    bf16_mfu = max((res[k]["mfu"] for k in ("bf16", "bf16_compiled") if k in res), default=None)
    targets = [("MFU fp32, our loop (1 proc, 1 thread)", res["ours"]["mfu"], ">=", 0.80, False),
               ("MFU bf16, best of eager/compiled", bf16_mfu, ">=", 0.50, False),
               ("scaling efficiency, DDP 2 ranks", res["scaling_efficiency"], ">=", 0.95, False),
               ("FSDP / DDP tokens/s, 2 ranks", res["fsdp_over_ddp"], ">=", 0.90, False),
               ("loop overhead vs minimal loop", res["loop_overhead"], "<=", 0.03, True),
               ("launch ratio torchx / torchrun", res["launch_ratio"], "<=", 1.10, False)]
    res["targets"] = [{"name": name, "value": value, "op": op, "target": goal,
                       "percent": percent,
                       "pass": None if value is None else
                       value >= goal if op == ">=" else value <= goal}
                      for name, value, op, goal, percent in targets]
    return res


def checks(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The targets that could be measured here (bf16 needs bf16 matmul hardware)."""
    return [t for t in report["results"]["targets"] if t["pass"] is not None]


def table(report: dict[str, Any]) -> str:
    res, peak, launch = report["results"], report["peak"], report["results"]["launch_first_step_s"]

    def fmt(value: float, percent: bool = False) -> str:
        return f"{100 * value:+.1f}%" if percent else f"{value:.3f}"

    def loop(key: str) -> str:
        row = res[key]
        compiled = (f", compile {row['compile_time_s']:.1f}s apart" if "compile_time_s" in row
                    else "")
        return (f"{row['tokens_per_s']:,.0f} tok/s, MFU {row['mfu']:.3f}, "
                f"{row['median_step_s'] * 1e3:.1f} ms/step{compiled}")

    no_bf16 = f"n/a: no bf16 matmul hardware ({torch.backends.cpu.get_cpu_capability()})"
    targets = [("target", "measured", "goal", "result"), *(
        (t["name"], no_bf16 if t["value"] is None else fmt(t["value"], t["percent"]),
         f"{t['op']} {fmt(t['target'], t['percent']).lstrip('+')}",
         "n/a" if t["pass"] is None else "pass" if t["pass"] else "MISS")
        for t in res["targets"])]
    names = {"ours": "our loop, 1 proc, fp32", "minimal": "minimal loop, 1 proc, fp32",
             "ours_log1": "our loop, 1 proc, fp32, --log-every 1",
             "compiled": "our loop, 1 proc, fp32, --compile", "ddp2": "DDP, 2 ranks, fp32",
             "ddp2_log1": "DDP, 2 ranks, fp32, --log-every 1",
             "ddp2_bf16_reduce": "DDP, 2 ranks, fp32, --grad-reduce-dtype bf16",
             "fsdp2": "FSDP, 2 ranks, fp32", "bf16": "our loop, 1 proc, bf16",
             "bf16_compiled": "our loop, 1 proc, bf16, --compile"}
    memory, sync = res["loss_memory"], res["host_sync_at_log_steps"]
    bf16_peak = (f"{res['bf16_peak_flops_per_thread'] / 1e9:.1f} GFLOP/s on "
                 f"{res['bf16_hardware']}" if res["bf16_hardware"] else no_bf16)
    info = [("figure", "value"),
            ("fp32 matmul peak, 1 thread", f"{peak['peak_flops'] / 1e9:.1f} GFLOP/s "
             f"(n={peak['best_size']}; drift at end {100 * res['peak_drift']:+.1f}%)"),
            ("bf16 matmul peak, 1 thread", bf16_peak),
            ("2 matmul processes together / 2x one",
             f"{res['matmul_two_process_ratio']:.3f} (hardware ceiling for scaling)"),
            *((names[kind], loop(kind)) for kind in names if kind in res),
            ("compiled / eager speed, fp32", f"{res['compile_speedup']:.3f}"),
            (f"host syncs only at log steps: tokens/s ratio (--log-every {sync['log_every']} / 1)",
             ", ".join(f"{label} {sync[key]['ratio']:.3f} (rounds " + " ".join(
                 f"{r:.3f}" for r in sync[key]["per_round_ratio"]) + ")"
                 for key, label in (("single", "1 proc"), ("ddp2", "DDP 2 ranks")))),
            ("overhead by trainer's own step_time_s",
             fmt(res["loop_overhead_trainer_reported"], percent=True)),
            ("scaling by trainer's own step_time_s",
             fmt(res["scaling_efficiency_trainer_reported"])),
            ("scaling, DDP 2 ranks with bf16 gradient reduction",
             fmt(res["scaling_efficiency_bf16_reduce"])),
            ("time to step 1, torchx / torchrun",
             f"{launch['torchx']:.2f}s / {launch['torchrun']:.2f}s (medians)"),
            ("time to step 1, torchrun with the components' flags",
             f"{launch['torchrun_c10d']:.2f}s: torchx / it = {res['launch_ratio_same_flags']:.3f}"),
            *((f"loss step peak memory, vocab {report['plan']['loss_vocab']:,}, {dtype}",
               f"chunked {memory[f'{dtype}_chunked'] / 2**20:,.0f} MiB, plain "
               f"{memory[f'{dtype}_plain'] / 2**20:,.0f} MiB "
               f"({memory[f'{dtype}_plain'] / memory[f'{dtype}_chunked']:.2f}x)")
              for dtype in ("fp32", "bf16"))]
    return "\n".join([f"{res['model']} model ({res['params'] / 1e6:.1f}M params, seq "
                      f"{res['seq_len']}, micro-batch {res['micro_batch_per_rank']}/rank), "
                      f"{THREADS} thread/process, {report['host']['cpu']}", "",
                      harness.columns(targets, left=(0, -1)), "",
                      harness.columns(info, left=(0, -1))])


if __name__ == "__main__":
    raise SystemExit(harness.main())
