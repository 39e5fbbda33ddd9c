"""A run's appended outputs (metrics.jsonl, console.log, TensorBoard events) when the run lives
on an object store, where nothing can be appended to: they are written to a local folder and
copied to the run's URL at :meth:`Mirror.sync` (after every checkpoint and at exit), so a lost
node loses at most the lines written since the last checkpoint. For a local run directory the
folder is the run directory itself and syncing has nothing to do. Plain Python without torch.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from trainers.runs.storage import RunPath, is_remote


class Mirror:
    """The local folder (``local``) whose files become ``target``'s at :meth:`sync`.

    ``resumed`` names files the run appends to across attempts: on an object store they are
    fetched first, so an attempt continues the previous attempt's file."""

    def __init__(self, target: RunPath, resumed: Sequence[str] = ()) -> None:
        self.target = target
        self.remote = is_remote(target)
        self._sent: dict[str, tuple[int, int]] = {}
        if not self.remote:
            self.local = Path(target)
            self.local.mkdir(parents=True, exist_ok=True)
            return
        self.local = Path(tempfile.mkdtemp(prefix="trainers-run-"))
        for name in resumed:
            source = target / name
            if source.exists():
                (self.local / name).write_bytes(source.read_bytes())
                self._sent[name] = self._version(self.local / name)

    @staticmethod
    def _version(path: Path) -> tuple[int, int]:
        stat = path.stat()
        return stat.st_mtime_ns, stat.st_size

    def sync(self) -> None:
        """Copy every file of ``local`` that changed since the last sync to ``target`` (each
        one PUT: a reader sees the previous copy or the new one)."""
        if not self.remote:
            return
        for path in sorted(p for p in self.local.rglob("*") if p.is_file()):
            name = path.relative_to(self.local).as_posix()
            version = self._version(path)
            if self._sent.get(name) != version:
                (self.target / name).write_bytes(path.read_bytes())
                self._sent[name] = version

    def close(self) -> None:
        """Sync a last time and, on an object store, remove the local folder."""
        self.sync()
        if self.remote:
            shutil.rmtree(self.local, ignore_errors=True)
