"""Every process a test starts, started one way: its output in files, its failures explained.

- :func:`run_command` runs a command (``torchrun``, the ``torchx`` CLI, a ``python -m``
  command) to its end; :func:`start` starts one in the background (a :class:`Launched`).
  Each launch's stdout and stderr go to files of their own under the session's log folder
  (:func:`log_root`), and each process it starts carries ``TTX_TEST_LAUNCH`` in its
  environment, so its whole tree is found again even after its parent died (torchrun's
  workers run in sessions of their own).
- :func:`run_forked` runs a trainer's ranks forked from a process that has already imported
  torch and the trainers (the standard library's forkserver with the trainers preloaded), in
  the environment torchrun gives its workers (the rendezvous store hosted here, on a port the
  kernel picked): the same code and numbers at a fraction of the start-up cost. Use it where
  the numbers are the subject; launch for real where launching is.
- A launch that misses its deadline gets SIGABRT on every process of its tree (the tests'
  processes run with Python's fault handler on, so each prints its threads' stacks), then
  SIGKILL; the error shows each process's output, labelled, and where the files are.
- A test that leaves a launched process alive fails (the plugin part below), and the launches
  of each unit and integration test module are counted against ``tests/launches.json``: a
  change that launches more updates that table on purpose.
"""

from __future__ import annotations

import atexit
import faulthandler
import itertools
import json
import multiprocessing
import os
import random
import re
import runpy
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.connection import wait as wait_for_sentinels
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
LAUNCH_TABLE = REPO / "tests" / "launches.json"
# The tiers whose launches the table holds. The system tier's helpers for its services
# (podman, the Slurm commands, Ray) still start some processes themselves; its launches through
# this module are reported (TTX_LAUNCH_REPORT) but not held to the table yet.
COUNTED = ("tests/unit/", "tests/integration/")
# The table's rows of what a session makes once for several modules (shared_launches).
SHARED = "shared: "
MARKER = "TTX_TEST_LAUNCH"
TAIL_CHARS = 3000
ABORT_GRACE_S = 5.0  # how long aborted processes get to write their stacks and exit
# How long a test's last processes get to end on their own: a forkserver whose parent has
# exited sees its pipe close and exits, which for a process holding torch took over 2 s on
# a loaded CI machine (a benchmark's forkserver, reported as left behind). Only a process
# still alive waits for it.
EXITING_GRACE_S = 15.0
# What the forked processes' parent imports once: torch, every trainer (with the loop, the
# models, the parallelisms and DCP they import), and TorchX's CLI with our components.
PRELOAD = ["torch", "trainers.ddp", "trainers.fsdp", "trainers.tensor_parallel",
           "trainers.pipeline", "trainers.model_parallel", "torchx.cli.main",
           "components.launch", "tests.support.processes"]

# multiprocessing reads a forkserver child's exit status once, and Process.start() reads those
# of every earlier child: threads that run ranks at once (a ThreadPoolExecutor of refusals)
# would read each other's and find 255. One thread at a time starts or polls a rank.
_RANKS_LOCK = threading.Lock()
_ids = itertools.count(1)
_log_root: Path | None = None
_forkserver: multiprocessing.context.BaseContext | None = None
_shared: list[str] = []


def log_root() -> Path:
    """The session's folder of launch outputs (kept when a test failed, else removed)."""
    global _log_root
    if _log_root is None:
        _log_root = Path(tempfile.mkdtemp(prefix="ttx-test-logs-"))
    return _log_root


def child_env() -> dict[str, str]:
    """The environment of a process the tests start: this checkout importable, this
    interpreter's environment first on PATH (torchx's local_cwd runs `torchrun` from PATH),
    one OpenMP thread and one inductor compile thread unless set, unbuffered output, and
    Python's fault handler on: a process that crashes or is aborted prints every thread's
    stack to its stderr."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    env.setdefault("PYTHONFAULTHANDLER", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.pop(MARKER, None)
    return env


def environment(env: dict[str, str | None] | None) -> dict[str, str]:
    """:func:`child_env` with ``env`` laid over it (a None value removes the variable)."""
    full = child_env()
    for name, value in (env or {}).items():
        if value is None:
            full.pop(name, None)
        else:
            full[name] = value
    return full


def unused_port(span: int = 1) -> int:
    """A port for a server a test starts that must be named before it binds (a component's
    ``--lighthouse_port``): free now with the ``span - 1`` after it, and below the kernel's
    ephemeral range (components.launch.RENDEZVOUS_PORTS), where no process's outgoing
    connection or ``bind(0)`` listener can take it meanwhile."""
    from components.launch import RENDEZVOUS_PORTS

    for port in random.sample(RENDEZVOUS_PORTS[:-span], 64):
        probes = [socket.socket() for _ in range(span)]
        try:
            for offset, probe in enumerate(probes):
                probe.bind(("", port + offset))
            return port
        except OSError:
            continue
        finally:
            for probe in probes:
                probe.close()
    raise AssertionError(f"no free port among 64 tried in {RENDEZVOUS_PORTS}")


def _launch_dir(label: str) -> tuple[str, Path]:
    launch_id = f"{os.getpid()}-{next(_ids)}"
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in label)[:60]
    folder = log_root() / f"{launch_id.split('-')[1]:>04}-{safe}"
    folder.mkdir(parents=True)
    return launch_id, folder


def _tail(path: Path, chars: int = TAIL_CHARS) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    if len(text) <= chars:
        return text
    return f"[... {len(text) - chars} chars above]\n" + text[-chars:]


def outputs_report(folder: Path) -> str:
    """The end of every non-empty output file under ``folder`` (the command's own and, for
    torchrun with ``--log-dir`` there, each rank's), each under its label."""
    parts = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.stat().st_size):
        parts.append(f"----- {path.relative_to(folder)} -----\n{_tail(path)}")
    return "\n".join(parts) + f"\n(all output: {folder})"


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def marked_processes(prefix: str | tuple[str, ...]) -> list[psutil.Process]:
    """Live processes whose environment holds a launch marker starting with ``prefix`` (or
    any of several): one pass over the process table."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid == os.getpid() or not _alive(proc):
                continue
            if proc.environ().get(MARKER, "").startswith(prefix):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def tree(pids: Sequence[int], marker: str | None = None) -> list[psutil.Process]:
    """The live processes of ``pids``, their descendants, and those carrying ``marker``."""
    found: dict[int, psutil.Process] = {}
    for pid in pids:
        try:
            root = psutil.Process(pid)
            for proc in [root, *root.children(recursive=True)]:
                found[proc.pid] = proc
        except psutil.Error:
            continue
    if marker is not None:
        for proc in marked_processes(marker):
            found[proc.pid] = proc
    return [proc for proc in found.values() if _alive(proc)]


def abort_tree(pids: Sequence[int], marker: str | None = None) -> list[str]:
    """SIGABRT every live process of the tree (their stacks go to their stderr), then
    SIGKILL what is left after :data:`ABORT_GRACE_S`; the command lines that were aborted."""
    procs = tree(pids, marker)
    aborted = []
    for proc in procs:
        try:
            aborted.append(f"{proc.pid}: {' '.join(proc.cmdline())[:200]}")
            proc.send_signal(signal.SIGABRT)
        except psutil.Error:
            continue
    psutil.wait_procs(procs, timeout=ABORT_GRACE_S)
    kill_tree(pids, marker)
    return aborted


def kill_tree(pids: Sequence[int], marker: str | None = None) -> None:
    """SIGKILL every live process of the tree and wait for them to go."""
    procs = tree(pids, marker)
    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            continue
    psutil.wait_procs(procs, timeout=10)


@contextmanager
def shared_launches(name: str) -> Iterator[None]:
    """Count the launches made inside for ``name``, something a session makes once and
    several test modules share (a session fixture's run, a component's job), rather than for
    the module whose test happened to need it first: under pytest-xdist each worker makes it
    where it first needs it. Its row in tests/launches.json is ``shared: name``, held per
    worker."""
    _shared.append(SHARED + name)
    try:
        yield
    finally:
        _shared.pop()


def _note_launch(kind: str, launch_id: str, pids: Sequence[int] = ()) -> None:
    if _shared:
        _by_module.setdefault(_shared[-1], Counter())[kind] += 1
    else:
        _CURRENT.launches[kind] += 1
    _CURRENT.markers.append(launch_id)
    _CURRENT.pids.extend(pids)


class Launched:
    """A command started in the background by :func:`start`: its files and its tree."""

    def __init__(self, cmd: Sequence[str], folder: Path, launch_id: str,
                 popen: subprocess.Popen[bytes]) -> None:
        self.cmd, self.folder, self.launch_id, self.popen = list(cmd), folder, launch_id, popen

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def stdout(self) -> str:
        """What the command has written to its stdout so far."""
        return (self.folder / "stdout").read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return (self.folder / "stderr").read_text(errors="replace")

    def processes(self) -> list[psutil.Process]:
        """The live processes of this launch (the command and everything it started)."""
        return tree([self.pid], self.launch_id)

    def describe(self, why: str) -> str:
        return f"{' '.join(self.cmd)}: {why}\n{outputs_report(self.folder)}"

    def wait_for(self, text: str, timeout: float, stream: str = "stdout") -> str:
        """Wait until ``text`` (a regular expression) matches in the command's ``stream``; what
        it holds then. Fails (stacks first) when the command ends or ``timeout`` passes first."""
        deadline = time.monotonic() + timeout
        while True:
            seen = getattr(self, stream)
            if re.search(text, seen, flags=re.M):
                return seen
            if self.popen.poll() is not None:
                raise AssertionError(self.describe(
                    f"ended ({self.popen.returncode}) before printing {text!r}"))
            if time.monotonic() > deadline:
                aborted = abort_tree([self.pid], self.launch_id)
                raise AssertionError(self.describe(
                    f"printed no {text!r} in {timeout} s; aborted for stacks:\n"
                    + "\n".join(aborted)))
            time.sleep(0.1)

    def wait(self, timeout: float, check: bool = False) -> subprocess.CompletedProcess[str]:
        """The finished command (its output read back); past ``timeout`` its tree is aborted
        for stacks and the error shows them. With ``check`` a non-zero exit fails too."""
        try:
            code = self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            aborted = abort_tree([self.pid], self.launch_id)
            raise AssertionError(self.describe(
                f"missed its {timeout:.0f} s deadline; aborted for stacks:\n"
                + "\n".join(aborted))) from None
        if check and code != 0:
            raise AssertionError(self.describe(f"failed ({code})"))
        return subprocess.CompletedProcess(self.cmd, code, self.stdout, self.stderr)

    def popen_children(self) -> list[psutil.Process]:
        """The command's own child processes (torchrun's: its workers)."""
        try:
            return psutil.Process(self.pid).children()
        except psutil.Error:
            return []

    def stop(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the command's whole tree (SIGKILL: and wait for it to go)."""
        if sig == signal.SIGKILL:
            kill_tree([self.pid], self.launch_id)
            self.popen.wait(timeout=10)
            return
        for proc in self.processes():
            try:
                proc.send_signal(sig)
            except psutil.Error:
                continue


def start(cmd: Sequence[str], *, cwd: Path = REPO, env: dict[str, str | None] | None = None,
          label: str | None = None, stdout: int | None = None) -> Launched:
    """Start ``cmd`` in the background in a session of its own, its stdout and stderr to
    files (``stdout``: a file descriptor to write to instead, e.g. a pseudo-terminal's), in
    :func:`environment` ``env``."""
    launch_id, folder = _launch_dir(label or Path(cmd[0]).name + "-" + "-".join(cmd[1:3]))
    return _popen(list(map(str, cmd)), folder, launch_id, cwd, env, stdout)


def torchrun(module: str, args: Sequence[str], nproc: int, *, cwd: Path = REPO,
             env: dict[str, str | None] | None = None, options: Sequence[str] = ()) -> Launched:
    """Start ``torchrun --nproc_per_node nproc [options] -m module args`` on one node (a c10d
    rendezvous on a port the kernel picks), each rank's stdout and stderr in files of its own
    under the launch's folder (``--log-dir``, ``--redirects``) and also on torchrun's output
    (``--tee``, each line prefixed with the rank)."""
    launch_id, folder = _launch_dir(f"torchrun-{module}-x{nproc}")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
           *options, "--rdzv_backend", "c10d", "--rdzv_endpoint", "localhost:0",
           "--log-dir", str(folder / "ranks"), "--redirects", "3", "--tee", "3",
           "-m", module, *map(str, args)]
    return _popen(cmd, folder, launch_id, cwd, env)


def _popen(cmd: list[str], folder: Path, launch_id: str, cwd: Path,
           env: dict[str, str | None] | None, stdout: int | None = None) -> Launched:
    full_env = {**environment(env), MARKER: launch_id}
    with open(folder / "stdout", "wb") as out, open(folder / "stderr", "wb") as err:
        popen = subprocess.Popen(cmd, cwd=cwd, env=full_env, stdout=out if stdout is None
                                 else stdout, stderr=err, stdin=subprocess.DEVNULL,
                                 start_new_session=True)
    _note_launch("launched", launch_id, [popen.pid])
    return Launched(cmd, folder, launch_id, popen)


def run_command(cmd: Sequence[str], *, cwd: Path = REPO, env: dict[str, str | None] | None = None,
                timeout: float = 300, check: bool = False,
                label: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` to its end (see :func:`start` and :meth:`Launched.wait`)."""
    return start(cmd, cwd=cwd, env=env, label=label).wait(timeout, check=check)


# ---- ranks forked from a preloaded process -------------------------------------------------


@dataclass(frozen=True)
class RankSpec:
    """What one forked rank runs: ``python -m module args`` in ``cwd`` with ``env``."""

    module: str
    args: list[str]
    env: dict[str, str]
    cwd: str
    stdout: str
    stderr: str


def _redirect(path: str, fd: int) -> None:
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(target, fd)
    os.close(target)


def _renew_import_time_state() -> None:
    """What a preloaded module computed at import from the parent's working directory and
    home, computed again from the child's: TorchX's CLI reads ``.torchxconfig`` from the
    directories it listed when imported."""
    config = sys.modules.get("torchx.runner.config")
    if config is not None:
        config.DEFAULT_CONFIG_DIRS[:] = [str(Path.home()), str(Path.cwd())]


def _rank_main(spec: RankSpec) -> None:
    """A forked rank: a session of its own, its output to its files, the environment torchrun
    gives, the fault handler on; then ``python -m module`` as the interpreter would run it
    (exit status, traceback and exit handlers included)."""
    os.setsid()
    _redirect(spec.stdout, 1)
    _redirect(spec.stderr, 2)
    sys.stdout.reconfigure(line_buffering=True)
    sys.stderr.reconfigure(line_buffering=True)
    os.environ.clear()
    os.environ.update(spec.env)
    os.chdir(spec.cwd)
    # multiprocessing made "forkserver" this process's default start method (a forkserver
    # child's bootstrap forces its own); a cold interpreter's default is the platform's, so
    # that a DataLoader's workers fork from the rank rather than start a forkserver of their
    # own (cold imports, and a server that outlives the rank by a moment)
    multiprocessing.set_start_method(None, force=True)
    _renew_import_time_state()
    faulthandler.enable(all_threads=True)
    import torch

    torch.set_num_threads(int(spec.env.get("OMP_NUM_THREADS", "1")))
    sys.argv = [spec.module, *spec.args]
    # runpy warns that the module was imported before it runs as __main__: here by the
    # preloading, which a cold ``python -m`` does not do
    warnings.filterwarnings("ignore", category=RuntimeWarning,
                            message=f"'{re.escape(spec.module)}' found in sys.modules")
    try:
        runpy.run_module(spec.module, run_name="__main__", alter_sys=True)
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        raise SystemExit(1) from None
    finally:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()


def _preloaded() -> multiprocessing.context.BaseContext:
    global _forkserver
    if _forkserver is None:
        _forkserver = multiprocessing.get_context("forkserver")
        _forkserver.set_forkserver_preload(PRELOAD)
    return _forkserver


def rank_env(rank: int, nproc: int, port: int) -> dict[str, str]:
    """What torchrun's agent sets for worker ``rank`` of ``nproc`` on one node whose store
    (the agent's) listens on ``port``, but ``TORCHELASTIC_RUN_ID``: there is no agent for
    ``TRAINERS_KILL_AT``'s ``node`` to kill (a forked rank's parent is the preloaded one)."""
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0",
            "ROLE_RANK": str(rank), "ROLE_NAME": "default", "WORLD_SIZE": str(nproc),
            "LOCAL_WORLD_SIZE": str(nproc), "GROUP_WORLD_SIZE": "1",
            "ROLE_WORLD_SIZE": str(nproc), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
            "TORCHELASTIC_USE_AGENT_STORE": "True"}


def run_forked(module: str, args: Sequence[str], nproc: int = 1, *,
               env: dict[str, str | None] | None = None, cwd: Path = REPO, timeout: float = 300,
               check: bool = True) -> subprocess.CompletedProcess[str]:
    """``python -m module args`` (``nproc`` 1: a plain process) or its ``nproc`` ranks as
    ``torchrun --nproc_per_node nproc`` would run them, forked from the preloaded process.

    The result's stdout and stderr are the ranks' in rank order; its exit status the first
    failing rank's (0 when all succeed). When a rank fails the others get 5 s to end, then
    are killed (as torchrun stops a failed group). Past ``timeout`` every rank is aborted for
    its stacks. With ``check`` a failure raises with each rank's output, labelled."""
    import torch.distributed as dist

    launch_id, folder = _launch_dir(f"{module}-x{nproc}")
    base = environment(env)
    store = None
    if nproc > 1:
        store = dist.TCPStore("127.0.0.1", 0, nproc, is_master=True, wait_for_workers=False,
                              timeout=timedelta(seconds=timeout))
    context = _preloaded()
    procs = []
    for rank in range(nproc):
        rank_vars = rank_env(rank, nproc, store.port) if store else {}
        spec = RankSpec(module, list(map(str, args)), {**base, **rank_vars, MARKER: launch_id},
                        str(cwd), str(folder / f"rank{rank}.stdout"),
                        str(folder / f"rank{rank}.stderr"))
        proc = context.Process(target=_rank_main, args=(spec,), name=f"rank{rank}")
        with _RANKS_LOCK:
            proc.start()
        procs.append(proc)
    _note_launch("forked", launch_id, [p.pid for p in procs])
    cmd = [module, *map(str, args)]
    why = _await_ranks(procs, timeout)
    codes = _exit_codes(procs)
    del store
    stdout = "".join((folder / f"rank{r}.stdout").read_text(errors="replace")
                     for r in range(nproc))
    stderr = "".join((folder / f"rank{r}.stderr").read_text(errors="replace")
                     for r in range(nproc))
    code = next((c for c in codes if c), 0)
    if why or (check and code != 0):
        raise AssertionError(f"python -m {' '.join(cmd)} on {nproc} forked rank(s): "
                             f"{why or f'exit statuses {codes}'}\n{outputs_report(folder)}")
    return subprocess.CompletedProcess(cmd, code, stdout, stderr)


def _exit_codes(procs: list[multiprocessing.process.BaseProcess]) -> list[int | None]:
    with _RANKS_LOCK:
        return [p.exitcode for p in procs]


def _await_ranks(procs: list[multiprocessing.process.BaseProcess], timeout: float) -> str:
    """Wait for every rank; stop the rest 5 s after one fails (time to print their own
    errors). Non-empty: why it gave up."""
    deadline = time.monotonic() + timeout
    stop_at = None
    while None in (codes := _exit_codes(procs)):
        running = [p for p, code in zip(procs, codes, strict=True) if code is None]
        now = time.monotonic()
        if now > deadline:
            aborted = abort_tree([p.pid for p in running])
            wait_for_sentinels([p.sentinel for p in running], timeout=10)
            return f"missed its {timeout:.0f} s deadline; aborted for stacks:\n" + "\n".join(
                aborted)
        if stop_at is None and any(codes):
            stop_at = now + 5
        if stop_at is not None and now > stop_at:
            kill_tree([p.pid for p in running])
        wait_for_sentinels([p.sentinel for p in running], timeout=0.5)
    return ""


# ---- the pytest plugin: no process left behind, launches counted --------------------------


@dataclass
class _TestLaunches:
    launches: Counter[str] = field(default_factory=Counter)
    markers: list[str] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)


_CURRENT = _TestLaunches()
_by_module: dict[str, Counter[str]] = {}


def _module_of(nodeid: str) -> str:
    return nodeid.split("::")[0]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    """Launches made while a test's fixtures are set up count for its module; processes
    still alive after it are a shared fixture's (its servers), not leftovers."""
    global _CURRENT
    _CURRENT = _TestLaunches()
    try:
        return (yield)
    finally:
        _by_module.setdefault(_module_of(item.nodeid), Counter()).update(_CURRENT.launches)
        _CURRENT = _TestLaunches()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    result = yield
    _by_module.setdefault(_module_of(item.nodeid), Counter()).update(_CURRENT.launches)
    # a process already on its way out (a server whose parent just exited sees its pipe
    # close) is not left behind: it gets EXITING_GRACE_S to go
    _, alive = psutil.wait_procs(live_launched(), timeout=EXITING_GRACE_S)
    left = {proc.pid: proc for proc in alive}
    _CURRENT.markers.clear()
    _CURRENT.pids.clear()
    if left:
        lines = []
        for proc in left.values():
            try:
                lines.append(f"{proc.pid}: {' '.join(proc.cmdline())[:200]}")
            except psutil.Error:
                continue
        kill_tree(list(left))
        if lines:
            item.user_properties.append(("left_processes", "\n".join(lines)))
            pytest.fail(f"{item.nodeid} left {len(lines)} process(es) running (killed now):\n"
                        + "\n".join(lines), pytrace=False)
    return result


def live_launched() -> list[psutil.Process]:
    """The live processes of the launches this test made so far."""
    found = {proc.pid: proc for proc in tree(_CURRENT.pids)}
    if _CURRENT.markers:
        found.update({proc.pid: proc for proc in marked_processes(tuple(_CURRENT.markers))})
    return list(found.values())


def launch_counts() -> dict[str, dict[str, int]]:
    """Launches this session made, by test module: ``launched`` (a new interpreter: a
    command, torchrun, the torchx CLI) and ``forked`` (a run of ranks forked preloaded)."""
    return {module: dict(sorted(counts.items())) for module, counts in sorted(_by_module.items())
            if counts}


def over_table(counts: dict[str, dict[str, int]], table: dict[str, dict[str, int]]) -> list[str]:
    """Each module of ``counts`` under :data:`COUNTED`, or shared row, that launched more than
    ``table`` allows it, as a line."""
    over = []
    for module, kinds in counts.items():
        if not module.startswith((*COUNTED, SHARED)):
            continue
        for kind, n in kinds.items():
            allowed = table.get(module, {}).get(kind, 0)
            if n > allowed:
                over.append(f"{module}: {n} {kind} (tests/launches.json allows {allowed})")
    return over


_summary: list[str] = []
# pytest-xdist: each worker sends its session's launch counts and kept log folder to the
# controller (config.workeroutput), which holds them to the table once for the whole run.
_WORKER_COUNTS, _WORKER_LOGS = "ttx_launch_counts", "ttx_log_root"
_worker_logs: list[str] = []


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    """On the controller: add a finished worker's launch counts (a shared row: the most any
    worker made, each making it once) and its kept log folder."""
    output = getattr(node, "workeroutput", {})
    for module, kinds in json.loads(output.get(_WORKER_COUNTS, "{}")).items():
        counts = _by_module.setdefault(module, Counter())
        if module.startswith(SHARED):
            counts |= Counter(kinds)
        else:
            counts.update(kinds)
    if output.get(_WORKER_LOGS):
        _worker_logs.append(output[_WORKER_LOGS])


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the session when a module launched more than tests/launches.json allows (update
    it on purpose: a reviewer sees the cost); remove the launch outputs of a passing run.
    With ``TTX_LAUNCH_REPORT`` set, write this session's counts there (JSON). Under
    pytest-xdist the workers hand both to the controller, which does this for the run."""
    keep_logs = _log_root is not None and session.exitstatus != 0
    if _log_root is not None and not keep_logs:
        shutil.rmtree(_log_root, ignore_errors=True)
    if _is_worker(session.config):
        session.config.workeroutput[_WORKER_COUNTS] = json.dumps(launch_counts())
        session.config.workeroutput[_WORKER_LOGS] = str(_log_root) if keep_logs else ""
        return
    counts = launch_counts()
    table = json.loads(LAUNCH_TABLE.read_text()) if LAUNCH_TABLE.exists() else {}
    over = over_table(counts, table)
    report = os.environ.get("TTX_LAUNCH_REPORT")
    if report:
        Path(report).write_text(json.dumps(counts, indent=1) + "\n")
    if over:
        _summary.append("launches over tests/launches.json (update it on purpose):")
        _summary.extend("  " + line for line in over)
        if session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    for folder in [str(_log_root)] * keep_logs + _worker_logs:
        _summary.append(f"every launch's output: {folder}")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in _summary:
        terminalreporter.write_line(line)
