"""bench/checkpoint_storage.py saves, resumes and async-saves through the Checkpointer on disk
and on its own S3 server with ``--quick``."""

from __future__ import annotations

import json
import sys

import pytest

from tests.support.processes import run_command

pytestmark = pytest.mark.slow


def test_checkpoint_storage_quick_run_measures_both_targets(tmp_path):
    output = tmp_path / "checkpoint_storage.json"
    proc = run_command([sys.executable, "-m", "bench.checkpoint_storage", "--quick", "--output",
                        str(output)])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(output.read_text())
    assert report["world_size"] == 1 and report["server_cpu_s"] > 0
    assert {(r["target"], r["root"].startswith("s3://bench/")) for r in report["rounds"]} == {
        ("disk", False), ("s3", True)}
    disk, s3 = (report["summary"]["targets"][t] for t in ("disk", "s3"))
    # the same state in both places: DCP's files alike, the manifests a few bytes apart
    assert abs(disk["bytes"] - s3["bytes"]) < 1024 and disk["bytes"] > 2**20
    for row in (disk, s3):
        assert row["save_s"]["median"] > 0 and row["resume_s"]["median"] > 0
        assert row["held_save_s"]["median"] > 0 and row["phases"]["save_phases"]["write"] > 0
    assert disk["phases"]["save_phases"]["commit"] > 0 and s3["phases"]["save_phases"]["prune"]
    for name in ("disk", "s3", "S3 / disk: sync save"):
        assert name in proc.stdout
