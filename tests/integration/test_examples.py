"""The README's "Your model, your data" demo, short: examples/stdlib_code/run.sh trains a BPE
tokenizer on the standard library, tokenizes it, trains llama-small under the fsdp component on
local_cwd and samples from the checkpoint, offline."""

from __future__ import annotations

import json
import math
import subprocess

import pytest

from tests.support.runs import REPO, child_env

pytestmark = pytest.mark.slow


def test_stdlib_code_demo_runs_end_to_end(tmp_path):
    env = {**child_env(), "STEPS": "4", "BATCH": "4", "OUT": str(tmp_path)}
    proc = subprocess.run(["examples/stdlib_code/run.sh"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    tokenizer = json.loads((tmp_path / "tokenizer.json").read_text())
    assert len(tokenizer["model"]["vocab"]) + len(tokenizer["added_tokens"]) > 1000
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["model"] == "llama-small" and summary["world_size"] == 2
    assert summary["first_loss"] == pytest.approx(math.log(4096), abs=0.5)
    assert "final_eval_loss" in summary
    assert "\ndef read_config(path):" in "\n" + proc.stdout  # the sample, prompt first
