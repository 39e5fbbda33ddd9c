"""Sampling from and exporting a run's checkpoint: in one process, from any trainer's
checkpoint, the exported Hugging Face model computing our logits, and one line for bad input."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support.component_runs import COMPONENTS, by_component
from tests.support.runs import TINY, one_line_error, run_trainer
from trainers.options.trainer_table import TRAINERS
from trainers.runs.checkpoint_files import MANIFEST, find_checkpoints
from trainers.tools import export, sample
from trainers.tools.generate import generate
from trainers.tools.run_model import load_run_model, pick_checkpoint

PROMPT = "héllo wörld ✓ 🙂"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """A one-process tiny run with checkpoints at steps 2 and 4."""
    run = tmp_path_factory.mktemp("run")
    run_trainer([*TINY, "--steps", "4", "--checkpoint-every", "2", "--output-dir", str(run)])
    return run


def _with_manifests(run: Path, target: Path, edit: Callable[[dict[str, Any]], Any]) -> Path:
    """A copy of ``run`` at ``target`` with ``edit`` applied to each checkpoint's manifest."""
    shutil.copytree(run, target)
    for checkpoint in find_checkpoints(target):
        manifest = json.loads((checkpoint / MANIFEST).read_text())
        edit(manifest)
        (checkpoint / MANIFEST).write_text(json.dumps(manifest))
    return target


def _configured(**changes: Any) -> Callable[[dict[str, Any]], None]:
    """A manifest edit: ``changes`` into its run config."""
    return lambda manifest: manifest["config"].update(changes)


def _greedy(model: torch.nn.Module, ids: list[int], tokens: int) -> list[int]:
    """Argmax decoding written out: the reference the sampler must equal."""
    ids = list(ids)
    with torch.no_grad():
        for _ in range(tokens):
            ids.append(int(model(torch.tensor([ids[-64:]]))[0, -1].argmax()))
    return ids


def _sample(capsys, *argv: str) -> str:
    sample.main([*argv])
    return capsys.readouterr().out.removesuffix("\n")


def test_greedy_sampling_is_deterministic_and_the_argmax_of_our_model(tiny_run, capsys):
    text = _sample(capsys, str(tiny_run), "--prompt", PROMPT, "--tokens", "12",
                   "--temperature", "0")
    assert _sample(capsys, str(tiny_run), "--prompt", PROMPT, "--tokens", "12",
                   "--temperature", "0", "--seed", "7") == text
    model, config = load_run_model(tiny_run)
    assert config["model"] == "tiny" and not model.training
    ids = _greedy(model, list(PROMPT.encode()), 12)
    assert text == bytes(ids).decode("utf-8", errors="replace")


def test_decoding_stops_at_the_stop_id(tiny_run):
    """generate(stop=ID) ends where ID is drawn (trainers.tools.sample --stop-at-end passes the
    tokenizer's end-of-text id) and returns what came before it."""
    model, _ = load_run_model(tiny_run)
    prompt = list(PROMPT.encode())
    greedy = _greedy(model, prompt, 12)[len(prompt):]
    stop = next(t for i, t in enumerate(greedy) if t not in greedy[:i] and i > 0)
    cut = greedy.index(stop)
    assert generate(model, prompt, 12, 64, 256, stop=stop) == greedy[:cut]
    assert generate(model, prompt, 12, 64, 256) == greedy


def test_sampling_with_a_seed_repeats_and_top_k_1_is_greedy(tiny_run, capsys):
    args = [str(tiny_run), "--prompt", "ab", "--tokens", "16", "--temperature", "1.5"]
    assert _sample(capsys, *args, "--seed", "3") == _sample(capsys, *args, "--seed", "3")
    greedy = _sample(capsys, str(tiny_run), "--prompt", "ab", "--tokens", "16",
                     "--temperature", "0")
    assert _sample(capsys, *args, "--top-k", "1") == greedy


def test_a_prompt_longer_than_the_context_keeps_its_last_tokens(tiny_run, capsys):
    prompt = "x" * 40 + "y" * 60  # 100 bytes, the tiny model's context is 64
    text = _sample(capsys, str(tiny_run), "--prompt", prompt, "--tokens", "5",
                   "--temperature", "0")
    model, _ = load_run_model(tiny_run)
    tail = list(prompt.encode())[-64:]
    assert text == prompt + bytes(_greedy(model, tail, 5)[64:]).decode("utf-8", "replace")


def test_checkpoint_picks_a_step_and_a_corrupt_newest_is_skipped(tiny_run, tmp_path, caplog):
    assert pick_checkpoint(tiny_run).name == "step_00000004"
    assert pick_checkpoint(tiny_run, 2).name == "step_00000002"
    older, _ = load_run_model(tiny_run, 2)
    run = _with_manifests(tiny_run, tmp_path / "run", _configured())
    next((run / "checkpoints/step_00000004").glob("*.distcp")).write_bytes(b"garbage")
    fallback, _ = load_run_model(run)
    assert "step_00000004 is corrupt" in caplog.text
    assert all(torch.equal(a, b) for a, b in zip(older.state_dict().values(),
                                                 fallback.state_dict().values(), strict=True))


def test_a_tokenizer_json_run_samples_through_it_and_exports_it(tiny_run, tmp_path, capsys):
    """A run whose config names a tokenizer.json (here one whose ids are the bytes, so the
    model's output is the byte-level run's) samples through it and exports a copy of it."""
    pytest.importorskip("transformers")
    from trainers.tools.hf_export import byte_tokenizer

    tokenizer = tmp_path / "tokenizer.json"
    byte_tokenizer().save(str(tokenizer))
    run = _with_manifests(tiny_run, tmp_path / "run", _configured(tokenizer=str(tokenizer)))
    args = ["--prompt", "hello", "--tokens", "8", "--temperature", "0"]
    assert _sample(capsys, str(run), *args) == _sample(capsys, str(tiny_run), *args)
    export.main([str(run), str(tmp_path / "hf")])
    assert (tmp_path / "hf/tokenizer.json").read_bytes() == tokenizer.read_bytes()


@pytest.fixture(scope="module")
def llama_run(tmp_path_factory) -> Path:
    """A one-process llama-tiny run (grouped-query attention, untied head)."""
    run = tmp_path_factory.mktemp("llama-run")
    run_trainer([*TINY, "--model", "llama-tiny", "--steps", "2", "--output-dir", str(run)])
    return run


@pytest.mark.parametrize("run_fixture, architecture", [("tiny_run", "GPT2LMHeadModel"),
                                                       ("llama_run", "LlamaForCausalLM")])
def test_export_computes_our_logits_in_transformers(request, tmp_path, monkeypatch,
                                                   run_fixture, architecture):
    transformers = pytest.importorskip("transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    run = request.getfixturevalue(run_fixture)
    out = tmp_path / "hf"
    export.main([str(run), str(out)])
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert type(hf).__name__ == architecture
    assert not info["missing_keys"] and not info["unexpected_keys"]
    ours, _ = load_run_model(run)
    ids = torch.randint(0, 256, (2, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected, actual = ours(ids), hf.eval()(ids).logits
    assert ((actual - expected).norm() / expected.norm()).item() <= 1e-5

    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert tokenizer(PROMPT)["input_ids"] == list(PROMPT.encode())
    assert tokenizer.decode(list(PROMPT.encode())) == PROMPT


def test_the_component_runs_cover_every_trainer():
    assert COMPONENTS.keys() == TRAINERS.keys()


@pytest.mark.parametrize("trainer", by_component())
def test_every_trainers_checkpoint_samples_and_exports(component_runs, tmp_path, capsys,
                                                       monkeypatch, trainer):
    """Sharded, stage-split or spread, the checkpoint of each component's run joins into the
    one-process model: its weights are the one-process run's (the same training, to rounding),
    sampling is its greedy decoding, and the export computes its logits in transformers."""
    transformers = pytest.importorskip("transformers")
    run = component_runs[trainer]
    (model, _), (whole, _) = load_run_model(run), load_run_model(component_runs.reference)
    j = COMPONENTS[trainer][0]
    manifest = json.loads((pick_checkpoint(run) / MANIFEST).read_text())
    assert manifest["world_size"] == int(j[0]) * int(j[-1])
    # Adam turns rounding differences into update differences of ~1e-5 relative; a shard
    # placed wrongly would differ by O(1).
    for (name, a), b in zip(model.state_dict().items(), whole.state_dict().values(),
                            strict=True):
        assert ((a - b).norm() / b.norm()).item() <= 1e-4, name
    text = _sample(capsys, str(run), "--prompt", PROMPT, "--tokens", "10", "--temperature", "0")
    ids = _greedy(model, list(PROMPT.encode()), 10)
    assert text == bytes(ids).decode("utf-8", errors="replace")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    export.main([str(run), str(tmp_path / "hf")])
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    tokens = torch.tensor([ids])
    with torch.no_grad():
        expected, actual = model(tokens), hf(tokens).logits
    assert ((actual - expected).norm() / expected.norm()).item() <= 1e-5


@pytest.mark.parametrize(("argv", "message"), [
    (["--tokens", "0"], "--tokens must be positive, got 0"),
    (["--temperature", "-1"], "--temperature must be >= 0"),
    (["--top-k", "-2"], "--top-k must be >= 0"),
    (["--checkpoint", "3"], "no checkpoint of step 3; its steps are 4, 2"),
])
def test_bad_sampling_options_are_one_line(tiny_run, capsys, argv, message):
    assert message in one_line_error(capsys, sample, str(tiny_run), "--prompt", "a", *argv)


def test_an_empty_prompt_is_one_line(tiny_run, capsys):
    assert "--prompt is empty" in one_line_error(capsys, sample, str(tiny_run), "--prompt", "")


@pytest.mark.parametrize("module", [sample, export])
def test_a_path_without_checkpoints_is_one_line(tmp_path, capsys, module):
    argv = [str(tmp_path / "nothing"), "--prompt", "a"] if module is sample else \
        [str(tmp_path / "nothing"), str(tmp_path / "out")]
    assert "no checkpoint there" in one_line_error(capsys, module, *argv)


def test_a_manifest_without_config_is_one_line(tiny_run, tmp_path, capsys):
    run = _with_manifests(tiny_run, tmp_path / "run", lambda m: m.pop("config"))
    assert "holds no run config" in one_line_error(capsys, sample, str(run), "--prompt", "a")


def test_a_missing_tokenizer_file_is_one_line(tiny_run, tmp_path, capsys):
    gone = _configured(tokenizer=str(tmp_path / "gone.json"))
    run = _with_manifests(tiny_run, tmp_path / "run", gone)
    assert "gone.json: no such file" in one_line_error(capsys, sample, str(run), "--prompt", "a")


def test_export_refuses_a_non_empty_out_and_attention_gpt2_lacks(tiny_run, tmp_path, capsys):
    pytest.importorskip("transformers")
    (tmp_path / "full").mkdir()
    (tmp_path / "full/x").write_text("x")
    assert "is not an empty directory" in one_line_error(capsys, export, str(tiny_run),
                                                 str(tmp_path / "full"))
    run = _with_manifests(tiny_run, tmp_path / "run", _configured(attention="linear"))
    assert "is not GPT-2's" in one_line_error(capsys, export, str(run), str(tmp_path / "out"))
