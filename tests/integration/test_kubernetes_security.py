"""checkov on what ``kubectl kustomize`` builds from k8s/ (the base and every overlay) and on
the pods every rendered Volcano Job and JobSet creates: no failed check, and each skipped check
justified beside its id."""

from __future__ import annotations

import pytest
import yaml

from tests.integration.test_kubernetes_render import TRAINER_ARGS
from tests.support.checkov import checkov_executable, failures, scan
from tests.support.k8s import KUSTOMIZATIONS, REPO, jobset_pods, kustomize_build, pod_of, render

# checkov lives in an environment of its own, built on first use (about a minute; .ci/run builds
# it in the background while README's tier runs): not a laptop's fast tier.
pytestmark = [pytest.mark.slow, pytest.mark.torchx_main]

# Checks skipped for the rendered training pods, each with its reason. Nothing is skipped for
# the builds of k8s/. The Volcano Job itself is not scanned: checkov reads any kind "Job" as
# batch/v1 and looks for spec.template, which a Volcano Job keeps per task
# (spec.tasks[].template), so the pods Volcano creates from those templates are what is scanned.
POD_SKIPS = {
    "CKV_K8S_8": "liveness probe: a training process serves nothing to probe, and a probe that "
                 "restarts a slow step would kill a healthy gang-scheduled job",
    "CKV_K8S_9": "readiness probe: no Service routes traffic to training pods (the svc "
                 "plugin's headless service publishes not-ready addresses on purpose)",
    "CKV_K8S_15": "imagePullPolicy Always: the image is the user's --image; kind and air-gapped "
                  "clusters run pre-loaded images that Always would fail to pull",
    "CKV_K8S_43": "image digest: the image is the user's --image (a digest works: "
                  "--image REGISTRY/torchx-templates@sha256:...); the default is a local tag",
    "CKV_K8S_40": "UID >= 10000: the image's user is uid 1000 (images/), kept so that "
                  "runAsNonRoot is verifiable and files in the image stay readable",
    "CKV_K8S_35": "secrets as environment: only with the opt-in secret_env option, for tools "
                  "that read tokens from the environment; secret_volumes mounts files instead",
}


@pytest.fixture(scope="module")
def checkov():
    return checkov_executable(REPO)


def test_checkov_passes_every_kustomize_build_without_skips(checkov, tmp_path):
    """Each build written to its own file, all scanned at once: checkov reads every object of
    every build and fails no check."""
    objects = 0
    for kustomization in KUSTOMIZATIONS:
        build = kustomize_build(kustomization)
        objects += len(build)
        (tmp_path / (kustomization.replace("/", "-") + ".yaml")).write_text(
            yaml.safe_dump_all(build))
    report = scan(checkov, tmp_path, skip={})
    assert report["summary"]["resource_count"] == objects
    assert report["summary"]["passed"] > 0 and report["summary"]["parsing_errors"] == 0
    assert failures(report) == []


def test_checkov_passes_every_rendered_pod(checkov, tmp_path):
    """Every component's multi-node pods with the default profile, and a ddp job with every
    pod option, scanned next to k8s/base's NetworkPolicy (which selects them)."""
    jobs = [render(c, "1x1" if c == "model_parallel" else "2x2", TRAINER_ARGS[c])
            for c in TRAINER_ARGS]
    jobs.append(render("ddp", "2x2", TRAINER_ARGS["ddp"], cfg=(
        "node_selector=pool:train,tolerations=nvidia.com/gpu:NoSchedule,"
        "secret_env=HF_TOKEN:hf-token:token,secret_volumes=gcs-key:/var/run/gcs,"
        "image_pull_secrets=registry-creds,shm_size=512Mi")))
    _assert_pods_pass(checkov, tmp_path, [[pod_of(job, task) for task in job["spec"]["tasks"]]
                                          for job in jobs])


def test_checkov_passes_every_rendered_jobset_pod(checkov, tmp_path):
    """The same for ``-s kubernetes_jobset``: the pods of every component's JobSet."""
    jobsets = [render(c, "1x1" if c == "model_parallel" else "2x2", TRAINER_ARGS[c],
                      scheduler="kubernetes_jobset") for c in TRAINER_ARGS]
    _assert_pods_pass(checkov, tmp_path, [jobset_pods(jobset) for jobset in jobsets])


def _assert_pods_pass(checkov, tmp_path, jobs_pods: list[list[dict]]) -> None:
    """checkov finds nothing (but :data:`POD_SKIPS`) in the pods of each job, scanned next to
    k8s/base's NetworkPolicy as kubectl kustomize builds it (which selects them)."""
    for i, pods in enumerate(jobs_pods):
        for pod in pods:
            pod["metadata"]["namespace"] = "torchx-templates"  # .torchxconfig's namespace
        (tmp_path / f"job-{i}.yaml").write_text(yaml.safe_dump_all(pods))
    (policy,) = [o for o in kustomize_build("base") if o["kind"] == "NetworkPolicy"]
    (tmp_path / "network-policy.yaml").write_text(yaml.safe_dump(policy))
    report = scan(checkov, tmp_path, skip=POD_SKIPS)
    assert report["summary"]["resource_count"] >= 2 * len(jobs_pods)
    assert report["summary"]["parsing_errors"] == 0
    assert failures(report) == []
