"""Finding a run's checkpoints while another rank writes under the same folder."""

from __future__ import annotations

from upath import UPath

from trainers.runs.checkpoint_files import find_checkpoints, step_dirs


def test_a_folder_gone_while_it_is_listed_holds_no_checkpoints(monkeypatch):
    """A new run's folder in a bucket holds only another rank's store-check probe, which that
    rank deletes right after this rank saw the folder: no checkpoint, and no NotADirectoryError
    (the cause of a 2-rank FSDP run on a bucket dying before its first step)."""
    run = UPath("memory:///probe-race/run")
    probe = run / ".write-check-0"
    probe.write_bytes(b"")
    fs = run.fs
    isdir = fs.isdir

    def isdir_then_the_probe_is_deleted(path: str) -> bool:
        answer = isdir(path)
        if path.rstrip("/") == run.path and fs.exists(probe.path):
            fs.rm_file(probe.path)  # the other rank's rm_file, right after this answer
        return answer

    monkeypatch.setattr(fs, "isdir", isdir_then_the_probe_is_deleted)
    assert find_checkpoints(run) == []


def test_step_folders_are_listed_newest_first_and_others_ignored(tmp_path):
    for name in ("step_00000004", "step_00000012", "step_x", "other"):
        (tmp_path / name).mkdir()
    (tmp_path / "step_00000020").write_text("a file, not a checkpoint")
    assert [p.name for p in step_dirs(tmp_path)] == ["step_00000012", "step_00000004"]
    assert step_dirs(tmp_path / "missing") == []
