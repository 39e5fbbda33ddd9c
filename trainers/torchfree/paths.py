"""Whether a directory could be made and written, decided without writing anything.

Standard library only. ``os.access`` alone says yes to root everywhere, also where the file
system refuses every write (a read-only mount, or a kernel file system such as /proc or
/sys); those are read from ``statvfs`` and the mount table instead of probing with a scratch
directory, so a dry run changes nothing on disk.
"""

from __future__ import annotations

import os
from pathlib import Path

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
