"""FSDP2, tensor parallel and 2-D FSDP x TP compute the same training as one process.

Under torchrun + gloo, fp32, dropout 0: per-step losses within 1e-5 relative of the
single-process run (and of DDP); TP's logits and gradients within 1e-5 of the unsharded model;
DCP checkpoints resume across world sizes.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.runs import REPO, TINY, assert_close, child_env, losses, run_trainer

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
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--rdzv_backend", "c10d", "--rdzv_endpoint", "localhost:0",
           "-m", "tests.support.workers.tp_grads"]
    proc = subprocess.run(cmd, cwd=REPO, env=child_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
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


@pytest.mark.parametrize("saved_on, resumed_on", [(2, 1), (1, 2)])
def test_fsdp_checkpoint_resumes_at_another_world_size(tmp_path, saved_on, resumed_on):
    # 48 sequences, global batch 16: 3 steps an epoch, so step 4 resumes mid-epoch.
    common = [*BATCH, "--checkpoint-every", "4", "--train-samples", "48"]
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    run_trainer([*common, "--output-dir", str(whole)], nproc=saved_on, module="trainers.fsdp")
    proc = run_trainer([*common, "--output-dir", str(resumed), "--resume",
                        str(whole / "checkpoints" / "step_00000004")], nproc=resumed_on,
                       module="trainers.fsdp")
    assert "at step 4" in proc.stdout
    assert_close(losses(resumed), {s: v for s, v in losses(whole).items() if s > 4})


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
