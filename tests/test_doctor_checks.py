"""doctor's cluster checks as pure functions over the objects the API server returns, and the
width rule of ingress.source_ranges (a check that needs no cluster).

The objects are built like the API server's answers; the bundle's expectations (policy
names, ClusterRoles, generated object names, the allowlist) come from a real render.
tests/test_doctor_cluster.py runs the same checks against the real control plane tier.
"""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from maas_kubevirt import doctor, policies
from policies_fixtures import catch_all_ingress
from maas_kubevirt.values import load_values

VALUES = load_values(None)
BUNDLE = policies.objects(policies.render_kubernetes(VALUES, None))
GENERATED = doctor.Generated.from_policies(BUNDLE, policies.allowlist_annotation(VALUES["ingress"]))
POLICY_NAMES = [o["metadata"]["name"] for o in BUNDLE if o["kind"] == "ClusterPolicy"]
OUR_ROLES = [o for o in BUNDLE if o["kind"] == "ClusterRole"]
OPT_IN = "maas.io/kubevirt-bmc=enabled"
APPLY = "`maas-kubevirt render --output build && kubectl apply -k build/kubernetes`"


def kyverno_role(controller: str, rules: list[dict]) -> dict:
    """Kyverno's own aggregate ClusterRole, as its install manifest defines it."""
    return {
        "metadata": {"name": f"kyverno:{controller}"},
        "aggregationRule": {"clusterRoleSelectors": [
            {"matchLabels": {f"rbac.kyverno.io/aggregate-to-{controller}": "true"}},
            {"matchLabels": {"app.kubernetes.io/component": controller, "app.kubernetes.io/part-of": "kyverno"}},
        ]},
        "rules": rules,
    }


def merged_roles() -> list[dict]:
    """Ours plus Kyverno's, with the aggregation controller's work done."""
    roles = copy.deepcopy(OUR_ROLES)
    for role in OUR_ROLES:
        controller = next(k for k in role["metadata"]["labels"] if k.startswith("rbac.kyverno.io/")).split("aggregate-to-")[1]
        roles.append(kyverno_role(controller, [{"apiGroups": ["kyverno.io"], "resources": ["*"], "verbs": ["*"]}]
                                  + copy.deepcopy(role["rules"])))
    return roles


def vm(name: str, macs: list[str | None]) -> dict:
    interfaces = [{"name": f"nic{i}", "bridge": {}, **({"macAddress": mac} if mac else {})} for i, mac in enumerate(macs)]
    return {"metadata": {"name": name, "namespace": "vms"},
            "spec": {"template": {"spec": {"domain": {"devices": {"interfaces": interfaces}}}}}}


def ingress(name: str, annotations: dict) -> dict:
    return {"metadata": {"name": name, "namespace": "vms", "annotations": annotations}}


ALLOWLIST = dict(GENERATED.allowlist)


def inventory(vms: list[dict], *, secrets=None, bmcs=None, ingresses=None) -> doctor.Inventory:
    names = [v["metadata"]["name"] for v in vms]
    return doctor.Inventory(
        "vms", vms,
        set(f"{n}-bmc" for n in names) if secrets is None else secrets,
        set(names) if bmcs is None else bmcs,
        [ingress(f"{n}-bmc", ALLOWLIST) for n in names] if ingresses is None else ingresses,
    )


# --- what the bundle generates ------------------------------------------------------------


def test_generated_names_and_allowlist_come_from_the_rendered_policy():
    assert GENERATED.name("Secret", "web1", "vms") == "web1-bmc"
    assert GENERATED.name("VirtualMachineBMC", "web1", "vms") == "web1"
    assert GENERATED.name("Ingress", "web1", "vms") == "web1-bmc"
    assert doctor._cidrs(GENERATED.allowlist[policies.ALLOWLIST_ANNOTATION]) == set(VALUES["ingress"]["source_ranges"])


def test_another_ingress_class_keeps_its_own_allowlist_annotation():
    values = load_values(None)
    values["ingress"].update(class_name="traefik", allowlist_annotation="example.io/source-ranges")
    bundle = policies.objects(policies.render_kubernetes(values, None))
    generated = doctor.Generated.from_policies(bundle, policies.allowlist_annotation(values["ingress"]))
    assert list(generated.allowlist) == ["example.io/source-ranges"]


# --- CRDs and Kyverno ---------------------------------------------------------------------


def test_crds():
    assert doctor.crds_check(doctor.CRDS).status == "ok"
    check = doctor.crds_check(["virtualmachines.kubevirt.io"])
    assert check.status == "fail" and check.subjects == ("virtualmachinebmcs.bmc.kubevirt.io",)
    assert "kubevirtBMC" in check.fix and "KubeVirt" not in check.fix.replace("kubevirtBMC", "")


@given(st.integers(0, 99), st.integers(0, 99), st.integers(0, 99), st.sampled_from(["", "v"]),
       st.sampled_from(["", "-rc.1", "+build5"]), st.sampled_from(["", "reg.kyverno.io/kyverno/", "localhost:5000/k/"]))
def test_image_version_reads_any_semver_tag(major, minor, patch, prefix, suffix, registry):
    image = f"{registry}kyverno:{prefix}{major}.{minor}.{patch}{suffix}"
    assert doctor.image_version(image) == (major, minor, patch)
    assert doctor.image_version(image + "@sha256:" + "a" * 64) == (major, minor, patch)


@pytest.mark.parametrize("image", ["reg.kyverno.io/kyverno/kyverno:latest", "localhost:5000/kyverno",
                                   "kyverno@sha256:" + "b" * 64, "kyverno:1.13"])
def test_image_version_without_a_version(image):
    assert doctor.image_version(image) is None


def deployment(name: str, image: str) -> dict:
    return {"metadata": {"name": name}, "spec": {"template": {"spec": {"containers": [{"name": "c", "image": image}]}}}}


def policy_crd(rule_level: bool) -> dict:
    generate = {"properties": {"synchronize": {}, **({"generateExisting": {}} if rule_level else {})}}
    rules = {"items": {"properties": {"generate": generate}}}
    return {"spec": {"versions": [{"name": "v1", "schema": {"openAPIV3Schema": {
        "properties": {"spec": {"properties": {"rules": rules}}}}}}]}}


def test_kyverno_version_from_the_controllers_images():
    ok = doctor.kyverno_version_check([deployment("kyverno-admission-controller", "ghcr.io/kyverno/kyverno:v1.13.4"),
                                       deployment("kyverno-background-controller", "ghcr.io/kyverno/background-controller:v1.14.0")],
                                      policy_crd(True))
    assert ok.status == "ok" and "1.13.4" in ok.found
    old = doctor.kyverno_version_check([deployment("kyverno-admission-controller", "ghcr.io/kyverno/kyverno:v1.12.6")],
                                       policy_crd(True))
    assert old.status == "fail" and "1.12.6" in old.found and "1.13.0 or later" in old.fix


def test_kyverno_version_from_the_crd_when_no_image_says():
    assert doctor.kyverno_version_check([], policy_crd(True)).status == "ok"
    # Below the release the control-plane tier proves (upstream.lock.yaml): a warning, naming it.
    older = doctor.kyverno_version_check([deployment("kyverno-admission-controller", "ghcr.io/kyverno/kyverno:v1.13.4")],
                                         policy_crd(True), "v1.19.1")
    assert older.status == "warn" and "v1.19.1" in older.found and "upstream.lock.yaml" in older.found
    assert doctor.kyverno_version_check([deployment("k", "kyverno:v1.19.1")], policy_crd(True), "v1.19.1").status == "ok"
    assert doctor.kyverno_version_check([deployment("x", "kyverno:latest")], policy_crd(False)).status == "fail"
    missing = doctor.kyverno_version_check([], None)
    assert missing.status == "fail" and "not installed" in missing.found


# --- RBAC aggregation ---------------------------------------------------------------------


def test_rbac_merged():
    checks = doctor.kyverno_rbac_checks(OUR_ROLES, merged_roles(), APPLY)
    assert [c.status for c in checks] == ["ok"] * len(OUR_ROLES)
    assert {c.name for c in checks} == {f"cluster.kyverno_rbac/{r['metadata']['name'].rsplit(':', 1)[-1]}"
                                        for r in OUR_ROLES}
    assert "cluster.kyverno_rbac/background-controller" in {c.name for c in checks}


def test_rbac_our_role_removed_and_unmerged():
    roles = merged_roles()
    name = "maas-kubevirt:kyverno:background-controller"
    roles = [r for r in roles if r["metadata"]["name"] != name]
    for role in roles:
        if role["metadata"]["name"] == "kyverno:background-controller":
            role["rules"] = role["rules"][:1]   # the aggregation controller took ours away
    checks = {c.name: c for c in doctor.kyverno_rbac_checks(OUR_ROLES, roles, APPLY)}
    check = checks["cluster.kyverno_rbac/background-controller"]
    assert check.status == "fail" and f"ClusterRole {name} is missing" in check.found and check.fix == APPLY


def test_rbac_present_but_not_merged():
    roles = merged_roles()
    for role in roles:
        if role["metadata"]["name"] == "kyverno:background-controller":
            role["rules"] = role["rules"][:1]
    checks = {c.name: c for c in doctor.kyverno_rbac_checks(OUR_ROLES, roles, APPLY)}
    check = checks["cluster.kyverno_rbac/background-controller"]
    assert check.status == "fail" and "not merged" in check.found and "kyverno:background-controller lacks" in check.found
    assert "clusterrole-aggregation" in check.fix


def test_rbac_without_kyverno():
    checks = doctor.kyverno_rbac_checks(OUR_ROLES, copy.deepcopy(OUR_ROLES), APPLY)
    assert all(c.status == "fail" and "no Kyverno ClusterRole aggregates" in c.found for c in checks)


VERBS = st.sampled_from(["get", "list", "watch", "create", "update", "delete"])
RULES = st.lists(st.fixed_dictionaries({
    "apiGroups": st.lists(st.sampled_from(["", "apps", "kubevirt.io"]), min_size=1, max_size=2),
    "resources": st.lists(st.sampled_from(["secrets", "ingresses", "virtualmachines"]), min_size=1, max_size=2),
    "verbs": st.lists(VERBS, min_size=1, max_size=3),
}), max_size=4)


@given(RULES, RULES)
def test_missing_rules_is_exactly_what_the_union_lacks(wanted, granted):
    """A tuple is missing iff no granted rule holds its group, resource and verb."""
    missing = set(doctor.missing_rules(wanted, granted))
    allowed = {(g, r, v) for rule in granted for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    needed = {(g, r, v) for rule in wanted for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    assert missing == {f"{v} {g or 'core'}/{r}" for g, r, v in needed - allowed}
    assert doctor.missing_rules(wanted, granted + wanted) == []


def test_missing_rules_wildcards_and_resource_names():
    named = [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["seed"], "verbs": ["get"]}]
    assert doctor.missing_rules(named, [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]) == []
    assert doctor.missing_rules(named, [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["other"],
                                         "verbs": ["get"]}]) == ["get core/secrets/seed"]
    unnamed = [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["list"]}]
    assert doctor.missing_rules(unnamed, named) == ["list core/secrets"]


@pytest.mark.parametrize("selector, labels, selected", [
    ({"matchLabels": {"a": "1"}}, {"a": "1", "b": "2"}, True),
    ({"matchLabels": {"a": "1"}}, {"a": "2"}, False),
    ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}]}, {"a": "2"}, True),
    ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {"a": "1"}, False),
    ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {}, False),
    ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {}, True),
])
def test_label_selectors(selector, labels, selected):
    assert doctor._selects(selector, labels) is selected


# --- policies and the seed ----------------------------------------------------------------


def cluster_policy(name: str, ready: str | None, message: str = "") -> dict:
    status = {} if ready is None else {"conditions": [{"type": "Ready", "status": ready, "message": message}]}
    return {"metadata": {"name": name}, "status": status}


def test_policies_ready_missing_or_not_ready():
    ready = [cluster_policy(name, "True") for name in POLICY_NAMES]
    assert doctor.policies_check(POLICY_NAMES, ready, APPLY).status == "ok"
    deleted = doctor.policies_check(POLICY_NAMES, ready[1:], APPLY)
    assert deleted.status == "fail" and f"missing: {POLICY_NAMES[0]}" in deleted.found and deleted.fix == APPLY
    broken = ready[:-1] + [cluster_policy(POLICY_NAMES[-1], "False", "requires permissions get for v1/Secret")]
    check = doctor.policies_check(POLICY_NAMES, broken, APPLY)
    assert check.status == "fail" and "requires permissions" in check.found and "kubectl describe" in check.fix
    pending = doctor.policies_check(POLICY_NAMES, ready[:-1] + [cluster_policy(POLICY_NAMES[-1], None)], APPLY)
    assert pending.status == "fail" and "no Ready condition yet" in pending.found


def test_seed_secret_compared_by_digest():
    seed = "the-seed-0123456789abcdef0123456789abcdef"
    digest = hashlib.sha256(seed.encode()).hexdigest()
    ok = doctor.seed_secret_check(digest, seed, "maas-kubevirt/maas-kubevirt-seed", "apply")
    assert ok.status == "ok"
    wrong = doctor.seed_secret_check(hashlib.sha256(b"other").hexdigest(), seed, "ns/s", "apply")
    assert wrong.status == "fail" and "another seed" in wrong.found and seed not in wrong.found
    assert doctor.seed_secret_check(None, seed, "ns/s", "apply").status == "fail"
    assert doctor.seed_secret_check(digest, None, "ns/s", "apply").status == "warn"


# --- namespaces, VMs, Ingresses -----------------------------------------------------------


def namespace(name: str, kubemacpool: bool) -> dict:
    labels = {"maas.io/kubevirt-bmc": "enabled"}
    if kubemacpool:
        labels[policies.KUBEMACPOOL_LABEL] = "allocate"
    return {"metadata": {"name": name, "labels": labels}}


def test_namespaces_need_the_kubemacpool_label():
    assert doctor.namespaces_check([namespace("vms", True)], OPT_IN).status == "ok"
    check = doctor.namespaces_check([namespace("vms", True), namespace("tenant", False)], OPT_IN)
    assert check.status == "fail" and check.subjects == ("tenant",)
    assert check.fix == f"`kubectl label namespace tenant {policies.KUBEMACPOOL_LABEL}=allocate`"
    assert doctor.namespaces_check([], OPT_IN).status == "warn"


def test_vms_complete():
    check = doctor.vms_check(inventory([vm("web1", ["02:00:00:00:00:01"]), vm("web2", ["02:00:00:00:00:02"] * 2)]),
                             GENERATED, OPT_IN)
    assert check.status == "ok" and check.name == "cluster.vms/vms"


def test_a_vm_without_a_mac():
    check = doctor.vms_check(inventory([vm("web1", ["02:00:00:00:00:01", None])]), GENERATED, OPT_IN)
    assert check.status == "fail" and "web1: no MAC on interface nic1" in check.found
    assert check.subjects == ("web1",)


@pytest.mark.parametrize("missing, text", [("secrets", "no Secret web1-bmc"),
                                           ("bmcs", "no VirtualMachineBMC web1"),
                                           ("ingresses", "no Ingress web1-bmc")])
def test_a_vm_without_its_bmc_objects(missing, text):
    check = doctor.vms_check(inventory([vm("web1", ["02:00:00:00:00:01"])], **{missing: set() if missing != "ingresses" else []}),
                             GENERATED, OPT_IN)
    assert check.status == "fail" and text in check.found


def test_a_vm_whose_name_cannot_have_a_bmc():
    check = doctor.vms_check(inventory([vm("a" * 56, ["02:00:00:00:00:01"])]), GENERATED, OPT_IN)
    assert check.status == "fail" and "rename the VM" in check.found


def test_ingress_allowlist_kept_changed_or_removed():
    vms = [vm("web1", ["02:00:00:00:00:01"]), vm("web2", ["02:00:00:00:00:02"])]
    assert doctor.allowlist_check([inventory(vms)], GENERATED, APPLY).status == "ok"
    key = next(iter(ALLOWLIST))
    # Same CIDRs in another order are the same allowlist.
    reordered = {key: ",".join(reversed(ALLOWLIST[key].split(",")))}
    assert doctor.allowlist_check([inventory(vms, ingresses=[ingress("web1-bmc", reordered), ingress("web2-bmc", ALLOWLIST)])],
                                  GENERATED, APPLY).status == "ok"
    opened = [ingress("web1-bmc", {key: "0.0.0.0/0"}), ingress("web2-bmc", {})]
    check = doctor.allowlist_check([inventory(vms, ingresses=opened)], GENERATED, APPLY)
    assert check.status == "fail" and check.subjects == ("vms/web1-bmc", "vms/web2-bmc")


# --- the cluster section over a cluster that answers from memory ----------------------------


class MemoryCluster:
    """Answers doctor's reads from dicts, as kube.Cluster answers from the API server."""

    def __init__(self, seed: str):
        self.crds = {name: {} for name in doctor.CRDS} | {doctor.KYVERNO_POLICY_CRD: policy_crd(True)}
        self.roles = merged_roles()
        self.policies = [cluster_policy(name, "True") for name in POLICY_NAMES]
        self.seed_digest = hashlib.sha256(seed.encode()).hexdigest()
        self.namespace_list = [namespace("vms", True)]
        self.inventory = inventory([vm("web1", ["02:00:00:00:00:01"])])
        self.policies_of = {"vms": [network_policy("vms")]}
        self.daemonset_list = [daemonset("kube-system", "calico-node")]
        self.elsewhere = [catch_all_ingress("web", "shop", class_name="traefik", hosts=[None])]

    def crd(self, name):
        return self.crds.get(name)

    def deployments(self, selector):
        return []

    def gateways(self):
        return []

    def configmap(self, namespace, name):
        return None

    def cluster_roles(self):
        return self.roles

    def cluster_policies(self):
        return self.policies

    def secret_digest(self, namespace, name, key):
        return self.seed_digest

    def namespaces(self, selector):
        assert selector == OPT_IN
        return self.namespace_list

    def virtual_machines(self, ns):
        return self.inventory.vms

    def secret_names(self, ns):
        return self.inventory.secrets

    def virtual_machine_bmcs(self, ns):
        return [{"metadata": {"name": n}} for n in self.inventory.bmcs]

    def ingresses(self, ns):
        return self.inventory.ingresses if ns is not None else self.inventory.ingresses + self.elsewhere

    def network_policies(self, ns):
        return self.policies_of.get(ns, [])

    def daemonsets(self):
        return self.daemonset_list


def test_cluster_section_over_a_healthy_cluster_and_one_with_each_failure():
    seed = "s" * 40
    fixes = doctor._Fixes("maas-kubevirt", VALUES)
    cluster = MemoryCluster(seed)
    reach = doctor.Reach()
    checks = doctor.cluster_checks(VALUES, cluster, seed, fixes, reach)
    assert {c.status for c in checks} == {"ok"}, [c for c in checks if c.status != "ok"]
    assert reach.hosts == {"vms": "web1.vms.bmc.example.com"}
    cluster.policies.pop()
    cluster.crds.pop("virtualmachinebmcs.bmc.kubevirt.io")
    cluster.seed_digest = hashlib.sha256(b"another").hexdigest()
    cluster.namespace_list[0]["metadata"]["labels"].pop(policies.KUBEMACPOOL_LABEL)
    cluster.inventory.vms[0]["spec"]["template"]["spec"]["domain"]["devices"]["interfaces"][0].pop("macAddress")
    cluster.policies_of.clear()
    cluster.elsewhere.append(catch_all_ingress("all", "shop", class_name=VALUES["ingress"]["class_name"], default_backend=True))
    cluster.daemonset_list.clear()
    checks = {c.name: c for c in doctor.cluster_checks(VALUES, cluster, seed, fixes, doctor.Reach())}
    failed = {name for name, c in checks.items() if c.status == "fail"}
    assert failed == {"cluster.crds", "cluster.policies", "cluster.seed_secret", "cluster.kubemacpool", "cluster.vms/vms",
                      "cluster.network_policies", "cluster.catch_all", "proxy.isolation"}
    assert checks["proxy.isolation"].subjects == ("Ingress shop/all uses class maas-kubevirt-bmc",)
    assert checks["cluster.cni"].status == "warn"


class Forbidden(MemoryCluster):
    """A kubeconfig that may read the opted-in namespaces but list nothing cluster-wide."""

    def daemonsets(self):
        from maas_kubevirt.kube import KubeError
        raise KubeError("/apis/apps/v1/daemonsets", 403, "daemonsets.apps is forbidden")

    def ingresses(self, ns):
        if ns is None:
            from maas_kubevirt.kube import KubeError
            raise KubeError("/apis/networking.k8s.io/v1/ingresses", 403, "ingresses.networking.k8s.io is forbidden")
        return super().ingresses(ns)


def test_what_cannot_be_listed_cluster_wide_is_a_warning():
    seed = "s" * 40
    checks = {c.name: c for c in doctor.cluster_checks(VALUES, Forbidden(seed), seed,
                                                       doctor._Fixes("maas-kubevirt", VALUES), doctor.Reach())}
    assert checks["cluster.cni"].status == checks["cluster.catch_all"].status == checks["proxy.isolation"].status == "warn"
    assert checks["cluster.network_policies"].status == "ok"


# --- what keeps the BMCs closed: NetworkPolicy, CNI, no catch-all Ingress -----------------------


def network_policy(ns: str) -> dict:
    """The NetworkPolicy as the API server returns it after Kyverno generated it."""
    return {"metadata": {"name": "maas-kubevirt-bmc", "namespace": ns,
                         "labels": {"app.kubernetes.io/part-of": "maas-kubevirt"}},
            "spec": copy.deepcopy(GENERATED.network_policy)}


def daemonset(ns: str, name: str) -> dict:
    return {"metadata": {"name": name, "namespace": ns}}


def test_the_generated_network_policy_admits_only_the_ingress_controller_to_redfish():
    assert GENERATED.names["NetworkPolicy"] == "maas-kubevirt-bmc"
    assert GENERATED.network_policy == {
        "podSelector": {"matchExpressions": [{"key": "kubevirt.io/virtualmachinebmc-name", "operator": "Exists"}]},
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}}],
                     "ports": [{"protocol": "TCP", "port": 10080}]}],
    }


def test_network_policies_missing_or_changed():
    assert doctor.network_policies_check({}, GENERATED, APPLY).status == "ok"
    assert doctor.network_policies_check({"a": [network_policy("a")]}, GENERATED, APPLY).status == "ok"
    opened = network_policy("b")
    opened["spec"]["ingress"][0]["from"] = [{"namespaceSelector": {}}]
    check = doctor.network_policies_check(
        {"a": [network_policy("a")], "b": [opened], "c": [], "d": [{"metadata": {"name": "other"}, "spec": {}}]},
        GENERATED, APPLY)
    assert check.status == "fail" and check.subjects == ("c", "d", "b")
    assert "without NetworkPolicy maas-kubevirt-bmc" in check.found and "changed from the rendered one: b" in check.found
    assert "maas-kubevirt-bmc-isolation" in check.fix


@pytest.mark.parametrize("names, status", [
    (["calico-node"], "ok"), (["cilium"], "ok"), (["kube-router"], "ok"), (["antrea-agent"], "ok"),
    (["weave-net"], "ok"), (["canal"], "ok"), (["kube-proxy", "kube-flannel-ds"], "warn"), ([], "warn"),
    (["calico-nodes"], "warn"), (["my-cilium"], "warn"),
])
def test_a_cni_that_enforces_network_policy_is_looked_for_by_daemonset_name(names, status):
    check = doctor.cni_check([daemonset("kube-system", n) for n in names])
    assert check.status == status
    if status == "warn":
        assert "heuristic" in check.found and "NetworkPolicy" in check.fix
    assert doctor.cni_check(None).status == "warn"


def test_catch_all_ingresses_of_the_bmc_class():
    ingresses = [
        catch_all_ingress("hostless", "a", class_name="nginx", hosts=[None]),
        catch_all_ingress("mixed", "a", class_name="nginx", hosts=["www.example.org", ""]),
        catch_all_ingress("default", "b", class_name="nginx", hosts=["www.example.org"], default_backend=True),
        catch_all_ingress("legacy", "b", class_name=None, legacy_class="nginx", hosts=[None]),
        catch_all_ingress("named", "a", class_name="nginx", hosts=["www.example.org"]),
        catch_all_ingress("other", "a", class_name="traefik", hosts=[None], default_backend=True),
        catch_all_ingress("classless", "a", class_name=None, hosts=[None]),
    ]
    check = doctor.catch_all_check(ingresses, "nginx", allowed=False)
    assert check.status == "fail"
    assert check.subjects == ("a/hostless", "a/mixed", "b/default", "b/legacy")
    assert "b/default (spec.defaultBackend)" in check.found and "a/hostless (a rule without host)" in check.found
    assert doctor.catch_all_check(ingresses, "nginx", allowed=True).status == "warn"
    assert doctor.catch_all_check(ingresses[4:], "nginx", allowed=False).status == "ok"
    assert doctor.catch_all_check(ingresses, "traefik", allowed=False).subjects == ("a/other",)
    assert doctor.catch_all_check(None, "nginx", allowed=False).status == "warn"


@given(st.lists(st.one_of(st.none(), st.just(""), st.sampled_from(["a.example.org", "web1.vms.bmc.example.com"])),
                max_size=4),
       st.booleans(), st.sampled_from(["nginx", "traefik", None]), st.sampled_from(["nginx", "traefik", None]))
def test_catch_all_rule(hosts, default_backend, class_name, legacy):
    """A catch-all: defaultBackend, or any rule whose host is absent or empty; of a class when
    spec.ingressClassName or the older annotation names it."""
    ingress_ = catch_all_ingress("x", "a", class_name=class_name, legacy_class=legacy, hosts=hosts, default_backend=default_backend)
    is_catch_all = default_backend or any(not h for h in hosts)
    assert (doctor.catch_all(ingress_) is not None) == is_catch_all
    assert doctor.ingress_classes(ingress_) == {c for c in (class_name, legacy) if c}


_versions = st.tuples(st.integers(0, 9), st.integers(0, 12), st.integers(0, 20))
_suffixes = st.sampled_from(["", "~beta1-123-gabc", "-rc2", "-16000-g1234.snap"])
_broken = ((3, 6, 0), (3, 6, 4)), ((3, 7, 0), (3, 7, 2))


def _text(version):
    return ".".join(map(str, version))


@given(_versions, _suffixes)
def test_maas_version_rule(version, suffix):
    """With nothing proven: fail below 2.9.0 and inside 3.6.0-3.6.4 / 3.7.0-3.7.2, ok elsewhere;
    the fix names 3.6.5 and 3.7.3."""
    check = doctor.version_check(f"{_text(version)}{suffix}")
    bad = version < (2, 9, 0) or any(low <= version <= high for low, high in _broken)
    assert check.status == ("fail" if bad else "ok")
    assert ("upgrade to 3.6.5 or 3.7.3" in check.fix) is bad


@given(_versions, _suffixes, st.lists(_versions.filter(lambda v: v >= (2, 9, 0) and not any(
    low <= v <= high for low, high in _broken)), min_size=1, max_size=4, unique=True))
def test_maas_version_rule_follows_the_proven_releases(version, suffix, proven):
    """ok exactly on a proven release; a warning naming the nearest proven release (its own
    series' newest, else the newest older one, else the oldest) on any other that works; fail on
    the broken ranges whatever is proven."""
    check = doctor.version_check(f"{_text(version)}{suffix}", [_text(release) for release in proven])
    bad = version < (2, 9, 0) or any(low <= version <= high for low, high in _broken)
    if bad:
        assert check.status == "fail"
        return
    # A beta of a proven release is not that release; it sorts below it.
    key = version + ((-2, 1) if suffix.startswith("~beta1") else (0, 0))
    if key[3:] == (0, 0) and version in proven:
        assert check.status == "ok" and "proven on" in check.found
        return
    same = sorted(r for r in proven if r[:2] == version[:2])
    older = sorted(r for r in proven if r + (0, 0) < key)
    nearest = (same or older or sorted(proven)[:1])[-1]
    assert check.status == "warn"
    assert f"the nearest proven is {_text(nearest)}" in check.found
    assert _text(nearest) in check.fix
    # every proven release is listed, oldest first
    assert ", ".join(_text(r) for r in sorted(proven)) in check.found


@given(_versions, st.lists(_versions, min_size=1, max_size=5))
def test_nearest_proven_is_proven_and_in_the_series_when_one_is(version, proven):
    from maas_kubevirt.maas import nearest_proven

    nearest = nearest_proven(version, proven)
    assert nearest in proven
    if version in proven:
        assert nearest[:2] == version[:2]
    if any(r[:2] == version[:2] for r in proven):
        assert nearest == max(r for r in proven if r[:2] == version[:2])
    elif any(r < version for r in proven):
        assert nearest == max(r for r in proven if r < version)
    else:
        assert nearest == min(proven)
    assert nearest_proven(version, []) is None


def test_maas_version_row_on_the_matrix():
    """upstream.lock.yaml's matrix: ok on 3.5.13, 3.6.5, 3.7.3 and 3.8.0a1 (as master serves it,
    3.8.0~a1); each other release that works names its series' proven release, or the nearest older."""
    from maas_kubevirt import upstream

    lock = upstream.proven(Path(__file__).resolve().parents[1] / upstream.LOCK_NAME)
    matrix = upstream.proven_releases("maas", lock)
    assert matrix == ("3.5.13", "3.6.5", "3.7.3", "3.8.0a1") and lock["maas"] in matrix
    expected = {"3.5.13": ("ok", None), "3.6.5": ("ok", None), "3.7.3": ("ok", None),
                "3.8.0a1": ("ok", None), "3.8.0~a1": ("ok", None), "3.8.0~alpha1-123-g.abc": ("ok", None),
                "3.8.0~a2": ("warn", "3.8.0a1"), "3.8.0~beta1": ("warn", "3.8.0a1"), "3.8.0": ("warn", "3.8.0a1"),
                "3.9.0": ("warn", "3.8.0a1"), "4.0.0~rc1": ("warn", "3.8.0a1"),
                "3.5.4": ("warn", "3.5.13"), "3.5.14": ("warn", "3.5.13"), "3.6.6": ("warn", "3.6.5"),
                "3.7.4": ("warn", "3.7.3"), "3.4.2": ("warn", "3.5.13"),
                "2.9.0": ("warn", "3.5.13"), "3.6.4": ("fail", None), "3.7.0": ("fail", None), "2.8.9": ("fail", None)}
    for text, (status, nearest) in expected.items():
        check = doctor.version_check(text, matrix)
        assert check.status == status, (text, check)
        if nearest:
            assert f"the nearest proven is {nearest}" in check.found, (text, check)


_qualifiers = st.sampled_from([("", (0, 0)), ("~alpha{}", (-3, None)), ("a{}", (-3, None)), ("~a{}", (-3, None)),
                               ("~beta{}", (-2, None)), ("b{}", (-2, None)), ("~rc{}", (-1, None)), ("rc{}", (-1, None))])


@given(_versions, _qualifiers, st.integers(1, 30), st.sampled_from(["", "-16517-g.4c8b7a1", "-123"]))
def test_a_release_key_orders_pre_releases_below_their_release(version, qualifier, number, build):
    """MAAS's spellings (3.8.0~alpha1, as MAASVersion prints; 3.8.0a1, pyproject's; 3.8.0~a1, master's
    version/) read as one key, with the build's suffix ignored; any pre-release sorts below its release."""
    from maas_kubevirt.maas import parse_version, release_key

    spelling, (order, _) = qualifier
    text = f"{_text(version)}{spelling.format(number)}{build}"
    key = release_key(text)
    assert key == version + ((order, number) if spelling else (0, 0))
    assert parse_version(text) == version
    assert (key < version + (0, 0)) == bool(spelling)


@given(_versions, _qualifiers, st.integers(1, 30),
       st.lists(_versions.filter(lambda v: v >= (3, 7, 3)), min_size=1, max_size=4, unique=True))
def test_a_release_newer_than_every_proven_one_is_a_warning_naming_the_newest(version, qualifier, number, proven):
    """Above every proven release (a pre-release of one included), doctor warns and names the newest proven."""
    spelling, _ = qualifier
    newest = max(proven)
    assume(version > newest)
    check = doctor.version_check(f"{_text(version)}{spelling.format(number)}", [_text(r) for r in proven])
    assert check.status == "warn", check
    assert f"the nearest proven is {_text(newest)}" in check.found and _text(newest) in check.fix


def test_an_unreadable_maas_version_is_a_warning():
    assert doctor.version_check("garbage\x1b[31m").status == "warn"
    assert "\x1b" not in doctor.version_check("garbage\x1b[31m").found


# --- ingress.source_ranges: at most a few hosts (issue 25 item 3) -------------------------------

_v4_small = st.builds(lambda third, host, prefix: f"10.0.{third}.{host}/{prefix}",
                      st.integers(0, 3), st.integers(0, 255), st.integers(24, 32))
_v6_small = st.builds(lambda host, prefix: f"fd00::{host:x}/{prefix}", st.integers(0, 0xffff), st.integers(116, 128))


def _hosts(cidr: str) -> set:
    import ipaddress

    return set(ipaddress.ip_network(cidr, strict=False))


@given(st.lists(st.one_of(_v4_small, _v6_small), min_size=1, max_size=6))
def test_the_allowed_addresses_are_the_union_of_the_ranges(ranges):
    """Overlapping ranges count once, a host bit set counts as its network, and the row is ok
    exactly when that count is at most MAX_ALLOWED_ADDRESSES."""
    union = set().union(*(_hosts(r) for r in ranges))
    assert doctor.allowed_addresses(ranges) == (len(union), [])
    check = doctor.source_ranges_check(ranges, APPLY)
    assert check.name == "ingress.source_ranges"
    assert check.status == ("ok" if len(union) <= doctor.MAX_ALLOWED_ADDRESSES else "warn")
    assert (check.fix == "") == (check.status == "ok")


@given(st.integers(0, 2 ** 32 - 1), st.integers(1, 32))
def test_one_ipv4_range_is_ok_up_to_a_slash_28(address, prefix):
    import ipaddress

    cidr = f"{ipaddress.IPv4Address(address)}/{prefix}"
    check = doctor.source_ranges_check([cidr], APPLY)
    assert check.status == ("ok" if prefix >= 28 else "warn"), check
    assert f"{2 ** (32 - prefix):,} address" in check.found


@given(st.integers(0, 2 ** 128 - 1), st.integers(1, 128))
def test_one_ipv6_range_is_ok_up_to_a_slash_124(address, prefix):
    import ipaddress

    check = doctor.source_ranges_check([f"{ipaddress.IPv6Address(address)}/{prefix}"], APPLY)
    assert check.status == ("ok" if prefix >= 124 else "warn"), check


@given(st.sets(st.integers(0, 2 ** 24 - 1), min_size=1, max_size=40), st.booleans())
def test_single_hosts_are_ok_up_to_sixteen_of_them(hosts, ipv6):
    """/32s or /128s, one per rack controller: the 17th is one too many."""
    import ipaddress

    ranges = [f"{ipaddress.IPv6Address(0xfd00 << 112 | h)}/128" if ipv6 else f"{ipaddress.IPv4Address(10 << 24 | h)}/32"
              for h in sorted(hosts)]
    check = doctor.source_ranges_check(ranges, APPLY)
    assert doctor.allowed_addresses(ranges)[0] == len(hosts)
    assert check.status == ("ok" if len(hosts) <= 16 else "warn")


@pytest.mark.parametrize("ranges, version", [
    (["0.0.0.0/0"], "IPv4"), (["10.0.0.5/32", "::/0"], "IPv6"), (["::/0", "0.0.0.0/0"], "IPv4 and IPv6"),
])
def test_the_whole_address_space_is_said_plainly(ranges, version):
    check = doctor.source_ranges_check(ranges, APPLY)
    assert check.status == "warn" and check.subjects == tuple(r for r in ranges if r.endswith("/0"))
    assert f"every {version} address may reach the BMCs" in check.found


def test_the_fix_names_the_edit_and_where_maas_lists_its_rack_controllers():
    check = doctor.source_ranges_check(VALUES["ingress"]["source_ranges"], APPLY)
    # The shipped example (the private ranges) is far wider than a few hosts.
    assert check.status == "warn" and check.subjects == ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")
    assert "17,891,328 addresses may reach the BMCs" in check.found
    assert "each as /32 (IPv4) or /128 (IPv6)" in check.fix and "`source_ranges: [10.0.0.5/32, 10.0.0.6/32]`" in check.fix
    assert "`maas $PROFILE rack-controllers read`" in check.fix and check.fix.endswith(APPLY)
    assert "2^120 addresses" in doctor.source_ranges_check(["fd00::/8"], APPLY).found
    assert doctor.source_ranges_check(["10.0.0.5/32", "10.0.0.6/32"], APPLY, rack_controllers=2).found == (
        "10.0.0.5/32, 10.0.0.6/32: 2 address(es) may reach the BMCs; MAAS lists 2 rack controller(s): "
        "1 address(es) allowed per rack controller")


def test_the_readme_and_the_upgrade_page_state_the_proven_releases():
    from maas_kubevirt import upstream

    root = Path(__file__).resolve().parents[1]
    matrix = upstream.proven_releases("maas", upstream.proven(root / upstream.LOCK_NAME))
    stated = ", ".join(matrix[:-1]) + " and " + matrix[-1]
    for page in ("README.md", "docs/how-to/upgrade-maas.md"):
        assert stated in " ".join((root / page).read_text(encoding="utf-8").split()), page
