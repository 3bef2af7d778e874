"""values -> the Kubernetes side of the bundle: Kyverno policies, their RBAC, the seed Secret.

Rendered from the Jinja templates in templates/ (StrictUndefined). Every value from the values
file reaches the YAML through the ``q`` filter, a JSON string (JSON is YAML), so no value can
change the shape of a document; every rendered file is parsed back before it is returned.

The policies compute the identity rules of :mod:`maas_kubevirt.identity` in Kyverno's JMESPath
(``sha256``, ``truncate``, ``regex_replace_all``, ``join``); tests run them through the Kyverno
engine and compare with the identity module.

``python -m maas_kubevirt.policies DIR`` writes the reference render of the default values
(without the seed Secret) to DIR; the repository keeps it in kyverno/.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Any

import jinja2
import yaml

from maas_kubevirt import identity
from maas_kubevirt import exposure as exposure_module
from maas_kubevirt import bmc_proxy
from maas_kubevirt.exposure import exposure_context
from maas_kubevirt.pools import spec as pool_spec, vm as pool_vm
from maas_kubevirt.paths import data_dir, write_atomic
from maas_kubevirt.values import NGINX_ALLOWLIST_ANNOTATIONS, ValuesError, nginx_allowlist_annotations, traefik_crds_served

# Oldest Kyverno the policies are written for (rule-level generateExisting, failureAction,
# mutateExistingOnPolicyUpdate); tests run them with the CLI built by tools/build-kyverno.
KYVERNO_MIN_VERSION = "1.13.0"
KUBERNETES_MIN_VERSION = "1.28"
CATEGORY = "MAAS, KubeVirt"
EXAMPLE_NAMESPACE = "maas-vms"
# Rendered only with kubernetes.example_namespace true (the default).
EXAMPLE_NAMESPACE_FILE = "example-namespace.yaml"
KUBEMACPOOL_LABEL = "mutatevirtualmachines.kubemacpool.io"
# ingress-nginx's source allowlist; whitelist-source-range is its deprecated alias, which
# ingress-nginx still honours, so neither may come from ingress.annotations.
ALLOWLIST_ANNOTATION, DEPRECATED_ALLOWLIST_ANNOTATION = NGINX_ALLOWLIST_ANNOTATIONS
# The Ingress class annotation older than spec.ingressClassName, which controllers still read.
LEGACY_INGRESS_CLASS_ANNOTATION = "kubernetes.io/ingress.class"
CLUSTER_ISSUER_ANNOTATION = "cert-manager.io/cluster-issuer"
# ingress-nginx's own annotations (DefaultAnnotationsPrefix in
# internal/ingress/annotations/parser/main.go). server-alias adds server names to the servers of
# the Ingress's hosts: comma-separated, each strings.TrimSpace'd, wildcards and ~regexes accepted
# (internal/ingress/annotations/alias/main.go, ValidateServerName in parser/validators.go). The
# *-snippet ones paste raw nginx configuration: server-, configuration-, stream-, auth- and
# modsecurity-snippet (internal/ingress/annotations/{serversnippet,snippet,streamsnippet,authreq,
# modsecurity}/main.go). On the BMC class the first may name only the namespace's own BMC hosts,
# and the others are refused.
NGINX_ANNOTATION_PREFIX = "nginx.ingress.kubernetes.io/"
SERVER_ALIAS_SUFFIX = "server-alias"
SERVER_ALIAS_ANNOTATION = NGINX_ANNOTATION_PREFIX + SERVER_ALIAS_SUFFIX
SNIPPET_SUFFIX = "-snippet"
# An alias the BMC class admits: blanks around it (RE2 [[:space:]], which ingress-nginx trims
# too), then one or more DNS labels of lower-case letters, digits and '-', then
# .<the Ingress's namespace>.<domain>. No '*', no '~' regex, no leading dot (nginx's
# ".example.org" is a wildcard). The namespace and domain are joined in by the rule.
ALIAS_HOST_LABELS_REGEX = "^[[:space:]]*([a-z0-9]([-a-z0-9]*[a-z0-9])?[.])+"
# Set on each VM by the opt-in rule: a new value on every opt-in makes the update that fires
# the BMC policy's generate rules even when the VM already carries its serial and UUID.
OPTED_IN_ANNOTATION = "maas-kubevirt/opted-in"
# On each generated <vm>-bmc Secret: which seed its user and password come from (seed_version).
SEED_VERSION_ANNOTATION = "maas-kubevirt/seed-version"
# On each <vm>-bmc Secret, and on each VM the rotations policy touches: the credential generation
# (identity.parse_generation) its user and password are derived with. On the VM it is only the
# trigger of a re-derivation: the bmc-secret rule reads the generation from the ConfigMap.
GENERATION_ANNOTATION = "maas-kubevirt/credential-generation"
# The keys and values the rotations ConfigMap admits: a serial identity.parse_serial accepts (a
# DNS-1123 subdomain, a dot, a DNS-1123 label; a ConfigMap key is at most 253 characters), and a
# generation identity.parse_generation accepts. RE2 syntax, the same in Python's re.
SERIAL_KEY_REGEX = (
    "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?([.][a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*"
    "[.][a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
)
GENERATION_REGEX = "^(0|[1-9][0-9]{0,8})$"


def generation_total_jmespath(obj: str, above: int | None = None) -> str:
    """The sum of the canonical generations in obj's data (a JMESPath of the ConfigMap), or of those
    above ``above``; 0 without any. Kyverno's sum wants one number at least: hence the 0."""
    test = f"regex_match('{GENERATION_REGEX}', value)" + (f" && to_number(value) > `{above}`" if above is not None else "")
    return f"sum([`0`, items({obj}.data || `{{}}`, 'key', 'value')[?{test}].to_number(value)][])"


POLICY_NAMES = {
    "identity": "maas-kubevirt-vm-identity",
    "claims": "maas-kubevirt-identity-claims",
    "audit": "maas-kubevirt-audit-vm",
    "bmc": "maas-kubevirt-vm-bmc",
    "isolation": "maas-kubevirt-bmc-isolation",
    "rotations": "maas-kubevirt-credential-rotations",
    "route_isolation": "maas-kubevirt-route-isolation",
    "power_off": "maas-kubevirt-guest-power-off",
}
# kubevirtBMC (internal/controller/virtualmachinebmc/constant.go): every BMC pod carries this
# label, and listens for Redfish on this port behind its Service's port 80.
BMC_POD_LABEL = "kubevirt.io/virtualmachinebmc-name"
REDFISH_POD_PORT = 10080
# The NetworkPolicy generated in each opted-in namespace.
NETWORK_POLICY_NAME = "maas-kubevirt-bmc"

SEED_SECRET_FILE = "seed-secret.yaml"
KUSTOMIZATION_FILE = "kustomization.yaml"
# The reconciler's ServiceAccount, and the name of its Role and RoleBinding on the Lease.
RECONCILER_ACCOUNT = "maas-kubevirt-reconciler"
RECONCILER_RBAC_FILE = "reconciler-rbac.yaml"
# The rotations ConfigMap (identity.ROTATIONS_CONFIGMAP), rendered without data.
ROTATIONS_FILE = "credential-rotations.yaml"
# Warm pools (issue 42), rendered only with `pools`: the pools' own ServiceAccount (beside the
# reconciler's), its ClusterRole bound in each pool namespace, and the policy that admits from it
# nothing but the VMs pools.vm.manifest makes. Not in POLICY_NAMES: the default render has none.
POOLS_ACCOUNT = "maas-kubevirt-pools"
POOLS_POLICY = "maas-kubevirt-pools"
POOLS_RBAC_FILE = "pools-rbac.yaml"
POOLS_POLICY_FILE = "policy-pools.yaml"
# KubeMacPool's VM webhook records each MAC allocation on the VM in this annotation
# (pkg/webhook/mutatevirtualmachines in k8snetworkplumbingwg/kubemacpool), before validation.
KUBEMACPOOL_TRANSACTION_ANNOTATION = "kubemacpool.io/transaction-timestamp"
# Its finalizer, which releases the MAC when the VM goes (RuntimeObjectFinalizerName, same file).
KUBEMACPOOL_FINALIZER = "k8s.v1.cni.cncf.io/kubeMacPool"
# Output files. kustomize sorts the objects itself (namespaces, RBAC and Secrets before
# custom resources), so this order is only the order of the kustomization's list.
FILES = [
    "system-namespace.yaml",
    "rbac.yaml",
    RECONCILER_RBAC_FILE,
    POOLS_RBAC_FILE,
    ROTATIONS_FILE,
    SEED_SECRET_FILE,
    "policy-vm-identity.yaml",
    "policy-identity-claims.yaml",
    "policy-vm-audit.yaml",
    "policy-vm-bmc.yaml",
    "policy-bmc-isolation.yaml",
    "policy-route-isolation.yaml",
    "policy-credential-rotations.yaml",
    "policy-guest-power-off.yaml",
    POOLS_POLICY_FILE,
    EXAMPLE_NAMESPACE_FILE,
]


def kubernetes_example(values: dict) -> bool:
    """Whether the render holds the example namespace (kubernetes.example_namespace)."""
    return bool(values["kubernetes"]["example_namespace"])


_VM = "request.object.metadata.name"
_NS = "request.object.metadata.namespace"


def _jmespath_string(text: str) -> str:
    """A JMESPath raw string literal of text (values are DNS names or label keys: no quote)."""
    if "'" in text or "\\" in text:
        raise ValueError(f"cannot quote {text!r} into JMESPath")
    return f"'{text}'"


def uuid_jmespath(root: str = "request.object") -> str:
    """identity.smbios_uuid of the object at root: sha256_hex("<namespace>/<vm>") cut into a UUID."""
    return (
        "regex_replace_all('^(.{8})(.{4}).(.{3}).(.{3})(.{12}).*$', "
        f"sha256(join('/', [{root}.metadata.namespace, {root}.metadata.name])), "
        "'${1}-${2}-8${3}-8${4}-${5}')"
    )


UUID_JMESPATH = uuid_jmespath()
# The VM's credential generation in the bmc-secret rule: its key <vm>.<namespace> in the rotations
# ConfigMap (the `rotations` context entry holds that ConfigMap's data), '0' when absent. A
# nested variable: Kyverno substitutes the inner {{ }} into the JMESPath text first
# (loadVariable in pkg/engine/context/loaders/variable.go runs SubstituteAll on entry.Variable.JMESPath).
GENERATION_JMESPATH = (
    'rotations."{{ request.object.metadata.name }}.{{ request.object.metadata.namespace }}" || \'0\''
)
# identity.bmc_password: sha256_hex(seed + ":" + serial [+ ":" + generation])[0:32], serial =
# "<vm>.<namespace>"; ':0$' removed, so generation 0 hashes exactly what it did before rotation.
PASSWORD_JMESPATH = (
    f"truncate(sha256(regex_replace_all(':0$', join('', [seed, ':', {_VM}, '.', {_NS}, ':', generation]), '')), `32`)"
)
# identity.bmc_user: BMC_USER_PREFIX + sha256_hex(seed + ":user:" + serial [+ ":" + generation])[0:32].
# kubevirtBMC reads the user from the Secret's key `username` (bmcUserKey in
# internal/controller/virtualmachinebmc/controller.go, BMC_USERNAME in cmd/virtbmc/main.go).
USER_JMESPATH = (
    f"join('', [{_jmespath_string(identity.BMC_USER_PREFIX)}, "
    f"truncate(sha256(regex_replace_all(':0$', join('', [seed, ':user:', {_VM}, '.', {_NS}, ':', generation]), '')), `32`)])"
)
# kubevirtBMC names its Service <vm>-virtbmc: a DNS-1035 label, so <vm> is one of <= 55 chars.
BMC_NAME_REGEX = "^[a-z]([-a-z0-9]{0,53}[a-z0-9])?$"
BMC_NAME_MAX = 55
# <vm>.<namespace>.<domain> must fit 253 characters for every VM name kubevirtBMC serves and
# every namespace, so the generate rules need no precondition on the domain (which would make
# the domain immutable in them): 253 - 55 - 1 - 63 - 1.
DOMAIN_MAX = identity.HOST_MAX - BMC_NAME_MAX - 1 - identity.LABEL_MAX - 1
# A serial the commissioning script would read as a claim <vm>.<namespace>
# (identity.parse_serial), in any letter case and with surrounding blanks: RE2 syntax.
SERIAL_CLAIM_REGEX = (
    "(?i)^[[:space:]]*[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)+[[:space:]]*$"
)
# A UUID libvirt would read (hex digits, any hyphens, surrounding blanks) reduced to 32 hex
# digits; the derived form has version 8 and variant digit 8 (identity.smbios_uuid).
UUID_DERIVED_HEX_REGEX = "^[0-9a-f]{12}8[0-9a-f]{3}8[0-9a-f]{15}$"


def uuid_hex_jmespath(expression: str) -> str:
    """The UUID at expression as lower-case hex digits only ('' when absent)."""
    return f"to_lower(regex_replace_all('[-[:space:]]', {expression} || '', ''))"


# Where each kind that can carry SMBIOS keeps its firmware (KubeVirt's API types).
CLAIM_KINDS = [
    {"rule": "vm", "kind": "kubevirt.io/v1/VirtualMachine", "name": "VirtualMachine",
     "firmware": "spec.template.spec.domain.firmware"},
    {"rule": "vmi", "kind": "kubevirt.io/v1/VirtualMachineInstance", "name": "VirtualMachineInstance",
     "firmware": "spec.domain.firmware"},
    {"rule": "vmirs", "kind": "kubevirt.io/v1/VirtualMachineInstanceReplicaSet",
     "name": "VirtualMachineInstanceReplicaSet", "firmware": "spec.template.spec.domain.firmware"},
    {"rule": "vmpool", "kind": "pool.kubevirt.io/*/VirtualMachinePool", "name": "VirtualMachinePool",
     "firmware": "spec.virtualMachineTemplate.spec.template.spec.domain.firmware"},
]

# Characters PyYAML refuses in a stream, or reads as line breaks inside a quoted scalar.
_YAML_UNSAFE = re.compile("[^\x09\x0a\x0d\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd\U00010000-\U0010ffff]")
_KYVERNO_SYNTAX = ("{{", "$(")


def _yaml_escape(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def quote(value: Any) -> str:
    """A YAML double-quoted scalar that reads back as exactly ``value`` (a string)."""
    if not isinstance(value, str):
        raise TypeError(f"only strings are quoted into templates, not {type(value).__name__}")
    return _YAML_UNSAFE.sub(_yaml_escape, json.dumps(value, ensure_ascii=False))


def _b64(value: str) -> str:
    return base64.b64encode(value.encode("utf-8")).decode("ascii")


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(data_dir() / "templates")),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
    )
    env.filters["q"] = quote
    env.filters["b64"] = _b64
    return env


def allowlist_annotation(ingress: dict) -> str:
    """The annotation that carries the source allowlist for the configured Ingress class."""
    return ingress["allowlist_annotation"] or nginx_allowlist_annotations(ingress)[0]


def seed_version(seed: str) -> str:
    """A one-way, domain-separated digest naming a seed; it reveals nothing about the seed."""
    return hashlib.sha256(f"maas-kubevirt seed version\0{seed}".encode("utf-8")).hexdigest()[:16]


def check_values(values: dict) -> None:
    """Object-level checks beyond values.py: raise ValuesError for values giving invalid objects."""
    problems: list[str] = []
    ingress = values["ingress"]
    domain = values["redfish"]["domain"]
    if len(domain) > DOMAIN_MAX:
        problems.append(
            f"redfish.domain: expected at most {DOMAIN_MAX} characters (so that <vm>.<namespace>.<domain> "
            f"fits 253 for every VM name kubevirtBMC serves), found {len(domain)}"
        )
    if ingress["tls_secret"] and ingress["cluster_issuer"]:
        problems.append(
            "ingress.cluster_issuer: expected an empty string when ingress.tls_secret is set "
            f"(one source of TLS certificates), found {ingress['cluster_issuer']!r}"
        )
    managed = {ALLOWLIST_ANNOTATION, DEPRECATED_ALLOWLIST_ANNOTATION, *nginx_allowlist_annotations(ingress),
               allowlist_annotation(ingress), CLUSTER_ISSUER_ANNOTATION}
    for key, value in ingress["annotations"].items():
        if key in managed:
            problems.append(
                f"ingress.annotations[{key!r}]: expected an annotation maas-kubevirt does not set itself "
                "(use ingress.source_ranges / ingress.cluster_issuer), found it set"
            )
        for text, what in ((key, "key"), (value, "value")):
            if isinstance(text, str) and any(token in text for token in _KYVERNO_SYNTAX):
                problems.append(
                    f"ingress.annotations[{key!r}]: expected a {what} without '{{{{' or '$(' "
                    f"(Kyverno would read it as a variable), found {text!r}"
                )
    if values["kubernetes"]["opt_in_label"] == KUBEMACPOOL_LABEL:
        problems.append(
            f"kubernetes.opt_in_label: expected a label other than KubeMacPool's {KUBEMACPOOL_LABEL}, "
            f"found {KUBEMACPOOL_LABEL!r}"
        )
    if problems:
        raise ValuesError(problems)


def server_alias_list_jmespath(prefix: str = NGINX_ANNOTATION_PREFIX) -> str:
    """The Ingress's server-alias (under the controller's annotation prefix) split on commas, [] when none."""
    alias = f'request.object.metadata.annotations."{prefix}{SERVER_ALIAS_SUFFIX}"'
    return f"{alias} && split({alias}, ',') || `[]`"


def own_alias_regex_jmespath(domain: str) -> str:
    """The RE2 pattern of an alias the Ingress's own namespace may serve (ALIAS_HOST_LABELS_REGEX)."""
    tail = "[.]" + "[.]".join(domain.split(".")) + "[[:space:]]*$"
    return f"join('', [{_jmespath_string(ALIAS_HOST_LABELS_REGEX)}, {_NS}, {_jmespath_string(tail)}])"


# kube-controller-manager's endpoint controllers, as ServiceAccounts in kube-system when it runs with
# --use-service-account-credentials (pkg/controller/.../*, the names in cmd/kube-controller-manager/names).
ENDPOINT_CONTROLLER_ACCOUNTS = ("endpoint-controller", "endpointslice-controller", "endpointslicemirroring-controller")
VIRTBMC_SUFFIX = "-virtbmc"
_OCTET = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"


def _octets(low: int, high: int) -> str:
    """An RE2 group for the decimal octets low..high, after any leading zeros."""
    if (low, high) == (0, 255):
        return "0*" + _OCTET
    return "0*(" + "|".join(str(n) for n in range(low, high + 1)) + ")"


def ipv4_networks_regex(cidrs: list[str]) -> str:
    """An RE2 pattern (Python's re too) for an address, as an Endpoints or EndpointSlice may hold it,
    in any of the IPv4 networks ``cidrs``; "" without any. As the API server reads an address when it
    is lenient (netutils.ParseIPSloppy): leading zeros in an octet are decimal, and an IPv4 address
    may follow IPv6 text ("::ffff:10.244.1.5", which Go's proxies dial as IPv4), so both match."""
    import ipaddress

    alternatives = []
    for cidr in cidrs:
        network = ipaddress.IPv4Network(cidr)
        first, last = network.network_address.packed, network.broadcast_address.packed
        alternatives.append("[.]".join(_octets(first[i], last[i]) for i in range(4)))
    if not alternatives:
        return ""
    return "^([0-9A-Fa-f:]*:)?(" + "|".join(alternatives) + ")$"


def zone_claim_jmespath(hostname: str, domain: str) -> str:
    """True when hostname (a JMESPath expression) is under domain, or a wildcard that covers it."""
    host = f"to_lower({hostname})"
    return (f"ends_with({host}, {_jmespath_string('.' + domain)}) || {host} == {_jmespath_string(domain)} || "
            f"starts_with({host}, '*.') && ends_with({_jmespath_string('.' + domain)}, trim_prefix({host}, '*'))")


def gateway_ref_jmespath(ref: str, values: dict, listener: bool = True) -> str:
    """True when the parent reference at ref (a JMESPath expression) names the site's BMC Gateway (and listener)."""
    gateway = values["gateway"]
    checks = [
        f"({ref}.group || {_jmespath_string(exposure_module.GATEWAY_API_GROUP)}) == {_jmespath_string(exposure_module.GATEWAY_API_GROUP)}",
        f"({ref}.kind || 'Gateway') == 'Gateway'",
        f"({ref}.namespace || {_NS}) == {_jmespath_string(gateway['namespace'])}",
        f"({ref}.name || '') == {_jmespath_string(gateway['name'])}",
    ]
    if gateway["section_name"] and listener:
        section = _jmespath_string(gateway["section_name"])
        checks.append(f"({ref}.sectionName || {section}) == {section}")
    return " && ".join(checks)


# Traefik's kinds (traefik.io, any version) the route-isolation policy covers with gateway.traefik_crds.
TRAEFIK_ROUTE_KINDS = ("traefik.io/*/IngressRoute", "traefik.io/*/IngressRouteTCP")
TRAEFIK_SERVICE_KINDS = (*TRAEFIK_ROUTE_KINDS, "traefik.io/*/TraefikService")
# In a Traefik rule (its `match`), RE2: a host matcher (Host, HostSNI, v2's HostHeader), and a
# regexp host matcher (HostRegexp, HostSNIRegexp), whose pattern Kyverno cannot bound. Traefik reads
# matcher names in any case.
TRAEFIK_HOST_MATCHER_REGEX = "(?i)(^|[^a-z0-9])host(sni|header)?[[:space:]]*[(]"
TRAEFIK_HOST_REGEXP_REGEX = "(?i)host(sni)?regexp"
# A '*' among a host matcher's arguments: HostSNI(`*`) catches every TLS connection without SNI (MAAS's).
TRAEFIK_WILDCARD_HOST_REGEX = "(?i)host(sni|header)?[[:space:]]*[(][^)]*[*]"


def _traefik_context(values: dict) -> dict[str, Any]:
    """What the Traefik rules of the route-isolation policy read from the values (gateway.traefik_crds)."""
    match = "element.match || ''"
    namespace = "request.object.metadata.namespace"
    return {
        "traefik_crds": traefik_crds_served(values),
        "traefik_route_kinds": TRAEFIK_ROUTE_KINDS,
        "traefik_service_kinds": TRAEFIK_SERVICE_KINDS,
        "traefik_match_names_a_host": "{{ regex_match(" + _jmespath_string(TRAEFIK_HOST_MATCHER_REGEX) + f", {match}) }}}}",
        # An alternative or a negation may reopen what a Host() closes; a backslash is an escape in a
        # double-quoted argument ("\x62mc..."), which contains() would not see through.
        "traefik_match_unreadable": (f"{{{{ contains({match}, '||') || contains({match}, '!') || "
                                     f"contains({match}, `\"\\\\\"`) || regex_match("
                                     + _jmespath_string(TRAEFIK_HOST_REGEXP_REGEX) + f", {match}) }}}}"),
        "traefik_match_claims_bmc_host": (f"{{{{ contains(to_lower({match}), {_jmespath_string(values['redfish']['domain'])}) || "
                                          "regex_match(" + _jmespath_string(TRAEFIK_WILDCARD_HOST_REGEX) + f", {match}) }}}}"),
        # Every service an IngressRoute(TCP) route or a TraefikService (weighted, mirroring) names.
        "traefik_services": ("[request.object.spec.routes[].services[] || `[]`, request.object.spec.weighted.services || `[]`, "
                             "request.object.spec.mirroring.mirrors || `[]`, "
                             "request.object.spec.mirroring && [request.object.spec.mirroring] || `[]`][]"),
        "traefik_service_to_another_namespaces_bmc": (
            f"{{{{ (element.namespace || {namespace}) != {namespace} && "
            f"ends_with(to_lower(element.name || ''), {_jmespath_string(VIRTBMC_SUFFIX)}) }}}}"),
    }


def _route_isolation_context(values: dict) -> dict[str, Any]:
    domain = values["redfish"]["domain"]
    kinds = exposure_module.isolated_route_kinds(values)
    matches = exposure_module.ROUTE_KIND_MATCH
    background = f"system:serviceaccount:{values['kubernetes']['kyverno_namespace']}:kyverno-background-controller"
    endpoints_service = ("request.object.kind == 'EndpointSlice' && (request.object.metadata.labels.\"kubernetes.io/service-name\" || '') "
                         "|| request.object.metadata.name")
    return {
        "route_kinds": kinds,
        "route_kinds_with_hostnames": [matches[k][0] for k in kinds if matches[k][1] is True],
        "catch_all_kinds": [matches[k][0] for k in kinds if matches[k][1] is not None],
        "listener_set_kinds": [matches[k][0] for k in kinds if matches[k][1] is None],
        "gateway_api_group": exposure_module.GATEWAY_API_GROUP,
        "endpoint_controller_accounts": ENDPOINT_CONTROLLER_ACCOUNTS,
        "pod_network_regex": ipv4_networks_regex(values["kubernetes"]["pod_cidrs"]),
        "bmc_pod_ips_jmespath": f'items[?metadata.labels."{BMC_POD_LABEL}"].status.podIPs[].ip || `[]`',
        "externalname_to_virtbmc": "{{ regex_match('(?i)^[^.]+" + VIRTBMC_SUFFIX + "([.]|$)', "
                                   "request.object.spec.externalName || '') }}",
        "externalname_address": "{{ trim(to_lower(request.object.spec.externalName || ''), '.') }}",
        "endpoints_of_virtbmc": "{{ ends_with(" + endpoints_service + ", " + _jmespath_string(VIRTBMC_SUFFIX) + ") }}",
        "endpoint_addresses": ("[request.object.subsets[].addresses[].ip || `[]`, request.object.subsets[].notReadyAddresses[].ip "
                               "|| `[]`, request.object.endpoints[].addresses[] || `[]`][]"),
        "claims_bmc_zone": "{{ " + zone_claim_jmespath("element", domain) + " }}",
        "claims_bmc_zone_of": lambda expression: "{{ " + zone_claim_jmespath(expression, domain) + " }}",
        "generated_own_host": "{{ request.userInfo.username == " + _jmespath_string(background)
        + " && !starts_with(element, '*') && ends_with(to_lower(element), join('', ['.', " + _NS + ", "
        + _jmespath_string("." + domain) + "])) }}",
        # Any listener of the BMC Gateway, whatever gateway.section_name says: each serves BMC hosts.
        "parent_is_bmc_gateway": "{{ " + gateway_ref_jmespath("element", values, listener=False) + " }}",
        "listener_set_on_bmc_gateway": "{{ " + gateway_ref_jmespath("request.object.spec.parentRef", values, listener=False) + " }}",
        "listener_in_bmc_domain": "{{ ends_with(to_lower(element.hostname || ''), " + _jmespath_string("." + domain) + ") }}",
        "background_controller": background,
        **_traefik_context(values),
        "grant_reaches_virtbmc": "{{ (element.name || '') == '' || ends_with(element.name || '', " + _jmespath_string(VIRTBMC_SUFFIX) + ") }}",
    }


# What a pool VM's metadata may hold at validation: what pools.vm.manifest writes, what the API
# server sets before validating a create (uid, creationTimestamp, generation, managedFields), and
# KubeMacPool's annotation and finalizer (its webhook mutates before any validation).
POOL_VM_METADATA_KEYS = ("name", "namespace", "labels", "annotations", "finalizers",
                         "uid", "creationTimestamp", "generation", "managedFields")
_POOL_VM = "request.object"


def _json_literal(value: Any) -> str:
    """A JMESPath JSON literal (backticks) of value; values are validated names and quantities. One
    level of braces at most: Kyverno's variable syntax ends a {{ }} at the first nested '}}'
    (RegexVariables in pkg/engine/variables/regex), and would judge a cut-off expression."""
    text = json.dumps(value, sort_keys=True)
    if "`" in text or "\\" in text or "}}" in text:
        raise ValueError(f"cannot quote {value!r} into JMESPath")
    return f"`{text}`"


def pool_vm_name_regex(pool: str) -> str:
    """RE2 of identity.is_pool_vm_name for this pool: <pool>-<rest>, one DNS label."""
    return identity.pool_vm_name_pattern(pool)


def _keys_within(path: str, allowed: list[str] | tuple[str, ...], why: str) -> dict:
    """A deny condition: the object at path holds a key that is not allowed."""
    return {"why": why, "key": f"{{{{ keys({path} || `{{}}`) }}}}", "operator": "AnyNotIn", "value": list(allowed)}


def _not(expression: str, why: str) -> dict:
    """A deny condition: the JMESPath expression is false."""
    return {"why": why, "key": f"{{{{ {expression} }}}}", "operator": "Equals", "value": False}


def _whole(path: str, number: int) -> str:
    """A JMESPath test that the integer at path is number, compared as text. In Kyverno v1.19.1's
    admission webhook, == against a number literal found the pool VM's own cores and bootOrders
    unequal, where `kyverno apply` finds them equal (tests/test_pools_maas_tier.py refused every
    pool VM until then); to_string writes both sides alike."""
    return f"to_string({path}) == '{int(number)}'"


def _not_quantity(path: str, quantity: str, why: str) -> dict:
    """A deny condition: the quantity at path is not ``quantity`` (Kyverno's Equals parses both as
    quantities, so the form KubeVirt's mutator writes back, 4Gi for 4096Mi, still matches)."""
    return {"why": why, "key": f"{{{{ {path} || '' }}}}", "operator": "NotEquals", "value": quantity}


def pool_vm_conditions(pool: dict) -> list[dict]:
    """The deny conditions of one pool's rule: any deviation from pools.vm.manifest for that pool,
    beyond what the mutating webhooks add before validation (Kyverno's identity stamp, KubeMacPool's
    MAC, KubeVirt's machine type and architecture)."""
    o, name = _POOL_VM, f"{_POOL_VM}.metadata.name"
    dvt = f"{o}.spec.dataVolumeTemplates[0]"
    template = f"{o}.spec.template"
    spec = f"{template}.spec"
    domain = f"{spec}.domain"
    interface = f"{domain}.devices.interfaces[0]"
    volume = f"{spec}.volumes[0]"
    disk_name = f"join('-', [{name}, {_jmespath_string(pool_vm.DISK)}])"
    serial = f"join('.', [{name}, {o}.metadata.namespace])"
    pool_label = {pool_spec.POOL_LABEL: pool["name"]}
    return [
        _not(f"regex_match({_jmespath_string(pool_vm_name_regex(pool['name']))}, {name})", "the name: <pool>-<rest>, one DNS label"),
        _keys_within(f"{o}.metadata", POOL_VM_METADATA_KEYS, "no ownerReferences, generateName or other metadata"),
        _not(f"{o}.metadata.labels == {_json_literal({**pool_label, pool_spec.MANAGED_BY[0]: pool_spec.MANAGED_BY[1]})}",
             "exactly the pool's label and the managed-by label"),
        _keys_within(f"{o}.metadata.annotations", (pool_spec.PROOF_ANNOTATION, KUBEMACPOOL_TRANSACTION_ANNOTATION),
                     "the proof annotation, and KubeMacPool's"),
        _not(f"regex_match('^[0-9a-f]{{32}}$', {o}.metadata.annotations.\"{pool_spec.PROOF_ANNOTATION}\" || '')",
             "a proof of the shape identity.pool_vm_proof gives (only the reconciler can compute its value)"),
        _not(f"length({o}.metadata.finalizers || `[]`) == `0` || {o}.metadata.finalizers == {_json_literal([KUBEMACPOOL_FINALIZER])}",
             "no finalizer but KubeMacPool's"),
        _keys_within(f"{o}.spec", ("runStrategy", "dataVolumeTemplates", "template"), "no instancetype, preference or other spec"),
        _not(f"{o}.spec.runStrategy == 'Once'", "runStrategy Once"),
        _not(f"length({o}.spec.dataVolumeTemplates || `[]`) == `1`", "exactly one DataVolume template"),
        _keys_within(dvt, ("metadata", "spec"), "a template of metadata and spec alone"),
        # KubeVirt's mutator writes the templates back through Go types: creationTimestamp null.
        _keys_within(f"{dvt}.metadata", ("name", "creationTimestamp"), "no labels or annotations on the DataVolume (CDI reads its own)"),
        _not(f"{dvt}.metadata.name == {disk_name}", "the DataVolume <vm>-root"),
        _keys_within(f"{dvt}.spec", ("source", "storage"), "no sourceRef, pvc, contentType, checkpoints or preallocation"),
        _not(f"keys({dvt}.spec.source || `{{}}`) == ['blank'] && {dvt}.spec.source.blank == `{{}}`",
             "a blank source: a clone, pvc, http, registry, upload or snapshot source would read data from elsewhere"),
        _keys_within(f"{dvt}.spec.storage", ("storageClassName", "resources"), "no accessModes, volumeMode, selector, volumeName or dataSource"),
        _not(f"{dvt}.spec.storage.storageClassName == {_jmespath_string(pool['storage_class'])}", "the pool's storage class"),
        _keys_within(f"{dvt}.spec.storage.resources", ("requests",), "requests alone"),
        _keys_within(f"{dvt}.spec.storage.resources.requests", ("storage",), "storage alone"),
        _not_quantity(f"{dvt}.spec.storage.resources.requests.storage", pool["disk"], "the pool's disk size"),
        _keys_within(template, ("metadata", "spec"), "a template of metadata and spec alone"),
        _keys_within(f"{template}.metadata", ("labels", "creationTimestamp"),
                     "no annotations on the instance: hooks.kubevirt.io/hookSidecars would run any image beside it"),
        _not(f"{template}.metadata.labels == {_json_literal(pool_label)}", "the instance labelled with its pool alone"),
        _keys_within(spec, ("domain", "networks", "volumes", "architecture"),
                     "no accessCredentials, nodeSelector, affinity, tolerations, hostname or other instance setting"),
        _keys_within(domain, ("cpu", "resources", "devices", "firmware", "machine"), "no other domain setting"),
        _not(f"keys({domain}.cpu || `{{}}`) == ['cores'] && {_whole(f'{domain}.cpu.cores', pool['cores'])}",
             "the pool's cores alone"),
        _keys_within(f"{domain}.resources", ("requests",), "requests alone"),
        _keys_within(f"{domain}.resources.requests", ("memory",), "memory alone"),
        _not_quantity(f"{domain}.resources.requests.memory", pool["memory"], "the pool's memory"),
        # Kyverno's identity stamp (policy-vm-identity.yaml) sets these two, and only to these values.
        _keys_within(f"{domain}.firmware", ("serial", "uuid"), "no firmware but the stamped serial and UUID"),
        _not(f"({domain}.firmware.serial || {serial}) == {serial}", "the VM's own serial, if any"),
        _not(f"({domain}.firmware.uuid || {UUID_JMESPATH}) == {UUID_JMESPATH}", "the VM's own derived UUID, if any"),
        # KubeVirt's mutator sets the machine type (vm-mutator.go, setDefaultMachineType).
        _keys_within(f"{domain}.machine", ("type",), "a machine type alone"),
        _keys_within(f"{domain}.devices", ("interfaces", "disks"),
                     "no hostDevices, gpus, filesystems, watchdog, tpm or other device"),
        _not(f"length({domain}.devices.interfaces || `[]`) == `1`", "exactly one interface"),
        # KubeMacPool gives the interface its MAC before validation.
        _keys_within(interface, ("name", "bridge", "bootOrder", "macAddress"), "no other interface setting"),
        _not(f"{interface}.name == {_jmespath_string(pool_vm.INTERFACE)} && {interface}.bridge == `{{}}` && {_whole(f'{interface}.bootOrder', 1)}",
             "a bridge on the PXE network, first to boot"),
        _not(f"length({domain}.devices.disks || `[]`) == `1`", "exactly one disk"),
        _keys_within(f"{domain}.devices.disks[0]", ("name", "disk", "bootOrder"), "no other disk setting"),
        _not(f"{domain}.devices.disks[0].name == {_jmespath_string(pool_vm.DISK)} && "
             f"{domain}.devices.disks[0].disk == {_json_literal({'bus': 'virtio'})} && "
             f"{_whole(f'{domain}.devices.disks[0].bootOrder', 2)}",
             "a virtio disk, second to boot"),
        _not(f"length({spec}.networks || `[]`) == `1`", "exactly one network"),
        _keys_within(f"{spec}.networks[0]", ("name", "multus"), "a Multus network alone"),
        _not(f"{spec}.networks[0].name == {_jmespath_string(pool_vm.INTERFACE)} && "
             f"{spec}.networks[0].multus == {_json_literal({'networkName': pool['network']})}", "the pool's Multus network"),
        _not(f"length({spec}.volumes || `[]`) == `1`", "exactly one volume"),
        _keys_within(volume, ("name", "dataVolume"), "the DataVolume alone: no hostDisk, containerDisk, cloudInit or other source"),
        _keys_within(f"{volume}.dataVolume", ("name",), "the DataVolume by name alone"),
        _not(f"{volume}.name == {_jmespath_string(pool_vm.DISK)} && {volume}.dataVolume.name == {disk_name}",
             "the volume of the one DataVolume template"),
    ]


def _pools_context(values: dict) -> dict[str, Any]:
    """What the pools' RBAC and policy read from the values (``pools``), rendered only with pools."""
    pools = values["pools"]
    return {
        "pools_account": POOLS_ACCOUNT,
        "pools_policy": POOLS_POLICY,
        "pool_label": pool_spec.POOL_LABEL,
        "pool_namespace_label": pool_spec.NAMESPACE_LABEL,
        # Each namespace once, in the order of the values.
        "pool_namespaces": list(dict.fromkeys(pool["namespace"] for pool in pools)),
        "pool_refs": [f"{pool['namespace']}/{pool['name']}" for pool in pools],
        "pool_vm_conditions": pool_vm_conditions,
        "pool_vm_name_regex": pool_vm_name_regex,
        "pool_suffix": "[a-z0-9]([-a-z0-9]*[a-z0-9])?",
    }


def _context(values: dict, seed: str | None) -> dict[str, Any]:
    redfish, kubernetes, ingress = values["redfish"], values["kubernetes"], values["ingress"]
    annotations = {allowlist_annotation(ingress): ",".join(ingress["source_ranges"])}
    tls_secret_name = ingress["tls_secret"]
    if ingress["cluster_issuer"]:
        annotations[CLUSTER_ISSUER_ANNOTATION] = ingress["cluster_issuer"]
        tls_secret_name = "{{ " + _VM + " }}-bmc-tls"
    annotations.update(ingress["annotations"])
    files = [name for name in FILES if (seed is not None or name != SEED_SECRET_FILE)
             and (kubernetes_example(values) or name != EXAMPLE_NAMESPACE_FILE)
             and (values["pools"] or name not in (POOLS_RBAC_FILE, POOLS_POLICY_FILE))]
    if bmc_proxy.FILE in exposure_context(values)["exposure_files"]:
        files.insert(files.index("policy-vm-identity.yaml"), bmc_proxy.FILE)
    domain = redfish["domain"]
    label = kubernetes["opt_in_label"]
    # The controller's --annotations-prefix: the snippet and alias rules read annotations under it.
    prefix = ingress["annotation_prefix"].rstrip("/") + "/"
    return {
        **values,
        "seed": seed,
        "category": CATEGORY,
        "kyverno_version": KYVERNO_MIN_VERSION,
        "kubernetes_version": KUBERNETES_MIN_VERSION,
        "policy_names": POLICY_NAMES,
        "example_namespace": EXAMPLE_NAMESPACE,
        "opted_in_annotation": OPTED_IN_ANNOTATION,
        "seed_version_annotation": SEED_VERSION_ANNOTATION,
        "seed_version": seed_version(seed) if seed is not None else "",
        "uuid_jmespath": UUID_JMESPATH,
        "target_uuid_jmespath": uuid_jmespath("target"),
        "own_uuid_hex_jmespath": f"regex_replace_all('-', {UUID_JMESPATH}, '')",
        "uuid_hex_jmespath": uuid_hex_jmespath,
        "serial_claim_regex": SERIAL_CLAIM_REGEX,
        "uuid_derived_hex_regex": UUID_DERIVED_HEX_REGEX,
        "claim_kinds": CLAIM_KINDS,
        "password_jmespath": "{{ base64_encode(" + PASSWORD_JMESPATH + ") }}",
        "user_jmespath": "{{ base64_encode(" + USER_JMESPATH + ") }}",
        "bmc_name_check": "{{ regex_match('" + BMC_NAME_REGEX + "', " + _VM + ") }}",
        "old_opt_in_label": '{{ request.oldObject.metadata.labels."' + label + "\" || '' }}",
        "host_template": "{{ " + _VM + " }}.{{ " + _NS + " }}." + domain,
        "in_own_zone": "{{ ends_with(to_lower(element), join('', ['.', " + _NS + ", "
        + _jmespath_string("." + domain) + "])) }}",
        "server_alias_annotation": prefix + SERVER_ALIAS_SUFFIX,
        "server_alias_list": server_alias_list_jmespath(prefix),
        "own_alias_check": "{{ regex_match(" + own_alias_regex_jmespath(domain) + ", element) }}",
        "snippet_count": "{{ length(keys(request.object.metadata.annotations || `{}`)[?starts_with(@, "
        + _jmespath_string(prefix) + ") && ends_with(@, " + _jmespath_string(SNIPPET_SUFFIX)
        + ")]) }}",
        "nginx_annotation_prefix": prefix,
        "ingress_without_class": "{{ (request.object.spec.ingressClassName || '') == '' && "
        "(request.object.metadata.annotations.\"" + LEGACY_INGRESS_CLASS_ANNOTATION + "\" || '') == '' }}",
        "snippet_suffix": SNIPPET_SUFFIX,
        "seed_url_path": f"/api/v1/namespaces/{kubernetes['system_namespace']}/secrets/{kubernetes['seed_secret']}",
        "rotations_configmap": identity.ROTATIONS_CONFIGMAP,
        "rotations_url_path": f"/api/v1/namespaces/{kubernetes['system_namespace']}/configmaps/{identity.ROTATIONS_CONFIGMAP}",
        "generation_jmespath": GENERATION_JMESPATH,
        "generation_annotation": GENERATION_ANNOTATION,
        "serial_key_regex": SERIAL_KEY_REGEX,
        "generation_regex": GENERATION_REGEX,
        "reconciler_generation_max": identity.RECONCILER_GENERATION_MAX,
        "generation_total": generation_total_jmespath,
        "target_generation_jmespath": 'request.object.data."{{ target.metadata.name }}.{{ target.metadata.namespace }}" || \'0\'',
        "ingress_annotations": annotations,
        "bmc_pod_label": BMC_POD_LABEL,
        "redfish_pod_port": REDFISH_POD_PORT,
        "network_policy_name": NETWORK_POLICY_NAME,
        "legacy_ingress_class_jmespath": '{{ request.object.metadata.annotations."'
        + LEGACY_INGRESS_CLASS_ANNOTATION + "\" || '' }}",
        "tls_secret_name": tls_secret_name,
        "files": {"ordered": files, "seed": seed is not None},
        "reconciler_account": RECONCILER_ACCOUNT,
        "lease_namespace": values["reconciler"]["lease"]["namespace"] or kubernetes["system_namespace"],
        **exposure_context(values),
        **_route_isolation_context(values),
        **_pools_context(values),
    }


class _StrictLoader(yaml.SafeLoader):
    """safe_load that refuses duplicate mapping keys (a template bug, not a value problem)."""


def _mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict:
    keys = [loader.construct_object(key, deep=True) for key, _ in node.value]
    duplicates = {k for k in keys if keys.count(k) > 1}
    if duplicates:
        raise yaml.constructor.ConstructorError(None, None, f"duplicate keys {sorted(map(str, duplicates))}", node.start_mark)
    return loader.construct_mapping(node, deep=True)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def parse(text: str) -> list[Any]:
    """The documents of a rendered file (duplicate keys refused); None documents dropped."""
    return [doc for doc in yaml.load_all(text, Loader=_StrictLoader) if doc is not None]


def render_kubernetes(values: dict, seed: str | None) -> dict[str, str]:
    """Kubernetes manifests by file name, in apply order, kustomization.yaml last.

    ``seed=None`` renders the reference tree (kyverno/): everything but the seed Secret.
    Raises ValuesError for values that would give invalid objects.
    """
    check_values(values)
    if seed is not None and (not isinstance(seed, str) or not seed):
        raise ValuesError(["seed.file: expected a non-empty seed, found an empty one"])
    env = _environment()
    context = _context(values, seed)
    rendered: dict[str, str] = {}
    for name in context["files"]["ordered"] + [KUSTOMIZATION_FILE]:
        text = env.get_template(name + ".j2").render(context)
        try:
            documents = parse(text)
        except yaml.YAMLError as error:  # a template bug: values cannot cause it
            raise RuntimeError(f"rendered {name} is not valid YAML: {error.__class__.__name__}") from None
        if not documents or not all(isinstance(doc, dict) for doc in documents):
            raise RuntimeError(f"rendered {name} does not hold YAML mappings")
        rendered[name] = text
    return rendered


def objects(manifests: dict[str, str]) -> list[dict]:
    """Every Kubernetes object of a render (kustomization.yaml excluded)."""
    return [doc for name, text in manifests.items() if name != KUSTOMIZATION_FILE for doc in parse(text)]


def _immutable_generate_parts(policy: dict) -> set[str]:
    """Each generate rule of a policy without its generate block, as canonical JSON.

    Kyverno refuses to change these once a rule synchronises (pkg/validation/policy/generate.go:
    the rule minus generate is hashed, and the new policy's hashes must include the old ones).
    """
    return {
        json.dumps({k: v for k, v in rule.items() if k != "generate"}, sort_keys=True)
        for rule in policy.get("spec", {}).get("rules", [])
        if "generate" in rule
    }


def _synchronises(policy: dict) -> bool:
    return any(rule.get("generate", {}).get("synchronize") for rule in policy.get("spec", {}).get("rules", []))


def cluster_policies(directory: str | Path) -> dict[str, dict]:
    """The ClusterPolicies `kubectl apply -k directory` applies, by name ({} when none yet)."""
    directory = Path(directory)
    try:
        listed = yaml.safe_load((directory / KUSTOMIZATION_FILE).read_text(encoding="utf-8"))["resources"]
        paths = [directory / name for name in listed if isinstance(name, str) and "/" not in name]
    except (OSError, UnicodeDecodeError, yaml.YAMLError, TypeError, KeyError):
        paths = sorted(directory.glob("policy-*.yaml"))
    found: dict[str, dict] = {}
    for path in paths:
        try:
            documents = parse(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
        for doc in documents:
            if isinstance(doc, dict) and doc.get("kind") == "ClusterPolicy":
                found[doc.get("metadata", {}).get("name", "")] = doc
    return found


def policies_to_recreate(previous: dict[str, dict], current: dict[str, dict]) -> list[str]:
    """Names of the policies Kyverno would refuse to update from previous to current."""
    return sorted(
        name for name, old in previous.items()
        if name in current and _synchronises(old)
        and not _immutable_generate_parts(old) <= _immutable_generate_parts(current[name])
    )


def before_rotations(policy: dict) -> bool:
    """True for a BMC policy rendered before credential generations (no `rotations` context entry)."""
    for rule in policy.get("spec", {}).get("rules", []):
        if rule.get("name") == "bmc-secret":
            return not any(entry.get("name") == "rotations" for entry in rule.get("context") or [])
    return False


def keeps_downstream(policy: dict) -> bool:
    """True when deleting the policy leaves its generated objects (orphanDownstreamOnPolicyDelete)."""
    return all(rule["generate"].get("orphanDownstreamOnPolicyDelete") is True
               for rule in policy.get("spec", {}).get("rules", []) if "generate" in rule)


def recreate_procedure(names: list[str], retired: list[str], kustomize_dir: str | Path,
                       previous: dict[str, dict]) -> str:
    """What render prints when the render cannot be applied with `kubectl apply -k` alone."""
    lines = []
    if names:
        lines.append(
            "Kyverno cannot update " + ", ".join(names) + " in place: the change reaches a part of a "
            "synchronised generate rule that Kyverno keeps immutable (its match, which holds the "
            "opt-in label, or its context, which names the seed Secret and the rotations ConfigMap). "
            "`kubectl apply -k` alone would be refused."
        )
    if any(before_rotations(previous[name]) for name in names):
        lines.append(
            "This is the upgrade to per-VM credential generations: the bmc-secret rule now also reads "
            f"ConfigMap {identity.ROTATIONS_CONFIGMAP} (which `kubectl apply -k` creates, empty) and "
            "derives each VM's user and password with its generation there. Every VM starts at "
            "generation 0, which derives exactly the user and password it has now: the Secrets gain only "
            f"the annotation {GENERATION_ANNOTATION}: \"0\", and MAAS needs nothing. Do it in one go, "
            "and apply right after the delete."
        )
    if retired:
        lines.append("This version no longer has " + ", ".join(retired) + "; `kubectl apply -k` does not remove it.")
    lines.append("Delete, then apply:")
    lines += [f"  kubectl delete clusterpolicy {name}" for name in names + retired]
    lines.append(f"  kubectl apply -k {kustomize_dir}")
    if all(keeps_downstream(previous[name]) for name in names + retired):
        lines.append(
            "The generated Secrets, VirtualMachineBMCs, Ingresses and NetworkPolicies stay in place "
            "while the policy is gone (orphanDownstreamOnPolicyDelete), and the new policy adopts and "
            "updates those of the VMs and namespaces it matches (generateExisting). Those of VMs it no "
            "longer matches stay as they are until their VM is deleted."
        )
    else:
        lines.append(
            "The policy in the cluster was rendered without orphanDownstreamOnPolicyDelete: "
            "deleting it deletes every generated Secret, VirtualMachineBMC, Ingress and NetworkPolicy, and the "
            "new policy generates them again (generateExisting). MAAS cannot reach the BMCs in "
            "between."
        )
    return "\n".join(lines)


def write_reference(directory: str | Path, values: dict | None = None) -> list[Path]:
    """Write the reference render (no seed Secret) of values (default: the defaults) to directory."""
    from maas_kubevirt.values import load_values

    manifests = render_kubernetes(values if values is not None else load_values(None), None)
    directory = Path(directory)
    for stale in directory.glob("*.yaml"):
        if stale.name not in manifests:
            stale.unlink()
    return [write_atomic(directory / name, text) for name, text in manifests.items()]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m maas_kubevirt.policies DIRECTORY", file=sys.stderr)
        return 2
    for path in write_reference(args[0]):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
