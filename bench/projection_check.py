"""The step-time projection against published scaling tables (docs/benchmarks.md).

``bench/published_scaling.csv`` holds the published rows with their sources: torchtitan's
Llama 3.1 8B FSDP on 8 and 128 H100s, llm-foundry's MPT-7B FSDP on 8 to 512 H100s,
Megatron-LM's H100 weak-scaling table and its 2021 A100 one (Narayanan et al.'s
configurations). For each table the matmul efficiency is calibrated on its smallest-scale row
(:func:`trainers.sizing.projection.calibrate`), every row is projected with it, and the
check compares the change in per-device throughput from the smallest to the largest scale
(goal: within ``CHANGE_GOAL_POINTS`` of the published change) and each row's absolute figure
(goal: within ``ABSOLUTE_GOAL`` of the published one). Nothing is tuned per row: the only
per-table settings are what the source states of its framework (``FRAMEWORKS``).
"""

from __future__ import annotations

import csv
import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainers.sizing.memory_formulas import Layout
from trainers.sizing.projection import Assumptions, Hardware, Job, calibrate, project
from trainers.sizing.resources import gpu_perf
from trainers.sizing.shapes import ModelConfig

TABLE = Path(__file__).resolve().parent / "published_scaling.csv"
CHANGE_GOAL_POINTS = 5.0
ABSOLUTE_GOAL = 0.15
# What each source states of how its framework runs (the CSV's notes name where): Megatron-LM's
# H100 runs hide tensor-parallel communication (--tp-comm-overlap, which requires
# --sequence-parallel) and overlap the distributed optimizer's gradient reduce-scatter and
# parameter all-gather (--overlap-grad-reduce --overlap-param-gather), as its README says;
# its 2021 runs (--fp16: fp16 gradients) all-reduce with torch's DDP during the last backward
# (--DDP-impl torch) or after the backward (local); the others are priced as our trainers run
# (FSDP prefetch, DDP buckets, tensor parallelism on the critical path).
FRAMEWORKS: dict[str, dict[str, Any]] = {
    "fsdp2": {}, "fsdp1": {},
    "megatron-2021-torch-ddp": {"grad_bytes": 2},
    "megatron-2021-local-ddp": {"grad_bytes": 2, "overlap_grad_reduce": False},
    "megatron-2024": {"tp_overlap": 1.0, "distributed_optimizer": True,
                      "sequence_parallel": True}}
QUICK: dict[str, Any] = {}


@dataclass
class Plan:
    table: str = str(TABLE)


def read_rows(path: Path = TABLE) -> list[dict[str, str]]:
    """The published rows, as the CSV's strings."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def shape_of(row: dict[str, str]) -> ModelConfig:
    """The row's model, with the attention it runs (``sdpa``: flash, which keeps no scores;
    ``naive``: the scores kept for backward)."""
    llama = row["family"] == "llama"
    return ModelConfig(vocab_size=int(row["vocab"]), n_layers=int(row["layers"]),
                       n_heads=int(row["heads"]), d_model=int(row["hidden"]),
                       max_seq_len=int(row["seq_len"]), family=row["family"],
                       attention=row["attention"],
                       n_kv_heads=int(row["kv_heads"]) if llama else 0,
                       ffn_dim=int(row["ffn"]) if llama else 0)


def job_of(row: dict[str, str]) -> Job:
    gpus, tp, pp = int(row["gpus"]), int(row["tp"]), int(row["pp"])
    layout = Layout(row["sharding"], dp=gpus // (tp * pp), tp=tp, pp=pp)
    return Job(shape_of(row), int(row["seq_len"]), int(row["global_batch"]), layout,
               int(row["micro_batch"]), row["recompute"], row["schedule"] or "1f1b",
               int(row["virtual_stages"] or 1))


def hardware_of(row: dict[str, str]) -> Hardware:
    perf = gpu_perf(row["gpu"])
    return Hardware(perf.peak_tflops * 1e12, perf.intra_node_gbps, perf.inter_node_gbps,
                    hbm_gbps=perf.hbm_gbps)


def assumptions_of(row: dict[str, str]) -> Assumptions:
    """The projection's defaults with what the row's source states of its framework."""
    return Assumptions(**FRAMEWORKS[row["framework"]])


def published_flops_per_token(row: dict[str, str]) -> float:
    """FLOPs per token as the source counts them: ``model`` (6 N + 12 L d s, ours and
    Megatron-LM's 2024 count) or ``megatron_recompute`` (Narayanan et al. 2021, Eq. 3, which
    counts the recomputed forward: 96 B s l h^2 (1 + s/6h + V/16lh) per B s tokens)."""
    if row["flops_convention"] == "model":
        return shape_of(row).flops_per_token(int(row["seq_len"]))
    s, h, layers, vocab = (int(row[k]) for k in ("seq_len", "hidden", "layers", "vocab"))
    return 96 * layers * h * h * (1 + s / (6 * h) + vocab / (16 * layers * h))


def in_published_units(row: dict[str, str], tokens_per_s_per_device: float) -> float:
    """Tokens/s per device as the row's metric: itself, or teraFLOP/s per GPU."""
    if row["metric"] == "tokens_per_s_per_gpu":
        return tokens_per_s_per_device
    return tokens_per_s_per_device * published_flops_per_token(row) / 1e12


def compare(rows: list[dict[str, str]]) -> list[dict[str, Any]]:
    """Per published table: its rows, published against projected with the matmul efficiency
    calibrated on its smallest-scale row, the change smallest -> largest scale in points,
    each row's error, and whether the goals are met."""
    tables: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        tables.setdefault(row["table"], []).append(row)
    results = []
    for name, members in tables.items():
        members = sorted(members, key=lambda r: int(r["gpus"]))
        base = members[0]
        unit = published_flops_per_token(base) if base["metric"] == "tflops_per_gpu" else 1.0
        target = float(base["published"]) * (1e12 if unit != 1.0 else 1.0) / unit
        efficiency = calibrate(job_of(base), hardware_of(base), target, assumptions_of(base))
        out = []
        for row in members:
            assume = dataclasses.replace(assumptions_of(row), matmul_efficiency=efficiency)
            p = project(job_of(row), hardware_of(row), assume)
            predicted = in_published_units(row, p.tokens_per_s_per_device)
            out.append({"row": row["row"], "gpus": int(row["gpus"]),
                        "published": float(row["published"]), "predicted": predicted,
                        "error": predicted / float(row["published"]) - 1, "mfu": p.mfu,
                        "step_s": p.step_s, "non_matmul_s": p.non_matmul_s,
                        "bubble_s": p.bubble_s,
                        "exposed_s": dict(p.exposed_s)})
        first, last = out[0], out[-1]
        published_change = 100 * (last["published"] / first["published"] - 1)
        predicted_change = 100 * (last["predicted"] / first["predicted"] - 1)
        worst = max(abs(r["error"]) for r in out[1:])
        results.append({
            "table": name, "metric": base["metric"], "calibrated_on": base["row"],
            "matmul_efficiency": efficiency, "rows": out,
            "published_change_points": published_change,
            "predicted_change_points": predicted_change,
            "change_miss_points": predicted_change - published_change,
            "change_goal_met": abs(predicted_change - published_change) <= CHANGE_GOAL_POINTS,
            "worst_absolute_error": worst, "absolute_goal_met": worst <= ABSOLUTE_GOAL})
    return results


def run(plan: Plan, scratch: Path) -> dict[str, Any]:
    return {"tables": compare(read_rows(Path(plan.table)))}


def table(report: dict[str, Any]) -> str:
    """Per table: each row's published and projected figure and error, then the change
    smallest -> largest scale and the goals."""
    from bench.harness import columns

    blocks = []
    for t in report["tables"]:
        unit = "tokens/s/GPU" if t["metric"] == "tokens_per_s_per_gpu" else "TFLOP/s/GPU"
        rows = [["row", "GPUs", f"published {unit}", f"projected {unit}", "error", "MFU"]]
        rows += [[r["row"], str(r["gpus"]), f"{r['published']:,.1f}", f"{r['predicted']:,.1f}",
                  f"{100 * r['error']:+.1f}%", f"{r['mfu']:.3f}"] for r in t["rows"]]
        blocks.append(
            f"{t['table']} (matmul efficiency {t['matmul_efficiency']:.3f}, calibrated on "
            f"{t['calibrated_on']})\n" + columns(rows) + "\n"
            f"change smallest -> largest: published {t['published_change_points']:+.1f} "
            f"points, projected {t['predicted_change_points']:+.1f} (miss "
            f"{t['change_miss_points']:+.1f}; goal {CHANGE_GOAL_POINTS:g}: "
            f"{'met' if t['change_goal_met'] else 'MISSED'}); worst absolute error "
            f"{100 * t['worst_absolute_error']:.1f}% (goal {100 * ABSOLUTE_GOAL:g}%: "
            f"{'met' if t['absolute_goal_met'] else 'MISSED'})")
    return "\n\n".join(blocks)


def checks(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"name": f"{t['table']} {goal}", "pass": t[f"{goal}_goal_met"]}
            for t in report["tables"] for goal in ("change", "absolute")]


if __name__ == "__main__":
    from bench import harness

    sys.exit(harness.main())
