"""Memory per rank and throughput of DDP, FSDP2 and tensor parallelism, two ranks on this CPU.

``python -m bench.sharded`` measures, in one run:

1. bytes per rank of parameters, gradients and optimizer state under DDP, FSDP with
   ``--reshard-after-forward false`` and FSDP with ``--reshard-after-forward true``, each with
   two ranks under torchrun. Each rank (``--worker VARIANT``) builds the model as the trainers
   do (``prepare_model``, then ``DDPStrategy`` or ``apply_fsdp`` + ``ShardedStrategy``), builds
   the optimizer with ``build_optimizer``, runs one real training step (``forward_backward`` on
   a micro-batch of the synthetic Markov-chain data, gradient clipping, ``optimizer.step()``)
   and then counts the live tensors: every parameter's local storage (a DTensor's local shard),
   its ``.grad`` and every tensor in ``optimizer.state``, each distinct storage once. During
   that step, between forward and backward, it also counts the parameters registered on the
   model, which is where resharding after forward shows. Each figure is printed next to its
   arithmetic (``P x 4`` bytes and so on) and the FSDP / DDP ratio of each category is checked
   against ``1 / N`` (within 5%);
2. tokens/s of the real trainers ``trainers.fsdp``, ``trainers.tensor_parallel --tp 2`` and
   ``trainers.ddp``, two ranks each at the same global batch, one thread per rank, read from
   each run's ``summary.json``, with the ratio to DDP.

It prints tables and writes every raw figure to ``bench/results/sharded.json`` (``--quick``: a
smoke check with the tiny model and a few steps, written to ``sharded_quick.json``). See
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import resource
import shlex
import shutil
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` and `trainers` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402

from bench.common import (  # noqa: E402
    RESULTS_DIR,
    THREADS,
    BenchError,
    child_env,
    finish,
    host_info,
    progress,
    run_in_scratch,
    run_streaming,
)
from bench.peak import measure_peak  # noqa: E402
from trainers.spec.shapes import MODEL_SIZES  # noqa: E402

NPROC = 2
FP32 = 4  # bytes per parameter, gradient and AdamW moment (fp32 training)
TOLERANCE = 0.05  # measured FSDP / DDP within 5% of 1 / N
# Memory variants: name -> (trainer whose options it parses, --reshard-after-forward).
MEMORY_VARIANTS: dict[str, tuple[str, bool | None]] = {
    "ddp": ("trainers.ddp", None),
    "fsdp_reshard_off": ("trainers.fsdp", False),
    "fsdp_reshard_on": ("trainers.fsdp", True),
}
# Throughput variants: name -> (trainer module, extra flags).
SPEED_VARIANTS: dict[str, tuple[str, list[str]]] = {
    "fsdp": ("trainers.fsdp", []),
    "tensor_parallel": ("trainers.tensor_parallel", ["--tp", str(NPROC)]),
    "ddp": ("trainers.ddp", []),
}
CATEGORIES = ("params", "grads", "optimizer")


@dataclass
class Plan:
    """Sizes and repetitions of one benchmark run."""

    memory_model: str = "small"
    memory_batch: int = 16  # global batch of the one measured step
    speed_model: str = "small"
    speed_batch: int = 16  # global batch of every throughput run
    steps: int = 20  # per throughput run; the trainer's summary leaves out the first 3
    rounds: int = 2  # each round runs the three trainers once, order rotating
    train_samples: int = 1024
    peak_sizes: tuple[int, ...] = (1024, 2048, 4096)
    peak_seconds: float = 2.0
    timeout_s: float = 1200.0  # per subprocess

    @classmethod
    def quick(cls) -> Plan:
        return cls(memory_model="tiny", speed_model="tiny", steps=5, rounds=1,
                   train_samples=256, peak_sizes=(256, 512), peak_seconds=0.2, timeout_s=180.0)


def torchrun(module: str, args: Sequence[str]) -> list[str]:
    """``python -m torch.distributed.run`` with NPROC ranks on a free rendezvous port."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(NPROC),
            "--rdzv_backend", "c10d", "--rdzv_endpoint", "localhost:0", "-m", module, *args]


# --------------------------------------------------------------------------- worker (one rank)


class Tally:
    """Bytes of a set of tensors: logical (numel x element size of each local tensor) and
    storage (each distinct underlying storage once, whatever views of it were seen)."""

    def __init__(self) -> None:
        self.tensors = 0
        self.numel = 0
        self.logical = 0
        self.storages: dict[int, int] = {}

    def add(self, tensor: torch.Tensor) -> None:
        if isinstance(tensor, DTensor):
            tensor = tensor.to_local()
        self.tensors += 1
        self.numel += tensor.numel()
        self.logical += tensor.numel() * tensor.element_size()
        storage = tensor.untyped_storage()
        self.storages.setdefault(storage.data_ptr(), storage.nbytes())

    def add_all(self, tensors: Iterable[torch.Tensor]) -> Tally:
        for tensor in tensors:
            self.add(tensor)
        return self

    @property
    def storage(self) -> int:
        return sum(self.storages.values())

    def as_dict(self) -> dict[str, int]:
        return {"storage_bytes": self.storage, "logical_bytes": self.logical,
                "numel": self.numel, "tensors": self.tensors, "storages": len(self.storages)}


def union(*tallies: Tally) -> int:
    """Storage bytes of several tallies together, shared storages once."""
    merged: dict[int, int] = {}
    for tally in tallies:
        merged.update(tally.storages)
    return sum(merged.values())


def worker(variant: str, model: str, batch_size: int, train_samples: int, out: Path) -> None:
    """One rank of a memory measurement (run under torchrun); writes ``out.rank<R>.json``."""
    from torch.distributed.device_mesh import init_device_mesh

    from trainers.core.data import BatchStream, MarkovChainDataset
    from trainers.core.distributed import init_distributed
    from trainers.core.loop import Strategy, build_optimizer, prepare_model
    from trainers.ddp import DDPStrategy
    from trainers.parallel.fsdp import ShardedStrategy, apply_fsdp
    from trainers.spec.config import parse_config

    prog, reshard = MEMORY_VARIANTS[variant]
    argv = ["--model", model, "--batch-size", str(batch_size),
            "--train-samples", str(train_samples)]
    if reshard is not None:
        argv += ["--reshard-after-forward", str(reshard).lower()]
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cfg = parse_config(argv, prog, world_sizes=[world], check_paths=False)
    torch.set_num_threads(THREADS)
    with init_distributed(cfg) as env:
        net = prepare_model(cfg, env.device)
        strategy: Strategy
        if reshard is None:
            strategy = DDPStrategy(net, env)
        else:
            mesh = init_device_mesh(env.device.type, (env.world_size,), mesh_dim_names=("dp",))
            apply_fsdp(net, mesh, cfg.reshard_after_forward, cfg.dtype == "bf16",
                       cfg.cpu_offload)
            strategy = ShardedStrategy(net, dp_rank=env.rank, dp_size=env.world_size)
        params = list(strategy.model.parameters())
        built = Tally().add_all(params)
        optimizer = build_optimizer(strategy.model, cfg)

        dataset = MarkovChainDataset(MODEL_SIZES[cfg.model].vocab_size, cfg.seq_len,
                                     cfg.train_samples, cfg.seed)
        stream = BatchStream(dataset, cfg.micro_batch(strategy.dp_size), strategy.dp_rank,
                             strategy.dp_size, cfg.seed)
        inputs, targets = next(stream)
        micro_batches = [(inputs.to(env.device), targets.to(env.device))]

        # Between forward and backward: wrap this strategy's loss (the forward of
        # forward_backward) to count the parameters registered on the model at that moment.
        between: dict[str, Any] = {}
        forward_loss = strategy.loss

        def loss_then_count(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            loss = forward_loss(inputs, targets)
            registered = Tally().add_all(strategy.model.parameters())
            between.update(registered.as_dict())
            # registered plus the sharded parameters, which FSDP keeps alive throughout
            between["alive_storage_bytes"] = union(registered, built)
            between["registered_dtensors"] = sum(
                isinstance(p, DTensor) for p in strategy.model.parameters())
            return loss

        strategy.loss = loss_then_count  # type: ignore[method-assign]
        torch.manual_seed(cfg.seed + env.rank)  # as train() does (dropout is 0 here anyway)
        optimizer.zero_grad(set_to_none=True)
        loss = strategy.forward_backward(micro_batches, strategy.autocast(cfg.dtype, env.device))
        grad_norm = strategy.clip_grad_norm(cfg.grad_clip)
        optimizer.step()
        strategy.loss = forward_loss  # type: ignore[method-assign]

        params = list(strategy.model.parameters())
        after = Tally().add_all(params)
        grads = Tally().add_all(p.grad for p in params if p.grad is not None)
        optim = Tally()
        steps = Tally()
        for state in optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor):
                    optim.add(value)
                    if key == "step":
                        steps.add(value)
        everything = union(after, grads, optim)
        tied = net.head.weight is net.tok_emb.weight
        record = {
            "variant": variant, "rank": env.rank, "world_size": env.world_size,
            "model": cfg.model, "device": str(env.device), "trainer_options_of": prog,
            "reshard_after_forward": reshard, "micro_batch": cfg.micro_batch(strategy.dp_size),
            "seq_len": cfg.seq_len,
            "loss": strategy.mean_over_replicas(loss), "grad_norm": grad_norm,
            "param_tensors": len(params), "head_tied_to_embedding": tied,
            "params_at_build": built.as_dict(),
            "params": after.as_dict(), "grads": grads.as_dict(), "optimizer": optim.as_dict(),
            "optimizer_step_counters": steps.as_dict(),
            "optimizer_state_keys": sorted({k for s in optimizer.state.values() for k in s}),
            "between_forward_backward": between,
            "total_storage_bytes": everything,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        }
    Path(f"{out}.rank{record['rank']}.json").write_text(json.dumps(record, indent=2) + "\n")


# --------------------------------------------------------------------------- memory (driver)


def shard_numels(model: str, nproc: int) -> dict[str, Any]:
    """Parameter shapes of ``model`` (built on the meta device) and the per-rank FSDP shard:
    FSDP2 splits dim 0 into ``nproc`` chunks of ceil(d0 / nproc) rows and pads every rank's
    shard to that size."""
    from trainers.core.model import build_model

    with torch.device("meta"):
        net = build_model(model)
    shapes = [tuple(p.shape) for p in net.parameters()]
    total = sum(math.prod(s) for s in shapes)
    padded = sum(math.ceil(s[0] / nproc) * math.prod(s[1:]) for s in shapes)
    return {"param_tensors": len(shapes), "numel": total, "padded_shard_numel": padded}


def memory_expectations(model: str, nproc: int) -> dict[str, dict[str, dict[str, Any]]]:
    """The arithmetic for every (variant, category): bytes per rank and the formula."""
    p = MODEL_SIZES[model].num_params()
    shapes = shard_numels(model, nproc)
    if shapes["numel"] != p:
        raise BenchError(f"{model}: the model has {shapes['numel']:,} parameters but "
                         f"MODEL_SIZES says {p:,}")
    t = shapes["param_tensors"]
    shard = shapes["padded_shard_numel"]
    pad = shard * nproc - p  # elements of padding summed over the ranks
    n = nproc

    def entry(value: int, formula: str) -> dict[str, Any]:
        return {"bytes": value, "formula": formula}

    shard_f = f"P*4/{n}" + (f" + pad {pad * FP32 // n:,}" if pad else "")
    # The root module (embedding = tied head, positions, final norm) is never resharded after
    # forward (apply_fsdp): it stays gathered in both modes.
    cfg = MODEL_SIZES[model]
    root = (cfg.vocab_size + cfg.max_seq_len + 2) * cfg.d_model
    root_f = f"R*4 + (P-R)*4/{n}, R={root:,} root params"
    steps_f = f"4*T (T={t} step counters)"
    return {
        "ddp": {
            "params": entry(p * FP32, "P*4"), "grads": entry(p * FP32, "P*4"),
            "optimizer": entry(2 * p * FP32 + t * FP32, f"2*P*4 + {steps_f}"),
            "between": entry(p * FP32, "P*4 (replica)"),
            "between_alive": entry(p * FP32, "P*4"),
        },
        "fsdp_reshard_off": {
            "params": entry(shard * FP32, shard_f), "grads": entry(shard * FP32, shard_f),
            "optimizer": entry(2 * shard * FP32 + t * FP32, f"2*({shard_f}) + {steps_f}"),
            "between": entry(p * FP32, "P*4 (unsharded, kept for backward)"),
            "between_alive": entry(p * FP32 + shard * FP32, f"P*4 + {shard_f}"),
        },
        "fsdp_reshard_on": {
            "params": entry(shard * FP32, shard_f), "grads": entry(shard * FP32, shard_f),
            "optimizer": entry(2 * shard * FP32 + t * FP32, f"2*({shard_f}) + {steps_f}"),
            "between": entry((shard - root // n + root) * FP32, f"{root_f} (blocks resharded)"),
            "between_alive": entry((shard + root) * FP32, f"{shard_f} + R*4"),
        },
        "_model": {"P": p, "T": t, "R": root, "padded_shard_numel": shard,
                   "padding_numel": pad},
    }


def run_memory(plan: Plan, variant: str, scratch: Path) -> dict[str, Any]:
    """One memory measurement under torchrun; each rank's record."""
    prefix = scratch / f"memory-{variant}"
    args = ["--worker", variant, "--model", plan.memory_model,
            "--batch-size", str(plan.memory_batch), "--train-samples", str(plan.train_samples),
            "--worker-out", str(prefix)]
    cmd = torchrun("bench.sharded", args)
    wall = run_streaming(cmd, plan.timeout_s, scratch / f"memory-{variant}.log",
                         child_env(scratch))
    ranks = []
    for rank in range(NPROC):
        path = Path(f"{prefix}.rank{rank}.json")
        if not path.exists():
            raise BenchError(f"memory {variant}: rank {rank} wrote no {path.name}")
        ranks.append(json.loads(path.read_text()))
    return {"variant": variant, "command": shlex.join(cmd), "wall_s": wall, "ranks": ranks}


def memory_figure(run: dict[str, Any], category: str, field: str = "storage_bytes") -> int:
    """The largest per-rank figure of ``category`` (the ranks agree when shapes divide)."""
    if category == "between":
        return max(r["between_forward_backward"][field] for r in run["ranks"])
    if category == "between_alive":
        return max(r["between_forward_backward"]["alive_storage_bytes"] for r in run["ranks"])
    return max(r[category][field] for r in run["ranks"])


def summarize_memory(plan: Plan, runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    expect = memory_expectations(plan.memory_model, NPROC)
    model = expect["_model"]
    rows = []
    for variant in MEMORY_VARIANTS:
        for category in (*CATEGORIES, "between", "between_alive"):
            measured = memory_figure(runs[variant], category)
            exp = expect[variant][category]
            rows.append({"variant": variant, "category": category, "measured_bytes": measured,
                         "expected_bytes": exp["bytes"], "formula": exp["formula"],
                         "measured_over_expected": measured / exp["bytes"]})
    checks = []
    ddp = runs["ddp"]
    for variant in ("fsdp_reshard_off", "fsdp_reshard_on"):
        for category in CATEGORIES:
            ratio = memory_figure(runs[variant], category) / memory_figure(ddp, category)
            checks.append(check(f"{variant} / ddp, {category}", ratio, 1 / NPROC))
    on = memory_figure(runs["fsdp_reshard_on"], "between")
    off = memory_figure(runs["fsdp_reshard_off"], "between")
    root = model["R"]
    checks.append(check("params between fwd and bwd, reshard on / off", on / off,
                        (root + (model["P"] - root) / NPROC) / model["P"]))
    checks.append(check("params between fwd and bwd, reshard off / ddp", off /
                        memory_figure(ddp, "between"), 1.0))
    for variant in ("fsdp_reshard_off", "fsdp_reshard_on"):
        total = sum(r["params"]["numel"] for r in runs[variant]["ranks"])
        checks.append({"name": f"{variant}: parameter elements summed over ranks = P",
                       "value": total, "target": model["P"], "pass": total == model["P"]})
    losses = {v: runs[v]["ranks"][0]["loss"] for v in MEMORY_VARIANTS}
    spread = (max(losses.values()) - min(losses.values())) / abs(losses["ddp"])
    checks.append({"name": "step-1 loss equal across variants (rel. spread <= 1e-5)",
                   "value": spread, "target": 1e-5, "pass": spread <= 1e-5})
    return {"model": plan.memory_model, "nproc": NPROC, **model, "rows": rows,
            "losses": losses, "checks": checks}


def check(name: str, ratio: float, goal: float) -> dict[str, Any]:
    return {"name": name, "value": ratio, "target": goal,
            "pass": abs(ratio / goal - 1) <= TOLERANCE}


# --------------------------------------------------------------------------- throughput


def trainer_args(plan: Plan, out_dir: Path, peak_flops: float) -> list[str]:
    """Flags of a pure throughput run: no evaluation, TensorBoard or mid-run checkpoints."""
    return ["--model", plan.speed_model, "--steps", str(plan.steps),
            "--batch-size", str(plan.speed_batch), "--grad-accum", "1", "--eval-every", "0",
            "--checkpoint-every", "0", "--tensorboard", "false", "--resume", "none",
            "--output-dir", str(out_dir), "--peak-tflops", f"{peak_flops / 1e12:.6g}",
            "--train-samples", str(plan.train_samples), "--val-samples", "64"]


def run_speed(plan: Plan, variant: str, tag: str, scratch: Path,
              peak_flops: float) -> dict[str, Any]:
    module, extra = SPEED_VARIANTS[variant]
    run_dir = scratch / tag
    cmd = torchrun(module, [*trainer_args(plan, run_dir, peak_flops), *extra])
    wall = run_streaming(cmd, plan.timeout_s, scratch / f"{tag}.log", child_env(scratch))
    summary = json.loads((run_dir / "summary.json").read_text())
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    timed = [r["step_time_s"] for r in records[3:]] or [r["step_time_s"] for r in records]
    shutil.rmtree(run_dir, ignore_errors=True)
    return {"variant": variant, "tag": tag, "command": shlex.join(cmd), "wall_s": wall,
            "step_time_s": [r["step_time_s"] for r in records],
            "median_step_s": statistics.median(timed),
            "summary": {k: summary.get(k) for k in
                        ("tokens_per_s", "mfu", "peak_memory_bytes", "first_loss",
                         "final_loss", "world_size", "steps")}}


def summarize_speed(plan: Plan, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    tokens_per_step = plan.speed_batch * MODEL_SIZES[plan.speed_model].max_seq_len
    out: dict[str, Any] = {"model": plan.speed_model, "global_batch": plan.speed_batch,
                           "tokens_per_step": tokens_per_step}
    for variant, variant_runs in runs.items():
        out[variant] = {
            "tokens_per_s": statistics.median(r["summary"]["tokens_per_s"] for r in variant_runs),
            "mfu": statistics.median(r["summary"]["mfu"] for r in variant_runs),
            "peak_memory_bytes": max(r["summary"]["peak_memory_bytes"] for r in variant_runs),
            "median_step_s": statistics.median(
                t for r in variant_runs for t in r["step_time_s"][3:] or r["step_time_s"]),
            "per_round_tokens_per_s": [r["summary"]["tokens_per_s"] for r in variant_runs],
        }
    for variant in runs:
        out[variant]["vs_ddp"] = out[variant]["tokens_per_s"] / out["ddp"]["tokens_per_s"]
    return out


# --------------------------------------------------------------------------- the benchmark


def run_benchmark(plan: Plan, scratch: Path, quick: bool,
                  peak_tflops: float | None) -> dict[str, Any]:
    started = time.perf_counter()
    report: dict[str, Any] = {
        "benchmark": "bench.sharded", "schema": 1, "quick": quick, "nproc": NPROC,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": host_info(), "plan": dataclasses.asdict(plan), "threads_per_process": THREADS,
    }
    memory_runs = {}
    for variant in MEMORY_VARIANTS:
        progress(f"memory: {variant}, {plan.memory_model} model, {NPROC} ranks")
        memory_runs[variant] = run_memory(plan, variant, scratch)
    report["memory_runs"] = memory_runs
    report["memory"] = summarize_memory(plan, memory_runs)

    if peak_tflops is None:
        progress(f"fp32 matmul peak at {THREADS} thread, sizes {list(plan.peak_sizes)}")
        peak = measure_peak(plan.peak_sizes, plan.peak_seconds)
        peak_flops = peak["peak_flops"]
    else:
        peak, peak_flops = {"given_tflops": peak_tflops}, peak_tflops * 1e12
    report["peak"] = {**peak, "peak_flops_used": peak_flops}
    progress(f"peak {peak_flops / 1e9:.1f} GFLOP/s per rank (for MFU)")

    speed_runs: dict[str, list[dict[str, Any]]] = {v: [] for v in SPEED_VARIANTS}
    order = list(SPEED_VARIANTS)
    for index in range(plan.rounds):
        for variant in order[index % 3:] + order[:index % 3]:
            progress(f"throughput round {index + 1}/{plan.rounds}: {variant} "
                     f"({plan.steps} steps)")
            run = run_speed(plan, variant, f"round{index + 1}-{variant}", scratch, peak_flops)
            run["round"] = index + 1
            speed_runs[variant].append(run)
            progress(f"  {run['summary']['tokens_per_s']:,.0f} tok/s")
    report["speed_runs"] = speed_runs
    report["speed"] = summarize_speed(plan, speed_runs)
    report["duration_s"] = time.perf_counter() - started
    return report


# --------------------------------------------------------------------------- output


def columns(rows: Sequence[Sequence[str]], right: Sequence[int]) -> list[str]:
    """Rows as aligned text, the columns in ``right`` right-aligned, the others left-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    out = []
    for index, row in enumerate(rows):
        cells = [cell.rjust(w) if i in right else cell.ljust(w)
                 for i, (cell, w) in enumerate(zip(row, widths, strict=True))]
        out.append("  ".join(cells).rstrip())
        if index == 0:
            out.append("  ".join("-" * w for w in widths))
    return out


def human(value: float) -> str:
    if abs(value) >= 2**20:
        return f"{value / 2**20:.2f} MiB"
    return f"{value / 2**10:.1f} KiB"


LABELS = {"params": "parameters", "grads": "gradients", "optimizer": "optimizer state",
          "between": "params registered fwd->bwd", "between_alive": "param storage alive fwd->bwd"}


def table(report: dict[str, Any]) -> str:
    mem = report["memory"]
    lines = []
    if report["quick"]:
        lines.append("QUICK SMOKE RUN: tiny model, few steps; timings are not meaningful.")
    lines.append(f"Memory per rank, {mem['model']} model (P = {mem['P']:,} parameters in "
                 f"{mem['T']} tensors), {NPROC} ranks, after one training step (fp32, AdamW)")
    lines.append("")
    rows = [("variant", "category", "measured", "arithmetic", "expected", "meas/exp")]
    for row in mem["rows"]:
        rows.append((row["variant"], LABELS[row["category"]], human(row["measured_bytes"]),
                     row["formula"], human(row["expected_bytes"]),
                     f"{row['measured_over_expected']:.4f}"))
    lines += columns(rows, right=(2, 4, 5))
    lines.append("")
    rows = [("check", "measured", "target", "result")]
    for c in mem["checks"]:
        value = f"{c['value']:.4f}" if isinstance(c["value"], float) else f"{c['value']:,}"
        goal = c["target"]
        target = (f"{goal:.4f} +-{100 * TOLERANCE:.0f}%" if isinstance(goal, float) and goal > 1e-3
                  else f"{goal:,}" if isinstance(goal, int) else f"<= {goal:g}")
        rows.append((c["name"], value, target, "pass" if c["pass"] else "MISS"))
    lines += columns(rows, right=(1, 2))
    lines.append("")
    speed = report["speed"]
    lines.append(f"Throughput, {speed['model']} model, global batch {speed['global_batch']} "
                 f"({speed['tokens_per_step']:,} tokens/step), {NPROC} ranks x {THREADS} thread, "
                 f"peak {report['peak']['peak_flops_used'] / 1e9:.1f} GFLOP/s per rank")
    lines.append("")
    rows = [("trainer", "tokens/s", "vs ddp", "MFU", "median step", "peak RSS rank 0")]
    for variant in SPEED_VARIANTS:
        f = speed[variant]
        rows.append((variant, f"{f['tokens_per_s']:,.0f}", f"{f['vs_ddp']:.3f}",
                     f"{100 * f['mfu']:.1f}%", f"{1e3 * f['median_step_s']:.0f} ms",
                     human(f["peak_memory_bytes"])))
    lines += columns(rows, right=(1, 2, 3, 4, 5))
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.sharded", description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="smoke check: tiny model, few steps, one round (about a minute)")
    parser.add_argument("--output", type=Path, default=None,
                        help="results JSON (default: bench/results/sharded.json, "
                             "or sharded_quick.json with --quick)")
    parser.add_argument("--steps", type=int, help="override: steps per throughput run (>= 4)")
    parser.add_argument("--rounds", type=int, help="override: rounds of the three trainers")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="peak TFLOP/s per rank for MFU (default: measured at 1 thread)")
    parser.add_argument("--scratch", type=Path, default=None,
                        help="parent of the scratch directory (default: the system temp dir)")
    parser.add_argument("--keep-runs", action="store_true", help="keep the scratch directory")
    parser.add_argument("--strict", action="store_true", help="exit 1 if any check misses")
    # internal: one rank of a memory measurement, launched by the driver under torchrun
    parser.add_argument("--worker", choices=sorted(MEMORY_VARIANTS), help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--model", default="small", help=argparse.SUPPRESS)
    parser.add_argument("--batch-size", type=int, default=16, help=argparse.SUPPRESS)
    parser.add_argument("--train-samples", type=int, default=1024, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args.worker, args.model, args.batch_size, args.train_samples, args.worker_out)
        return 0
    plan = Plan.quick() if args.quick else Plan()
    if args.steps is not None:
        if args.steps < 4:
            raise SystemExit("--steps must be >= 4 (the trainer's summary skips 3 warm-up steps)")
        plan.steps = args.steps
    if args.rounds is not None:
        if args.rounds < 1:
            raise SystemExit(f"--rounds must be >= 1, got {args.rounds}")
        plan.rounds = args.rounds
    output = args.output or RESULTS_DIR / ("sharded_quick.json" if args.quick else "sharded.json")
    torch.set_num_threads(THREADS)
    report = run_in_scratch("bench-sharded-", args.scratch, args.keep_runs,
                            lambda scratch: run_benchmark(plan, scratch, args.quick,
                                                          args.peak_tflops))
    if report is None:
        return 2
    missed = [c["name"] for c in report["memory"]["checks"] if not c["pass"]]
    return finish(output, report, table(report), missed, args.strict)


if __name__ == "__main__":
    sys.exit(main())
