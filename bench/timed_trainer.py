"""``python -m trainers.ddp`` unchanged, plus a time stamp as each step's metrics are written.

Usage: ``python -m bench.timed_trainer STAMPS_PREFIX [trainer arguments...]`` (also under
``torchrun``). The trainer runs exactly as ``python -m trainers.ddp`` would; the only addition
is one ``time.perf_counter()`` call at the top of ``MetricsWriter.write``, which the loop calls
once per step on every rank after the step's work is done. Consecutive differences are
therefore whole loop iterations: data, forward and backward, clipping, the optimizer and
scheduler, the metrics and logging that follow a step's own ``step_time_s`` measurement.
Each rank writes its stamps to ``STAMPS_PREFIX.rank<RANK>.json`` at exit.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from trainers import ddp
from trainers.core.metrics import MetricsWriter


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python -m bench.timed_trainer STAMPS_PREFIX [trainer arguments...]")
    prefix, argv = sys.argv[1], sys.argv[2:]
    stamps: list[float] = []
    write = MetricsWriter.write

    def timed_write(self: MetricsWriter, step: int, metrics: dict[str, Any]) -> None:
        stamps.append(time.perf_counter())
        write(self, step, metrics)

    MetricsWriter.write = timed_write  # type: ignore[method-assign]
    try:
        ddp.main(argv)
    finally:
        MetricsWriter.write = write  # type: ignore[method-assign]
        rank = os.environ.get("RANK", "0")
        Path(f"{prefix}.rank{rank}.json").write_text(json.dumps(stamps) + "\n")


if __name__ == "__main__":
    main()
