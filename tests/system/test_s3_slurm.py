"""A 2-node job on the real Slurm cluster of ``.ci/slurm-up`` with its run on moto's S3 server
(tests/support/s3.py): the credentials and endpoint reach both nodes from the submitting
environment (``sbatch`` exports it), every output lands in the bucket and none in the job
directory, and no credential is written into the job script, the logs or the run.
"""

from __future__ import annotations

import json

import pytest

from tests.support.slurm import job_dir, status, submit, trainer_args, wait
from trainers.runs.storage import location


@pytest.mark.slow
def test_two_node_job_writes_its_run_to_the_bucket(slurm_cluster, s3, tmp_path, monkeypatch):
    secret = "slurm-secret-value-7f3e"  # moto takes any key; this one is traced
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    handle = submit(tmp_path, "ddp", "2x1", trainer_args("--output-dir", s3.url("run"),
                                                         steps=10))
    wait(handle)
    assert "State: SUCCEEDED" in status(tmp_path, handle)
    summary = json.loads(location(s3.url("run", "summary.json")).read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 10
    assert summary["final_loss"] < summary["first_loss"]
    keys = s3.keys("run/")
    for name in ("run/config.json", "run/metrics.jsonl", "run/console.log"):
        assert name in keys, keys
    assert any(k.startswith("run/checkpoints/step_") and k.endswith("/manifest.json")
               for k in keys), keys
    ran_in = job_dir(tmp_path, handle)
    assert not (ran_in / "outputs").exists()  # nothing of the run on the nodes' disk
    for path in [p for p in ran_in.iterdir() if p.is_file()]:
        assert secret not in path.read_text(errors="replace"), path
    for key in keys:
        if key.endswith((".json", ".jsonl", ".log")):
            assert secret not in location(f"s3://{s3.name}/{key}").read_text(), key
