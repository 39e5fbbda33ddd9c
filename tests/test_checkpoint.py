"""Checkpoints: atomic, keep-last-k, verified, falling back past a corrupt newest one."""

from __future__ import annotations

import logging
import shutil

import pytest
import torch

from tests.conftest import TINY, losses, run_trainer
from trainers.checkpoint import Checkpointer, find_checkpoints, verify
from trainers.config import parse_config
from trainers.errors import ConfigError
from trainers.model import build_model


def _state(seed: int):
    torch.manual_seed(seed)
    model = build_model("tiny")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randint(0, 256, (2, 8))).sum().backward()
    optimizer.step()
    return model, optimizer


def test_save_load_round_trip_and_keep_last_k(tmp_path, world_of_one):
    model, optimizer = _state(0)
    ckpt = Checkpointer(tmp_path, keep=2, env=world_of_one, model_name="tiny")
    for step in (1, 2, 3):
        ckpt.save(step, model, optimizer, {"step": step, "data": {"epoch": 0, "samples": step}})
    assert [p.name for p in find_checkpoints(tmp_path)] == ["step_00000003", "step_00000002"]
    assert not list((tmp_path / "checkpoints").glob("*.tmp"))

    other, other_opt = _state(1)
    loop_state = {"step": 0, "data": {"epoch": 0, "samples": 0}}
    ckpt.load(ckpt.choose("auto"), other, other_opt, loop_state)
    assert loop_state == {"step": 3, "data": {"epoch": 0, "samples": 3}}
    for a, b in zip(model.parameters(), other.parameters(), strict=True):
        assert torch.equal(a, b)
    exp_avg = optimizer.state[next(model.parameters())]["exp_avg"]
    assert torch.equal(exp_avg, other_opt.state[next(other.parameters())]["exp_avg"])


def test_an_unfinished_save_is_ignored(tmp_path, world_of_one):
    model, optimizer = _state(0)
    ckpt = Checkpointer(tmp_path, keep=3, env=world_of_one, model_name="tiny")
    ckpt.save(1, model, optimizer, {"step": 1})
    # A crash during the save of step 2 leaves only its temporary directory behind.
    partial = tmp_path / "checkpoints" / "step_00000002.tmp"
    shutil.copytree(tmp_path / "checkpoints" / "step_00000001", partial)
    (partial / "manifest.json").unlink()
    assert ckpt.choose("auto").name == "step_00000001"


def test_corrupt_newest_falls_back_with_a_warning(tmp_path, world_of_one, caplog):
    model, optimizer = _state(0)
    ckpt = Checkpointer(tmp_path, keep=3, env=world_of_one, model_name="tiny")
    for step in (1, 2):
        ckpt.save(step, model, optimizer, {"step": step})
    newest = tmp_path / "checkpoints" / "step_00000002"
    data_file = next(newest.glob("*.distcp"))
    raw = bytearray(data_file.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # one flipped byte, same size
    data_file.write_bytes(bytes(raw))
    assert "CRC-32" in verify(newest)
    with caplog.at_level(logging.WARNING):
        assert ckpt.choose("auto").name == "step_00000001"
    assert "step_00000002 is corrupt" in caplog.text

    (tmp_path / "checkpoints" / "step_00000001" / "manifest.json").write_text("{trunc")
    with pytest.raises(ConfigError, match="every checkpoint is corrupt"):
        ckpt.choose("auto")


def test_a_checkpoint_of_another_model_is_refused(tmp_path, world_of_one):
    model, optimizer = _state(0)
    Checkpointer(tmp_path, 1, world_of_one, "tiny").save(1, model, optimizer, {"step": 1})
    for resume in ("auto", str(tmp_path / "checkpoints" / "step_00000001")):
        with pytest.raises(ConfigError, match="holds a --model tiny checkpoint, not small"):
            parse_config(["--model", "small", "--output-dir", str(tmp_path), "--resume", resume],
                         "trainers.ddp", world_sizes=[1])


def test_trainer_resumes_past_a_corrupt_checkpoint(tmp_path):
    args = [*TINY, "--output-dir", str(tmp_path), "--checkpoint-every", "3", "--steps", "6"]
    run_trainer(args)
    reference = losses(tmp_path)
    newest = tmp_path / "checkpoints" / "step_00000006"
    next(newest.glob("*.distcp")).write_bytes(b"garbage")
    proc = run_trainer([*args, "--resume", "auto"])
    assert "step_00000006 is corrupt" in proc.stderr
    assert "resumed from" in proc.stdout and "step_00000003 at step 3" in proc.stdout
    assert losses(tmp_path) == reference  # steps 4-6 trained again, identically


def test_resume_none_refuses_to_overwrite_checkpoints(tmp_path):
    run_trainer([*TINY, "--output-dir", str(tmp_path), "--steps", "2"])
    proc = run_trainer([*TINY, "--output-dir", str(tmp_path), "--steps", "2"], check=False)
    assert proc.returncode == 2
    assert "already holds checkpoints; pass --resume auto or a new --output-dir" in proc.stderr
    assert find_checkpoints(tmp_path)
