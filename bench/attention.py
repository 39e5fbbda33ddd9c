"""Attention memory and time: naive, sdpa and tiled causal attention (docs/attention.md)."""

import contextlib
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker

from bench import harness
from bench.harness import human, progress
from trainers.models.attention import TILE, attention_fn

IMPLEMENTATIONS = ("sdpa", "naive", "tiled")  # sdpa first: the reference for the others
MARKERS = {"sdpa": "s", "naive": "o", "tiled": "^"}
# naive's forward + backward holds about this many (batch, heads, seq, seq) fp32 tensors at
# its peak (3.2 measured at 1k and 4k; 4 errs on the side of not running it for real).
NAIVE_SCORE_TENSORS = 4
TARGET_RATIO = 10.0
OVERRIDES = {"real_limit_gb": 0.0, "threads": 1}
# --quick: small sequences; the largest naive point goes through fake mode too
QUICK = {"seqs": (128, 256, 512), "repeats": 1, "real_limit_gb": 20 * 2**20 / 1e9}


@dataclass
class Plan:
    seqs: tuple[int, ...] = (1024, 4096, 16384)
    batch: int = 1
    heads: int = 8
    head_dim: int = 64
    repeats: int = 3  # timed runs per point at most...
    timed_budget_s: float = 20.0  # ...stopping once a point's runs took this long
    real_limit_gb: float = 10.0  # naive above this (by the formula) runs in fake mode
    seed: int = 0
    threads: int = field(default_factory=torch.get_num_threads)  # torch intra-op threads


def make_inputs(plan: Plan, seq: int, fake: bool = False) -> tuple[torch.Tensor, ...]:
    """q, k, v (requiring grad) and the upstream gradient: seeded, or empty when ``fake``."""
    gen = torch.Generator().manual_seed(plan.seed)
    shape = (plan.batch, plan.heads, seq, plan.head_dim)
    q, k, v, grad = (torch.empty(shape) if fake else torch.randn(shape, generator=gen)
                     for _ in range(4))
    return q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), grad


def measure_memory(plan: Plan, name: str, seq: int, fake: bool) -> dict[str, int]:
    """Bytes beyond the inputs: peak in forward, alive after forward, peak over fwd + bwd."""
    with FakeTensorMode() if fake else contextlib.nullcontext():
        q, k, v, grad = make_inputs(plan, seq, fake)
        tracker = MemTracker()
        tracker.track_external(q, k, v, grad)

        def total(kind: str = "current") -> int:
            return tracker.get_tracker_snapshot(kind)[q.device]["Total"]

        with tracker:
            start = total()
            out = attention_fn(name, window=seq)(q, k, v)
            forward_peak, after_forward = total("peak"), total()
            out.backward(grad)
            del out
        peak = total("peak")
    return {"forward_peak_bytes": forward_peak - start,
            "after_forward_bytes": after_forward - start, "peak_bytes": peak - start}


def measure_time(plan: Plan, name: str, seq: int, reference: tuple[torch.Tensor, ...] | None
                 ) -> tuple[dict[str, Any], tuple[torch.Tensor, ...]]:
    """Forward and backward seconds (each run on fresh gradients) and the last run's output
    and gradients; with ``reference`` (sdpa's), the largest absolute differences from it."""
    fn = attention_fn(name, window=seq)
    forward, backward = [], []
    while len(forward) < plan.repeats and sum(forward) + sum(backward) < plan.timed_budget_s:
        q, k, v, grad = make_inputs(plan, seq)
        start = time.perf_counter()
        out = fn(q, k, v)
        middle = time.perf_counter()
        out.backward(grad)
        forward.append(middle - start)
        backward.append(time.perf_counter() - middle)
    results = (out.detach(), q.grad, k.grad, v.grad)
    timing: dict[str, Any] = {"forward_s": statistics.median(forward),
                              "backward_s": statistics.median(backward), "runs": len(forward)}
    if reference is not None:
        timing["max_abs_diff_vs_sdpa"] = {
            key: float((a - b).abs().max())
            for key, a, b in zip(("out", "dq", "dk", "dv"), results, reference, strict=True)}
    return timing, results


def run(plan: Plan, scratch: Path) -> dict[str, Any]:
    """Every implementation at every sequence length, then the target at the largest."""
    points = []
    for seq in plan.seqs:
        reference = None
        for name in IMPLEMENTATIONS:
            score = plan.batch * plan.heads * seq * seq * 4  # one fp32 score matrix
            fake = name == "naive" and NAIVE_SCORE_TENSORS * score > plan.real_limit_gb * 1e9
            progress(f"{name} at seq {seq} ({'fake' if fake else 'real'})")
            point: dict[str, Any] = {"implementation": name, "seq": seq,
                                     "accounting": "fake" if fake else "real",
                                     "score_matrix_bytes": score,
                                     **measure_memory(plan, name, seq, fake), "timing": None}
            if fake:
                point["timing_skipped"] = (
                    f"not run: {NAIVE_SCORE_TENSORS} score matrices of {score / 1e9:.3g} GB "
                    f"exceed the real-run limit of {plan.real_limit_gb:.3g} GB; memory from "
                    "fake-mode accounting")
            else:
                point["timing"], results = measure_time(plan, name, seq, reference)
                reference = reference or results
                if name == "naive":  # the fake-mode accounting, checked where both exist
                    point["fake_check"] = measure_memory(plan, name, seq, fake=True)
            points.append(point)
    largest = max(plan.seqs)
    at_largest = {p["implementation"]: p["peak_bytes"] for p in points if p["seq"] == largest}
    ratios = {name: at_largest["naive"] / at_largest[name] for name in ("sdpa", "tiled")}
    return {"tiled_block": TILE, "naive_score_tensors": NAIVE_SCORE_TENSORS, "points": points,
            "target": {"name": "naive's peak over sdpa's and tiled's", "seq": largest,
                       "min_ratio": TARGET_RATIO, "naive_over": ratios,
                       "pass": all(r >= TARGET_RATIO for r in ratios.values())}}


def checks(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [report["target"]]


def table(report: dict[str, Any]) -> str:
    rows = [("impl", "seq", "memory", "score matrix", "fwd peak", "after fwd", "fwd+bwd peak",
             "x score", "fwd s", "bwd s", "max |diff| vs sdpa")]
    notes = []
    for p in report["points"]:
        timing = p["timing"] or {}
        diffs = timing.get("max_abs_diff_vs_sdpa")
        rows.append((p["implementation"], str(p["seq"]), p["accounting"],
                     *(human(p[k]) for k in ("score_matrix_bytes", "forward_peak_bytes",
                                             "after_forward_bytes", "peak_bytes")),
                     f"{p['peak_bytes'] / p['score_matrix_bytes']:.3f}",
                     *(f"{timing[k]:.3f}" if timing else "-" for k in ("forward_s", "backward_s")),
                     f"{max(diffs.values()):.1e}" if diffs else "-"))
        if p["timing"] is None:
            notes.append(f"{p['implementation']} at {p['seq']}: {p['timing_skipped']}")
        if "fake_check" in p:
            same = all(p["fake_check"][key] == p[key] for key in p["fake_check"])
            notes.append(f"{p['implementation']} at {p['seq']}: fake-mode accounting "
                         f"{'equals' if same else 'DIFFERS from'} the real count "
                         f"(peak {human(p['fake_check']['peak_bytes'])})")
    target = report["target"]
    notes.append(f"target at seq {target['seq']}: naive's peak over sdpa's "
                 f"{target['naive_over']['sdpa']:.0f}x, over tiled's "
                 f"{target['naive_over']['tiled']:.0f}x (need >= {target['min_ratio']:.0f}x): "
                 f"{'PASS' if target['pass'] else 'MISS'}")
    return "\n".join([harness.columns(rows, left=(0, 2)), *notes])


def draw(report: dict[str, Any], images: Path) -> list[Path]:
    """Peak memory of forward + backward against sequence length, log-log, with the formula."""
    from matplotlib.ticker import FuncFormatter

    plan, by = report["plan"], {(p["implementation"], p["seq"]): p for p in report["points"]}
    seqs = sorted({seq for _, seq in by})
    scores = [by["sdpa", seq]["score_matrix_bytes"] for seq in seqs]
    lines = {name: ([by[name, seq]["peak_bytes"] for seq in seqs], f"C{i}{MARKERS[name]}-")
             for i, name in enumerate(IMPLEMENTATIONS)}
    lines[f"score matrix: {plan['batch']} x {plan['heads']} x seq² x 4 B"] = (scores, "k--")
    with harness.figure(images / "attention_memory.png", figsize=(6.5, 4.5)) as ax:
        harness.chart(ax, seqs, lines, "sequence length",
                      "peak memory beyond the inputs, forward + backward",
                      [f"{s // 1024}k" if s >= 1024 else str(s) for s in seqs])
        for i, name in enumerate(IMPLEMENTATIONS):  # hollow markers: fake mode, not run
            fake = [seq for seq in seqs if by[name, seq]["accounting"] == "fake"]
            if fake:
                ax.plot(fake, [by[name, seq]["peak_bytes"] for seq in fake], MARKERS[name],
                        markersize=11, markerfacecolor="white", color=f"C{i}",
                        label=f"{name}, fake-mode accounting (not run)")
        ax.legend()
        ax.set_yscale("log", base=2)
        values = [by[key]["peak_bytes"] for key in by] + scores
        low, high = math.floor(math.log2(min(values))), math.ceil(math.log2(max(values)))
        ax.set_yticks([2.0**e for e in range(low - low % 2, high + 1, 2)])  # powers of 4
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: human(y)))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda y, _: ""))
        ax.set_title(f"causal attention, fp32, {plan['heads']} heads x {plan['head_dim']}",
                     fontsize=10)
    return [images / "attention_memory.png"]


if __name__ == "__main__":
    raise SystemExit(harness.main())
