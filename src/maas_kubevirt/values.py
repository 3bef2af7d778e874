"""The values file: built-in defaults, the operator's overrides, and validation of every key."""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Any, Callable

import yaml

from maas_kubevirt import identity, quantity
from maas_kubevirt.paths import data_dir

DEFAULT_VALUES_PATH = data_dir() / "values.yaml"

_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?\Z")
_URL = re.compile(r"https?://[^\s/?#]+(/[^\s?#]*)?\Z")
_K8S_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_MAAS_TAG = re.compile(r"[\w-]+\Z")
# ingress-nginx reads a source allowlist from these annotations only (the second is the
# deprecated name it still honours), under its --annotations-prefix: any other name under that
# prefix would leave the BMC open.
NGINX_ALLOWLIST_ANNOTATIONS = (
    "nginx.ingress.kubernetes.io/allowlist-source-range",
    "nginx.ingress.kubernetes.io/whitelist-source-range",
)


class ValuesError(Exception):
    """Values that cannot be used; each problem reads ``key.path: expected X, found Y``."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


def _found(value: Any) -> str:
    if isinstance(value, str):
        return repr(value) if value else "an empty string"
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return str(value)
    return f"a {type(value).__name__}"


def _choice(*options: str) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if value in options else "one of " + ", ".join(options)

    return check


def _dns_name(value: Any) -> str | None:
    try:
        identity.validate_domain(value)
    except identity.IdentityError:
        return "a DNS name such as bmc.example.com"
    return None


def _label_key(value: Any) -> str | None:
    if isinstance(value, str):
        prefix, _, name = value.rpartition("/")
        prefix_ok = not prefix or (len(prefix) <= 253 and _K8S_NAME.match(prefix))
        if prefix_ok and name and len(name) <= 63 and _LABEL_NAME.match(name):
            return None
    return "a Kubernetes label key ([prefix/]name, name 1-63 characters)"


def _label_value(value: Any) -> str | None:
    if isinstance(value, str) and value and len(value) <= 63 and _LABEL_NAME.match(value):
        return None
    return "a non-empty Kubernetes label value (1-63 letters, digits, '-', '_', '.')"


def _k8s_name(value: Any) -> str | None:
    if isinstance(value, str) and value and len(value) <= 253 and _K8S_NAME.match(value):
        return None
    return "a Kubernetes object name (DNS-1123 subdomain)"


def _namespace(value: Any) -> str | None:
    try:
        identity.validate_namespace(value)
    except identity.IdentityError:
        return "a Kubernetes namespace name (DNS-1123 label)"
    return None


def _optional(check: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
    def optional(value: Any) -> str | None:
        if value == "":
            return None
        problem = check(value)
        return problem and f"{problem}, or an empty string"

    return optional


def _text(value: Any) -> str | None:
    if isinstance(value, str) and value.strip() and value.isprintable():
        return None
    return "a non-empty printable string"


def _maas_pool_name(value: Any) -> str | None:
    """A resource pool name as MAAS accepts it (src/maasserver/models/resourcepool.py: ^\\w[ \\w-]*$)."""
    if isinstance(value, str) and len(value) <= 256 and re.fullmatch(r"\w[ \w-]*", value):
        return None
    return "a MAAS resource pool name (a letter, digit or '_', then those, '-' and spaces)"


def _each(item: Callable[[Any], str | None], what: str) -> Callable[[Any], list[str]]:
    """A list, maybe empty, whose every entry passes item (which says what it expected)."""
    def check(value: Any) -> list[str]:
        if not isinstance(value, list):
            return [f"a list of {what} (may be empty)"]
        return [f"[{index}]: expected {problem}, found {_found(entry)}"
                for index, entry in enumerate(value) if (problem := item(entry))]
    return check


def _path(value: Any) -> str | None:
    return None if isinstance(value, str) and "\0" not in value else "a file path"


def _absolute_path(value: Any) -> str | None:
    if isinstance(value, str) and value.startswith("/") and "\0" not in value:
        return None
    return "an absolute file path"


def _url(value: Any) -> str | None:
    return None if isinstance(value, str) and _URL.match(value) else "an http:// or https:// URL"


def _listen_address(value: Any) -> str | None:
    """"" (off) or host:port, the host an IP address or a name, IPv6 in brackets: [::1]:9639."""
    if value == "":
        return None
    match = isinstance(value, str) and re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\d{1,5})|([^\s:\[\]/]+):(\d{1,5})", value)
    if match:
        host, port = (match[1], match[2]) if match[1] is not None else (match[3], match[4])
        try:
            if match[1] is not None:
                ipaddress.IPv6Address(host)
            if int(port) <= 65535:
                return None
        except ValueError:
            pass
    return '"" (off) or host:port to listen on, e.g. 127.0.0.1:9639, an IPv6 host in brackets: [::1]:9639'


def _seconds(low: int, high: int) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if isinstance(value, int) and not isinstance(value, bool) and low <= value <= high:
            return None
        return f"a whole number of seconds from {low} to {high}"

    return check


def _whole(low: int, high: int, unit: str) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if isinstance(value, int) and not isinstance(value, bool) and low <= value <= high:
            return None
        return f"a whole number of {unit} from {low} to {high}"

    return check


def _maas_tag(value: Any) -> str | None:
    if isinstance(value, str) and 0 < len(value) <= 256 and _MAAS_TAG.match(value):
        return None
    return "a MAAS tag name (letters, digits, '_' and '-')"


def _cidr(item: Any) -> Any:
    """item as an ipaddress network (host bits zero), or None when it is not one."""
    try:
        return ipaddress.ip_network(item, strict=True) if isinstance(item, str) else None
    except ValueError:
        return None


def _source_ranges(value: Any) -> list[str]:
    """The BMC allowlist: at least one CIDR; neither one of them nor their union the whole space (/0)."""
    if not isinstance(value, list):
        return ["a list of CIDRs such as 10.0.0.0/8"]
    if not value:
        return ["at least one CIDR, such as the MAAS rack controllers' (an empty list would leave every BMC open)"]
    problems: list[str] = []
    networks: list = []
    whole: set[int] = set()  # IP versions already refused for a /0 item
    for index, item in enumerate(value):
        network = _cidr(item)
        if network is None:
            problems.append(f"[{index}]: expected a CIDR such as 10.0.0.0/8, found {_found(item)}")
            continue
        if network.prefixlen == 0:
            whole.add(network.version)
            problems.append(f"[{index}]: expected a CIDR narrower than /0 (the rack controllers, not "
                            f"the whole Internet), found {item!r}")
            continue
        networks.append(network)
    return problems + _whole_family_unions(networks, whole)


def _pod_cidrs(value: Any) -> list[str]:
    """The cluster's pod networks (IPv4 CIDRs, host bits zero); empty: the pod-network rule is off."""
    if not isinstance(value, list):
        return ["a list of IPv4 CIDRs such as 10.244.0.0/16 (the cluster's pod networks; [] for none)"]
    problems: list[str] = []
    for index, item in enumerate(value):
        network = _cidr(item)
        if network is None:
            problems.append(f"[{index}]: expected an IPv4 CIDR such as 10.244.0.0/16, found {_found(item)}")
        elif network.version != 4:
            problems.append(f"[{index}]: expected an IPv4 CIDR such as 10.244.0.0/16 (IPv6 pod networks are "
                            f"not checked yet), found {item!r}")
        elif network.prefixlen == 0:
            problems.append(f"[{index}]: expected the pod network, narrower than /0, found {item!r}")
    return problems


def _whole_family_unions(networks: list, already_whole: set[int]) -> list[str]:
    """A problem for each IP version whose ranges together cover all of it, as /0 would."""
    problems = []
    for version, everything in ((4, "0.0.0.0/0"), (6, "::/0")):
        family = [n for n in networks if n.version == version]
        if version in already_whole or not family:
            continue
        if any(n.prefixlen == 0 for n in ipaddress.collapse_addresses(family)):
            listed = ", ".join(str(n) for n in family)
            problems.append(f": expected CIDRs that together leave out part of IPv{version} (the rack "
                            f"controllers, not the whole Internet), found {listed}, which add up to {everything}")
    return problems


def _boolean(value: Any) -> str | None:
    return None if isinstance(value, bool) else "true or false"


def _annotation_key(value: Any) -> str | None:
    return _label_key(value) and "an annotation key ([prefix/]name)"


def _annotations(value: Any) -> list[str]:
    if not isinstance(value, dict):
        return ["a mapping of annotation keys to string values"]
    problems = []
    for key, item in value.items():
        if _label_key(key):
            problems.append(f"[{key!r}]: expected an annotation key ([prefix/]name), found {_found(key)}")
        elif not isinstance(item, str):
            problems.append(f"[{key!r}]: expected a string value (quote it), found {_found(item)}")
    return problems


# reconciler.lease: the Lease the reconcilers of one site elect their holder on. The renew
# deadline and retry period are Kubernetes' own components' (kube-controller-manager:
# --leader-elect-renew-deadline 10s, --leader-elect-retry-period 2s); the duration is longer than
# their 15 s because every MAAS request a holder starts must end within it (_check_lease_fits).
LEASE: dict[str, Callable[[Any], str | None]] = {
    "kubeconfig": _optional(_absolute_path),
    "namespace": _optional(_namespace),
    "name": _k8s_name,
    "duration": _seconds(1, 3600),
    "renew_deadline": _seconds(1, 3600),
    "retry_period": _seconds(1, 3600),
}
# client-go refuses timings that cannot keep one leader (tools/leaderelection/leaderelection.go,
# NewLeaderElector): the lease must outlast the renew deadline, and the renew deadline must
# leave room for a jittered retry (JitterFactor 1.2).
JITTER_FACTOR = 1.2


def _lease(value: Any) -> list[str]:
    """reconciler.lease: each key by its name, then the order of the three timings."""
    if not isinstance(value, dict):
        return ["a mapping of " + ", ".join(LEASE)]
    problems = [f".{key}: unknown key; expected one of {', '.join(LEASE)}" for key in value if key not in LEASE]
    for key, check in LEASE.items():
        if key not in value:
            problems.append(f".{key}: expected a value, found nothing")
            continue
        problem = check(value[key])
        if problem:
            problems.append(f".{key}: expected {problem}, found {_found(value[key])}")
    if problems:
        return problems
    if value["duration"] <= value["renew_deadline"]:
        problems.append(f".duration: expected more seconds than renew_deadline ({value['renew_deadline']}), "
                        f"found {value['duration']}")
    if value["renew_deadline"] <= JITTER_FACTOR * value["retry_period"]:
        problems.append(f".renew_deadline: expected more than {JITTER_FACTOR} x retry_period "
                        f"({value['retry_period']}), found {value['renew_deadline']}")
    return problems


# reconciler.pools: the pools' own credential in the cluster (docs/reference/values.md).
POOLS_ACCESS: dict[str, Callable[[Any], str | None]] = {"kubeconfig": _optional(_absolute_path)}


def _pools_access(value: Any) -> list[str]:
    if not isinstance(value, dict):
        return ["a mapping of " + ", ".join(POOLS_ACCESS)]
    problems = [f".{key}: unknown key; expected one of {', '.join(POOLS_ACCESS)}" for key in value
                if key not in POOLS_ACCESS]
    for key, check in POOLS_ACCESS.items():
        problem = check(value.get(key))
        if problem:
            problems.append(f".{key}: expected {problem}, found {_found(value.get(key))}")
    return problems


# A pool VM is <pool>-<suffix>: the pool's name leaves room for the suffix and for the names
# kubevirtBMC and Kyverno derive from the VM within one DNS label.
POOL_NAME_MAX = 40
ON_RELEASE = ("recreate", "keep")


def _pool_name(value: Any) -> str | None:
    if isinstance(value, str) and len(value) <= POOL_NAME_MAX and identity.is_label(value):
        return None
    return f"a DNS label of at most {POOL_NAME_MAX} characters (lower-case letters, digits and '-')"


def _size(least: int, least_text: str) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        try:
            return None if quantity.parse(value) >= least else f"at least {least_text}"
        except quantity.QuantityError as error:
            return str(error)

    return check


def _network(value: Any) -> str | None:
    """A NetworkAttachmentDefinition: ``name`` in the pool's namespace, or ``namespace/name``."""
    parts = value.split("/") if isinstance(value, str) else []
    if 1 <= len(parts) <= 2 and all(identity.is_label(part) for part in parts):
        return None
    return "a NetworkAttachmentDefinition, as name or namespace/name"


# Each pool of the top-level list `pools`: the keys with a default may be left out.
POOL: dict[str, Callable[[Any], Any]] = {
    "name": _pool_name,
    "namespace": _namespace,
    "cores": _whole(1, 1024, "cores"),
    "memory": _size(2**30, "1Gi (MAAS boots its ephemeral image into memory)"),
    "disk": _size(2**30, "1Gi"),
    "storage_class": _k8s_name,
    "network": _network,
    "ready": _whole(0, 10000, "machines"),
    "max": _whole(1, 10000, "VMs"),
    "tags": _each(_maas_tag, "MAAS tag names"),
    "on_release": _choice(*ON_RELEASE),
}
POOL_DEFAULTS: dict[str, Any] = {"tags": [], "on_release": "recreate"}


def _pool(pool: Any) -> list[str]:
    """One pool: each key by its name, then ready within max."""
    if not isinstance(pool, dict):
        return [": expected a mapping of " + ", ".join(POOL) + f", found {_found(pool)}"]
    problems = [f".{key}: unknown key; expected one of {', '.join(POOL)}" for key in pool if key not in POOL]
    for key, check in POOL.items():
        if key not in pool:
            if key not in POOL_DEFAULTS:
                problems.append(f".{key}: expected a value, found nothing")
            continue
        outcome = check(pool[key])
        if isinstance(outcome, str):
            problems.append(f".{key}: expected {outcome}, found {_found(pool[key])}")
        elif outcome:
            problems.extend(f".{key}{problem}" for problem in outcome)
    if not problems and pool["ready"] > pool["max"]:
        problems.append(f".ready: expected at most max ({pool['max']}), found {pool['ready']}")
    return problems


def _pools(value: Any) -> list[str]:
    """The list of pools: each pool, then names unique (a pool's name is also its MAAS tag)."""
    if not isinstance(value, list):
        return ["a list of pools (may be empty)"]
    problems = [f"[{index}]{problem}" for index, pool in enumerate(value) for problem in _pool(pool)]
    seen: dict[str, int] = {}
    for index, pool in enumerate(value):
        name = pool.get("name") if isinstance(pool, dict) else None
        if isinstance(name, str) and seen.setdefault(name, index) != index:
            problems.append(f"[{index}].name: expected a name no other pool has, found {name!r} "
                            f"(also pool [{seen[name]}])")
    return problems


def _annotation_prefix(value: Any) -> str | None:
    if isinstance(value, str) and value and len(value) <= 253 and _K8S_NAME.match(value):
        return None
    return "an annotation prefix (a DNS subdomain such as nginx.ingress.kubernetes.io)"


# An OCI image reference as a pod's image takes it: registry/path:tag or @digest, no spaces.
_IMAGE = re.compile(r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*(:[\w][\w.-]{0,127})?(@sha256:[0-9a-f]{64})?$")


def _image(value: Any) -> str | None:
    return None if isinstance(value, str) and _IMAGE.match(value) and ("@" in value or ":" in value.rsplit("/", 1)[-1]) else (
        "a container image with a tag or digest (e.g. docker.io/library/traefik:v3.6.12)")


def _ip_address(value: Any) -> str | None:
    try:
        ipaddress.ip_address(value)
    except (TypeError, ValueError):
        return "an IP address (the BMC proxy's load-balancer address)"
    return None


def _section_name(value: Any) -> str | None:
    # Gateway API's SectionName: a DNS-1123 subdomain of at most 253 characters.
    return None if isinstance(value, str) and _K8S_NAME.match(value) and len(value) <= 253 else (
        "a listener name (a DNS-1123 subdomain)")


# How the BMC hosts are published: an Ingress per VM, or an HTTPRoute per VM on the site's Gateway.
EXPOSURES = ("ingress", "gateway")
# Gateway API has no portable client-address filter: the allowlist is rendered for the
# implementation named, or (external) enforced by the operator in front of the Gateway.
GATEWAY_ALLOWLISTS = ("traefik", "envoy-gateway", "external")
# Who enforces ingress.source_ranges on the Ingress path: the allowlist annotation, or (for
# Traefik's NGINX provider, which v3.6 serves without reading that annotation) one Traefik
# ipAllowList Middleware attached to the controller's entry point.
INGRESS_ALLOWLISTS = ("annotation", "traefik")
# Ingress keys that shape only the generated Ingress: set with exposure gateway, they would do nothing.
INGRESS_ONLY = {"tls_secret": "", "cluster_issuer": "", "annotations": {}, "allowlist": "annotation"}

# The Gateway API kinds that carry hostnames or attach to a Gateway, which the route-isolation
# policy holds to the BMC rules. Kyverno refuses a policy that matches a kind the cluster does not
# serve, so the list names what the site installed; the experimental channel's TLSRoute, TCPRoute,
# UDPRoute and XListenerSet are not in the standard one.
ROUTE_KINDS = ("HTTPRoute", "GRPCRoute", "TLSRoute", "TCPRoute", "UDPRoute", "XListenerSet", "ListenerSet")
# What route_kinds: [] means with exposure gateway: the standard channel's kinds.
STANDARD_ROUTE_KINDS = ["HTTPRoute", "GRPCRoute"]


def _route_kinds(value: Any) -> list[str]:
    if not isinstance(value, list):
        return ["a list of Gateway API kinds (may be empty)"]
    return [f"[{index}]: expected one of {', '.join(ROUTE_KINDS)}, found {_found(kind)}"
            for index, kind in enumerate(value) if kind not in ROUTE_KINDS]


def traefik_crds_served(values: dict) -> bool:
    """gateway.traefik_crds: whether the cluster serves IngressRoute, IngressRouteTCP and TraefikService."""
    return values["gateway"]["traefik_crds"]


# Top-level keys holding one value rather than a section.
SCALARS: dict[str, Callable[[Any], Any]] = {"exposure": _choice(*EXPOSURES), "pools": _pools}

# Each leaf: a check returning what was expected (scalar) or a list of sub-problems (collections).
SCHEMA: dict[str, dict[str, Callable[[Any], Any]]] = {
    "redfish": {
        "domain": _dns_name,
        "check": _choice("off", "advisory", "strict"),
    },
    "seed": {"file": _path},
    "smbios": {"manufacturer": _text},
    "kubernetes": {
        "system_namespace": _namespace,
        "seed_secret": _k8s_name,
        "opt_in_label": _label_key,
        "opt_in_value": _label_value,
        "kyverno_namespace": _namespace,
        "example_namespace": _boolean,
        "pod_cidrs": _pod_cidrs,
    },
    "ingress": {
        "class_name": _k8s_name,
        "controller_namespace": _namespace,
        "allow_catch_all": _boolean,
        "tls_secret": _optional(_k8s_name),
        "cluster_issuer": _optional(_k8s_name),
        "source_ranges": _source_ranges,
        "allowlist_annotation": _optional(_annotation_key),
        "annotations": _annotations,
        "annotation_prefix": _annotation_prefix,
        "watch_without_class": _boolean,
        "allowlist": _choice(*INGRESS_ALLOWLISTS),
    },
    "gateway": {
        "namespace": _optional(_namespace),
        "name": _optional(_k8s_name),
        "section_name": _optional(_section_name),
        "class_name": _k8s_name,
        "allowlist": _choice(*GATEWAY_ALLOWLISTS),
        "route_kinds": _route_kinds,
        "traefik_crds": _boolean,
    },
    "bmc_proxy": {
        "image": _image,
        "address": _optional(_ip_address),
    },
    "maas": {
        "url": _url,
        "api_key_file": _absolute_path,
        "commission": _choice("auto", "approved", "never"),
        "approval_tag": _maas_tag,
        "on_hostname_taken": _choice("fallback", "skip"),
        "adopt_pools": _each(_maas_pool_name, "MAAS resource pool names"),
        "interval": _seconds(1, 86400),
        "resync_interval": _seconds(60, 604800),
        "power_check_interval": _seconds(60, 86400),
        "timeout": _seconds(1, 600),
        "commission_timeout": _seconds(30, 3600),
        "concurrency": _whole(1, 64, "requests at once"),
        "cycle_deadline": _seconds(10, 86400),
        "max_response_mib": _whole(1, 65536, "MiB"),
        "audit_log": _optional(_absolute_path),
        "metrics_address": _listen_address,
    },
    "reconciler": {"lease": _lease, "pools": _pools_access},
}
# Leaves that are mappings of their own, with their keys: a values file's keys merge over the
# defaults' one by one.
NESTED: dict[tuple[str, str], dict[str, Callable[[Any], Any]]] = {
    ("reconciler", "lease"): LEASE,
    ("reconciler", "pools"): POOLS_ACCESS,
}


# Keys a values file may no longer set, and why: ignoring one silently would let an operator
# believe it still has an effect.
RETIRED: dict[tuple[str, str], str] = {
    ("redfish", "scheme"): "MAAS stores the Redfish address as a bare host and always reaches it over https://",
    ("redfish", "username"): ("each VM's BMC user is derived from the seed like its password, so that no "
                              "other machine can share its BMC row in MAAS"),
}


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader that notes every key a mapping repeats (PyYAML keeps the last one
    silently: two ``redfish:`` sections would leave the first without effect). Keys brought in
    by a merge (``<<: *defaults``) may be overridden, as YAML means them to be."""

    def __init__(self, stream: Any):
        super().__init__(stream)
        self.duplicates: list[str] = []

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark)
            except TypeError:   # an unhashable key: PyYAML's own error follows
                continue
            if first is not key_node.start_mark:
                name = repr(key) if isinstance(key, str) else _found(key)
                self.duplicates.append(f"key {name} appears twice, at {_where(first, key_node.start_mark)}: keep "
                                       "one (YAML would take the last and drop the first without a word)")
        return super().construct_mapping(node, deep)


def _where(first: yaml.Mark, second: yaml.Mark) -> str:
    if first.line == second.line:   # a flow mapping: {a: 1, a: 2}
        return f"line {first.line + 1}, columns {first.column + 1} and {second.column + 1}"
    return f"line {first.line + 1} and line {second.line + 1}"


def _read(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ValuesError([f"{path}: cannot read the values file: {error.strerror or error}"]) from None
    loader = None
    try:
        loader = _UniqueKeyLoader(text)
        data = loader.get_single_data()
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or "invalid YAML"
        raise ValuesError([f"{path}: not valid YAML{where}: {problem}"]) from None
    finally:
        if loader is not None:
            loader.dispose()
    if loader.duplicates:
        raise ValuesError([f"{path}: {duplicate}" for duplicate in loader.duplicates])
    return data


def validate(values: Any, source: str = "values") -> dict:
    """Check every key of a complete values mapping against SCHEMA; return it or raise ValuesError."""
    if not isinstance(values, dict):
        raise ValuesError([f"{source}: expected a mapping of sections, found {_found(values)}"])
    problems = []
    for section in values:
        if section not in SCHEMA and section not in SCALARS:
            problems.append(f"{section}: unknown key; expected one of {', '.join([*SCALARS, *SCHEMA])}")
    for key, check in SCALARS.items():
        if key not in values:
            problems.append(f"{key}: expected a value, found nothing")
        elif isinstance(outcome := check(values[key]), str):
            problems.append(f"{key}: expected {outcome}, found {_found(values[key])}")
        elif outcome:
            problems.extend(f"{key}{p}" if p.startswith(("[", ":", ".")) else f"{key}: expected {p}, found "
                            f"{_found(values[key])}" for p in outcome)
    for section, keys in SCHEMA.items():
        given = values.get(section)
        if not isinstance(given, dict):
            problems.append(f"{section}: expected a mapping, found {_found(given)}")
            continue
        for key in given:
            if (section, key) in RETIRED:
                problems.append(f"{section}.{key}: no longer supported: {RETIRED[section, key]}; remove the key")
            elif key not in keys:
                problems.append(f"{section}.{key}: unknown key; expected one of {', '.join(keys)}")
        for key, check in keys.items():
            if key not in given:
                problems.append(f"{section}.{key}: expected a value, found nothing")
                continue
            outcome = check(given[key])
            if isinstance(outcome, str):
                problems.append(f"{section}.{key}: expected {outcome}, found {_found(given[key])}")
            elif isinstance(outcome, list):
                problems.extend(
                    f"{section}.{key}{p}" if p.startswith(("[", ":", ".")) else f"{section}.{key}: expected {p}, found {_found(given[key])}"
                    for p in outcome
                )
    if problems:
        raise ValuesError(problems)
    _check_nginx_allowlist(values["ingress"])
    _check_gateway(values)
    _check_lease_fits(values)
    _check_pools_commissioned(values)
    values["pools"] = [{**POOL_DEFAULTS, **pool} for pool in values["pools"]]
    values["redfish"]["domain"] = identity.validate_domain(values["redfish"]["domain"])
    return values


def nginx_allowlist_annotations(ingress: dict) -> tuple[str, ...]:
    """ingress-nginx's allowlist annotation and its deprecated alias, under the controller's prefix."""
    prefix = ingress["annotation_prefix"].rstrip("/") + "/"
    return tuple(prefix + known.split("/", 1)[1] for known in NGINX_ALLOWLIST_ANNOTATIONS)


def _check_nginx_allowlist(ingress: dict) -> None:
    """An allowlist annotation under the controller's prefix is one ingress-nginx reads: a typo there
    would open every BMC. One under another prefix is another controller's, taken as it is."""
    name = ingress["allowlist_annotation"]
    read = nginx_allowlist_annotations(ingress)
    prefix = ingress["annotation_prefix"].rstrip("/") + "/"
    if name.startswith(prefix) and name not in read:
        raise ValuesError([
            f"ingress.allowlist_annotation: expected {', '.join(read)}, an empty string, or another "
            f"controller's annotation (the only allowlists ingress-nginx reads under ingress.annotation_prefix "
            f"{prefix.rstrip('/')}), found {name!r}"])


def _check_gateway(values: dict) -> None:
    """exposure: gateway attaches every route to one Gateway of the site: it must be named."""
    if values["exposure"] != "gateway":
        return
    ignored = [key for key, default in INGRESS_ONLY.items() if values["ingress"][key] != default]
    if ignored:
        raise ValuesError([
            f"ingress.{key}: expected {_found(INGRESS_ONLY[key]) if INGRESS_ONLY[key] != {} else 'an empty mapping'} "
            f"with exposure gateway (it shapes only the generated Ingress; TLS is the Gateway listener's and "
            f"the allowlist is gateway.allowlist), found {_found(values['ingress'][key])}" for key in ignored])
    kinds = values["gateway"]["route_kinds"]
    if kinds and "HTTPRoute" not in kinds:
        raise ValuesError([f"gateway.route_kinds: expected HTTPRoute among them (exposure is gateway: the BMC "
                           f"routes are HTTPRoutes), found {', '.join(kinds)}"])
    missing = [f"gateway.{key}" for key in ("namespace", "name") if not values["gateway"][key]]
    if missing:
        raise ValuesError([
            f"{key}: expected the {'namespace' if key.endswith('namespace') else 'name'} of the site's Gateway "
            f"the BMC routes attach to (exposure is gateway), found an empty string" for key in missing])


def _check_lease_fits(values: dict) -> None:
    """With a lease, a holder starts a MAAS request only if it ends (maas.timeout) before a standby
    may take over; a duration that leaves no such room would never let it write at all."""
    lease, timeout = values["reconciler"]["lease"], values["maas"]["timeout"]
    if lease["kubeconfig"] and lease["duration"] - lease["renew_deadline"] < timeout:
        raise ValuesError([
            f"reconciler.lease.duration: expected at least reconciler.lease.renew_deadline + maas.timeout "
            f"({lease['renew_deadline']} + {timeout} = {lease['renew_deadline'] + timeout} seconds, so that "
            f"every MAAS request a holder starts ends before a standby may take over), found {lease['duration']}"])


def _check_pools_commissioned(values: dict) -> None:
    """A pool keeps machines Ready, which only commissioning makes them."""
    if values["pools"] and values["maas"]["commission"] == "never":
        raise ValuesError([
            "maas.commission: expected auto or approved with pools (a pool's machines must be commissioned to "
            "become Ready; a pool in the values file is the administrator's approval), found 'never'"])


def _merge(defaults: dict, overrides: dict) -> dict:
    merged = dict(defaults)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict) and key in SCHEMA:
            merged[key] = {**merged[key], **value}
            for section, leaf in NESTED:
                if section == key and isinstance(value.get(leaf), dict) and isinstance(defaults[key].get(leaf), dict):
                    merged[key][leaf] = {**defaults[key][leaf], **value[leaf]}
        else:
            merged[key] = value
    return merged


def _normalise(values: dict) -> dict:
    # YAML 1.1 reads a bare `off` as false; the operator meant the option's name.
    redfish = values.get("redfish")
    if isinstance(redfish, dict) and redfish.get("check") is False:
        redfish["check"] = "off"
    return values


def load_values(path: str | os.PathLike | None = None) -> dict:
    """The built-in defaults with the file at path (if any) merged over them, validated."""
    defaults = _read(DEFAULT_VALUES_PATH)
    if path is None:
        return validate(_normalise(defaults), str(DEFAULT_VALUES_PATH))
    overrides = _read(Path(path))
    if overrides is None:
        overrides = {}
    if not isinstance(overrides, dict):
        raise ValuesError([f"{path}: expected a mapping of sections, found {_found(overrides)}"])
    return validate(_normalise(_merge(defaults, overrides)), str(path))
