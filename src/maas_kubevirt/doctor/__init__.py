"""``maas-kubevirt doctor``: check a whole site (MAAS, the cluster, the network) and say how to fix it.

Each check gives one row: its name, ok / warn / fail / skip, what it found and the exact fix.
The checks themselves are pure functions over what MAAS, the API server and the local system
answer, one module per family (:mod:`.maas`, :mod:`.cluster` with the exposure's rows in
:mod:`.gateway`, the BMC proxy's in :mod:`.bmc_proxy`, the warm pools' in :mod:`.pools`,
:mod:`.network`; what the cluster's families read alike in :mod:`.inventory`); ``run`` gathers
those answers (read-only everywhere) and ``main`` prints them as a table, JSON or YAML.
Exit status: 0 when nothing fails, 1 otherwise, 2 for usage or configuration errors.

Secrets: the seed, the BMC passwords and the API key are compared (in constant time, or by
SHA-256 digest) and never printed; the seed Secret's value never leaves :mod:`kube`.
"""

from __future__ import annotations

import ipaddress
import os
import shlex
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

from maas_kubevirt import EXIT_FAILED, EXIT_OK, EXIT_USAGE, PROG, kubeconfigs, policies
from maas_kubevirt.console import TABLE, WIDE, document, error, output_format, table, terminal_width, warn

if TYPE_CHECKING:
    from maas_kubevirt.maas import MAASClient

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
STATUSES = (OK, WARN, FAIL, SKIP)

# `render`'s default output directory, named in the fixes.
RENDER_DIR = "build"
LISTED = 5  # offenders named in one row; the JSON "subjects" holds them all
# The table's width when stdout is not a terminal and COLUMNS is unset: unbounded rows run to
# 300 columns in a mail or a CI log. -o wide keeps each row on one line, -o json is for scripts.
PIPED_WIDTH = 120

Resolver = Callable[[str], list[str]]


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    found: str
    fix: str = ""
    subjects: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict:
        """The row as JSON: check, status, found, fix, and every affected object as subjects."""
        return {"check": self.name, "status": self.status, "found": self.found, "fix": self.fix,
                "subjects": list(self.subjects)}


def _clean(text: Any) -> str:
    """One printable line: control characters escaped (text from MAAS or the cluster)."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in " ".join(str(text).split()))


def _networks(items: Any) -> set[str]:
    """CIDRs as a set of normal forms (10.0.0.1/8 and 10.0.0.0/8 are one range); text kept as is when not a CIDR."""
    found = set()
    for item in items if isinstance(items, list) else []:
        try:
            found.add(str(ipaddress.ip_network(str(item).strip(), strict=False)))
        except ValueError:
            found.add(_clean(item))
    return found


def _some(items: Sequence[str]) -> str:
    shown = ", ".join(items[:LISTED])
    return shown + (f" and {len(items) - LISTED} more" if len(items) > LISTED else "")


def _version_text(version: Sequence[int]) -> str:
    return ".".join(map(str, version))


def _skipped(names: Iterable[str], reason: str) -> list[Check]:
    return [Check(name, SKIP, reason) for name in names]


# The families import the helpers above from this module, so they are imported after them.
from maas_kubevirt.doctor.network import (  # noqa: E402
    HTTPS_PORT, MAX_ALLOWED_ADDRESSES, REDFISH_DEADLINE, Credentials, allowed_addresses, dns_check, redfish_check,
    route_check,
    redfish_probe, redfish_url, source_ranges_check, system_resolve,
)
from maas_kubevirt.doctor.maas import (  # noqa: E402
    FIXED_DNS_VERSIONS, KEY_REFUSED, MAAS_CHECKS, admin_check, claims, claims_check, enlist_commissioning_check,
    maas_checks, password_check, script_check, seed_file_check, version_check,
)
from maas_kubevirt.doctor.lease import lease_check, lease_checks  # noqa: E402
from maas_kubevirt.doctor.inventory import Inventory, _selects, ingress_classes  # noqa: E402
from maas_kubevirt.doctor.cluster import (  # noqa: E402
    CLUSTER_CHECKS, CRDS, KUBEMACPOOL_VALUE, KYVERNO_CONTROLLERS, KYVERNO_MIN, KYVERNO_POLICY_CRD,
    NETWORK_POLICY_CNIS, Generated, _cidrs, allowlist_check, catch_all, catch_all_check,
    cluster_checks, cni_check, crds_check, image_version, kyverno_rbac_checks,
    kyverno_version_check, missing_rules, namespaces_check, network_policies_check, policies_check,
    seed_secret_check, vm_problems, vms_check, cluster_check_names,
)
from maas_kubevirt.doctor.gateway import (  # noqa: E402
    GATEWAY_CHECKS, INGRESS_CHECKS, admits, allowed_routes_check, exposure_checks, hostname_covers,
    hostname_matches, ingress_allowlist_check, programmed_check, route_problem, routes_check,
)
from maas_kubevirt.doctor.gateway import allowlist_check as gateway_allowlist_check  # noqa: E402
from maas_kubevirt.doctor import bmc_proxy, pools  # noqa: E402

# What callers and tests use from the families, under one name: maas_kubevirt.doctor.
__all__ = [
    "OK", "WARN", "FAIL", "SKIP", "STATUSES", "Check", "Options", "Reach", "run", "summary",
    "render_table", "checks_document", "render", "main",
    "HTTPS_PORT", "REDFISH_DEADLINE", "Credentials", "dns_check", "redfish_check", "redfish_probe", "redfish_url",
    "system_resolve", "MAX_ALLOWED_ADDRESSES", "allowed_addresses", "source_ranges_check",
    "FIXED_DNS_VERSIONS", "MAAS_CHECKS", "admin_check", "claims", "claims_check", "enlist_commissioning_check",
    "maas_checks", "password_check", "script_check", "seed_file_check", "version_check",
    "CLUSTER_CHECKS", "CRDS", "KUBEMACPOOL_VALUE", "KYVERNO_CONTROLLERS", "KYVERNO_MIN", "KYVERNO_POLICY_CRD",
    "Generated", "Inventory", "_cidrs", "_selects", "allowlist_check", "cluster_checks", "crds_check",
    "image_version", "kyverno_rbac_checks", "kyverno_version_check", "missing_rules", "namespaces_check",
    "policies_check", "seed_secret_check", "vm_problems", "vms_check", "NETWORK_POLICY_CNIS", "catch_all",
    "catch_all_check", "cni_check", "ingress_classes", "network_policies_check",
    "lease_check", "lease_checks", "cluster_check_names",
    "GATEWAY_CHECKS", "INGRESS_CHECKS", "admits", "allowed_routes_check", "exposure_checks", "gateway_allowlist_check",
    "hostname_covers", "hostname_matches", "ingress_allowlist_check", "programmed_check", "route_problem",
    "routes_check", "bmc_proxy", "pools",
]


# --- gathering: read-only requests, then the families' checks -------------------------------


@dataclass
class Options:
    kubeconfig: str | None = None
    context: str | None = None
    command: str = PROG                      # how the operator runs us, for the fixes
    resolve: Resolver | None = None         # None: the system resolver
    redfish_deadline: float = REDFISH_DEADLINE
    redfish_https_port: int | None = None     # None: HTTPS_PORT, where MAAS's driver reaches a BMC


@dataclass
class Reach:
    """What the network checks need: one host (and MAAS's credentials) per namespace."""
    hosts: dict[str, str] = field(default_factory=dict)
    credentials: dict[str, Credentials] = field(default_factory=dict)


class _Fixes:
    def __init__(self, command: str, values: Mapping[str, Any]):
        render = f"{command} render --output {RENDER_DIR}"
        self.apply = f"`{render} && kubectl apply -k {RENDER_DIR}/kubernetes`"
        self.apply_seed = (f"point seed.file at the MAAS host's seed, then `{render} && kubectl apply -f "
                           f"{RENDER_DIR}/kubernetes/{policies.SEED_SECRET_FILE}`")
        self.upload = f"`{command} upload-script` (it renders the script from these values)"
        self.enlist = "`maas $PROFILE maas set-config name=enlist_commissioning value=true`"
        self.reconcile = command
        self.key_source = "MAAS_API_KEY" if os.environ.get("MAAS_API_KEY") else values["maas"]["api_key_file"]


def run(values: Mapping[str, Any], client: MAASClient | None, cluster: Any | None, options: Options,
        no_key: str = "") -> list[Check]:
    """Every check, in order: MAAS, the seed file, the reconciler's lease, the cluster, the warm
    pools, the Ingress allowlist's width, the network. Without a client (no_key: why there is no
    MAAS API key) each MAAS row is skipped with that reason and every other row runs."""
    fixes = _Fixes(options.command, values)
    reach = Reach()
    seed_check, seed = seed_file_check(values["seed"]["file"])
    generations, unread = cluster_generations(values, cluster)
    if client is None:
        checks = _skipped(MAAS_CHECKS, f"no MAAS API key ({no_key}): MAAS was not asked; the cluster, the route "
                                       "and the network rows below need none")
    else:
        checks = maas_checks(values, client, seed, fixes, reach, generations, unread)
    checks.append(seed_check)
    checks.append(lease_checks(values, client))
    if cluster is None:
        checks.append(Check("cluster", SKIP, f"no --kubeconfig given, and {kubeconfigs.none_found()}: "
                            "the cluster was not checked",
                            f"{kubeconfigs.fix()}: `{options.command} doctor --kubeconfig FILE` "
                            "(read access is enough)"))
    else:
        checks.extend(cluster_checks(values, cluster, seed, fixes, reach))
    checks.extend(pools.pools_checks(values, cluster, fixes.apply, any(c.name == "cluster.api" for c in checks)))
    checks.append(source_ranges_check(values["ingress"]["source_ranges"], fixes.apply,
                                      _rack_controllers(client, checks)))
    resolve = options.resolve or system_resolve
    checks.append(dns_check(reach.hosts, resolve, values["redfish"]["domain"]))
    checks.append(route_check(reach.hosts, values["bmc_proxy"]["address"], resolve,
                              options.redfish_https_port or HTTPS_PORT))
    checks.append(redfish_check(reach.credentials, resolve, options.redfish_deadline,
                                options.redfish_https_port or HTTPS_PORT))
    reach.credentials.clear()
    return checks


def cluster_generations(values: Mapping[str, Any], cluster: Any | None) -> tuple[dict | None, str]:
    """Every VM's credential generation, through reconciler.lease's access or else --kubeconfig;
    (None, why) without either or when the ConfigMap cannot be read."""
    from maas_kubevirt import identity, rotate, rotations
    from maas_kubevirt import lease as leases   # not doctor.lease, this package's lease checks
    from maas_kubevirt.kube import KubeError

    if leases.configured(values):
        generations, unread = rotate.read_generations(values)
        return generations, _clean(unread)
    if cluster is None:
        return None, "no cluster access (reconciler.lease or --kubeconfig)"
    path = (f"/api/v1/namespaces/{values['kubernetes']['system_namespace']}/configmaps/"
            f"{identity.ROTATIONS_CONFIGMAP}")
    try:
        found = cluster.get(path)
    except KubeError as failure:
        return None, _clean(failure)
    if not isinstance(found, Mapping):
        return None, f"ConfigMap {identity.ROTATIONS_CONFIGMAP} does not exist"
    return rotations.parse(found.get("data") or {})[0], ""


def _rack_controllers(client: MAASClient, checks: Sequence[Check]) -> int | None:
    """How many rack controllers MAAS lists; None when it cannot say (then it is not asked again
    after its version check failed: a site without MAAS waits for no more timeouts)."""
    from maas_kubevirt.maas import MAASError

    if not checks or checks[0].name != "maas.version" or checks[0].status in (FAIL, SKIP):
        return None
    try:
        return len(client.rack_controllers())
    except MAASError:
        return None


def summary(checks: Sequence[Check]) -> dict[str, int]:
    return {status: sum(c.status == status for c in checks) for status in STATUSES}


def render_table(checks: Sequence[Check], width: int | None = None) -> str:
    """The checks as a table; with a width, FOUND and FIX wrap so that its lines fit."""
    rows = [(c.name, c.status, c.found, c.fix or "-") for c in checks]
    counts = summary(checks)
    return table(("CHECK", "STATUS", "FOUND", "FIX"), rows, width, wrap=(2, 3)) + "\n" + \
        ", ".join(f"{n} {status}" for status, n in counts.items())


def checks_document(checks: Sequence[Check]) -> dict:
    """The checks as -o json and -o yaml print them: each with its subjects, and the summary."""
    return {"checks": [c.as_dict() for c in checks], "summary": summary(checks)}


def render(checks: Sequence[Check], output: str) -> str:
    """The checks as -o says: the table fitted to the terminal (piped: PIPED_WIDTH), wide never
    wrapped, or a document."""
    if output == TABLE:
        return render_table(checks, terminal_width(PIPED_WIDTH))
    if output == WIDE:
        return render_table(checks)
    return document(checks_document(checks), output)


def _no_key(values: Mapping[str, Any]) -> str:
    """Why this host has no MAAS API key at all ("" when it has one to try)."""
    from maas_kubevirt.maas import API_KEY_CREDENTIAL, ENV_KEY
    from maas_kubevirt.paths import credential_path

    if os.environ.get(ENV_KEY) or credential_path(API_KEY_CREDENTIAL) is not None:
        return ""
    path = values["maas"]["api_key_file"]
    return "" if os.path.exists(path) else f"${ENV_KEY} is not set and maas.api_key_file {path} does not exist"


def main(values: dict, args: Any) -> int:
    """``doctor [--kubeconfig FILE [--context NAME]] [-o FORMAT]``: 0 nothing fails, 1 something does."""
    from maas_kubevirt.maas import RetryPolicy, client_from_values

    command = PROG + (f" --values {shlex.quote(args.values)}" if getattr(args, "values", None) else "")
    options = Options(kubeconfig=getattr(args, "kubeconfig", None), context=getattr(args, "context", None),
                      command=command)
    source = "--kubeconfig"
    if not options.kubeconfig:
        found = kubeconfigs.default()   # as kubectl: $KUBECONFIG, else ~/.kube/config
        if found is not None:
            options.kubeconfig, source = found
    cluster = None
    if options.kubeconfig:
        from maas_kubevirt.kube import Cluster, KubeConfigError

        try:
            cluster = Cluster(options.kubeconfig, options.context, source)
        except KubeConfigError as failure:
            error(str(failure))
            return EXIT_USAGE
        if cluster.insecure:
            warn(f"the kubeconfig skips verifying the API server's certificate ({cluster.host})")
    # No key on this host (a rack controller, a workstation): every row but MAAS's still runs. A
    # key that is there but unusable is a configuration error, as for every command.
    no_key = _no_key(values)
    client = None if no_key else client_from_values(values, warn)
    if client is not None:
        # A diagnosis should not sit through the reconciler's patient retries.
        client.retry = RetryPolicy(attempts=2, backoff=1.0, max_retry_after=5.0)
    try:
        checks = run(values, client, cluster, options, no_key)
    finally:
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.close()
    print(render(checks, output_format(args)), flush=True)
    # A refused key is a configuration error, as for every other command: no check could run.
    if any(c.name == "maas.admin" and c.status == FAIL and c.found.startswith(KEY_REFUSED) for c in checks):
        return EXIT_USAGE
    return EXIT_FAILED if any(c.status == FAIL for c in checks) else EXIT_OK
