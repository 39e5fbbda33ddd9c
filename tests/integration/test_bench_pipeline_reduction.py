"""bench/pipeline_reduction.py at its ``--quick`` size trains pp 2 x dp 2 under interleaved 1F1B
with the flat all-reduce and with FSDP2 (ZeRO-2 and ZeRO-3) per stage, and the losses agree."""

from __future__ import annotations

import json
import sys

import pytest

from tests.support.processes import run_command

pytestmark = pytest.mark.slow


def test_pipeline_reduction_quick_run_compares_flat_zero2_and_zero3(tmp_path):
    output = tmp_path / "pipeline_reduction.json"
    proc = run_command([sys.executable, "-m", "bench.pipeline_reduction", "--quick", "--output",
                        str(output)])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(output.read_text())
    assert report["nproc"] == 4 and list(report["schedules"]) == ["interleaved1f1b"]
    result = report["schedules"]["interleaved1f1b"]
    assert [r["variant"] for r in result["runs"]] == ["flat", "zero2", "zero3"]
    assert "--virtual-stages 2" in result["runs"][0]["command"]
    for run in result["runs"]:
        assert len(run["loss"]) == report["plan"]["steps"] and len(run["peak_memory_bytes"]) == 4
    summary = result["summary"]
    assert summary["flat"]["vs_flat"] == 1.0 and summary["flat"]["max_loss_diff"] == 0.0
    for zero in ("zero2", "zero3"):
        assert summary[zero]["median_step_s"] > 0 and summary[zero]["max_loss_diff"] <= 1e-5
    assert summary["zero3"]["cpu_step_s"] > 0 and summary["flat"]["cpu_vs_flat"] == 1.0
    assert min(summary["zero3"]["peak_memory_bytes"]) > 2**20
    assert "interleaved1f1b  zero3" in proc.stdout and "max |dloss|" in proc.stdout
