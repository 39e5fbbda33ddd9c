"""k8s/ as ``kubectl kustomize`` builds it (the base and every overlay, with the real client):
every core object schema-valid, every manifest file in a build, the overlays changing exactly
what they say, RBAC exactly least privilege, and .torchxconfig's [kubernetes] and
[kubernetes_jobset] profiles naming objects that the builds create, and the Volcano and
Kueue objects of the builds against their CRD schemas (``VOLCANO_CRD_DIR``, ``KUEUE_CRD_DIR``;
unset, that test skips, which fails under CI=true)."""

from __future__ import annotations

import configparser

import pytest
import yaml

from tests.support.k8s import (
    K8S_DIR,
    KUSTOMIZATIONS,
    REPO,
    by_id,
    crd_setting,
    kustomize_build,
    manifests,
    object_id,
    validate_core,
    validate_crd,
)

BASE_DIR = K8S_DIR / "base"
KUEUE_DIR = K8S_DIR / "components/kueue"
# Each Kueue overlay and the kustomization it adds the Kueue component to.
KUEUE_OVERLAYS = {"overlays/kueue": "base", "overlays/kind-kueue": "overlays/kind"}
CORE_KINDS = {"Namespace", "PriorityClass", "ServiceAccount", "Role", "RoleBinding",
              "PersistentVolumeClaim", "NetworkPolicy"}
# The kinds of each build's custom resources: the Volcano Queue (base) or Kueue's (overlays).
CRD_KINDS = {"base": {"Queue"}, "overlays/kind": {"Queue"},
             **{k: {"ResourceFlavor", "ClusterQueue", "LocalQueue", "WorkloadPriorityClass"}
                for k in KUEUE_OVERLAYS}}

# What kubernetes_jobset calls beyond the pod, event and log reads of REQUIRED_ACCESS (schedule,
# describe, cancel, list), plus reading Kueue's view of a waiting job.
REQUIRED_JOBSET_ACCESS = {
    *(("jobset.x-k8s.io", "jobsets", v) for v in ("create", "get", "list", "watch", "delete")),
    ("jobset.x-k8s.io", "jobsets/status", "get"),
    *(("kueue.x-k8s.io", r, v) for r in ("workloads", "localqueues")
      for v in ("get", "list", "watch")),
}
# What torchx's kubernetes scheduler calls (schedule, describe, cancel, list, log) plus
# watching pods and events: (API group, resource, verb).
REQUIRED_ACCESS = {
    *(("batch.volcano.sh", "jobs", v) for v in ("create", "get", "list", "watch", "delete")),
    ("batch.volcano.sh", "jobs/status", "get"),
    *(("", r, v) for r in ("pods", "events") for v in ("get", "list", "watch")),
    ("", "pods/log", "get"),
}


def _granted(role: dict) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
            for r in rule["resources"] for v in rule["verbs"]}


def _named(objects: list[dict]) -> dict[str, dict[str, dict]]:
    """kind -> name -> object."""
    out: dict[str, dict[str, dict]] = {}
    for obj in objects:
        out.setdefault(obj["kind"], {})[obj["metadata"]["name"]] = obj
    return out


def _files(directory) -> list[dict]:
    return [obj for path, obj in manifests(directory) if path.parent == directory]


def test_every_kustomization_under_k8s_is_built():
    """The kustomizations the tests build are all there are (a Component is built through the
    overlays that add it)."""
    found = set()
    for path in K8S_DIR.rglob("kustomization.yaml"):
        if yaml.safe_load(path.read_text())["kind"] == "Kustomization":
            found.add(str(path.parent.relative_to(K8S_DIR)))
    assert found == set(KUSTOMIZATIONS)
    assert yaml.safe_load((KUEUE_DIR / "kustomization.yaml").read_text())["kind"] == "Component"


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_core_object_of_the_build_validates(kustomization):
    objects = kustomize_build(kustomization)
    by_id(objects)  # no two objects with one id
    kinds = {o["kind"] for o in objects}
    assert kinds == CORE_KINDS | CRD_KINDS[kustomization]
    for obj in objects:
        if crd_setting(obj) is not None:  # validated against its CRD below
            assert obj["kind"] in CRD_KINDS[kustomization], obj["kind"]
            continue
        try:
            validate_core(obj)
        except Exception as err:
            raise AssertionError(f"{kustomization}: {obj['kind']} "
                                 f"{obj['metadata']['name']}: {err}") from err


def test_base_builds_exactly_the_objects_of_its_files():
    """k8s/base's kustomization lists every manifest file there, and kustomize passes them
    through unchanged."""
    assert by_id(kustomize_build("base")) == by_id(_files(BASE_DIR))
    listed = yaml.safe_load((BASE_DIR / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted(p.name for p in BASE_DIR.glob("*.yaml")
                                    if p.name != "kustomization.yaml")


def test_every_manifest_file_under_k8s_is_in_a_build():
    built = {}
    for kustomization in KUSTOMIZATIONS:
        built.update(by_id(kustomize_build(kustomization)))
    files = manifests()
    assert files
    for path, obj in files:
        assert object_id(obj) in built, f"{path.relative_to(REPO)}: {object_id(obj)}"


def test_kind_overlay_turns_the_outputs_claim_into_read_write_once_2gi():
    base, kind = by_id(kustomize_build("base")), by_id(kustomize_build("overlays/kind"))
    claim_id = ("v1", "PersistentVolumeClaim", "torchx-templates", "torchx-outputs")
    assert base[claim_id]["spec"]["accessModes"] == ["ReadWriteMany"]
    claim = kind.pop(claim_id)
    validate_core(claim)
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "2Gi"
    base.pop(claim_id)
    assert kind == base  # the claim is all that changes


@pytest.mark.parametrize("overlay", sorted(KUEUE_OVERLAYS))
def test_kueue_overlays_drop_the_volcano_queue_and_add_the_component(overlay):
    """Each Kueue overlay is its base (k8s/base, or the kind overlay) without the Volcano Queue
    (its CRD is absent where only JobSet and Kueue are installed) plus exactly the objects of
    k8s/components/kueue's files."""
    built = by_id(kustomize_build(overlay))
    base = by_id(kustomize_build(KUEUE_OVERLAYS[overlay]))
    (queue,) = [i for i in base if i[1] == "Queue"]
    assert queue[0].startswith("scheduling.volcano.sh/")
    del base[queue]
    component = by_id(_files(KUEUE_DIR))
    assert {i[1] for i in component} >= {"ResourceFlavor", "ClusterQueue", "LocalQueue",
                                         "WorkloadPriorityClass", "Role", "RoleBinding"}
    assert built == {**base, **component}
    assert not set(base) & set(component)


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_rbac_grants_exactly_what_torchx_needs_in_one_namespace(kustomization):
    """torchx-submitter holds exactly what ``-s kubernetes`` needs, plus what
    ``-s kubernetes_jobset`` needs where the Kueue component is added, in its namespace only;
    torchx-trainer holds nothing and mounts no token."""
    objects = kustomize_build(kustomization)
    assert not [o for o in objects if o["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    named = _named(objects)
    roles, bindings = named["Role"], named["RoleBinding"]
    assert {b["roleRef"]["name"] for b in bindings.values()} == set(roles)
    for binding in bindings.values():
        assert binding["roleRef"]["kind"] == "Role"
        assert [(s["kind"], s["name"]) for s in binding["subjects"]] == [
            ("ServiceAccount", "torchx-submitter")]
    namespaces = {o["metadata"]["namespace"] for o in [*roles.values(), *bindings.values()]}
    assert namespaces == {"torchx-templates"}
    granted = [_granted(role) for role in roles.values()]
    assert "*" not in {x for triples in granted for triple in triples for x in triple}
    assert _granted(roles["torchx-submitter"]) == REQUIRED_ACCESS
    if kustomization in KUEUE_OVERLAYS:
        assert _granted(roles["torchx-submitter-jobset"]) == REQUIRED_JOBSET_ACCESS
        assert set(roles) == {"torchx-submitter", "torchx-submitter-jobset"}
    else:
        assert set(roles) == {"torchx-submitter"}
    accounts = named["ServiceAccount"]
    assert set(accounts) == {"torchx-submitter", "torchx-trainer"}
    assert accounts["torchx-trainer"]["automountServiceAccountToken"] is False


@pytest.mark.parametrize("kustomization", ["base", "overlays/kind"])
def test_torchxconfig_profile_names_objects_that_the_build_creates(kustomization):
    config = configparser.ConfigParser()
    config.read(REPO / ".torchxconfig")
    profile = config["kubernetes"]
    names = {(o["kind"], o["metadata"]["name"]) for o in kustomize_build(kustomization)}
    assert ("Queue", profile["queue"]) in names
    assert ("Namespace", profile["namespace"]) in names
    assert ("ServiceAccount", profile["service_account"]) in names
    assert ("PriorityClass", profile["priority_class"]) in names
    assert ("PersistentVolumeClaim", profile["checkpoint_pvc"].split(":")[0]) in names


@pytest.mark.parametrize("overlay", sorted(KUEUE_OVERLAYS))
def test_kueue_objects_admit_the_jobset_profile(overlay):
    """[kubernetes_jobset]'s LocalQueue is in its namespace, its ClusterQueue admits that
    namespace with a flavor that exists, and its priority classes exist (Kubernetes' and
    Kueue's), all in the overlay's build."""
    config = configparser.ConfigParser()
    config.read(REPO / ".torchxconfig")
    profile = config["kubernetes_jobset"]
    by_kind = _named(kustomize_build(overlay))
    queue = by_kind["LocalQueue"][profile["local_queue"]]
    assert queue["metadata"]["namespace"] == profile["namespace"]
    assert profile["namespace"] in by_kind["Namespace"]
    assert profile["service_account"] in by_kind["ServiceAccount"]
    assert profile["checkpoint_pvc"].split(":")[0] in by_kind["PersistentVolumeClaim"]
    cluster_queue = by_kind["ClusterQueue"][queue["spec"]["clusterQueue"]]
    assert cluster_queue["spec"]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": profile["namespace"]}
    (group,) = cluster_queue["spec"]["resourceGroups"]
    assert {f["name"] for f in group["flavors"]} <= set(by_kind["ResourceFlavor"])
    assert {"cpu", "memory"} <= set(group["coveredResources"])
    assert profile["workload_priority_class"] in by_kind["WorkloadPriorityClass"]
    assert profile["priority_class"] in by_kind["PriorityClass"]
    for key in ("namespace", "service_account", "checkpoint_pvc"):
        assert profile[key].split(":")[0] == config["kubernetes"][key].split(":")[0]


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_custom_resource_of_the_build_matches_its_crd(kustomization):
    """The Volcano Queue of k8s/base and the kind overlay; Kueue's objects of the Kueue
    overlays."""
    custom = [o for o in kustomize_build(kustomization) if crd_setting(o) is not None]
    assert {o["kind"] for o in custom} == CRD_KINDS[kustomization]
    for obj in custom:
        try:
            validate_crd(crd_setting(obj), obj)
        except Exception as err:
            raise AssertionError(f"{kustomization}: {obj['kind']} "
                                 f"{obj['metadata']['name']}: {err}") from err
