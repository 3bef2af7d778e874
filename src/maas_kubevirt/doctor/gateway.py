"""doctor's exposure rows: what publishes each BMC host and what holds it to ``ingress.source_ranges``.

With ``exposure: gateway`` (four rows): the site's Gateway is Programmed with an HTTPS listener
for every opted-in namespace (``gateway.programmed``), that listener admits the opted-in
namespaces' routes and says which others it admits (``gateway.allowed_routes``), each generated
HTTPRoute is Accepted with ResolvedRefs by that Gateway (``gateway.routes``), and each route's
allowlist holds the source ranges (``gateway.allowlist``: the BMC proxy's entry point with
``traefik``, each route's SecurityPolicy with ``envoy-gateway``). With ``exposure: ingress``: which
mechanism enforces the source ranges (``ingress.allowlist``).

Each check is a pure function over what the API server answers (dicts, as kube.Cluster returns
them); :func:`exposure_checks` gathers those answers, read-only, for doctor's cluster section.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from maas_kubevirt import bmc_proxy, exposure, policies
from maas_kubevirt.doctor import FAIL, OK, SKIP, WARN, Check, _clean, _networks, _some
from maas_kubevirt.doctor.inventory import Inventory, _listed_or_none, _selects
from maas_kubevirt.exposure import hostname_covers, hostname_matches  # noqa: F401 (doctor re-exports both)

if TYPE_CHECKING:
    from maas_kubevirt.doctor import _Fixes

GATEWAY_CHECKS = ("gateway.programmed", "gateway.allowed_routes", "gateway.routes", "gateway.allowlist")
INGRESS_CHECKS = ("ingress.allowlist",)
GROUP = exposure.GATEWAY_API_GROUP
GATEWAY_CRD = f"gateways.{GROUP}"
# gateway.allowlist -> the CRD of its per-route object (none for external).
ALLOWLIST_CRDS = {mode: f"{kind[1]}.{kind[0]}" for mode, kind in exposure.GATEWAY_ALLOWLIST_KINDS.items()}
LISTENER_CONDITIONS = ("Accepted", "Programmed", "ResolvedRefs")


def check_names(values: Mapping[str, Any]) -> tuple[str, ...]:
    """The exposure rows doctor makes for these values."""
    return GATEWAY_CHECKS if values["exposure"] == "gateway" else INGRESS_CHECKS


# --- reading the Gateway ------------------------------------------------------------------------


def _condition(conditions: Iterable[Mapping[str, Any]] | None, kind: str) -> tuple[str | None, str]:
    """(status, "Reason: message") of one condition; (None, "") when it is not set."""
    for condition in conditions or []:
        if isinstance(condition, Mapping) and condition.get("type") == kind:
            why = ": ".join(_clean(part) for part in (condition.get("reason"), condition.get("message")) if part)
            return str(condition.get("status")), why
    return None, ""


def _listeners(gateway: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [item for item in (gateway.get("spec") or {}).get("listeners") or [] if isinstance(item, Mapping)]


def _listener_problem(gateway: Mapping[str, Any], listener: Mapping[str, Any]) -> str | None:
    """A listener condition the Gateway's controller set to False (an invalid certificate ref, a
    port it cannot serve, ...), or None."""
    for status in (gateway.get("status") or {}).get("listeners") or []:
        if isinstance(status, Mapping) and status.get("name") == listener.get("name"):
            false = []
            for kind in LISTENER_CONDITIONS:
                state, why = _condition(status.get("conditions"), kind)
                if state == "False":
                    false.append(f"{kind} False" + (f" ({why})" if why else ""))
            return "; ".join(false) or None
    return None


def _candidates(gateway: Mapping[str, Any], section: str) -> list[Mapping[str, Any]]:
    """The listeners the routes may attach to: the one gateway.section_name names, or all."""
    listeners = _listeners(gateway)
    return [item for item in listeners if item.get("name") == section] if section else listeners


def covering_listeners(gateway: Mapping[str, Any], section: str, namespace: str, domain: str) -> list[Mapping[str, Any]]:
    """The HTTPS listeners (of gateway.section_name, if set) that serve every ``<vm>.<namespace>.<domain>``."""
    return [item for item in _candidates(gateway, section)
            if str(item.get("protocol") or "") == "HTTPS"
            and hostname_covers(item.get("hostname"), f"{namespace}.{domain}")]


def _listener_names(listeners: Iterable[Mapping[str, Any]]) -> str:
    return ", ".join(sorted({_clean(item.get("name") or "?") for item in listeners}))


def programmed_check(gateway: Mapping[str, Any] | None, crd_installed: bool, where: str, section: str,
                     namespaces: Sequence[str], domain: str) -> Check:
    """The site's Gateway exists and is Programmed, and for each opted-in namespace an HTTPS
    listener (of gateway.section_name, if set) whose hostname covers ``*.<ns>.<domain>``, with no
    listener condition False.

    where: namespace/name of the Gateway; namespaces: the opted-in namespaces.
    """
    name = "gateway.programmed"
    ns, gw = where.split("/", 1)
    if gateway is None:
        if not crd_installed:
            return Check(name, FAIL, f"the Gateway API CRDs are not installed (no {GATEWAY_CRD}): "
                         "no HTTPRoute can serve a BMC",
                         "install Gateway API's standard-channel CRDs (sigs.k8s.io/gateway-api) and an implementation "
                         f"(docs/how-to/gateway.md), then create Gateway {where}")
        return Check(name, FAIL, f"Gateway {where} does not exist: no HTTPRoute can serve a BMC",
                     f"create Gateway {where} with an HTTPS listener for *.{domain} (or one for *.<ns>.{domain} per "
                     "opted-in namespace), or set gateway.namespace and gateway.name to the site's Gateway and "
                     "re-render", (where,))
    state, why = _condition((gateway.get("status") or {}).get("conditions"), "Programmed")
    if state != "True":
        said = f"Programmed {state}" if state else "no Programmed condition"
        return Check(name, FAIL, f"Gateway {where} is not Programmed ({said}{': ' + why if why else ''})",
                     f"`kubectl -n {ns} describe gateway {gw}` says why; the controller of its GatewayClass must "
                     "accept and program it", (where,))
    listeners = _listeners(gateway)
    if section and not _candidates(gateway, section):
        return Check(name, FAIL, f"Gateway {where} has no listener {_clean(section)} (gateway.section_name); it has: "
                     f"{_listener_names(listeners) or 'none'}",
                     "set gateway.section_name to the HTTPS listener that serves the BMC hosts (or empty: any "
                     f"listener that covers them) and re-render, or add listener {_clean(section)} to Gateway {where}",
                     (where,))
    scope = f"listener {_clean(section)}" if section else "listener"
    problems: list[str] = []
    served: set[str] = set()
    for namespace in namespaces:
        covering = covering_listeners(gateway, section, namespace, domain)
        if not covering:
            plain = [item for item in _candidates(gateway, section)
                     if hostname_covers(item.get("hostname"), f"{namespace}.{domain}")]
            problems.append(f"{namespace} (no HTTPS {scope} for *.{namespace}.{domain}"
                            + (f"; {_listener_names(plain)} is {_clean(plain[0].get('protocol'))}" if plain else "") + ")")
            continue
        broken = [(item, _listener_problem(gateway, item)) for item in covering]
        working = [item for item, problem in broken if problem is None]
        if not working:
            problems.append(f"{namespace} (listener {_clean(broken[0][0].get('name'))}: {broken[0][1]})")
            continue
        served.update(_clean(item.get("name") or "?") for item in working)
    if problems:
        return Check(name, FAIL, f"Gateway {where} is Programmed, but serves no BMC host of: {_some(problems)}",
                     f"give Gateway {where} (`kubectl -n {ns} edit gateway {gw}`) an HTTPS listener with hostname "
                     f"*.<ns>.{domain} for each namespace named (or one *.{domain}), whose tls.certificateRefs hold a "
                     f"certificate for *.<ns>.{domain} (a *.{domain} certificate does not cover <vm>.<ns>.{domain})"
                     + (f"; the routes attach to listener {_clean(section)} only (gateway.section_name)" if section else ""),
                     tuple(problem.split(" ", 1)[0] for problem in problems))
    if not namespaces:
        return Check(name, OK, f"Gateway {where} is Programmed; no namespace is opted in yet")
    return Check(name, OK, f"Gateway {where} is Programmed; HTTPS listener {', '.join(sorted(served))} serves "
                 f"*.<ns>.{domain} for each of {len(namespaces)} opted-in namespace(s)")


# --- which namespaces a listener admits ------------------------------------------------------------


def _admits_httproutes(listener: Mapping[str, Any]) -> bool:
    kinds = (listener.get("allowedRoutes") or {}).get("kinds")
    if not kinds:                                  # the protocol's default: HTTPRoute for HTTPS
        return True
    return any(isinstance(k, Mapping) and k.get("kind") == "HTTPRoute" and (k.get("group") or GROUP) == GROUP
               for k in kinds)


def admits(listener: Mapping[str, Any], namespace: str, labels: Mapping[str, str], gateway_namespace: str) -> bool:
    """Whether the listener's allowedRoutes admit an HTTPRoute of this namespace (from Same, the
    default; All; or Selector, evaluated against the namespace's labels)."""
    if not _admits_httproutes(listener):
        return False
    namespaces = (listener.get("allowedRoutes") or {}).get("namespaces") or {}
    origin = namespaces.get("from") or "Same"
    if origin == "All":
        return True
    if origin == "Selector":
        selector = namespaces.get("selector")
        return isinstance(selector, Mapping) and _selects(selector, labels)
    return origin == "Same" and namespace == gateway_namespace


def _from_text(listener: Mapping[str, Any]) -> str:
    namespaces = (listener.get("allowedRoutes") or {}).get("namespaces") or {}
    origin = _clean(namespaces.get("from") or "Same")
    if origin != "Selector":
        return f"from: {origin}"
    selector = namespaces.get("selector") or {}
    parts = [f"{_clean(k)}={_clean(v)}" for k, v in (selector.get("matchLabels") or {}).items()]
    parts += [f"{_clean(e.get('key'))} {_clean(e.get('operator'))}" + (f" ({', '.join(map(_clean, e.get('values') or []))})"
              if e.get("values") else "") for e in selector.get("matchExpressions") or [] if isinstance(e, Mapping)]
    return f"from: Selector {', '.join(parts) or '(empty: every namespace)'}"


def allowed_routes_check(gateway: Mapping[str, Any] | None, where: str, section: str,
                         opted_in: Sequence[Mapping[str, Any]], every_namespace: Sequence[Mapping[str, Any]] | None,
                         domain: str, opt_in: str) -> Check:
    """The listeners serving the opted-in namespaces admit their HTTPRoutes (fail otherwise), and
    no other namespace's (a warning naming those others).

    opted_in: the opted-in Namespace objects; every_namespace: every Namespace of the cluster,
    None when they may not be listed. opt_in: the opt-in label as key=value, for the fix.
    """
    name = "gateway.allowed_routes"
    if gateway is None:
        return Check(name, SKIP, f"no Gateway {where} (gateway.programmed)")
    ns, gw = where.split("/", 1)
    key, _, value = opt_in.partition("=")
    fix = (f"set allowedRoutes of the BMC listener of Gateway {where} (`kubectl -n {ns} edit gateway {gw}`) to "
           f"`namespaces: {{from: Selector, selector: {{matchLabels: {{{key}: {value}}}}}}}`, kinds HTTPRoute: it then "
           "admits exactly the opted-in namespaces")
    labels = {str(n["metadata"]["name"]): n["metadata"].get("labels") or {} for n in opted_in}
    listeners: dict[str, Mapping[str, Any]] = {}
    refused, uncovered = [], []
    for namespace in sorted(labels):
        covering = covering_listeners(gateway, section, namespace, domain)
        if not covering:
            uncovered.append(namespace)
            continue
        listeners.update((str(item.get("name")), item) for item in covering)
        if not any(admits(item, namespace, labels[namespace], ns) for item in covering):
            refused.append(namespace)
    if not labels:
        return Check(name, OK, "no namespace is opted in yet")
    if not listeners:
        return Check(name, SKIP, f"no HTTPS listener of Gateway {where} serves the opted-in namespaces (gateway.programmed)")
    how = "; ".join(f"listener {_clean(n)}: {_from_text(item)}" for n, item in sorted(listeners.items()))
    note = f" ({len(uncovered)} namespace(s) without a listener: gateway.programmed)" if uncovered else ""
    if every_namespace is None:
        # from: Same admits the Gateway's own namespace alone, known without listing any.
        same = all(_from_text(item) == "from: Same" for item in listeners.values())
        others: list[str] | None = ([ns] if ns not in labels else []) if same else None
    else:
        everyone = {str(n["metadata"]["name"]): n["metadata"].get("labels") or {} for n in every_namespace}
        others = sorted(n for n, l in everyone.items() if n not in labels
                        and any(admits(item, n, l, ns) for item in listeners.values()))
    if refused:
        return Check(name, FAIL, f"{how}: the HTTPRoutes of {len(refused)} opted-in namespace(s) are not admitted "
                     f"(their BMCs are not served): {_some(refused)}{note}", fix, tuple(refused))
    if others is None:
        return Check(name, WARN, f"{how}: admits every opted-in namespace; which others it admits is not known "
                     f"(the namespaces may not be listed){note}",
                     "run doctor with a kubeconfig that may list namespaces, or " + fix)
    if others:
        return Check(name, WARN, f"{how}: admits the {len(labels)} opted-in namespace(s) and {len(others)} other(s), "
                     f"whose routes share the BMC listener (the isolation policy refuses their hosts under {domain}): "
                     f"{_some(others)}{note}", fix, tuple(others))
    return Check(name, OK, f"{how}: admits exactly the {len(labels)} opted-in namespace(s){note}")


# --- the generated routes ---------------------------------------------------------------------------


def expected_routes(inventories: Iterable[Inventory]) -> list[tuple[str, str]]:
    """(namespace, VM) of every VM with a VirtualMachineBMC: each has a generated route."""
    return sorted((inventory.namespace, str(vm["metadata"]["name"])) for inventory in inventories
                  for vm in inventory.vms if str(vm["metadata"]["name"]) in inventory.bmcs)


def _by_name(items: Iterable[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    return {str((item.get("metadata") or {}).get("name")): item for item in items}


def _is_our_parent(ref: Mapping[str, Any], route_namespace: str, where: str, section: str) -> bool:
    ns, gw = where.split("/", 1)
    return (ref.get("name") == gw and (ref.get("namespace") or route_namespace) == ns
            and (ref.get("group") or GROUP) == GROUP and (ref.get("kind") or "Gateway") == "Gateway"
            and (not section or ref.get("sectionName") == section))


def route_problem(route: Mapping[str, Any] | None, route_namespace: str, where: str, section: str) -> str | None:
    """Why one generated HTTPRoute serves no BMC, from its status.parents entry for our Gateway; None when
    that entry has Accepted=True and ResolvedRefs=True."""
    if route is None:
        return "missing"
    parents = [p for p in (route.get("status") or {}).get("parents") or []
               if isinstance(p, Mapping) and isinstance(p.get("parentRef"), Mapping)
               and _is_our_parent(p["parentRef"], route_namespace, where, section)]
    if not parents:
        return f"no status from Gateway {where}: not attached"
    problems = []
    for parent in parents:
        problems = []
        for kind in ("Accepted", "ResolvedRefs"):
            state, why = _condition(parent.get("conditions"), kind)
            if state != "True":
                problems.append(f"{kind} {state or 'unset'}" + (f": {why}" if why else ""))
        if not problems:
            return None
    return "; ".join(problems)


def routes_check(expected: Sequence[tuple[str, str]], routes: Mapping[str, Iterable[Mapping[str, Any]]], where: str,
                 section: str, apply: str) -> Check:
    """Each generated HTTPRoute <vm>-bmc exists and is Accepted with ResolvedRefs by our Gateway.

    expected: (namespace, VM) pairs; routes: namespace -> its HTTPRoutes.
    """
    name = "gateway.routes"
    if not expected:
        return Check(name, OK, "no VM with a VirtualMachineBMC yet")
    by_namespace = {namespace: _by_name(items) for namespace, items in routes.items()}
    broken = []
    for namespace, vm in expected:
        route = f"{vm}{exposure.ROUTE_SUFFIX}"
        problem = route_problem(by_namespace.get(namespace, {}).get(route), namespace, where, section)
        if problem:
            broken.append((f"{namespace}/{route}", problem))
    if not broken:
        return Check(name, OK, f"{len(expected)} HTTPRoute(s) <vm>{exposure.ROUTE_SUFFIX}, each Accepted with "
                     f"ResolvedRefs by Gateway {where}")
    fix = (f"missing: `kubectl get clusterpolicy {policies.POLICY_NAMES['bmc']}` must be Ready (Kyverno generates each "
           f"route), then {apply}; not Accepted: `kubectl -n NAMESPACE describe httproute NAME` (NotAllowedByListeners: "
           "gateway.allowed_routes; NoMatchingListenerHostname: gateway.programmed); ResolvedRefs False: BackendNotFound "
           f"is the <vm>-virtbmc Service kubevirtBMC makes, an unresolved ExtensionRef is gateway.allowlist")
    return Check(name, FAIL, f"{len(broken)} of {len(expected)} HTTPRoute(s) serve no BMC: "
                 + _some([f"{route} ({problem})" for route, problem in broken]), fix,
                 tuple(route for route, _ in broken))


# --- the allowlist -------------------------------------------------------------------------------------


def _targets(policy: Mapping[str, Any], route: str) -> bool:
    spec = policy.get("spec") or {}
    refs = list(spec.get("targetRefs") or []) + ([spec["targetRef"]] if isinstance(spec.get("targetRef"), Mapping) else [])
    return any(isinstance(r, Mapping) and r.get("group") == GROUP and r.get("kind") == "HTTPRoute"
               and r.get("name") == route for r in refs)


def _security_policy_problem(policy: Mapping[str, Any] | None, route: str, namespace: str, where: str,
                             ranges: set[str]) -> str | None:
    """Why an Envoy Gateway SecurityPolicy does not hold the rendered allowlist on the route, or None."""
    if policy is None:
        return "no SecurityPolicy"
    if not _targets(policy, route):
        return f"its SecurityPolicy does not target HTTPRoute {route}"
    authorization = (policy.get("spec") or {}).get("authorization") or {}
    if authorization.get("defaultAction") != "Deny":
        return "its SecurityPolicy's defaultAction is not Deny"
    allowed = set()
    for rule in authorization.get("rules") or []:
        if isinstance(rule, Mapping) and rule.get("action") == "Allow":
            allowed |= _networks((rule.get("principal") or {}).get("clientCIDRs"))
    if allowed != ranges:
        return f"its SecurityPolicy allows {', '.join(sorted(allowed)) or 'no clientCIDRs'}"
    ns, gw = where.split("/", 1)
    for ancestor in (policy.get("status") or {}).get("ancestors") or []:
        ref = (ancestor or {}).get("ancestorRef") or {}
        if ref.get("name") == gw and (ref.get("namespace") or namespace) == ns:
            state, why = _condition(ancestor.get("conditions"), "Accepted")
            return None if state == "True" else f"its SecurityPolicy is not Accepted ({state or 'unset'}{': ' + why if why else ''})"
    return f"its SecurityPolicy has no status from Gateway {where}: not attached"


def _mechanism(shown: str) -> str:
    return f"its Envoy Gateway SecurityPolicy <vm>{exposure.ROUTE_ALLOWLIST_SUFFIX} (Deny, but {shown}), Accepted"


def allowlist_check(mode: str, expected: Sequence[tuple[str, str]], routes: Mapping[str, Iterable[Mapping[str, Any]]],
                    objects: Mapping[str, Iterable[Mapping[str, Any]]], source_ranges: Sequence[str], where: str,
                    crd_installed: bool, apply: str) -> Check:
    """gateway.allowlist: envoy-gateway, each route's SecurityPolicy targets it, denies by default,
    allows exactly the source ranges and is Accepted; external, a warning every run (traefik: the
    BMC proxy's row, doctor/bmc_proxy.py).

    objects: namespace -> its SecurityPolicies.
    """
    name = "gateway.allowlist"
    shown = ", ".join(source_ranges)
    if mode == "traefik":
        return Check(name, OK, f"the BMC proxy's entry point holds every route to {shown} (proxy.allowlist checks it)")
    if mode == "external":
        return Check(name, WARN, f"the allowlist is enforced outside maas-kubevirt (gateway.allowlist: external): "
                     f"whatever is in front of Gateway {where} must admit only {shown}; doctor cannot check it",
                     f"make sure the proxy or firewall in front of Gateway {where} admits only ingress.source_ranges, "
                     "or set gateway.allowlist to traefik or envoy-gateway to have maas-kubevirt render it")
    kind = exposure.GATEWAY_ALLOWLIST_KINDS[mode][2]
    crd = ALLOWLIST_CRDS[mode]
    if not crd_installed:
        return Check(name, FAIL, f"the {kind} CRD ({crd}) is not installed: no route has its allowlist",
                     "install Envoy Gateway with its CRDs, or set gateway.allowlist to the implementation that serves "
                     "Gateway " + where)
    if not expected:
        return Check(name, OK, f"no VM with a VirtualMachineBMC yet; each route will get {_mechanism(shown)}")
    ranges = _networks(list(source_ranges))
    found = {namespace: _by_name(items) for namespace, items in objects.items()}
    broken = []
    for namespace, vm in expected:
        route, allow = f"{vm}{exposure.ROUTE_SUFFIX}", f"{vm}{exposure.ROUTE_ALLOWLIST_SUFFIX}"
        problem = _security_policy_problem(found.get(namespace, {}).get(allow), route, namespace, where, ranges)
        if problem:
            broken.append((f"{namespace}/{allow}", problem))
    if not broken:
        return Check(name, OK, f"{len(expected)} route(s), each with {_mechanism(shown)}")
    plural = "securitypolicy"
    return Check(name, FAIL, f"{len(broken)} of {len(expected)} route(s) without their {kind} allowlist ({shown}): "
                 + _some([f"{allow} ({problem})" for allow, problem in broken]),
                 f"Kyverno generates and re-syncs each {kind}: `kubectl -n NAMESPACE delete {plural} NAME` to have it "
                 f"regenerated; `kubectl get clusterpolicy {policies.POLICY_NAMES['bmc']}` must be Ready; then {apply}",
                 tuple(allow for allow, _ in broken))


def ingress_allowlist_check(values: Mapping[str, Any]) -> Check:
    """Which mechanism enforces ingress.source_ranges: the annotation (cluster.ingress_allowlist compares
    it on each Ingress), or the BMC proxy's entry point (proxy.allowlist checks it)."""
    checked = "proxy.allowlist" if bmc_proxy.rendered(dict(values)) else "cluster.ingress_allowlist compares it on each BMC Ingress"
    return Check("ingress.allowlist", OK, f"enforced by {exposure.allowlist_mechanism(dict(values))}; {checked}")


# --- gathering -----------------------------------------------------------------------------------------


def exposure_checks(values: Mapping[str, Any], cluster: Any, opted_in: Sequence[Mapping[str, Any]],
                    inventories: Sequence[Inventory], fixes: _Fixes) -> list[Check]:
    """The exposure rows, from read-only requests; a KubeError other than 403 propagates (cluster.api)."""
    if values["exposure"] != "gateway":
        return [ingress_allowlist_check(values)]
    settings, domain = values["gateway"], values["redfish"]["domain"]
    where, section, mode = exposure.gateway_ref(dict(values)), settings["section_name"], settings["allowlist"]
    gateway = cluster.gateway(settings["namespace"], settings["name"])
    gateway_crd = gateway is not None or cluster.crd(GATEWAY_CRD) is not None
    names = [str(n["metadata"]["name"]) for n in opted_in]
    every_namespace = _listed_or_none(cluster.namespaces) if gateway is not None else None
    expected = expected_routes(inventories)
    namespaces = sorted({namespace for namespace, _ in expected})
    routes = {namespace: cluster.httproutes(namespace) for namespace in namespaces}
    checks = [
        programmed_check(gateway, gateway_crd, where, section, sorted(names), domain),
        allowed_routes_check(gateway, where, section, opted_in, every_namespace, domain,
                             f"{values['kubernetes']['opt_in_label']}={values['kubernetes']['opt_in_value']}"),
        routes_check(expected, routes, where, section, fixes.apply),
    ]
    objects: dict[str, list[dict]] = {}
    allowlist_crd = True
    if mode in ALLOWLIST_CRDS:
        allowlist_crd = cluster.crd(ALLOWLIST_CRDS[mode]) is not None
        objects = {namespace: cluster.securitypolicies(namespace) for namespace in namespaces} if allowlist_crd else {}
    checks.append(allowlist_check(mode, expected, routes, objects, values["ingress"]["source_ranges"], where,
                                  allowlist_crd, fixes.apply))
    return checks
