"""Per-job directories under the ``job_dir`` run option, and the workspace snapshot in them.

``job_dir`` names a parent directory: each job gets its own new directory under it,
``<role>-<time>-<id>`` (a snapshot of the workspace, the sbatch script, the logs and, by
default, the run's outputs), so one profile serves every job. A dry run only names the
directory (:func:`new_job_dir`, :func:`check_writable`); submission makes it
(:func:`make_job_dir`, :func:`snapshot_workspace`) and removes it again if sbatch refuses the job
(:func:`remove_job_dir`).
"""

from __future__ import annotations

import os
import posixpath
import secrets
import shutil
import stat
import time
from collections.abc import Iterable
from pathlib import Path

import fsspec
from torchx.workspace.api import walk_workspace

from components.schedulers.slurm.options import slurm_error
from trainers.options.paths import existing_ancestor, unwritable_reason


def new_job_dir(parent: str, name: str) -> str:
    """A new directory's path under ``parent`` for a job whose first role is ``name``."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return os.path.join(os.path.abspath(parent), f"{name}-{stamp}-{secrets.token_hex(2)}")


def _unwritable(job_dir: str, parent: str, strerror: str) -> str:
    return (f"job_dir={job_dir} cannot be written ({parent}: {strerror}); "
            "pass -cfg job_dir=<a directory you can write>")


def check_writable(job_dir: str) -> None:
    """Refuse a ``job_dir`` that cannot be created and written, without writing anything
    (a dry run writes nothing): :func:`trainers.options.paths.unwritable_reason`."""
    reason = unwritable_reason(Path(job_dir))
    if reason is not None:
        raise slurm_error(_unwritable(job_dir, str(reason[0]), reason[1]))


def make_job_dir(path: str, option: str) -> str:
    """Create the job's new directory and its missing parents; return the directory that
    existed before. ``option`` is the ``job_dir`` the user passed, for the one-line error."""
    existed = str(existing_ancestor(Path(path)))
    try:
        os.makedirs(path)
    except OSError as err:
        raise slurm_error(_unwritable(option, existed, err.strerror)) from None
    return existed


def remove_job_dir(path: str, existed: str) -> None:
    """Undo :func:`make_job_dir`: remove the job's directory, then its parents below
    ``existed`` while they are empty (another job may have put its own there since)."""
    shutil.rmtree(path, ignore_errors=True)
    parent = os.path.dirname(os.path.abspath(path))
    while parent != existed and parent.startswith(existed.rstrip("/") + "/"):
        try:
            os.rmdir(parent)
        except OSError:
            break
        parent = os.path.dirname(parent)


def snapshot_workspace(workspace: str, target: str, skip: Iterable[str] = ()) -> None:
    """Copy ``workspace`` (a path or fsspec URL) into the existing directory ``target``, minus
    what its ``.torchxignore`` lists and minus the ``skip`` directories (local paths: the jobs'
    parent, so a ``job_dir`` inside the workspace never copies the earlier jobs). File modes
    are kept (scripts stay executable)."""
    fs, root = fsspec.core.url_to_fs(workspace)
    skipped = [os.path.abspath(d).rstrip("/") + "/" for d in skip]
    for dirpath, _, files in walk_workspace(fs, root):
        rel = posixpath.relpath(dirpath, root)
        for name, info in files.items():
            src = info["name"]
            if any((src + "/").startswith(d) for d in skipped):
                continue
            dest = os.path.join(target, name if rel == "." else os.path.join(rel, name))
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with fs.open(src, "rb") as fin, open(dest, "wb") as fout:
                shutil.copyfileobj(fin, fout)
            if isinstance(info.get("mode"), int):
                os.chmod(dest, stat.S_IMODE(info["mode"]))
