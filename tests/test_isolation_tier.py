"""The gateway exposure and the route-isolation policy on the live control plane (issue 30).

Kyverno's own controllers admit and generate here, so this proves what `kyverno test` cannot: the
generated HTTPRoute and Middleware are admitted (they come from the background controller's
account), the endpoint controllers' writes are excluded, and the BMC pods' addresses come from
the apiCall. Needs the Gateway API and Traefik CRDs the control plane installs from $TRAEFIK.
"""

from __future__ import annotations

import json

import pytest

from conftest import require
from test_controlplane import (  # noqa: F401  (fixtures: bundle, site, make_namespace)
    PART_OF, SETTLE, apply, bundle, eventually, get, install, make_namespace, merged, render_bundle, site, tenant_user, vm,
)

GATEWAY_NAMESPACE, GATEWAY_NAME = "bmc-gateway", "bmc"
TENANT = ("--as", "tenant-admin", "--as-group", "system:masters")
ENDPOINT_CONTROLLER = ("--as", "system:serviceaccount:kube-system:endpointslice-controller",
                       "--as-group", "system:masters")


@pytest.fixture
def gateway_bundle(control_plane, site, bundle):
    """The gateway render (Traefik allowlist, every route kind the tier serves, Traefik's CRDs), applied and Ready."""
    require(control_plane.kubectl("get", "crd", "httproutes.gateway.networking.k8s.io", check=False).returncode == 0,
            "the control plane has no Gateway API CRDs (TRAEFIK unset: tools/build-traefik)")
    directory, values, seed = site
    gateway = merged(values, {"exposure": "gateway", "gateway": {
        "namespace": GATEWAY_NAMESPACE, "name": GATEWAY_NAME, "allowlist": "traefik", "traefik_crds": True,
        "route_kinds": ["HTTPRoute", "GRPCRoute", "TLSRoute", "TCPRoute", "XListenerSet"]}})
    rendered = render_bundle(directory, gateway, seed, name="build")
    # The switch render prints: the route rule cannot change in place.
    control_plane.kubectl("delete", "clusterpolicy", "maas-kubevirt-vm-bmc", "--wait=true")
    install(control_plane, rendered)
    yield rendered
    # Back to the default render for the next test (its bundle fixture starts the policies afresh).
    control_plane.kubectl("delete", "clusterpolicy", "-l", PART_OF, "--wait=true")


def refused(cp, obj: dict, *as_user: str) -> str:
    result = cp.kubectl(*as_user, "create", "-f", "-", input=json.dumps(obj), check=False)
    assert result.returncode != 0, f"admitted: {obj['kind']} {obj['metadata']['name']}"
    return result.stderr


def admitted(cp, obj: dict, *as_user: str) -> None:
    cp.kubectl(*as_user, "create", "-f", "-", input=json.dumps(obj))


def http_route(name: str, namespace: str, hostnames: list[str] | None) -> dict:
    spec: dict = {"parentRefs": [{"namespace": GATEWAY_NAMESPACE, "name": GATEWAY_NAME}],
                  "rules": [{"backendRefs": [{"name": "web", "port": 80}]}]}
    if hostnames is not None:
        spec["hostnames"] = hostnames
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def slice_of(name: str, namespace: str, service: str, address: str) -> dict:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"name": name, "namespace": namespace, "labels": {"kubernetes.io/service-name": service}},
            "endpoints": [{"addresses": [address]}], "ports": [{"name": "http", "port": 10080, "protocol": "TCP"}]}


def bmc_pod(cp, vm_name: str, namespace: str, address: str) -> None:
    """A kubevirtBMC agent pod as the API server sees it (no kubelet here: its address is patched in)."""
    apply(cp, {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": f"{vm_name}-virtbmc-agent", "namespace": namespace,
        "labels": {"kubevirt.io/virtualmachinebmc-name": vm_name}},
        "spec": {"containers": [{"name": "virtbmc", "image": "virtbmc"}]}})
    cp.kubectl("-n", namespace, "patch", "pod", f"{vm_name}-virtbmc-agent", "--subresource", "status", "--type", "merge",
               "-p", json.dumps({"status": {"podIP": address, "podIPs": [{"ip": address}]}}))


def test_the_gateway_exposure_generates_the_route_and_deletes_it_with_the_vm(control_plane, gateway_bundle,
                                                                            make_namespace):
    """The HTTPRoute alone: the BMC proxy's entry point holds the allowlist (bmc-proxy.yaml), so no
    per-route Middleware is generated, and the proxy needs no CRD provider."""
    cp, ns = control_plane, make_namespace()
    apply(cp, vm("web1", ns))
    route = eventually(cp, lambda: get(cp, "httproute", "web1-bmc", ns), "HTTPRoute web1-bmc")
    assert route["spec"]["hostnames"] == [f"web1.{ns}.{gateway_bundle.domain}"]
    assert route["spec"]["parentRefs"][0]["name"] == GATEWAY_NAME
    assert route["spec"]["rules"][0]["backendRefs"][0]["name"] == "web1-virtbmc"
    assert "filters" not in route["spec"]["rules"][0]
    assert get(cp, "middlewares.traefik.io", "web1-bmc-allowlist", ns) is None
    assert get(cp, "ingress", "web1-bmc", ns) is None
    cp.kubectl("-n", ns, "delete", "virtualmachine", "web1", "--wait=true")
    eventually(cp, lambda: get(cp, "httproute", "web1-bmc", ns) is None, "the route goes with the VM")


def test_no_tenant_route_reaches_another_namespaces_bmc(control_plane, gateway_bundle, make_namespace):
    cp, victim, tenant = control_plane, make_namespace(), make_namespace(labelled=False)
    domain = gateway_bundle.domain
    apply(cp, vm("web1", victim))
    eventually(cp, lambda: get(cp, "httproute", "web1-bmc", victim), "the victim's HTTPRoute")
    bmc_pod(cp, "web1", victim, "198.51.100.41")
    # A route claiming the victim's host, its own namespace's by hand, or a covering wildcard.
    for name, hosts in (("claim", [f"web1.{victim}.{domain}"]), ("own", [f"web9.{tenant}.{domain}"]),
                        ("wildcard", ["*." + domain.split(".", 1)[1]])):
        assert "route-hostnames-outside-the-bmc-domain" in refused(cp, http_route(name, tenant, hosts), *TENANT)
    assert "route-no-catch-all-on-the-bmc-gateway" in refused(cp, http_route("catch-all", tenant, None), *TENANT)
    admitted(cp, http_route("app", tenant, ["app.example.org"]), *TENANT)
    # The detours around the route: an ExternalName, a selectorless Service's slice, a grant.
    assert "service-externalname-not-to-a-bmc" in refused(cp, {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "detour", "namespace": tenant},
        "spec": {"type": "ExternalName", "externalName": f"web1-virtbmc.{victim}.svc.cluster.local"}}, *TENANT)
    assert "endpoints-not-to-a-bmc-pod" in refused(cp, slice_of("detour-1", tenant, "detour", "198.51.100.41"), *TENANT)
    assert "bmc-endpoints-only-from-the-endpoint-controllers" in refused(
        cp, slice_of("web1-virtbmc-1", victim, "web1-virtbmc", "198.51.100.99"), *TENANT)
    assert "referencegrant-not-to-a-bmc" in refused(cp, {
        "apiVersion": "gateway.networking.k8s.io/v1beta1", "kind": "ReferenceGrant",
        "metadata": {"name": "to-bmc", "namespace": victim},
        "spec": {"from": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": tenant}],
                 "to": [{"group": "", "kind": "Service", "name": "web1-virtbmc"}]}}, *TENANT)
    # What the endpoint controller writes for the BMC's own Service is its business.
    admitted(cp, slice_of("web1-virtbmc-2", victim, "web1-virtbmc", "198.51.100.41"), *ENDPOINT_CONTROLLER)
    admitted(cp, slice_of("db-1", tenant, "db", "198.51.100.7"), *TENANT)


def test_a_tenant_cannot_reach_into_the_bmc_gateway(control_plane, gateway_bundle, make_namespace):
    """Issue 41, as a tenant user (not an administrator) who may write Gateway API objects and
    Traefik's in its own namespace, and Gateways in the BMC Gateway's: its own Gateway of the BMC
    class, a hostless listener on the BMC Gateway, a route with a wildcard above the domain, and an
    IngressRoute matching PathPrefix(`/redfish`) at priority 100000 are each refused."""
    cp, tenant = control_plane, make_namespace(labelled=False)
    domain, bmc_class = gateway_bundle.domain, gateway_bundle.values["gateway"]["class_name"]
    require(cp.kubectl("get", "crd", "ingressroutes.traefik.io", check=False).returncode == 0,
            "the control plane has no Traefik CRDs (TRAEFIK unset: tools/build-traefik)")
    apply(cp, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": GATEWAY_NAMESPACE}})
    listener = {"name": "tenant-a", "hostname": f"*.tenant-a.{domain}", "port": 8443, "protocol": "HTTPS",
                "tls": {"certificateRefs": [{"name": "tenant-a-bmc-tls"}]}}
    apply(cp, {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
               "metadata": {"name": GATEWAY_NAME, "namespace": GATEWAY_NAMESPACE},
               "spec": {"gatewayClassName": bmc_class, "listeners": [listener]}})
    gateway_api = {"gateway.networking.k8s.io": ["gateways", "httproutes"], "traefik.io": ["ingressroutes"]}
    as_tenant = tenant_user(cp, tenant, gateway_api)
    tenant_user(cp, GATEWAY_NAMESPACE, {"gateway.networking.k8s.io": ["gateways"]})
    hostless = {"name": "rogue", "port": 8443, "protocol": "HTTPS", "tls": {"certificateRefs": [{"name": "rogue-tls"}]}}
    # Its own Gateway of the BMC class, with a hostless listener on the BMC listener's port.
    assert "gateway-class-only-for-the-bmc-gateway" in refused(cp, {
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": {"name": "own", "namespace": tenant},
        "spec": {"gatewayClassName": bmc_class, "listeners": [hostless]}}, *as_tenant)
    # A hostless listener, or one above the domain, on the BMC Gateway.
    for extra in (hostless, {**hostless, "name": "above", "hostname": "*." + domain.split(".", 1)[1]}):
        result = cp.kubectl(*as_tenant, "-n", GATEWAY_NAMESPACE, "patch", "gateway", GATEWAY_NAME, "--type=json", "-p",
                            json.dumps([{"op": "add", "path": "/spec/listeners/-", "value": extra}]), check=False)
        assert result.returncode != 0 and "bmc-gateway-listeners-in-the-bmc-domain" in result.stderr, result.stderr
    # A route with a wildcard above the domain, on a Gateway of its own of another class.
    route = http_route("above", tenant, ["*." + domain.split(".", 1)[1]])
    route["spec"]["parentRefs"] = [{"name": "public"}]
    assert "route-hostnames-outside-the-bmc-domain" in refused(cp, route, *as_tenant)
    # Traefik's IngressRoute with no host and a priority above every BMC route.
    assert "traefik-routes-name-hosts-outside-the-bmc-domain" in refused(cp, {
        "apiVersion": "traefik.io/v1alpha1", "kind": "IngressRoute", "metadata": {"name": "redfish", "namespace": tenant},
        "spec": {"entryPoints": ["websecure"], "routes": [{
            "match": "PathPrefix(`/redfish`)", "kind": "Rule", "priority": 100000,
            "services": [{"name": "web", "port": 80}]}]}}, *as_tenant)
    # What the tenant may do: its own Gateway of another class, routes and IngressRoutes for its hosts.
    admitted(cp, {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
                  "metadata": {"name": "public", "namespace": tenant},
                  "spec": {"gatewayClassName": "traefik", "listeners": [{**hostless, "hostname": "app.example.org"}]}},
             *as_tenant)
    admitted(cp, {"apiVersion": "traefik.io/v1alpha1", "kind": "IngressRoute", "metadata": {"name": "app", "namespace": tenant},
                  "spec": {"entryPoints": ["websecure"], "routes": [{
                      "match": "Host(`app.example.org`) && PathPrefix(`/redfish`)", "kind": "Rule", "priority": 100000,
                      "services": [{"name": "web", "port": 80}]}]}}, *as_tenant)
    # Not left for the other tests: the BMC Gateway and the tenant's rights beside it.
    for kind in ("gateway", "rolebinding", "role"):
        cp.kubectl("-n", GATEWAY_NAMESPACE, "delete", kind, GATEWAY_NAME if kind == "gateway" else "tenant", check=False)


def test_with_the_ingress_exposure_the_detours_around_the_ingress_are_refused(control_plane, bundle, make_namespace):
    """The ExternalName and selectorless detours of item 3 need no Gateway API: the default render refuses them."""
    cp, victim, tenant = control_plane, make_namespace(), make_namespace(labelled=False)
    bmc_pod(cp, "web1", victim, "198.51.100.42")
    assert "service-externalname-not-to-a-bmc" in refused(cp, {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "detour", "namespace": tenant},
        "spec": {"type": "ExternalName", "externalName": "198.51.100.42"}}, *TENANT)
    assert "endpoints-not-to-a-bmc-pod" in refused(cp, {
        "apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "detour", "namespace": tenant},
        "subsets": [{"addresses": [{"ip": "198.51.100.42"}], "ports": [{"port": 10080}]}]}, *TENANT)
    assert "bmc-endpoints-only-from-the-endpoint-controllers" in refused(
        cp, slice_of("web1-virtbmc-1", victim, "web1-virtbmc", "198.51.100.98"), *TENANT)
    admitted(cp, slice_of("web1-virtbmc-2", victim, "web1-virtbmc", "198.51.100.42"), *ENDPOINT_CONTROLLER)


# Issue 41 item 5: a selectorless Service seeded with a pod-network address before any BMC pod holds
# it. endpoints-not-to-a-bmc-pod compares with the pods of the moment; with kubernetes.pod_cidrs,
# endpoints-not-into-the-pod-network refuses the address itself, from anyone but the controllers.
POD_CIDRS = ["10.244.0.0/16"]
SEEDED = "10.244.7.7"
MIRRORING_CONTROLLER = ("--as", "system:serviceaccount:kube-system:endpointslicemirroring-controller",
                        "--as-group", "system:masters")


@pytest.fixture
def pod_network_bundle(control_plane, site, bundle):
    """The default render with kubernetes.pod_cidrs set, applied and Ready."""
    directory, values, seed = site
    rendered = render_bundle(directory, merged(values, {"kubernetes": {"pod_cidrs": POD_CIDRS}}), seed,
                             name="build-pod-cidrs")
    install(control_plane, rendered)
    yield rendered
    # Back to the default render for the next test (its bundle fixture starts the policies afresh).
    control_plane.kubectl("delete", "clusterpolicy", "-l", PART_OF, "--wait=true")


def slice_in(name: str, namespace: str, service: str, addresses: list[str], family: str = "IPv4",
             labels: dict | None = None) -> dict:
    obj = slice_of(name, namespace, service, addresses[0])
    obj["addressType"] = family
    obj["endpoints"] = [{"addresses": addresses}]
    obj["metadata"]["labels"].update(labels or {})
    return obj


def test_a_selectorless_service_cannot_be_seeded_with_a_pod_network_address(control_plane, pod_network_bundle,
                                                                          make_namespace):
    cp, victim, tenant = control_plane, make_namespace(), make_namespace(labelled=False)
    rule = "endpoints-not-into-the-pod-network"
    admitted(cp, {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "seed", "namespace": tenant},
                  "spec": {"ports": [{"port": 80, "targetPort": 10080}]}}, *TENANT)
    # No pod holds the address yet: endpoints-not-to-a-bmc-pod has nothing to compare with.
    assert not [p for p in json.loads(cp.kubectl("get", "pods", "-A", "-o", "json").stdout)["items"]
                if SEEDED in [a.get("ip") for a in p.get("status", {}).get("podIPs") or []]]
    assert rule in refused(cp, slice_in("seed-1", tenant, "seed", [SEEDED]), *TENANT)
    assert rule in refused(cp, {"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "seed", "namespace": tenant},
                                "subsets": [{"notReadyAddresses": [{"ip": SEEDED}], "ports": [{"port": 10080}]}]}, *TENANT)
    # Dressed up: beside an outside address, as the controller's slice, with leading zeros, as IPv4
    # after IPv6 text, as an FQDN slice; each refused (by the policy, or by the API server itself).
    for name, addresses, family, labels in (
            ("seed-2", ["198.51.100.7", SEEDED], "IPv4", None),
            ("seed-3", [SEEDED], "IPv4", {"endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}),
            ("seed-4", ["010.244.007.007"], "IPv4", None),
            ("seed-5", ["::ffff:10.244.7.7"], "IPv6", None),
            ("seed-6", ["::ffff:af4:707"], "IPv6", None),
            ("seed-7", [SEEDED], "FQDN", None)):
        refused(cp, slice_in(name, tenant, "seed", addresses, family, labels), *TENANT)
    # An update that moves an admitted slice into the pod network is refused the same way.
    admitted(cp, slice_in("seed-8", tenant, "seed", ["198.51.100.7"]), *TENANT)
    moved = cp.kubectl(*TENANT, "-n", tenant, "patch", "endpointslice", "seed-8", "--type", "json", "-p",
                       json.dumps([{"op": "replace", "path": "/endpoints/0/addresses/0", "value": SEEDED}]), check=False)
    assert moved.returncode != 0 and rule in moved.stderr, moved.stderr
    # The BMC pod takes the address later: nothing of the tenant's leads there.
    bmc_pod(cp, "web1", victim, SEEDED)
    slices = json.loads(cp.kubectl("get", "endpointslices", "-n", tenant, "-o", "json").stdout)["items"]
    assert [s["metadata"]["name"] for s in slices] == ["seed-8"]
    assert all(a != SEEDED for s in slices for e in s.get("endpoints") or [] for a in e["addresses"])
    assert get(cp, "endpoints", "seed", tenant) is None
    # The endpoint controllers' slices and mirrors still work, for pod addresses too.
    admitted(cp, slice_in("web1-virtbmc-1", victim, "web1-virtbmc", [SEEDED]), *ENDPOINT_CONTROLLER)
    admitted(cp, slice_in("app-1", tenant, "app", ["10.244.9.9"]), *ENDPOINT_CONTROLLER)
    admitted(cp, slice_in("mirror-1", tenant, "external", ["10.244.9.10"]), *MIRRORING_CONTROLLER)
    # Outside the pod network a tenant's selectorless Service is its own business.
    admitted(cp, slice_in("db-1", tenant, "db", ["10.245.0.7", "198.51.100.8"]), *TENANT)
