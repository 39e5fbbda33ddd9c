"""Instruction and chat samples: the formats, the chat template, which tokens are in the loss,
the truncation rule, batches cut to their samples in length buckets, and the masked loss of a
step against a hand-computed one."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from trainers.core.batch_stream import length_buckets
from trainers.core.data import InstructionDataset, instruction_datasets
from trainers.core.loss import IGNORE
from trainers.core.strategy import Strategy
from trainers.errors import ConfigError
from trainers.formats import instruction_data as data
from trainers.formats.tokenizer import BYTES_END_OF_TEXT, load_tokenizer
from trainers.options.train_config import TrainConfig
from trainers.runs.storage import location

CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 3+3?"},
        {"role": "assistant", "content": "6"}]


def config(tmp_path: Path, **options) -> TrainConfig:
    return TrainConfig(data=str(tmp_path / "data.jsonl"), output_dir=str(tmp_path / "run"),
                       seq_len=64, **options)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def loss_text(ids: np.ndarray, loss: np.ndarray) -> str:
    """The text of the tokens in the loss (bytes tokenizer, end-of-text as '$')."""
    return "".join("$" if i == BYTES_END_OF_TEXT else chr(i) for i in ids[loss])


def test_chat_turns_count_only_the_assistants_rendered_replies(tmp_path):
    segments = data.chat_segments(CHAT, data.DEFAULT_TEMPLATE)
    ids, loss = data.encode(segments, load_tokenizer("bytes"))
    text = "".join(chr(i) if i != BYTES_END_OF_TEXT else "$" for i in ids)
    assert text == ("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
                    "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nand 3+3?<|im_end|>\n"
                    "<|im_start|>assistant\n6<|im_end|>\n$")
    assert loss_text(ids, loss) == "4<|im_end|>\n6<|im_end|>\n$"


def test_prompt_completion_counts_the_completion_and_the_end(tmp_path):
    segments = data.record_segments({"q": "1+1=", "a": "2"}, data.PROMPT_COMPLETION,
                                    config(tmp_path, prompt_field="q", completion_field="a"), "")
    ids, loss = data.encode(segments, load_tokenizer("bytes"))
    assert bytes(ids[:-1].tolist()) == b"1+1=2" and ids[-1] == BYTES_END_OF_TEXT
    assert loss.tolist() == [False] * 4 + [True, True]


def test_the_tokenizers_own_chat_template_is_used(tmp_path):
    """A tokenizer.json with a chat_template in the tokenizer_config.json beside it (as an
    hf:DIR has them) renders the turns; its tokens in the loss are the reply's."""
    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(["be brief 2+2? 4 and 3+3? 6 [INST] [/INST] </s>"] * 4,
                                  trainers.BpeTrainer(special_tokens=["[UNK]", "</s>"]))
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    template = ("{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} "
                "[/INST]{% elif m['role'] == 'assistant' %} {{ m['content'] }}</s>"
                "{% else %}{{ raise_exception('only user and assistant') }}{% endif %}"
                "{% endfor %}")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    cfg = config(tmp_path, tokenizer=str(tmp_path / "tokenizer.json"))
    assert data.chat_template(cfg) == template
    hf = load_tokenizer(cfg.tokenizer)
    ids, loss = data.encode(data.chat_segments(CHAT[1:], template), hf)
    assert hf.decode(ids[loss].tolist()).split() == ["4", "</s>", "6", "</s>", "</s>"]
    with pytest.raises(ConfigError, match="the chat template refuses it: only user and "
                                          "assistant"):
        data.chat_segments(CHAT, template)


def test_the_format_is_detected_and_its_options_checked(tmp_path):
    write_jsonl(tmp_path / "data.jsonl", [{"messages": CHAT}])
    files = [location(tmp_path / "data.jsonl")]
    assert data.data_format(config(tmp_path), files) == data.CHAT
    write_jsonl(tmp_path / "data.jsonl", [{"prompt": "a", "completion": "b"}])
    assert data.data_format(config(tmp_path), files) == data.PROMPT_COMPLETION
    write_jsonl(tmp_path / "data.jsonl", [{"text": "a"}])
    assert data.data_format(config(tmp_path), files) == data.TEXT
    with pytest.raises(ConfigError, match="--prompt-field applies to prompt_completion data, "
                                          "and --data .* is read as chat; drop --prompt-field"):
        data.check_format_options(config(tmp_path, prompt_field="q"), data.CHAT)
    (tmp_path / "notes.txt").write_text("plain")
    with pytest.raises(ConfigError, match="notes.txt is plain text; pass only .jsonl/.parquet"):
        data.data_format(config(tmp_path, data_format="chat"),
                         [*files, location(tmp_path / "notes.txt")])


@pytest.mark.parametrize("rows, options, message", [
    ([{"conversation": CHAT}], {"data_format": "chat"},
     r"data.jsonl:1: no field 'messages' holding a list of \{role, content\} turns; pass the "
     "--messages-field"),
    ([{"prompt": "a"}], {"data_format": "prompt_completion"},
     "data.jsonl:1: no string field 'completion'; pass the --completion-field"),
    ([{"messages": [{"role": "tool", "content": "x"}, *CHAT[1:3]]}], {},
     "data.jsonl:1: the chat template refuses it: the chat template knows the roles system, "
     "user and assistant, not tool"),
    ([{"messages": CHAT[:2]}], {}, "data.jsonl:1: the conversation has no assistant turn"),
    ([{"prompt": "x" * 80, "completion": "y"}], {"long_samples": "error"},
     "data.jsonl:1: --seq-len 64 cuts the whole completion .it starts after 80 tokens.; raise "
     "--seq-len or shorten the prompt"),
    ([{"prompt": "", "completion": ""}], {},
     "data.jsonl:1: the sample has nothing to learn .no completion token after its first "
     "token.; give it a completion or drop it"),
])
def test_bad_samples_are_named(tmp_path, rows, options, message):
    write_jsonl(tmp_path / "data.jsonl", rows + [{"prompt": "a", "completion": "b"}])
    cfg = config(tmp_path, **options)
    files = [location(tmp_path / "data.jsonl")]
    with pytest.raises(ConfigError, match=message):
        data.tokenize_samples(files, data.data_format(cfg, files), cfg, load_tokenizer("bytes"))


def test_a_template_that_drops_a_role_is_refused():
    """A template that renders nothing for a role (no error of its own) is caught too."""
    template = ("{% for m in messages %}{% if m['role'] != 'system' %}{{ m['role'] }}: "
                "{{ m['content'] }}\n{% endif %}{% endfor %}"
                "{% if add_generation_prompt %}assistant: {% endif %}")
    with pytest.raises(ConfigError, match="does not render role 'system' .turn 1.; pass a "
                                          "--chat-template that knows it"):
        data.chat_segments(CHAT, template)
    assert data.chat_segments(CHAT[1:], template)[1] == ("4\n", True)


def pairs(tmp_path: Path, prompts: list[int], **options) -> tuple[data.Samples, TrainConfig]:
    """Prompt/completion samples with prompts of ``prompts`` bytes (completion ``c`` + the
    sample's number), tokenized (bytes), and their config (--seq-len 64)."""
    write_jsonl(tmp_path / "data.jsonl", [{"prompt": "p" * length, "completion": f"c{i}"}
                                          for i, length in enumerate(prompts)])
    cfg = config(tmp_path, **options)
    files = [location(tmp_path / "data.jsonl")]
    return data.tokenize_samples(files, data.PROMPT_COMPLETION, cfg, load_tokenizer("bytes")), cfg


def test_samples_whose_completion_the_window_cuts_are_skipped(tmp_path):
    """By default the samples --seq-len leaves no completion token of are left out, the others
    kept in order, and what was skipped is said in one line; --long-samples error refuses the
    first, as ever; a run left with fewer than two samples is refused in one line."""
    tokenized, cfg = pairs(tmp_path, [3, 80, 5, 90, 7])
    kept = data.kept_samples(tokenized, cfg, "cache")
    texts = [bytes(kept.ids[a:b - 1].tolist())
             for a, b in zip(kept.starts[:-1], kept.starts[1:], strict=True)]
    assert texts == [b"pppc0", b"pppppc2", b"pppppppc4"]
    assert kept.skipped == data.Skipped(count=2, total=5, seq_len=64, longest=90)
    assert kept.skipped.line() == (
        "skipped 2 of 5 samples: --seq-len 64 cuts their whole completion (the longest prompt "
        "is 90 tokens); --seq-len 90 keeps them all, --long-samples error refuses them")
    assert data.kept_samples(tokenized, dataclasses.replace(cfg, seq_len=90), "cache") \
        .skipped is None
    with pytest.raises(ConfigError, match=r"^cache sample 2: --seq-len 64 cuts the whole "
                                          r"completion \(it starts after 80 tokens\); raise "
                                          "--seq-len or shorten the prompt$"):
        data.kept_samples(tokenized, dataclasses.replace(cfg, long_samples="error"), "cache")
    for prompts, which in (([80, 90], "all 2 samples"),
                           ([3, 80, 90], "2 of the 3 samples")):
        left = ", leaving one .two are needed: one is held out." if len(prompts) == 3 else ""
        tokenized, cfg = pairs(tmp_path, prompts)
        with pytest.raises(ConfigError, match=f"^--seq-len 64 cuts the whole completion of "
                                              f"{which} of --data .*data.jsonl{left}; pass "
                                              "--seq-len 90 or more, or shorten the prompts$"):
            data.kept_samples(tokenized, cfg, "cache")


def test_prompt_lengths_say_which_samples_a_window_cuts():
    """A sample keeps a target in the loss at --seq-len N (check_window) exactly when its
    prompt length is N or less, whatever its flags."""
    rng = np.random.default_rng(0)
    flags = [rng.random(length) < 0.3 for length in rng.integers(2, 20, size=40)]
    for loss in flags:
        loss[rng.integers(1, len(loss))] = True
    lengths = [len(loss) for loss in flags]
    tokenized = data.Samples(np.zeros(sum(lengths), np.int64), np.concatenate(flags),
                             np.concatenate([[0], np.cumsum(lengths)]), 256)
    prompts = data.prompt_lengths(tokenized)
    for seq_len in range(1, 21):
        kept = [loss[1:seq_len + 1].any() for loss in flags]
        assert kept == (prompts <= seq_len).tolist()


def samples(lengths: list[int], prompt: int = 2) -> data.Samples:
    ids = [np.arange(n) % 200 + 1 for n in lengths]
    loss = [np.arange(n) >= prompt for n in lengths]
    return data.Samples(np.concatenate(ids), np.concatenate(loss),
                        np.concatenate([[0], np.cumsum(lengths)]), 256)


def test_a_sample_is_cut_to_the_window_and_a_batch_to_its_longest_sample():
    dataset = InstructionDataset(samples([5, 12, 40]), range(3), seq_len=16, multiple=4)
    inputs, targets = dataset[0]
    assert inputs.tolist()[:5] == [1, 2, 3, 4, 0] and inputs[4:].eq(0).all()
    assert targets.tolist()[:5] == [IGNORE, 3, 4, 5, IGNORE]  # prompt 2, then 3 counted
    long_inputs, long_targets = dataset[2]  # 40 tokens cut to the first 17
    assert long_inputs.tolist() == list(range(1, 17))
    assert long_targets[-1] == 17
    assert dataset.lengths.tolist() == [4, 11, 16]
    batch = dataset.collate([dataset[0], dataset[1]])
    assert batch[0].shape == (2, 12)  # 11 tokens rounded up to a multiple of 4
    assert dataset.collate([dataset[0], dataset[2]])[0].shape == (2, 16)
    fixed = InstructionDataset(samples([5, 12]), range(2), seq_len=16, multiple=0)
    assert fixed.collate([fixed[0]])[0].shape == (1, 16)  # a pipeline keeps its shapes


def test_length_buckets_group_similar_lengths_whatever_the_split():
    lengths = np.random.default_rng(0).integers(1, 500, size=1000)
    order = length_buckets(lengths, 32, torch.Generator().manual_seed(3))
    assert sorted(order) == list(range(1000))
    assert order == length_buckets(lengths, 32, torch.Generator().manual_seed(3))
    spread = [np.ptp(lengths[order[i:i + 32]]) for i in range(0, 992, 32)]
    assert np.mean(spread) < 0.1 * np.ptp(lengths)  # a random batch spans about 0.9


def test_the_steps_loss_is_the_mean_over_every_counted_token():
    """Two micro-batches with different counts of completion tokens: the step's loss and
    gradient are those of one cross-entropy over all counted tokens, by hand."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Linear(16, 50))
    inputs = torch.randint(0, 50, (4, 10))
    targets = torch.randint(0, 50, (4, 10))
    targets[0, :8] = IGNORE   # micro-batch 1: 2 + 10 counted
    targets[2, :3] = IGNORE   # micro-batch 2: 7 + 0 counted
    targets[3] = IGNORE
    strategy = Strategy(model, 0, 1)
    step_loss = strategy.forward_backward([(inputs[:2], targets[:2]), (inputs[2:], targets[2:])],
                                          contextlib.nullcontext())
    ours = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    by_hand = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten(), ignore_index=IGNORE)
    by_hand.backward()
    torch.testing.assert_close(step_loss, by_hand.detach(), rtol=1e-6, atol=1e-7)
    for grad, param in zip(ours, model.parameters(), strict=True):
        torch.testing.assert_close(grad, param.grad, rtol=1e-5, atol=1e-7)


def test_the_last_samples_are_held_out(tmp_path):
    cfg = dataclasses.replace(config(tmp_path), val_fraction=0.25, batching="pad")
    train, val = instruction_datasets(cfg, samples([5, 6, 7, 8, 9, 10, 11, 12]))
    assert (train.indices, val.indices) == (range(0, 6), range(6, 8))
    packed, held_out = instruction_datasets(dataclasses.replace(cfg, batching="auto"),
                                            samples([5, 6, 7, 8, 9, 10, 11, 12]))
    assert sorted(i for pack in packed.packs for i in pack) == list(range(6))
    assert sorted(i for pack in held_out.packs for i in pack) == [6, 7]
