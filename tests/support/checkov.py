"""Run checkov (the Kubernetes framework) from its own virtual environment.

checkov cannot share the project's environment: installing it there downgrades ``networkx``
(torch's dependency) to 2.6 and ``packaging`` to 23.2. So :func:`checkov_executable` uses
``$CHECKOV`` when set, else ``.venv-checkov/bin/checkov`` in the repository, creating that
environment with :data:`CHECKOV_REQUIREMENT` on first use through ``.ci/uv-install`` (seconds;
reused afterwards). Creating it holds a lock (``.venv-checkov.lock``), so pytest-xdist's workers
make it once.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
from pathlib import Path
from typing import Any

CHECKOV_REQUIREMENT = "checkov==3.3.30"


def checkov_executable(repo: Path) -> Path:
    """The checkov command to run, installing it into ``repo/.venv-checkov`` when needed."""
    if os.environ.get("CHECKOV"):
        return Path(os.environ["CHECKOV"])
    venv = repo / ".venv-checkov"
    exe = venv / "bin" / "checkov"
    with open(repo / ".venv-checkov.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released on close: one install at a time
        if not exe.exists():
            subprocess.run([str(repo / ".ci" / "uv-install"), str(venv), CHECKOV_REQUIREMENT],
                           check=True, timeout=900)
    return exe


def scan(checkov: Path, directory: Path, skip: dict[str, str]) -> dict[str, Any]:
    """checkov's JSON report on every Kubernetes manifest under ``directory``, with the checks
    in ``skip`` (id -> justification) skipped; offline (no guideline download)."""
    cmd = [str(checkov), "--directory", str(directory), "--framework", "kubernetes",
           "--output", "json", "--quiet", "--compact", "--skip-download"]
    if skip:
        cmd += ["--skip-check", ",".join(sorted(skip))]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode not in (0, 1):  # 1: failed checks, reported in the JSON
        raise RuntimeError(f"checkov exited {proc.returncode}: {proc.stderr[-3000:]}")
    report = json.loads(proc.stdout)
    reports = report if isinstance(report, list) else [report]
    (k8s,) = [r for r in reports if r.get("check_type") == "kubernetes"]
    return k8s


def failures(report: dict[str, Any]) -> list[str]:
    """One ``CHECK_ID resource (file)`` line per failed check of a checkov report."""
    return [f"{c['check_id']} {c['resource']} ({c['file_path']})"
            for c in report["results"]["failed_checks"]]
