"""python -m trainers.tools.plot draws real runs' files: two ddp runs that differ in --lr, and a
pipeline run's timeline."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.support.runs import TINY, run_trainer
from trainers.errors import ConfigError
from trainers.runs import run_plot
from trainers.tools import plot

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two 4-step ddp runs (--lr 0.003 and 0.001) evaluating every 2 steps. The pipeline run
    is tests/conftest.py's ``gpipe_timeline_run`` (2 stages, 4 micro-batches)."""
    root = tmp_path_factory.mktemp("runs")
    args = [*TINY, "--steps", "4", "--eval-every", "2"]
    for name, lr in (("a", "0.003"), ("b", "0.001")):
        run_trainer([*args, "--lr", lr, "--output-dir", str(root / name)])
    return root


def _records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_runs_are_drawn_against_the_step_with_a_legend_of_their_differences(runs, tmp_path):
    loaded = [run_plot.load_run(runs / name) for name in ("a", "b")]
    assert run_plot.labels(loaded) == ["ddp --lr 0.003", "ddp --lr 0.001"]
    fig = run_plot.draw(loaded)
    axes = fig.get_axes()
    assert [ax.get_ylabel() for ax in axes] == [p[1] for p in run_plot.PANELS]
    loss = axes[0]
    train_a, eval_a, train_b, _ = loss.get_lines()
    assert list(train_a.get_xdata()) == [1, 2, 3, 4]
    assert list(train_a.get_ydata()) == [r["loss"] for r in _records(runs / "a")]
    assert list(eval_a.get_xdata()) == [2, 4]
    assert list(train_b.get_ydata()) == [r["loss"] for r in _records(runs / "b")]
    assert [t.get_text() for t in loss.get_legend().get_texts()] == run_plot.labels(loaded)
    memory = axes[3].get_lines()[0]
    assert list(memory.get_ydata()) == [r["peak_memory_bytes"] / 2**30
                                        for r in _records(runs / "a")]

    out = plot.main([str(runs / "a"), str(runs / "b"), "-o", str(tmp_path / "two.png")])
    assert out.read_bytes()[:8] == PNG_SIGNATURE and out.stat().st_size > 10_000
    assert plot.main([str(runs / "a")]) == runs / "a" / "plot.png"
    assert run_plot.labels([loaded[0]]) == ["ddp --model tiny"]
    shutil.copytree(runs / "a", tmp_path / "a-again")
    alike = [loaded[0], run_plot.load_run(tmp_path / "a-again")]
    assert run_plot.labels(alike) == ["ddp (a)", "ddp (a-again)"]


@pytest.mark.slow
def test_a_pipeline_runs_timeline_is_drawn(gpipe_timeline_run, tmp_path):
    run = run_plot.load_run(gpipe_timeline_run)
    assert {i["stage"] for i in run.timeline} == {0, 1}
    assert sorted((i["kind"], i["microbatch"], i["stage"]) for i in run.timeline) == sorted(
        (kind, m, s) for kind in "FB" for m in range(4) for s in range(2))
    fig = run_plot.draw([run])
    timeline = fig.get_axes()[-1]
    assert len(timeline.patches) == len(run.timeline) == 16
    assert [t.get_text() for t in timeline.get_yticklabels()] == ["stage 0", "stage 1"]
    out = plot.main([str(gpipe_timeline_run), "-o", str(tmp_path / "pipe.png")])
    assert out.read_bytes()[:8] == PNG_SIGNATURE


def test_a_directory_without_metrics_is_refused_in_one_line(tmp_path, capsys):
    with pytest.raises(ConfigError, match="holds no metrics.jsonl; pass a run directory"):
        run_plot.load_run(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        plot.main([str(tmp_path)])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().startswith("trainers.tools.plot: error: ")
