"""k8s/: every object schema-valid, the kustomizations complete, RBAC exactly least privilege,
and .torchxconfig's [kubernetes] and [kubernetes_jobset] profiles naming objects that k8s/ and
its Kueue overlay create."""

from __future__ import annotations

import configparser
import copy

import yaml

from tests.support.k8s import (
    K8S_DIR,
    REPO,
    manifests,
    validate_core,
    validate_kueue,
    validate_volcano,
)

KUEUE_DIR = K8S_DIR / "components/kueue"

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


def _validate(obj: dict) -> None:
    if obj["apiVersion"].endswith("volcano.sh/v1beta1") or "volcano.sh" in obj["apiVersion"]:
        validate_volcano(obj)
    elif obj["apiVersion"].startswith("kueue.x-k8s.io/"):
        validate_kueue(obj)
    else:
        validate_core(obj)


def _base() -> list[dict]:
    """The objects of k8s/ itself (not its overlays' or components')."""
    return [obj for path, obj in manifests() if path.parent == K8S_DIR]


def _granted(role: dict) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
            for r in rule["resources"] for v in rule["verbs"]}


def test_every_object_in_k8s_validates():
    objects = manifests()
    kinds = {obj["kind"] for _, obj in objects}
    assert {"Namespace", "Queue", "PriorityClass", "ServiceAccount", "Role", "RoleBinding",
            "PersistentVolumeClaim", "NetworkPolicy", "ResourceFlavor", "ClusterQueue",
            "LocalQueue", "WorkloadPriorityClass"} <= kinds
    for path, obj in objects:
        try:
            _validate(obj)
        except Exception as err:
            raise AssertionError(f"{path.relative_to(REPO)}: {obj['kind']}: {err}") from err


def test_kustomization_lists_every_manifest():
    kustomization = yaml.safe_load((K8S_DIR / "kustomization.yaml").read_text())
    files = {p.name for p in K8S_DIR.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(kustomization["resources"]) == sorted(files)


def _apply_json_patch(obj: dict, ops: list[dict]) -> dict:
    out = copy.deepcopy(obj)
    for op in ops:
        assert op["op"] == "replace", op
        *parents, leaf = op["path"].strip("/").split("/")
        node = out
        for key in parents:
            node = node[key]
        assert leaf in node, op["path"]
        node[leaf] = op["value"]
    return out


def test_kind_overlay_patches_a_valid_read_write_once_claim():
    overlay = yaml.safe_load((K8S_DIR / "overlays/kind/kustomization.yaml").read_text())
    assert overlay["resources"] == ["../.."]
    objects = [obj for _, obj in manifests(K8S_DIR) if "overlays" not in str(_)]
    for patch in overlay["patches"]:
        target = patch["target"]
        (obj,) = [o for o in objects if o["kind"] == target["kind"]
                  and o["metadata"]["name"] == target["name"]]
        patched = _apply_json_patch(obj, yaml.safe_load(patch["patch"]))
        validate_core(patched)
        assert patched["spec"]["accessModes"] == ["ReadWriteOnce"]


def test_rbac_grants_exactly_what_torchx_needs_in_one_namespace():
    assert not [o for _, o in manifests() if o["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    objects = _base()
    (role,) = [o for o in objects if o["kind"] == "Role"]
    granted = _granted(role)
    assert "*" not in {x for triple in granted for x in triple}
    assert granted == REQUIRED_ACCESS
    (binding,) = [o for o in objects if o["kind"] == "RoleBinding"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    accounts = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ServiceAccount"}
    assert [s["name"] for s in binding["subjects"]] == ["torchx-submitter"]
    assert accounts["torchx-trainer"]["automountServiceAccountToken"] is False
    assert not [b for b in objects if b["kind"] == "RoleBinding"
                and "torchx-trainer" in {s["name"] for s in b["subjects"]}]


def test_torchxconfig_profile_names_objects_that_k8s_creates():
    config = configparser.ConfigParser()
    config.read(REPO / ".torchxconfig")
    profile = config["kubernetes"]
    names = {(o["kind"], o["metadata"]["name"]) for o in _base()}
    assert ("Queue", profile["queue"]) in names
    assert ("Namespace", profile["namespace"]) in names
    assert ("ServiceAccount", profile["service_account"]) in names
    assert ("PriorityClass", profile["priority_class"]) in names
    assert ("PersistentVolumeClaim", profile["checkpoint_pvc"].split(":")[0]) in names


def test_kueue_overlays_add_the_component_to_k8s_and_to_kind():
    for overlay, base in (("kueue", ["../.."]), ("kind-kueue", ["../kind"])):
        kustomization = yaml.safe_load((K8S_DIR / f"overlays/{overlay}/kustomization.yaml")
                                       .read_text())
        assert kustomization["resources"] == base
        assert kustomization["components"] == ["../../components/kueue"]
    component = yaml.safe_load((KUEUE_DIR / "kustomization.yaml").read_text())
    assert component["kind"] == "Component"
    files = {p.name for p in KUEUE_DIR.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(component["resources"]) == sorted(files)
    # no Volcano Queue where only JobSet and Kueue are installed: the base's is deleted
    (patch,) = [yaml.safe_load(p["patch"]) for p in component["patches"]]
    assert patch["$patch"] == "delete"
    assert (patch["kind"], patch["metadata"]["name"]) in {
        (o["kind"], o["metadata"]["name"]) for o in _base()}


def test_kueue_rbac_adds_exactly_what_kubernetes_jobset_needs():
    objects = [obj for path, obj in manifests(KUEUE_DIR)]
    (role,) = [o for o in objects if o["kind"] == "Role"]
    assert _granted(role) == REQUIRED_JOBSET_ACCESS
    (binding,) = [o for o in objects if o["kind"] == "RoleBinding"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert [s["name"] for s in binding["subjects"]] == ["torchx-submitter"]
    assert {o["metadata"]["namespace"] for o in (role, binding)} == {"torchx-templates"}


def test_kueue_objects_admit_the_jobset_profile():
    """[kubernetes_jobset]'s LocalQueue is in its namespace, its ClusterQueue admits that
    namespace with a flavor that exists, and its priority classes exist (Kubernetes' and
    Kueue's)."""
    config = configparser.ConfigParser()
    config.read(REPO / ".torchxconfig")
    profile = config["kubernetes_jobset"]
    objects = [obj for _, obj in manifests()]
    by_kind = {}
    for obj in objects:
        by_kind.setdefault(obj["kind"], {})[obj["metadata"]["name"]] = obj
    queue = by_kind["LocalQueue"][profile["local_queue"]]
    assert queue["metadata"]["namespace"] == profile["namespace"]
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
