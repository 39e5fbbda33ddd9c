"""Training on instruction and chat data: a step's loss is the mean over the completion tokens
of the global batch however they fall on ranks and micro-batches, and a run resumes exactly
at another data-parallel size (the length buckets do not depend on it)."""

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
    tokens differ in number: the same losses and evaluation losses (fp32)."""
    # 8 held-out samples: one evaluation batch of 8, or 2 of 2 on each rank.
    data = ["--data", str(write_sums(tmp_path / "sums.jsonl", 100)), "--val-fraction", "0.08"]
    one, split = tmp_path / "one", tmp_path / "split"
    run_trainer([*RUN, *data, "--batching", "pad", "--output-dir", str(one)])
    run_trainer([*RUN, *data, "--batching", "pad", "--grad-accum", "2", "--output-dir",
                 str(split)], nproc=2)
    assert_close(losses(split), losses(one))
    evals = [{r["step"]: r["eval_loss"] for r in map(json.loads, (run / "metrics.jsonl")
                                                       .read_text().splitlines())
              if "eval_loss" in r} for run in (one, split)]
    assert list(evals[0]) == [3, 6]
    assert_close(evals[1], evals[0])
    assert len(list((one / "data").glob("samples-*.npz"))) == 1


@pytest.mark.slow  # two trainer runs, one on 2 ranks
def test_a_chat_run_resumes_exactly_at_another_data_parallel_size(tmp_path):
    template = tmp_path / "chat.jinja"
    template.write_text("{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}\n"
                        "{% endfor %}{% if add_generation_prompt %}a:{% endif %}")
    data = ["--data", str(write_chats(tmp_path / "chats.jsonl")), "--chat-template",
            str(template), "--checkpoint-every", "4", "--eval-every", "0"]
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    run_trainer([*RUN, *data, "--output-dir", str(whole)], nproc=2)
    proc = run_trainer([*RUN, *data, "--output-dir", str(resumed), "--resume",
                        str(whole / "checkpoints" / "step_00000004")])
    assert "at step 4" in proc.stdout
    assert_close(losses(resumed), {s: v for s, v in losses(whole).items() if s > 4})


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
