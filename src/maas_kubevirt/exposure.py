"""How each VM's BMC host is published: an Ingress, or a Gateway API HTTPRoute and its allowlist.

The exposure is a choice of renderer (templates/exposure/<exposure>.j2, included by the BMC
policy); this module holds what the templates, render, doctor and the tests share about it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from maas_kubevirt import bmc_proxy

# Each VM's route (Ingress or HTTPRoute) is <vm>-bmc, and its gateway allowlist object (an Envoy
# Gateway SecurityPolicy) <vm>-bmc-allowlist, both in the VM's namespace.
ROUTE_SUFFIX = "-bmc"
ROUTE_ALLOWLIST_SUFFIX = "-bmc-allowlist"
# The BMC policy's rule that generates the route, by exposure.
ROUTE_RULES = {"ingress": "bmc-ingress", "gateway": "bmc-httproute"}
GATEWAY_API_GROUP = "gateway.networking.k8s.io"
# gateway.allowlist -> (apiGroup, resource, kind, apiVersion) of the per-VM allowlist object:
# Envoy Gateway's api/v1alpha1 SecurityPolicy (spec.authorization.rules[].principal.clientCIDRs),
# attached by its targetRefs. With traefik, the BMC proxy's entry point holds the allowlist.
GATEWAY_ALLOWLIST_KINDS = {
    "envoy-gateway": ("gateway.envoyproxy.io", "securitypolicies", "SecurityPolicy", "gateway.envoyproxy.io/v1alpha1"),
}
_ROUTE_DESCRIPTIONS = {
    "traefik": "a Gateway API HTTPRoute on Gateway {gateway}, served by the BMC proxy",
    "envoy-gateway": "a Gateway API HTTPRoute on Gateway {gateway} with an Envoy Gateway SecurityPolicy",
    "external": "a Gateway API HTTPRoute on Gateway {gateway} (the allowlist enforced in front of it)",
}


def gateway_ref(values: dict) -> str:
    """namespace/name of the site's Gateway."""
    return f"{values['gateway']['namespace']}/{values['gateway']['name']}"


def route_objects(values: dict) -> list[tuple[str, str, str]]:
    """(apiVersion, kind, name suffix) of what the BMC policy generates per VM to publish its BMC."""
    if values["exposure"] == "ingress":
        return [("networking.k8s.io/v1", "Ingress", ROUTE_SUFFIX)]
    allowlist = GATEWAY_ALLOWLIST_KINDS.get(values["gateway"]["allowlist"])
    extra = [(allowlist[3], allowlist[2], ROUTE_ALLOWLIST_SUFFIX)] if allowlist else []
    return extra + [(f"{GATEWAY_API_GROUP}/v1", "HTTPRoute", ROUTE_SUFFIX)]


def allowlist_mechanism(values: dict) -> str:
    """One sentence: what enforces ingress.source_ranges for this exposure (doctor and render say it)."""
    ranges = ", ".join(values["ingress"]["source_ranges"])
    if values["exposure"] == "gateway":
        allowlist = values["gateway"]["allowlist"]
        if allowlist == "traefik":
            return f"the BMC proxy's entry point ({bmc_proxy.FILE}: {bmc_proxy.entry_point_middleware()}, {ranges})"
        if allowlist == "envoy-gateway":
            return f"an Envoy Gateway SecurityPolicy <vm>{ROUTE_ALLOWLIST_SUFFIX} on each HTTPRoute ({ranges})"
        return (f"nothing maas-kubevirt renders: gateway.allowlist is external, so whatever is in front of "
                f"Gateway {gateway_ref(values)} must admit only {ranges}")
    if values["ingress"]["allowlist"] == "traefik":
        return f"the BMC proxy's entry point ({bmc_proxy.FILE}: {bmc_proxy.entry_point_middleware()}, {ranges})"
    annotation = values["ingress"]["allowlist_annotation"] or "nginx.ingress.kubernetes.io/allowlist-source-range"
    return f"the annotation {annotation} on each Ingress, read by the controller of class {values['ingress']['class_name']} ({ranges})"


def exposure_context(values: dict) -> dict[str, Any]:
    """What the templates need to know of the exposure: descriptions, extra files and RBAC."""
    if values["exposure"] == "gateway":
        description = _ROUTE_DESCRIPTIONS[values["gateway"]["allowlist"]].format(gateway=gateway_ref(values))
        allowlist = GATEWAY_ALLOWLIST_KINDS.get(values["gateway"]["allowlist"])
        generated = [(GATEWAY_API_GROUP, "httproutes")] + ([allowlist[:2]] if allowlist else [])
    else:
        description = "an Ingress"
        generated = [("networking.k8s.io", "ingresses")]
    return {
        "route_description": description,
        "route_suffix": ROUTE_SUFFIX,
        "route_allowlist_suffix": ROUTE_ALLOWLIST_SUFFIX,
        "generated_route_rbac": generated,
        "exposure_files": [bmc_proxy.FILE] if bmc_proxy.rendered(values) else [],
        **bmc_proxy.context(values),
    }


def rendered_exposure(policy: dict | None) -> str | None:
    """The exposure a rendered BMC policy publishes with (by its route rule), None if unknown."""
    names = {rule.get("name") for rule in (policy or {}).get("spec", {}).get("rules", [])}
    found = [exposure for exposure, rule in ROUTE_RULES.items() if rule in names]
    return found[0] if len(found) == 1 else None


def switch_procedure(previous: str, values: dict, kustomize_dir: str | Path, policy: str, prog: str) -> str:
    """What render prints when the exposure changed since the last render: a switch that keeps every BMC reachable."""
    domain = values["redfish"]["domain"]
    if values["exposure"] == "gateway":
        old, new = "Ingresses", "HTTPRoutes"
        ready = (f"Gateway {gateway_ref(values)} is Programmed, with an HTTPS listener for *.<ns>.{domain} (a "
                 "certificate per opted-in namespace) whose allowedRoutes admit the opted-in namespaces")
        delete_old = "kubectl delete ingress --all-namespaces -l app.kubernetes.io/part-of=maas-kubevirt"
    else:
        old, new = "HTTPRoutes", "Ingresses"
        ready = f"the Ingress controller of class {values['ingress']['class_name']} serves *.<ns>.{domain} with TLS"
        delete_old = "kubectl delete httproute --all-namespaces -l app.kubernetes.io/part-of=maas-kubevirt"
    return "\n".join([
        f"The exposure changed from {previous} to {values['exposure']}: every VM's BMC moves from its {old} to "
        f"{new}. To keep every BMC reachable, in this order:",
        f"  1. Check that {ready}.",
        f"  2. kubectl delete clusterpolicy {policy}",
        f"     (the {old}, Secrets and VirtualMachineBMCs stay: orphanDownstreamOnPolicyDelete)",
        f"  3. kubectl apply -k {kustomize_dir}",
        f"     (the new policy generates the {new} of every VM: generateExisting)",
        f"  4. {prog} doctor   (every route accepted, the allowlist attached)",
        f"  5. Point the DNS records *.<ns>.{domain} at the new proxy, and wait out their TTL.",
        f"  6. {delete_old}",
    ])


# Where each Gateway API kind lives (group/version/kind as Kyverno matches it: any version) and
# whether it carries spec.hostnames. ListenerSets carry them per listener.
ROUTE_KIND_MATCH = {
    "HTTPRoute": (f"{GATEWAY_API_GROUP}/*/HTTPRoute", True),
    "GRPCRoute": (f"{GATEWAY_API_GROUP}/*/GRPCRoute", True),
    "TLSRoute": (f"{GATEWAY_API_GROUP}/*/TLSRoute", True),
    "TCPRoute": (f"{GATEWAY_API_GROUP}/*/TCPRoute", False),
    "UDPRoute": (f"{GATEWAY_API_GROUP}/*/UDPRoute", False),
    "XListenerSet": ("gateway.networking.x-k8s.io/*/XListenerSet", None),
    "ListenerSet": (f"{GATEWAY_API_GROUP}/*/ListenerSet", None),
}


def isolated_route_kinds(values: dict) -> list[str]:
    """The Gateway API kinds the route-isolation policy covers (gateway.route_kinds, or its default)."""
    kinds = values["gateway"]["route_kinds"]
    if kinds:
        return [kind for kind in ROUTE_KIND_MATCH if kind in kinds]
    return ["HTTPRoute", "GRPCRoute"] if values["exposure"] == "gateway" else []


def hostname_matches(listener: str | None, host: str) -> bool:
    """Whether a Gateway API listener or route hostname admits one host: none admits every host,
    ``*.<suffix>`` a host of one or more labels before ``.<suffix>``, any other only itself."""
    if not listener:
        return True
    listener, host = listener.lower(), host.lower()
    if listener.startswith("*."):
        suffix = listener[1:]
        return host.endswith(suffix) and len(host) > len(suffix) and not host[:-len(suffix)].endswith(".")
    return listener == host


def hostname_covers(listener: str | None, suffix: str) -> bool:
    """Whether a hostname admits every host ``<label>.<suffix>``: none, or a wildcard that admits one."""
    return not listener or (listener.startswith("*.") and hostname_matches(listener, f"x.{suffix}"))


def claims_bmc_zone(hostname: str, domain: str) -> bool:
    """True when a route or listener hostname would serve a BMC host <vm>.<ns>.<domain>.

    A hostname at or under the domain does, and so does a wildcard above it ('*.example.com'
    covers bmc.example.com's hosts); the route-isolation policy computes the same in JMESPath.
    """
    host, domain = hostname.lower(), domain.lower()
    return host == domain or host.endswith("." + domain) or (host.startswith("*.") and hostname_covers(host, domain))
