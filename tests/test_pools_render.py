"""The pools' RBAC and policy as `render` writes them (issue 42): nothing without pools; with pools,
one ServiceAccount, one ClusterRole, a RoleBinding per pool namespace, and a policy whose every rule
holds that account alone. What the policy decides is run by Kyverno in test_policies_kyverno.py
(tests/kyverno/pools*) and on the control plane in test_pools_tier.py."""

from __future__ import annotations

import re

import pytest

from kyverno_conditions import VARIABLE
from maas_kubevirt import identity, policies
from maas_kubevirt.values import load_values
import pools_fixtures as pf
from policies_fixtures import REFERENCE_DIR

POOL_FILES = {policies.POOLS_RBAC_FILE, policies.POOLS_POLICY_FILE}


def by_kind(manifests: dict[str, str], name: str) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = {}
    for doc in policies.parse(manifests[name]):
        found.setdefault(doc["kind"], []).append(doc)
    return found


def test_without_pools_the_render_is_the_reference_tree():
    manifests = policies.render_kubernetes(load_values(None), None)
    assert not POOL_FILES & set(manifests)
    assert not any(policies.POOLS_ACCOUNT in text for text in manifests.values())
    on_disk = {path.name: path.read_text(encoding="utf-8") for path in REFERENCE_DIR.glob("*.yaml")}
    assert manifests == on_disk


@pytest.mark.parametrize("lease_namespace", ["", "maas-lease"])
def test_pools_get_one_account_one_role_and_a_binding_per_namespace(lease_namespace):
    base = load_values(None)
    base["reconciler"]["lease"]["namespace"] = lease_namespace
    third = {**pf.POOLS[0], "name": "tiny", "cores": 1}   # a second pool in the first one's namespace
    manifests = policies.render_kubernetes(pf.values(base, [*pf.POOLS, third]), None)
    assert POOL_FILES <= set(manifests)
    listed = policies.parse(manifests[policies.KUSTOMIZATION_FILE])[0]["resources"]
    assert POOL_FILES <= set(listed)
    home = lease_namespace or base["kubernetes"]["system_namespace"]
    objects = by_kind(manifests, policies.POOLS_RBAC_FILE)
    [account] = objects["ServiceAccount"]
    assert account["metadata"] == {"name": policies.POOLS_ACCOUNT, "namespace": home,
                                   "labels": {"app.kubernetes.io/part-of": "maas-kubevirt"}}
    assert account["automountServiceAccountToken"] is False
    [role] = objects["ClusterRole"]
    assert role["rules"] == [
        {"apiGroups": ["kubevirt.io"], "resources": ["virtualmachines"], "verbs": ["get", "list", "create", "delete"]},
        {"apiGroups": ["cdi.kubevirt.io"], "resources": ["datavolumes"], "verbs": ["get", "list"]},
    ]
    bindings = objects["RoleBinding"]
    assert [b["metadata"]["namespace"] for b in bindings] == [pf.NAMESPACE, pf.UNLABELLED]
    for binding in bindings:
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                      "name": policies.POOLS_ACCOUNT}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": policies.POOLS_ACCOUNT, "namespace": home}]
    # The same account is the one the policy holds, and in the reconciler's namespace.
    reconciler = by_kind(manifests, policies.RECONCILER_RBAC_FILE)["ServiceAccount"][0]
    assert reconciler["metadata"]["namespace"] == home
    [policy] = by_kind(manifests, policies.POOLS_POLICY_FILE)["ClusterPolicy"]
    for rule in policy["spec"]["rules"]:
        assert rule["match"]["any"][0]["subjects"] == [
            {"kind": "ServiceAccount", "name": policies.POOLS_ACCOUNT, "namespace": home}], rule["name"]


def test_the_policy_has_a_rule_per_pool_and_none_for_updates():
    settings = pf.values()
    [policy] = by_kind(policies.render_kubernetes(settings, None), policies.POOLS_POLICY_FILE)["ClusterPolicy"]
    assert policy["metadata"]["name"] == policies.POOLS_POLICY
    annotations = policy["metadata"]["annotations"]
    assert {"policies.kyverno.io/title", "policies.kyverno.io/category", "policies.kyverno.io/severity",
            "policies.kyverno.io/description"} <= set(annotations)
    assert policy["spec"]["background"] is False     # the rules read who is asking
    rules = policy["spec"]["rules"]
    assert [r["name"] for r in rules] == ["pool-namespaces-only", "pool-vms-only", "pool-vm-small", "pool-vm-large",
                                          "pool-vms-only-on-delete"]
    operations = {r["name"]: r["match"]["any"][0]["resources"]["operations"] for r in rules}
    assert operations["pool-vms-only-on-delete"] == ["DELETE"]
    assert all(ops == ["CREATE"] for name, ops in operations.items() if name != "pool-vms-only-on-delete")
    assert all(r["validate"]["failureAction"] == "Enforce" for r in rules)
    [excluded] = rules[0]["exclude"]["any"]
    assert excluded["resources"] == {"namespaces": [pf.NAMESPACE, pf.UNLABELLED],
                                     "namespaceSelector": {"matchLabels": pf.POOLS_ENABLED}}
    for pool in settings["pools"]:
        rule = next(r for r in rules if r["name"] == f"pool-vm-{pool['name']}")
        assert rule["match"]["any"][0]["resources"]["namespaces"] == [pool["namespace"]]
        assert rule["preconditions"]["all"][0]["value"] == pool["name"]
        conditions = rule["validate"]["deny"]["conditions"]["any"]
        for key in ("storage_class", "memory", "disk", "network"):
            assert any(c["value"] == pool[key] or f'"{pool[key]}"' in c["key"] or f"'{pool[key]}'" in c["key"]
                       for c in conditions), key
        assert any(f"to_string(request.object.spec.template.spec.domain.cpu.cores) == '{pool['cores']}'" in c["key"]
                   for c in conditions)


def test_every_condition_is_one_whole_kyverno_variable():
    """Kyverno ends a {{ }} at the first nested '}}': a JSON literal of nested objects would cut the
    expression short and be judged as something else (measured: a clone source was admitted)."""
    [policy] = by_kind(policies.render_kubernetes(pf.values(), None), policies.POOLS_POLICY_FILE)["ClusterPolicy"]
    keys = [c["key"] for r in policy["spec"]["rules"] for c in (r.get("validate", {}).get("deny") or {}).get(
        "conditions", {}).get("any", []) + r.get("preconditions", {}).get("all", [])]
    assert len(keys) > 40
    for key in keys:
        assert VARIABLE.fullmatch(key), key
    with pytest.raises(ValueError):
        policies._json_literal({"blank": {}})


@pytest.mark.parametrize("name", ["small-bcd24", "small-22222", "small-bcd2", "small-bcd245", "small-abcde",
                                  "small-BCD24", "smallx-bcd24", "tiny-bcd24", "small-bcd2a", "xsmall-bcd24"])
def test_the_name_rule_is_identity_is_pool_vm_name(name):
    assert bool(re.fullmatch(policies.pool_vm_name_regex("small"), name)) == identity.is_pool_vm_name("small", name)


def test_every_deviation_is_a_change_of_the_exact_vm():
    settings = pf.values()
    exact = pf.pool_vm(settings)
    for case, change in pf.DEVIATIONS:
        assert change(exact) != exact, case
    assert pf.mutated(exact) != exact
