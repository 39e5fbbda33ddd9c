"""config.json's record of a run, the options a resume changed, the LR schedule's rule for a
resume with more --steps, and the console: its line and the progress bar on a terminal (unit
level, and one trainer run on a pseudo-terminal; tests/integration/test_checkpoint.py runs
resumes for real)."""

from __future__ import annotations

import fcntl
import io
import json
import os
import pty
import re
import struct
import sys
import termios

import pytest

from tests.support.processes import start
from tests.support.runs import REPO, TINY
from trainers.core.loop import lr_factor
from trainers.core.metrics import MetricsWriter, format_line
from trainers.options.train_config import TrainConfig
from trainers.runs.run_record import (
    changed_options,
    git_state,
    read_config,
    run_record,
    write_config,
)


def test_changed_options_lists_every_difference_but_where_an_attempt_writes():
    saved = TrainConfig(steps=120, output_dir="a", resume="auto").to_dict()
    now = TrainConfig(steps=160, lr=1e-3, output_dir="b", resume="a/checkpoints").to_dict()
    assert changed_options(saved, now) == ["--steps 120 -> 160", "--lr 0.003 -> 0.001"]
    assert changed_options(saved, saved) == []


def test_the_record_names_the_command_code_and_versions(tmp_path):
    record = run_record(TrainConfig(output_dir=str(tmp_path)).to_dict(), "fsdp",
                        ["--model", "tiny"], 4)
    assert record["command"] == ["python", "-m", "trainers.fsdp", "--model", "tiny"]
    assert record["world_size"] == 4 and record["options"]["model"] == "tiny"
    assert re.fullmatch(r"[0-9a-f]{40}", record["git"]["commit"])
    assert isinstance(record["git"]["dirty"], bool)
    assert record["versions"]["torch"] and record["versions"]["torchx"] == "0.7.0"
    write_config(tmp_path, record)
    assert read_config(tmp_path) == record
    assert read_config(tmp_path / "elsewhere") is None


def test_git_state_outside_a_checkout_is_unknown(tmp_path):
    assert git_state(tmp_path) == {"commit": None, "dirty": None}
    assert git_state(REPO)["commit"] is not None


def test_more_steps_continue_at_the_final_rate_without_a_jump():
    """The issue's case: 120 steps, resumed with --steps 160; the rate of steps 121-160 is the
    rate of step 120, and the cosine is not reshaped before it."""
    first, extended = TrainConfig(steps=120), TrainConfig(steps=160)
    before = [lr_factor(s, first, 120) for s in range(120)]
    after = [lr_factor(s, extended, 120) for s in range(160)]
    assert after[:120] == before
    assert after[120:] == [before[-1]] * 40
    decay = after[first.warmup_steps:]
    assert all(b <= a for a, b in zip(decay, decay[1:], strict=False))
    # A schedule that ended inside its warm-up stays at its last rate too.
    assert {lr_factor(s, TrainConfig(steps=10, warmup_steps=10), 6) for s in range(5, 10)} \
        == {0.6}


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("terminal", [True, False])
def test_a_terminal_gets_a_progress_bar_and_a_log_plain_lines(tmp_path, monkeypatch, terminal):
    out = _Terminal() if terminal else io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    writer = MetricsWriter(tmp_path, True, (), start_step=2, total_steps=4)
    for step in (3, 4):
        writer.write(step, {"loss": 1.5})
        writer.print(f"line {step}")
    writer.close()
    text = out.getvalue()
    assert "line 3\n" in text and "line 4\n" in text
    assert ("4/4" in text and "loss=1.5000" in text) == terminal
    assert [json.loads(line)["step"] for line in
            (tmp_path / "metrics.jsonl").read_text().splitlines()] == [3, 4]


def _read_all(fd: int) -> bytes:
    """Everything written to the pseudo-terminal whose controller is ``fd`` until it closes."""
    out = b""
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except OSError:  # EIO: every writer closed the terminal
            return out
        if not chunk:
            return out
        out += chunk


def test_a_run_on_a_real_terminal_draws_the_bar_below_whole_lines(tmp_path):
    """The trainer with its stdout on a pseudo-terminal, as from a shell: tqdm's bar counts
    to the last step, and every step line still arrives whole, on a line of its own."""
    controller, terminal = pty.openpty()
    # 24 rows of 120 columns: a new pseudo-terminal has none, and tqdm draws no bar in 0 columns
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    args = [*TINY, "--output-dir", str(tmp_path)]  # 8 steps
    proc = start([sys.executable, "-m", "trainers.ddp", *args], stdout=terminal)
    os.close(terminal)
    text = _read_all(controller).decode()
    os.close(controller)
    proc.wait(300, check=True)
    lines = re.split(r"[\r\n]+", text)
    bar = re.compile(r"\s*\d+%\|.*\| \d/8 \[.*(step/s|s/step), loss=5\.\d{4}\]$")
    bars = [line for line in lines if bar.match(line)]
    assert bars and bars[-1].startswith("100%|"), lines
    steps = [line for line in lines if line.startswith("step ")]
    assert [int(line.split()[1].split("/")[0]) for line in steps] == list(range(1, 9)), lines
    assert all("ETA" in line for line in steps), steps


def test_the_console_line_carries_the_eval_loss_elapsed_time_and_eta():
    metrics = {"loss": 2.0, "grad_norm": 0.5, "lr": 1e-3, "tokens_per_s": 1000.0, "mfu": 0.1,
               "peak_memory_bytes": 2**20, "data_share": 0.01}
    line = format_line(50, 300, {**metrics, "eval_loss": 2.25}, 62.4, 3725.0)
    assert line.startswith("step  50/300 | loss 2.0000 | eval 2.2500 | grad_norm 0.500")
    assert line.endswith("| 0:01:02 elapsed, ETA 1:02:05")
    assert "eval" not in format_line(51, 300, metrics, 63, 3700)
