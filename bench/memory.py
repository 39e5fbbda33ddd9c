"""Memory optimisation, measured: ``python -m bench.memory``.

Trains the ``small`` model in one process (one thread) in a baseline configuration (fp32, no
activation checkpointing) and in optimised ones (bf16 autocast; activation checkpointing;
both), and measures for each the anatomy of a step (parameters, gradients, optimizer state,
activations held at the end of forward; :func:`bench.memory_probe.measure_step`) next to
the prediction of :mod:`trainers.memory`, and the median step time over timed steps outside
the tracker. Reports each configuration's activation reduction and step-time cost against the
baseline, writes ``bench/results/memory.json`` and draws ``docs/img/memory_anatomy.png``:
the measured anatomy of the configurations, and the predicted anatomy of the 1B model per
rank on 8 devices under DDP and ZeRO-1/2/3 (the same code as ``python -m trainers.memory``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` and `trainers` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench.common import REPO, RESULTS_DIR, THREADS, host_info, progress, write_json  # noqa: E402
from bench.memory_probe import measure_step  # noqa: E402
from trainers.core.loop import build_optimizer  # noqa: E402
from trainers.core.model import build_model  # noqa: E402
from trainers.parallel.checkpointing import apply_activation_checkpointing  # noqa: E402
from trainers.spec.config import parse_config  # noqa: E402
from trainers.spec.memory import SHARDINGS, Layout, predict  # noqa: E402
from trainers.spec.shapes import MODEL_SIZES  # noqa: E402

CONFIGS = [("baseline: fp32", "fp32", False), ("bf16 autocast", "bf16", False),
           ("activation checkpointing", "fp32", True),
           ("bf16 + activation checkpointing", "bf16", True)]
CATEGORIES = ("params", "grads", "optimizer", "activations", "gathered")


def run_config(model_name: str, batch: int, dtype: str, checkpointing: bool,
               steps: int) -> dict[str, Any]:
    """Measured anatomy and median step time of one configuration."""
    cfg = parse_config(["--model", model_name], "trainers.ddp", world_sizes=[1],
                       check_paths=False)
    torch.manual_seed(0)
    model = build_model(model_name)
    if checkpointing:
        apply_activation_checkpointing(model)
    optimizer = build_optimizer(model, cfg)
    seq = cfg.seq_len
    inputs, targets = torch.randint(0, 256, (2, batch, seq))

    def autocast() -> contextlib.AbstractContextManager:
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16")

    for _ in range(2):
        measured = measure_step(model, optimizer, inputs, targets, autocast())
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        with autocast():
            logits = model(inputs)
        F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    predicted = predict(model.cfg, batch, seq, dtype, checkpointing, Layout())
    return {"dtype": dtype, "checkpointing": checkpointing, "batch": batch, "seq": seq,
            "measured": dataclasses.asdict(measured),
            "predicted": dataclasses.asdict(predicted),
            "step_s": statistics.median(times), "step_times_s": times}


def draw(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = dict(zip(CATEGORIES, ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3"),
                      strict=True))
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6))
    for ax, rows, unit, title in (
            (left, [(r["name"], r["measured"]) for r in report["configs"]], 2**20,
             f"{report['model']}, batch {report['configs'][0]['batch']} x "
             f"{report['configs'][0]['seq']}, 1 process: measured (MiB)"),
            (right, [(s, r) for s, r in report["predicted_1b"].items()], 2**30,
             "1B model, bf16, 1 x 2048 tokens, per rank of 8: predicted (GiB)")):
        bottoms = [0.0] * len(rows)
        for category in CATEGORIES:
            values = [row[category] / unit for _, row in rows]
            ax.bar(range(len(rows)), values, bottom=bottoms, color=colors[category],
                   label=category)
            bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
        ax.set_xticks(range(len(rows)), [name.replace(" + ", "\n+ ") for name, _ in rows],
                      fontsize=8)
        ax.set_title(title, fontsize=9)
    left.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.memory", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model, few steps")
    args = parser.parse_args(argv)
    torch.set_num_threads(THREADS)
    model_name, batch, steps = ("tiny", 4, 3) if args.quick else ("small", 8, 12)
    configs = []
    for name, dtype, checkpointing in CONFIGS:
        progress(name)
        configs.append({"name": name, **run_config(model_name, batch, dtype, checkpointing,
                                                   steps)})
    base = configs[0]
    for config in configs:
        config["activation_reduction"] = (base["measured"]["activations"]
                                          / config["measured"]["activations"])
        config["step_time_cost"] = config["step_s"] / base["step_s"] - 1
    predicted_1b = {s: dataclasses.asdict(predict(MODEL_SIZES["1b"], 1, 2048, "bf16", False,
                                                  Layout(s, dp=8))) for s in SHARDINGS}
    report = {"host": host_info(), "model": model_name, "threads": THREADS,
              "configs": configs, "predicted_1b": predicted_1b}
    name = "memory_quick" if args.quick else "memory"
    write_json(RESULTS_DIR / f"{name}.json", report)
    image = (RESULTS_DIR / "quick_img" if args.quick else REPO / "docs" / "img")
    draw(report, image / "memory_anatomy.png")
    print(f"{'configuration':32} {'activations':>12} {'predicted':>12} {'reduction':>9} "
          f"{'step':>8} {'cost':>7}")
    for c in configs:
        print(f"{c['name']:32} {c['measured']['activations'] / 2**20:9.2f} MiB "
              f"{c['predicted']['activations'] / 2**20:8.2f} MiB {c['activation_reduction']:8.2f}x "
              f"{c['step_s'] * 1e3:6.0f}ms {100 * c['step_time_cost']:+6.1f}%")
    print(f"\nwrote {RESULTS_DIR / (name + '.json')} and {image / 'memory_anatomy.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
