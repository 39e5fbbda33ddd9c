"""``local_cwd``: TorchX's local scheduler with strict run options, the submitting
interpreter's scripts on PATH, and ``torchx status``/``torchx cancel`` from another terminal.

``torchx`` started by path from a virtual environment that is not activated
(``.venv/bin/torchx run ...``) would leave ``torchrun`` off the job's PATH (``torchrun: command
not found`` inside the job); the job's PATH starts with the directory of the interpreter that
runs ``torchx`` (TorchX's ``extra_paths``), so the job runs the same environment's
``torchrun`` and Python.

TorchX keeps a local job's processes only in the ``torchx run`` process that started them, so
from any other process ``torchx status`` says the job does not exist and ``torchx cancel``
silently does nothing. Here every job's process groups (one per replica: torchrun and its
workers) are also recorded in a per-user directory; another process sees the job RUNNING while
they live, and cancels it with SIGTERM to them, as TorchX's own cancel does: torchrun forwards
it to the trainers, which save a checkpoint and exit (trainers/core/preemption.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

from torchx.schedulers.api import DescribeAppResponse
from torchx.schedulers.local_scheduler import CWDImageProvider
from torchx.specs import AppState

from components.schedulers.run_options import StrictRunOptions
from components.schedulers.submit import SubmitChecks
from components.schedulers.torchx_workarounds.local import TorchXLocalScheduler


def jobs_dir() -> Path:
    """Where this user's running local jobs are recorded, one ``<app id>.json`` each."""
    return Path(tempfile.gettempdir()) / f"torchx-local_cwd-{os.getuid()}"


def _start_time(pid: int) -> str | None:
    """The start time of process ``pid``, which tells a reused pid apart (from /proc; "" where
    there is none, as on macOS, and only the pid's existence is known); None if it is gone."""
    if Path("/proc/self/stat").exists():
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
        except (OSError, IndexError):
            return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return ""


class LocalJobs:
    """The process groups of running local jobs, by app id, shared between processes."""

    def __init__(self, folder: Path | None = None) -> None:
        self.folder = folder or jobs_dir()

    def record(self, app_id: str, pids: list[int]) -> None:
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        record = [[pid, _start_time(pid)] for pid in pids]
        (self.folder / f"{app_id}.json").write_text(json.dumps(record))

    def alive(self, app_id: str) -> list[int]:
        """The recorded process groups of ``app_id`` still running (the record is dropped once
        none is)."""
        path = self.folder / f"{app_id}.json"
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            return []
        alive = [pid for pid, started in record if _start_time(pid) == started]
        if not alive:
            path.unlink(missing_ok=True)
        return alive

    def forget(self, app_id: str) -> None:
        (self.folder / f"{app_id}.json").unlink(missing_ok=True)


class LocalCwdScheduler(SubmitChecks, StrictRunOptions, TorchXLocalScheduler):
    """TorchX's LocalScheduler with :class:`StrictRunOptions` and jobs visible to other
    processes (:class:`LocalJobs`)."""

    registered_as = "local_cwd"
    jobs = LocalJobs()

    def schedule_checked(self, dryrun_info: Any) -> str:
        app_id = super().schedule_checked(dryrun_info)
        self.jobs.record(app_id, self.process_groups(app_id))
        return app_id

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        response = super().describe(app_id)
        if response is not None:
            if response.state in (AppState.SUCCEEDED, AppState.FAILED, AppState.CANCELLED):
                self.jobs.forget(app_id)
            return response
        if self.jobs.alive(app_id):
            return DescribeAppResponse(app_id=app_id, state=AppState.RUNNING)
        return None

    def _cancel_existing(self, app_id: str) -> None:
        if self.started_here(app_id):
            super()._cancel_existing(app_id)
            return
        for pid in self.jobs.alive(app_id):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)


def create_scheduler(session_name: str, cache_size: int = 100, **kwargs: Any
                     ) -> LocalCwdScheduler:
    """The ``local_cwd`` entry point (pyproject.toml's ``torchx.schedulers`` table)."""
    return LocalCwdScheduler(session_name=session_name, image_provider_class=CWDImageProvider,
                             cache_size=cache_size,
                             extra_paths=[os.path.dirname(sys.executable)])
