"""The examples, short. examples/stdlib_code/run.sh (README's "Your model, your data" demo)
trains a BPE tokenizer on the standard library, tokenizes it, trains llama-small under the fsdp
component on local_cwd and samples from the checkpoint, offline; examples/stdlib_docstrings/run.sh
fine-tunes that run's export with LoRA on docstrings to code, evaluates on held-out modules and
samples a held-out function. The pretraining run is made once and shared."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest

from tests.support.processes import run_command

pytestmark = pytest.mark.slow


def run_example(script: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``examples/<script>`` short (4 steps of batch 4) with ``env`` added; asserts it exits 0."""
    proc = run_command([f"examples/{script}"], env={"STEPS": "4", "BATCH": "4", **env},
                       timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def stdlib_code(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """The stdlib_code demo's OUT and its process, run once for the module."""
    out = tmp_path_factory.mktemp("stdlib_code")
    return out, run_example("stdlib_code/run.sh", OUT=str(out))


def test_stdlib_code_demo_runs_end_to_end(stdlib_code):
    out, proc = stdlib_code
    tokenizer = json.loads((out / "tokenizer.json").read_text())
    assert len(tokenizer["model"]["vocab"]) + len(tokenizer["added_tokens"]) > 1000
    summary = json.loads((out / "run" / "summary.json").read_text())
    assert summary["model"] == "llama-small" and summary["world_size"] == 2
    assert summary["first_loss"] == pytest.approx(math.log(4096), abs=0.5)
    assert "final_eval_loss" in summary
    assert "\ndef read_config(path):" in "\n" + proc.stdout  # the sample, prompt first


def test_stdlib_docstrings_fine_tunes_the_demo(stdlib_code, tmp_path):
    proc = run_example("stdlib_docstrings/run.sh", PRETRAINED=str(stdlib_code[0]),
                       OUT=str(tmp_path))
    records = [json.loads(line)
               for line in (tmp_path / "instructions.jsonl").read_text().splitlines()]
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    held = math.ceil(len(records) * config["options"]["val_fraction"])
    prompt = (tmp_path / "prompt.txt").read_text()
    assert prompt in [r["prompt"] for r in records[-held:]]  # the sample's is held out
    assert prompt not in [r["prompt"] for r in records[:-held]]
    assert config["options"]["lora_rank"] == 16
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    evals = [m["eval_loss"] for m in map(json.loads, metrics) if "eval_loss" in m]
    assert len(evals) == 4 and all(math.isfinite(e) for e in evals)
    assert f"held-out completion loss: {evals[0]:.4f} at step 1 -> {evals[-1]:.4f} at step 4" \
        in proc.stdout
    assert "\n" + prompt in "\n" + proc.stdout  # the sample, prompt first
