"""doctor's exposure rows as pure functions over what the API server returns: the Gateway, its
listeners' hostnames and allowedRoutes, the generated HTTPRoutes and their allowlist objects
(gateway.*), and which mechanism holds the BMC Ingresses to the source ranges (ingress.allowlist).

The generated objects come from a real render: the BMC policy's generate rules, with the VM's
name and namespace put in as Kyverno does, and then the status an implementation would write.
"""

from __future__ import annotations

import copy
import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from maas_kubevirt import bmc_proxy, doctor, exposure, policies
from maas_kubevirt.kube import KubeError
from maas_kubevirt.values import load_values
from test_doctor_checks import (
    MemoryCluster, cluster_policy, kyverno_role, namespace, network_policy, policy_crd,
)

DOMAIN = "bmc.example.com"
WHERE = "gw/bmc"
APPLY = "`maas-kubevirt render --output build && kubectl apply -k build/kubernetes`"
OPT_IN = "maas.io/kubevirt-bmc=enabled"
RANGES = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"]
SELECTOR = {"from": "Selector", "selector": {"matchLabels": {"maas.io/kubevirt-bmc": "enabled"}}}


def gateway_values(allowlist: str = "traefik", section: str = "") -> dict:
    values = load_values(None)
    values["exposure"] = "gateway"
    values["gateway"].update(namespace="gw", name="bmc", section_name=section, allowlist=allowlist)
    return values


def generated(values: dict, kind: str, vm_name: str, ns: str) -> dict:
    """The object the rendered BMC policy generates for one VM, as the API server returns it."""
    bundle = policies.objects(policies.render_kubernetes(values, None))
    policy = next(o for o in bundle if o["kind"] == "ClusterPolicy" and o["metadata"]["name"] == policies.POLICY_NAMES["bmc"])
    rule = next(r["generate"] for r in policy["spec"]["rules"] if (r.get("generate") or {}).get("kind") == kind)
    text = json.dumps({"apiVersion": rule["apiVersion"], "kind": kind, "metadata": {"name": rule["name"], "namespace": ns},
                       "spec": rule["data"]["spec"]})
    text = re.sub(r"\{\{\s*request\.object\.metadata\.name\s*\}\}", vm_name, text)
    return json.loads(re.sub(r"\{\{\s*request\.object\.metadata\.namespace\s*\}\}", ns, text))


def condition(kind: str, status: str = "True", reason: str = "", message: str = "") -> dict:
    return {"type": kind, "status": status, "reason": reason or kind, "message": message}


def listener(name: str, hostname: str | None, protocol: str = "HTTPS", namespaces: dict | None = None,
             kinds: list | None = None) -> dict:
    item = {"name": name, "protocol": protocol, "port": 443 if protocol == "HTTPS" else 80}
    if hostname is not None:
        item["hostname"] = hostname
    allowed = {}
    if namespaces is not None:
        allowed["namespaces"] = namespaces
    if kinds is not None:
        allowed["kinds"] = kinds
    if allowed:
        item["allowedRoutes"] = allowed
    return item


def gateway(*listeners: dict, programmed: str = "True", listener_status: dict | None = None) -> dict:
    statuses = [{"name": item["name"], "conditions": [condition(k) for k in doctor.gateway.LISTENER_CONDITIONS]}
                for item in listeners]
    for status in statuses:
        if listener_status and status["name"] in listener_status:
            status["conditions"] = listener_status[status["name"]]
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": "bmc", "namespace": "gw"}, "spec": {"gatewayClassName": "traefik", "listeners": list(listeners)},
            "status": {"conditions": [condition("Accepted"), condition("Programmed", programmed)], "listeners": statuses}}


WILDCARD = gateway(listener("bmc", f"*.{DOMAIN}", namespaces=SELECTOR))


def accepted(route: dict, accepted_: str = "True", resolved: str = "True", parent: dict | None = None,
             reason: str = "") -> dict:
    """The route with the status.parents entry the Gateway's controller writes."""
    route = copy.deepcopy(route)
    ref = parent or route["spec"]["parentRefs"][0]
    route["status"] = {"parents": [{"parentRef": ref, "controllerName": "traefik.io/gateway-controller",
                                    "conditions": [condition("Accepted", accepted_, reason), condition("ResolvedRefs", resolved, reason)]}]}
    return route


def ancestors(policy: dict, status: str = "True", gateway_name: str = "bmc") -> dict:
    policy = copy.deepcopy(policy)
    policy["status"] = {"ancestors": [{"ancestorRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway",
                                                       "namespace": "gw", "name": gateway_name},
                                       "controllerName": "gateway.envoyproxy.io/gatewayclass-controller",
                                       "conditions": [condition("Accepted", status)]}]}
    return policy


# --- Gateway API hostname matching: a wildcard matches one or more labels ------------------------

LABEL = st.sampled_from(["a", "b", "vms", "bmc", "example", "com"])
LABELS = st.lists(LABEL, min_size=1, max_size=4)


def matches_by_labels(listener_labels: list[str] | None, host: list[str]) -> bool:
    """The rule stated on labels: no hostname matches all; ``*`` first matches one or more labels."""
    if listener_labels is None:
        return True
    if listener_labels[0] == "*":
        tail = listener_labels[1:]
        return len(host) > len(tail) and host[len(host) - len(tail):] == tail
    return listener_labels == host


LISTENER = st.one_of(st.none(), LABELS, LABELS.map(lambda labels: ["*"] + labels))


@given(LISTENER, LABELS)
def test_a_listener_hostname_matches_a_host_as_gateway_api_says(labels, host):
    hostname = None if labels is None else ".".join(labels)
    assert doctor.hostname_matches(hostname, ".".join(host)) == matches_by_labels(labels, host)
    assert doctor.hostname_matches(hostname and hostname.upper(), ".".join(host)) == matches_by_labels(labels, host)


@given(LISTENER, LABELS, LABELS)
def test_a_listener_covers_a_namespace_when_it_matches_every_host_under_it(labels, suffix, prefix):
    """covers(*.suffix) holds exactly when every <label>.suffix matches: two fresh labels stand for
    all of them, and any prefix then matches too."""
    hostname = None if labels is None else ".".join(labels)
    covered = doctor.hostname_covers(hostname, ".".join(suffix))
    fresh = [["zz-fresh"], ["zz-fresh", "zz-other"]]
    assert covered == all(matches_by_labels(labels, p + suffix) for p in fresh)
    if covered:
        assert doctor.hostname_matches(hostname, ".".join(prefix + suffix))


@given(st.sampled_from(["web1", "a", "x" * 55]), st.sampled_from(["vms", "tenant-b"]))
def test_a_domain_wildcard_covers_every_namespace_and_a_namespace_wildcard_only_its_own(vm_name, ns):
    host = f"{vm_name}.{ns}.{DOMAIN}"
    assert doctor.hostname_matches(f"*.{DOMAIN}", host) and doctor.hostname_covers(f"*.{DOMAIN}", f"{ns}.{DOMAIN}")
    assert doctor.hostname_covers(f"*.{ns}.{DOMAIN}", f"{ns}.{DOMAIN}")
    assert not doctor.hostname_covers(f"*.other.{DOMAIN}", f"{ns}.{DOMAIN}")
    assert not doctor.hostname_matches(f"*.{DOMAIN}", DOMAIN)          # one or more labels, not none
    assert not doctor.hostname_covers(host, f"{ns}.{DOMAIN}")           # an exact hostname is one host
    assert doctor.hostname_covers(None, f"{ns}.{DOMAIN}")


# --- gateway.programmed ------------------------------------------------------------------------------


def programmed(gw, namespaces=("vms",), section="", crd=True):
    return doctor.programmed_check(gw, crd, WHERE, section, list(namespaces), DOMAIN)


def test_the_gateway_programmed_with_a_listener_for_every_namespace():
    check = programmed(WILDCARD, ["vms", "tenant-b"])
    assert check.status == "ok" and "listener bmc" in check.found and "2 opted-in" in check.found
    per_namespace = gateway(listener("vms", f"*.vms.{DOMAIN}"), listener("b", f"*.tenant-b.{DOMAIN}"))
    assert programmed(per_namespace, ["vms", "tenant-b"]).status == "ok"
    assert programmed(WILDCARD, []).status == "ok"


def test_a_missing_gateway_or_missing_crds():
    absent = programmed(None)
    assert absent.status == "fail" and "does not exist" in absent.found and "gateway.name" in absent.fix
    no_crds = programmed(None, crd=False)
    assert no_crds.status == "fail" and doctor.gateway.GATEWAY_CRD in no_crds.found
    assert "sigs.k8s.io/gateway-api" in no_crds.fix


def test_a_gateway_not_programmed_says_why():
    check = programmed(gateway(listener("bmc", f"*.{DOMAIN}"), programmed="False"))
    assert check.status == "fail" and "Programmed False" in check.found
    assert "`kubectl -n gw describe gateway bmc`" in check.fix
    unset = copy.deepcopy(WILDCARD)
    unset["status"] = {}
    assert "no Programmed condition" in programmed(unset).found


def test_a_section_name_the_gateway_lacks():
    check = programmed(WILDCARD, section="bmc-https")
    assert check.status == "fail" and "no listener bmc-https" in check.found and "it has: bmc" in check.found
    assert "gateway.section_name" in check.fix
    assert programmed(WILDCARD, section="bmc").status == "ok"


def test_a_namespace_without_an_https_listener_is_named():
    gw = gateway(listener("vms", f"*.vms.{DOMAIN}"), listener("web", f"*.tenant-b.{DOMAIN}", protocol="HTTP"))
    check = programmed(gw, ["vms", "tenant-b", "shop"])
    assert check.status == "fail" and check.subjects == ("tenant-b", "shop")
    assert "web is HTTP" in check.found
    assert f"*.<ns>.{DOMAIN}" in check.fix and "certificate" in check.fix
    # The exact name of one VM's host serves that VM alone, not the namespace.
    assert programmed(gateway(listener("one", f"web1.vms.{DOMAIN}")), ["vms"]).status == "fail"
    # With section_name, only that listener counts.
    both = gateway(listener("other", f"*.{DOMAIN}"), listener("bmc", f"*.vms.{DOMAIN}"))
    assert programmed(both, ["vms", "shop"], section="bmc").subjects == ("shop",)


def test_a_listener_its_controller_refused():
    gw = gateway(listener("bmc", f"*.{DOMAIN}"), listener_status={"bmc": [
        condition("Accepted"), condition("Programmed", "False", "Invalid"),
        condition("ResolvedRefs", "False", "InvalidCertificateRef", "secret gw/bmc-tls does not exist")]})
    check = programmed(gw)
    assert check.status == "fail" and "InvalidCertificateRef" in check.found and check.subjects == ("vms",)


# --- gateway.allowed_routes ----------------------------------------------------------------------------


def other(name: str, labels: dict | None = None) -> dict:
    return {"metadata": {"name": name, "labels": labels or {}}}


OPTED = [namespace("vms", True), namespace("tenant-b", True)]
EVERYONE = OPTED + [other("gw"), other("kube-system"), other("shop", {"team": "web"})]


def allowed(gw, opted=OPTED, everyone=EVERYONE, section=""):
    return doctor.allowed_routes_check(gw, WHERE, section, opted, everyone, DOMAIN, OPT_IN)


def test_a_selector_on_the_opt_in_label_admits_exactly_the_opted_in_namespaces():
    check = allowed(WILDCARD)
    assert check.status == "ok" and "exactly the 2 opted-in" in check.found
    assert "from: Selector maas.io/kubevirt-bmc=enabled" in check.found


def test_from_all_admits_every_other_namespace_and_says_which():
    check = allowed(gateway(listener("bmc", f"*.{DOMAIN}", namespaces={"from": "All"})))
    assert check.status == "warn" and check.subjects == ("gw", "kube-system", "shop")
    assert "from: All" in check.found
    assert "matchLabels: {maas.io/kubevirt-bmc: enabled}" in check.fix


def test_a_selector_is_evaluated_against_the_namespaces():
    wide = {"from": "Selector", "selector": {"matchExpressions": [{"key": "team", "operator": "DoesNotExist"}]}}
    check = allowed(gateway(listener("bmc", f"*.{DOMAIN}", namespaces=wide)))
    assert check.status == "warn" and check.subjects == ("gw", "kube-system")
    narrow = {"from": "Selector", "selector": {"matchLabels": {"team": "web"}}}
    check = allowed(gateway(listener("bmc", f"*.{DOMAIN}", namespaces=narrow)))
    assert check.status == "fail" and check.subjects == ("tenant-b", "vms") and "shop" not in check.subjects


def test_from_same_admits_only_the_gateways_namespace():
    check = allowed(gateway(listener("bmc", f"*.{DOMAIN}")))       # allowedRoutes' default
    assert check.status == "fail" and check.subjects == ("tenant-b", "vms") and "from: Same" in check.found
    # Known without listing the namespaces.
    assert allowed(gateway(listener("bmc", f"*.{DOMAIN}")), everyone=None).status == "fail"


def test_a_listener_whose_kinds_exclude_httproute_admits_no_route():
    kinds = [{"group": "gateway.networking.k8s.io", "kind": "GRPCRoute"}]
    check = allowed(gateway(listener("bmc", f"*.{DOMAIN}", namespaces={"from": "All"}, kinds=kinds)))
    assert check.status == "fail" and check.subjects == ("tenant-b", "vms")
    kinds = [{"kind": "HTTPRoute"}]
    assert allowed(gateway(listener("bmc", f"*.{DOMAIN}", namespaces=SELECTOR, kinds=kinds))).status == "ok"


def test_namespaces_that_may_not_be_listed_leave_the_others_unknown():
    check = allowed(WILDCARD, everyone=None)
    assert check.status == "warn" and "not known" in check.found


def test_allowed_routes_without_a_gateway_or_listener():
    assert allowed(None).status == "skip"
    assert allowed(gateway(listener("web", "shop.example.org"))).status == "skip"
    assert allowed(WILDCARD, opted=[]).status == "ok"


def test_each_namespace_is_judged_by_the_listeners_that_serve_it():
    gw = gateway(listener("vms", f"*.vms.{DOMAIN}", namespaces=SELECTOR),
                 listener("b", f"*.tenant-b.{DOMAIN}", namespaces={"from": "Same"}),
                 listener("shop", "*.shop.example.org", namespaces={"from": "All"}))
    check = allowed(gw)
    assert check.status == "fail" and check.subjects == ("tenant-b",)


# --- gateway.routes -------------------------------------------------------------------------------------


VALUES = gateway_values()
ROUTE = generated(VALUES, "HTTPRoute", "web1", "vms")


def test_the_generated_route_attaches_to_the_sites_gateway():
    assert ROUTE["metadata"]["name"] == "web1-bmc" and ROUTE["spec"]["hostnames"] == [f"web1.vms.{DOMAIN}"]
    assert doctor.hostname_matches(WILDCARD["spec"]["listeners"][0]["hostname"], ROUTE["spec"]["hostnames"][0])


def routes(expected, items, section=""):
    return doctor.routes_check(expected, {"vms": items}, WHERE, section, APPLY)


def test_every_route_accepted_with_resolved_refs():
    web2 = generated(VALUES, "HTTPRoute", "web2", "vms")
    check = routes([("vms", "web1"), ("vms", "web2")], [accepted(ROUTE), accepted(web2)])
    assert check.status == "ok" and "2 HTTPRoute(s)" in check.found
    assert routes([], []).status == "ok"


@pytest.mark.parametrize("route, problem", [
    (None, "missing"),
    (ROUTE, "no status from Gateway gw/bmc"),
    (accepted(ROUTE, "False", reason="NotAllowedByListeners"), "Accepted False: NotAllowedByListeners"),
    (accepted(ROUTE, resolved="False", reason="BackendNotFound"), "ResolvedRefs False: BackendNotFound"),
    (accepted(ROUTE, parent={"group": "gateway.networking.k8s.io", "kind": "Gateway", "namespace": "gw", "name": "other"}),
     "no status from Gateway gw/bmc"),
])
def test_a_route_that_serves_no_bmc_is_named(route, problem):
    web2 = generated(VALUES, "HTTPRoute", "web2", "vms")
    check = routes([("vms", "web1"), ("vms", "web2")], [accepted(web2)] + ([route] if route else []))
    assert check.status == "fail" and check.subjects == ("vms/web1-bmc",)
    assert problem in check.found and "1 of 2" in check.found
    assert "NotAllowedByListeners" in check.fix and APPLY in check.fix


def test_a_route_on_its_section_is_judged_by_that_parent():
    values = gateway_values(section="bmc")
    route = generated(values, "HTTPRoute", "web1", "vms")
    assert route["spec"]["parentRefs"][0]["sectionName"] == "bmc"
    assert routes([("vms", "web1")], [accepted(route)], section="bmc").status == "ok"
    assert routes([("vms", "web1")], [accepted(ROUTE)], section="bmc").status == "fail"


def test_routes_are_listed_by_the_listed_convention():
    expected = [("vms", f"web{i}") for i in range(8)]
    check = routes(expected, [])
    assert len(check.subjects) == 8 and "and 3 more" in check.found


# --- gateway.allowlist ----------------------------------------------------------------------------------


def envoy(policies_, crd=True):
    return doctor.gateway_allowlist_check("envoy-gateway", [("vms", "web1")], {"vms": [accepted(ROUTE)]},
                                          {"vms": policies_}, RANGES, WHERE, crd, APPLY)


SECURITY_POLICY = generated(gateway_values("envoy-gateway"), "SecurityPolicy", "web1", "vms")


def test_envoy_gateway_each_route_targeted_by_an_accepted_security_policy():
    check = envoy([ancestors(SECURITY_POLICY)])
    assert check.status == "ok" and "SecurityPolicy" in check.found


@pytest.mark.parametrize("change, problem", [
    (lambda p: p.clear(), "no SecurityPolicy"),
    (lambda p: p["spec"]["targetRefs"][0].update(name="web2-bmc"), "does not target HTTPRoute web1-bmc"),
    (lambda p: p["spec"]["authorization"].update(defaultAction="Allow"), "defaultAction is not Deny"),
    (lambda p: p["spec"]["authorization"]["rules"][0]["principal"].update(clientCIDRs=["0.0.0.0/0"]), "allows 0.0.0.0/0"),
    (lambda p: p["status"]["ancestors"][0]["conditions"][0].update(status="False"), "not Accepted"),
    (lambda p: p.pop("status"), "no status from Gateway gw/bmc"),
    (lambda p: p["status"]["ancestors"][0]["ancestorRef"].update(name="other"), "no status from Gateway gw/bmc"),
])
def test_envoy_gateway_a_policy_missing_changed_or_unattached(change, problem):
    policy = ancestors(SECURITY_POLICY)
    change(policy)
    check = envoy([policy] if policy else [])
    assert check.status == "fail" and problem in check.found and check.subjects == ("vms/web1-bmc-allowlist",)
    assert "securitypolicy" in check.fix


def test_external_warns_every_run():
    for expected in ([], [("vms", "web1")]):
        check = doctor.gateway_allowlist_check("external", expected, {}, {}, RANGES, WHERE, True, APPLY)
        assert check.status == "warn"
        assert check.found.startswith("the allowlist is enforced outside maas-kubevirt (gateway.allowlist: external): ")
        assert ", ".join(RANGES) in check.found and "gw/bmc" in check.found


# --- ingress.allowlist ---------------------------------------------------------------------------------


def test_the_annotation_is_named_and_left_to_the_ingress_rows():
    check = doctor.ingress_allowlist_check(load_values(None))
    assert check.status == "ok" and policies.ALLOWLIST_ANNOTATION in check.found
    assert "cluster.ingress_allowlist" in check.found


# --- the cluster section with each exposure --------------------------------------------------------------


class GatewayCluster(MemoryCluster):
    """A healthy site on exposure gateway: the Gateway, and per VM what the bundle generates."""

    def __init__(self, seed: str, values: dict):
        super().__init__(seed)
        bundle = policies.objects(policies.render_kubernetes(values, None))
        ours = [o for o in bundle if o["kind"] == "ClusterRole"
                and any(k.startswith("rbac.kyverno.io/") for k in o["metadata"]["labels"])]
        self.roles = copy.deepcopy(ours)
        for role in ours:
            controller = next(k for k in role["metadata"]["labels"] if k.startswith("rbac.kyverno.io/")).split("aggregate-to-")[1]
            self.roles.append(kyverno_role(controller, copy.deepcopy(role["rules"])))
        self.policies = [cluster_policy(o["metadata"]["name"], "True") for o in bundle if o["kind"] == "ClusterPolicy"]
        self.crds.update({doctor.gateway.GATEWAY_CRD: {}, "securitypolicies.gateway.envoyproxy.io": {}})
        self.proxy = {o["kind"]: o for o in bundle if o["metadata"].get("name") == bmc_proxy.NAME}
        self.crds[doctor.KYVERNO_POLICY_CRD] = policy_crd(True)
        self.inventory.ingresses = []
        self.gateway_object = copy.deepcopy(WILDCARD)
        self.routes = [accepted(generated(values, "HTTPRoute", "web1", "vms"))]
        mode = values["gateway"]["allowlist"]
        self.allowlist = [ancestors(generated(values, "SecurityPolicy", "web1", "vms"))] if mode == "envoy-gateway" else []
        self.everyone = [namespace("vms", True), other("gw")]
        self.policies_of = {"vms": [network_policy("vms")]}

    def namespaces(self, selector=None):
        return self.namespace_list if selector == OPT_IN else self.everyone

    def gateway(self, ns, name):
        return self.gateway_object if (ns, name) == ("gw", "bmc") else None

    def httproutes(self, ns):
        return self.routes if ns == "vms" else []

    def gateways(self):
        return [self.gateway_object] if self.gateway_object is not None else []

    def deployments(self, selector):
        return [self.proxy["Deployment"]] if selector == f"app.kubernetes.io/name={bmc_proxy.NAME}" and "Deployment" in self.proxy else []

    def configmap(self, namespace, name):
        return self.proxy.get("ConfigMap") if name == bmc_proxy.NAME else None

    def securitypolicies(self, ns):
        return self.allowlist if ns == "vms" else []


def cluster_rows(values, cluster, seed="s" * 40):
    return {c.name: c for c in doctor.cluster_checks(values, cluster, seed, doctor._Fixes("maas-kubevirt", values),
                                                     doctor.Reach())}


@pytest.mark.parametrize("allowlist", ["traefik", "envoy-gateway"])
def test_a_healthy_gateway_site(allowlist):
    values = gateway_values(allowlist)
    rows = cluster_rows(values, GatewayCluster("s" * 40, values))
    assert {n: c.status for n, c in rows.items() if c.status != "ok"} == {}
    names = list(rows)
    assert names.index("gateway.programmed") > names.index("cluster.vms/vms")
    assert names[names.index("gateway.programmed"):names.index("gateway.allowlist") + 1] == list(doctor.GATEWAY_CHECKS)
    # The Ingress rows that the gateway exposure does not generate for are not made.
    assert "cluster.ingress_allowlist" not in rows and "ingress.allowlist" not in rows
    assert rows["cluster.vms/vms"].found == "1 VM(s), each with MACs, Secret and VirtualMachineBMC"
    assert all(set(c.as_dict()) == {"check", "status", "found", "fix", "subjects"} for c in rows.values())


def test_a_gateway_site_with_each_failure():
    values = gateway_values()
    cluster = GatewayCluster("s" * 40, values)
    cluster.gateway_object["status"]["conditions"][1]["status"] = "False"
    cluster.gateway_object["spec"]["listeners"][0]["allowedRoutes"] = {"namespaces": {"from": "All"}}
    cluster.routes = [accepted(cluster.routes[0], "False", reason="NotAllowedByListeners")]
    cluster.proxy.pop("ConfigMap")
    rows = cluster_rows(values, cluster)
    assert {n: c.status for n, c in rows.items() if n.startswith("gateway.")} == {
        "gateway.programmed": "fail", "gateway.allowed_routes": "warn", "gateway.routes": "fail", "gateway.allowlist": "ok"}
    assert rows["proxy.allowlist"].status == "fail" and "no ConfigMap" in rows["proxy.allowlist"].found
    assert rows["gateway.allowed_routes"].subjects == ("gw",)
    external = gateway_values("external")
    rows = cluster_rows(external, GatewayCluster("s" * 40, external))
    assert rows["gateway.allowlist"].status == "warn"


def test_a_gateway_site_without_gateway_api():
    values = gateway_values()
    cluster = GatewayCluster("s" * 40, values)
    cluster.gateway_object = None
    cluster.crds.pop(doctor.gateway.GATEWAY_CRD)
    rows = cluster_rows(values, cluster)
    assert "not installed" in rows["gateway.programmed"].found and rows["gateway.allowed_routes"].status == "skip"
    assert rows["gateway.allowlist"].status == "ok" and rows["proxy.isolation"].status == "ok"


def test_the_api_server_failing_at_the_gateway_skips_the_rows_after_it():
    values = gateway_values()
    cluster = GatewayCluster("s" * 40, values)

    def refuse(ns, name):
        raise KubeError(f"/apis/gateway.networking.k8s.io/v1/namespaces/{ns}/gateways/{name}", 500, "etcd is down")

    cluster.gateway = refuse
    rows = cluster_rows(values, cluster)
    assert rows["cluster.api"].status == "fail" and "etcd is down" in rows["cluster.api"].found
    assert {n: rows[n].status for n in doctor.GATEWAY_CHECKS} == dict.fromkeys(doctor.GATEWAY_CHECKS, "skip")
    assert rows["cluster.network_policies"].status == "skip" and "cluster.ingress_allowlist" not in rows


def test_the_ingress_exposure_says_which_mechanism_enforces_the_ranges():
    rows = cluster_rows(load_values(None), MemoryCluster("s" * 40))
    assert rows["ingress.allowlist"].status == "ok" and rows["cluster.ingress_allowlist"].status == "ok"
    names = list(rows)
    assert names.index("ingress.allowlist") == names.index("cluster.ingress_allowlist") + 1
