"""What every benchmark here shares: subprocesses, scratch directories, host facts, JSON.

Every subprocess runs with one thread per process (``THREADS``), this interpreter's
``torchrun`` and ``torchx`` first on PATH, and its temporary files inside the scratch
directory, so nothing is left behind.
"""

from __future__ import annotations

import contextlib
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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO / "bench" / "results"
BIN = Path(sys.executable).parent  # torchrun and torchx of this interpreter's environment
THREADS = 1


class BenchError(RuntimeError):
    """A benchmark subprocess failed or produced no usable figures."""


# --------------------------------------------------------------------------- subprocesses


def child_env(scratch: Path) -> dict[str, str]:
    """The environment of every subprocess: one thread, this environment's tools first, and
    temporary files (torchrun's and torchx's log directories) inside the scratch directory."""
    tmp = scratch / "tmp"
    tmp.mkdir(exist_ok=True)
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(THREADS), MKL_NUM_THREADS=str(THREADS),
               PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", TMPDIR=str(tmp))
    return env


def tool(name: str) -> str:
    """``torchrun`` or ``torchx`` of this interpreter's environment, else from PATH."""
    path = BIN / name
    if path.is_file():
        return str(path)
    found = shutil.which(name)
    if found is None:
        raise BenchError(f"{name} not found next to {sys.executable} or on PATH")
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_streaming(cmd: Sequence[str], timeout_s: float, log_path: Path, env: dict[str, str],
                  on_line: Callable[[str, float], None] | None = None) -> float:
    """Run ``cmd`` in the repo root with stdout and stderr merged into ``log_path``.

    ``on_line(line, seconds_since_spawn)`` sees every line as it arrives. Returns the wall time
    to exit; raises BenchError on a non-zero exit or a timeout (the process group is killed).
    """
    start = time.perf_counter()
    with open(log_path, "w") as log:
        log.write(f"$ {shlex.join(cmd)}\n")
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, bufsize=1,
                                start_new_session=True)
        timed_out = threading.Event()

        def kill() -> None:
            timed_out.set()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

        timer = threading.Timer(timeout_s, kill)
        timer.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                if on_line is not None:
                    on_line(line, time.perf_counter() - start)
                log.write(line)
            code = proc.wait()
        finally:
            timer.cancel()
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    elapsed = time.perf_counter() - start
    if timed_out.is_set() or code != 0:
        why = f"timed out after {timeout_s:.0f}s" if timed_out.is_set() else f"exited {code}"
        tail = "".join(log_path.read_text().splitlines(keepends=True)[-25:])
        raise BenchError(f"{shlex.join(cmd)} {why}; last lines of {log_path}:\n{tail}")
    return elapsed


def progress(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- measurements


def median(values: Sequence[float]) -> float:
    if not values:
        raise BenchError("no measured steps; raise --steps")
    return statistics.median(values)


def host_info() -> dict[str, Any]:
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True,
                                  timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    cpu = platform.processor()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    import torchx

    return {"cpu": cpu, "logical_cpus": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "torchx": torchx.__version__,
            "platform": platform.platform(), "git_commit": git("rev-parse", "HEAD"),
            "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
            "load_avg_at_start": list(os.getloadavg())}


def write_json(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    tmp.replace(path)



def finish(output: Path, report: dict[str, Any], table: str, missed: Sequence[str],
           strict: bool) -> int:
    """Write ``report`` to ``output``, print ``table``; exit status 1 when ``strict`` and a
    target or check in ``missed`` failed, else 0."""
    write_json(output, report)
    print(table)
    print(f"\nwrote {output} ({report['duration_s']:.0f}s)")
    return 1 if strict and missed else 0


def run_in_scratch(prefix: str, parent: str | None, keep: bool,
                   run: Callable[[Path], dict[str, Any]]) -> dict[str, Any] | None:
    """``run(scratch)`` in a fresh scratch directory (under ``parent``, default the system's
    temporary directory), removed afterwards unless ``keep``; None (the directory kept, its
    path printed) when a benchmark step failed."""
    scratch = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    progress(f"scratch directory {scratch}")
    try:
        report = run(scratch)
    except BenchError as err:
        progress(f"failed: {err}")
        progress(f"logs kept in {scratch}")
        return None
    if keep:
        progress(f"runs kept in {scratch}")
    else:
        shutil.rmtree(scratch, ignore_errors=True)
    return report
