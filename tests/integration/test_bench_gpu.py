"""bench/gpu.py, the GPU benchmark, runs its whole path on the CPU with ``--quick``: FSDP2 over
llama-tiny eager and compiled, whose runs end at the same loss (the proof of ``--compile`` under
FSDP; DDP's and the pipeline's: tests/integration/test_compile.py)."""

from __future__ import annotations

import json
import sys

import pytest

from tests.support.processes import run_command

pytestmark = pytest.mark.slow


def test_gpu_benchmark_quick_run_reports_both_fsdp_runs(tmp_path):
    output = tmp_path / "gpu.json"
    proc = run_command([sys.executable, "-m", "bench.gpu", "--quick", "--output", str(output)],
                       timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(output.read_text())
    assert report["nproc"] == 2 and report["peak"]["peak_flops"] > 0
    eager, compiled = report["runs"]["eager"], report["runs"]["compiled"]
    for run in (eager, compiled):
        assert run["tokens_per_s"] > 0 and 0 < run["mfu"] < 1 and run["peak_memory_bytes"] > 0
        assert "trainers.fsdp" in run["command"]
    assert "--compile" in compiled["command"] and "--compile" not in eager["command"]
    assert compiled["compile_time_s"] > 0 and eager["compile_time_s"] is None
    # bf16 where the CPU multiplies in it (its rounding lands elsewhere in compiled kernels)
    rel = 1e-3 if report["dtype"] == "bf16" else 1e-4
    assert compiled["final_loss"] == pytest.approx(eager["final_loss"], rel=rel), report["runs"]
    assert "llama-tiny under FSDP on 2 x" in proc.stdout
    assert "compiled" in proc.stdout and "eager" in proc.stdout
