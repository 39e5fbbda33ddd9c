"""This machine's fp32 matmul peak at a given thread count: ``python -m bench.peak --help``.

The peak is the best FLOP/s of ``torch.mm`` on square fp32 matrices (``2 n^3`` FLOPs per
call) over a few sizes, each run repeatedly for a fixed time after one warm-up call. MFU in
``bench.throughput`` is relative to this figure, measured at the thread count the trainer uses.

``--wait-stdin`` makes the process print ``ready`` once torch is loaded and wait for a line on
stdin before it starts, so that several processes can be released at the same moment and
``bench.throughput`` can measure what two single-threaded processes reach together (the
hardware's own ceiling for data-parallel scaling on this machine).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch


def matmul_rates(size: int, seconds: float, min_calls: int = 3) -> list[float]:
    """FLOP/s of each timed ``torch.mm`` of two ``size`` x ``size`` fp32 matrices."""
    a = torch.randn(size, size)
    b = torch.randn(size, size)
    out = torch.empty(size, size)
    torch.mm(a, b, out=out)  # warm-up: kernel selection, page faults
    rates: list[float] = []
    deadline = time.perf_counter() + seconds
    while len(rates) < min_calls or time.perf_counter() < deadline:
        start = time.perf_counter()
        torch.mm(a, b, out=out)
        rates.append(2 * size**3 / (time.perf_counter() - start))
    return rates


def measure_peak(sizes: Sequence[int], seconds: float) -> dict[str, Any]:
    """Best and median FLOP/s per size, and the peak: the best over all sizes."""
    by_size: dict[str, dict[str, float]] = {}
    for size in sizes:
        rates = matmul_rates(size, seconds)
        by_size[str(size)] = {"best_flops": max(rates), "median_flops": statistics.median(rates),
                              "calls": len(rates)}
    best_size = max(by_size, key=lambda s: by_size[s]["best_flops"])
    return {"threads": torch.get_num_threads(), "dtype": "float32", "by_size": by_size,
            "best_size": int(best_size), "peak_flops": by_size[best_size]["best_flops"]}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench.peak", description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--seconds", type=float, default=2.0, help="timed seconds per size")
    parser.add_argument("--wait-stdin", action="store_true",
                        help="print 'ready', then start on the next line of stdin")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.wait_stdin:
        torch.mm(torch.ones(8, 8), torch.ones(8, 8))  # load the BLAS before the release
        print("ready", flush=True)
        sys.stdin.readline()
    print(json.dumps(measure_peak(args.sizes, args.seconds)), flush=True)


if __name__ == "__main__":
    main()
