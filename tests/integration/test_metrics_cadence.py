"""The loop's metrics cadence (trainers.core.loop): the host reads a step's loss and gradient
norm only at flush points (log steps, the attempt's first and last step, evaluation and
checkpoint steps, ...), yet metrics.jsonl and the step hook still get every step, in order,
with the figures of a read after every step (``--log-every 1``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support.runs import TINY, losses, run_trainer, without
from trainers.config.parsing import parse_config
from trainers.core import loop
from trainers.core.distributed import init_distributed
from trainers.core.strategy import Strategy
from trainers.runs.storage import location


def records(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def train_here(argv: list[str], on_step: loop.StepHook | None = None) -> dict[str, Any]:
    """``trainers.ddp``'s loop in this process (a world of one)."""
    from trainers.ddp import build
    from trainers.models import spec_of

    cfg = parse_config(argv, "ddp")
    spec = spec_of(cfg)
    with init_distributed(cfg) as env:
        return loop.train(cfg, env, build(cfg, env, spec), spec, location(cfg.output_dir),
                          on_step=on_step)


@pytest.mark.slow
def test_deferred_metrics_equal_every_step_reads_on_two_ddp_ranks(tmp_path):
    """2-rank DDP with evaluations: --log-every 3 (flushes at steps 1, 3, 4, 6 and 8) writes
    the same metrics.jsonl losses, eval losses and gradient norms, every step in order, as
    --log-every 1; the console lines are those of the log and evaluation steps."""
    args = [*without(TINY, "--log-every", "--eval-every"), "--batch-size", "16",
            "--eval-every", "4", "--checkpoint-every", "0"]
    runs = {}
    for every in ("1", "3"):
        proc = run_trainer([*args, "--log-every", every, "--output-dir", str(tmp_path / every)],
                           nproc=2)
        runs[every] = records(tmp_path / every)
        printed = [int(line.split()[1].split("/")[0]) for line in proc.stdout.splitlines()
                   if line.startswith("step ")]
        assert printed == ([1, 2, 3, 4, 5, 6, 7, 8] if every == "1" else [1, 3, 4, 6, 8])
    for key in ("step", "loss", "grad_norm", "lr"):
        assert [r[key] for r in runs["3"]] == [r[key] for r in runs["1"]], key
    assert [r["step"] for r in runs["3"]] == list(range(1, 9))
    evals = {every: {r["step"]: r["eval_loss"] for r in rs if "eval_loss" in r}
             for every, rs in runs.items()}
    assert evals["3"] == evals["1"] and sorted(evals["3"]) == [4, 8]


def test_step_hook_gets_every_step_in_order_at_the_flush_points(tmp_path, monkeypatch):
    """--log-every 4 and asynchronous checkpoints every 3 steps over 7: steps 2 and 5 wait for
    the next flush, which hands them to the hook just ahead of its own step, in order; each
    checkpoint reaches the hook with the step that committed it."""
    trained: list[int] = []
    train_step = loop.train_step

    def counted(run, step, schedule_steps):
        trained.append(step)
        return train_step(run, step, schedule_steps)

    monkeypatch.setattr(loop, "train_step", counted)
    seen: list[tuple[int, int, float, Path | None]] = []  # (step, steps trained, loss, saved)
    train_here([*without(TINY, "--steps", "--log-every"), "--steps", "7", "--log-every", "4",
                "--checkpoint-every", "3", "--device", "cpu", "--output-dir", str(tmp_path)],
               on_step=lambda s, m, c: seen.append((s, len(trained), m["loss"], c)))
    assert [(s, t) for s, t, _, _ in seen] == [(1, 1), (2, 3), (3, 3), (4, 4), (5, 6), (6, 6),
                                               (7, 7)]
    assert {s: loss for s, _, loss, _ in seen} == losses(tmp_path)
    ckpts = tmp_path / "checkpoints"
    assert [c for _, _, _, c in seen] == [None, None, None, ckpts / "step_00000003", None,
                                          None, ckpts / "step_00000007"]


def test_the_loop_reads_no_tensor_between_flushes(tmp_path, monkeypatch):
    """One process, --log-every 4 over 8 steps: every host read of a tensor (``item``,
    ``tolist``, ``float``, ``bool``) but the preemption check's integer flag comes after steps
    1, 4 and 8, none inside a step, and the replicas' losses are reduced once per flush. A
    per-step read of the loss or the gradient norm (a device sync on a GPU) fails this."""
    at: dict[str, Any] = {"step": 0, "inside": False}
    reads: list[tuple[int, bool, str]] = []
    train_step = loop.train_step

    def tracked(run, step, schedule_steps):
        at.update(step=step, inside=True)
        try:
            return train_step(run, step, schedule_steps)
        finally:
            at["inside"] = False

    def spy(name: str):
        original = getattr(torch.Tensor, name)

        def read(self, *args, **kwargs):
            if self.is_floating_point() and at["step"]:
                reads.append((at["step"], at["inside"], name))
            return original(self, *args, **kwargs)
        return read

    monkeypatch.setattr(loop, "train_step", tracked)
    for name in ("item", "tolist", "__float__", "__bool__"):
        monkeypatch.setattr(torch.Tensor, name, spy(name))
    reductions: list[int] = []
    means = Strategy.means_over_replicas
    monkeypatch.setattr(Strategy, "means_over_replicas",
                        lambda self, values: reductions.append(at["step"]) or means(self, values))
    summary = train_here([*without(TINY, "--log-every"), "--log-every", "4",
                          "--checkpoint-every", "0", "--device", "cpu",
                          "--output-dir", str(tmp_path)])
    assert [r["step"] for r in records(tmp_path)] == list(range(1, 9))
    assert not [r for r in reads if r[1]], reads  # nothing read inside a step
    assert sorted({step for step, _, _ in reads}) == [1, 4, 8], reads
    assert reductions == [1, 4, 8]
    assert summary["final_loss"] == losses(tmp_path)[8]


@pytest.mark.parametrize("grads, max_norm, expected_norm, expected", [
    ([[3.0, 4.0]], 1.0, 5.0, [[0.6, 0.8]]),  # clipped: scaled by 1 / (5 + 1e-6)
    ([[0.3, 0.4]], 1.0, 0.5, [[0.3, 0.4]]),  # under max_norm: unchanged
    ([[3.0, 4.0]], 0.0, 5.0, [[3.0, 4.0]]),  # 0: measure only
    ([[float("nan"), 1.0], [2.0, 0.0]], 1.0, float("nan"), [[float("nan"), 1.0], [2.0, 0.0]]),
    ([[float("inf"), 1.0], [2.0, 0.0]], 1.0, float("inf"), [[float("nan"), 0.0], [0.0, 0.0]]),
], ids=["clipped", "under", "measure-only", "nan", "inf"])
def test_clipping_on_the_device_keeps_the_host_rule(grads, max_norm, expected_norm, expected):
    """Strategy.clip_grads returns the norm as a tensor and scales only above max_norm, as the
    host comparison did: a NaN norm leaves the gradients as they are, an infinite one scales
    them by 0 (the infinite entry becomes NaN)."""
    model = torch.nn.ParameterList(torch.nn.Parameter(torch.zeros(len(g))) for g in grads)
    for param, grad in zip(model, grads, strict=True):
        param.grad = torch.tensor(grad)
    norm = Strategy(model, dp_rank=0, dp_size=1).clip_grads(max_norm)
    assert isinstance(norm, torch.Tensor) and norm.dim() == 0
    torch.testing.assert_close(norm, torch.tensor(expected_norm), equal_nan=True)
    for param, want in zip(model, expected, strict=True):
        torch.testing.assert_close(param.grad, torch.tensor(want), equal_nan=True)
