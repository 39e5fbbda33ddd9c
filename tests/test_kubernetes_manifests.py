"""k8s/: every object schema-valid, the kustomizations complete, RBAC exactly least privilege,
and .torchxconfig's [kubernetes] profile naming objects that k8s/ creates."""

from __future__ import annotations

import configparser
import copy

import yaml

from tests.k8s_support import K8S_DIR, REPO, manifests, validate_core, validate_volcano

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
    else:
        validate_core(obj)


def test_every_object_in_k8s_validates():
    objects = manifests()
    kinds = {obj["kind"] for _, obj in objects}
    assert {"Namespace", "Queue", "PriorityClass", "ServiceAccount", "Role", "RoleBinding",
            "PersistentVolumeClaim", "NetworkPolicy"} <= kinds
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
    objects = [obj for _, obj in manifests()]
    assert not [o for o in objects if o["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    (role,) = [o for o in objects if o["kind"] == "Role"]
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
               for r in rule["resources"] for v in rule["verbs"]}
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
    names = {(o["kind"], o["metadata"]["name"]) for _, o in manifests()}
    assert ("Queue", profile["queue"]) in names
    assert ("Namespace", profile["namespace"]) in names
    assert ("ServiceAccount", profile["service_account"]) in names
    assert ("PriorityClass", profile["priority_class"]) in names
    assert ("PersistentVolumeClaim", profile["checkpoint_pvc"].split(":")[0]) in names
