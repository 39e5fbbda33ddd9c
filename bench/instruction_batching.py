"""Instruction batches: padded in length buckets against packed, on the same samples.

``--batching pad`` puts one sample in each sequence and cuts a batch to its longest sample,
drawing batches of similar lengths (:func:`trainers.core.batch_stream.length_buckets`);
``--batching pack`` packs samples into sequences of ``--seq-len`` (best-fit decreasing) with
attention kept within each sample (a document mask, so sdpa runs with an explicit mask
instead of its causal kernel). Both train the same model on the same prompt/completion
samples, whose lengths are spread as instruction sets' are (log-normal), with
``trainers.ddp`` on one process, rounds alternating. Reported per variant: the median step
time, the tokens computed per second, the sample tokens (everything but padding) per second,
and the padding share of what was computed; the batches of each run are drawn again here, by
the trainer's own classes, to count its padding.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import harness
from bench.harness import median
from trainers.config.parsing import parse_config
from trainers.core.batch_stream import BatchStream
from trainers.core.data import instruction_datasets
from trainers.formats.data_source import instruction_source
from trainers.formats.instruction_data import tokenize_samples
from trainers.options.model_names import model_shape

VARIANTS = ("pad", "pack")
OVERRIDES = {"steps": 4, "rounds": 1, "samples": 64}
QUICK = {"model": "llama-tiny", "samples": 200, "steps": 4, "warmup": 1, "rounds": 1,
         "batch_size": 8, "median_tokens": 20, "timeout_s": 120.0}


@dataclass
class Plan:
    model: str = "llama-small"
    samples: int = 2000
    median_tokens: int = 60  # the samples' median length (log-normal, sigma 0.7)
    batch_size: int = 16
    steps: int = 30
    warmup: int = 5  # steps left out of the timing
    rounds: int = 2
    timeout_s: float = 900.0


def write_samples(path: Path, count: int, median_tokens: int, most: int, seed: int = 0) -> Path:
    """``count`` prompt/completion records of log-normal lengths around ``median_tokens``
    bytes (at most ``most``), a third of each the prompt."""
    rng = random.Random(seed)
    with path.open("w") as out:
        for _ in range(count):
            length = min(most, max(4, int(rng.lognormvariate(math.log(median_tokens), 0.7))))
            text = "".join(rng.choice("abcdefghij klmnop") for _ in range(length))
            cut = max(1, length // 3)
            out.write(json.dumps({"prompt": text[:cut], "completion": text[cut:]}) + "\n")
    return path


def drawn_tokens(args: list[str], steps: int, warmup: int) -> dict[str, int]:
    """The tokens computed and the sample tokens of the batches the run of ``args`` trains on
    in steps ``warmup + 1`` to ``steps``, drawn again with the trainer's classes."""
    cfg = parse_config([*args, "--output-dir", "unused"], "ddp", world_sizes=[1])
    files, tokenizer, fmt, _ = instruction_source(cfg)
    train, _ = instruction_datasets(cfg, tokenize_samples(files, fmt, cfg, tokenizer))
    stream = BatchStream(train, cfg.batch_size, 0, 1, cfg.seed, global_batch=cfg.batch_size)
    computed = samples = 0
    for step in range(1, steps + 1):
        inputs, targets, *_ = next(stream)
        if step > warmup:
            computed += inputs.numel()
            samples += _sample_tokens(targets)
    return {"computed": computed, "sample": samples}


def _sample_tokens(targets: Any) -> int:
    """The sample tokens of a batch: each row up to its last counted target (every sample
    ends with its end-of-text id in the loss), padded or packed; after that, padding."""
    counted = (targets != -100).int()
    return int((targets.shape[1] - counted.flip(1).argmax(1)).sum())


def run(plan: Plan, scratch: Path) -> dict[str, Any]:
    data = write_samples(scratch / "samples.jsonl", plan.samples, plan.median_tokens,
                         model_shape(plan.model).max_seq_len)
    base = [*harness.trainer_args(plan.model, plan.batch_size, plan.steps, 1e12),
            "--data", str(data), "--log-every", str(plan.steps)]
    runs: list[dict[str, Any]] = []
    for round_, variant in harness.rotations(VARIANTS, plan.rounds):
        args = [*base, "--batching", variant]
        result = harness.run_trainer("trainers.ddp", args, 1, scratch,
                                     f"{variant}-r{round_}", plan.timeout_s)
        timed = result["records"][plan.warmup:]
        runs.append({"variant": variant, "round": round_, "command": result["command"],
                     "step_s": [r["step_time_s"] for r in timed],
                     "seconds": sum(r["step_time_s"] for r in timed)})
    tokens = {v: drawn_tokens([*base, "--batching", v], plan.steps, plan.warmup)
              for v in VARIANTS}
    summary = {}
    for variant in VARIANTS:
        mine = [r for r in runs if r["variant"] == variant]
        seconds = median([r["seconds"] for r in mine])
        drawn = tokens[variant]
        summary[variant] = {
            "median_step_s": median([s for r in mine for s in r["step_s"]]),
            "tokens_per_s": drawn["computed"] / seconds,
            "sample_tokens_per_s": drawn["sample"] / seconds,
            "padding_share": 1 - drawn["sample"] / drawn["computed"], **drawn}
    for variant in VARIANTS:
        summary[variant]["vs_pad"] = (summary[variant]["sample_tokens_per_s"]
                                      / summary["pad"]["sample_tokens_per_s"])
    return {"runs": runs, "summary": summary}


def table(report: dict[str, Any]) -> str:
    plan = report["plan"]
    rows = [["batching", "step (s)", "tokens/s", "sample tokens/s", "padding", "vs pad"]]
    for variant, row in report["summary"].items():
        rows.append([variant, f"{row['median_step_s']:.3f}", f"{row['tokens_per_s']:,.0f}",
                     f"{row['sample_tokens_per_s']:,.0f}", f"{row['padding_share']:.1%}",
                     f"{row['vs_pad']:.2f}x"])
    return (f"{plan['model']}, {plan['samples']} samples (median {plan['median_tokens']} "
            f"tokens), batch {plan['batch_size']}, steps {plan['warmup'] + 1}-{plan['steps']} "
            f"of {plan['rounds']} rounds, 1 process\n" + harness.columns(rows))


if __name__ == "__main__":
    raise SystemExit(harness.main())
