"""The BMC proxy: a Traefik of its own that serves the generated BMC routes and nothing else.

render writes it (bmc-proxy.yaml) when Traefik enforces the allowlist (gateway.allowlist or
ingress.allowlist ``traefik``); doctor checks that the live one is still the BMC's alone.
"""

from __future__ import annotations

import yaml

FILE = "bmc-proxy.yaml"
NAME = "maas-kubevirt-bmc-proxy"
# GatewayClasses and IngressClasses are cluster-scoped, so no tenant can make one carrying this label.
LABEL, LABEL_VALUE = "maas-kubevirt.io/bmc-proxy", "true"
# Traefik's Gateway controller name is fixed (pkg/provider/kubernetes/gateway/kubernetes.go,
# controllerName); its NGINX provider serves the IngressClasses whose controller it is told.
GATEWAY_CONTROLLER = "traefik.io/gateway-controller"
INGRESS_CONTROLLER = "maas-kubevirt.io/bmc-proxy"
ENTRY_POINT, PORT = "bmc", 8443
PING_ENTRY_POINT, PING_PORT = "ping", 8082
MIDDLEWARE = "bmc-allowlist"
DYNAMIC_DIR, DYNAMIC_FILE = "/etc/traefik/dynamic", "bmc-proxy.yaml"
# The providers that would let objects tenants write reach the proxy (doctor refuses each one).
TENANT_PROVIDERS = ("kubernetescrd", "kubernetesingress", "knative")


def rendered(values: dict) -> bool:
    """Whether render writes the proxy: Traefik enforces the allowlist for the chosen exposure."""
    if values["exposure"] == "gateway":
        return values["gateway"]["allowlist"] == "traefik"
    return values["ingress"]["allowlist"] == "traefik"


def entry_point_middleware() -> str:
    """The allowlist Middleware as its entry point names it (Traefik's file provider)."""
    return f"{MIDDLEWARE}@file"


def dynamic_configuration(values: dict) -> str:
    """The file provider's configuration: the one ipAllowList Middleware of ingress.source_ranges."""
    config = {"http": {"middlewares": {MIDDLEWARE: {"ipAllowList": {"sourceRange": list(values["ingress"]["source_ranges"])}}}}}
    return yaml.safe_dump(config, sort_keys=False)


def args(values: dict) -> list[str]:
    """The proxy's command line: one entry point held to the allowlist, and one Kubernetes provider."""
    common = [
        "--global.checkNewVersion=false",
        "--global.sendAnonymousUsage=false",
        "--log.level=INFO",
        "--ping=true",
        f"--ping.entryPoint={PING_ENTRY_POINT}",
        f"--entryPoints.{PING_ENTRY_POINT}.address=:{PING_PORT}",
        f"--entryPoints.{ENTRY_POINT}.address=:{PORT}",
        f"--entryPoints.{ENTRY_POINT}.asDefault=true",
        f"--entryPoints.{ENTRY_POINT}.http.tls=true",
        f"--entryPoints.{ENTRY_POINT}.http.middlewares={entry_point_middleware()}",
        f"--providers.file.filename={DYNAMIC_DIR}/{DYNAMIC_FILE}",
    ]
    if values["exposure"] == "gateway":
        # The Gateway's status names the address of the proxy's own Service (what DNS points at).
        return common + [
            "--providers.kubernetesGateway=true",
            f"--providers.kubernetesGateway.labelSelector={LABEL}={LABEL_VALUE}",
            f"--providers.kubernetesGateway.statusAddress.service.name={NAME}",
            f"--providers.kubernetesGateway.statusAddress.service.namespace={values['ingress']['controller_namespace']}",
        ]
    return common + [
        "--providers.kubernetesIngressNGINX=true",
        f"--providers.kubernetesIngressNGINX.controllerClass={INGRESS_CONTROLLER}",
        f"--providers.kubernetesIngressNGINX.ingressClass={values['ingress']['class_name']}",
        "--providers.kubernetesIngressNGINX.watchIngressWithoutClass=false",
        "--providers.kubernetesIngressNGINX.disableSvcExternalName=true",
    ]


def context(values: dict) -> dict:
    """What templates/bmc-proxy.yaml.j2 needs beyond the values."""
    return {
        "bmc_proxy_name": NAME,
        "bmc_proxy_label": LABEL,
        "bmc_proxy_label_value": LABEL_VALUE,
        "bmc_proxy_gateway_controller": GATEWAY_CONTROLLER,
        "bmc_proxy_controller": INGRESS_CONTROLLER,
        "bmc_proxy_args": args(values),
        "bmc_proxy_port": PORT,
        "bmc_proxy_ping_port": PING_PORT,
        "bmc_proxy_dynamic_dir": DYNAMIC_DIR,
        "bmc_proxy_dynamic_file": DYNAMIC_FILE,
        "bmc_proxy_dynamic": dynamic_configuration(values).rstrip("\n"),
    }


def enabled_providers(lowered_args: list[str]) -> set[str]:
    """The providers a Traefik command line turns on: any option of one turns it on, unless it says =false."""
    named = {arg.removeprefix("--providers.").split("=", 1)[0].split(".", 1)[0]
             for arg in lowered_args if arg.startswith("--providers.")}
    return {name for name in named if f"--providers.{name}=false" not in lowered_args}


def provider_problems(container_args: list[str], values: dict) -> list[str]:
    """What in a live proxy's command line lets objects tenants can write reach it ([] when none)."""
    problems = []
    lowered = [arg.lower() for arg in container_args]
    enabled = enabled_providers(lowered)
    for provider in TENANT_PROVIDERS:
        if provider in enabled:
            problems.append(f"provider {provider} is on (it serves objects tenants can write)")
    if values["exposure"] == "gateway":
        selector = f"--providers.kubernetesgateway.labelselector={LABEL}={LABEL_VALUE}"
        if "kubernetesgateway" in enabled and selector not in lowered:
            problems.append(f"its Gateway provider has no labelSelector {LABEL}={LABEL_VALUE} (it serves every "
                            "GatewayClass of Traefik's, tenants' included)")
        if any(arg.startswith("--providers.kubernetesgateway.experimentalchannel=true") for arg in lowered):
            problems.append("its Gateway provider's experimental channel is on (TLSRoutes and TCPRoutes attach)")
    elif "kubernetesingressnginx" in enabled:
        controller = f"--providers.kubernetesingressnginx.controllerclass={INGRESS_CONTROLLER}"
        if controller not in lowered:
            problems.append(f"its NGINX provider's controllerClass is not {INGRESS_CONTROLLER} (it serves "
                            "ingress-nginx's classes, tenants' included)")
        if "--providers.kubernetesingressnginx.watchingresswithoutclass=true" in lowered:
            problems.append("its NGINX provider serves Ingresses without a class")
    return problems
