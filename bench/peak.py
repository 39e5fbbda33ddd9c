"""This machine's matmul peak (fp32 or bf16) by the trainers' own probe, the best over sides.

Samples of ``trainers.core.metrics.measure_peak_flops`` (docs/benchmarks.md, "Definitions").
"""

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from bench.harness import THREADS, progress, write_rank
from trainers.core.metrics import measure_peak_flops

SIZES = (1024, 2048, 4096)


def measure_peak(sizes: Sequence[int] = SIZES, seconds: float = 2.0,
                 dtype: torch.dtype = torch.float32,
                 device: torch.device | None = None) -> dict[str, Any]:
    """Samples of the probe on ``dtype`` matrices on ``device`` for ``seconds`` (at least 3) per
    matrix side: per size the best and median FLOP/s and the ``calls``; ``peak_flops``, the
    best of all, at ``best_size``."""
    device = device or torch.device("cpu")
    name = str(dtype).removeprefix("torch.")
    where = f"{torch.get_num_threads()} thread(s)" if device.type == "cpu" else str(device)
    progress(f"{name} matmul peak on {where}, sizes {list(sizes)}")
    by_size: dict[str, dict[str, float]] = {}
    for size in sizes:
        rates: list[float] = []
        deadline = time.perf_counter() + seconds
        while len(rates) < 3 or time.perf_counter() < deadline:
            rates.append(measure_peak_flops(device, dtype, 0.0, size))
        by_size[str(size)] = {"best_flops": max(rates), "median_flops": statistics.median(rates),
                              "calls": len(rates)}
    best = max(by_size, key=lambda size: by_size[size]["best_flops"])
    progress(f"peak {by_size[best]['best_flops'] / 1e9:.1f} GFLOP/s at n={best}")
    return {"threads": torch.get_num_threads(), "dtype": name, "by_size": by_size,
            "best_size": int(best), "peak_flops": by_size[best]["best_flops"]}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.peak",
                                     description=__doc__.splitlines()[0],
                                     allow_abbrev=False)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="matrix sides")
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds of samples per size")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                        help="matrix dtype (bf16 is converted in software without AMX or "
                        "AVX512-BF16, so the probe shows whether the CPU has them)")
    parser.add_argument("--worker", metavar="PREFIX", help="as a rank under torchrun: start "
                        "after a barrier with the others, write to PREFIX.rank<RANK>.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(THREADS)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    if args.worker is None:
        print(json.dumps(measure_peak(args.sizes, args.seconds, dtype)))
        return
    dist.init_process_group("gloo")
    dist.barrier()
    write_rank(args.worker, measure_peak(args.sizes, args.seconds, dtype))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
