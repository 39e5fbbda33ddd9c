"""The Llama family trains alike under every trainer: losses within 1e-5 of one process.

``llama-tiny`` (grouped-query attention: 4 query heads, 2 key/value heads) on gloo, fp32,
dropout 0: ddp, tensor parallel with sequence parallel (one key/value head per rank) and the
model-parallel spread give the single-process run's per-step losses. The 3-D pipeline x FSDP2
(ZeRO-3) x tensor parallel run on 8 ranks under interleaved 1f1b with activation checkpointing
is llama-tiny's too: tests/integration/test_pipeline.py's checkpoint test, which also resumes
it at other layouts.
"""

from __future__ import annotations

import pytest

from tests.support.runs import assert_close, losses, run_trainer

pytestmark = pytest.mark.slow

LLAMA = ["--model", "llama-tiny", "--steps", "8", "--batch-size", "16", "--eval-every", "0",
         "--checkpoint-every", "0", "--log-every", "1", "--tensorboard", "false",
         "--device", "cpu", "--peak-tflops", "1"]


@pytest.fixture(scope="module")
def llama_single(tmp_path_factory) -> dict[int, float]:
    run_dir = tmp_path_factory.mktemp("llama-single")
    run_trainer([*LLAMA, "--output-dir", str(run_dir)])
    return losses(run_dir)


def test_llama_learns(llama_single):
    assert llama_single[8] < llama_single[1] - 0.3


@pytest.mark.parametrize("module, nproc, extra", [
    ("trainers.ddp", 2, []),
    ("trainers.tensor_parallel", 2, ["--tp", "2", "--sequence-parallel"]),
    ("trainers.model_parallel", 1, ["--devices", "cpu,cpu"]),
], ids=["ddp", "tp-sp", "model-parallel"])
def test_llama_matches_one_process(tmp_path, llama_single, module, nproc, extra):
    run_trainer([*LLAMA, *extra, "--output-dir", str(tmp_path)], nproc=nproc, module=module)
    assert_close(losses(tmp_path), llama_single)
