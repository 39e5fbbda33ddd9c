"""Host memory of each rank at the end of model setup, held to a bound (docs/memory.md).

Exit 1 when a rank grows by more than ``full fp32 model / N + largest parameter + OVERHEAD_MIB``.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench import harness
from bench.memory_probe import Tally
from trainers.core.metrics import peak_memory_bytes

MIB = 2**20
HOST = torch.device("cpu")  # peak_memory_bytes of the CPU: the peak resident set size
OVERHEAD_MIB = 64  # the allocator, the device mesh and the strategy's buffers
TRAINERS = {"fsdp": [], "tensor_parallel": ["--tp", "{nproc}"]}
OVERRIDES = {"model": None, "nproc": 1}
STRICT = True  # a rank over its bound always fails the run
QUICK = {"model": "tiny", "timeout_s": 180.0}


@dataclass
class Plan:
    model: str = "125m"  # a size of at least 100M parameters for the recorded figures
    nproc: int = 2
    timeout_s: float = 900.0


def measure(cfg: Any, env: Any, build: Callable[[Any, Any, Any], Any]) -> dict[str, Any]:
    """One rank (:func:`bench.harness.serve_rank`): the peak RSS around the trainer's build."""
    from trainers.models import spec_of

    spec = spec_of(cfg)
    sizes = [p.numel() * p.element_size() for p in spec.meta_model().parameters()]
    before, start = peak_memory_bytes(HOST), time.perf_counter()
    strategy = build(cfg, env, spec)
    seconds, after = time.perf_counter() - start, peak_memory_bytes(HOST)
    return {"peak_before_bytes": before, "peak_after_bytes": after,
            "setup_growth_bytes": after - before,
            "local_param_bytes": Tally(strategy.model.parameters()).logical,
            "full_model_bytes": sum(sizes), "largest_param_bytes": max(sizes), "setup_s": seconds}


def run(plan: Plan, scratch: Path) -> dict[str, Any]:
    """Both trainers' builds, every rank's record with its bound."""
    ranks = []
    for trainer, extra in TRAINERS.items():
        args = ["--model", plan.model, "--batch-size", str(2 * plan.nproc),
                *(a.format(nproc=plan.nproc) for a in extra)]
        ranks += harness.run_ranks("bench.setup_memory", [trainer, *args], plan.nproc, scratch,
                                   trainer, plan.timeout_s)["ranks"]
    for record in ranks:
        bound = (record["full_model_bytes"] / plan.nproc + record["largest_param_bytes"]
                 + OVERHEAD_MIB * MIB)
        record.update(bound_bytes=int(bound), within_bound=record["setup_growth_bytes"] <= bound)
    return {"model": plan.model, "nproc": plan.nproc, "overhead_mib": OVERHEAD_MIB, "ranks": ranks}


def checks(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"name": f"{r['trainer']} rank {r['rank']}", "pass": r["within_bound"]}
            for r in report["ranks"]]


def table(report: dict[str, Any]) -> str:
    rows = [("trainer", "rank", "peak before", "peak after", "growth", "shards", "bound", "ok")]
    rows += [(r["trainer"], str(r["rank"]),
              *(f"{r[k] / MIB:,.0f} MiB" for k in ("peak_before_bytes", "peak_after_bytes",
                                                  "setup_growth_bytes", "local_param_bytes",
                                                  "bound_bytes")),
              "yes" if r["within_bound"] else "NO") for r in report["ranks"]]
    first = report["ranks"][0]
    return (f"--model {report['model']}, {report['nproc']} ranks: full fp32 model "
            f"{first['full_model_bytes'] / MIB:,.0f} MiB, largest parameter "
            f"{first['largest_param_bytes'] / MIB:,.0f} MiB; bound = full / "
            f"{report['nproc']} + largest + {report['overhead_mib']} MiB\n"
            + harness.columns(rows))


if __name__ == "__main__":
    raise SystemExit(harness.main())
