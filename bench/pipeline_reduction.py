"""Gradient reduction of the pipeline trainer: FSDP2 per stage against the flat all-reduce.

The pipeline trainer (``trainers/pipeline.py``) shards each stage over the data-parallel
replicas with FSDP2, and ``torch.distributed.pipelining`` issues a stage's reduce-scatter as
soon as that stage's last backward is done, so that under an interleaved schedule one stage's
reduction may overlap the backward of the rank's other stages (on GPUs; on CPU over gloo the
reduce-scatter blocks, see docs/benchmarks.md). Before, every stage was whole on
each replica and the gradients were averaged after the schedule step by one flat all-reduce.
This benchmark trains the same model, batch and seed at pp 2 x dp 2 (4 ranks, gloo) with both:
``flat`` (:class:`FlatAllReduce`, whole stages, the all-reduce as it was) and FSDP2 as ZeRO-2
and ZeRO-3, under 1F1B and interleaved 1F1B, every run launched the same way (``torchrun -m
bench.pipeline_reduction --worker``), and reports the median step time and CPU time per step
against ``flat``'s, each rank's peak memory and whether the losses agree.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from bench import harness
from bench.harness import human, median
from trainers.config.parsing import parse_or_exit
from trainers.core.distributed import DistEnv
from trainers.core.entry import train_in_group
from trainers.core.strategy import Strategy
from trainers.models import ModelSpec
from trainers.options.train_config import SCHEDULE_STAGES, TrainConfig
from trainers.parallel.parallelize import parallelize
from trainers.parallel.pipeline import PipelineStrategy, split_stage, stage_indices
from trainers.pipeline import build as fsdp_build
from trainers.runs.log_setup import configure_logging

PP, DP = 2, 2
NPROC = PP * DP
# variant -> its gradient reduction: the flat all-reduce, or FSDP2 with these flags
VARIANTS = {"flat": None, "zero2": ["--reshard-after-forward", "false"],
            "zero3": ["--reshard-after-forward", "true"]}
LOSS_TOLERANCE = 1e-5  # largest |loss - flat's loss| at any step, fp32
STRICT = True  # a loss that disagrees fails the run
OVERRIDES = {"steps": 3, "rounds": 1, "warmup": 0}
QUICK = {"model": "tiny", "schedules": ("interleaved1f1b",), "variants": ("flat", "zero2", "zero3"),
         "virtual_stages": 2, "steps": 3, "warmup": 1, "rounds": 1, "timeout_s": 120.0}


@dataclass
class Plan:
    model: str = "small"
    schedules: tuple[str, ...] = ("1f1b", "interleaved1f1b")
    variants: tuple[str, ...] = tuple(VARIANTS)  # with "flat": the others are measured against it
    batch_size: int = 8  # global: 4 sequences per replica
    microbatches: int = 2  # per replica and step
    virtual_stages: int = 3  # of interleaved1f1b; pp x this must divide the model's blocks
    steps: int = 10
    warmup: int = 3  # leading steps of each run left out of the medians
    rounds: int = 3  # each round runs every variant once per schedule, order rotating
    timeout_s: float = 600.0  # per run


class FlatAllReduce(PipelineStrategy):
    """The pipeline strategy as it was before FSDP: whole (unsharded) stages on every replica,
    gradients averaged over ``dp_group`` after the schedule step by one all-reduce of all of
    them concatenated."""

    def _sync_gradients(self) -> None:
        super()._sync_gradients()
        if self.dp_size > 1:
            grads = [p.grad for p in self.model.parameters() if p.grad is not None]
            flat = torch.cat([g.flatten() for g in grads])
            dist.all_reduce(flat, group=self.dp_group)
            flat /= self.dp_size
            offset = 0
            for grad in grads:
                grad.copy_(flat[offset:offset + grad.numel()].view_as(grad))
                offset += grad.numel()


def build_flat(cfg: TrainConfig, env: DistEnv, spec: ModelSpec) -> Strategy:
    """``trainers.pipeline.build`` with no FSDP: each stage is parallelized with
    ``dp_mesh=None``, so it is whole on every replica, and :class:`FlatAllReduce` reduces."""
    mesh = init_device_mesh(env.device.type, (cfg.pp, cfg.dp_size(env.world_size), cfg.tp),
                            mesh_dim_names=("pp", "dp", "tp"))
    num_stages = cfg.pp * cfg.virtual_stages
    indices = stage_indices(mesh["pp"].get_local_rank(), cfg.pp, num_stages)
    parts = []
    for index in indices:
        part = split_stage(spec.meta_model(), spec, index, num_stages)
        parallelize(part, spec, cfg, env.device, tp_mesh=mesh["tp"] if cfg.tp > 1 else None)
        parts.append(part)
    return FlatAllReduce(parts, spec, indices, cfg, mesh, env.device)


def worker(prefix: str, argv: Sequence[str]) -> None:
    """``--worker PREFIX REDUCTION TRAINER_ARGS``: train as ``trainers.pipeline`` does, with
    its own build (``fsdp``) or :func:`build_flat` (``flat``), and write this rank's metrics of
    every step (:func:`bench.harness.write_rank`; measured before the final checkpoint) with
    the CPU time the process (all its threads) has used by the end of the step."""
    reduction, *args = argv
    configure_logging()
    cfg = parse_or_exit(args, "pipeline")
    steps: list[dict[str, float]] = []
    train_in_group(cfg, "pipeline", build_flat if reduction == "flat" else fsdp_build,
                   on_step=lambda step, metrics, _: steps.append(
                       {"step": step, "process_time_s": time.process_time(), **metrics}),
                   argv=args)
    harness.write_rank(prefix, {"reduction": reduction, "steps": steps})


def schedule_flags(plan: Plan, name: str) -> list[str]:
    """The trainer flags of schedule ``name``: interleaved ones over ``plan.virtual_stages``."""
    several = SCHEDULE_STAGES[name] == "several"
    return ["--schedule", name, *(["--virtual-stages", str(plan.virtual_stages)] if several
                                  else [])]


def run_variant(plan: Plan, schedule: list[str], variant: str, scratch: Path,
                tag: str) -> dict[str, Any]:
    """One training run of ``variant``: the command, rank 0's step times and losses (the mean
    over replicas), the CPU time of each step summed over the ranks, each rank's peak memory."""
    flags = VARIANTS[variant]
    args = [*harness.trainer_args(plan.model, plan.batch_size, plan.steps, 1e12, 256),
            "--pp", str(PP), "--dp", str(DP), "--microbatches", str(plan.microbatches),
            *schedule, *(flags or []), "--output-dir", str(scratch / tag),
            "--log-every", "1"]  # a flush, so the hook's CPU-time stamp, every step
    result = harness.run_ranks("bench.pipeline_reduction", ["fsdp" if flags else "flat", *args],
                               NPROC, scratch, tag, plan.timeout_s)
    ranks = result["ranks"]  # rank 0 first
    return {"variant": variant, "tag": tag, "command": result["command"],
            "wall_s": result["wall_s"],
            "step_time_s": [s["step_time_s"] for s in ranks[0]["steps"]],
            "loss": [s["loss"] for s in ranks[0]["steps"]],
            "cpu_s": cpu_per_step(ranks),
            "peak_memory_bytes": [max(s["peak_memory_bytes"] for s in r["steps"])
                                  for r in ranks]}


def cpu_per_step(ranks: list[dict[str, Any]]) -> list[float]:
    """CPU seconds of steps 2 to the one before last, summed over the ranks: from one step's end
    to the next, so the first step (and the setup before it) and the last one (whose end comes
    after the final checkpoint) are left out. Unlike wall time it does not count the time a
    rank waits, for a peer or for the core, so other processes on the machine move it less."""
    ends = [[s["process_time_s"] for s in r["steps"]] for r in ranks]
    return [sum(e[i + 1] - e[i] for e in ends) for i in range(len(ends[0]) - 2)]


def summarize(plan: Plan, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per variant: step times pooled over rounds (each run's warm-up left out), their median,
    its ratio to ``flat``'s and each run's own median; the median CPU seconds per step (summed
    over the ranks; steps after the warm-up) and its ratio to ``flat``'s; each rank's largest peak
    memory; the largest loss difference from ``flat``'s first run at any step of any run."""
    reference = next(r["loss"] for r in runs if r["variant"] == "flat")
    out: dict[str, Any] = {}
    for variant in plan.variants:
        mine = [r for r in runs if r["variant"] == variant]
        out[variant] = {
            "median_step_s": median([t for r in mine for t in r["step_time_s"][plan.warmup:]]),
            "run_medians_s": [median(r["step_time_s"][plan.warmup:]) for r in mine],
            "cpu_step_s": median([c for r in mine for c in r["cpu_s"][max(plan.warmup - 1, 0):]]),
            "peak_memory_bytes": [max(p) for p in zip(*(r["peak_memory_bytes"] for r in mine),
                                                      strict=True)],
            "max_loss_diff": max(abs(a - b) for r in mine
                                 for a, b in zip(r["loss"], reference, strict=True))}
    for variant in plan.variants:
        for key, ratio in (("median_step_s", "vs_flat"), ("cpu_step_s", "cpu_vs_flat")):
            out[variant][ratio] = out[variant][key] / out["flat"][key]
    return out


def run(plan: Plan, scratch: Path) -> dict[str, Any]:
    """Every variant under each of ``plan.schedules``, ``plan.rounds`` times in rotating order."""
    results = {}
    for name in plan.schedules:
        flags = schedule_flags(plan, name)
        runs = [run_variant(plan, flags, variant, scratch, f"{name}-round{index}-{variant}")
                for index, variant in harness.rotations(plan.variants, plan.rounds)]
        results[name] = {"runs": runs, "summary": summarize(plan, runs)}
    return {"nproc": NPROC, "pp": PP, "dp": DP, "backend": "gloo", "schedules": results}


def checks(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The losses of every run agree with ``flat``'s within LOSS_TOLERANCE."""
    return [{"name": f"{name} {variant}: max |loss - flat loss|", "value": row["max_loss_diff"],
             "target": LOSS_TOLERANCE, "pass": row["max_loss_diff"] <= LOSS_TOLERANCE}
            for name, result in report["schedules"].items()
            for variant, row in result["summary"].items()]


def table(report: dict[str, Any]) -> str:
    plan = report["plan"]
    rows = [("schedule", "reduction", "median step", "vs flat", "per run (ms)", "CPU/step",
             "vs flat",
             *(f"peak rank {r}" for r in range(report["nproc"])), "max |dloss|")]
    for name, result in report["schedules"].items():
        for variant, row in result["summary"].items():
            rows.append((name, variant, f"{1e3 * row['median_step_s']:.0f} ms",
                         f"{row['vs_flat']:.3f}",
                         " ".join(f"{1e3 * t:.0f}" for t in row["run_medians_s"]),
                         f"{row['cpu_step_s']:.2f} s", f"{row['cpu_vs_flat']:.3f}",
                         *(human(b) for b in row["peak_memory_bytes"]),
                         f"{row['max_loss_diff']:.1e}"))
    return "\n".join([
        f"Pipeline gradient reduction, {plan['model']} model, pp {report['pp']} x dp "
        f"{report['dp']} ({report['nproc']} ranks, gloo, fp32), global batch "
        f"{plan['batch_size']}, {plan['microbatches']} micro-batches per replica, "
        f"{plan['steps']} steps x {plan['rounds']} rounds (first {plan['warmup']} of each run "
        "left out); median step: rank 0's wall time; CPU/step: CPU seconds of a step summed over "
        "the ranks; peak: the rank's peak resident memory", "",
        harness.columns(rows, left=(0, 1))])


if __name__ == "__main__":
    raise SystemExit(harness.main())
