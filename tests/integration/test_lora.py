"""LoRA runs end to end (docs/finetuning.md): resume, export in PEFT's format that
``peft.PeftModel.from_pretrained`` loads onto the exported base with our logits, ``--merge``,
sampling with the adapter, the refusals; and (slow) ddp on 2 ranks, fsdp on 2 ranks with
activation checkpointing and ``--compile``, and model_parallel equal one process."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from tests.support.runs import TINY, assert_close, losses, one_line_error, run_trainer
from trainers.models.huggingface import tiny_llama_config
from trainers.tools import export, sample
from trainers.tools.run_model import load_run_model

LORA = [*TINY, "--lora-rank", "4", "--lr", "3e-2"]


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory) -> Path:
    """A one-process tiny GPT LoRA run of 8 steps, checkpoints at 4 and 8."""
    run = tmp_path_factory.mktemp("gpt-lora")
    run_trainer([*LORA, "--checkpoint-every", "4", "--output-dir", str(run)])
    return run


def _run(tmp_path: Path, model: str, *args: str) -> Path:
    """A 3-step one-process LoRA run of ``model``."""
    run = tmp_path / "run"
    run_trainer([*LORA, "--steps", "3", "--model", model, *args, "--output-dir", str(run)])
    return run


def test_a_resumed_run_repeats_the_uninterrupted_one(gpt_run, tmp_path):
    run_trainer([*LORA, "--output-dir", str(tmp_path), "--resume",
                 str(gpt_run / "checkpoints" / "step_00000004")])
    assert losses(tmp_path) == {s: v for s, v in losses(gpt_run).items() if s > 4}


def test_resuming_with_other_adapters_is_one_line(gpt_run, tmp_path):
    checkpoint = gpt_run / "checkpoints" / "step_00000004"
    proc = run_trainer([*LORA, "--lora-targets", "wq,wv", "--output-dir", str(tmp_path),
                        "--resume", str(checkpoint)], check=False)
    assert proc.returncode == 2
    assert proc.stderr == (f"trainers.ddp: error: --resume {checkpoint}: it holds adapters of "
                           "--lora-rank 4 on --lora-targets '' but this run asks for adapters "
                           "of --lora-rank 4 on --lora-targets 'wq,wv'; pass the checkpoint's "
                           "LoRA options, or --resume none (or another --output-dir) to start "
                           "anew\n")


def _logits(model: torch.nn.Module) -> torch.Tensor:
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model.eval()(ids)
    return out if isinstance(out, torch.Tensor) else out.logits


@pytest.mark.parametrize("model", ["tiny", "llama-tiny", "hf"])
def test_peft_loads_the_exported_adapter_onto_the_exported_base(gpt_run, tmp_path,
                                                               monkeypatch, model):
    """Our logits within 1e-5; the base alone computes something else (the adapter counts)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    if model == "tiny":
        run = gpt_run
    elif model == "hf":
        run = _run(tmp_path, f"hf:{tiny_llama_config(tmp_path / 'hf')}")
    else:
        run = _run(tmp_path, model, "--lora-targets", "wq,wk,wo,down")
    out, base_dir = tmp_path / "out", tmp_path / "base"
    export.main([str(run), str(out)])
    base_dir.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(out / name, base_dir / name)
    base = AutoModelForCausalLM.from_pretrained(base_dir)
    alone = _logits(base)
    ours = _logits(load_run_model(run)[0])
    theirs = _logits(PeftModel.from_pretrained(base, out))
    assert (theirs - ours).abs().max() <= 1e-5
    assert (alone - ours).abs().max() > 1e-3


def test_merge_writes_the_base_with_the_adapters_folded_in(gpt_run, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    export.main([str(gpt_run), str(tmp_path / "merged"), "--merge"])
    assert not list((tmp_path / "merged").glob("adapter_*"))
    merged = _logits(AutoModelForCausalLM.from_pretrained(tmp_path / "merged"))
    assert (merged - _logits(load_run_model(gpt_run)[0])).abs().max() <= 1e-5


def test_sampling_uses_the_adapter(gpt_run, capsys):
    """Greedy sampling is the argmax decoding of the adapted model (base and adapters)."""
    model = load_run_model(gpt_run)[0]
    prompt = list(b"abc")
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(12):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    sample.main([str(gpt_run), "--prompt", "abc", "--tokens", "12", "--temperature", "0"])
    assert capsys.readouterr().out.removesuffix("\n").encode() == bytes(ids)


def test_the_refusals_are_one_line(tmp_path, capsys):
    """Before anything trains or is written: targets matching no layer (no config.json), an
    adapter export cannot place, --merge of a full run (no OUT)."""
    proc = run_trainer([*LORA, "--lora-targets", "wq,nope", "--output-dir", str(tmp_path)],
                       check=False)
    assert proc.returncode == 2
    assert proc.stderr == ("trainers.ddp: error: --lora-targets nope matches no linear layer "
                           "of the model; pass some of down,head,up,wk,wo,wq,wv\n")
    assert not (tmp_path / "config.json").exists()
    head = tmp_path / "head"
    run_trainer([*LORA, "--steps", "1", "--lora-targets", "wq,head", "--output-dir", str(head)])
    assert one_line_error(capsys, export, str(head), str(tmp_path / "out")) == (
        "trainers.tools.export: error: the adapter on head has no counterpart in the exported gpt "
        "model; train with --lora-targets of the blocks' layers\n")
    full = tmp_path / "full"
    run_trainer([*TINY, "--steps", "1", "--output-dir", str(full)])
    assert one_line_error(capsys, export, str(full), str(tmp_path / "out"), "--merge") == (
        f"trainers.tools.export: error: --merge folds a LoRA run's adapters in, but {full} trained "
        "every parameter; drop --merge\n")
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> dict[int, float]:
    """The parity reference: one process, global batch 16."""
    run = tmp_path_factory.mktemp("lora-one")
    run_trainer([*LORA, "--batch-size", "16", "--output-dir", str(run)])
    return losses(run)


@pytest.mark.slow
@pytest.mark.parametrize("module, nproc, args", [
    ("trainers.ddp", 2, []),
    ("trainers.fsdp", 2, ["--activation-checkpointing", "--compile"]),
    ("trainers.model_parallel", 1, ["--devices", "cpu,cpu"]),
], ids=["ddp", "fsdp-checkpointing-compile", "model-parallel"])
def test_lora_equals_one_process(one_process, tmp_path, module, nproc, args):
    """FSDP2 over the adapters and the frozen base is the fsdp row's, with activation
    checkpointing and compiled blocks around it (a plain fsdp row would be the same sharding
    again); the bf16 LoRA FSDP2 run and its exact resume: test_memory.py."""
    run_trainer([*LORA, "--batch-size", "16", *args, "--output-dir", str(tmp_path)],
                nproc=nproc, module=module)
    assert_close(losses(tmp_path), one_process)
