"""Checkpoints: atomic, keep-last-k, verified, falling back past a corrupt newest one."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch

from tests.support.runs import TINY, losses, run_trainer, without
from trainers.config.parsing import parse_config
from trainers.core.checkpoint import Checkpointer
from trainers.core.checkpoint_state import ModelAndOptimizer, Progress, RankRNG
from trainers.errors import ConfigError
from trainers.models import build_model
from trainers.runs.checkpoint_files import find_checkpoints, verify


def _state(seed: int):
    model = build_model("tiny", seed=seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randint(0, 256, (2, 8))).sum().backward()
    optimizer.step()
    return model, optimizer


def tiny_checkpointer(tmp_path, env, keep: int = 3, seed: int = 0):
    """A checkpointer of a tiny model and optimizer, its step and this rank's RNG."""
    model, optimizer = _state(seed)
    progress = Progress()
    ckpt = Checkpointer(tmp_path, keep, env, {"model": "tiny"},
                        state={"train": ModelAndOptimizer(model, optimizer), "progress": progress},
                        rank_state={"rng": RankRNG()})
    return ckpt, model, optimizer, progress


def test_save_load_round_trip_and_keep_last_k(tmp_path, world_of_one):
    ckpt, model, optimizer, progress = tiny_checkpointer(tmp_path, world_of_one, keep=2)
    for step in (1, 2, 3):
        progress.step = step
        ckpt.save(step)
    saved_rng = torch.get_rng_state()
    assert [p.name for p in find_checkpoints(tmp_path)] == ["step_00000003", "step_00000002"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == \
        ["step_00000002", "step_00000003"]

    torch.rand(10)  # the RNG moves on; loading puts it back
    other_ckpt, other, other_opt, other_progress = tiny_checkpointer(tmp_path, world_of_one, seed=1)
    assert not torch.equal(next(model.parameters()), next(other.parameters()))
    other_ckpt.load(other_ckpt.choose("auto"))
    assert other_progress.step == 3
    assert torch.equal(torch.get_rng_state(), saved_rng)
    for a, b in zip(model.parameters(), other.parameters(), strict=True):
        assert torch.equal(a, b)
    exp_avg = optimizer.state[next(model.parameters())]["exp_avg"]
    assert torch.equal(exp_avg, other_opt.state[next(other.parameters())]["exp_avg"])


def test_an_unfinished_save_is_ignored_and_pruned_once_a_newer_one_commits(tmp_path,
                                                                           world_of_one):
    ckpt = tiny_checkpointer(tmp_path, world_of_one)[0]
    ckpt.save(1)
    # A crash during the save of step 2 leaves its files without the manifest, the commit
    # marker, which is written last.
    partial = tmp_path / "checkpoints" / "step_00000002"
    shutil.copytree(tmp_path / "checkpoints" / "step_00000001", partial)
    (partial / "manifest.json").unlink()
    assert ckpt.choose("auto").name == "step_00000001"
    assert [p.name for p in find_checkpoints(tmp_path)] == ["step_00000001"]
    ckpt.save(3)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == \
        ["step_00000001", "step_00000003"]


def test_corrupt_newest_falls_back_with_a_warning(tmp_path, world_of_one, caplog):
    ckpt = tiny_checkpointer(tmp_path, world_of_one)[0]
    for step in (1, 2):
        ckpt.save(step)
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
    tiny_checkpointer(tmp_path, world_of_one, keep=1)[0].save(1)
    for resume in ("auto", str(tmp_path / "checkpoints" / "step_00000001")):
        with pytest.raises(ConfigError, match="holds a --model tiny checkpoint, not small"):
            parse_config(["--model", "small", "--output-dir", str(tmp_path), "--resume", resume],
                         "ddp", world_sizes=[1])


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


def test_a_checkpoint_of_an_earlier_format_is_refused_in_one_line(tmp_path, world_of_one):
    """Checkpoints written before the state was registered as separate Stateful entries (no
    "format" in their manifest) cannot be resumed; say so instead of failing inside DCP."""
    ckpt = tiny_checkpointer(tmp_path, world_of_one)[0]
    ckpt.save(1)
    manifest_path = tmp_path / "checkpoints" / "step_00000001" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    assert manifest["format"] == 2
    del manifest["format"]
    manifest_path.write_text(json.dumps(manifest))
    message = "holds a format-1 checkpoint from an earlier version of these trainers"
    with pytest.raises(ConfigError, match=message):
        parse_config(["--output-dir", str(tmp_path)], "ddp", world_sizes=[1])
    with pytest.raises(ConfigError, match=message):
        ckpt.choose("auto")


def _metrics(run_dir) -> dict[int, dict[str, float]]:
    return {r["step"]: r for r in map(json.loads,
                                      (run_dir / "metrics.jsonl").read_text().splitlines())}


def test_a_resume_tells_the_truth(tmp_path):
    """config.json records the run; extending --steps keeps the rate of the last step (no jump)
    and says so; the summary's first loss is the run's; a complete run says how to continue;
    every changed option is listed in one warning."""
    args = [*without(TINY, "--resume", "--steps", "--warmup-steps"), "--output-dir",
            str(tmp_path), "--checkpoint-every", "2", "--steps", "4", "--warmup-steps", "1"]
    first = run_trainer(args)
    assert f"run directory: {tmp_path}" in first.stdout
    record = json.loads((tmp_path / "config.json").read_text())
    assert record["command"] == ["python", "-m", "trainers.ddp", *args]
    assert record["options"]["steps"] == 4 and record["world_size"] == 1
    assert record["git"]["commit"] and record["versions"]["torch"]
    first_loss = json.loads((tmp_path / "summary.json").read_text())["first_loss"]

    extended = run_trainer([*args[:-4], "--steps", "6", "--warmup-steps", "1"])
    assert "resumed from" in extended.stdout and "at step 4" in extended.stdout
    assert "--steps 6 extends the run's 4-step schedule" in extended.stdout
    lr = {step: m["lr"] for step, m in _metrics(tmp_path).items()}
    assert lr[5] == lr[6] == pytest.approx(lr[4], rel=1e-12) and lr[3] > lr[4]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["resumed_from_step"] == 4 and summary["first_loss"] == first_loss
    assert summary["first_loss"] == _metrics(tmp_path)[1]["loss"]

    done = run_trainer([*args[:-4], "--steps", "6", "--warmup-steps", "1", "--lr", "0.001"])
    warnings = [line for line in done.stdout.splitlines() if line.startswith("warning:")]
    assert warnings == ["warning: resuming with changed options (they apply from step 7): "
                        "--lr 0.003 -> 0.001"]
    assert ("the run is already complete at step 6 (--steps 6); to train further pass --steps "
            "N > 6") in done.stdout
    assert not [line for line in done.stdout.splitlines() if line.startswith("step ")]
