"""Asynchronous checkpoints: a snapshot of the save's step, committed one step later, verified,
and a run that trains and resumes exactly as with synchronous saves."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.checkpoint.staging import DefaultStager

from tests.integration.test_checkpoint import tiny_checkpointer
from tests.support.runs import TINY, assert_close, losses, run_trainer
from trainers.core import checkpoint
from trainers.runs.checkpoint_files import find_checkpoints, verify


def test_an_async_save_holds_its_step_and_is_committed_later(tmp_path, world_of_one):
    ckpt, model, _, progress = tiny_checkpointer(tmp_path, world_of_one)
    progress.step = 1
    assert ckpt.save(1, asynchronous=True) is None
    assert find_checkpoints(tmp_path) == []  # written into step_00000001.tmp, not committed
    at_save = {name: t.clone() for name, t in model.state_dict().items()}
    with torch.no_grad():  # training goes on while the copy is written
        for param in model.parameters():
            param.add_(1.0)
    progress.step = 2
    committed = ckpt.commit_pending()
    assert committed == tmp_path / "checkpoints" / "step_00000001"
    assert verify(committed) is None
    assert ckpt.commit_pending() is None  # nothing left in flight
    ckpt.close()

    other_ckpt, other, _, other_progress = tiny_checkpointer(tmp_path, world_of_one, seed=1)
    other_ckpt.load(other_ckpt.choose("auto"))
    assert other_progress.step == 1
    for name, tensor in other.state_dict().items():
        assert torch.equal(tensor, at_save[name]), name


def test_a_synchronous_save_first_commits_the_one_in_flight(tmp_path, world_of_one):
    ckpt = tiny_checkpointer(tmp_path, world_of_one)[0]
    ckpt.save(1, asynchronous=True)
    assert ckpt.save(2).name == "step_00000002"
    checkpoints = find_checkpoints(tmp_path)
    assert [p.name for p in checkpoints] == ["step_00000002", "step_00000001"]
    assert all(verify(p) is None for p in checkpoints)
    assert not list((tmp_path / "checkpoints").glob("*.tmp"))
    ckpt.close()


def _model_and_optimizer(checkpoint, out) -> dict[str, torch.Tensor]:
    dcp_to_torch_save(checkpoint, out)
    return torch.load(out, weights_only=False)["train"]


@pytest.mark.slow
def test_async_checkpoints_train_and_resume_exactly_like_sync(tmp_path):
    """Two ranks with dropout, a checkpoint every 2 steps: the same losses and the same saved
    state with async and sync saves, every checkpoint verified, and a resume from an async one
    continues like the uninterrupted run."""
    common = [*TINY, "--batch-size", "16", "--dropout", "0.1", "--checkpoint-every", "2",
              "--train-samples", "48"]
    runs = {mode: tmp_path / mode for mode in ("async", "sync")}
    for mode, run_dir in runs.items():
        run_trainer([*common, f"--{'' if mode == 'async' else 'no-'}async-checkpoint",
                     "--output-dir", str(run_dir)], nproc=2)
    assert losses(runs["async"]) == losses(runs["sync"])
    for run_dir in runs.values():
        checkpoints = find_checkpoints(run_dir)
        assert [p.name for p in checkpoints] == ["step_00000008", "step_00000006",
                                                 "step_00000004"]
        assert all(verify(p) is None for p in checkpoints)
    saved = [_model_and_optimizer(run_dir / "checkpoints" / "step_00000006",
                                  tmp_path / f"{mode}.pt") for mode, run_dir in runs.items()]
    for group in ("model", "optim"):
        assert saved[0][group].keys() == saved[1][group].keys()
        for key, value in saved[0][group].items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(value, saved[1][group][key]), key

    resumed = tmp_path / "resumed"
    proc = run_trainer([*common, "--output-dir", str(resumed), "--resume",
                        str(runs["async"] / "checkpoints" / "step_00000004")], nproc=2)
    assert "at step 4" in proc.stdout
    assert_close(losses(resumed), {s: v for s, v in losses(runs["sync"]).items() if s > 4})


class _HoldsAClass:
    """A Stateful whose state holds a class (the real runs' states hold one)."""

    def state_dict(self) -> dict[str, object]:
        return {"kind": int}

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Nothing to restore."""


def _stage_then_close(self, state_dict, **kwargs):
    """torch 2.11 and 2.12's ``DefaultStager._stage``: it closes its own state-dict stager after
    each stage (2.13 does not)."""
    staged = self._state_dict_stager.stage(state_dict, non_blocking=False)
    self._state_dict_stager.close()
    return staged


@pytest.mark.parametrize("one_stager_per_save", [True, False])
def test_async_saves_where_the_torch_closes_its_stager_after_each(tmp_path, world_of_one,
                                                                  monkeypatch,
                                                                  one_stager_per_save):
    """Under torch 2.11/2.12's stager (simulated here), a stager reused for a second save
    fails on its emptied copy table; a new stager for each save (what checkpoint.py does on
    those versions) commits every save."""
    monkeypatch.setattr(DefaultStager, "_stage", _stage_then_close)
    monkeypatch.setattr(checkpoint, "STAGER_SERVES_ONE_SAVE", one_stager_per_save)
    ckpt, _, _, progress = tiny_checkpointer(tmp_path, world_of_one)
    ckpt.state["kind"] = _HoldsAClass()
    for step in (1, 2, 3):
        progress.step = step
        if one_stager_per_save:
            ckpt.save(step, asynchronous=True)
        elif step == 2:
            with pytest.raises(KeyError, match="<class 'type'>"):
                ckpt.save(step, asynchronous=True)
            return
        else:
            ckpt.save(step, asynchronous=True)
    assert ckpt.commit_pending() == tmp_path / "checkpoints" / "step_00000003"
    assert sorted(p.name for p in find_checkpoints(tmp_path)) == [
        "step_00000001", "step_00000002", "step_00000003"]
    ckpt.close()
