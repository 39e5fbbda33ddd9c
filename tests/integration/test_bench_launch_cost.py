"""bench/launch_cost.py at its ``--quick`` size times a tiny run started cold and forked from the
tests' preloaded process, on 1 and 2 ranks, and both train the same losses."""

from __future__ import annotations

import json
import sys

import pytest

from tests.support.processes import run_command

pytestmark = pytest.mark.slow


def test_launch_cost_quick_run_times_both_launchers_on_the_same_losses(tmp_path):
    output = tmp_path / "launch_cost.json"
    proc = run_command([sys.executable, "-m", "bench.launch_cost", "--quick", "--output",
                        str(output)])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(output.read_text())
    assert [row["nproc"] for row in report["rows"]] == [1, 2] and report["preload_s"] > 0
    for row in report["rows"]:
        assert row["same_losses"] and row["cold_s"] > 0 and row["forked_s"] > 0
        assert row["ratio"] == pytest.approx(row["cold_s"] / row["forked_s"])
    assert "cold/forked" in proc.stdout and "starting the preloaded process" in proc.stdout
