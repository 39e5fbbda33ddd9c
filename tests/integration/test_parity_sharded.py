"""FSDP2, tensor parallel and 2-D FSDP x TP compute the same training as one process.

Under torchrun + gloo, fp32, dropout 0: per-step losses within 1e-5 relative of the
single-process run (and of DDP); TP's logits and gradients within 1e-5 of the unsharded model;
DCP checkpoints resume across world sizes.
"""

from __future__ import annotations

import pytest

from tests.support.processes import run_forked
from tests.support.runs import (
    TINY,
    assert_close,
    losses,
    run_trainer,
    without,
)

pytestmark = pytest.mark.slow

BATCH = [*TINY, "--batch-size", "16"]


def test_fsdp_matches_ddp_and_one_process(tmp_path, single_process, ddp_two_ranks):
    """ZeRO-3; ZeRO-2 (--reshard-after-forward false) is the fsdp component's run, checked
    against one process by tests/integration/test_sample_export.py."""
    run_trainer([*BATCH, "--output-dir", str(tmp_path)], nproc=2, module="trainers.fsdp")
    assert_close(losses(tmp_path), single_process)
    assert_close(losses(tmp_path), ddp_two_ranks)


def test_fsdp_with_accumulation_and_checkpointing(tmp_path, single_process):
    run_trainer([*BATCH, "--grad-accum", "2", "--activation-checkpointing",
                 "--output-dir", str(tmp_path)], nproc=2, module="trainers.fsdp")
    assert_close(losses(tmp_path), single_process)


def test_tensor_parallel_logits_and_gradients_match_the_unsharded_model():
    """Without and with sequence parallel, in one torchrun."""
    proc = run_forked("tests.support.workers.tp_grads", [], nproc=2)
    assert proc.stdout.count("checked logits and") == 2, proc.stdout


def test_tensor_parallel_with_sequence_parallel_matches_one_process(tmp_path, single_process):
    """Plain tensor parallel is the 2-D run's below."""
    run_trainer([*BATCH, "--tp", "2", "--sequence-parallel", "--output-dir", str(tmp_path)],
                nproc=2, module="trainers.tensor_parallel")
    assert_close(losses(tmp_path), single_process)


def test_two_dimensional_fsdp_by_tp_matches_one_process(tmp_path, single_process):
    run_trainer([*BATCH, "--tp", "2", "--output-dir", str(tmp_path)], nproc=4,
                module="trainers.tensor_parallel")
    assert_close(losses(tmp_path), single_process)


def test_fsdp_checkpoint_resumes_at_another_world_size(tmp_path):
    """One process saves step 4, two ranks resume from it and save step 8, one process resumes
    from that: each resumed run's losses are the uninterrupted one-process run's (a chain of
    three runs proves both directions, 1 -> 2 and 2 -> 1)."""
    # 48 sequences, global batch 16: 3 steps an epoch, so steps 4 and 8 resume mid-epoch.
    common = [*without(BATCH, "--steps"), "--steps", "10", "--checkpoint-every", "4",
              "--train-samples", "48"]
    whole, on_two, on_one = tmp_path / "whole", tmp_path / "on-two", tmp_path / "on-one"
    run_trainer([*common, "--output-dir", str(whole)], module="trainers.fsdp")
    expected = losses(whole)
    for saved, resumed, step, nproc in ((whole, on_two, 4, 2), (on_two, on_one, 8, 1)):
        proc = run_trainer([*common, "--output-dir", str(resumed), "--resume",
                            str(saved / "checkpoints" / f"step_{step:08d}")], nproc=nproc,
                           module="trainers.fsdp")
        assert f"at step {step}" in proc.stdout
        assert_close(losses(resumed), {s: v for s, v in expected.items() if s > step})


def test_fsdp_cpu_offload_computes_the_same_losses(tmp_path, single_process):
    run_trainer([*BATCH, "--cpu-offload", "--output-dir", str(tmp_path)], nproc=2,
                module="trainers.fsdp")
    assert_close(losses(tmp_path), single_process)


def test_fsdp_bf16_mixed_precision_tracks_fp32(tmp_path, single_process):
    """bf16 parameters and compute, fp32 reduction: close to fp32, not equal."""
    run_trainer([*BATCH, "--dtype", "bf16", "--output-dir", str(tmp_path)], nproc=2,
                module="trainers.fsdp")
    bf16 = losses(tmp_path)
    assert bf16 != single_process
    assert_close(bf16, single_process, rel=2e-2)
