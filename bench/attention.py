"""Attention memory and time, measured: ``python -m bench.attention``.

Runs forward + backward of causal self-attention (batch 1, 8 heads, head dim 64, fp32) with
the ``naive``, ``sdpa`` and ``tiled`` implementations of :mod:`trainers.core.attention` at
sequence lengths 1k, 4k and 16k, in this process. For each it records

- peak memory beyond the inputs (q, k, v and the upstream gradient), after forward and over
  forward + backward, from ``torch.distributed._tools.mem_tracker.MemTracker``, which counts
  every live tensor storage; and what forward leaves alive (the output and what autograd
  saved for backward);
- wall time of forward and of backward (median of up to ``repeats`` runs, untracked);
- the largest difference of the output and gradients from ``sdpa``'s on the same inputs;
- for ``naive`` where it runs for real, the same memory counted in fake mode (a check that
  the fake-mode accounting used at the largest sizes agrees with the real one);

next to the score-matrix formula ``batch x heads x seq^2 x 4`` bytes. Where ``naive`` would
need more than ``--real-limit-gb`` (``NAIVE_SCORE_TENSORS`` score matrices: the probabilities
saved for backward and the temporaries of its backward), it is not run: MemTracker counts its
allocations under ``FakeTensorMode`` (the same ops on tensors without data) and the timing is
skipped. Every figure is labelled ``real`` or ``fake``. Writes ``bench/results/attention.json``
and ``docs/img/attention_memory.png`` and checks the target: at the largest sequence, ``sdpa``
and ``tiled`` need at least 10x less peak memory than ``naive``.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` and `trainers` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.distributed._tools.mem_tracker import MemTracker  # noqa: E402

from bench.common import REPO, RESULTS_DIR, host_info, progress, write_json  # noqa: E402
from trainers.core.attention import TILE, attention_fn  # noqa: E402

IMAGES = REPO / "docs" / "img"
IMPLEMENTATIONS = ("sdpa", "naive", "tiled")  # sdpa first: the reference for the others
# naive's forward + backward holds about this many (batch, heads, seq, seq) fp32 tensors at
# its peak (3.2 measured at 1k and 4k; 4 errs on the side of not running it for real).
NAIVE_SCORE_TENSORS = 4
TARGET_RATIO = 10.0


@dataclass
class Plan:
    seqs: tuple[int, ...] = (1024, 4096, 16384)
    batch: int = 1
    heads: int = 8
    head_dim: int = 64
    repeats: int = 3  # timed runs per point at most...
    timed_budget_s: float = 20.0  # ...stopping once a point's runs took this long
    real_limit_bytes: int = 10 * 10**9  # naive above this (by the formula) runs in fake mode
    seed: int = 0

    @classmethod
    def quick(cls) -> Plan:
        """Small sequences; the largest naive point goes through fake mode too."""
        return cls(seqs=(128, 256, 512), repeats=1, real_limit_bytes=20 * 2**20)

    def score_bytes(self, seq: int) -> int:
        """One fp32 (batch, heads, seq, seq) score matrix."""
        return self.batch * self.heads * seq * seq * 4


def make_inputs(plan: Plan, seq: int) -> tuple[torch.Tensor, ...]:
    """q, k, v (requiring grad) and the upstream gradient, the same for every implementation."""
    gen = torch.Generator().manual_seed(plan.seed)
    shape = (plan.batch, plan.heads, seq, plan.head_dim)
    q, k, v, grad = (torch.randn(shape, generator=gen) for _ in range(4))
    return q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), grad


def measure_memory(plan: Plan, name: str, seq: int, fake: bool) -> dict[str, int]:
    """Bytes beyond the inputs: peak in forward, alive after forward, peak over fwd + bwd."""
    fn = attention_fn(name, window=seq)
    with FakeTensorMode() if fake else contextlib.nullcontext():
        shape = (plan.batch, plan.heads, seq, plan.head_dim)
        q, k, v, grad = ((torch.empty(shape) for _ in range(4)) if fake
                         else make_inputs(plan, seq))
        for t in (q, k, v):
            t.requires_grad_()
        tracker = MemTracker()
        tracker.track_external(q, k, v, grad)
        with tracker:
            device = q.device
            start = tracker.get_tracker_snapshot()[device]["Total"]
            out = fn(q, k, v)
            forward_peak = tracker.get_tracker_snapshot("peak")[device]["Total"]
            after_forward = tracker.get_tracker_snapshot()[device]["Total"]
            out.backward(grad)
            del out
        peak = tracker.get_tracker_snapshot("peak")[device]["Total"]
    return {"forward_peak_bytes": forward_peak - start,
            "after_forward_bytes": after_forward - start,
            "peak_bytes": peak - start}


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
        end = time.perf_counter()
        forward.append(middle - start)
        backward.append(end - middle)
    results = (out.detach(), q.grad, k.grad, v.grad)
    timing: dict[str, Any] = {"forward_s": statistics.median(forward),
                              "backward_s": statistics.median(backward),
                              "runs": len(forward)}
    if reference is not None:
        timing["max_abs_diff_vs_sdpa"] = dict(zip(
            ("out", "dq", "dk", "dv"),
            (float((a - b).abs().max()) for a, b in zip(results, reference, strict=True)),
            strict=True))
    return timing, results


def run_benchmark(plan: Plan) -> dict[str, Any]:
    host = host_info()
    started = datetime.now(timezone.utc)
    points = []
    for seq in plan.seqs:
        reference = None
        for name in IMPLEMENTATIONS:
            naive_estimate = NAIVE_SCORE_TENSORS * plan.score_bytes(seq)
            fake = name == "naive" and naive_estimate > plan.real_limit_bytes
            progress(f"{name} at seq {seq}: memory ({'fake' if fake else 'real'})")
            point: dict[str, Any] = {"implementation": name, "seq": seq,
                                     "accounting": "fake" if fake else "real",
                                     "score_matrix_bytes": plan.score_bytes(seq),
                                     **measure_memory(plan, name, seq, fake)}
            if fake:
                point["timing"] = None
                point["timing_skipped"] = (
                    f"not run: {NAIVE_SCORE_TENSORS} score matrices of "
                    f"{plan.score_bytes(seq) / 1e9:.3g} GB exceed the real-run limit of "
                    f"{plan.real_limit_bytes / 1e9:.3g} GB; memory from fake-mode accounting")
            else:
                progress(f"{name} at seq {seq}: time")
                point["timing"], results = measure_time(plan, name, seq, reference)
                if reference is None:
                    reference = results
                if name == "naive":  # the fake-mode accounting, checked where both exist
                    point["fake_check"] = measure_memory(plan, name, seq, fake=True)
            points.append(point)
    largest = max(plan.seqs)
    at_largest = {p["implementation"]: p["peak_bytes"] for p in points if p["seq"] == largest}
    ratios = {name: at_largest["naive"] / at_largest[name] for name in ("sdpa", "tiled")}
    return {"date": started.isoformat(timespec="seconds"),
            "wall_s": (datetime.now(timezone.utc) - started).total_seconds(),
            "host": host, "threads": torch.get_num_threads(), "plan": asdict(plan),
            "tiled_block": TILE, "naive_score_tensors": NAIVE_SCORE_TENSORS, "points": points,
            "target": {"seq": largest, "min_ratio": TARGET_RATIO,
                       "naive_over": ratios,
                       "pass": all(r >= TARGET_RATIO for r in ratios.values())}}


def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def table(report: dict[str, Any]) -> str:
    lines = [f"{'impl':6} {'seq':>6} {'memory':6} {'score matrix':>12} {'fwd peak':>10} "
             f"{'after fwd':>10} {'fwd+bwd peak':>12} {'x score':>7} {'fwd s':>7} {'bwd s':>7} "
             f"{'max |diff| vs sdpa':>18}"]
    for p in report["points"]:
        timing = p["timing"]
        times = (f"{timing['forward_s']:>7.3f} {timing['backward_s']:>7.3f}" if timing
                 else f"{'-':>7} {'-':>7}")
        diffs = timing.get("max_abs_diff_vs_sdpa") if timing else None
        diff = f"{max(diffs.values()):>18.1e}" if diffs else f"{'-':>18}"
        lines.append(f"{p['implementation']:6} {p['seq']:>6} {p['accounting']:6} "
                     f"{fmt_bytes(p['score_matrix_bytes']):>12} "
                     f"{fmt_bytes(p['forward_peak_bytes']):>10} "
                     f"{fmt_bytes(p['after_forward_bytes']):>10} "
                     f"{fmt_bytes(p['peak_bytes']):>12} "
                     f"{p['peak_bytes'] / p['score_matrix_bytes']:>7.3f} {times} {diff}")
    for p in report["points"]:
        if p["timing"] is None:
            lines.append(f"{p['implementation']} at {p['seq']}: {p['timing_skipped']}")
        if "fake_check" in p:
            same = all(p["fake_check"][key] == p[key] for key in p["fake_check"])
            lines.append(f"{p['implementation']} at {p['seq']}: fake-mode accounting "
                         f"{'equals' if same else 'DIFFERS from'} the real count "
                         f"(peak {fmt_bytes(p['fake_check']['peak_bytes'])})")
    target = report["target"]
    verdict = "PASS" if target["pass"] else "MISS"
    lines.append(f"target at seq {target['seq']}: naive's peak over sdpa's "
                 f"{target['naive_over']['sdpa']:.0f}x, over tiled's "
                 f"{target['naive_over']['tiled']:.0f}x (need >= {target['min_ratio']:.0f}x): "
                 f"{verdict}")
    return "\n".join(lines)


def draw(report: dict[str, Any], images: Path) -> Path:
    """Peak memory of forward + backward against sequence length, log-log, with the formula."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    markers = {"naive": "o", "sdpa": "s", "tiled": "^"}
    for name in IMPLEMENTATIONS:
        points = sorted((p for p in report["points"] if p["implementation"] == name),
                        key=lambda p: p["seq"])
        (line,) = ax.plot([p["seq"] for p in points], [p["peak_bytes"] for p in points],
                          f"{markers[name]}-", label=name)
        fake = [p for p in points if p["accounting"] == "fake"]
        if fake:  # hollow markers: counted in fake mode, not run
            ax.plot([p["seq"] for p in fake], [p["peak_bytes"] for p in fake], markers[name],
                    markersize=11, markerfacecolor="white", color=line.get_color(),
                    label=f"{name}, fake-mode accounting (not run)")
    seqs = sorted({p["seq"] for p in report["points"]})
    scores = [next(p["score_matrix_bytes"] for p in report["points"] if p["seq"] == s)
              for s in seqs]
    plan = report["plan"]
    ax.plot(seqs, scores, "k--", label=f"score matrix: {plan['batch']} x {plan['heads']} "
            "x seq² x 4 B")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    values = [p["peak_bytes"] for p in report["points"]] + scores
    low, high = math.floor(math.log2(min(values))), math.ceil(math.log2(max(values)))
    ax.set_yticks([2.0**e for e in range(low - low % 2, high + 1, 2)])  # powers of 4
    ax.set_xticks(seqs, [f"{s // 1024}k" if s >= 1024 else str(s) for s in seqs])
    ax.set_xlabel("sequence length")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: fmt_bytes(y)))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda y, _: ""))
    ax.set_ylabel("peak memory beyond the inputs, forward + backward")
    ax.set_title(f"causal attention, fp32, {plan['heads']} heads x {plan['head_dim']}",
                 fontsize=10)
    ax.legend()
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    images.mkdir(parents=True, exist_ok=True)
    path = images / "attention_memory.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.attention", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sequences, smoke check")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help="torch intra-op threads")
    parser.add_argument("--real-limit-gb", type=float,
                        help="naive runs for real only below this estimate (default 10; "
                             "--quick: 0.021)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    plan = Plan.quick() if args.quick else Plan()
    if args.real_limit_gb is not None:
        plan.real_limit_bytes = int(args.real_limit_gb * 1e9)
    report = run_benchmark(plan)
    report["command"] = " ".join(["python -m bench.attention", *(argv or sys.argv[1:])])
    output = RESULTS_DIR / ("attention_quick.json" if args.quick else "attention.json")
    write_json(output, report)
    image = draw(report, IMAGES if not args.quick else RESULTS_DIR / "quick_img")
    print(table(report))
    print(f"\nwrote {output} and {image}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
