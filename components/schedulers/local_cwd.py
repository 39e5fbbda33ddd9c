"""``local_cwd``: TorchX's local scheduler with strict run options and the submitting
interpreter's scripts on PATH.

``torchx`` started by path from a virtual environment that is not activated
(``.venv/bin/torchx run ...``) would leave ``torchrun`` off the job's PATH (``torchrun: command
not found`` inside the job); the job's PATH starts with the directory of the interpreter that
runs ``torchx`` (TorchX's ``extra_paths``), so the job runs the same environment's
``torchrun`` and Python.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from torchx.schedulers.local_scheduler import CWDImageProvider, LocalScheduler

from components.schedulers.run_options import StrictRunOptions


class LocalCwdScheduler(StrictRunOptions, LocalScheduler):
    """TorchX's LocalScheduler with :class:`StrictRunOptions`."""

    registered_as = "local_cwd"


def create_scheduler(session_name: str, cache_size: int = 100, **kwargs: Any
                     ) -> LocalCwdScheduler:
    """The ``local_cwd`` entry point (pyproject.toml's ``torchx.schedulers`` table)."""
    return LocalCwdScheduler(session_name=session_name, image_provider_class=CWDImageProvider,
                             cache_size=cache_size,
                             extra_paths=[os.path.dirname(sys.executable)])
