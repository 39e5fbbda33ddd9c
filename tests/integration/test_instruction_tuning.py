"""Training on instruction and chat data: a step's loss is the mean over the completion tokens
of the global batch however they fall on ranks and micro-batches, samples whose completion
--seq-len cuts whole are skipped alike on every rank, and a run resumes exactly at another
data-parallel size (the length buckets do not depend on it)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tests.support.runs import TINY, assert_close, losses, run_trainer

RUN = [*TINY, "--batch-size", "8", "--steps", "6", "--eval-every", "3", "--eval-batches", "2"]


def write_sums(path: Path, count: int) -> Path:
    """Prompt/completion records of additions, prompts of 4 to 40 bytes."""
    rng = random.Random(0)
    with path.open("w") as out:
        for _ in range(count):
            a, b = rng.randrange(10 ** rng.randrange(1, 18)), rng.randrange(100)
            out.write(json.dumps({"prompt": f"{a} plus {b} is ", "completion": str(a + b)})
                      + "\n")
    return path


def insert_long(path: Path, records: dict[int, dict]) -> Path:
    """Insert ``records`` (by the line number each is to have, from 1) into the .jsonl file
    ``path``."""
    lines = path.read_text().splitlines(keepends=True)
    for number, record in sorted(records.items()):
        lines.insert(number - 1, json.dumps(record) + "\n")
    path.write_text("".join(lines))
    return path


def skip_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("skipped ")]


def write_chats(path: Path, count: int = 96) -> Path:
    rng = random.Random(1)
    with path.open("w") as out:
        for _ in range(count):
            a, b = rng.randrange(1000), rng.randrange(1000)
            turns = [{"role": "user", "content": f"{a}+{b}?"},
                     {"role": "assistant", "content": str(a + b)}]
            if rng.random() < 0.5:
                turns = [{"role": "system", "content": "add"}, *turns]
            out.write(json.dumps({"messages": turns}) + "\n")
    return path


def test_completion_loss_is_the_same_on_any_split_of_the_batch(tmp_path):
    """One process with the whole batch, and 2 ranks x 2 micro-batches of 2, whose completion
    tokens differ in number: the same losses and evaluation losses (fp32). Two samples whose
    prompts outrun --seq-len 64 are skipped, by both ranks alike, before the split: one line
    says so, and summary.json counts them."""
    sums = insert_long(write_sums(tmp_path / "sums.jsonl", 100),
                       {11: {"prompt": "7" * 70, "completion": "7"},
                        61: {"prompt": "9" * 90, "completion": "9"}})
    # 8 of the 100 samples kept held out: one evaluation batch of 8, or 2 of 2 on each rank.
    data = ["--data", str(sums), "--val-fraction", "0.08"]
    one, split = tmp_path / "one", tmp_path / "split"
    procs = [run_trainer([*RUN, *data, "--batching", "pad", "--output-dir", str(one)]),
             run_trainer([*RUN, *data, "--batching", "pad", "--grad-accum", "2", "--output-dir",
                          str(split)], nproc=2)]
    assert_close(losses(split), losses(one))
    for proc, run in zip(procs, (one, split), strict=True):
        assert skip_lines(proc.stdout) == [
            "skipped 2 of 102 samples: --seq-len 64 cuts their whole completion (the longest "
            "prompt is 90 tokens); --seq-len 90 keeps them all, --long-samples error refuses "
            "them"]
        assert json.loads((run / "summary.json").read_text())["skipped_samples"] == 2
    evals = [{r["step"]: r["eval_loss"] for r in map(json.loads, (run / "metrics.jsonl")
                                                       .read_text().splitlines())
              if "eval_loss" in r} for run in (one, split)]
    assert list(evals[0]) == [3, 6]
    assert_close(evals[1], evals[0])
    assert len(list((one / "data").glob("samples-*.npz"))) == 1


@pytest.mark.slow  # two trainer runs, one on 2 ranks
def test_a_chat_run_resumes_exactly_at_another_data_parallel_size(tmp_path):
    """Two conversations whose first reply --seq-len cuts are skipped in both runs."""
    template = tmp_path / "chat.jinja"
    template.write_text("{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}\n"
                        "{% endfor %}{% if add_generation_prompt %}a:{% endif %}")
    long = {"messages": [{"role": "user", "content": "1+" * 40 + "1?"},
                         {"role": "assistant", "content": "41"}]}
    chats = insert_long(write_chats(tmp_path / "chats.jsonl"), {5: long, 50: long})
    data = ["--data", str(chats), "--chat-template", str(template), "--checkpoint-every", "4",
            "--eval-every", "0"]
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    first = run_trainer([*RUN, *data, "--output-dir", str(whole)], nproc=2)
    proc = run_trainer([*RUN, *data, "--output-dir", str(resumed), "--resume",
                        str(whole / "checkpoints" / "step_00000004")])
    assert "at step 4" in proc.stdout
    assert_close(losses(resumed), {s: v for s, v in losses(whole).items() if s > 4})
    assert [len(skip_lines(p.stdout)) for p in (first, proc)] == [1, 1]
    assert skip_lines(proc.stdout)[0].startswith("skipped 2 of 98 samples: --seq-len 64 ")


@pytest.mark.slow  # four trainer runs, two on 2 ranks
def test_a_pipeline_and_packed_fsdp_match_one_process(tmp_path):
    """Padded samples through a 2-stage pipeline (which pads by default: fixed-width batches,
    the schedule's loss divided by the step's shared count), and packed samples sharded by
    FSDP on 2 ranks, each against one process batching the same way."""
    data = ["--data", str(write_sums(tmp_path / "sums.jsonl", 100)), "--eval-every", "0"]
    runs = {name: tmp_path / name for name in ("pad", "pipeline", "pack", "fsdp")}
    run_trainer([*RUN, *data, "--batching", "pad", "--output-dir", str(runs["pad"])])
    run_trainer([*RUN, *data, "--pp", "2", "--microbatches", "4", "--output-dir",
                 str(runs["pipeline"])], nproc=2, module="trainers.pipeline")
    run_trainer([*RUN, *data, "--output-dir", str(runs["pack"])])
    run_trainer([*RUN, *data, "--output-dir", str(runs["fsdp"])],
                nproc=2, module="trainers.fsdp")
    assert_close(losses(runs["pipeline"]), losses(runs["pad"]))
    assert_close(losses(runs["fsdp"]), losses(runs["pack"]))
    metrics = (runs["fsdp"] / "metrics.jsonl").read_text().splitlines()
    packed = [json.loads(line) for line in metrics]
    assert {round(r["tokens_per_s"] * r["step_time_s"]) for r in packed} == {8 * 64}  # full
