"""The one harness every benchmark runs on (docs/benchmarks.md, "The harness").

A benchmark module defines a ``Plan`` dataclass, ``QUICK`` (its fields under ``--quick``),
``run(plan, scratch)`` and ``table(report)``; optionally ``OVERRIDES`` (field -> least value or
None: a ``--field`` each), ``checks(report)``, ``draw(report, images)``, ``STRICT``, and for
``--worker`` runs ``measure`` (:func:`serve_rank`) or ``worker(prefix, args)``.
"""

import argparse
import contextlib
import dataclasses
import importlib
import json
import os
import platform
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO / "bench" / "results"
BIN = Path(sys.executable).parent  # first on PATH: this environment's torchrun and torchx
THREADS = 1
WORKER = "--worker"  # first argument of a benchmark module run as a worker


class BenchError(RuntimeError):
    """A benchmark subprocess failed or produced no usable figures."""


def progress(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def median(values: Sequence[float]) -> float:
    """The median; BenchError when nothing was measured."""
    if not values:
        raise BenchError("no measured steps; raise --steps")
    return statistics.median(values)


def rotations(names: Sequence[str], rounds: int) -> list[tuple[int, str]]:
    """``(round, name)`` for each name in each round (from 1), the order rotating each round."""
    return [(r + 1, names[(r + i) % len(names)]) for r in range(rounds)
            for i in range(len(names))]


def launch(module: str, args: Sequence[str], nproc: int = 1) -> list[str]:
    """``python -m module args``, under ``torchrun`` on a free port when ``nproc`` > 1."""
    if nproc == 1:
        return [sys.executable, "-m", module, *args]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return ["torchrun", "--nproc_per_node", str(nproc), "--master_port", str(port), "-m",
            module, *args]


def run_logged(cmd: Sequence[str], scratch: Path, tag: str, timeout_s: float) -> float:
    """Run ``cmd`` (``tag``) in the repository root (``THREADS`` threads, ``BIN`` first on PATH,
    temporary files in ``scratch``); return the wall time. ``<scratch>/<tag>.log`` gets its
    output, each line after the seconds since the start. A non-zero exit or a timeout (the
    process group is then killed) raises BenchError with the log's last lines."""
    progress(tag)
    log_path = scratch / f"{tag}.log"
    (scratch / "tmp").mkdir(exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS), "MKL_NUM_THREADS": str(THREADS),
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "TMPDIR": str(scratch / "tmp")}
    start = time.perf_counter()
    with open(log_path, "w") as log:
        log.write(f"$ {shlex.join(cmd)}\n")
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True,
                                stderr=subprocess.STDOUT, bufsize=1, start_new_session=True)

        def kill() -> None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

        timer = threading.Timer(timeout_s, kill)
        timer.start()
        try:
            for line in proc.stdout or ():
                log.write(f"{time.perf_counter() - start:.6f} {line}")
        finally:
            timer.cancel()
            if proc.poll() is None:
                kill()
            code = proc.wait()
    wall = time.perf_counter() - start
    if code != 0:
        why = f"timed out after {timeout_s:.0f}s" if wall >= timeout_s else f"exited {code}"
        tail = "".join(log_path.read_text().splitlines(keepends=True)[-25:])
        raise BenchError(f"{shlex.join(cmd)} {why}; last lines of {log_path}:\n{tail}")
    return wall


def trainer_args(model: str, batch_size: int, steps: int, peak_flops: float,
                 train_samples: int = 1024) -> list[str]:
    """Flags of a pure throughput run: no evaluation, TensorBoard or mid-run checkpoints (the
    trainer still saves one after its last step, untimed); ``--peak-tflops`` skips its probe."""
    return ["--model", model, "--batch-size", str(batch_size), "--grad-accum", "1",
            "--steps", str(steps), "--eval-every", "0", "--checkpoint-every", "0",
            "--tensorboard", "false", "--resume", "none", "--peak-tflops",
            f"{peak_flops / 1e12:.6g}", "--train-samples", str(train_samples),
            "--val-samples", "64"]


def run_trainer(module: str, args: Sequence[str], nproc: int, scratch: Path, tag: str,
                timeout_s: float, keep: bool = False) -> dict[str, Any]:
    """Train with ``python -m module args --output-dir <scratch>/<tag>`` on ``nproc`` ranks:
    ``command``, ``wall_s``, ``run_dir`` (removed unless ``keep``), ``summary`` (summary.json)
    and ``records`` (metrics.jsonl)."""
    run_dir = scratch / tag
    cmd = launch(module, [*args, "--output-dir", str(run_dir)], nproc)
    result = {"command": shlex.join(cmd), "wall_s": run_logged(cmd, scratch, tag, timeout_s),
              "run_dir": run_dir, "summary": json.loads((run_dir / "summary.json").read_text()),
              "records": [json.loads(line) for line in
                          (run_dir / "metrics.jsonl").read_text().splitlines()]}
    if not keep:
        shutil.rmtree(run_dir, ignore_errors=True)
    return result


def run_ranks(module: str, args: Sequence[str], nproc: int, scratch: Path, tag: str,
              timeout_s: float) -> dict[str, Any]:
    """Run ``python -m module --worker PREFIX args`` on ``nproc`` ranks: ``command``, ``wall_s``
    and ``ranks``, the records they wrote with :func:`write_rank`."""
    cmd = launch(module, [WORKER, str(scratch / tag), *args], nproc)
    return {"command": shlex.join(cmd), "wall_s": run_logged(cmd, scratch, tag, timeout_s),
            "ranks": [json.loads((scratch / f"{tag}.rank{r}.json").read_text())
                      for r in range(nproc)]}


def write_rank(prefix: str | Path, record: Any) -> None:
    """This rank's record (``RANK``, default 0) as ``<prefix>.rank<RANK>.json``."""
    Path(f"{prefix}.rank{os.environ.get('RANK', '0')}.json").write_text(json.dumps(record) + "\n")


def serve_rank(prefix: str, trainer: str, args: Sequence[str],
               measure: Callable[..., dict[str, Any]]) -> None:
    """One rank of :func:`run_ranks`: ``trainers.<trainer>``'s config from ``args``, its process
    group, and ``measure(cfg, env, build)`` (its own ``build``) with ``rank``, ``world_size``."""
    from trainers.config.parsing import parse_config
    from trainers.core.distributed import init_distributed

    torch.set_num_threads(THREADS)
    cfg = parse_config(list(args), trainer, check_paths=False)
    build = importlib.import_module(f"trainers.{trainer}").build
    with init_distributed(cfg) as env:
        record = {"rank": env.rank, "world_size": env.world_size, "trainer": trainer,
                  **measure(cfg, env, build)}
    write_rank(prefix, record)


def columns(rows: Sequence[Sequence[str]], left: Sequence[int] = (0,)) -> str:
    """Rows as aligned text under a rule below the first (the header): the columns in ``left``
    (negative indices count from the end) left-aligned, the others right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lefts = {i % len(widths) for i in left}
    lines = ["  ".join(c.ljust(w) if i in lefts else c.rjust(w)
                       for i, (c, w) in enumerate(zip(row, widths, strict=True))).rstrip()
             for row in rows]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def human(value: float, digits: int = 3) -> str:
    """Bytes in GiB, MiB or KiB to ``digits`` significant digits."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= size:
            return f"{value / size:.{digits}g} {unit}"
    return f"{value:.0f} B"


@contextlib.contextmanager
def figure(path: Path, *grid: int, figsize: tuple[float, float]) -> Iterator[Any]:
    """The axes of a matplotlib figure of ``grid`` (rows, columns) subplots (``pip install -e
    ".[bench]"``), saved to ``path`` (PNG, 110 dpi) after the block."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    yield fig.subplots(*grid)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def chart(ax: Any, xs: Sequence[int], lines: dict[str, tuple[Sequence[float], str]],
          xlabel: str, ylabel: str, names: Sequence[str] | None = None) -> None:
    """Each of ``lines`` (label -> (values at ``xs``, matplotlib format)) on ``ax``, over a log2
    x axis ticked at ``xs`` (labelled ``names``), with axis labels, legend and grid."""
    for label, (ys, fmt) in lines.items():
        ax.plot(xs, ys, fmt, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, names or [str(x) for x in xs])
    ax.set(xlabel=xlabel, ylabel=ylabel)
    ax.legend()
    ax.grid(alpha=0.3, which="both")


def host_info() -> dict[str, Any]:
    """CPU, versions, the git commit and whether tracked files differ from it, load average."""
    import torchx

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True,
                              text=True).stdout.strip()

    cpus = [line.split(":", 1)[1].strip() for line in
            Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")]
    return {"cpu": cpus[0] if cpus else platform.processor(), "logical_cpus": os.cpu_count(),
            "python": platform.python_version(), "torch": torch.__version__,
            "torchx": torchx.__version__, "platform": platform.platform(),
            "git_commit": git("rev-parse", "HEAD"),
            "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
            "load_avg_at_start": list(os.getloadavg())}


def main(bench: ModuleType | None = None, argv: Sequence[str] | None = None) -> int:
    """``python -m bench.<name>`` for benchmark module ``bench`` (default: ``__main__``). Exit 2
    when a step failed (the scratch directory stays), 1 when a check failed under ``--strict``.
    Plots go to docs/img, with ``--quick`` to bench/results/quick_img."""
    bench, argv = bench or sys.modules["__main__"], list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == [WORKER]:
        if hasattr(bench, "measure"):
            serve_rank(argv[1], argv[2], argv[3:], bench.measure)
        else:
            bench.worker(argv[1], argv[2:])
        return 0
    name, overrides = bench.__spec__.name.rpartition(".")[2], getattr(bench, "OVERRIDES", {})
    parser = argparse.ArgumentParser(prog=f"python -m bench.{name}",
                                     description=bench.__doc__.splitlines()[0],
                                     allow_abbrev=False)
    parser.add_argument("--quick", action="store_true",
                        help=f"smoke check: tiny sizes, a few steps; writes {name}_quick.json")
    parser.add_argument("--output", type=Path, help=f"default: bench/results/{name}.json")
    parser.add_argument("--keep-runs", action="store_true", help="keep the scratch directory")
    parser.add_argument("--strict", action="store_true", help="exit 1 if a check is missed")
    for field, least in overrides.items():
        default = getattr(bench.Plan(), field)
        parser.add_argument(f"--{field.replace('_', '-')}", dest=field, type=type(default),
                            help=f"plan: {default}" + (f"; at least {least}" if least else ""))
    args = parser.parse_args(argv)
    plan = bench.Plan(**bench.QUICK) if args.quick else bench.Plan()
    for field, least in overrides.items():
        if (value := getattr(args, field)) is not None:
            if least is not None and value < least:
                parser.error(f"--{field.replace('_', '-')} must be >= {least}, got {value}")
            setattr(plan, field, value)
    torch.set_num_threads(getattr(plan, "threads", THREADS))
    output = args.output or RESULTS_DIR / f"{name}{'_quick' if args.quick else ''}.json"
    report: dict[str, Any] = {
        "benchmark": f"bench.{name}", "command": f"{parser.prog} {shlex.join(argv)}".strip(),
        "schema": 1, "quick": args.quick,
        "created": datetime.now(UTC).isoformat(timespec="seconds"), "host": host_info(),
        "plan": dataclasses.asdict(plan), "threads_per_process": torch.get_num_threads()}
    started, scratch = time.perf_counter(), Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
    progress(f"scratch directory {scratch}")
    try:
        report.update(bench.run(plan, scratch))
    except (BenchError, OSError) as err:
        progress(f"failed: {err}\n[bench] logs kept in {scratch}")
        return 2
    if not args.keep_runs:
        shutil.rmtree(scratch, ignore_errors=True)
    report["duration_s"] = time.perf_counter() - started
    output.parent.mkdir(parents=True, exist_ok=True)
    output.with_name(output.name + ".tmp").write_text(json.dumps(report, indent=2) + "\n")
    output.with_name(output.name + ".tmp").replace(output)  # never a half-written result
    images = RESULTS_DIR / "quick_img" if args.quick else REPO / "docs" / "img"
    drawn = bench.draw(report, images) if hasattr(bench, "draw") else []
    if args.quick:
        print("QUICK SMOKE RUN: tiny sizes, a few steps; the figures are not meaningful.")
    print(bench.table(report))
    print(f"\nwrote {', '.join(str(p) for p in [output, *drawn])} ({report['duration_s']:.0f}s)")
    failed = hasattr(bench, "checks") and not all(c["pass"] for c in bench.checks(report))
    return 1 if failed and (args.strict or getattr(bench, "STRICT", False)) else 0
