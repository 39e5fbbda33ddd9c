"""LoRA (trainers/models/lora.py): adapters on any spec, the base frozen and unchanged by
training, the adapters alone in gradients, optimizer state and checkpoints."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader

from tests.support.runs import TINY, without
from trainers.config.parsing import parse_config
from trainers.errors import ConfigError
from trainers.models import build_model, materialize, resolve_spec, spec_of
from trainers.models.huggingface import tiny_llama_config
from trainers.models.lora import adapters, merge_adapters, with_lora
from trainers.models.registry import family_key
from trainers.runs.checkpoint_files import find_checkpoints
from trainers.sizing.shapes import MODEL_SIZES


def _adapted(name: str, targets: str = "", seed: int = 0) -> torch.nn.Module:
    spec = with_lora(resolve_spec(name), family_key(name), 4, 16.0, 0.0, targets)
    model = spec.meta_model()
    materialize(model, torch.device("cpu"), seed, spec)
    return model.eval()


CUSTOM = "examples.custom_model.conv_lm:SPEC"


@pytest.mark.parametrize("name, expected", [
    ("tiny", {"wq", "wk", "wv"}), ("llama-tiny", {"wq", "wv"}), ("hf", {"q_proj", "v_proj"}),
    (CUSTOM, {"gate", "out"}),  # MODULE:ATTR: every linear layer in the blocks, not the head
])
def test_each_family_has_a_default_set_of_targets(tmp_path, name, expected):
    model_name = f"hf:{tiny_llama_config(tmp_path)}" if name == "hf" else name
    spec = with_lora(resolve_spec(model_name), family_key(model_name), 4, 16.0, 0.0, "")
    paths = list(adapters(spec.meta_model()))
    assert len(paths) == 4 * len(expected)  # in every one of the 4 blocks
    assert {p.rpartition(".")[2] for p in paths} == expected


def test_a_target_matching_no_layer_names_the_candidates():
    with pytest.raises(ConfigError, match=r"^--lora-targets wz matches no linear layer of the "
                                          r"model; pass some of down,head,up,wk,wo,wq,wv$"):
        with_lora(resolve_spec("tiny"), "gpt", 4, 16.0, 0.0, "wq,wz")


def test_new_adapters_leave_the_model_as_it_was_and_repeat_with_the_seed():
    """B starts at zero, so the adapted model computes the base model; A is the same for the
    same (seed, name) and differs with the seed."""
    tokens = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    adapted, base = _adapted("llama-tiny"), build_model("llama-tiny", seed=0).eval()
    with torch.no_grad():
        assert torch.equal(adapted(tokens), base(tokens))
    a = adapters(adapted)["blocks.1.attn.wq"].lora_A.weight
    assert a.abs().sum() > 0
    assert torch.equal(a, adapters(_adapted("llama-tiny"))["blocks.1.attn.wq"].lora_A.weight)
    assert not torch.equal(a, adapters(_adapted("llama-tiny", seed=1))["blocks.1.attn.wq"]
                           .lora_A.weight)


def test_merging_computes_what_the_adapters_did():
    model = _adapted("tiny", "wq,wo,up")
    with torch.no_grad():
        for layer in adapters(model).values():
            layer.lora_B.weight.normal_(0, 0.1, generator=torch.Generator().manual_seed(1))
    tokens = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(tokens)
        merge_adapters(model)
        assert (model(tokens) - before).abs().max() < 1e-5
        assert not torch.equal(model(tokens), before)  # merged: another computation


@pytest.mark.parametrize("name, targets", [("tiny", "wq,wv,down"), (CUSTOM, "")])
def test_training_changes_only_the_adapters(tmp_path, name, targets):
    """After 3 steps the base is bitwise the seed's, only adapters had gradients, and the
    checkpoint holds only adapters and their optimizer state (a built-in family, with its
    tied head, and a MODULE:ATTR model)."""
    from trainers.core.distributed import init_distributed
    from trainers.core.loop import train
    from trainers.ddp import build

    lora = ["--lora-rank", "4"] + (["--lora-targets", targets] if targets else [])
    cfg = parse_config([*without(TINY, "--steps", "--model"), "--model", name, "--steps", "3",
                        *lora, "--device", "cpu", "--output-dir", str(tmp_path)], "ddp")
    spec = spec_of(cfg)
    with init_distributed(cfg) as env:
        strategy = build(cfg, env, spec)
        train(cfg, env, strategy, spec, tmp_path)
    model = strategy.model
    fresh = build_model(name, seed=cfg.seed)
    trained = {name for name, p in model.named_parameters() if p.grad is not None}
    assert trained == {name for name, p in model.named_parameters() if p.requires_grad}
    assert trained == {f"{path}.{ab}.weight" for path in adapters(model) for ab in
                       ("lora_A", "lora_B")}
    for path, base in fresh.named_parameters():
        assert torch.equal(model.get_parameter(path), base), path
    assert all(adapters(model)[p].lora_B.weight.abs().sum() > 0 for p in adapters(model))
    saved = FileSystemReader(str(find_checkpoints(tmp_path / "checkpoints")[0]))
    keys = saved.read_metadata().state_dict_metadata
    model_keys = {k.removeprefix("train.model.") for k in keys if k.startswith("train.model.")}
    assert model_keys == trained
    optim_params = {k.removeprefix("train.optim.state.").rpartition(".")[0] for k in keys
                    if k.startswith("train.optim.state.")}
    assert optim_params == trained


@pytest.mark.parametrize("args, message", [
    (["--lora-rank", "-1"], "--lora-rank must be >= 0 (0: train every parameter), got -1"),
    (["--lora-rank", "4", "--lora-dropout", "1"], "--lora-dropout must be in [0, 1), got 1.0"),
    (["--lora-rank", "4", "--lora-alpha", "0"], "--lora-alpha must be positive, got 0.0"),
    (["--lora-targets", "wq"], "--lora-targets applies only to LoRA; pass --lora-rank R (e.g. "
                               "8) or drop --lora-targets"),
])
def test_bad_lora_options_are_one_line(args, message):
    with pytest.raises(ConfigError) as error:
        parse_config(args, "ddp")
    assert str(error.value) == message


@pytest.mark.parametrize("name", ["tiny", "llama-tiny"])
def test_a_bf16_run_holds_the_frozen_linears_in_bf16_and_computes_the_same(name):
    """Under --dtype bf16 the frozen linear layers are bf16 (a tied head stays the fp32
    embedding; norms, embeddings and adapters fp32), the bf16 rounding of the fp32 base, so
    under autocast logits and adapter gradients equal those of an fp32 base bitwise; fp32
    runs keep an fp32 base."""
    args = [*without(TINY, "--model"), "--model", name, "--lora-rank", "4"]
    models = {}
    for dtype in ("fp32", "bf16"):
        spec = spec_of(parse_config([*args, "--dtype", dtype], "ddp"))
        models[dtype] = spec.meta_model()
        materialize(models[dtype], torch.device("cpu"), 0, spec)
    assert {p.dtype for p in models["fp32"].parameters()} == {torch.float32}
    linears = {f"{path}.weight" for path, m in models["bf16"].named_modules()
               if isinstance(m, torch.nn.Linear) and path.rpartition(".")[2] not in
               ("lora_A", "lora_B") and not (name == "tiny" and path == "head")}
    dtypes = {n: p.dtype for n, p in models["bf16"].named_parameters(remove_duplicate=False)}
    assert linears and {n for n, d in dtypes.items() if d == torch.bfloat16} == linears
    tokens = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    grads = []
    for model in models.values():
        for layer in adapters(model).values():  # B != 0, so the adapters' inputs matter
            torch.nn.init.normal_(layer.lora_B.weight, 0, 0.1,
                                  generator=torch.Generator().manual_seed(1))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(tokens).float().sum().backward()
        grads.append([p.grad for p in model.parameters() if p.requires_grad])
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))


def test_mfu_counts_a_lora_step_as_4_flops_per_base_weight_and_6_per_adapter():
    """The base's weights get no gradient: 4 N (forward, input gradients) instead of 6 N,
    plus 6 per adapter parameter (llama-8b's untied embedding is a lookup, not counted)."""
    from trainers.core.run_state import model_flops_per_token

    shape = MODEL_SIZES["llama-8b"]
    weights = shape.num_params() - shape.vocab_size * shape.d_model
    args = ["--model", "llama-8b", "--seq-len", "2048"]
    full = model_flops_per_token(parse_config(args, "ddp"), shape)
    lora = model_flops_per_token(parse_config([*args, "--lora-rank", "16"], "ddp"), shape)
    assert full == shape.flops_per_token(2048)
    assert full - lora == 2 * weights - 6 * 32 * 16 * (2 * 4096 + 4096 + 1024)  # wq, wv
