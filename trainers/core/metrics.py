"""Run metrics: the per-step line, metrics.jsonl, the trackers (TensorBoard, MLflow, W&B:
:mod:`trainers.core.trackers`), summary.json, MFU.

Only rank 0 writes. On an object store (``--output-dir s3://...``) the appended files and a
``console.log`` of the printed lines go through a :class:`trainers.runs.mirror.Mirror`:
written locally, copied to the run's URL at every checkpoint (:meth:`MetricsWriter.sync`) and
at :meth:`MetricsWriter.close`. Peak memory is CUDA's max allocated bytes on GPUs and the
process's peak resident set size on the CPU. MFU divides achieved FLOP/s by a peak the user sets
(``--peak-tflops``) or, by default, by a short matmul probe on this device in the run's dtype.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import resource
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from trainers.core.trackers import IDS_FILE, PLOT_TRACKERS, Guarded, open_trackers
from trainers.runs.mirror import Mirror
from trainers.runs.run_plot import load_run, render
from trainers.runs.run_record import read_config
from trainers.runs.storage import RunPath, write_bytes_atomic

CONSOLE_LOG = "console.log"


def peak_memory_bytes(device: torch.device) -> int:
    """Peak bytes this process held so far on ``device``."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def bf16_matmul_hardware(device: torch.device) -> str | None:
    """What multiplies bf16 matrices natively on ``device`` (AMX or AVX512-BF16 on a CPU, an
    Ampere or newer GPU), or None: bf16 is then converted in software and slower than fp32."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device) if torch.cuda.is_bf16_supported(False) else None
    flags: set[str] = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    return next((name for flag, name in (("amx_bf16", "AMX"), ("avx512_bf16", "AVX512-BF16"))
                 if flag in flags), None)


def measure_peak_flops(device: torch.device, dtype: torch.dtype, seconds: float = 0.3,
                       size: int | None = None) -> float:
    """FLOP/s of a ``size`` x ``size`` matmul (default 4096 on CUDA, 1024 on the CPU) on
    ``device`` at the current thread count: the best of the calls made within ``seconds``
    after one warm-up call."""
    size = size or (4096 if device.type == "cuda" else 1024)
    gen = torch.Generator(device=device).manual_seed(0)  # leaves the global RNG untouched
    a, b = (torch.randn(size, size, device=device, dtype=dtype, generator=gen) for _ in "ab")
    best = math.inf
    deadline = time.perf_counter() + seconds
    for i in range(100):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        torch.mm(a, b)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - start
        if i > 0:  # the first call warms up
            best = min(best, elapsed)
            if time.perf_counter() > deadline:
                break
    return 2 * size**3 / best


def _human_bytes(value: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.1f}{unit}"
        value /= 1024
    return f"{value:.1f}TiB"


def _clock(seconds: float) -> str:
    """``seconds`` as H:MM:SS."""
    return str(datetime.timedelta(seconds=round(seconds)))


def format_line(step: int, total: int, m: dict[str, Any], elapsed_s: float,
                eta_s: float) -> str:
    """``step | loss [| eval] | grad_norm | lr | tok/s | mfu | mem | data | elapsed, ETA`` in
    one line; the eval loss on the steps that evaluate."""
    evaluated = f" | eval {m['eval_loss']:.4f}" if "eval_loss" in m else ""
    return (f"step {step:>{len(str(total))}}/{total} | loss {m['loss']:.4f}{evaluated} | "
            f"grad_norm {m['grad_norm']:.3f} | lr {m['lr']:.2e} | "
            f"tok/s {m['tokens_per_s']:,.0f} | mfu {100 * m['mfu']:.1f}% | "
            f"mem {_human_bytes(m['peak_memory_bytes'])} | data {100 * m['data_share']:.1f}% | "
            f"{_clock(elapsed_s)} elapsed, ETA {_clock(eta_s)}")


class MetricsWriter:
    """Rank 0's sink for per-step metrics; a no-op on other ranks.

    A run resumed at ``start_step`` keeps the metrics.jsonl records up to that step and drops
    those of steps it will train again, so the file holds each step once (rewritten at the
    first step written: a run that stops before a step leaves it as it was); ``steps_redone``
    counts the dropped steps (the work a restart lost, as far as it was recorded: the loop
    writes steps at its flush points, :mod:`trainers.core.loop`, always before a checkpoint or
    an injected fault, so a crash elsewhere leaves the steps since the last flush uncounted).
    :meth:`write` is called for every step, in order, in bursts at those points. On a
    terminal (``stdout`` a TTY) and given ``total_steps``, a tqdm progress bar with the loss,
    elapsed time and ETA runs below the printed lines; in a log (not a TTY) there are only the
    lines. A run on an object store also keeps the printed lines in ``console.log`` (its pods'
    logs go with them).

    ``trackers`` (names from :data:`trainers.options.tracker_names.TRACKERS`) get every
    step's metrics as metrics.jsonl does, the run's config.json options as parameters, its
    directory and git commit as tags, and the summary (:meth:`log_summary`).
    """

    def __init__(self, run_dir: RunPath, enabled: bool, trackers: Sequence[str],
                 start_step: int = 0, total_steps: int | None = None) -> None:
        self.enabled = enabled
        self.steps_redone = 0
        self._jsonl = None
        self._kept: list[str] = []
        self._jsonl_path: Path | None = None
        self._console = None
        self._trackers: list[Guarded] = []
        self._bar = None
        self._mirror: Mirror | None = None
        if not enabled:
            return
        self._mirror = Mirror(run_dir, resumed=("metrics.jsonl", CONSOLE_LOG, IDS_FILE))
        local = self._mirror.local
        if self._mirror.remote:
            self._console = open(local / CONSOLE_LOG, "a", buffering=1)  # noqa: SIM115
        if total_steps is not None and sys.stdout.isatty() and start_step < total_steps:
            from tqdm import tqdm

            self._bar = tqdm(total=total_steps, initial=start_step, unit="step",
                             dynamic_ncols=True, file=sys.stdout)
        path = local / "metrics.jsonl"
        records = path.read_text().splitlines() if path.exists() else []
        self._kept = [line for line in records if _step_of_record(line) <= start_step]
        self._jsonl_path = path
        self.steps_redone = max([_step_of_record(line) for line in records] + [start_step]) \
            - start_step
        record = read_config(run_dir)
        tags = {"run_dir": str(run_dir),
                "git_commit": str(((record or {}).get("git") or {}).get("commit"))}
        self._trackers = open_trackers(trackers, local, record, run_dir.name, tags,
                                       self.print)

    def write(self, step: int, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        if self._jsonl is None:  # the records of the steps trained again go now
            self._jsonl_path.write_text("".join(line + "\n" for line in self._kept))
            self._jsonl = open(self._jsonl_path, "a", buffering=1)  # noqa: SIM115 (close())
        self._jsonl.write(json.dumps({"step": step, **metrics}) + "\n")
        if self._bar is not None:
            self._bar.set_postfix(loss=f"{metrics['loss']:.4f}", refresh=False)
            self._bar.update(1)
        for tracker in self._trackers:
            tracker.call("log_metrics", step, metrics)

    def log_summary(self, summary: dict[str, Any]) -> None:
        """Give the trackers the run's summary (summary.json) as final metrics, and those that
        keep files (:data:`~trainers.core.trackers.PLOT_TRACKERS`) the run's plot, drawn into
        ``plot.png`` of the run directory (when matplotlib is installed: ``.[plot]``)."""
        for tracker in self._trackers:
            tracker.call("log_summary", summary)
        keep_plot = [t for t in self._trackers if t.name in PLOT_TRACKERS and t.tracker]
        if not keep_plot or self._mirror is None:
            return
        try:
            image = render([load_run(self._mirror.local)])
        except ImportError:
            self.print("note: the trackers get no plot: matplotlib is not installed (pip "
                       "install -e '.[plot]')")
            return
        plot = self._mirror.local / "plot.png"
        plot.write_bytes(image)
        for tracker in keep_plot:
            tracker.call("log_plot", plot)

    def print(self, line: str) -> None:
        if self._bar is not None:
            self._bar.write(line, file=sys.stdout)
        elif self.enabled:
            print(line, file=sys.stdout, flush=True)
        if self._console is not None:
            self._console.write(line + "\n")

    def sync(self) -> None:
        """Make what was written so far durable in the run directory: on an object store, copy
        the changed files to it (the loop calls this after every checkpoint)."""
        if self._mirror is None:
            return
        for tracker in self._trackers:
            tracker.call("flush")
        self._mirror.sync()

    def close(self) -> None:
        """Close the files and sync them a last time."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        for tracker in self._trackers:
            tracker.call("close")
        self._trackers = []
        for sink in (self._jsonl, self._console):
            if sink is not None:
                sink.close()
        self._jsonl = self._console = None
        if self._mirror is not None:
            self._mirror.close()
            self._mirror = None


def _step_of_record(line: str) -> float:
    """The step of a metrics.jsonl line; infinity for a line cut short by a crash."""
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return math.inf


def write_summary(run_dir: RunPath, summary: dict[str, Any]) -> None:
    """Write ``summary.json`` atomically."""
    write_bytes_atomic(run_dir / "summary.json", (json.dumps(summary, indent=2) + "\n").encode())
