"""doctor's warm pools rows (only with ``pools``): per pool its namespace, network and
StorageClass; then CDI's DataVolumes, the pools' RBAC (pools/access.py names it) and, on the
MAAS host, ``reconciler.pools.kubeconfig``. Read through the operator's kubeconfig, never the pools'."""

from __future__ import annotations

import os
from typing import Any, Iterable, Mapping, Sequence

from maas_kubevirt import policies
from maas_kubevirt.doctor import FAIL, OK, SKIP, Check, _clean, _skipped, _some
from maas_kubevirt.doctor.cluster import KUBEMACPOOL_VALUE, api_check
from maas_kubevirt.pools import access
from maas_kubevirt.pools.spec import NAMESPACE_LABEL, Pool, from_values

NAMESPACE = "pools.namespace"
NETWORK = "pools.network"
STORAGE_CLASS = "pools.storage_class"
DATAVOLUMES = "pools.datavolumes"
CLUSTER_ROLE = "pools.cluster_role"
ROLE_BINDINGS = "pools.role_bindings"
ACCOUNT = "pools.account"
KUBECONFIG = "pools.kubeconfig"
POOL_ROWS = (NAMESPACE, NETWORK, STORAGE_CLASS)
CLUSTER_ROWS = (DATAVOLUMES, CLUSTER_ROLE, ROLE_BINDINGS, ACCOUNT)

DATAVOLUME_CRD = "datavolumes.cdi.kubevirt.io"
DATAVOLUME_VERSION = "v1beta1"   # what a VM's dataVolumeTemplates are (KubeVirt's API)
RBAC = "/apis/rbac.authorization.k8s.io/v1"
VALUES_PAGE = "docs/reference/values.md"


def pool_namespace_check(pool: Pool, namespace: Mapping[str, Any] | None, opt_in: tuple[str, str]) -> Check:
    """The pool's namespace exists, is not being deleted, and has the three labels its VMs need."""
    name = f"{NAMESPACE}/{pool.name}"
    wanted = (opt_in, (policies.KUBEMACPOOL_LABEL, KUBEMACPOOL_VALUE), NAMESPACE_LABEL)
    label = " ".join(f"{key}={value}" for key, value in wanted)
    if namespace is None:
        return Check(name, FAIL, f"namespace {pool.namespace} does not exist",
                     f"`kubectl create namespace {pool.namespace} && kubectl label namespace {pool.namespace} {label}`")
    if (namespace.get("metadata") or {}).get("deletionTimestamp"):
        return Check(name, FAIL, f"namespace {pool.namespace} is being deleted, with the pool's VMs",
                     "let it go, then create it again with its labels, or move the pool to another namespace")
    labels = (namespace.get("metadata") or {}).get("labels") or {}
    missing = [f"{key}={value}" for key, value in wanted if labels.get(key) != value]
    if missing:
        # Without opt-in no BMC, without KubeMacPool a new MAC each start, without the pools' label
        # Kyverno refuses the pools' VMs there.
        return Check(name, FAIL, f"namespace {pool.namespace} lacks {', '.join(missing)}",
                     f"`kubectl label --overwrite namespace {pool.namespace} {' '.join(missing)}`", tuple(missing))
    return Check(name, OK, f"namespace {pool.namespace} exists, labelled {label}")


def network_where(pool: Pool) -> tuple[str, str]:
    """(namespace, name) of the pool's NetworkAttachmentDefinition: ``namespace/name``, or the pool's namespace."""
    namespace, _, name = pool.network.rpartition("/")
    return namespace or pool.namespace, name


def network_check(pool: Pool, found: Mapping[str, Any] | None) -> Check:
    namespace, network = network_where(pool)
    where = f"NetworkAttachmentDefinition {namespace}/{network}"
    if found is None:
        return Check(f"{NETWORK}/{pool.name}", FAIL,
                     f"{where} does not exist (or Multus is not installed): the pool's VMs cannot start",
                     "create it on the PXE segment's bridge, or set pools[].network to one that exists "
                     f"({VALUES_PAGE})")
    return Check(f"{NETWORK}/{pool.name}", OK, f"{where} exists")


def storage_class_check(pool: Pool, found: Mapping[str, Any] | None) -> Check:
    if found is None:
        return Check(f"{STORAGE_CLASS}/{pool.name}", FAIL,
                     f"StorageClass {pool.storage_class} does not exist: the pool's disks stay Pending",
                     f"set pools[].storage_class to one of `kubectl get storageclass` ({VALUES_PAGE})")
    return Check(f"{STORAGE_CLASS}/{pool.name}", OK, f"StorageClass {pool.storage_class} exists")


def datavolumes_check(crd: Mapping[str, Any] | None) -> Check:
    """CDI's DataVolume CRD serves the version a VM's dataVolumeTemplates are."""
    served = [str(v.get("name")) for v in (crd or {}).get("spec", {}).get("versions") or []
              if isinstance(v, Mapping) and v.get("served")]
    if crd is not None and DATAVOLUME_VERSION in served:
        return Check(DATAVOLUMES, OK, f"CRD {DATAVOLUME_CRD} serves {DATAVOLUME_VERSION}")
    found = (f"CRD {DATAVOLUME_CRD} does not exist" if crd is None
             else f"CRD {DATAVOLUME_CRD} serves {_some(served) or 'no version'}, not {DATAVOLUME_VERSION}")
    return Check(DATAVOLUMES, FAIL, f"{found}: no pool VM can be created (its disk is a DataVolume)",
                 "install CDI (containerized-data-importer) at a release serving cdi.kubevirt.io/v1beta1")


def grants(role: Mapping[str, Any]) -> set[tuple[str, str, str]]:
    """(group, resource, verb) of every rule of a ClusterRole; a rule limited to resourceNames
    grants no whole resource, and a non-resource URL counts as resource ``url:<path>``."""
    found = set()
    for rule in role.get("rules") or []:
        if not isinstance(rule, Mapping) or rule.get("resourceNames"):
            continue
        verbs = [str(v) for v in rule.get("verbs") or []]
        found |= {("", f"url:{url}", verb) for url in rule.get("nonResourceURLs") or [] for verb in verbs}
        found |= {(str(group), str(resource), verb) for group in rule.get("apiGroups") or []
                  for resource in rule.get("resources") or [] for verb in verbs}
    return found


def cluster_role_check(role: Mapping[str, Any] | None, apply: str) -> Check:
    """The ClusterRole grants exactly access.RULES: anything more (a verb, a resource, a wildcard,
    an aggregation) is more than the pools' kubeconfig should hold."""
    where = f"ClusterRole {access.CLUSTER_ROLE}"
    if role is None:
        return Check(CLUSTER_ROLE, FAIL, f"{where} does not exist: the pools cannot create their VMs", apply)
    wanted = {(group, resource, verb) for (group, resource), verbs in access.RULES.items() for verb in verbs}
    granted = grants(role)
    extra = sorted(f"{verb} {resource}{'.' + group if group else ''}" for group, resource, verb in granted - wanted)
    if role.get("aggregationRule"):
        extra.insert(0, "an aggregationRule (other roles' rules join it)")
    missing = sorted(f"{verb} {resource}.{group}" for group, resource, verb in wanted - granted)
    extra = [_clean(e) for e in extra]
    if extra:
        return Check(CLUSTER_ROLE, FAIL, f"{where} grants more than the pools need: {_some(extra)}",
                     f"remove those rules: {apply}", tuple(extra))
    if missing:
        return Check(CLUSTER_ROLE, FAIL, f"{where} lacks {_some(missing)}", apply, tuple(missing))
    return Check(CLUSTER_ROLE, OK, f"{where} grants exactly get, list, create, delete on virtualmachines.kubevirt.io "
                 "and get, list on datavolumes.cdi.kubevirt.io")


def _binds_role(binding: Mapping[str, Any]) -> bool:
    ref = binding.get("roleRef") or {}
    return ref.get("kind") == "ClusterRole" and ref.get("name") == access.CLUSTER_ROLE


def role_bindings_check(pool_namespaces: Iterable[str], bindings: Sequence[Mapping[str, Any]],
                        cluster_bindings: Sequence[Mapping[str, Any]], account_namespace: str, apply: str) -> Check:
    """The ClusterRole is bound to the pools' ServiceAccount by one RoleBinding in each pool
    namespace, to no one else, in no other namespace, and by no ClusterRoleBinding."""
    account = {"kind": "ServiceAccount", "name": access.ACCOUNT, "namespace": account_namespace}
    wanted = sorted(set(pool_namespaces))
    bound, wrong = set(), []
    for binding in (b for b in bindings if _binds_role(b)):
        metadata = binding.get("metadata") or {}
        where = f"{metadata.get('namespace')}/{metadata.get('name')}"
        subjects = [{k: s.get(k) for k in ("kind", "name", "namespace")} for s in binding.get("subjects") or []
                    if isinstance(s, Mapping)]
        if metadata.get("namespace") not in wanted:
            wrong.append(f"RoleBinding {where} (no pool's namespace)")
        elif subjects != [account]:
            wrong.append(f"RoleBinding {where} binds it to other subjects than {account_namespace}/{access.ACCOUNT}")
        else:
            bound.add(metadata.get("namespace"))
    wrong += [f"ClusterRoleBinding {(b.get('metadata') or {}).get('name')} (every namespace)"
              for b in cluster_bindings if _binds_role(b)]
    wrong = [_clean(w) for w in wrong]
    missing = [ns for ns in wanted if ns not in bound]
    if wrong:
        return Check(ROLE_BINDINGS, FAIL, f"ClusterRole {access.CLUSTER_ROLE} is bound beyond the pools' namespaces: "
                     f"{_some(wrong)}", "delete those bindings (`kubectl delete rolebinding -n NAMESPACE NAME`, "
                     f"`kubectl delete clusterrolebinding NAME`), then {apply}", tuple(wrong))
    if missing:
        return Check(ROLE_BINDINGS, FAIL, f"no RoleBinding {access.ROLE_BINDING} to {account_namespace}/"
                     f"{access.ACCOUNT} in {_some(missing)}: the pools cannot make VMs there", apply, tuple(missing))
    return Check(ROLE_BINDINGS, OK, f"RoleBinding {access.ROLE_BINDING} in {_some(wanted)} and no other namespace")


def account_check(found: Mapping[str, Any] | None, namespace: str, apply: str) -> Check:
    where = f"ServiceAccount {namespace}/{access.ACCOUNT}"
    if found is None:
        return Check(ACCOUNT, FAIL, f"{where} does not exist: reconciler.pools.kubeconfig cannot be made", apply)
    return Check(ACCOUNT, OK, f"{where} exists")


def kubeconfig_check(values: Mapping[str, Any]) -> Check:
    """reconciler.pools.kubeconfig is set and, where doctor runs on the MAAS host (the file is
    there), reads as a kubeconfig; elsewhere the file is the MAAS host's, not doctor's to read."""
    from maas_kubevirt.kube import Cluster, KubeConfigError

    path = access.kubeconfig_path(values)
    if not path:
        return Check(KUBECONFIG, FAIL, "reconciler.pools.kubeconfig is not set: reconcile refuses to start",
                     access.NEEDS_KUBECONFIG)
    if not os.path.exists(path):
        return Check(KUBECONFIG, SKIP, f"{_clean(path)} is not on this host: doctor runs elsewhere than the MAAS host",
                     "run doctor on the MAAS host to check it")
    try:
        Cluster(path, source="reconciler.pools.kubeconfig").close()
    except KubeConfigError as failure:
        return Check(KUBECONFIG, FAIL, _clean(failure),
                     f"make the kubeconfig of {access.ACCOUNT} again ({VALUES_PAGE})")
    return Check(KUBECONFIG, OK, f"{_clean(path)} reads as a kubeconfig")


def row_names(pools: Iterable[Pool]) -> list[str]:
    """The cluster rows of these pools, in order (the kubeconfig's is not one)."""
    return [f"{row}/{pool.name}" for pool in pools for row in POOL_ROWS] + list(CLUSTER_ROWS)


def pools_checks(values: Mapping[str, Any], cluster: Any, apply: str, api_down: bool = False) -> list[Check]:
    """Every pool row, read-only through doctor's cluster: none without pools; only the
    kubeconfig's without a cluster; the cluster rows skipped when the API server did not answer
    (``api_down``: the cluster section's cluster.api failed; else this one's)."""
    from maas_kubevirt.kube import KubeError

    pools = from_values(values)
    if not pools:
        return []
    checks: list[Check] = []
    if api_down:
        checks += _skipped(row_names(pools), "the API server did not answer")
    elif cluster is not None:
        try:
            checks += _cluster_rows(values, pools, cluster, apply)
        except KubeError as error:
            done = {c.name for c in checks}
            checks.append(api_check(error))
            checks += _skipped([n for n in row_names(pools) if n not in done], "the API server did not answer")
    checks.append(kubeconfig_check(values))
    return checks


def _cluster_rows(values: Mapping[str, Any], pools: Sequence[Pool], cluster: Any, apply: str) -> list[Check]:
    kubernetes = values["kubernetes"]
    opt_in = (kubernetes["opt_in_label"], kubernetes["opt_in_value"])
    checks = []
    for pool in pools:
        checks.append(pool_namespace_check(pool, cluster.get(f"/api/v1/namespaces/{pool.namespace}"), opt_in))
        namespace, network = network_where(pool)
        checks.append(network_check(pool, cluster.get(
            f"/apis/k8s.cni.cncf.io/v1/namespaces/{namespace}/network-attachment-definitions/{network}")))
        checks.append(storage_class_check(pool, cluster.get(f"/apis/storage.k8s.io/v1/storageclasses/"
                                                            f"{pool.storage_class}")))
    checks.append(datavolumes_check(cluster.crd(DATAVOLUME_CRD)))
    checks.append(cluster_role_check(cluster.get(f"{RBAC}/clusterroles/{access.CLUSTER_ROLE}"), apply))
    account_namespace = access.account_namespace(values)
    checks.append(role_bindings_check([pool.namespace for pool in pools], list(cluster.items(f"{RBAC}/rolebindings")),
                                      list(cluster.items(f"{RBAC}/clusterrolebindings")), account_namespace, apply))
    checks.append(account_check(cluster.get(f"/api/v1/namespaces/{account_namespace}/serviceaccounts/"
                                            f"{access.ACCOUNT}"), account_namespace, apply))
    return checks
