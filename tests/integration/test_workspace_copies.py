"""Job copies carry the repository's sources and nothing of what a checkout accumulates.

Three copies are made of a checkout: each Slurm job's directory (TorchX's ``_copy_to_dir``,
filtered by ``.torchxignore``), local_docker's workspace image (TorchX's ``_build_context``,
filtered by ``.dockerignore``) and the images' build context (images/build, filtered by
``images/<flavour>.Dockerfile.dockerignore`` with Docker's own rules, as docker-py implements
them). Each is made here, with TorchX's and docker-py's functions, from a copy of the
repository's tracked files to which the debris of real use is added: a torch wheel staged by
``images/build --wheels``, an earlier Slurm job's directory, virtual environments, outputs,
caches.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import re
import shutil
import tarfile
from pathlib import Path

import pytest
from docker.utils.build import exclude_paths
from torchx.workspace.dir_workspace import _copy_to_dir
from torchx.workspace.docker_workspace import _build_context

from tests.support.processes import run_command
from tests.support.runs import REPO

MB = 1 << 20
WHEEL = "images/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
# path -> bytes: what using the checkout leaves in it (none of it a source)
DEBRIS = {
    WHEEL: 32 * MB,
    "slurm-jobs/ddp-20250101-000000-1a2b/" + WHEEL: 32 * MB,  # an earlier job's copy
    "slurm-jobs/ddp-20250101-000000-1a2b/trainers/ddp.py": 1000,
    "slurm-jobs/ddp-20250101-000000-1a2b/slurm-7-ddp-0.out": 1000,
    "slurm-7.out": 1000,
    ".torchxslurmjobdirs": 100,
    ".git/objects/pack/pack-0a1b.pack": 2 * MB,
    ".venv/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so": 4 * MB,
    ".venv-checkov/bin/checkov": 1000,
    "outputs/ddp/checkpoints/step_00000008/__0_0.distcp": 2 * MB,
    "trainers/__pycache__/ddp.cpython-311.pyc": 1000,
    "torchx_templates.egg-info/PKG-INFO": 1000,
    ".pytest_cache/v/cache/lastfailed": 100,
    ".ruff_cache/0.6.0/123": 100,
    "build/lib/trainers/ddp.py": 1000,
    "dist/torchx_templates-0.1.0-py3-none-any.whl": 1000,
}


def _tracked() -> list[str]:
    """The checkout's sources: tracked files and untracked ones git does not ignore."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("the repository's tracked files need git and a checkout")
    out = run_command(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                      check=True).stdout
    return [p for p in out.split("\0") if p and (REPO / p).is_file()]


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """A copy of the repository's files (tracked, and untracked ones git does not ignore) plus
    DEBRIS."""
    root = tmp_path_factory.mktemp("checkout")
    for path in _tracked():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / path, root / path)
    for path, size in DEBRIS.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        with open(root / path, "wb") as f:
            f.truncate(size)  # sparse: as many bytes to copy, none on disk
    return root


def _size(root: Path, paths: set[str]) -> int:
    return sum((root / p).stat().st_size for p in paths)


def test_slurm_job_directory_holds_the_sources_only(checkout, tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    _copy_to_dir(str(checkout), str(job))  # what TorchX's DirWorkspaceMixin does per job
    copied = {str(p.relative_to(job)) for p in job.rglob("*") if p.is_file()}
    assert not copied & DEBRIS.keys(), sorted(copied & DEBRIS.keys())
    # every source is there (bench/results is left out on purpose: results, not code)
    sources = {p for p in _tracked() if not p.startswith(("bench/results/", "images/wheels/"))}
    assert sources <= copied, sorted(sources - copied)
    assert copied <= sources, sorted(copied - sources)
    assert _size(job, copied) < 4 * MB


def test_local_docker_workspace_layer_holds_the_sources_only(checkout):
    with _build_context("unused", str(checkout)) as context, \
            tarfile.open(fileobj=context) as tar:
        members = {m.name: m.size for m in tar.getmembers() if m.isfile()}
    assert not members.keys() & DEBRIS.keys(), sorted(members.keys() & DEBRIS.keys())
    for needed in ("pyproject.toml", ".torchxconfig", "trainers/ddp.py",
                   "components/ddp.py", "components/schedulers/local/docker_engine.py"):
        assert needed in members
    assert ".git" not in members  # a worktree's .git file
    assert not [m for m in members if m.startswith(("tests/", "docs/", "bench/", ".git/"))]
    assert sum(members.values()) < 2 * MB


def _dockerfile_inputs(dockerfile: Path) -> list[str]:
    """The context paths ``dockerfile`` COPYs and bind-mounts."""
    text = dockerfile.read_text().replace("\\\n", " ")
    mounted = re.findall(r"--mount=type=bind,source=([^,\s]+)", text)
    copied = [src for line in re.findall(r"^COPY (.+)$", text, re.M)
              for src in line.split()[:-1] if not src.startswith("--")]
    return [p.rstrip("/") for p in mounted + copied]


@pytest.mark.parametrize("flavour", ["cpu", "cuda"])
def test_image_build_context_holds_what_the_dockerfile_uses(checkout, flavour):
    dockerfile = f"images/{flavour}.Dockerfile"
    ignore = checkout / f"{dockerfile}.dockerignore"
    assert ignore.is_file(), f"{dockerfile} needs its own ignore file (see images/build)"
    # as docker-py (and the Docker CLI) read an ignore file
    patterns = [line.strip() for line in ignore.read_text().splitlines()
                if line.strip() and not line.strip().startswith("#")]
    context = {p for p in exclude_paths(str(checkout), patterns, dockerfile=dockerfile)
               if (checkout / p).is_file()}
    inputs = _dockerfile_inputs(checkout / dockerfile)
    assert {"images/wheels", "images/requirements.txt", "trainers", "components"} <= set(inputs)
    for path in inputs:
        assert any(p == path or p.startswith(path + "/") for p in context), path
    assert WHEEL in context  # the staged wheels reach the build's bind mount
    leaked = sorted(p for p in context & DEBRIS.keys() if p != WHEEL)
    assert not leaked, leaked
    assert _size(checkout, context - {WHEEL}) < 2 * MB


def _load_build_script():
    loader = importlib.machinery.SourceFileLoader("images_build", str(REPO / "images" / "build"))
    spec = importlib.util.spec_from_loader("images_build", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_images_build_names_the_ignore_file_for_podman():
    build = _load_build_script()
    podman = build.build_command("podman", "cpu", "t:cpu", None, None, [])
    assert podman[podman.index("--ignorefile") + 1] == \
        str(REPO / "images" / "cpu.Dockerfile.dockerignore")
    # BuildKit finds <Dockerfile>.dockerignore next to the Dockerfile by itself
    assert "--ignorefile" not in build.build_command("docker", "cpu", "t:cpu", None, None, [])
