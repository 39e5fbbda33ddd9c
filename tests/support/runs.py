"""Running trainers and TorchX as the tests do, and reading and comparing what runs wrote."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from tests.support.processes import REPO, child_env, run_forked, torchrun
from trainers.config.parsing import without_option
from trainers.runs.checkpoint_files import find_checkpoints

__all__ = ["REPO", "child_env"]

# Small, fast settings for the tiny model; tests add or override flags.
TINY = ["--model", "tiny", "--batch-size", "8", "--steps", "8", "--warmup-steps", "2",
        "--eval-every", "0", "--tensorboard", "false", "--log-every", "1",
        "--peak-tflops", "1", "--train-samples", "256", "--resume", "none"]


def run_trainer(args: list[str], nproc: int = 1, module: str = "trainers.ddp",
                check: bool = True, launcher: str = "forked", env: dict[str, str] | None = None,
                timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python -m module args`` (nproc 1) or its ``nproc`` ranks on one node: forked from the
    preloaded process (:func:`tests.support.processes.run_forked`, for tests of numbers), or
    with ``launcher="torchrun"`` under the real ``torchrun --nproc_per_node`` (for tests of
    launching: restarts, signals, torchrun's summary; each rank's output is prefixed with its
    rank there). With ``check`` a failure raises with each rank's output."""
    if launcher == "forked":
        return run_forked(module, args, nproc, env=env, timeout=timeout, check=check)
    return torchrun(module, args, nproc, env=env).wait(timeout, check=check)


def torchx_cli(*args: str, cwd: Path = REPO, env: dict[str, str] | None = None,
               timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python -m torchx.cli.main <args>`` in ``cwd`` with the tests' environment plus ``env``,
    forked from the preloaded process (a process each time: TorchX's CLI keeps global argument
    state). The jobs it runs are launched for real (torchrun, on local_cwd)."""
    return run_forked("torchx.cli.main", args, cwd=cwd, env=env, timeout=timeout, check=False)


# ``args`` less the given options and their values (the tests' short name).
without = without_option


def losses(run_dir: Path) -> dict[int, float]:
    """Per-step training loss from a run's metrics.jsonl."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records}


def assert_close(actual: dict[int, float], expected: dict[int, float], rel: float = 1e-5) -> None:
    """Same steps, and each loss within ``rel`` (relative) of the expected one."""
    assert actual.keys() == expected.keys(), (sorted(actual), sorted(expected))
    for step in expected:
        diff = abs(actual[step] - expected[step]) / abs(expected[step])
        assert diff <= rel, f"step {step}: {actual[step]} vs {expected[step]} (rel {diff:.2e})"


def final_weights(run_dir: Path, tmp_path: Path) -> dict[str, torch.Tensor]:
    """The model tensors of the run's newest checkpoint, gathered into plain tensors."""
    out = tmp_path / f"{run_dir.name}.pt"
    dcp_to_torch_save(find_checkpoints(run_dir / "checkpoints")[0], out)
    state = torch.load(out, weights_only=False)["train"]["model"]
    return {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in state.items()}


def assert_same_run(faulted: Path, reference: Path, tmp_path: Path) -> None:
    """A restarted run ended where the uninterrupted one did: losses and final weights within
    1e-6 relative."""
    ref_losses, got_losses = losses(reference), losses(faulted)
    assert got_losses.keys() == ref_losses.keys()
    for step, loss in ref_losses.items():
        assert abs(got_losses[step] - loss) <= 1e-6 * abs(loss), (step, got_losses[step], loss)
    ref_w, got_w = final_weights(reference, tmp_path), final_weights(faulted, tmp_path)
    assert ref_w.keys() == got_w.keys()
    for name, tensor in ref_w.items():
        diff = (got_w[name] - tensor).abs().max() / tensor.abs().max().clamp_min(1e-12)
        assert diff <= 1e-6, (name, float(diff))


def one_line_error(capsys: Any, module: Any, *argv: str) -> str:
    """What ``module.main(argv)`` writes to stderr when it exits 2, asserting it is one line."""
    import pytest

    with pytest.raises(SystemExit) as exit_info:
        module.main([*argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err
