"""``--model hf:DIR``: a local Hugging Face causal LM trained by the trainers.

Its weights come from the directory's safetensors when present (logits equal Hugging Face's
own model's), it trains under ddp and fsdp (with activation checkpointing) with the
single-process run's losses, and what it cannot do is refused in one line before a start.
"""

from __future__ import annotations

import pytest
import torch

from tests.support.runs import assert_close, losses, run_trainer
from trainers.config.parsing import parse_config
from trainers.errors import ConfigError
from trainers.models import build_model
from trainers.models.huggingface import tiny_llama_config

transformers = pytest.importorskip("transformers")

RUN = ["--steps", "6", "--batch-size", "8", "--eval-every", "0", "--checkpoint-every", "0",
       "--log-every", "1", "--tensorboard", "false", "--device", "cpu", "--peak-tflops", "1"]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return tiny_llama_config(tmp_path_factory.mktemp("hf") / "tiny-llama")


def test_weights_come_from_the_safetensors_files(tmp_path, hf_dir):
    config = transformers.AutoConfig.from_pretrained(hf_dir)
    torch.manual_seed(3)
    reference = transformers.AutoModelForCausalLM.from_config(config).eval()
    reference.save_pretrained(tmp_path)  # config.json and model.safetensors
    ours = build_model(f"hf:{tmp_path}", seed=0).eval()
    tokens = torch.randint(0, 256, (2, 32))
    torch.testing.assert_close(ours(tokens), reference(tokens).logits, rtol=1e-5, atol=1e-6)


def test_without_weights_the_seed_initializes_it(hf_dir):
    first, again, other = (dict(build_model(f"hf:{hf_dir}", seed=s).named_parameters())
                           for s in (1, 1, 2))
    name = "model.model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(first[name], again[name]) and not torch.equal(first[name], other[name])
    assert abs(first[name].std().item() - 0.02) < 0.003  # initializer_range


@pytest.mark.parametrize("trainer, args, message", [
    ("ddp", ["--model", "hf:/nonexistent"], "config.json does not exist"),
    ("tensor_parallel", ["--tp", "2"], "has no tensor-parallel plan; pass --tp 1"),
    ("pipeline", ["--pp", "2"], "cannot be split into stages"),
    ("model_parallel", ["--devices", "cpu,cpu"], "cannot be split into stages"),
    ("ddp", ["--attention", "naive"], "applies to the built-in models only"),
])
def test_what_it_cannot_do_is_refused(tmp_path, hf_dir, trainer, args, message):
    argv = ["--model", f"hf:{hf_dir}", "--output-dir", str(tmp_path), *args]
    with pytest.raises(ConfigError, match=message):
        parse_config(argv, trainer, world_sizes=[2])


@pytest.mark.slow
def test_ddp_and_fsdp_match_one_process(tmp_path, hf_dir):
    model = ["--model", f"hf:{hf_dir}", *RUN]
    run_trainer([*model, "--output-dir", str(tmp_path / "one")])
    single = losses(tmp_path / "one")
    assert single[6] < single[1]
    run_trainer([*model, "--output-dir", str(tmp_path / "ddp")], nproc=2)
    run_trainer([*model, "--activation-checkpointing", "--output-dir", str(tmp_path / "fsdp")],
                nproc=2, module="trainers.fsdp")
    assert_close(losses(tmp_path / "ddp"), single)
    assert_close(losses(tmp_path / "fsdp"), single)
