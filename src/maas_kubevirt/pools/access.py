"""The pools' own cluster access: a kubeconfig of the ServiceAccount maas-kubevirt-pools."""

from __future__ import annotations

from typing import Any, Mapping

from maas_kubevirt import kube
from maas_kubevirt.lease.config import namespace_of
from maas_kubevirt.paths import credential_path

CREDENTIAL = "pools-kubeconfig"
# The pools' RBAC, as the bundle makes it: the ServiceAccount in the lease namespace, a
# ClusterRole of exactly RULES, one RoleBinding of that role to the account in each pool
# namespace (none elsewhere), and the Kyverno ClusterPolicy that admits only a pool's VM from it.
ACCOUNT = "maas-kubevirt-pools"
CLUSTER_ROLE = ROLE_BINDING = POLICY = ACCOUNT
# (API group, resource) -> the verbs the ClusterRole grants on it, and nothing else.
RULES = {("kubevirt.io", "virtualmachines"): frozenset({"get", "list", "create", "delete"}),
         ("cdi.kubevirt.io", "datavolumes"): frozenset({"get", "list"})}
NEEDS_KUBECONFIG = ("pools are configured but reconciler.pools.kubeconfig is not set: make a kubeconfig of the "
                    f"ServiceAccount {ACCOUNT} (docs/reference/values.md) and set its path there")


class PoolsConfigError(Exception):
    """The pools cannot reach the cluster as configured; the message says what to set."""


def kubeconfig_path(values: Mapping[str, Any]) -> str:
    """The systemd credential ``pools-kubeconfig`` when the service was handed one, else the values' path."""
    given = credential_path(CREDENTIAL)
    return str(given) if given is not None else values["reconciler"]["pools"]["kubeconfig"]


def cluster(values: Mapping[str, Any]) -> Any:
    """A ``kube.Cluster`` on the pools' kubeconfig; PoolsConfigError when there is none or it is unusable."""
    path = kubeconfig_path(values)
    if not path:
        raise PoolsConfigError(NEEDS_KUBECONFIG)
    try:
        return kube.Cluster(path, source="reconciler.pools.kubeconfig")
    except kube.KubeConfigError as failure:
        raise PoolsConfigError(str(failure)) from None


def account_namespace(values: Mapping[str, Any]) -> str:
    """Where the ServiceAccount lives: the lease's namespace."""
    return namespace_of(values)
