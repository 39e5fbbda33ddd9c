"""A run pointed at object storage that cannot work is refused by ``python -m trainers.<name>``
in one line naming the fix, before anything is written: not in the bucket, and not as a local
folder named after the URL (``s3:``), which a URL once silently became. The submit-time rows
(``torchx run`` and TorchX's runner) are tests/integration/test_s3_submit.py's.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support.processes import run_command, run_forked
from tests.support.s3 import Bucket

# What makes a process find no credentials anywhere (no variables, files or instance role).
NO_CREDENTIALS = {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None,
                  "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_CONFIG_FILE": "/nonexistent",
                  "AWS_EC2_METADATA_DISABLED": "true"}
# Runs trainers.ddp as if s3fs were not installed.
WITHOUT_S3FS = ("import runpy, sys; sys.modules['s3fs'] = None; sys.argv[0] = 'trainers.ddp'; "
                "runpy.run_module('trainers.ddp', run_name='__main__')")


def refuse(cwd: Path, output_dir: str, env: dict[str, str | None],
           without_s3fs: bool = False) -> str:
    """The one line ``python -m trainers.ddp --output-dir output_dir`` exits 2 with, run in
    ``cwd`` with ``env`` changed (None removes a variable); asserts nothing was written there."""
    args = ["--model", "tiny", "--steps", "2", "--output-dir", output_dir]
    if without_s3fs:  # a real interpreter: the preloaded one may have imported s3fs
        proc = run_command([sys.executable, "-c", WITHOUT_S3FS, *args], cwd=cwd, env=env,
                           timeout=120)
    else:
        proc = run_forked("trainers.ddp", args, cwd=cwd, env=env, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stdout == "" and list(cwd.iterdir()) == [], proc.stdout
    (line,) = proc.stderr.strip().splitlines()
    return line


@pytest.mark.parametrize("row", ["bucket-missing", "no-credentials", "endpoint-unreachable",
                                 "no-s3fs", "unknown-scheme"])
def test_a_run_on_storage_it_cannot_use_is_refused_in_one_line(s3: Bucket, tmp_path, row):
    url = s3.url("run")
    expected = {
        "bucket-missing": (s3.url("run").replace(s3.name, "no-such-bucket"), {},
                           "bucket no-such-bucket does not exist (create it, or fix the URL)"),
        "no-credentials": (url, NO_CREDENTIALS, "no credentials (set AWS_ACCESS_KEY_ID and "
                           "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or a role)"),
        "endpoint-unreachable": (url, {"AWS_ENDPOINT_URL": "http://127.0.0.1:9"},
                                 "the endpoint is unreachable (check AWS_ENDPOINT_URL and the "
                                 "network: http://127.0.0.1:9)"),
        "no-s3fs": (url, {}, "s3:// needs the s3fs package; pip install -e '.[s3]'"),
        "unknown-scheme": ("foo://bucket/run", {}, "unknown storage scheme foo://; pass a local "
                           "path or an s3:// (gs://, az://) URL"),
    }
    output_dir, env, reason = expected[row]
    line = refuse(tmp_path, output_dir, env, without_s3fs=row == "no-s3fs")
    assert line == f"trainers.ddp: error: --output-dir {output_dir}: {reason}"
    assert s3.keys() == []
