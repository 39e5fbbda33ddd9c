"""Host memory of each rank at the end of model setup: the meta-device build, measured.

``python -m bench.setup_memory [--model 125m] [--nproc 2]`` runs, for ``trainers.fsdp`` and
``trainers.tensor_parallel --tp N``, N ranks under torchrun (one thread each, CPU and gloo).
Each rank (``--worker TRAINER``) joins the process group as the trainers do, reads its peak
resident set size, calls the trainer's own ``build(cfg, env)`` (meta-device model, its
parallelism, then :func:`trainers.core.materialize.materialize`) and reads the peak again.
The growth of the peak during setup is held to

    full fp32 model / N  +  its largest parameter  +  OVERHEAD_MIB

(materialize generates one whole parameter at a time and keeps this rank's shard of it; the
overhead covers the allocator, the device mesh and the strategy's own buffers). It prints a
table and writes ``bench/results/setup_memory.json``; docs/memory.md records the figures.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import (
    RESULTS_DIR,
    THREADS,
    child_env,
    finish,
    free_port,
    host_info,
    progress,
    run_in_scratch,
    run_streaming,
    tool,
)

MIB = 2**20
OVERHEAD_MIB = 64
TRAINERS = {"fsdp": [], "tensor_parallel": ["--tp", "{nproc}"]}


def peak_rss() -> int:
    """This process's peak resident set size in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def worker(trainer: str, model: str, out: Path) -> None:
    """One rank: the trainer's own build, with the peak RSS before and after."""
    import torch
    from torch.distributed.tensor import DTensor

    from trainers.core.distributed import init_distributed
    from trainers.core.model import meta_model
    from trainers.spec.config import parse_config

    torch.set_num_threads(THREADS)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    extra = [a.format(nproc=world) for a in TRAINERS[trainer]]
    cfg = parse_config(["--model", model, "--batch-size", str(2 * world),
                        "--output-dir", str(out.parent), *extra], trainer, check_paths=False)
    build = importlib.import_module(f"trainers.{trainer}").build
    whole = meta_model(cfg)
    full = sum(p.numel() * p.element_size() for p in whole.parameters())
    largest = max(p.numel() * p.element_size() for p in whole.parameters())
    with init_distributed(cfg) as env:
        before = peak_rss()
        start = time.perf_counter()
        strategy = build(cfg, env)
        seconds = time.perf_counter() - start
        after = peak_rss()
        local = sum((p.to_local() if isinstance(p, DTensor) else p).numel() * p.element_size()
                    for p in strategy.model.parameters())
        record = {"trainer": trainer, "rank": env.rank, "world_size": env.world_size,
                  "peak_before_bytes": before, "peak_after_bytes": after,
                  "setup_growth_bytes": after - before, "local_param_bytes": local,
                  "full_model_bytes": full, "largest_param_bytes": largest,
                  "setup_s": seconds}
    Path(f"{out}.rank{record['rank']}.json").write_text(json.dumps(record) + "\n")


def run_benchmark(model: str, nproc: int, scratch: Path) -> dict[str, Any]:
    env = child_env(scratch)
    ranks = []
    for trainer in TRAINERS:
        progress(f"{trainer}: {nproc} ranks, --model {model}")
        out = scratch / trainer
        cmd = [tool("torchrun"), "--nproc_per_node", str(nproc), "--master_port",
               str(free_port()), "-m", "bench.setup_memory", "--worker", trainer,
               "--model", model, "--out", str(out)]
        run_streaming(cmd, 900, scratch / f"{trainer}.log", env)
        ranks += [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(nproc)]
    for record in ranks:
        bound = (record["full_model_bytes"] / nproc + record["largest_param_bytes"]
                 + OVERHEAD_MIB * MIB)
        record["bound_bytes"] = int(bound)
        record["within_bound"] = record["setup_growth_bytes"] <= bound
    return {"model": model, "nproc": nproc, "overhead_mib": OVERHEAD_MIB, "ranks": ranks}


def table(report: dict[str, Any]) -> str:
    rows = [("trainer", "rank", "peak before", "peak after", "growth", "shards", "bound", "ok")]
    for r in report["ranks"]:
        rows.append((r["trainer"], str(r["rank"]),
                     *(f"{r[k] / MIB:,.0f} MiB" for k in ("peak_before_bytes", "peak_after_bytes",
                                                         "setup_growth_bytes",
                                                         "local_param_bytes", "bound_bytes")),
                     "yes" if r["within_bound"] else "NO"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    first = report["ranks"][0]
    lines = [f"--model {report['model']}, {report['nproc']} ranks: full fp32 model "
             f"{first['full_model_bytes'] / MIB:,.0f} MiB, largest parameter "
             f"{first['largest_param_bytes'] / MIB:,.0f} MiB; bound = full / "
             f"{report['nproc']} + largest + {report['overhead_mib']} MiB"]
    lines += ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in
                        enumerate(zip(row, widths, strict=True))) for row in rows]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.setup_memory",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="125m", help="a model size of at least 100M "
                        "parameters for the recorded figures")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--worker", choices=sorted(TRAINERS), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "setup_memory.json")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.model, args.out)
        return 0
    start = time.perf_counter()
    report = run_in_scratch("setup-memory-", None, args.keep,
                            lambda scratch: run_benchmark(args.model, args.nproc, scratch))
    if report is None:
        return 1
    report.update(host=host_info(), duration_s=time.perf_counter() - start)
    missed = [f"{r['trainer']} rank {r['rank']}" for r in report["ranks"] if not r["within_bound"]]
    return finish(args.output, report, table(report), missed, strict=True)


if __name__ == "__main__":
    sys.exit(main())
