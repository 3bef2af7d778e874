"""The route-isolation policy through the Kyverno engine (`kyverno test`): every detour of issue 30.

Rendered for a gateway site that serves every Gateway API route kind, so each rule is there. Each
suite runs as one requester (Kyverno's background controller, or a tenant); the BMC pods'
addresses, which the policy lists with an apiCall, are given as the rule's values. Writes by the
endpoint controllers are excluded before any rule runs, and `kyverno test` passes an excluded
result whatever it expects, so those are proven on the control-plane tier.
"""

from __future__ import annotations

import copy
import json
import re

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from maas_kubevirt import exposure, policies
from maas_kubevirt.values import load_values, validate
from test_policies_kyverno import json_stream, kyverno, run_tests  # noqa: F401  (the fixture)

DOMAIN = "bmc.example.com"
GATEWAY = ("bmc-gateway", "bmc", "bmc-https")
BMC_POD_IP = "10.244.1.7"
POLICY = policies.POLICY_NAMES["route_isolation"]
BACKGROUND = "system:serviceaccount:kyverno:kyverno-background-controller"
TENANT = "system:serviceaccount:tenant-a:deployer"
ADMIN = "site-admin"
BMC_CLASS = "maas-kubevirt-bmc"
HOST_ROUTE = "Host(`app.example.org`) && PathPrefix(`/api`)"
TO_BMC = [{"name": "web1-virtbmc", "namespace": "tenant-b", "port": 80}]


def site_values() -> dict:
    values = copy.deepcopy(load_values(None))
    values["exposure"] = "gateway"
    values["gateway"].update(namespace=GATEWAY[0], name=GATEWAY[1], section_name=GATEWAY[2],
                             route_kinds=list(exposure.ROUTE_KIND_MATCH), traefik_crds=True)
    return validate(values)


def route(kind: str, name: str, namespace: str, hostnames: list[str] | None, parents: list[dict] | None = None) -> dict:
    version = "v1" if kind in ("HTTPRoute", "GRPCRoute") else "v1alpha2"
    spec: dict = {"parentRefs": parents if parents is not None else [
        {"namespace": GATEWAY[0], "name": GATEWAY[1], "sectionName": GATEWAY[2]}]}
    if hostnames is not None:
        spec["hostnames"] = hostnames
    return {"apiVersion": f"gateway.networking.k8s.io/{version}", "kind": kind,
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def service(name: str, namespace: str, external_name: str | None) -> dict:
    spec = {"type": "ExternalName", "externalName": external_name} if external_name else {
        "type": "ClusterIP", "ports": [{"port": 80}]}
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def endpoint_slice(name: str, namespace: str, service_name: str, addresses: list[str]) -> dict:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"name": name, "namespace": namespace, "labels": {"kubernetes.io/service-name": service_name}},
            "endpoints": [{"addresses": addresses}], "ports": [{"port": 10080}]}


def endpoints(name: str, namespace: str, addresses: list[str]) -> dict:
    return {"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": name, "namespace": namespace},
            "subsets": [{"addresses": [{"ip": a} for a in addresses], "ports": [{"port": 10080}]}]}


def gateway(name: str, namespace: str, hostnames: list[str | None], class_name: str = "traefik") -> dict:
    listeners = [{"name": f"l{i}", "port": 443, "protocol": "HTTPS", **({"hostname": h} if h else {})}
                 for i, h in enumerate(hostnames)]
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"gatewayClassName": class_name, "listeners": listeners}}


def ingress_route(name: str, namespace: str, matches: list[str], services: list[dict] | None = None,
                  kind: str = "IngressRoute", priority: int | None = None) -> dict:
    """A Traefik IngressRoute (or IngressRouteTCP) with one route per match."""
    routes = [{"match": m, **({"kind": "Rule"} if kind == "IngressRoute" else {}),
               **({"priority": priority} if priority is not None else {}),
               "services": services or [{"name": "web", "port": 80}]} for m in matches]
    return {"apiVersion": "traefik.io/v1alpha1", "kind": kind, "metadata": {"name": name, "namespace": namespace},
            "spec": {"entryPoints": ["websecure"], "routes": routes}}


def traefik_service(name: str, namespace: str, spec: dict) -> dict:
    return {"apiVersion": "traefik.io/v1alpha1", "kind": "TraefikService",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def listener_set(name: str, namespace: str, hostnames: list[str | None], parent: str = GATEWAY[1]) -> dict:
    doc = gateway(name, namespace, hostnames)
    doc.update(apiVersion="gateway.networking.x-k8s.io/v1alpha1", kind="XListenerSet")
    doc["spec"] = {"parentRef": {"namespace": GATEWAY[0], "name": parent}, "listeners": doc["spec"]["listeners"]}
    return doc


def grant(name: str, namespace: str, to: list[dict]) -> dict:
    return {"apiVersion": "gateway.networking.k8s.io/v1beta1", "kind": "ReferenceGrant",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"from": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": "tenant-a"}],
                     "to": to}}


# (requester, object, {rule: expected result}); "skip" where a precondition leaves the rule out.
CASES = [
    # ExternalName detours (issue item 3): to a *-virtbmc Service by name, in any case, or to a BMC pod.
    (TENANT, service("detour-by-name", "tenant-a", "web1-virtbmc.tenant-b.svc.cluster.local"), {"service-externalname-not-to-a-bmc": "fail"}),
    (TENANT, service("detour-upper", "tenant-a", "WEB1-VIRTBMC.tenant-b.svc.cluster.local."), {"service-externalname-not-to-a-bmc": "fail"}),
    (TENANT, service("detour-short", "tenant-b", "web1-virtbmc"), {"service-externalname-not-to-a-bmc": "fail"}),
    (TENANT, service("detour-ip", "tenant-a", BMC_POD_IP), {"service-externalname-not-to-a-bmc": "fail"}),
    (TENANT, service("elsewhere", "tenant-a", "db.example.org"), {"service-externalname-not-to-a-bmc": "pass"}),
    (TENANT, service("not-virtbmc", "tenant-a", "web1-virtbmcx.tenant-b.svc"), {"service-externalname-not-to-a-bmc": "pass"}),
    (TENANT, service("plain", "tenant-a", None), {"service-externalname-not-to-a-bmc": "skip"}),
    # A selectorless Service's own Endpoints or EndpointSlice aimed at a BMC pod, or a tenant's
    # write to a BMC Service's slice.
    (TENANT, endpoint_slice("detour-abcde", "tenant-a", "detour", [BMC_POD_IP]),
     {"endpoints-not-to-a-bmc-pod": "fail", "bmc-endpoints-only-from-the-endpoint-controllers": "skip"}),
    (TENANT, endpoint_slice("db-abcde", "tenant-a", "db", ["10.0.0.5"]),
     {"endpoints-not-to-a-bmc-pod": "pass", "bmc-endpoints-only-from-the-endpoint-controllers": "skip"}),
    (TENANT, endpoint_slice("web1-virtbmc-abcde", "tenant-b", "web1-virtbmc", ["198.51.100.66"]),
     {"endpoints-not-to-a-bmc-pod": "pass", "bmc-endpoints-only-from-the-endpoint-controllers": "fail"}),
    (TENANT, endpoints("detour-endpoints", "tenant-a", ["10.0.0.9", BMC_POD_IP]),
     {"endpoints-not-to-a-bmc-pod": "fail", "bmc-endpoints-only-from-the-endpoint-controllers": "skip"}),
    (TENANT, endpoints("web1-virtbmc", "tenant-b", ["198.51.100.66"]),
     {"endpoints-not-to-a-bmc-pod": "pass", "bmc-endpoints-only-from-the-endpoint-controllers": "fail"}),
    # Routes claiming a BMC host: another namespace's, the own namespace's by hand, a covering wildcard.
    (TENANT, route("HTTPRoute", "claim", "tenant-a", [f"web1.tenant-b.{DOMAIN}"]), {"route-hostnames-outside-the-bmc-domain": "fail"}),
    (TENANT, route("HTTPRoute", "own-by-hand", "tenant-a", [f"web1.tenant-a.{DOMAIN}"]), {"route-hostnames-outside-the-bmc-domain": "fail"}),
    (TENANT, route("HTTPRoute", "wildcard", "tenant-a", ["app.example.org", "*.example.com"]), {"route-hostnames-outside-the-bmc-domain": "fail"}),
    (TENANT, route("HTTPRoute", "zone", "tenant-a", [f"*.{DOMAIN}"]), {"route-hostnames-outside-the-bmc-domain": "fail"}),
    (TENANT, route("HTTPRoute", "apex", "tenant-a", [DOMAIN]), {"route-hostnames-outside-the-bmc-domain": "fail"}),
    (TENANT, route("HTTPRoute", "app", "tenant-a", ["app.example.org", "www.bmc.example.com.example.org"]),
     {"route-hostnames-outside-the-bmc-domain": "pass", "route-no-catch-all-on-the-bmc-gateway": "skip"}),
    (TENANT, route("GRPCRoute", "grpc", "tenant-a", [f"x.tenant-b.{DOMAIN}"]), {"route-hostnames-outside-the-bmc-domain": "fail"}),
    (TENANT, route("TLSRoute", "tls", "tenant-a", [f"*.tenant-b.{DOMAIN}"]), {"route-hostnames-outside-the-bmc-domain": "fail"}),
    (BACKGROUND, route("HTTPRoute", "web1-bmc", "tenant-a", [f"web1.tenant-a.{DOMAIN}"]), {"route-hostnames-outside-the-bmc-domain": "pass"}),
    (BACKGROUND, route("HTTPRoute", "stray", "tenant-a", [f"web1.tenant-b.{DOMAIN}"]), {"route-hostnames-outside-the-bmc-domain": "fail"}),
    (BACKGROUND, route("HTTPRoute", "wild", "tenant-a", [f"*.tenant-a.{DOMAIN}"]), {"route-hostnames-outside-the-bmc-domain": "fail"}),
    # Catch-alls on the BMC Gateway's listener: no hostnames, whatever the kind.
    (TENANT, route("HTTPRoute", "catch-all", "tenant-a", None), {"route-no-catch-all-on-the-bmc-gateway": "fail"}),
    (TENANT, route("HTTPRoute", "catch-all-empty", "tenant-a", [], [{"namespace": GATEWAY[0], "name": GATEWAY[1]}]),
     {"route-no-catch-all-on-the-bmc-gateway": "fail"}),
    (TENANT, route("HTTPRoute", "catch-all-local", GATEWAY[0], None, [{"name": GATEWAY[1]}]), {"route-no-catch-all-on-the-bmc-gateway": "fail"}),
    (TENANT, route("TCPRoute", "tcp", "tenant-a", None), {"route-no-catch-all-on-the-bmc-gateway": "fail"}),
    (TENANT, route("UDPRoute", "udp", "tenant-a", None), {"route-no-catch-all-on-the-bmc-gateway": "fail"}),
    # Every listener of the BMC Gateway serves BMC hosts, whatever gateway.section_name names.
    (TENANT, route("HTTPRoute", "other-listener", "tenant-a", None,
                   [{"namespace": GATEWAY[0], "name": GATEWAY[1], "sectionName": "web"}]), {"route-no-catch-all-on-the-bmc-gateway": "fail"}),
    (TENANT, route("HTTPRoute", "other-gateway", "tenant-a", None, [{"namespace": "apps", "name": "public"}]),
     {"route-no-catch-all-on-the-bmc-gateway": "pass"}),
    # Listeners: a ListenerSet's or another Gateway's, under the domain; a hostless one on the BMC Gateway.
    (TENANT, listener_set("listener-claim", "tenant-a", [f"*.tenant-b.{DOMAIN}"]), {"listenerset-outside-the-bmc-domain": "fail"}),
    (TENANT, listener_set("hostless", "tenant-a", [None]), {"listenerset-outside-the-bmc-domain": "fail"}),
    (TENANT, listener_set("listener-elsewhere", "tenant-a", [None], parent="public"), {"listenerset-outside-the-bmc-domain": "pass"}),
    # No ListenerSet adds a listener to the BMC Gateway, even one outside the domain.
    (TENANT, listener_set("apps", "tenant-a", ["apps.example.org"]), {"listenerset-outside-the-bmc-domain": "fail"}),
    (TENANT, listener_set("apps-public", "tenant-a", ["apps.example.org"], parent="public"),
     {"listenerset-outside-the-bmc-domain": "pass"}),
    (TENANT, gateway("rogue", "tenant-a", ["apps.example.org", f"*.{DOMAIN}"]), {"gateway-listeners-outside-the-bmc-domain": "fail"}),
    (TENANT, gateway("public", "apps", ["apps.example.org"]),
     {"gateway-listeners-outside-the-bmc-domain": "pass", "gateway-class-only-for-the-bmc-gateway": "pass",
      "bmc-gateway-listeners-in-the-bmc-domain": "skip"}),
    # The BMC class is the BMC Gateway's alone (issue 41): a tenant's own Gateway of it, hostless
    # listener and all, in any namespace, even one named like the BMC Gateway.
    (TENANT, gateway("tenant-gateway", "tenant-b", [None], BMC_CLASS), {"gateway-class-only-for-the-bmc-gateway": "fail"}),
    (TENANT, gateway(GATEWAY[1], "tenant-b", [f"*.tenant-b.{DOMAIN}"], BMC_CLASS),
     {"gateway-class-only-for-the-bmc-gateway": "fail"}),
    (TENANT, gateway("second", GATEWAY[0], [f"*.tenant-b.{DOMAIN}"], BMC_CLASS), {"gateway-class-only-for-the-bmc-gateway": "fail"}),
    # The BMC Gateway itself: its class, and listeners for hosts under the domain only.
    (ADMIN, gateway(GATEWAY[1], GATEWAY[0], [f"*.tenant-a.{DOMAIN}", f"*.{DOMAIN}"], BMC_CLASS),
     {"gateway-class-only-for-the-bmc-gateway": "pass", "bmc-gateway-listeners-in-the-bmc-domain": "pass"}),
    (TENANT, gateway(GATEWAY[1], GATEWAY[0], [f"*.tenant-a.{DOMAIN}", None], BMC_CLASS),
     {"bmc-gateway-listeners-in-the-bmc-domain": "fail"}),
    (BACKGROUND, gateway(GATEWAY[1], GATEWAY[0], ["*.example.com"], BMC_CLASS), {"bmc-gateway-listeners-in-the-bmc-domain": "fail"}),
    (ADMIN, gateway("bmc-elsewhere", GATEWAY[0], ["apps.example.org"], BMC_CLASS),
     {"gateway-class-only-for-the-bmc-gateway": "fail", "bmc-gateway-listeners-in-the-bmc-domain": "skip"}),
    # Traefik's IngressRoute (gateway.traefik_crds: some Traefik of the cluster reads it): a match must name
    # hosts outside the domain, and nothing Kyverno cannot read may reopen them.
    (TENANT, ingress_route("redfish", "tenant-b", ["PathPrefix(`/redfish`)"], priority=100000),
     {"traefik-routes-name-hosts-outside-the-bmc-domain": "fail", "traefik-services-not-to-another-namespaces-bmc": "pass"}),
    (TENANT, ingress_route("bmc-host", "tenant-a", [f"Host(`web1.tenant-b.{DOMAIN}`)"]),
     {"traefik-routes-name-hosts-outside-the-bmc-domain": "fail"}),
    (TENANT, ingress_route("bmc-host-upper", "tenant-a", [HOST_ROUTE, f"HOST(`WEB1.TENANT-B.{DOMAIN.upper()}`) && PathPrefix(`/`)"]),
     {"traefik-routes-name-hosts-outside-the-bmc-domain": "fail"}),
    (TENANT, ingress_route("or-path", "tenant-a", ["Host(`app.example.org`) || PathPrefix(`/redfish`)"]),
     {"traefik-routes-name-hosts-outside-the-bmc-domain": "fail"}),
    (TENANT, ingress_route("negated", "tenant-a", ["!Host(`app.example.org`)"]), {"traefik-routes-name-hosts-outside-the-bmc-domain": "fail"}),
    (TENANT, ingress_route("regexp", "tenant-a", ["HostRegexp(`^.+[.]example[.]com$`)"]),
     {"traefik-routes-name-hosts-outside-the-bmc-domain": "fail"}),
    (TENANT, ingress_route("escaped", "tenant-a", ['Host("web1.tenant-b.bmc\\x2eexample.com")']),
     {"traefik-routes-name-hosts-outside-the-bmc-domain": "fail"}),
    (TENANT, ingress_route("wildcard-sni", "tenant-a", ["HostSNI(`*`)"], kind="IngressRouteTCP"),
     {"traefik-routes-name-hosts-outside-the-bmc-domain": "fail"}),
    (TENANT, ingress_route("traefik-app", "tenant-a", [HOST_ROUTE, "host(`www.example.org`)"], priority=100000),
     {"traefik-routes-name-hosts-outside-the-bmc-domain": "pass", "traefik-services-not-to-another-namespaces-bmc": "pass"}),
    (TENANT, ingress_route("db", "tenant-a", ["HostSNI(`db.example.org`)"], kind="IngressRouteTCP"),
     {"traefik-routes-name-hosts-outside-the-bmc-domain": "pass"}),
    # ... and no service of another namespace's BMC, from a route or a TraefikService.
    (TENANT, ingress_route("to-bmc", "tenant-a", [HOST_ROUTE], services=TO_BMC),
     {"traefik-routes-name-hosts-outside-the-bmc-domain": "pass", "traefik-services-not-to-another-namespaces-bmc": "fail"}),
    (TENANT, ingress_route("to-bmc-tcp", "tenant-a", ["HostSNI(`db.example.org`)"], services=TO_BMC, kind="IngressRouteTCP"),
     {"traefik-services-not-to-another-namespaces-bmc": "fail"}),
    (TENANT, ingress_route("to-own-bmc", "tenant-b", [HOST_ROUTE], services=[{"name": "web1-virtbmc", "port": 80}]),
     {"traefik-services-not-to-another-namespaces-bmc": "pass"}),
    (TENANT, traefik_service("weighted", "tenant-a", {"weighted": {"services": [{"name": "web", "port": 80}, *TO_BMC]}}),
     {"traefik-services-not-to-another-namespaces-bmc": "fail"}),
    (TENANT, traefik_service("mirrored", "tenant-a", {"mirroring": {"name": "web", "port": 80, "mirrors": TO_BMC}}),
     {"traefik-services-not-to-another-namespaces-bmc": "fail"}),
    (TENANT, traefik_service("mirror-main", "tenant-a", {"mirroring": {**TO_BMC[0], "mirrors": []}}),
     {"traefik-services-not-to-another-namespaces-bmc": "fail"}),
    (TENANT, traefik_service("own", "tenant-a", {"weighted": {"services": [{"name": "web", "port": 80, "weight": 1}]}}),
     {"traefik-services-not-to-another-namespaces-bmc": "pass"}),
    # ReferenceGrants that let other namespaces' routes reach a BMC Service.
    (TENANT, grant("to-bmc", "tenant-b", [{"group": "", "kind": "Service", "name": "web1-virtbmc"}]), {"referencegrant-not-to-a-bmc": "fail"}),
    (TENANT, grant("to-all", "tenant-b", [{"group": "", "kind": "Service"}]), {"referencegrant-not-to-a-bmc": "fail"}),
    (TENANT, grant("to-db", "tenant-b", [{"group": "", "kind": "Service", "name": "db"}]), {"referencegrant-not-to-a-bmc": "pass"}),
    (TENANT, grant("to-secret", "tenant-b", [{"group": "", "kind": "Secret"}]), {"referencegrant-not-to-a-bmc": "pass"}),
]


def _write_suite(directory, values: dict, username: str, cases: list, policy: str = POLICY,
                 policy_file: str = "policy-route-isolation.yaml") -> int:
    """A `kyverno test` suite of cases as one requester; returns how many results it expects."""
    manifests = policies.render_kubernetes(values, None)
    (directory / "policy.yaml").write_text(manifests[policy_file])
    rule_values = [{"name": rule, "values": {"bmcPodIPs": [BMC_POD_IP]}}
                   for rule in ("service-externalname-not-to-a-bmc", "endpoints-not-to-a-bmc-pod")]
    (directory / "values.yaml").write_text(json_stream([{
        "apiVersion": "cli.kyverno.io/v1alpha1", "kind": "Values", "metadata": {"name": "values"},
        "policies": [{"name": POLICY, "rules": rule_values}]}]))
    namespace = username.split(":")[2] if username.startswith("system:serviceaccount:") else "default"
    (directory / "userinfo.yaml").write_text(json_stream([{
        "apiVersion": "cli.kyverno.io/v1alpha1", "kind": "UserInfo", "metadata": {"name": "requester"},
        "userInfo": {"username": username, "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}",
                                                      "system:authenticated"]}}]))
    objects, results = [], []
    names = [(o["metadata"]["namespace"], o["metadata"]["name"]) for o, _ in cases]
    assert len(set(names)) == len(names), "kyverno test tells results apart by namespace/name only"
    for obj, expected in cases:
        objects.append(obj)
        ref = f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
        results += [{"policy": policy, "rule": rule, "resources": [ref], "kind": obj["kind"], "result": outcome}
                    for rule, outcome in expected.items()]
    (directory / "resources.yaml").write_text(json_stream(objects))
    (directory / "kyverno-test.yaml").write_text(json_stream([{
        "apiVersion": "cli.kyverno.io/v1alpha1", "kind": "Test", "metadata": {"name": directory.name},
        "policies": ["policy.yaml"], "resources": ["resources.yaml"], "variables": "values.yaml",
        "userinfo": "userinfo.yaml", "results": results}]))
    return len(results)


def _passed(output: str) -> int:
    return sum(int(n) for n in re.findall(r"Test Summary: (\d+) tests? passed", output))


def test_every_detour_is_refused_and_the_generated_route_admitted(kyverno, tmp_path):
    values = site_values()
    expected = 0
    for username in (TENANT, BACKGROUND, ADMIN):
        suite = tmp_path / username.rsplit(":", 1)[-1]
        suite.mkdir()
        expected += _write_suite(suite, values, username, [(o, e) for u, o, e in CASES if u == username])
    output = run_tests(kyverno, tmp_path)
    assert _passed(output) >= expected, output
    assert "Excluded" not in output, output  # every result was judged by its rule


def test_every_rule_has_a_refused_and_an_admitted_case():
    rules = [r["name"] for r in policies.parse(policies.render_kubernetes(site_values(), None)["policy-route-isolation.yaml"])[0]["spec"]["rules"]]
    outcomes = {rule: {e[rule] for _, _, e in CASES if rule in e} for rule in rules}
    # That rule admits only the endpoint controllers, which are excluded before it runs (the tier).
    outcomes["bmc-endpoints-only-from-the-endpoint-controllers"].add("pass")
    assert all({"fail", "pass"} <= seen for seen in outcomes.values()), outcomes


_label = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?", fullmatch=True)
_hostname = st.one_of(
    st.builds(lambda labels, tail: ".".join(labels + [tail]), st.lists(_label, min_size=0, max_size=3),
              st.sampled_from([DOMAIN, "example.com", "com", "example.org", "bmc.example.com.example.org", "xbmc.example.com"])),
).flatmap(lambda host: st.sampled_from([host, "*." + host]))


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(hostnames=st.lists(_hostname, min_size=1, max_size=12, unique=True))
@example(hostnames=["*.com", "*.example.com", "*.bmc.example.com", "bmc.example.com", "*.xbmc.example.com",
                    "a.bmc.example.com", "example.com", "*.org"])
def test_engine_refuses_exactly_the_hostnames_the_zone_rule_claims(kyverno, tmp_path_factory, hostnames):
    """Random hostnames, one route each, through `kyverno test`: the policy and exposure.claims_bmc_zone agree."""
    suite = tmp_path_factory.mktemp("zone")
    cases = [(route("HTTPRoute", f"r{i}", "tenant-a", [host]),
              {"route-hostnames-outside-the-bmc-domain": "fail" if exposure.claims_bmc_zone(host, DOMAIN) else "pass"})
             for i, host in enumerate(hostnames)]
    expected = _write_suite(suite, site_values(), TENANT, cases)
    assert _passed(run_tests(kyverno, suite)) >= expected


@pytest.mark.parametrize("hostname, claimed", [
    ("web1.tenant-b.bmc.example.com", True), ("bmc.example.com", True), ("*.bmc.example.com", True),
    ("*.example.com", True), ("*.com", True), ("*.tenant-b.bmc.example.com", True), ("BMC.EXAMPLE.COM", True),
    ("xbmc.example.com", False), ("*.xbmc.example.com", False), ("example.com", False),
    ("bmc.example.com.example.org", False), ("*.org", False),
])
def test_the_zone_rule_covers_the_domain_its_hosts_and_every_wildcard_above_it(hostname, claimed):
    assert exposure.claims_bmc_zone(hostname, DOMAIN) is claimed


def test_the_ingress_site_renders_no_gateway_api_rule():
    rendered = policies.parse(policies.render_kubernetes(load_values(None), None)["policy-route-isolation.yaml"])[0]
    assert [r["name"] for r in rendered["spec"]["rules"]] == [
        "service-externalname-not-to-a-bmc", "bmc-endpoints-only-from-the-endpoint-controllers", "endpoints-not-to-a-bmc-pod",
        "ingress-class-only-for-the-bmc-ingresses"]
    kinds = {k for r in rendered["spec"]["rules"] for a in r["match"]["any"] for k in a["resources"]["kinds"]}
    assert not any("gateway.networking" in k for k in kinds)


def test_the_ingress_rules_follow_the_controllers_prefix_and_its_class_less_ingresses(kyverno, tmp_path):
    """ingress.annotation_prefix and ingress.watch_without_class (issue 30 item 3, the Ingress world)."""
    from policies_fixtures import catch_all_ingress

    values = copy.deepcopy(load_values(None))
    values["ingress"].update(annotation_prefix="ingress.example.org", watch_without_class=True)
    snippet = {"ingress.example.org/server-snippet": "return 200;"}
    alias = {"ingress.example.org/server-alias": "*.bmc.example.com"}
    cases = [
        (catch_all_ingress("classless-hostless", "tenant-a", class_name=None, hosts=[None]), {"ingress-no-catch-all": "fail"}),
        (catch_all_ingress("classless-snippet", "tenant-a", class_name=None, hosts=["a.example.org"], annotations=snippet),
         {"ingress-no-nginx-snippet": "fail", "ingress-no-catch-all": "pass"}),
        (catch_all_ingress("prefixed-snippet", "tenant-a", hosts=["b.example.org"], annotations=snippet),
         {"ingress-no-nginx-snippet": "fail"}),
        (catch_all_ingress("prefixed-alias", "tenant-a", hosts=["c.example.org"], annotations=alias),
         {"ingress-server-alias-in-its-own-namespace": "fail"}),
        # The default prefix is not this controller's: its annotations configure nothing here.
        (catch_all_ingress("default-prefix-snippet", "tenant-a", hosts=["d.example.org"],
                           annotations={"nginx.ingress.kubernetes.io/server-snippet": "return 200;"}),
         {"ingress-no-nginx-snippet": "pass"}),
        (catch_all_ingress("other-class", "tenant-a", class_name="traefik", hosts=[None]), {"ingress-no-catch-all": "skip"}),
    ]
    expected = _write_suite(tmp_path, validate(values), TENANT, cases, policies.POLICY_NAMES["isolation"],
                            "policy-bmc-isolation.yaml")
    assert _passed(run_tests(kyverno, tmp_path)) >= expected
    # Without watch_without_class, a class-less Ingress is not the BMC class's.
    values["ingress"]["watch_without_class"] = False
    plain = tmp_path / "plain"
    plain.mkdir()
    classless = [(catch_all_ingress("classless-hostless", "tenant-a", class_name=None, hosts=[None]),
                  {"ingress-no-catch-all": "skip"})]
    expected = _write_suite(plain, validate(values), TENANT, classless, policies.POLICY_NAMES["isolation"],
                            "policy-bmc-isolation.yaml")
    assert _passed(run_tests(kyverno, plain)) >= expected


# Issue 41 item 5: with kubernetes.pod_cidrs, no address in the pod network from a tenant, whether
# or not a BMC pod holds it yet (BMC_POD_IP is in 10.244.0.0/16; 10.244.9.9 is held by no pod).
POD_NETWORK_CASES = [
    (endpoint_slice("seeded-abcde", "tenant-a", "seeded", ["10.244.9.9"]), "fail"),
    (endpoint_slice("held-abcde", "tenant-a", "held", [BMC_POD_IP]), "fail"),
    (endpoint_slice("zeros-abcde", "tenant-a", "zeros", ["010.244.009.009"]), "fail"),
    (endpoint_slice("mapped-abcde", "tenant-a", "mapped", ["::ffff:10.244.9.9"]), "fail"),
    (endpoint_slice("mixed-abcde", "tenant-a", "mixed", ["198.51.100.7", "10.96.0.1", "10.244.255.255"]), "fail"),
    (endpoints("seeded-endpoints", "tenant-a", ["10.244.0.1"]), "fail"),
    (endpoint_slice("outside-abcde", "tenant-a", "outside", ["10.245.0.1", "10.243.255.255", "198.51.100.7"]), "pass"),
    (endpoints("outside-endpoints", "tenant-a", ["198.51.100.9"]), "pass"),
]


def test_with_pod_cidrs_no_tenant_endpoint_names_the_pod_network(kyverno, tmp_path):
    values = copy.deepcopy(load_values(None))
    values["kubernetes"]["pod_cidrs"] = ["10.244.0.0/16"]
    rule = "endpoints-not-into-the-pod-network"
    expected = _write_suite(tmp_path, validate(values), TENANT, [(o, {rule: e}) for o, e in POD_NETWORK_CASES])
    output = run_tests(kyverno, tmp_path)
    assert _passed(output) >= expected, output
    assert "Excluded" not in output, output


def test_only_the_generated_ingresses_take_the_bmc_class(kyverno, tmp_path):
    """Issue 41: the BMC Ingress class is the generated Ingresses' alone, by class, by the older
    annotation, or (watch_without_class) by having none; another class is not the rule's."""
    from policies_fixtures import catch_all_ingress, expected_ingress

    values = validate(copy.deepcopy(load_values(None)))
    rule = "ingress-class-only-for-the-bmc-ingresses"
    tenant = [
        (catch_all_ingress("tenant-class", "tenant-a", hosts=["www.example.org"]), {rule: "fail"}),
        (catch_all_ingress("tenant-own-host", "tenant-a", hosts=[f"web1.tenant-a.{DOMAIN}"]), {rule: "fail"}),
        (catch_all_ingress("tenant-legacy", "tenant-a", class_name=None, legacy_class=BMC_CLASS, hosts=["www.example.org"]),
         {rule: "fail"}),
        (catch_all_ingress("other-class", "tenant-a", class_name="traefik", hosts=[None]), {rule: "skip"}),
        (catch_all_ingress("classless", "tenant-a", class_name=None, hosts=["www.example.org"]), {rule: "skip"}),
    ]
    generated = [(expected_ingress("web1", "tenant-a", values), {rule: "pass"})]
    expected = 0
    for name, username, cases in (("tenant", TENANT, tenant), ("background", BACKGROUND, generated)):
        (tmp_path / name).mkdir()
        expected += _write_suite(tmp_path / name, values, username, cases)
    values["ingress"]["watch_without_class"] = True
    (tmp_path / "classless").mkdir()
    expected += _write_suite(tmp_path / "classless", values, TENANT, [
        (catch_all_ingress("classless", "tenant-a", class_name=None, hosts=["www.example.org"]), {rule: "fail"})])
    output = run_tests(kyverno, tmp_path)
    assert _passed(output) >= expected, output

