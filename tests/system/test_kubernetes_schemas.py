"""The Volcano, JobSet and Kueue objects of the Kubernetes tests against the CRD schemas of the
pinned releases (Volcano v1.15.1, JobSet v0.12.0, Kueue v0.19.2), read from the directories in
``VOLCANO_CRD_DIR``, ``JOBSET_CRD_DIR`` and ``KUEUE_CRD_DIR`` (tests/support/k8s.py: a missing
setting skips, and fails under CI=true): the Volcano Jobs and JobSets that the integration tests
render, the recorded JobSets of the unit tests, and every custom resource that
``kubectl kustomize`` builds from k8s/. The integration and unit tests check everything else
about the same objects (their pods and core objects against the Kubernetes schema)."""

from __future__ import annotations

import pytest

from tests.integration import test_kubernetes_fault_tolerant as fault_tolerant_tests
from tests.integration import test_kubernetes_jobset as jobset_tests
from tests.integration import test_kubernetes_render as volcano_tests
from tests.integration.test_kubernetes_manifests import CRD_KINDS
from tests.support.k8s import (
    KUSTOMIZATIONS,
    crd_dir,
    crd_setting,
    kustomize_build,
    validate_core,
    validate_crd,
    validate_jobset,
    validate_volcano,
)
from tests.unit.test_kubernetes_jobset_status import SCENARIOS

CASE_ARGS = ("component", "j", "nodes", "min_nodes")


@pytest.fixture
def volcano_crds():
    """Skips before rendering when ``VOLCANO_CRD_DIR`` is unset."""
    crd_dir("VOLCANO_CRD_DIR")


@pytest.fixture
def jobset_crds():
    """Skips before rendering when ``JOBSET_CRD_DIR`` is unset."""
    crd_dir("JOBSET_CRD_DIR")


@pytest.mark.parametrize(CASE_ARGS, volcano_tests.CASES)
def test_rendered_volcano_job_matches_the_crd(volcano_crds, component, j, nodes, min_nodes):
    job = volcano_tests.render_case(component, j)
    assert job["kind"] == "Job" and len(job["spec"]["tasks"]) == nodes
    validate_volcano(job)


def test_volcano_job_with_every_pod_option_matches_the_crd(volcano_crds):
    validate_volcano(volcano_tests.render_pod_options())


@pytest.mark.parametrize(("j", "options", "cfg", "size"), volcano_tests.SHM_CASES)
def test_volcano_job_with_sized_dev_shm_matches_the_crd(volcano_crds, j, options, cfg, size):
    validate_volcano(volcano_tests.render_shm_case(j, options, cfg))


@pytest.mark.parametrize("component", volcano_tests.MAX_RETRIES_COMPONENTS)
def test_volcano_job_with_max_retries_matches_the_crd(volcano_crds, component):
    job = volcano_tests.render_max_retries(component)
    assert job["spec"]["maxRetry"] == 3
    validate_volcano(job)


@pytest.mark.parametrize(CASE_ARGS, jobset_tests.CASES)
def test_rendered_jobset_matches_the_crd(jobset_crds, component, j, nodes, min_nodes):
    jobset = jobset_tests.render_case(component, j)
    assert jobset["kind"] == "JobSet"
    validate_jobset(jobset)


def test_jobset_with_pod_options_and_max_retries_matches_the_crd(jobset_crds):
    jobset = jobset_tests.render_pod_options_and_max_retries()
    assert jobset["spec"]["failurePolicy"]["maxRestarts"] == 2
    validate_jobset(jobset)


@pytest.mark.parametrize(("j", "options", "cfg", "size"), volcano_tests.SHM_CASES)
def test_jobset_with_sized_dev_shm_matches_the_crd(jobset_crds, j, options, cfg, size):
    validate_jobset(jobset_tests.render_shm_case(j, options, cfg))


def test_fault_tolerant_volcano_job_matches_the_crd(volcano_crds):
    """The lighthouse task and the replica groups' own task policies (RestartTask)."""
    validate_volcano(fault_tolerant_tests.render_volcano())


def test_fault_tolerant_jobset_matches_the_crd(jobset_crds):
    """The replica groups' backoffLimit and the FailJobSet rule naming them."""
    validate_jobset(fault_tolerant_tests.render_jobset())


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_recorded_objects_match_the_api_schemas(scenario):
    """tests/support/k8s_objects/jobset_states.yaml: each JobSet against JobSet's CRD schema,
    each pod against the Kubernetes schema."""
    validate_jobset(SCENARIOS[scenario]["jobset"])
    for pod in SCENARIOS[scenario]["pods"]:
        validate_core(pod)


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_custom_resource_of_the_build_matches_its_crd(kustomization):
    """The Volcano Queue of k8s/base and the kind overlay; Kueue's objects of the Kueue
    overlays (their core objects: tests/integration/test_kubernetes_manifests.py)."""
    custom = [o for o in kustomize_build(kustomization) if crd_setting(o) is not None]
    assert {o["kind"] for o in custom} == CRD_KINDS[kustomization]
    for obj in custom:
        try:
            validate_crd(crd_setting(obj), obj)
        except Exception as err:
            raise AssertionError(f"{kustomization}: {obj['kind']} "
                                 f"{obj['metadata']['name']}: {err}") from err
