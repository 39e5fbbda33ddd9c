"""Memory optimisation, measured: bf16 autocast and activation checkpointing (docs/memory.md)."""

import dataclasses
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench import harness
from bench.memory_probe import measure_step
from trainers import ddp
from trainers.config.parsing import parse_config
from trainers.core.distributed import init_distributed
from trainers.core.loop import build_optimizer
from trainers.models import spec_of
from trainers.sizing.memory_formulas import SHARDINGS, Layout, predict
from trainers.sizing.shapes import MODEL_SIZES

CONFIGS = [("baseline: fp32", "fp32", False), ("bf16 autocast", "bf16", False),
           ("activation checkpointing", "fp32", True),
           ("bf16 + activation checkpointing", "bf16", True)]
CATEGORIES = ("params", "grads", "optimizer", "activations", "gathered")
COLORS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3")
QUICK = {"model": "tiny", "batch": 4, "steps": 3}


@dataclass
class Plan:
    model: str = "small"
    batch: int = 8
    steps: int = 12  # timed steps per configuration


def run(plan: Plan, scratch: Path) -> dict[str, Any]:
    """Each configuration, built by ``trainers.ddp.build`` in a one-rank process group: the
    measured anatomy and median step time against the baseline's; the 1B model's prediction."""
    configs = []
    for name, dtype, checkpointing in CONFIGS:
        harness.progress(name)
        cfg = parse_config(["--model", plan.model, "--batch-size", str(plan.batch), "--dtype",
                            dtype, "--activation-checkpointing", str(checkpointing).lower()],
                           "ddp", world_sizes=[1], check_paths=False)
        with init_distributed(cfg) as env:
            strategy = ddp.build(cfg, env, spec_of(cfg))
            optimizer = build_optimizer(strategy.model, cfg)
            inputs, targets = torch.randint(0, MODEL_SIZES[plan.model].vocab_size,
                                            (2, plan.batch, cfg.seq_len))
            for _ in range(2):
                measured = measure_step(strategy.model, optimizer, inputs, targets,
                                        strategy.autocast(dtype, env.device))
            times = []
            for _ in range(plan.steps):
                start = time.perf_counter()
                strategy.forward_backward([(inputs, targets)],
                                          strategy.autocast(dtype, env.device))
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                times.append(time.perf_counter() - start)
        predicted = predict(MODEL_SIZES[plan.model], plan.batch, cfg.seq_len, dtype,
                            checkpointing, Layout())
        configs.append({"name": name, "dtype": dtype, "checkpointing": checkpointing,
                        "batch": plan.batch, "seq": cfg.seq_len,
                        "measured": dataclasses.asdict(measured),
                        "predicted": dataclasses.asdict(predicted),
                        "step_s": statistics.median(times), "step_times_s": times})
    for config in configs:
        config["activation_reduction"] = (configs[0]["measured"]["activations"]
                                          / config["measured"]["activations"])
        config["step_time_cost"] = config["step_s"] / configs[0]["step_s"] - 1
    predicted_1b = {s: dataclasses.asdict(predict(MODEL_SIZES["1b"], 1, 2048, "bf16", False,
                                                  Layout(s, dp=8))) for s in SHARDINGS}
    return {"model": plan.model, "configs": configs, "predicted_1b": predicted_1b}


def draw(report: dict[str, Any], images: Path) -> list[Path]:
    """The measured anatomy of the configurations; the predicted 1B anatomy per sharding."""
    first, path = report["configs"][0], images / "memory_anatomy.png"
    with harness.figure(path, 1, 2, figsize=(12, 4.6)) as (left, right):
        for ax, rows, unit, title in (
                (left, [(r["name"], r["measured"]) for r in report["configs"]], 2**20,
                 f"{report['model']}, batch {first['batch']} x {first['seq']}, 1 process: "
                 "measured (MiB)"),
                (right, list(report["predicted_1b"].items()), 2**30,
                 "1B model, bf16, 1 x 2048 tokens, per rank of 8: predicted (GiB)")):
            bottoms = [0.0] * len(rows)
            for category, color in zip(CATEGORIES, COLORS, strict=True):
                values = [row[category] / unit for _, row in rows]
                ax.bar(range(len(rows)), values, bottom=bottoms, color=color, label=category)
                bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
            ax.set_xticks(range(len(rows)), [name.replace(" + ", "\n+ ") for name, _ in rows],
                          fontsize=8)
            ax.set_title(title, fontsize=9)
        left.legend(fontsize=8)
    return [path]


def table(report: dict[str, Any]) -> str:
    rows = [("configuration", "activations", "predicted", "reduction", "step", "cost")]
    rows += [(c["name"], f"{c['measured']['activations'] / 2**20:.2f} MiB",
              f"{c['predicted']['activations'] / 2**20:.2f} MiB",
              f"{c['activation_reduction']:.2f}x", f"{c['step_s'] * 1e3:.0f}ms",
              f"{100 * c['step_time_cost']:+.1f}%") for c in report["configs"]]
    return harness.columns(rows)


if __name__ == "__main__":
    raise SystemExit(harness.main())
