"""doctor's warm pools rows as pure functions over the objects the API server returns, and over
a cluster that answers from memory: a healthy site, then each row failing."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from maas_kubevirt import doctor, policies
from maas_kubevirt.doctor import pools as rows
from maas_kubevirt.kube import KubeError
from maas_kubevirt.pools import access
from maas_kubevirt.pools.spec import NAMESPACE_LABEL, Pool
from maas_kubevirt.values import load_values

APPLY = "`maas-kubevirt render --output build && kubectl apply -k build/kubernetes`"
POOL = {"name": "small", "namespace": "maas-pools", "cores": 2, "memory": "4Gi", "disk": "20Gi",
        "storage_class": "standard", "network": "pxe-net/pxe", "ready": 1, "max": 2}
SYSTEM = "maas-kubevirt"   # kubernetes.system_namespace's default: the account's namespace
RBAC = "/apis/rbac.authorization.k8s.io/v1"


def values(tmp_path: Path, pools=(POOL,), kubeconfig: str | None = "") -> dict:
    """Default values with these pools; kubeconfig "" writes a usable one, None leaves it unset."""
    given: dict = {"pools": list(pools)}
    if kubeconfig is not None:
        path = kubeconfig or str(tmp_path / "pools.kubeconfig")
        if not kubeconfig:
            Path(path).write_text(yaml.safe_dump({
                "apiVersion": "v1", "kind": "Config", "current-context": "c",
                "clusters": [{"name": "k", "cluster": {"server": "https://192.0.2.1:6443"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
        given["reconciler"] = {"pools": {"kubeconfig": path}}
    file = tmp_path / "values.yaml"
    file.write_text(yaml.safe_dump(given))
    return load_values(file)


def namespace(name: str, *labels: tuple[str, str]) -> dict:
    return {"metadata": {"name": name, "labels": dict(labels)}}


OPTED_IN = (("maas.io/kubevirt-bmc", "enabled"), (policies.KUBEMACPOOL_LABEL, "allocate"), NAMESPACE_LABEL)


def binding(namespace: str, name: str = access.ROLE_BINDING, subject_namespace: str = SYSTEM, **extra) -> dict:
    return {"metadata": {"name": name, "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": access.CLUSTER_ROLE},
            "subjects": [{"kind": "ServiceAccount", "name": access.ACCOUNT, "namespace": subject_namespace}], **extra}


ROLE = {"metadata": {"name": access.CLUSTER_ROLE}, "rules": [
    {"apiGroups": ["kubevirt.io"], "resources": ["virtualmachines"], "verbs": ["get", "list", "create", "delete"]},
    {"apiGroups": ["cdi.kubevirt.io"], "resources": ["datavolumes"], "verbs": ["get", "list"]}]}


class PoolsCluster:
    """Answers get and items from a dict of paths, as kube.Cluster answers from the API server."""

    def __init__(self):
        self.objects = {
            "/api/v1/namespaces/maas-pools": namespace("maas-pools", *OPTED_IN),
            "/apis/k8s.cni.cncf.io/v1/namespaces/pxe-net/network-attachment-definitions/pxe": {"metadata": {}},
            "/apis/storage.k8s.io/v1/storageclasses/standard": {"metadata": {}},
            f"{RBAC}/clusterroles/{access.CLUSTER_ROLE}": copy.deepcopy(ROLE),
            f"/api/v1/namespaces/{SYSTEM}/serviceaccounts/{access.ACCOUNT}": {"metadata": {}},
        }
        self.crds = {rows.DATAVOLUME_CRD: {"spec": {"versions": [{"name": "v1beta1", "served": True}]}}}
        self.lists = {f"{RBAC}/rolebindings": [binding("maas-pools"), {"metadata": {"name": "x", "namespace": "a"},
                                                                       "roleRef": {"kind": "Role", "name": "y"}}],
                      f"{RBAC}/clusterrolebindings": []}
        self.gets: list[str] = []
        self.down = False

    def get(self, path):
        if self.down:
            raise KubeError(path, None, "connection refused")
        self.gets.append(path)
        return copy.deepcopy(self.objects.get(path))

    def crd(self, name):
        return self.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}") or self.crds.get(name)

    def items(self, path, label_selector=None):
        return copy.deepcopy(self.lists.get(path, []))


def statuses(checks):
    return {c.name: c.status for c in checks}


def test_a_healthy_site_passes_every_pool_row(tmp_path):
    checks = rows.pools_checks(values(tmp_path), PoolsCluster(), APPLY)
    assert statuses(checks) == {"pools.namespace/small": "ok", "pools.network/small": "ok",
                                "pools.storage_class/small": "ok", "pools.datavolumes": "ok",
                                "pools.cluster_role": "ok", "pools.role_bindings": "ok", "pools.account": "ok",
                                "pools.kubeconfig": "ok"}


def test_without_pools_there_is_no_row_at_all(tmp_path):
    assert rows.pools_checks(values(tmp_path, pools=(), kubeconfig=None), PoolsCluster(), APPLY) == []


def test_without_a_cluster_only_the_kubeconfig_row_and_with_the_api_down_the_rest_skipped(tmp_path):
    assert statuses(rows.pools_checks(values(tmp_path), None, APPLY)) == {"pools.kubeconfig": "ok"}
    skipped = rows.pools_checks(values(tmp_path), PoolsCluster(), APPLY, api_down=True)
    assert [c.status for c in skipped] == ["skip"] * 7 + ["ok"]
    cluster = PoolsCluster()
    cluster.down = True
    checks = rows.pools_checks(values(tmp_path), cluster, APPLY)
    assert [c.name for c in checks[:2]] == ["cluster.api", "pools.namespace/small"]
    assert checks[0].status == "fail" and {c.status for c in checks[1:-1]} == {"skip"}


@pytest.mark.parametrize("labels, missing", [
    (OPTED_IN[1:], ["maas.io/kubevirt-bmc=enabled"]),
    (OPTED_IN[:1] + OPTED_IN[2:], [f"{policies.KUBEMACPOOL_LABEL}=allocate"]),
    (OPTED_IN[:2], ["maas-kubevirt.io/pools=enabled"]),
])
def test_the_pool_namespace_needs_each_label(labels, missing):
    pool = Pool(**{**POOL, "tags": ()})
    check = rows.pool_namespace_check(pool, namespace("maas-pools", *labels), OPTED_IN[0])
    assert check.status == "fail" and list(check.subjects) == missing
    assert check.fix == f"`kubectl label --overwrite namespace maas-pools {missing[0]}`"
    assert rows.pool_namespace_check(pool, None, OPTED_IN[0]).status == "fail"
    deleting = namespace("maas-pools", *OPTED_IN)
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert "being deleted" in rows.pool_namespace_check(pool, deleting, OPTED_IN[0]).found


def test_a_missing_network_storage_class_account_or_datavolume_crd_fails(tmp_path):
    cluster = PoolsCluster()
    for path in list(cluster.objects):
        if "network-attachment" in path or "storageclasses" in path or "serviceaccounts" in path:
            del cluster.objects[path]
    cluster.crds.clear()
    checks = {c.name: c for c in rows.pools_checks(values(tmp_path), cluster, APPLY)}
    assert "NetworkAttachmentDefinition pxe-net/pxe does not exist" in checks["pools.network/small"].found
    assert checks["pools.storage_class/small"].status == "fail"
    assert checks["pools.account"].status == "fail" and SYSTEM in checks["pools.account"].found
    assert checks["pools.datavolumes"].status == "fail"


def test_a_network_without_a_namespace_is_the_pools_own():
    pool = Pool(**{**POOL, "network": "pxe", "tags": ()})
    assert rows.network_where(pool) == ("maas-pools", "pxe")


def test_a_datavolume_crd_that_does_not_serve_v1beta1_fails():
    crd = {"spec": {"versions": [{"name": "v1beta1", "served": False}, {"name": "v1alpha1", "served": True}]}}
    check = rows.datavolumes_check(crd)
    assert check.status == "fail" and "serves v1alpha1, not v1beta1" in check.found


@pytest.mark.parametrize("rule, named", [
    ({"apiGroups": ["kubevirt.io"], "resources": ["virtualmachines"], "verbs": ["update", "patch"]},
     ["patch virtualmachines.kubevirt.io", "update virtualmachines.kubevirt.io"]),
    ({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}, ["get secrets"]),
    ({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}, ["* *.*"]),
    ({"apiGroups": ["kubevirt.io"], "resources": ["virtualmachines/status"], "verbs": ["get"]},
     ["get virtualmachines/status.kubevirt.io"]),
    ({"nonResourceURLs": ["/metrics"], "verbs": ["get"]}, ["get url:/metrics"]),
])
def test_the_cluster_role_fails_on_any_grant_beyond_the_pools(rule, named):
    role = copy.deepcopy(ROLE)
    role["rules"].append(rule)
    check = rows.cluster_role_check(role, APPLY)
    assert check.status == "fail" and list(check.subjects) == named and check.fix.startswith("remove those rules")


def test_the_cluster_role_fails_when_missing_short_or_aggregated():
    assert rows.cluster_role_check(None, APPLY).status == "fail"
    short = copy.deepcopy(ROLE)
    short["rules"][0]["verbs"] = ["get", "list", "create"]
    assert rows.cluster_role_check(short, APPLY).subjects == ("delete virtualmachines.kubevirt.io",)
    named = copy.deepcopy(ROLE)
    named["rules"][1]["resourceNames"] = ["one"]    # a named object is no grant of the resource
    assert rows.cluster_role_check(named, APPLY).status == "fail"
    aggregated = {**copy.deepcopy(ROLE), "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"a": "b"}}]}}
    assert rows.cluster_role_check(aggregated, APPLY).status == "fail"


def test_the_role_binding_must_be_in_each_pool_namespace_and_no_other():
    check = rows.role_bindings_check(["maas-pools", "more"], [binding("maas-pools")], [], SYSTEM, APPLY)
    assert check.status == "fail" and check.subjects == ("more",)
    elsewhere = rows.role_bindings_check(["maas-pools"], [binding("maas-pools"), binding("tenant")], [], SYSTEM, APPLY)
    assert elsewhere.status == "fail"
    assert elsewhere.subjects == ("RoleBinding tenant/maas-kubevirt-pools (no pool's namespace)",)
    other = binding("maas-pools", subject_namespace="tenant")
    assert "other subjects" in rows.role_bindings_check(["maas-pools"], [other], [], SYSTEM, APPLY).found
    everywhere = {**binding("maas-pools"), "metadata": {"name": "all"}}
    cluster_wide = rows.role_bindings_check(["maas-pools"], [binding("maas-pools")], [everywhere], SYSTEM, APPLY)
    assert cluster_wide.status == "fail" and cluster_wide.subjects == ("ClusterRoleBinding all (every namespace)",)


def test_the_kubeconfig_row_fails_unset_or_unusable_and_skips_off_the_maas_host(tmp_path):
    assert rows.kubeconfig_check(values(tmp_path, kubeconfig=None)).fix == access.NEEDS_KUBECONFIG
    elsewhere = rows.kubeconfig_check(values(tmp_path, kubeconfig=str(tmp_path / "absent")))
    assert elsewhere.status == "skip" and "elsewhere than the MAAS host" in elsewhere.found
    broken = tmp_path / "broken"
    broken.write_text("clusters: 3\n")
    assert rows.kubeconfig_check(values(tmp_path, kubeconfig=str(broken))).status == "fail"


def test_doctor_runs_the_pool_rows_after_the_cluster_rows(tmp_path, monkeypatch):
    given = values(tmp_path)
    monkeypatch.setattr(doctor, "cluster_checks", lambda *args: [doctor.Check("cluster.crds", "ok", "")])
    monkeypatch.setattr(doctor, "maas_checks", lambda *args: [])
    monkeypatch.setattr(doctor, "lease_checks", lambda *args: doctor.Check("reconciler.lease", "ok", ""))
    monkeypatch.setattr(doctor, "cluster_generations", lambda *args: ({}, ""))

    class NoMaas:
        def rack_controllers(self):
            return []

    names = [c.name for c in doctor.run(given, NoMaas(), PoolsCluster(), doctor.Options(resolve=lambda host: []))]
    at = names.index("cluster.crds")
    assert names[at + 1:at + 9] == ["pools.namespace/small", "pools.network/small", "pools.storage_class/small",
                                    "pools.datavolumes", "pools.cluster_role", "pools.role_bindings", "pools.account",
                                    "pools.kubeconfig"]
