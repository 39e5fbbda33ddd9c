"""The memory anatomy's formulas against a measured training step (each within 10%)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader

from bench.memory_probe import measure_step
from tests.support.processes import run_forked
from tests.support.runs import TINY, losses, run_trainer, without
from trainers.config.parsing import parse_config
from trainers.core.loop import build_optimizer
from trainers.models import build_model, materialize, resolve_spec, spec_of
from trainers.parallel.checkpointing import apply_activation_checkpointing
from trainers.sizing.memory_formulas import (
    Adapters,
    Layout,
    anatomy_table,
    parse_targets,
    predict,
)
from trainers.sizing.shapes import MODEL_SIZES

CATEGORIES = ("params", "grads", "optimizer", "activations", "gathered")


def assert_within(measured: dict[str, int], predicted: dict[str, int], rel: float = 0.10):
    for category in CATEGORIES:
        got, want = measured[category], predicted[category]
        assert abs(got - want) <= rel * max(want, 1), \
            f"{category}: measured {got}, predicted {want}"


# Both families at both sizes; bf16 (software matmuls on CPUs without bf16 hardware, slow at
# the larger size) on the tiny ones: its formulas differ from fp32's by the element size alone.
SINGLE_PROCESS_CASES = [(name, checkpointing, dtype)
                        for name in ("tiny", "small", "llama-tiny", "llama-small")
                        for checkpointing in (False, True)
                        for dtype in (("fp32", "bf16") if "tiny" in name else ("fp32",))]


@pytest.mark.slow
@pytest.mark.parametrize("name, checkpointing, dtype", SINGLE_PROCESS_CASES)
def test_single_process_step_matches_the_formulas(name, checkpointing, dtype):
    cfg = parse_config(["--model", name], "ddp", world_sizes=[1], check_paths=False)
    torch.manual_seed(0)
    model = build_model(name)
    if checkpointing:
        apply_activation_checkpointing(model, resolve_spec(name))
    optimizer = build_optimizer(model, cfg)
    batch, seq = 4, 64  # the shapes are the model's; a short sequence keeps it fast
    inputs, targets = torch.randint(0, model.cfg.vocab_size, (2, batch, seq))
    for _ in range(2):
        measured = measure_step(model, optimizer, inputs, targets, torch.autocast(
            "cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"))
    predicted = predict(model.cfg, batch, seq, dtype, checkpointing, Layout())
    assert_within(dataclasses.asdict(measured), dataclasses.asdict(predicted))
    # At the end of forward the step holds parameters, optimizer state and activations
    # (gradients were freed by the previous step's zero_grad); the peak is at least that.
    held = measured.params + measured.optimizer + measured.activations
    assert held <= measured.peak < 2 * predicted.total


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tiny", "llama-tiny"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("targets", ["", "wq,down,head"])
def test_single_process_lora_step_matches_the_formulas(name, dtype, targets):
    """LoRA (the model the trainers build for --lora-rank, its frozen linear layers bf16
    under --dtype bf16): the default targets, and ones that keep the MLP's and the head's
    inputs."""
    lora = ["--lora-rank", "4"] + (["--lora-targets", targets] if targets else [])
    cfg = parse_config(["--model", name, "--dtype", dtype, *lora], "ddp", world_sizes=[1],
                       check_paths=False)
    spec = spec_of(cfg)
    model = spec.meta_model()
    materialize(model, torch.device("cpu"), 0, spec)
    optimizer = build_optimizer(model, cfg)
    batch, seq = 4, 64
    inputs, targets_ = torch.randint(0, spec.shape.vocab_size, (2, batch, seq))
    for _ in range(2):
        measured = measure_step(model, optimizer, inputs, targets_, torch.autocast(
            "cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"))
    predicted = predict(spec.shape, batch, seq, dtype, False, Layout(),
                        Adapters(4, parse_targets(targets)))
    assert_within(dataclasses.asdict(measured), dataclasses.asdict(predicted))


# Every sharding in fp32 and bf16 (FSDP's bf16 policy changes what is held and gathered), and
# activation checkpointing once: it changes the activations alone, the same under any sharding
# (the one-process cases check it in both dtypes).
TWO_RANK_CASES = ["ddp:fp32:0", "ddp:bf16:0", "zero2:fp32:0", "zero2:bf16:0", "zero3:fp32:0",
                  "zero3:bf16:0", "zero3:fp32:1"]


# LoRA rank 4 on the default targets: ddp and FSDP (ZeRO-3) in fp32 and bf16 (FSDP's bf16
# policy over the frozen bf16 base and fp32 adapters), ZeRO-2 in bf16, checkpointing once.
LORA_CASES = ["ddp:fp32:0:4", "ddp:bf16:0:4", "zero3:fp32:0:4", "zero3:bf16:0:4",
              "zero2:bf16:0:4", "ddp:fp32:1:4"]


@pytest.fixture(scope="module")
def two_rank_records() -> list[dict]:
    """The records of every TWO_RANK_CASES and LORA_CASES case, measured in one torchrun of
    2 ranks (a launch, not a case, is what costs: one for both tests)."""
    proc = run_forked("tests.support.workers.memory_anatomy",
                      ["llama-tiny", *TWO_RANK_CASES, *LORA_CASES], nproc=2)
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


@pytest.mark.slow
@pytest.mark.parametrize("cases", [TWO_RANK_CASES, LORA_CASES], ids=["full", "lora"])
def test_two_rank_steps_match_the_formulas(two_rank_records, cases):
    """The sharding formulas on 2 ranks, on llama-tiny (the layout's division of the states
    does not depend on the family; every family's one-process formulas are checked above),
    training every parameter or LoRA's adapters."""
    lora = cases == LORA_CASES
    records = [r for r in two_rank_records if r["case"].endswith(" lora=0") != lora]
    assert len(records) == 2 * len(cases)  # a record per case and rank
    for record in records:
        try:
            assert_within(record["measured"], record["predicted"])
        except AssertionError as err:
            raise AssertionError(f"{record['case']}, rank {record['rank']}: {err}") from None


# 3-D on 8 ranks (pp 2 x dp 2 x tp 2): ZeRO-3 over dp in bf16, and dp 1 (two independent
# pipelines of pp 2 x tp 2) in fp32; activation checkpointing, as the planner prices pipelines.
PIPELINE_CASES = ["zero3:bf16", "ddp:fp32"]


@pytest.mark.slow
def test_3d_pipeline_stages_match_the_formulas(name="llama-tiny"):
    """Each stage of a pipeline x tensor x FSDP layout: the last stage (output side, the
    heaviest, what the planner prices) and the first (no output side) each within 10%."""
    proc = run_forked("tests.support.workers.pipeline_memory", [name, *PIPELINE_CASES],
                      nproc=8)
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(records) == 8 * len(PIPELINE_CASES)
    assert {r["stage"] for r in records} == {"first", "last"}
    for record in records:
        try:
            assert_within(record["measured"], record["predicted"])
        except AssertionError as err:
            raise AssertionError(f"{record['case']}, rank {record['rank']} ({record['stage']} "
                                 f"stage): {err}") from None


def test_sharding_divides_the_states():
    shape = MODEL_SIZES["1b"]
    ddp, zero1, zero2, zero3 = (predict(shape, 1, 2048, "bf16", False, Layout(s, dp=8))
                                for s in ("ddp", "zero1", "zero2", "zero3"))
    assert zero1.optimizer == pytest.approx(ddp.optimizer / 8, rel=1e-3)
    assert zero1.params == ddp.params and zero1.grads == ddp.grads
    assert zero2.grads == zero3.grads == pytest.approx(ddp.grads / 8, rel=1e-3)
    assert zero3.params == pytest.approx(ddp.params / 8, rel=1e-3)
    assert zero2.gathered == ddp.params // 2  # every parameter whole, in bf16
    assert ddp.params + ddp.grads + ddp.optimizer == 16 * shape.num_params() + 4 * (4 + 10 * 20)
    checkpointed = predict(shape, 1, 2048, "bf16", True, Layout())
    assert checkpointed.activations < ddp.activations / 5


def test_tensor_and_pipeline_degrees_divide_blocks():
    shape = MODEL_SIZES["7b"]
    whole = predict(shape, 1, 2048, "bf16", False, Layout())
    tp = predict(shape, 1, 2048, "bf16", False, Layout(tp=8))
    pp = predict(shape, 1, 2048, "bf16", False, Layout(pp=4))
    assert tp.params < whole.params / 6 and pp.params < whole.params / 3.5
    assert tp.activations < whole.activations / 2 and pp.activations < whole.activations / 3


def test_the_1b_table_comes_from_the_formulas():
    table = anatomy_table(MODEL_SIZES["1b"], 1, 2048, "bf16", False, 8)
    lines = table.splitlines()
    assert [line.split()[0] for line in lines[1:]] == ["ddp", "zero1", "zero2", "zero3"]
    zero3 = predict(MODEL_SIZES["1b"], 1, 2048, "bf16", False, Layout("zero3", dp=8))
    assert lines[-1].split()[-1] == f"{zero3.total / 2**30:.2f}"
    out = run_forked("trainers.planning.memory", ["--model", "1b",
                          "--devices", "8"])
    assert table in out.stdout


def test_the_3d_table_prices_the_heaviest_stage():
    """``trainers.planning.memory --tp --pp``: ZeRO over devices / (tp x pp) pipelines, and ZeRO-3
    holds one end of the model whole, not both."""
    shape = MODEL_SIZES["llama-8b"]
    table = anatomy_table(shape, 1, 8192, "bf16", True, 16, tp=2, pp=2)
    zero3 = predict(shape, 1, 8192, "bf16", True, Layout("zero3", dp=4, tp=2, pp=2))
    assert table.splitlines()[-1].split()[-1] == f"{zero3.total / 2**30:.2f}"
    assert zero3.gathered == (shape.vocab_size * shape.d_model + shape.d_model) * 2  # bf16
    out = run_forked("trainers.planning.memory", ["--model", "llama-8b",
                          "--seq-len", "8192", "--devices", "16", "--tp", "2", "--pp", "2",
                          "--activation-checkpointing"])
    assert table in out.stdout


def test_the_lora_table_prices_the_frozen_base_and_the_adapters():
    """``trainers.planning.memory --lora-rank 16``: llama-8b's base in bf16 but embeddings and
    norms, gradients and AdamW state for its 6.82M adapter parameters alone."""
    shape, adapters = MODEL_SIZES["llama-8b"], Adapters(16)
    ddp = predict(shape, 1, 8192, "bf16", False, Layout("ddp", dp=8), adapters)
    assert ddp.grads == 4 * 32 * 16 * (2 * 4096 + 4096 + 1024)  # wq, wv
    outside = shape.vocab_size * shape.d_model + (2 * 32 + 1) * shape.d_model
    assert ddp.params == 2 * (shape.num_params() - outside) + 4 * outside + ddp.grads
    table = anatomy_table(shape, 1, 8192, "bf16", False, 8, adapters=adapters)
    out = run_forked("trainers.planning.memory", ["--model", "llama-8b",
                          "--seq-len", "8192", "--lora-rank", "16"])
    assert "LoRA rank 16: 6.82M adapter parameters" in out.stdout and table in out.stdout


def test_unknown_sharding_is_refused():
    with pytest.raises(ValueError, match="unknown sharding 'zero4'"):
        Layout("zero4")


@pytest.mark.slow
@pytest.mark.parametrize("name, seq", [("tiny", 64), ("small", 128)])
@pytest.mark.parametrize("attention, window", [("naive", 256), ("tiled", 256),
                                               ("sliding_window", 64), ("linear", 256)])
def test_attention_implementations_match_the_formulas(name, seq, attention, window):
    cfg = parse_config(["--model", name], "ddp", world_sizes=[1], check_paths=False)
    torch.manual_seed(0)
    model = build_model(name, attention=attention, attention_window=window)
    optimizer = build_optimizer(model, cfg)
    inputs, targets = torch.randint(0, 256, (2, 2, seq))
    for _ in range(2):
        measured = measure_step(model, optimizer, inputs, targets)
    predicted = predict(model.cfg, 2, seq, "fp32", False, Layout())
    assert_within(dataclasses.asdict(measured), dataclasses.asdict(predicted))


@pytest.mark.slow
def test_a_bf16_lora_run_on_two_fsdp_ranks_trains_and_resumes_exactly(tmp_path):
    """The frozen bf16 base (one FSDP2 unit holding bf16 frozen and fp32 adapter parameters
    under the bf16 policy) trains: the loss falls; a resume from step 4 repeats the
    uninterrupted run's losses exactly; the checkpoint holds adapters alone."""
    args = [*without(TINY, "--model"), "--model", "llama-tiny", "--dtype", "bf16",
            "--lora-rank", "4", "--lr", "1e-2", "--checkpoint-every", "4"]
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    run_trainer([*args, "--output-dir", str(whole)], nproc=2, module="trainers.fsdp")
    reference = losses(whole)
    assert reference[8] < reference[1] - 0.02
    run_trainer([*args, "--output-dir", str(resumed), "--resume",
                 str(whole / "checkpoints" / "step_00000004")], nproc=2, module="trainers.fsdp")
    assert losses(resumed) == {s: v for s, v in reference.items() if s > 4}
    saved = FileSystemReader(str(whole / "checkpoints" / "step_00000008"))
    model_keys = [k for k in saved.read_metadata().state_dict_metadata
                  if k.startswith("train.model.")]
    assert model_keys and all(".lora_" in k for k in model_keys)
