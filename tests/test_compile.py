"""``--compile`` (per-block torch.compile, inductor on the CPU) trains like eager.

Per-step losses over 20 steps within 1e-4 relative of the eager single-process run, under DDP
in bf16, FSDP2 (on the llama family), and tensor parallelism with activation checkpointing; the
summary reports the compile time apart from the step time; parameter names, hence
checkpoints, are those of the eager model.
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import TINY, assert_close, losses, run_trainer
from trainers.core.metrics import bf16_matmul_hardware
from trainers.core.model_spec import resolve_spec
from trainers.parallel.checkpointing import apply_activation_checkpointing
from trainers.parallel.compile import apply_compile

STEPS = [*TINY, "--steps", "20"]
FP32 = ["--batch-size", "16"]
BF16 = ["--batch-size", "2", "--dtype", "bf16"]  # small: bf16 is slow on CPUs without AMX
# The shapes of `python -m bench.gpu --quick` (tests/test_bench_gpu.py), whose compiled run
# then finds this one's kernels in inductor's cache.
LLAMA = ["--model", "llama-tiny", "--batch-size", "4"]


@pytest.fixture(scope="module")
def eager(tmp_path_factory) -> dict[str, dict[int, float]]:
    """Per-step losses of one eager process: gpt tiny in fp32 and bf16, llama-tiny in fp32."""
    runs = {}
    for name, flags in (("fp32", FP32), ("bf16", BF16), ("llama", LLAMA)):
        run_dir = tmp_path_factory.mktemp(f"eager-{name}")
        run_trainer([*STEPS, *flags, "--output-dir", str(run_dir)])
        runs[name] = losses(run_dir)
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("module, flags, reference", [
    ("trainers.ddp", BF16, "bf16"),
    ("trainers.fsdp", LLAMA, "llama"),
    ("trainers.tensor_parallel", [*FP32, "--tp", "2", "--activation-checkpointing"], "fp32"),
], ids=["ddp-bf16", "fsdp-llama", "tp-ac"])
def test_compiled_run_matches_eager(tmp_path, eager, module, flags, reference):
    """Two ranks each: DDP's wrapper, FSDP's hooks and TP's DTensors around compiled blocks."""
    proc = run_trainer([*STEPS, *flags, "--compile", "--output-dir", str(tmp_path)], nproc=2,
                       module=module)
    assert_close(losses(tmp_path), eager[reference], rel=1e-4)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["compile_time_s"] > 0
    if reference == "bf16" and bf16_matmul_hardware(torch.device("cpu")) is None:
        assert "no bf16 matmul hardware" in proc.stdout


def test_compiled_blocks_keep_the_eager_parameter_names():
    spec = resolve_spec("tiny")
    eager, compiled = spec.meta_model(), spec.meta_model()
    apply_activation_checkpointing(compiled, spec)
    apply_compile(compiled, spec)
    assert list(compiled.state_dict()) == list(eager.state_dict())
    assert all(type(block.forward).__name__ != "method"
               for _, block in spec.named_blocks(compiled))
