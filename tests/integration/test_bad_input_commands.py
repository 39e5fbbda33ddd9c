"""Every ``python -m trainers.*`` command besides the trainers (tools.prepare_data,
tools.train_tokenizer, tools.sample, tools.export, tools.plot, planning.plan, planning.memory,
on_ray.train, tune, scaling) given wrong input, as a new user
would: each is refused with exit 2, no output and one ``trainers.X: error: ...`` line that
names the fix, without a traceback, and nothing in its directory is written, truncated or
removed (existing outputs included).

Each row runs in a directory of its own holding the inputs below (:func:`_inputs`); the rows'
processes run a few at a time, started once for the module (:func:`refusals`), since each is a
fresh interpreter refusing in well under a second.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.processes import run_command, run_forked
from tests.support.runs import child_env

# The words by which an error line of ours names its fix (argparse's own lines name the option).
FIX = re.compile(r"\b(pass|drop|pick|run it with|did you mean)\b|e\.g\.")


@dataclass(frozen=True)
class Row:
    """``python -m trainers.<module> *args``, run in the row's directory, whose one error line
    holds ``fragment``; ``fix``: the line is one of ours and
    names the fix (argparse's are not)."""

    module: str
    args: tuple[str, ...]
    fragment: str
    fix: bool = True

    @property
    def id(self) -> str:
        return f"{self.module}:{' '.join(self.args) or '(none)'}"


def rows(module: str, *cases: tuple) -> list[Row]:
    return [Row(module, tuple(args.split()) if isinstance(args, str) else args, *rest)
            for args, *rest in cases]


UNWRITABLE = "/proc/trainers-test/out"  # under a kernel file system: refused even for root

ROWS = [
    *rows("tools.prepare_data",
          ("", "the following arguments are required: source, target", False),
          ("nosuch.txt out.bin", "source nosuch.txt: no such file or directory"),
          ("text.txt .", "target . is a directory; pass the path of a file"),
          ("text.txt run", "target run is a directory"),
          ("text.txt afile/out.bin", "afile cannot be written (not a directory); pass a writable"),
          (f"text.txt {UNWRITABLE}.bin", "/proc cannot be written (a proc file system)"),
          ("text.txt text.txt", "target text.txt is also an input, which writing it would destroy"),
          ("empty.txt out.bin", "empty.txt is empty: no text to tokenize; pass non-empty files"),
          ("text.txt new.bin --tokenizer nosuch.json", "--tokenizer nosuch.json: no such file"),
          ("text.txt new.bin --tokenizer text.txt", "--tokenizer text.txt does not load"),
          ("text.txt new.bin --bogus", "unrecognized arguments: --bogus; pass only options"),
          ("text.txt new.bin --tok bytes", "unrecognized arguments: --tok bytes; did you mean "
           "--tokenizer? (`python -m trainers.tools.prepare_data --help` lists the options)")),
    *rows("tools.train_tokenizer",
          ("text.txt --output tok.json", "the following arguments are required: --vocab-size",
           False),
          ("text.txt --vocab-size x --output tok.json", "invalid int value: 'x'", False),
          ("text.txt --vocab-size 0 --output tok.json", "--vocab-size 0 cannot hold the 256"),
          ("text.txt --vocab-size -5 --output tok.json", "--vocab-size -5 cannot hold the 256"),
          ("text.txt --vocab-size 100 --output tok.json",
           "--vocab-size 100 cannot hold the 256 byte symbols and <|endoftext|>; pass "
           "--vocab-size 257 or more"),
          ("text.txt --vocab-size 5000000000 --output tok.json",
           "--vocab-size 5000000000: the trainer would allocate about 70 bytes per id"),
          ("nosuch.txt --vocab-size 300 --output tok.json", "corpus nosuch.txt: no such file"),
          ("text.txt --vocab-size 300 --output .", "--output . is a directory"),
          ("text.txt --vocab-size 300 --output afile/tok.json", "afile cannot be written"),
          (f"text.txt --vocab-size 300 --output {UNWRITABLE}.json", "/proc cannot be written"),
          ("text.txt --vocab-size 300 --output text.txt", "--output text.txt is also an input"),
          ("empty.txt --vocab-size 300 --output tok.json", "empty.txt is empty")),
    *rows("tools.sample",
          ("run", "the following arguments are required: --prompt", False),
          ("nosuch --prompt a", "nosuch: no checkpoint there (no such directory)"),
          ("afile --prompt a", "afile: no checkpoint there (not a directory)"),
          ("run --prompt a --tokens x", "argument --tokens: invalid int value: 'x'", False),
          ("run --prompt a --tokens 0", "--tokens must be positive, got 0; pass 1 or more"),
          ("run --prompt a --temperature -1", "--temperature must be >= 0, got -1; pass 0"),
          ("run --prompt a --temperature nan", "--temperature must be >= 0, got nan"),
          ("run --prompt a --top-k -2", "--top-k must be >= 0, got -2"),
          (("run", "--prompt", ""), "--prompt is empty; pass at least one character")),
    *rows("tools.export",
          ("run", "the following arguments are required: out", False),
          ("nosuch hf", "nosuch: no checkpoint there (no such directory)"),
          ("run afile", "afile already exists and is not an empty directory; pass a new"),
          ("run logged", "logged already exists and is not an empty directory"),
          (f"run {UNWRITABLE}", "/proc cannot be written (a proc file system)")),
    *rows("tools.plot",
          ("", "the following arguments are required: RUN", False),
          ("nosuch", "nosuch holds no metrics.jsonl; pass a run directory"),
          ("run", "run holds no metrics.jsonl"),
          ("unlogged", "unlogged/metrics.jsonl holds no step's metrics; pass a run that has"),
          ("logged -o plot.txt", "--output plot.txt: matplotlib writes no .txt files; pass a .png"),
          ("logged -o run", "--output run is a directory"),
          (f"logged -o {UNWRITABLE}.png", "/proc cannot be written")),
    *rows("planning.plan",
          ("--model nosuch", "--model nosuch: not a built-in size"),
          ("--nodes 0", "--nodes must be positive, got 0; pass a positive one"),
          ("--device-memory-gb nan", "--device-memory-gb must be positive, got nan"),
          ("--layers -1", "--layers must be positive, got -1; pass a positive one or drop it"),
          ("--seq-len 99999", "--seq-len must be in 1..2048, got 99999; pass one in that range"),
          ("--gpu-type h100 --device cpu", "--gpu-type describes GPUs; drop it"),
          ("--gpu-type nope", "argument --gpu-type: invalid choice: 'nope'", False),
          ("--global-batch x", "argument --global-batch: invalid int value", False)),
    *rows("planning.memory",
          ("--model nosuch", "--model nosuch: not a built-in size"),
          ("--devices 0", "--devices must be positive, got 0; pass a positive one"),
          ("--seq-len -3", "--seq-len must be in 1..2048, got -3"),
          ("--dtype fp8", "argument --dtype: invalid choice: 'fp8'", False)),
    *rows("on_ray.train",
          ("", "the following arguments are required: --trainer, --workers", False),
          ("--trainer zero --workers 2", "--trainer zero is not a trainer; pass ddp or fsdp"),
          ("--trainer model_parallel --workers 2", "cannot run under Ray Train"),
          ("--trainer ddp --workers 0", "--workers must be positive, got 0; pass 1 or more"),
          ("--trainer ddp --workers 2 --cpus-per-worker 0", "--cpus-per-worker must be positive"),
          ("--trainer ddp --workers 2 --cpus-per-worker nan", "--cpus-per-worker must be positive"),
          ("--trainer ddp --workers 2 --address nohost", "--address nohost: expected HOST:PORT"),
          ("--trainer ddp --workers 2 --address auto --num-cpus 2", "--num-cpus sizes the local"),
          (f"--trainer ddp --workers 2 -- --output-dir {UNWRITABLE}", "/proc cannot be written"),
          ("--trainer ddp --workers 2 -- --output-dir s3://runs/x",
           "--output-dir s3://runs/x: Ray Train keeps its experiment directory on a file system"),
          ("--trainer ddp --workers 2 -- --bogus", "unrecognized arguments: --bogus")),
    *rows("tune",
          ("--trainer ddp --workers 1", "nothing to search; pass --search OPTION=KIND:ARGS"),
          ("--trainer ddp --workers 1 --search lr",
           "--search lr: not OPTION=KIND:ARGS; write e.g."),
          ("--trainer ddp --workers 1 --search lr=logspace:1:2", "unknown kind 'logspace'; pass"),
          ("--trainer ddp --workers 1 --search lr=loguniform:0:1e-2",
           "loguniform needs 0 < LO; pass uniform"),
          ("--trainer ddp --workers 1 --search lr=uniform:1e-2:1e-4",
           "the range must be finite with LO < HI; pass lr=uniform:LO:HI"),
          ("--trainer ddp --workers 1 --search lr=loguniform:x:1", "'x' is not a number; write"),
          ("--trainer ddp --workers 1 --search pp=choice:1,2",
           "--search pp=choice:1,2: --pp 2: --pp is not served by trainers.ddp; use "),
          ("--trainer ddp --workers 1 --search lrr=choice:1,2",
           "--search lrr=choice:1,2: python -m trainers.ddp has no --lrr; pick one of its"),
          ("--trainer ddp --workers 1 --search batch-size=uniform:8:16",
           "--batch-size 8.0: argument --batch-size: invalid int value: '8.0'; a uniform range "
           "draws floats: search it with e.g. batch-size=randint:LO:HI"),
          ("--trainer ddp --workers 1 --search lr=choice:1e-3,1e-2 -- --lr 1e-3",
           "--lr is also fixed after --; drop one of them"),
          ("--trainer ddp --workers 1 --search output-dir=choice:a,b",
           "--output-dir is set by trainers.tune for each trial; pick another option to search"),
          ("--trainer ddp --workers 1 --search lr=choice:1e-3 -- --eval-every 0",
           "--eval-every 0: a search ranks its trials by their eval loss; pass --eval-every K"),
          ("--trainer ddp --workers 1 --search lr=choice:1e-3 --trials 0",
           "--trials must be positive, got 0; pass 1 or more"),
          ("--trainer model_parallel --workers 2 --search lr=choice:1e-3",
           "cannot run under Ray Train")),
    *rows("scaling",
          ("--nproc 1", "1 process is the baseline: pass --nproc 2 (or more), or --nodes 2"),
          ("--steps 5", "--steps 5 leaves no timed steps besides 3 warm-up, the profiler's "
           "warm-up and 5 profiled ones; pass --steps 11 or more"),
          ("--profile-steps 0", "--profile-steps must be positive, got 0; pass e.g. 5"),
          ("--nodes 2", "--nodes 2: pass --rdzv-endpoint HOST:PORT of node 0"),
          ("--nodes 2 --node-rank 2 --rdzv-endpoint h:1", "a --node-rank below it"),
          ("--trainer pipeline", "argument --trainer: invalid choice: 'pipeline'", False),
          ("-- --steps 4", "--steps is set by trainers.scaling for each run; pass "
           "trainers.scaling's own --steps"),
          ("-- --output-dir=x", "--output-dir is set by trainers.scaling for each run"),
          ("-- --batch-size 3", "--batch-size 3 is not divisible by --grad-accum 1 x "
           "data-parallel size 2; pass a multiple of 2"),
          ("-- --tp 2", "--tp is not served by trainers.ddp; use trainers.tensor_parallel"),
          (f"--output-dir {UNWRITABLE}", "the 1 process run cannot run: --output-dir "
           f"{UNWRITABLE}/nproc1: /proc cannot be written"),
          ("-- --bogus", "unrecognized arguments: --bogus")),
]


def _inputs(directory: Path) -> None:
    """What every row's directory holds: a text, an empty text, a plain file, an empty run
    directory, a run directory with metrics only and one with no step's metrics, and outputs
    that exist already."""
    (directory / "text.txt").write_text("Some text to tokenize.\n" * 4)
    (directory / "empty.txt").write_text("")
    (directory / "afile").write_text("not a directory\n")
    (directory / "run").mkdir()
    (directory / "logged").mkdir()
    (directory / "logged" / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 5.0})
                                                        + "\n")
    (directory / "unlogged").mkdir()
    (directory / "unlogged" / "metrics.jsonl").write_text('{"loss": 5.0}\n{"ste')
    (directory / "out.bin").write_bytes(b"an existing output")
    (directory / "tok.json").write_text("{}")


def _snapshot(directory: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every path under ``directory``: its mode, modification time and contents (files)."""
    return {str(p.relative_to(directory)): (p.stat().st_mode, p.stat().st_mtime_ns,
                                            p.read_bytes() if p.is_file() else b"")
            for p in sorted(directory.rglob("*"))}


@dataclass(frozen=True)
class Refusal:
    proc: subprocess.CompletedProcess[str]
    before: dict[str, tuple[int, int, bytes]]
    after: dict[str, tuple[int, int, bytes]]


@pytest.fixture(scope="module")
def refusals(tmp_path_factory) -> dict[str, Refusal]:
    """Each row's run, by row id: started a few at a time, each in a directory of its own.
    The directories are made here, before the threads: pytest's temporary-directory factory
    makes its base directory on first use and is not safe to call from several threads."""
    env = child_env()
    directories = [tmp_path_factory.mktemp("row") for _ in ROWS]

    def run(row: Row, directory: Path) -> Refusal:
        _inputs(directory)
        before = _snapshot(directory)
        proc = run_forked(f"trainers.{row.module}", row.args, cwd=directory, env=env,
                          timeout=120, check=False)
        return Refusal(proc, before, _snapshot(directory))

    with ThreadPoolExecutor(4) as pool:
        return dict(zip([row.id for row in ROWS], pool.map(run, ROWS, directories), strict=True))


@pytest.mark.parametrize("row", ROWS, ids=[row.id for row in ROWS])
def test_bad_input_is_refused_in_one_line_and_nothing_is_written(refusals, row):
    refusal = refusals[row.id]
    proc = refusal.proc
    report = f"exit {proc.returncode}\nstdout: {proc.stdout[-2000:]}\nstderr: {proc.stderr[-3000:]}"
    assert proc.returncode == 2, report
    assert "Traceback" not in proc.stderr and proc.stdout == "", report
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"trainers.{row.module}: error: "), report
    assert row.fragment in lines[0], report
    if row.fix:
        assert FIX.search(lines[0]), f"names no fix: {lines[0]}"
    assert refusal.after == refusal.before, "the refused command changed its directory"


@pytest.mark.parametrize("module", sorted({row.module for row in ROWS}))
def test_help_is_printed_and_exits_0(module):
    proc = run_command([sys.executable, "-m", f"trainers.{module}", "--help"], timeout=120)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr[-3000:]
    assert proc.stdout.startswith("usage: "), proc.stdout[:500]
