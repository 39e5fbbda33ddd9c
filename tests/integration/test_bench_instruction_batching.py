"""bench/instruction_batching.py at its ``--quick`` size trains padded and packed batches of the
same samples and counts what each computed; packing leaves no padding but a row's tail."""

from __future__ import annotations

import json
import sys

import pytest

from tests.support.processes import run_command

pytestmark = pytest.mark.slow


def test_instruction_batching_quick_run_measures_pad_and_pack(tmp_path):
    output = tmp_path / "instruction_batching.json"
    proc = run_command([sys.executable, "-m", "bench.instruction_batching", "--quick", "--output",
                        str(output)])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(output.read_text())
    assert [r["variant"] for r in report["runs"]] == ["pad", "pack"]
    assert all("--batching" in r["command"] for r in report["runs"])
    pad, pack = report["summary"]["pad"], report["summary"]["pack"]
    steps = report["plan"]["steps"] - report["plan"]["warmup"]
    assert pack["computed"] == steps * report["plan"]["batch_size"] * 64  # full sequences
    assert pad["computed"] < pack["computed"]  # cut to the longest sample of each batch
    for row in (pad, pack):
        assert 0 < row["padding_share"] < 0.5 and row["sample_tokens_per_s"] > 0
    assert pad["vs_pad"] == 1.0
    assert "sample tokens/s" in proc.stdout
