"""End to end: ``torchx run -s local_cwd`` of each component trains and its loss falls; an
HF model on a JSONL directory with its own tokenizer trains and samples."""

from __future__ import annotations

import json
import math

import pytest

from tests.support.component_runs import COMPONENTS, by_component
from tests.support.processes import run_forked
from tests.support.runs import run_trainer, torchx_cli


@pytest.mark.parametrize("component", by_component())
def test_component_on_local_cwd(component_runs, component):
    """The job succeeds on every rank of its -j, the loss and the eval loss fall, and the run
    holds its last checkpoint, TensorBoard events and a metrics line per step."""
    proc = component_runs.output(component)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "job finished: succeeded" in proc.stderr.lower()  # "Job" on 0.7.0, "job" on main
    run_dir = component_runs[component]
    j = COMPONENTS[component][0]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == int(j[0]) * int(j[-1])
    assert summary["first_loss"] > math.log(256) - 0.2
    assert summary["final_loss"] < summary["first_loss"] - 1.5
    assert summary["final_eval_loss"] < math.log(256) - 1.5
    assert (run_dir / "checkpoints" / "step_00000040" / "manifest.json").exists()
    assert list((run_dir / "tensorboard").iterdir())
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 40


def test_component_with_bad_arguments_schedules_nothing(tmp_path):
    proc = torchx_cli("run", "-s", "local_cwd", "components/ddp.py:ddp", "-j", "1x2", "--",
                      "--batch-size", "15", "--output-dir", str(tmp_path / "run"), timeout=120)
    assert proc.returncode == 1
    assert ("trainers.ddp: --batch-size 15 is not divisible by --grad-accum 1 x data-parallel "
            "size 2; pass a multiple of 2") in proc.stderr
    assert "Traceback" not in proc.stderr and "local_cwd://" not in proc.stdout
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_hf_model_on_a_jsonl_directory_with_a_trained_tokenizer(tmp_path):
    """``hf:DIR`` + a directory of .jsonl files + a tokenizer.json trained on them, under fsdp
    on 2 ranks (forked: the fsdp component's launch is test_component_on_local_cwd[fsdp]'s);
    then sampling from the run decodes through it."""
    pytest.importorskip("transformers")
    from trainers.models.huggingface import tiny_llama_config

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    words = ["the", "model", "trains", "on", "text", "and", "data", "shards", "over", "ranks"]
    for part in range(3):
        lines = [json.dumps({"text": " ".join(words[(i * 7 + k * 3 + part) % len(words)]
                                              for k in range(40))}) for i in range(200)]
        (corpus / f"part{part}.jsonl").write_text("\n".join(lines) + "\n")
    tokenizer = tmp_path / "tokenizer.json"
    from trainers.tools.train_tokenizer import main as train_tokenizer

    train_tokenizer([str(corpus), "--vocab-size", "300", "--output", str(tokenizer)])
    model = tiny_llama_config(tmp_path / "hf", vocab_size=300)
    run_dir = tmp_path / "run"
    run_trainer(["--model", f"hf:{model}", "--data", str(corpus), "--tokenizer", str(tokenizer),
                 "--steps", "30", "--batch-size", "8", "--activation-checkpointing",
                 "--eval-every", "15", "--output-dir", str(run_dir)],
                nproc=2, module="trainers.fsdp")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["final_loss"] < summary["first_loss"] - 1.0
    sample = run_forked("trainers.tools.sample", [str(run_dir), "--prompt", "the model",
                                                  "--tokens", "8"], timeout=120)
    assert sample.stdout.startswith("the model")
