"""The bad-input matrix's ``--model hf:DIR`` rows: a directory whose config.json is not a causal
LM's, or whose safetensors file is not whole, is refused in one line that names the fix by the
component (``torchx run --dryrun``: nothing is scheduled) and by ``python -m trainers.ddp``
(before it builds anything), as tests/integration/test_bad_input_matrix.py refuses the rest.

The directories are written here: tiny config.json files and hand-made safetensors bytes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from torchx.runner import get_runner

from components.errors import ComponentArgumentError
from tests.integration.test_bad_input_matrix import FIX, Row, assert_refused
from tests.support.processes import run_forked
from tests.support.runs import REPO, run_trainer
from trainers.models.huggingface import tiny_llama_config
from trainers.options.model_names import check_safetensors

NOT_CAUSAL = ("is not a causal LM config ({why}); pass the directory of a causal "
              "LM saved by transformers' save_pretrained (its architectures end in ForCausalLM)")
NOT_WHOLE = ("is not a readable safetensors file ({reason}); copy or save it again with "
             "save_pretrained, or pass a directory without it to start from the initialization")
# One float32 tensor of 16 values: the header, then its 64 bytes.
HEADER = json.dumps({"w": {"dtype": "F32", "shape": [16], "data_offsets": [0, 64]}}).encode()
WHOLE = len(HEADER).to_bytes(8, "little") + HEADER + bytes(64)


def _config(folder: Path, config: dict[str, object]) -> None:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))


def bad_hf_dirs(tmp: Path) -> None:
    """The directories of :data:`CASES` under ``tmp/models``."""
    widths = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
              "vocab_size": 256, "max_position_embeddings": 64}
    _config(tmp / "models/bert", {"architectures": ["BertForMaskedLM"], "model_type": "bert",
                                  "intermediate_size": 128, **widths})
    # BertConfig().save_pretrained: no architectures, an encoder's model_type
    _config(tmp / "models/bert-bare", {"model_type": "bert", "type_vocab_size": 2,
                                       "intermediate_size": 128, **widths})
    # BERT as a decoder: its class name ends like a causal LM's, its embeddings are an encoder's
    _config(tmp / "models/bert-lm-head", {"architectures": ["BertLMHeadModel"],
                                          "model_type": "bert", "is_decoder": True,
                                          "type_vocab_size": 2, "intermediate_size": 128,
                                          **widths})
    _config(tmp / "models/t5", {"architectures": ["T5ForConditionalGeneration"],
                                "model_type": "t5", "d_model": 64, "num_layers": 2,
                                "num_heads": 2, "vocab_size": 256, "is_encoder_decoder": True})
    (tiny_llama_config(tmp / "models/truncated") / "model.safetensors").write_bytes(WHOLE[:-16])
    garbage = len(b"not json").to_bytes(8, "little") + b"not json" + bytes(64)
    (tiny_llama_config(tmp / "models/garbage") / "model.safetensors").write_bytes(garbage)


@dataclass(frozen=True)
class Case:
    """``hf:{tmp}/models/<name>``, and what follows ``--model <it>: `` in its error line."""

    name: str
    error: str


CASES = [
    Case("bert", "{dir}/config.json " + NOT_CAUSAL.format(why="it describes a BertForMaskedLM")),
    Case("bert-bare", "{dir}/config.json " + NOT_CAUSAL.format(
        why="it names no architectures; its model_type is bert")),
    Case("bert-lm-head", "{dir}/config.json " + NOT_CAUSAL.format(
        why="it describes a BertLMHeadModel with an encoder's token-type embeddings")),
    Case("t5", "{dir}/config.json " + NOT_CAUSAL.format(
        why="it describes a T5ForConditionalGeneration")),
    Case("truncated", "{dir}/model.safetensors " + NOT_WHOLE.format(
        reason="its header spans 64 bytes of tensors, the file holds 48")),
    Case("garbage", "{dir}/model.safetensors " + NOT_WHOLE.format(
        reason="its header is not safetensors JSON: Expecting value: line 1 column 1 (char 0)")),
]


class DryRunRow(Row):
    """A row run as ``torchx run --dryrun``: were the component to accept it, the request would
    be printed and nothing run."""

    def args(self, tmp: Path) -> list[str]:
        return ["run", "--dryrun", *super().args(tmp)[1:]]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_the_component_refuses_it_before_scheduling(tmp_path, case):
    bad_hf_dirs(tmp_path)
    model = f"hf:{{tmp}}/models/{case.name}"
    error = case.error.format(dir="{tmp}/models/" + case.name)
    row = DryRunRow(case.name, "local_cwd", "ddp", f"trainers.ddp: --model {model}: {error}",
                    trainer=("--model", model, "--steps", "2"))
    assert_refused(row, tmp_path)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_the_runner_and_the_planner_refuse_it(tmp_path, case):
    """TorchX's Python runner (a dry run in this process) and the planner's command."""
    bad_hf_dirs(tmp_path)
    folder = tmp_path / "models" / case.name
    expected = f"--model hf:{folder}: {case.error.format(dir=folder)}"
    with get_runner() as runner, pytest.raises(ComponentArgumentError) as refused:
        runner.dryrun_component(f"{REPO}/components/ddp.py:ddp",
                                ["--", "--model", f"hf:{folder}"], "local_cwd", workspace=None)
    assert str(refused.value) == f"trainers.ddp: {expected}"
    if case.name == "bert-bare":  # the planner reads the same check; one case suffices
        plan = run_forked("trainers.planning.plan", ["--model", f"hf:{folder}"], timeout=120,
                          check=False)
        assert plan.returncode == 2
        assert plan.stderr.strip() == f"trainers.planning.plan: error: {expected}"


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_the_trainer_refuses_it_before_it_starts(tmp_path, case):
    bad_hf_dirs(tmp_path)
    folder = tmp_path / "models" / case.name
    proc = run_trainer(["--model", f"hf:{folder}", "--steps", "2", "--output-dir",
                        str(tmp_path / "run")], check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    error = proc.stderr.strip().splitlines()[-1]
    expected = f"trainers.ddp: error: --model hf:{folder}: {case.error.format(dir=folder)}"
    assert error == expected, (error, expected)
    assert FIX.search(error) and not (tmp_path / "run").exists()


def test_a_whole_safetensors_file_passes(tmp_path):
    """The check reads the format as the safetensors library writes it."""
    save_file = pytest.importorskip("safetensors.numpy").save_file

    save_file({"a": np.zeros((3, 5), np.float32), "b": np.ones(7, np.int64)},
              str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    check_safetensors(tmp_path / "model.safetensors")
    (tmp_path / "whole.safetensors").write_bytes(WHOLE)
    check_safetensors(tmp_path / "whole.safetensors")
    with pytest.raises(ValueError, match=re.escape("runs past the file's 4 bytes")):
        (tmp_path / "short.safetensors").write_bytes(b"\x01\x02\x03\x04")
        check_safetensors(tmp_path / "short.safetensors")
