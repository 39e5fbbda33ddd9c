"""Whether a directory could be made and written, decided without writing anything; whether a
run can be read.

Standard library only. ``os.access`` alone says yes to root everywhere, also where the file
system refuses every write (a read-only mount, or a kernel file system such as /proc or
/sys); those are read from ``statvfs`` and the mount table instead of probing with a scratch
directory, so a dry run changes nothing on disk. :func:`check_output` is the check the
commands (``python -m trainers.tools.prepare_data`` and the others) make of their outputs,
:func:`check_run` the one the commands that read a run (``trainers.tools.sample``,
``trainers.tools.export``) make of it. Both take a local path or, from
:func:`trainers.runs.storage.location`, a bucket URL, whose store they reach
(:func:`trainers.runs.storage.check_store`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from trainers.errors import ConfigError
from trainers.runs.storage import RunPath, check_store, is_remote, store_reason

# Kernel file systems nobody creates a directory in, even as root.
PSEUDO_FILE_SYSTEMS = frozenset({
    "proc", "sysfs", "devpts", "cgroup", "cgroup2", "securityfs", "debugfs", "tracefs",
    "configfs", "pstore", "bpf", "efivarfs", "fusectl", "mqueue", "binfmt_misc",
})


def existing_ancestor(path: Path) -> Path:
    """``path`` made absolute, or its nearest ancestor that exists."""
    probe = path.absolute()
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    return probe


def mount_type(path: Path) -> str | None:
    """The file system type of the mount holding ``path`` (None where /proc/self/mounts is
    not readable)."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    best, fstype = "", None
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        mount = fields[1].replace("\\040", " ")
        inside = path == Path(mount) or Path(mount) in path.parents
        if inside and len(mount) >= len(best):
            best, fstype = mount, fields[2]
    return fstype


def unwritable_reason(path: Path) -> tuple[Path, str] | None:
    """(the existing ancestor that stops it, why) when directory ``path`` cannot be created and
    written, else None."""
    probe = existing_ancestor(path)
    if not probe.is_dir():
        return probe, "not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return probe, "permission denied"
    if os.statvfs(probe).f_flag & os.ST_RDONLY:
        return probe, "a read-only file system"
    fstype = mount_type(probe.resolve())
    if fstype in PSEUDO_FILE_SYSTEMS:
        return probe, f"a {fstype} file system"
    return None


def check_output(path: RunPath, flag: str, kind: str = "file",
                 inputs: Sequence[Path] = ()) -> None:
    """Raise ConfigError (one line, naming ``flag``) unless a command can write its output
    ``path``, a ``kind`` of "file" (created or replaced) or "directory" (created or filled),
    decided before anything is written: a file must not be a directory nor one of the
    command's ``inputs``, and where it is to be created must be writable
    (:func:`unwritable_reason`; on an object store: its bucket written, by one small object
    removed again)."""
    named = f"{flag} {path}" if flag else str(path)
    if is_remote(path):
        reason = store_reason(path, write=True)
        if reason is not None:
            raise ConfigError(f"{named}: {reason}")
        if kind == "file" and path.is_dir():
            raise ConfigError(f"{named} is a directory; pass the path of a {kind} to write")
        return
    if kind == "file" and path.is_dir():
        raise ConfigError(f"{named} is a directory; pass the path of a {kind} to write")
    if kind == "file" and any(path.resolve() == p.resolve() for p in inputs):
        raise ConfigError(f"{named} is also an input, which writing it would destroy; pass "
                          "another path")
    reason = unwritable_reason(path.parent if kind == "file" else path)
    if reason is not None:
        where, why = reason
        raise ConfigError(f"{named}: {where} cannot be written ({why}); pass a writable path")


def check_run(path: RunPath) -> None:
    """Raise ConfigError unless run (or checkpoint) directory ``path`` exists (on an object
    store: its bucket can be read, and the prefix holds objects): what a command that reads a
    run answers before loading torch to look for its checkpoints."""
    check_store(path, "RUN", write=False)
    if not path.is_dir():
        why = "not a directory" if path.exists() else "no such directory"
        raise ConfigError(f"{path}: no checkpoint there ({why}); pass a run directory holding "
                          "checkpoints/step_* or a step_* directory")
