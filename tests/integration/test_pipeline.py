"""Pipeline (alone and 3-D) and model parallelism compute the single-process training.

Under torchrun + gloo, fp32: every schedule's per-step losses within 1e-5 relative of one
process, on 2 ranks and as 3-D (pp2 x dp2 x tp2 with ZeRO-3 on 8 ranks, on llama-tiny; pp2 x
tp2); the 8-rank 3-D checkpoint resumes at another layout (pp2 x tp2, and the fsdp trainer) with the
uninterrupted run's losses, and sample and export read it; the naive model-parallel run exactly
equal; the recorded timeline has a forward and a backward per micro-batch and stage.
"""

from __future__ import annotations

import json

import pytest

from tests.support.runs import TINY, assert_close, losses, run_trainer
from trainers.tools import export, sample

pytestmark = pytest.mark.slow

BATCH = [*TINY, "--batch-size", "16"]


@pytest.mark.parametrize("schedule, extra", [
    ("zerobubble", ["--virtual-stages", "2"]),
])
def test_schedules_match_one_process(tmp_path, single_process, schedule, extra):
    """The schedules the 3-D runs below do not take, on one pipeline of 2 ranks (gpipe's is
    test_timeline_records_every_micro_batch's run, which records its timeline besides)."""
    run_trainer([*BATCH, "--pp", "2", "--schedule", schedule, "--microbatches", "4", *extra,
                 "--output-dir", str(tmp_path)], nproc=2, module="trainers.pipeline")
    assert_close(losses(tmp_path), single_process)


THREE_D = ["--pp", "2", "--tp", "2", "--microbatches", "4"]
INTERLEAVED_AC = ["--schedule", "interleaved1f1b", "--virtual-stages", "2",
                  "--activation-checkpointing"]


@pytest.mark.parametrize("nproc, extra", [
    (4, ["--schedule", "1f1b", "--sequence-parallel"]),
], ids=["pp2-tp2-sp"])
def test_three_dimensional_runs_match_one_process(tmp_path, single_process, nproc, extra):
    """Tensor parallel (sequence parallel) inside each of 2 stages, one pipeline: the
    single-process losses. (pp2 x dp2 x tp2 with ZeRO-3 under interleaved 1F1B with activation
    checkpointing is the saved run of the test below; under 1f1b the component's run in
    test_component_3d.py; ZeRO-2 against the flat all-reduce is
    test_bench_pipeline_reduction.py's.)"""
    run_trainer([*BATCH, *THREE_D, *extra, "--output-dir", str(tmp_path)], nproc=nproc,
                module="trainers.pipeline")
    assert_close(losses(tmp_path), single_process)


def test_three_dimensional_checkpoint_resumes_at_other_layouts(tmp_path, capsys):
    """llama-tiny (grouped-query attention) as pp2 x dp2 x tp2 on 8 ranks (FSDP2 ZeRO-3 across
    the 2 pipelines, interleaved 1F1B with two virtual stages a rank, activation checkpointing)
    computes the one-process run's losses; its checkpoint, resumed at pp2 x tp2 x dp1 (1f1b) and
    by the fsdp trainer on 2 ranks through DCP's resharding, gives the uninterrupted run's
    losses; sample and export read it."""
    common = [*BATCH, "--model", "llama-tiny", "--train-samples", "48"]
    whole, one = tmp_path / "whole", tmp_path / "one-process"
    run_trainer([*common, *THREE_D, *INTERLEAVED_AC, "--checkpoint-every", "4",
                 "--output-dir", str(whole)], nproc=8, module="trainers.pipeline")
    run_trainer([*common, "--output-dir", str(one)])
    assert_close(losses(whole), losses(one))
    step_4 = str(whole / "checkpoints" / "step_00000004")
    after = {s: v for s, v in losses(whole).items() if s > 4}
    for name, module, nproc, layout in (("pp2-tp2", "trainers.pipeline", 4, THREE_D),
                                        ("fsdp", "trainers.fsdp", 2, [])):
        resumed = tmp_path / name
        proc = run_trainer([*common, *layout, "--checkpoint-every", "4", "--output-dir",
                            str(resumed), "--resume", step_4], nproc=nproc, module=module)
        assert "at step 4" in proc.stdout
        assert_close(losses(resumed), after)
    sample.main([str(whole), "--prompt", "ab", "--tokens", "4", "--temperature", "0"])
    assert len(capsys.readouterr().out.removesuffix("\n")) >= 2
    export.main([str(whole), str(tmp_path / "exported")])
    assert (tmp_path / "exported" / "model.safetensors").is_file()


def test_timeline_records_every_micro_batch(gpipe_timeline_run, single_process):
    """GPipe on 2 ranks, 4 micro-batches, --record-timeline (tests/conftest.py's run)."""
    assert_close(losses(gpipe_timeline_run), single_process)
    for rank in range(2):
        records = [json.loads(line) for line in
                   (gpipe_timeline_run / f"timeline.rank{rank}.jsonl").read_text().splitlines()]
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
