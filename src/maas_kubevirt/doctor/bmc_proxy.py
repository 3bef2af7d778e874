"""doctor's BMC proxy rows: the BMC class is the bundle's alone, and the proxy serves nothing else.

``proxy.isolation`` fails when another Gateway uses ``gateway.class_name`` (or a listener of the BMC
Gateway has no hostname), when an Ingress that is not a generated BMC Ingress uses
``ingress.class_name``, or when the proxy's command line turns on a provider whose scope takes in
objects tenants write (Traefik's CRD or Ingress provider, a Gateway provider without the BMC
class's labelSelector). ``proxy.allowlist``: the rendered proxy's entry point holds every request to
the source ranges.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import yaml

from maas_kubevirt import bmc_proxy, exposure
from maas_kubevirt.doctor import FAIL, OK, WARN, Check, _clean, _networks, _some
from maas_kubevirt.doctor.inventory import ingress_classes

ISOLATION = "proxy.isolation"
ALLOWLIST = "proxy.allowlist"


def check_names(values: Mapping[str, Any]) -> tuple[str, ...]:
    """The proxy rows doctor makes: the allowlist row only for the proxy render writes."""
    return (ISOLATION, ALLOWLIST) if bmc_proxy.rendered(dict(values)) else (ISOLATION,)


def _where(item: Mapping[str, Any]) -> str:
    metadata = item.get("metadata") or {}
    return f"{_clean(metadata.get('namespace'))}/{_clean(metadata.get('name'))}"


def _containers(deployment: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return ((deployment.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []


def shared_class_problems(values: Mapping[str, Any], gateways: Iterable[Mapping[str, Any]] | None,
                          ingresses: Iterable[Mapping[str, Any]] | None,
                          generated: Iterable[tuple[str, str]]) -> list[str]:
    """What else uses the BMC class: other Gateways of it and hostless listeners on the BMC Gateway
    (exposure gateway), or Ingresses of it that are not a generated ``<vm>-bmc`` (exposure ingress)."""
    problems = []
    if values["exposure"] == "gateway":
        settings = values["gateway"]
        ours = f"{settings['namespace']}/{settings['name']}"
        for gateway in gateways or []:
            if (gateway.get("spec") or {}).get("gatewayClassName") != settings["class_name"]:
                continue
            if _where(gateway) != ours:
                problems.append(f"Gateway {_where(gateway)} uses class {settings['class_name']}")
                continue
            for listener in (gateway.get("spec") or {}).get("listeners") or []:
                if isinstance(listener, Mapping) and not listener.get("hostname"):
                    problems.append(f"listener {_clean(listener.get('name'))} of Gateway {ours} has no hostname")
        return problems
    bmc_routes = {f"{namespace}/{vm}{exposure.ROUTE_SUFFIX}" for namespace, vm in generated}
    for ingress in ingresses or []:
        if values["ingress"]["class_name"] in ingress_classes(ingress) and _where(ingress) not in bmc_routes:
            problems.append(f"Ingress {_where(ingress)} uses class {values['ingress']['class_name']}")
    return problems


def isolation_check(values: Mapping[str, Any], gateways: Iterable[Mapping[str, Any]] | None,
                    ingresses: Iterable[Mapping[str, Any]] | None, generated: Sequence[tuple[str, str]],
                    proxies: Iterable[Mapping[str, Any]] | None) -> Check:
    """The BMC class is used by the bundle's objects alone, and the rendered proxy serves only it."""
    gateway_side = values["exposure"] == "gateway"
    listed = gateways if gateway_side else ingresses
    if listed is None:
        kind = "Gateways" if gateway_side else "Ingresses"
        return Check(ISOLATION, WARN, f"cannot list the {kind} of every namespace: whether the BMC class is shared "
                     "is unknown", f"run doctor with a kubeconfig that may list {kind} cluster-wide")
    problems = shared_class_problems(values, gateways, ingresses, generated)
    rendered = bmc_proxy.rendered(dict(values))
    if rendered:
        found = list(proxies or [])
        if not found:
            problems.append(f"no Deployment {bmc_proxy.NAME} (the BMC proxy of {bmc_proxy.FILE})")
        for deployment in found:
            for container in _containers(deployment):
                problems.extend(f"Deployment {_where(deployment)}: {problem}" for problem in
                                bmc_proxy.provider_problems([str(arg) for arg in container.get("args") or []], values))
    class_name = values["gateway"]["class_name"] if gateway_side else values["ingress"]["class_name"]
    kind = "GatewayClass" if gateway_side else "IngressClass"
    if problems:
        return Check(ISOLATION, FAIL, f"the BMC proxy is shared: {_some(problems)}; whatever else it serves can "
                     "outrank the BMC routes and receive MAAS's BMC passwords",
                     f"give every other Gateway or Ingress a class of its own and delete hostless listeners from the "
                     f"BMC Gateway (admission refuses new ones), and deploy the proxy as {bmc_proxy.FILE} renders it",
                     tuple(problems))
    if rendered:
        return Check(ISOLATION, OK, f"{kind} {class_name} is the bundle's alone, and Deployment {bmc_proxy.NAME} "
                     "serves only it (no CRD or Ingress provider)")
    return Check(ISOLATION, OK, f"{kind} {class_name} is the bundle's alone; the proxy serving it is yours to keep "
                 "to that class (doctor cannot read its configuration)")


def allowlist_problem(values: Mapping[str, Any], config: Mapping[str, Any] | None,
                      proxies: Iterable[Mapping[str, Any]] | None) -> str | None:
    """Why the rendered proxy does not hold every request to ingress.source_ranges, or None."""
    if config is None:
        return f"no ConfigMap {bmc_proxy.NAME} (the proxy's allowlist)"
    try:
        dynamic = yaml.safe_load(((config.get("data") or {}).get(bmc_proxy.DYNAMIC_FILE)) or "") or {}
        allow = dynamic["http"]["middlewares"][bmc_proxy.MIDDLEWARE]["ipAllowList"]
    except (yaml.YAMLError, KeyError, TypeError):
        return f"ConfigMap {bmc_proxy.NAME} holds no ipAllowList {bmc_proxy.MIDDLEWARE}"
    if _networks(allow.get("sourceRange")) != _networks(list(values["ingress"]["source_ranges"])):
        return f"ConfigMap {bmc_proxy.NAME} admits {', '.join(sorted(_networks(allow.get('sourceRange'))))}"
    if allow.get("ipStrategy"):
        return "its ipAllowList sets ipStrategy (the client address is then read from X-Forwarded-For, which a client sets)"
    flag = f"--entryPoints.{bmc_proxy.ENTRY_POINT}.http.middlewares={bmc_proxy.entry_point_middleware()}"
    for deployment in proxies or []:
        for container in _containers(deployment):
            if flag not in (container.get("args") or []):
                return f"Deployment {_where(deployment)} does not attach it ({flag} missing)"
    return None


def allowlist_check(values: Mapping[str, Any], config: Mapping[str, Any] | None,
                    proxies: Iterable[Mapping[str, Any]] | None, apply: str) -> Check:
    """The rendered proxy's entry point holds exactly the source ranges."""
    shown = ", ".join(values["ingress"]["source_ranges"])
    problem = allowlist_problem(values, config, proxies)
    if problem:
        return Check(ALLOWLIST, FAIL, f"the BMC proxy's allowlist is not {shown}: {problem}", apply,
                     (f"{values['ingress']['controller_namespace']}/{bmc_proxy.NAME}",))
    return Check(ALLOWLIST, OK, f"enforced by {exposure.allowlist_mechanism(dict(values))}, on every request to it")
