"""The search space of ``trainers.tune`` (``trainers.tune.search_space``) and the search's
table, best trial and printed command (``trainers.tune``), in this process without Ray. The
one-line refusals of bad searches are rows of tests/integration/test_bad_input_commands.py."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from trainers.config.parsing import without_option
from trainers.errors import ConfigError
from trainers.tune.search import (
    TrialRow,
    best_command,
    best_row,
    parse_args,
    table,
    trial_args,
)
from trainers.tune.search_space import (
    Axis,
    grid_size,
    parse_axis,
    parse_space,
)

TRIAL = ["--model", "tiny", "--steps", "20", "--eval-every", "5"]


@pytest.mark.parametrize("expr, axis", [
    ("lr=loguniform:1e-4:1e-2", Axis("lr", "loguniform", ("1e-4", "1e-2"))),
    ("--lr=uniform:0:0.5", Axis("lr", "uniform", ("0", "0.5"))),
    ("warmup-steps=randint:0:10", Axis("warmup-steps", "randint", ("0", "10"))),
    ("batch-size=choice:8, 16", Axis("batch-size", "choice", ("8", "16"))),
    ("dtype=grid:fp32,bf16", Axis("dtype", "grid", ("fp32", "bf16"))),
])
def test_expressions_parse(expr, axis):
    assert parse_axis(expr) == axis
    assert parse_axis(axis.text()) == axis


def test_draws_reach_the_trainer_as_it_parses_them():
    """Ranges of floats are checked (and passed) as floats, randint as integers, lists as
    given."""
    assert parse_axis("batch-size=uniform:8:16").extremes() == ["8.0", "16.0"]
    assert parse_axis("warmup-steps=randint:0:10").extremes() == ["0", "10"]
    assert parse_axis("dtype=choice:fp32,bf16").extremes() == ["fp32", "bf16"]
    axes = parse_space(["lr=loguniform:1e-4:1e-2", "warmup-steps=randint:0:10"])
    assert trial_args(axes, {"lr": 0.00123, "warmup-steps": 7.0}) == [
        "--lr", "0.00123", "--warmup-steps", "7"]


def test_grids_multiply_the_trials():
    assert grid_size(parse_space(["lr=choice:1,2,3"])) == 1
    assert grid_size(parse_space(["lr=grid:1,2,3", "dtype=grid:fp32,bf16"])) == 6


def test_an_option_searched_twice_is_refused():
    with pytest.raises(ConfigError, match="--search lr is given twice"):
        parse_space(["lr=choice:1e-3", "--lr=choice:1e-2"])


def test_the_fixed_output_dir_is_the_search_directory_not_a_trial_option(tmp_path):
    args = ["--a", "1", "--output-dir", "x", "--output-dir=y", "--b"]
    assert without_option(args, "--output-dir") == ["--a", "1", "--b"]
    search = parse_args(["--trainer", "ddp", "--workers", "1", "--search", "lr=grid:1e-3,1e-2",
                         "--", *TRIAL, "--output-dir", str(tmp_path / "s")])
    assert search.directory == tmp_path / "s" and search.trainer_args == TRIAL
    assert (search.grace_period, search.max_steps, search.options.trials) == (5, 20, 4)


def _row(trial: str, lr: str, steps: int, loss: float, outcome: str = "completed") -> TrialRow:
    return TrialRow(trial, {"lr": lr}, steps, loss, outcome, Path(trial) / "run")


def test_the_best_trial_is_the_lowest_last_eval_loss_and_its_command_trains_it(tmp_path):
    search = parse_args(["--trainer", "fsdp", "--workers", "2", "--search", "lr=grid:1e-3,3",
                         "--", *TRIAL, "--batch-size", "16", "--output-dir", str(tmp_path)])
    rows = [_row("a", "1e-3", 20, 4.1), _row("b", "3", 5, math.inf, "stopped by ASHA at step 5"),
            _row("c", "3e-3", 20, 3.9), _row("d", "1e-2", 0, math.nan, "failed: oops")]
    assert best_row(rows).trial == "c"
    assert best_row([rows[3]]) is None
    assert best_command(search, rows[2]) == (
        "torchx run -s local_cwd components/fsdp.py:fsdp -j 1x2 -- --model tiny --steps 20 "
        f"--eval-every 5 --batch-size 16 --lr 3e-3 --output-dir {tmp_path / 'best'}")
    lines = table(rows, search.axes).splitlines()
    assert lines[0] == "| trial | lr | steps | eval loss | outcome |"
    assert lines[3] == "| b | 3 | 5 | inf | stopped by ASHA at step 5 |"
