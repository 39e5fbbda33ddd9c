"""Memory per rank and throughput of DDP, FSDP2 and tensor parallelism (docs/benchmarks.md)."""

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from bench import harness
from bench.harness import THREADS, BenchError, human, median
from bench.memory_probe import Tally, union
from bench.peak import measure_peak
from trainers.core.metrics import peak_memory_bytes
from trainers.sizing.shapes import MODEL_SIZES

NPROC = 2
FP32 = 4  # bytes per parameter, gradient and AdamW moment (fp32 training)
TOLERANCE = 0.05  # measured FSDP / DDP within 5% of 1 / N
# variant -> the trainer and its extra flags
MEMORY_VARIANTS = {"ddp": "ddp", "fsdp_reshard_off": "fsdp --reshard-after-forward false",
                   "fsdp_reshard_on": "fsdp --reshard-after-forward true"}
SPEED_VARIANTS = {"fsdp": "fsdp", "tensor_parallel": f"tensor_parallel --tp {NPROC}", "ddp": "ddp"}
CATEGORIES = ("params", "grads", "optimizer")
ALL_CATEGORIES = (*CATEGORIES, "between", "between_alive")
LABELS = {"params": "parameters", "grads": "gradients", "optimizer": "optimizer state",
          "between": "params registered fwd->bwd", "between_alive": "param storage alive fwd->bwd"}
OVERRIDES = {"steps": 4, "rounds": 1, "peak_tflops": 0.0}  # steps: the summary skips 3
QUICK = {"memory_model": "tiny", "speed_model": "tiny", "steps": 5, "rounds": 1,
         "train_samples": 256, "peak_sizes": (256, 512), "peak_seconds": 0.2, "timeout_s": 180.0}


@dataclass
class Plan:
    memory_model: str = "small"
    memory_batch: int = 16  # global batch of the one measured step
    speed_model: str = "small"
    speed_batch: int = 16  # global batch of every throughput run
    steps: int = 20  # per throughput run; the trainer's summary leaves out the first 3
    rounds: int = 2  # each round runs the three trainers once, order rotating
    train_samples: int = 1024
    peak_sizes: tuple[int, ...] = (1024, 2048, 4096)
    peak_seconds: float = 2.0
    peak_tflops: float = 0.0  # per rank, for MFU; 0: measure it at one thread
    timeout_s: float = 1200.0  # per subprocess


def measure(cfg: Any, env: Any, build: Callable[[Any, Any, Any], Any]) -> dict[str, Any]:
    """One rank of a memory measurement (:func:`bench.harness.serve_rank`): the trainer's
    strategy and optimizer, one training step, then the bytes of every live tensor."""
    from trainers.core.batch_stream import BatchStream
    from trainers.core.data import build_datasets
    from trainers.core.loop import build_optimizer
    from trainers.models import spec_of

    strategy = build(cfg, env, spec_of(cfg))
    built = Tally(strategy.model.parameters())
    optimizer = build_optimizer(strategy.model, cfg)
    train_set, _ = build_datasets(cfg, env)
    micro = cfg.micro_batch(strategy.dp_size)
    inputs, targets = next(BatchStream(train_set, micro, strategy.dp_rank, strategy.dp_size,
                                       cfg.seed))
    # Between forward and backward (after the strategy's loss, the forward of forward_backward):
    # the parameters registered then, and with the sharded ones FSDP keeps throughout, alive.
    between: dict[str, Any] = {}
    forward_loss = strategy.loss

    def loss_then_count(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        loss, registered = forward_loss(inputs, targets), list(strategy.model.parameters())
        tally = Tally(registered)
        between.update(tally.as_dict(), alive_storage_bytes=union(tally, built),
                       registered_dtensors=sum(isinstance(p, DTensor) for p in registered))
        return loss

    strategy.loss = loss_then_count
    torch.manual_seed(cfg.seed + env.rank)  # as train() does (dropout is 0 here anyway)
    loss = strategy.forward_backward([(inputs.to(env.device), targets.to(env.device))],
                                     strategy.autocast(cfg.dtype, env.device))
    grad_norm = strategy.clip_grad_norm(cfg.grad_clip)
    optimizer.step()
    params = list(strategy.model.parameters())
    after, grads = Tally(params), Tally(p.grad for p in params)
    state = [(k, v) for s in optimizer.state.values() for k, v in s.items()
             if isinstance(v, torch.Tensor)]
    optim = Tally(v for _, v in state)
    net = getattr(strategy.model, "module", strategy.model)  # under DDP, the wrapped model
    return {
        "model": cfg.model, "device": str(env.device), "micro_batch": micro,
        "seq_len": cfg.seq_len, "loss": strategy.mean_over_replicas(loss),
        "grad_norm": grad_norm, "param_tensors": len(params),
        "head_tied_to_embedding": net.head.weight is net.tok_emb.weight,
        "params_at_build": built.as_dict(), "params": after.as_dict(), "grads": grads.as_dict(),
        "optimizer": optim.as_dict(),
        "optimizer_step_counters": Tally(v for k, v in state if k == "step").as_dict(),
        "optimizer_state_keys": sorted({k for k, _ in state}),
        "between_forward_backward": between, "total_storage_bytes": union(after, grads, optim),
        "peak_rss_bytes": peak_memory_bytes(torch.device("cpu"))}


def memory_expectations(model: str, nproc: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Bytes per rank and formula for every variant and category; the model's P, T, R, padding.
    FSDP2 splits dim 0 into ``nproc`` chunks of ceil(d0 / nproc) rows, padding every shard."""
    from trainers.models import resolve_spec

    cfg = MODEL_SIZES[model]
    p, shapes = cfg.num_params(), [q.shape for q in resolve_spec(model).meta_model().parameters()]
    if sum(math.prod(s) for s in shapes) != p:
        raise BenchError(f"{model}: the model's parameters disagree with MODEL_SIZES ({p:,})")
    t, n = len(shapes), nproc
    shard = sum(math.ceil(s[0] / n) * math.prod(s[1:]) for s in shapes)
    pad = shard * n - p  # elements of padding summed over the ranks
    shard_f = f"P*4/{n}" + (f" + pad {pad * FP32 // n:,}" if pad else "")
    steps_f = f"4*T (T={t} step counters)"
    # R: the root module (tied embedding and head, positions, final norm), never resharded
    root = (cfg.vocab_size + cfg.max_seq_len + 2) * cfg.d_model
    expect = {"ddp": [(p, "P*4"), (p, "P*4"), (2 * p + t, f"2*P*4 + {steps_f}"),
                      (p, "P*4 (replica)"), (p, "P*4")]}
    for variant, between, alive in (
            ("fsdp_reshard_off", (p, "P*4 (unsharded, kept for backward)"),
             (p + shard, f"P*4 + {shard_f}")),
            ("fsdp_reshard_on", (shard - root // n + root,
                                 f"R*4 + (P-R)*4/{n}, R={root:,} root params (blocks resharded)"),
             (shard + root, f"{shard_f} + R*4"))):
        expect[variant] = [(shard, shard_f), (shard, shard_f),
                           (2 * shard + t, f"2*({shard_f}) + {steps_f}"), between, alive]
    return ({v: {c: {"bytes": numel * FP32, "formula": formula}
                 for c, (numel, formula) in zip(ALL_CATEGORIES, e, strict=True)}
             for v, e in expect.items()},
            {"P": p, "T": t, "R": root, "padded_shard_numel": shard, "padding_numel": pad})


def check(name: str, value: float, goal: float, passed: bool | None = None) -> dict[str, Any]:
    """A check of ``value`` against ``goal``: within TOLERANCE of it unless ``passed`` says."""
    return {"name": name, "value": value, "target": goal,
            "pass": abs(value / goal - 1) <= TOLERANCE if passed is None else passed}


def summarize_memory(plan: Plan, runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Every measured figure (the largest per-rank storage bytes; the ranks agree when shapes
    divide) next to its arithmetic, and the checks."""
    expect, model = memory_expectations(plan.memory_model, NPROC)
    between = {"between": "storage_bytes", "between_alive": "alive_storage_bytes"}
    got = {(v, c): max(r["between_forward_backward"][between[c]] if c in between
                       else r[c]["storage_bytes"] for r in runs[v]["ranks"])
           for v in MEMORY_VARIANTS for c in ALL_CATEGORIES}
    rows = [{"variant": v, "category": c, "measured_bytes": got[v, c],
             "expected_bytes": expect[v][c]["bytes"], "formula": expect[v][c]["formula"],
             "measured_over_expected": got[v, c] / expect[v][c]["bytes"]} for v, c in got]
    fsdp, p, root = ("fsdp_reshard_off", "fsdp_reshard_on"), model["P"], model["R"]
    checks = [check(f"{v} / ddp, {c}", got[v, c] / got["ddp", c], 1 / NPROC)
              for v in fsdp for c in CATEGORIES]
    checks.append(check("params between fwd and bwd, reshard on / off",
                        got["fsdp_reshard_on", "between"] / got["fsdp_reshard_off", "between"],
                        (root + (p - root) / NPROC) / p))
    checks.append(check("params between fwd and bwd, reshard off / ddp",
                        got["fsdp_reshard_off", "between"] / got["ddp", "between"], 1.0))
    for variant in fsdp:
        total = sum(r["params"]["numel"] for r in runs[variant]["ranks"])
        checks.append(check(f"{variant}: parameter elements summed over ranks = P", total, p,
                            total == p))
    losses = {v: runs[v]["ranks"][0]["loss"] for v in MEMORY_VARIANTS}
    spread = (max(losses.values()) - min(losses.values())) / abs(losses["ddp"])
    checks.append(check("step-1 loss equal across variants (rel. spread <= 1e-5)", spread,
                        1e-5, spread <= 1e-5))
    return {"model": plan.memory_model, "nproc": NPROC, **model, "rows": rows,
            "losses": losses, "checks": checks}


def run(plan: Plan, scratch: Path) -> dict[str, Any]:
    """The three memory measurements, the peak, the rounds of throughput runs; summaries."""
    memory_runs = {}
    for variant, trainer in MEMORY_VARIANTS.items():
        args = [*trainer.split(), "--model", plan.memory_model, "--batch-size",
                str(plan.memory_batch), "--train-samples", str(plan.train_samples)]
        memory_runs[variant] = {"variant": variant, **harness.run_ranks(
            "bench.sharded", args, NPROC, scratch, f"memory-{variant}", plan.timeout_s)}
    peak = ({"given_tflops": plan.peak_tflops, "peak_flops": plan.peak_tflops * 1e12}
            if plan.peak_tflops else measure_peak(plan.peak_sizes, plan.peak_seconds))
    peak["peak_flops_used"] = peak["peak_flops"]
    speed_runs: dict[str, list[dict[str, Any]]] = {v: [] for v in SPEED_VARIANTS}
    for index, variant in harness.rotations(list(SPEED_VARIANTS), plan.rounds):
        trainer, *extra = SPEED_VARIANTS[variant].split()
        args = harness.trainer_args(plan.speed_model, plan.speed_batch, plan.steps,
                                    peak["peak_flops"], plan.train_samples)
        tag = f"round{index}-{variant}"
        result = harness.run_trainer(f"trainers.{trainer}", [*args, *extra], NPROC, scratch,
                                     tag, plan.timeout_s)
        times = [r["step_time_s"] for r in result["records"]]
        speed_runs[variant].append({
            "variant": variant, "tag": tag, "command": result["command"],
            "wall_s": result["wall_s"], "step_time_s": times,
            "median_step_s": median(times[3:] or times), "round": index,
            "summary": {k: result["summary"].get(k) for k in
                        ("tokens_per_s", "mfu", "peak_memory_bytes", "first_loss",
                         "final_loss", "world_size", "steps")}})
    speed = {"model": plan.speed_model, "global_batch": plan.speed_batch,
             "tokens_per_step": plan.speed_batch * MODEL_SIZES[plan.speed_model].max_seq_len}
    for variant, rs in speed_runs.items():  # medians over rounds, step times pooled
        speed[variant] = {
            "tokens_per_s": median([r["summary"]["tokens_per_s"] for r in rs]),
            "mfu": median([r["summary"]["mfu"] for r in rs]),
            "peak_memory_bytes": max(r["summary"]["peak_memory_bytes"] for r in rs),
            "median_step_s": median([t for r in rs for t in r["step_time_s"][3:]
                                     or r["step_time_s"]]),
            "per_round_tokens_per_s": [r["summary"]["tokens_per_s"] for r in rs]}
    for variant in speed_runs:
        speed[variant]["vs_ddp"] = speed[variant]["tokens_per_s"] / speed["ddp"]["tokens_per_s"]
    return {"nproc": NPROC, "memory_runs": memory_runs,
            "memory": summarize_memory(plan, memory_runs), "peak": peak,
            "speed_runs": speed_runs, "speed": speed}


def checks(report: dict[str, Any]) -> list[dict[str, Any]]:
    return report["memory"]["checks"]


def table(report: dict[str, Any]) -> str:
    mem, speed = report["memory"], report["speed"]
    rows = [("variant", "category", "measured", "arithmetic", "expected", "meas/exp")]
    rows += [(r["variant"], LABELS[r["category"]], human(r["measured_bytes"], 4), r["formula"],
              human(r["expected_bytes"], 4), f"{r['measured_over_expected']:.4f}")
             for r in mem["rows"]]
    checked = [("check", "measured", "target", "result")]
    for c in mem["checks"]:
        goal, value = c["target"], c["value"]
        goal_text = (f"{goal:,}" if isinstance(goal, int) else f"<= {goal:g}" if goal <= 1e-3
                     else f"{goal:.4f} +-{100 * TOLERANCE:.0f}%")
        checked.append((c["name"], f"{value:,}" if isinstance(value, int) else f"{value:.4f}",
                        goal_text, "pass" if c["pass"] else "MISS"))
    speeds = [("trainer", "tokens/s", "vs ddp", "MFU", "median step", "peak RSS rank 0")]
    speeds += [(v, f"{f['tokens_per_s']:,.0f}", f"{f['vs_ddp']:.3f}", f"{100 * f['mfu']:.1f}%",
                f"{1e3 * f['median_step_s']:.0f} ms", human(f["peak_memory_bytes"], 4))
               for v, f in ((v, speed[v]) for v in SPEED_VARIANTS)]
    return "\n".join([
        f"Memory per rank, {mem['model']} model (P = {mem['P']:,} parameters in {mem['T']} "
        f"tensors), {NPROC} ranks, after one training step (fp32, AdamW)", "",
        harness.columns(rows, left=(0, 1, 3)), "", harness.columns(checked, left=(0, 3)), "",
        f"Throughput, {speed['model']} model, global batch {speed['global_batch']} "
        f"({speed['tokens_per_step']:,} tokens/step), {NPROC} ranks x {THREADS} thread, "
        f"peak {report['peak']['peak_flops_used'] / 1e9:.1f} GFLOP/s per rank", "",
        harness.columns(speeds)])


if __name__ == "__main__":
    raise SystemExit(harness.main())
