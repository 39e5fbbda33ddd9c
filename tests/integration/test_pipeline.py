"""Pipeline and model parallelism compute the single-process training.

Under torchrun + gloo, fp32: every schedule's per-step losses within 1e-5 relative of one
process; the naive model-parallel run exactly equal; resume reproduces the losses; the
recorded timeline has a forward and a backward per micro-batch and stage.
"""

from __future__ import annotations

import json

import pytest

from tests.support.runs import TINY, assert_close, losses, run_trainer

pytestmark = pytest.mark.slow

BATCH = [*TINY, "--batch-size", "16"]


@pytest.mark.parametrize("schedule, extra", [
    ("gpipe", []),
    ("1f1b", []),
    ("interleaved1f1b", ["--virtual-stages", "2"]),
    ("zerobubble", ["--virtual-stages", "2"]),
])
def test_schedules_match_one_process(tmp_path, single_process, schedule, extra):
    run_trainer([*BATCH, "--pp", "2", "--schedule", schedule, "--microbatches", "4", *extra,
                 "--output-dir", str(tmp_path)], nproc=2, module="trainers.pipeline")
    assert_close(losses(tmp_path), single_process)


def test_pipeline_with_data_parallel_replicas(tmp_path, single_process):
    run_trainer([*BATCH, "--pp", "2", "--dp", "2", "--microbatches", "2",
                 "--activation-checkpointing", "--output-dir", str(tmp_path)], nproc=4,
                module="trainers.pipeline")
    assert_close(losses(tmp_path), single_process)


def test_pipeline_resumes_from_its_checkpoint(tmp_path):
    common = [*BATCH, "--pp", "2", "--checkpoint-every", "4", "--train-samples", "48"]
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    run_trainer([*common, "--output-dir", str(whole)], nproc=2, module="trainers.pipeline")
    proc = run_trainer([*common, "--output-dir", str(resumed), "--resume",
                        str(whole / "checkpoints" / "step_00000004")], nproc=2,
                       module="trainers.pipeline")
    assert "at step 4" in proc.stdout
    assert_close(losses(resumed), {s: v for s, v in losses(whole).items() if s > 4})


def test_timeline_records_every_micro_batch(tmp_path, single_process):
    run_trainer([*BATCH, "--pp", "2", "--schedule", "gpipe", "--microbatches", "4",
                 "--record-timeline", "--output-dir", str(tmp_path)], nproc=2,
                module="trainers.pipeline")
    assert_close(losses(tmp_path), single_process)
    for rank in range(2):
        records = [json.loads(line) for line in
                   (tmp_path / f"timeline.rank{rank}.jsonl").read_text().splitlines()]
        assert [r["step"] for r in records] == list(range(1, 9))
        (stage,) = records[-1]["stages"]
        assert stage["stage"] == rank and stage["activation_peak_bytes"] > 0
        kinds = sorted((i["kind"], i["microbatch"]) for i in stage["intervals"])
        assert kinds == [(k, m) for k in "BF" for m in range(4)]
        assert all(i["end"] > i["start"] for i in stage["intervals"])


def test_model_parallel_on_two_cpu_places_equals_one_device(tmp_path, single_process):
    run_trainer([*BATCH, "--devices", "cpu,cpu", "--output-dir", str(tmp_path)],
                module="trainers.model_parallel")
    assert losses(tmp_path) == single_process
