"""Bad input gets one clear line naming the fix, from the trainer and from the component."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from components.ddp import ddp
from components.errors import ComponentArgumentError
from tests.support.runs import run_trainer, torchx_cli
from trainers.config.parsing import parse_config, validate
from trainers.errors import ConfigError
from trainers.formats.token_file import write_token_file
from trainers.options.train_config import TrainConfig, model_vocab


def parse(*args: str, dp: int = 1, tmp: Path | None = None):
    out = ["--output-dir", str(tmp / "run")] if tmp else []
    return parse_config([*out, *args], "ddp", world_sizes=[dp])


def test_defaults_are_valid(tmp_path):
    cfg = parse(tmp=tmp_path)
    assert cfg.model == "tiny"
    assert cfg.seq_len == 64  # the tiny model's context
    assert cfg.micro_batch(1) == cfg.batch_size


def test_validation_returns_the_resolved_config_and_leaves_its_input_alone():
    given = TrainConfig(output_dir="")
    resolved = validate(given, [1], "fsdp", check_paths=False)
    assert (resolved.seq_len, resolved.output_dir) == (64, str(Path("outputs") / "fsdp"))
    assert (given.seq_len, given.output_dir) == (0, "")


def test_micro_batch_is_global_over_accumulation_and_replicas(tmp_path):
    cfg = parse("--batch-size", "48", "--grad-accum", "3", dp=4, tmp=tmp_path)
    assert cfg.micro_batch(4) == 4


@pytest.mark.parametrize("args, message", [
    (["--model", "huge"], "--model huge: not a built-in size"),
    (["--steps", "0"], "--steps must be positive"),
    (["--steps", "-3"], "--steps must be positive"),
    (["--batch-size", "0"], "--batch-size must be positive"),
    (["--lr", "0"], "--lr must be positive"),
    (["--lr=-1e-3"], "--lr must be positive"),
    (["--grad-accum", "0"], "--grad-accum must be positive"),
    (["--pg-timeout=-5"], r"--pg-timeout must be >= 0 seconds \(0: torch's default\), got -5"),
    (["--seq-len", "65"], "exceeds the tiny model's context of 64"),
    (["--dtype", "fp8"], "invalid choice: 'fp8'"),
    (["--steps", "ten"], "invalid int value: 'ten'"),
    (["--steps", "20", "--profile-steps", "20"],
     "--profile-steps 20 must be below --steps 20 .* pass --profile-steps 5 or more --steps"),
    (["--profile-steps", "-1"], "--profile-steps must be >= 0"),
])
def test_bad_values(tmp_path, args, message):
    with pytest.raises(ConfigError, match=message):
        parse(*args, tmp=tmp_path)


def test_batch_must_divide_by_accumulation_times_replicas(tmp_path):
    with pytest.raises(ConfigError, match=r"--batch-size 30 is not divisible by --grad-accum 2 "
                                          r"x data-parallel size 4; pass a multiple of 8"):
        parse("--batch-size", "30", "--grad-accum", "2", dp=4, tmp=tmp_path)


def test_missing_and_empty_data_files(tmp_path):
    with pytest.raises(ConfigError, match="no such file; make one with"):
        parse("--data", str(tmp_path / "nope.bin"), tmp=tmp_path)
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    with pytest.raises(ConfigError, match="the file is empty"):
        parse("--data", str(empty), tmp=tmp_path)
    header_only = tmp_path / "header.bin"
    write_token_file(header_only, np.array([], dtype=np.uint16), 256)
    with pytest.raises(ConfigError, match="holds no tokens"):
        parse("--data", str(header_only), tmp=tmp_path)
    text = tmp_path / "corpus.bin"
    text.write_text("not tokens")
    with pytest.raises(ConfigError, match="not a token file"):
        parse("--data", str(text), tmp=tmp_path)


def test_output_dir_that_cannot_be_written(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match=r"cannot be written \(not a directory\)"):
        parse_config(["--output-dir", str(blocker / "run")], "ddp", world_sizes=[1])
    with pytest.raises(ConfigError, match=r"/proc cannot be written \(a proc file system\)"):
        parse_config(["--output-dir", "/proc/run"], "ddp", world_sizes=[1])


def test_resume_from_a_directory_without_checkpoints(tmp_path):
    with pytest.raises(ConfigError, match="no checkpoint there"):
        parse("--resume", str(tmp_path), tmp=tmp_path)


def test_trainer_prints_one_line_and_exits_2(tmp_path):
    proc = run_trainer(["--batch-size", "30", "--grad-accum", "4", "--output-dir",
                        str(tmp_path)], check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "trainers.ddp: error: --batch-size 30 is not divisible by --grad-accum 4 x "
        "data-parallel size 1; pass a multiple of 4"]
    assert not list(tmp_path.iterdir())  # nothing was written


def test_component_rejects_bad_arguments_before_scheduling(tmp_path):
    with pytest.raises(ComponentArgumentError, match="nproc_per_node must be >= 1"):
        ddp("--model", "tiny", j="1x0")
    with pytest.raises(ComponentArgumentError, match="expected"):
        ddp(j="two")
    with pytest.raises(ComponentArgumentError, match="--model huge: not a built-in size"):
        ddp("--model", "huge")
    # 2 nodes x 3 processes = 6 replicas: 32 does not divide.
    with pytest.raises(ComponentArgumentError, match="data-parallel size 6"):
        ddp("--batch-size", "32", j="2x3")
    # elastic 1:2 nodes: the batch must divide at every size the job may run at
    with pytest.raises(ComponentArgumentError, match="data-parallel size 3"):
        ddp("--batch-size", "4", j="1:3x1")
    with pytest.raises(ComponentArgumentError, match="no such file"):
        ddp("--data", str(tmp_path / "missing.bin"))


def test_component_skips_path_checks_when_told(tmp_path):
    app = ddp("--data", "/cluster/only/corpus.bin", check_paths=False)
    assert "/cluster/only/corpus.bin" in app.roles[0].args[-1]


def test_component_builds_on_dist_ddp():
    app = ddp("--model", "tiny", "--steps", "5", j="2x4", max_retries=3)
    role = app.roles[0]
    command = role.args[-1]
    assert role.entrypoint == "bash" and command.startswith("torchrun ")
    assert "--nnodes 2 --nproc_per_node 4" in command
    assert "-m trainers.ddp --model tiny --steps 5 --output-dir 'outputs/${app_id}'" in command
    assert role.num_replicas == 2 and role.max_retries == 3


def test_component_keeps_a_given_output_dir():
    command = ddp("--output-dir=/tmp/somewhere").roles[0].args[-1]
    assert command.endswith("-m trainers.ddp --output-dir=/tmp/somewhere")


def parse_for(trainer: str, *args: str, world: int, tmp: Path):
    return parse_config(["--output-dir", str(tmp / "run"), *args], trainer,
                        world_sizes=[world])


def test_lora_targets_are_checked_before_submitting_where_the_layers_are_known(tmp_path):
    """Built-in families by our names, a Llama-shaped hf: model by Hugging Face's."""
    bad_data_files(tmp_path)
    hf = ["--model", f"hf:{tmp_path / 'hf'}", "--lora-rank", "4"]
    parse(*hf, "--lora-targets", "q_proj,v_proj,lm_head", tmp=tmp_path)
    with pytest.raises(ConfigError, match="--lora-targets wq matches no linear layer of the "
                                          "model; pass some of down_proj,gate_proj,k_proj,"
                                          "lm_head,o_proj,q_proj,up_proj,v_proj"):
        parse(*hf, "--lora-targets", "wq", tmp=tmp_path)
    parse("--model", "llama-tiny", "--lora-rank", "4", "--lora-targets", "gate,up", tmp=tmp_path)


def test_instruction_samples_pack_where_the_model_takes_positions(tmp_path):
    """By default samples are packed where every rank runs whole blocks of a model that takes
    positions, else padded; --batching pack where that cannot be is refused in one line."""
    from trainers.formats.instruction_data import packs

    bad_data_files(tmp_path)
    pairs = ["--data", str(tmp_path / "pairs.jsonl"), "--batch-size", "8"]
    assert packs(parse_for("fsdp", *pairs, world=2, tmp=tmp_path))
    assert packs(parse_for("model_parallel", *pairs, world=1, tmp=tmp_path))
    assert not packs(parse_for("pipeline", *pairs, "--pp", "2", world=2, tmp=tmp_path))
    assert not packs(parse_for("tensor_parallel", *pairs, "--tp", "2", world=2, tmp=tmp_path))
    assert not packs(parse_for("ddp", *pairs, "--attention", "tiled", world=1, tmp=tmp_path))
    assert not packs(parse_for("ddp", *pairs, "--batching", "pad", world=1, tmp=tmp_path))
    with pytest.raises(ConfigError, match=r"--batching pack needs the whole model in each "
                                          r"rank's forward, and --pp 2 --tp 1 splits it; pass "
                                          r"--batching pad"):
        parse_for("pipeline", *pairs, "--pp", "2", "--batching", "pack", world=2, tmp=tmp_path)


def test_three_dimensional_degrees(tmp_path):
    """pp x dp x tp = world; a stage's tp must split the model like the 2-D trainer's."""
    cfg = parse_for("pipeline", "--pp", "2", "--tp", "2", "--batch-size", "8",
                    "--microbatches", "2", world=8, tmp=tmp_path)
    assert cfg.dp_size(8) == 2 and cfg.micro_batch(2) == 4
    with pytest.raises(ConfigError, match=r"--dp 3 x --pp 2 x --tp 2 != world size 8; pass "
                                          r"--dp 2"):
        parse_for("pipeline", "--pp", "2", "--tp", "2", "--dp", "3", world=8, tmp=tmp_path)
    with pytest.raises(ConfigError, match=r"--tp 8 does not divide the tiny model's heads"):
        parse_for("pipeline", "--pp", "2", "--tp", "8", world=16, tmp=tmp_path)
    with pytest.raises(ConfigError, match=r"--pp 2 x --tp 8 = 16 does not divide the world "
                                          r"size 8; pick degrees whose product divides"):
        parse_for("pipeline", "--pp", "2", "--tp", "8", world=8, tmp=tmp_path)


@pytest.mark.parametrize("extra, refused", [([], True), (["--allow-cross-node-tp"], False)])
def test_a_rank_refuses_a_tensor_parallel_group_across_nodes(tmp_path, monkeypatch, extra,
                                                             refused):
    """Under torchrun on 4 nodes of 2 processes, --tp 4 would put a group on two nodes."""
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    args = ["--output-dir", str(tmp_path / "run"), "--pp", "2", "--tp", "4", "--batch-size",
            "8", "--microbatches", "2", *extra]
    if not refused:
        assert parse_config(args, "pipeline").tp == 4
        return
    with pytest.raises(ConfigError, match="--tp 4 does not divide the 2 processes per node, so "
                                          "a tensor-parallel group would span nodes; pass a --tp "
                                          "that divides 2 .* or --allow-cross-node-tp"):
        parse_config(args, "pipeline")


def test_tensor_parallel_degrees(tmp_path):
    cfg = parse_for("tensor_parallel", "--tp", "2", "--batch-size", "8", world=4, tmp=tmp_path)
    assert cfg.dp_size(4) == 2 and cfg.micro_batch(2) == 4
    with pytest.raises(ConfigError, match=r"--tp 3 does not divide the tiny model's heads \(4\)"):
        parse_for("tensor_parallel", "--tp", "3", world=3, tmp=tmp_path)
    with pytest.raises(ConfigError, match="--tp 4 does not divide the world size 2"):
        parse_for("tensor_parallel", "--tp", "4", world=2, tmp=tmp_path)
    with pytest.raises(ConfigError, match=r"--dp 3 x --tp 2 != world size 4; pass --dp 2"):
        parse_for("tensor_parallel", "--tp", "2", "--dp", "3", world=4, tmp=tmp_path)
    with pytest.raises(ConfigError, match="--sequence-parallel needs --tp > 1"):
        parse_for("tensor_parallel", "--sequence-parallel", world=2, tmp=tmp_path)


@pytest.mark.parametrize("trainer, args", [
    ("tensor_parallel", ["--tp", "0"]), ("pipeline", ["--pp", "0"]),
    ("pipeline", ["--pp", "2", "--dp", "-1"]),
])
def test_degrees_below_one_are_refused(tmp_path, trainer, args):
    with pytest.raises(ConfigError, match=r"--tp and --pp must be >= 1 and --dp >= 0, got "):
        parse_for(trainer, *args, world=2, tmp=tmp_path)


@pytest.mark.parametrize("trainer, args, served_by", [
    ("ddp", ["--tp", "2"], "trainers.tensor_parallel"),
    ("fsdp", ["--sequence-parallel"], "trainers.tensor_parallel"),
    ("ddp", ["--reshard-after-forward", "false"], "trainers.fsdp or trainers.tensor_parallel"),
    ("ddp", ["--cpu-offload"], "trainers.fsdp"),
    ("tensor_parallel", ["--cpu-offload"], "trainers.fsdp"),
    ("tensor_parallel", ["--lora-rank", "4"], "trainers.ddp or trainers.fsdp or "
     "trainers.model_parallel"),
    ("pipeline", ["--lora-rank", "4"], "trainers.ddp or trainers.fsdp or trainers.model_parallel"),
])
def test_options_a_trainer_cannot_serve(tmp_path, trainer, args, served_by):
    with pytest.raises(ConfigError, match=f"is not served by trainers.{trainer}; use {served_by}"):
        parse_for(trainer, *args, world=2, tmp=tmp_path)


def test_sharded_components_validate_before_scheduling():
    from components.fsdp import fsdp
    from components.tensor_parallel import tensor_parallel

    assert "-m trainers.fsdp" in fsdp("--cpu-offload", j="1x2").roles[0].args[-1]
    with pytest.raises(ComponentArgumentError, match="--tp 4 does not divide the world size 2"):
        tensor_parallel("--tp", "4", j="1x2")
    with pytest.raises(ComponentArgumentError, match="does not divide the tiny model's heads"):
        tensor_parallel("--tp", "3", j="1x3")
    with pytest.raises(ComponentArgumentError, match="is not served by trainers.fsdp"):
        fsdp("--tp", "2")
    command = tensor_parallel("--tp", "2", j="2x2").roles[0].args[-1]
    assert "--nnodes 2 --nproc_per_node 2" in command and "-m trainers.tensor_parallel" in command


@pytest.mark.parametrize("args, world, message", [
    (["--pp", "2", "--virtual-stages", "3", "--schedule", "interleaved1f1b"], 2,
     r"--pp 2 x --virtual-stages 3 = 6 stages do not divide the tiny model's 4 blocks"),
    (["--pp", "2", "--microbatches", "3"], 2,
     "each pipeline's batch of 32 sequences does not split into --microbatches 3"),
    (["--pp", "4", "--microbatches", "2", "--batch-size", "8"], 4,
     r"--schedule 1f1b needs --microbatches >= --pp \(4\), got 2"),
    (["--pp", "2", "--schedule", "zb"], 2, "argument --schedule: invalid choice: 'zb'"),
    (["--pp", "2", "--schedule", "interleaved1f1b"], 2,
     "--schedule interleaved1f1b runs several stages per rank; pass --virtual-stages 2"),
    (["--pp", "2", "--virtual-stages", "2"], 2,
     "--schedule 1f1b runs one stage per rank; pass --virtual-stages 1"),
    (["--pp", "3"], 4, "--pp 3 does not divide the world size 4"),
    (["--pp", "2", "--dp", "3"], 4, r"--dp 3 x --pp 2 != world size 4; pass --dp 2"),
    (["--pp", "2", "--grad-accum", "2"], 2, "the micro-batches are --microbatches"),
    (["--pp", "1"], 2, "a pipeline needs 2 or more"),
])
def test_pipeline_arguments(tmp_path, args, world, message):
    with pytest.raises(ConfigError, match=message):
        parse_for("pipeline", *args, world=world, tmp=tmp_path)


def test_model_parallel_devices(tmp_path):
    assert parse_for("model_parallel", "--devices", "cpu,cpu", world=1, tmp=tmp_path)
    with pytest.raises(ConfigError, match="'gpu0' is not a device"):
        parse_for("model_parallel", "--devices", "gpu0,cpu", world=1, tmp=tmp_path)


def test_model_parallel_component_checks_devices_and_processes():
    from components.model_parallel import model_parallel

    with pytest.raises(ComponentArgumentError,
                       match="cuda:0,cuda:1 needs --gpu 2 or more, not --gpu 1; pass --gpu 2"):
        model_parallel("--devices", "cuda:0,cuda:1", gpu=1)
    with pytest.raises(ComponentArgumentError, match="pass -j <nodes>x1"):
        model_parallel("--devices", "cpu,cpu", j="1x2")
    with pytest.raises(ComponentArgumentError, match="uses no GPU; pass --devices cuda:0,cuda:1"):
        model_parallel("--devices", "cpu,cpu", gpu=2, gpu_type="l4")
    app = model_parallel("--devices", "cuda:0,cuda:1", gpu=2, j="2x1", gpu_type="l4")
    assert "-m trainers.model_parallel --devices cuda:0,cuda:1" in app.roles[0].args[-1]
    assert (app.roles[0].resource.cpu, app.roles[0].resource.memMB) == (16, 65536)


def bad_data_files(tmp: Path) -> None:
    """The inputs of :func:`test_bad_data_sources` and of the bad-input matrix's data rows,
    under ``tmp``."""
    (tmp / "empty").mkdir()
    (tmp / "broken.json").write_text("{not json")
    (tmp / "notes.csv").write_text("a,b\n")
    (tmp / "docs.jsonl").write_text('{"text": "fine"}\n{"body": "no text field"}\n')
    (tmp / "plain.txt").write_text("some text " * 100)
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    (tmp / "chat.jsonl").write_text(json.dumps({"conversation": turns}) + "\n")
    (tmp / "roles.jsonl").write_text(json.dumps({"messages": [
        {"role": "narrator", "content": "once"}, *turns]}) + "\n")
    (tmp / "long.jsonl").write_text("".join(json.dumps({"prompt": "p" * n, "completion": "c"})
                                            + "\n" for n in (100, 120)))
    (tmp / "pairs.jsonl").write_text(2 * (json.dumps({"prompt": "p", "completion": "c"}) + "\n"))
    np.array([1, 2, 300], dtype=np.uint16).tofile(tmp / "raw.bin")
    np.arange(200, dtype=np.uint16).tofile(tmp / "small.bin")
    write_token_file(tmp / "tokens.bin", np.arange(256, dtype=np.uint16), 256)
    vocab = {f"w{i}": i for i in range(1000)} | {"[UNK]": 1000}
    from tokenizers import Tokenizer, models

    Tokenizer(models.WordLevel(vocab, unk_token="[UNK]")).save(str(tmp / "big.json"))
    from trainers.models.huggingface import tiny_llama_config

    tiny_llama_config(tmp / "hf")


@pytest.mark.parametrize("args, message", [
    (["--data", "{tmp}/plain.txt", "--tokenizer", "{tmp}/broken.json"],
     r"--tokenizer {tmp}/broken.json does not load \(.*\); pass a Hugging Face tokenizer.json"),
    (["--data", "{tmp}/plain.txt", "--tokenizer", "{tmp}/nope.json"],
     "--tokenizer {tmp}/nope.json: no such file; pass bytes or the path of a tokenizer.json"),
    (["--data", "{tmp}/plain.txt", "--tokenizer", "{tmp}/big.json"],
     "has 1,001 ids, more than the model's vocabulary of 256; pick a model with a larger"),
    (["--data", "{tmp}/raw.bin", "--token-dtype", "uint16"],
     "a raw .bin --data needs --token-dtype and --vocab-size; pass --vocab-size N"),
    (["--data", "{tmp}/raw.bin", "--vocab-size", "256"],
     r"needs --token-dtype and --vocab-size; pass --token-dtype uint16\|uint32"),
    (["--data", "{tmp}/raw.bin"], r"no token-file header .*pass --token-dtype uint16\|uint32"),
    (["--data", "{tmp}/raw.bin", "--token-dtype", "uint16", "--vocab-size", "256"],
     "--data {tmp}/raw.bin holds id 300, beyond --vocab-size 256; pass --vocab-size 301"),
    (["--data", "{tmp}/raw.bin", "--token-dtype", "uint32", "--vocab-size", "256"],
     "6 bytes are not whole uint32 ids; pass the --token-dtype the file was written with"),
    (["--data", "{tmp}/small.bin", "--token-dtype", "uint16", "--vocab-size", "1000"],
     "--vocab-size 1000 exceeds the model's vocabulary of 256; pick a model"),
    (["--data", "{tmp}/tokens.bin", "--token-dtype", "uint16", "--vocab-size", "256"],
     "is a token file with a header; drop --token-dtype and --vocab-size"),
    (["--data", "{tmp}/empty"], "--data {tmp}/empty: the directory holds no files; pass a"),
    (["--data", "{tmp}/*.parquet"], "the glob matches no files; pass a pattern that matches"),
    (["--data", "{tmp}/missing.txt"], "no such file or directory; pass a text file, a directory"),
    (["--data", "{tmp}/notes.csv"],
     "{tmp}/notes.csv has an unknown suffix; pass only .txt, .md, .py, .jsonl or .parquet"),
    (["--data", "{tmp}/docs.jsonl"],
     "{tmp}/docs.jsonl:2: no string field 'text'; pass the --text-field that holds the text"),
    (["--data", "{tmp}/docs.jsonl", "--text-field", "body"],
     "{tmp}/docs.jsonl:1: no string field 'body'"),
    (["--vocab-size", "256"], "--vocab-size applies only to a raw .bin --data .*, not "
     "synthetic data; drop --vocab-size"),
    (["--token-dtype", "uint32"], "--token-dtype applies only to a raw .bin --data"),
    (["--data", "{tmp}/plain.txt", "--vocab-size", "256"], "not text {tmp}/plain.txt; drop"),
    (["--data", "{tmp}/tokens.bin", "--tokenizer", "{tmp}/big.json"],
     "--tokenizer {tmp}/big.json has 1,001 ids, but the token file's vocabulary is 256; pass "
     "the tokenizer that made it"),
    (["--tokenizer", "{tmp}/big.json"], "--tokenizer applies to text data or the token file it "
     "made, not synthetic data; drop --tokenizer"),
    (["--text-field", "body"], "--text-field applies only to text --data"),
    (["--data", "{tmp}/plain.txt", "--text-field", "body"],
     "--text-field applies only to .jsonl and .parquet files, and --data {tmp}/plain.txt holds "
     "none; drop --text-field"),
    (["--data", "{tmp}/plain.txt", "--vocab-size", "-3"], "--vocab-size must be positive"),
    (["--data", "{tmp}/chat.jsonl", "--data-format", "chat"],
     r"{tmp}/chat.jsonl:1: no field 'messages' holding a list of \{role, content\} turns; pass "
     "the --messages-field that holds them"),
    (["--data", "{tmp}/roles.jsonl"], "{tmp}/roles.jsonl:1: the chat template refuses it: the "
     "chat template knows the roles system, user and assistant, not narrator"),
    (["--data", "{tmp}/long.jsonl"], "--seq-len 64 cuts the whole completion of all 2 samples "
     "of --data {tmp}/long.jsonl; pass --seq-len 120 or more, or shorten the prompts"),
    (["--data", "{tmp}/long.jsonl", "--long-samples", "error"], r"{tmp}/long.jsonl:1: --seq-len "
     r"64 cuts the whole completion \(it starts after 100 tokens\); raise --seq-len or shorten "
     "the prompt"),
    (["--long-samples", "error"], "--long-samples applies only to instruction and chat --data "
     ".*, not synthetic data; drop --long-samples"),
    (["--data", "{tmp}/plain.txt", "--long-samples", "error"], "--long-samples applies to "
     "instruction and chat samples, and --data {tmp}/plain.txt is read as text .*; drop "
     "--long-samples"),
    (["--data", "{tmp}/long.jsonl", "--messages-field", "turns"], "--messages-field applies to "
     "chat data, and --data {tmp}/long.jsonl is read as prompt_completion; drop"),
    (["--data-format", "chat"], "--data-format applies only to text --data .*, not synthetic "
     "data; drop --data-format"),
    (["--batching", "pad"], "--batching applies only to instruction and chat --data .*, not "
     "synthetic data; drop --batching"),
    (["--data", "{tmp}/plain.txt", "--batching", "pack"], "--batching applies to instruction "
     "and chat samples, and --data {tmp}/plain.txt is read as text .*; drop --batching"),
    (["--data", "{tmp}/pairs.jsonl", "--batching", "pack", "--attention", "naive"],
     "--batching pack masks attention to each sample with sdpa, not --attention naive; pass "
     "--attention sdpa or --batching pad"),
    (["--data", "{tmp}/pairs.jsonl", "--batching", "pack", "--model",
      "examples.custom_model.conv_lm:SPEC"], "--batching pack needs a model whose forward takes "
     "packed samples' positions, and --model examples.custom_model.conv_lm:SPEC is your own; "
     "pass --batching pad"),
])
def test_bad_data_sources(tmp_path, args, message):
    bad_data_files(tmp_path)
    fill = [a.replace("{tmp}", str(tmp_path)) for a in args]
    with pytest.raises(ConfigError, match=message.replace("{tmp}", str(tmp_path))) as err:
        parse(*fill, tmp=tmp_path)
    assert "\n" not in str(err.value)


def test_good_data_sources_pass(tmp_path):
    bad_data_files(tmp_path)
    parse("--data", str(tmp_path / "pairs.jsonl"), "--batching", "pack", tmp=tmp_path)
    parse("--data", str(tmp_path / "small.bin"), "--token-dtype", "uint16", "--vocab-size",
          "256", "--seq-len", "64", tmp=tmp_path)
    parse("--data", str(tmp_path / "*.txt"), tmp=tmp_path)
    parse("--data", str(tmp_path / "tokens.bin"), "--seq-len", "64", tmp=tmp_path)


def test_model_vocab_is_the_models(tmp_path):
    assert model_vocab(parse("--model", "125m", tmp=tmp_path)) == 50304


@pytest.mark.parametrize("name", ["ddp", "fsdp", "tensor_parallel", "pipeline",
                                  "model_parallel"])
def test_help_shows_the_trainers_own_options_once_each(name):
    """--help lists the options every trainer serves and this one's own, says when to use the
    trainer, and shows each default once (none for an empty one)."""
    from trainers.config.parsing import build_parser
    from trainers.options.trainer_table import TRAINERS, serving

    text = build_parser(name).format_help()
    assert TRAINERS[name].when.split(":")[0] in " ".join(text.split())
    shown = set(re.findall(r"^  (--[a-z-]+)", text, re.MULTILINE))
    for option in ("tp", "pp", "schedule", "cpu_offload", "devices", "reshard_after_forward"):
        flag = "--" + option.replace("_", "-")
        assert (flag in shown) == (name in serving(option)), (name, flag)
    assert "--model" in shown and "--output-dir" in shown
    entries = re.split(r"\n  (?=-)", text.split("options:", 1)[1])
    assert all(entry.count("(default:") <= 1 for entry in entries)
    assert "(default: )" not in text
    assert f"(default: outputs/{name})" in " ".join(text.split())
    # the shared options first, then exactly the options this trainer owns
    shared, own = text.split("\noptions of every trainer:\n")[1].split(
        f"\noptions of trainers.{name}:\n")
    assert "--model" in shared and "--output-dir" in shared
    owned = {"--" + o.replace("_", "-") for o in TRAINERS[name].options}
    assert set(re.findall(r"^  (--[a-z-]+)", own, re.MULTILINE)) - {
        "--no-" + flag[2:] for flag in owned} == owned


def test_torchx_run_takes_no_abbreviated_option(tmp_path):
    """``torchx run --dry`` is not ``--dryrun`` (our ``run`` command's parser): refused, nothing
    is run."""
    proc = torchx_cli("run", "--dry", "-s", "local_cwd", "components/ddp.py:ddp", "--", "--model",
                      "tiny", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.splitlines()[-1].endswith(
        ": error: unrecognized arguments: --dry"), proc.stderr[-2000:]
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize("given, meant", [
    ("--check", "--checkpoint-every"), ("--ste", "--steps"),
    ("--chekpoint-every", "--checkpoint-every"), ("--lora", "--lora-alpha or --lora-dropout or "
                                                  "--lora-rank or --lora-targets")])
def test_an_option_is_never_abbreviated_and_a_misspelt_one_names_the_closest(tmp_path, given,
                                                                               meant):
    """``--check 5`` is not ``--checkpoint-every 5`` (argparse's abbreviations are off)."""
    with pytest.raises(ConfigError) as refused:
        parse(given, "5", tmp=tmp_path)
    assert str(refused.value) == (f"unrecognized arguments: {given} 5; did you mean {meant}? "
                                  "(`python -m trainers.ddp --help` lists the options)")


def test_an_option_hidden_from_help_is_refused_naming_its_trainer(tmp_path):
    with pytest.raises(ConfigError, match="--tp is not served by trainers.ddp; use trainers."
                                          "tensor_parallel or trainers.pipeline or drop --tp"):
        parse("--tp", "2", tmp=tmp_path)
