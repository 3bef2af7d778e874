"""doctor's cluster checks: CRDs, Kyverno and its RBAC, the policies, the seed Secret, the
opted-in namespaces' VMs, Ingresses and NetworkPolicies, and what keeps the BMCs closed."""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from maas_kubevirt import bmc_proxy, identity, policies, upstream
from maas_kubevirt.doctor import FAIL, LISTED, OK, WARN, Check, _clean, _skipped, _some, _version_text
from maas_kubevirt.doctor import bmc_proxy as proxy_rows
from maas_kubevirt.doctor.gateway import GATEWAY_CRD, expected_routes, exposure_checks
from maas_kubevirt.doctor.gateway import check_names as exposure_check_names
from maas_kubevirt.doctor.inventory import Inventory, _listed_or_none, _selects, ingress_classes

if TYPE_CHECKING:
    from maas_kubevirt.doctor import Reach, _Fixes

CRDS = {
    "virtualmachines.kubevirt.io": "KubeVirt",
    "virtualmachinebmcs.bmc.kubevirt.io": "kubevirtBMC",
}
KYVERNO_POLICY_CRD = "clusterpolicies.kyverno.io"
KYVERNO_MIN = tuple(int(part) for part in policies.KYVERNO_MIN_VERSION.split("."))
KYVERNO_CONTROLLERS = "app.kubernetes.io/part-of=kyverno,app.kubernetes.io/component in (admission-controller,background-controller)"
KUBEMACPOOL_VALUE = "allocate"
# Node agents of CNIs that enforce NetworkPolicy, as their DaemonSets are usually named. A
# heuristic: a CNI installed under another name is not seen, and one seen may have its
# NetworkPolicy support switched off.
NETWORK_POLICY_CNIS = ("calico-node", "cilium", "kube-router", "antrea", "weave-net", "canal")


def crds_check(present: Iterable[str]) -> Check:
    """The VirtualMachine and VirtualMachineBMC CRDs exist."""
    have = set(present)
    missing = [crd for crd in CRDS if crd not in have]
    if not missing:
        return Check("cluster.crds", OK, "VirtualMachine and VirtualMachineBMC CRDs are installed")
    return Check("cluster.crds", FAIL, "missing CRD(s): " + ", ".join(missing),
                 "install " + " and ".join(sorted({CRDS[crd] for crd in missing})) +
                 " (their CRDs must exist before the policies are applied)", tuple(missing))


def image_version(image: str) -> tuple[int, int, int] | None:
    """(major, minor, patch) from an image tag like ``reg.kyverno.io/kyverno/kyverno:v1.13.4``."""
    tag = image.split("@", 1)[0].rsplit("/", 1)[-1].partition(":")[2]
    match = re.fullmatch(r"v?(\d+)\.(\d+)\.(\d+)(?:[-+].*)?", tag)
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


def _has_rule_level_generate_existing(crd: Mapping[str, Any]) -> bool:
    """ClusterPolicy CRD with ``rules[].generate.generateExisting``: new in Kyverno 1.13."""
    for version in (crd.get("spec") or {}).get("versions") or []:
        try:
            rules = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["rules"]
            if "generateExisting" in rules["items"]["properties"]["generate"]["properties"]:
                return True
        except (KeyError, TypeError):
            continue
    return False


def kyverno_version_check(deployments: Iterable[Mapping[str, Any]], policy_crd: Mapping[str, Any] | None,
                          proven: str | None = None) -> Check:
    """Kyverno 1.13 or later: from the controllers' image tags, else from the ClusterPolicy CRD; a
    warning below ``proven``, the release the control-plane tier runs (upstream.lock.yaml)."""
    name = "cluster.kyverno"
    minimum = _version_text(KYVERNO_MIN)
    fix = f"install or upgrade Kyverno to {minimum} or later"
    if policy_crd is None:
        return Check(name, FAIL, f"Kyverno is not installed (no {KYVERNO_POLICY_CRD} CRD)", fix)
    versions = []
    for deployment in deployments:
        containers = (((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers") or []
        for container in containers:
            version = image_version(str(container.get("image", "")))
            if version is not None:
                versions.append((version, (deployment.get("metadata") or {}).get("name", "?")))
    if versions:
        oldest, where = min(versions)
        if oldest < KYVERNO_MIN:
            return Check(name, FAIL, f"Kyverno {_version_text(oldest)} ({_clean(where)}): older than {minimum}", fix)
        tested = image_version(f"kyverno:{proven}") if proven else None
        if tested is not None and oldest < tested:
            return Check(name, WARN, f"Kyverno {_version_text(oldest)} ({_clean(where)}): older than {proven}, the "
                         f"release maas-kubevirt is proven on ({upstream.LOCK_NAME})", f"upgrade Kyverno to {proven}")
        return Check(name, OK, f"Kyverno {_version_text(oldest)} ({_clean(where)})")
    if _has_rule_level_generate_existing(policy_crd):
        return Check(name, OK, f"Kyverno {minimum} or later (the ClusterPolicy CRD has rule-level "
                     "generateExisting; no versioned controller Deployment found)")
    return Check(name, FAIL, f"Kyverno older than {minimum} (the ClusterPolicy CRD lacks rule-level "
                 "generateExisting)", fix)


def _grants(granted: Iterable[Mapping[str, Any]], group: str, resource: str, verb: str, name: str | None) -> bool:
    for rule in granted:
        if not (set(rule.get("apiGroups") or []) & {group, "*"}):
            continue
        if not (set(rule.get("resources") or []) & {resource, "*"}):
            continue
        if not (set(rule.get("verbs") or []) & {verb, "*"}):
            continue
        names = rule.get("resourceNames") or []
        if names and (name is None or name not in names):
            continue
        return True
    return False


def missing_rules(wanted: Iterable[Mapping[str, Any]], granted: Iterable[Mapping[str, Any]]) -> list[str]:
    """Each (verb, group/resource[/name]) of wanted that no rule of granted allows."""
    granted = list(granted)
    missing = []
    for rule in wanted:
        for group in rule.get("apiGroups") or [""]:
            for resource in rule.get("resources") or []:
                for name in rule.get("resourceNames") or [None]:
                    for verb in rule.get("verbs") or []:
                        if not _grants(granted, group, resource, verb, name):
                            target = f"{group or 'core'}/{resource}" + (f"/{name}" if name else "")
                            missing.append(f"{verb} {target}")
    return missing


def kyverno_rbac_checks(expected: Iterable[Mapping[str, Any]], cluster_roles: Iterable[Mapping[str, Any]],
                        apply: str) -> list[Check]:
    """For each of the project's ClusterRoles: it exists, and Kyverno's aggregate role holds its rules."""
    roles = {str((role.get("metadata") or {}).get("name")): role for role in cluster_roles}
    checks = []
    for role in expected:
        name = role["metadata"]["name"]
        labels = role["metadata"].get("labels") or {}
        check = f"cluster.kyverno_rbac/{name.rsplit(':', 1)[-1]}"
        if name not in roles:
            checks.append(Check(check, FAIL, f"ClusterRole {name} is missing", apply))
            continue
        aggregators = [
            other for other in roles.values()
            if any(_selects(s, labels) for s in ((other.get("aggregationRule") or {}).get("clusterRoleSelectors") or []))
        ]
        if not aggregators:
            wanted = ", ".join(f"{k}={v}" for k, v in labels.items() if k.startswith("rbac.kyverno.io/"))
            checks.append(Check(check, FAIL, f"no Kyverno ClusterRole aggregates {name} ({wanted})",
                                "install Kyverno with its RBAC (its controllers' ClusterRoles aggregate by these labels)"))
            continue
        problems = []
        for aggregator in aggregators:
            absent = missing_rules(role.get("rules") or [], aggregator.get("rules") or [])
            if absent:
                problems.append(f"{aggregator['metadata']['name']} lacks {_some(absent)}")
        if problems:
            checks.append(Check(check, FAIL, "not merged: " + "; ".join(problems),
                                "run kube-controller-manager with the clusterrole-aggregation controller "
                                f"(it merges {name} into Kyverno's role), then check again"))
        else:
            merged = ", ".join(a["metadata"]["name"] for a in aggregators)
            checks.append(Check(check, OK, f"{name} is merged into {merged}"))
    return checks


def _ready(policy: Mapping[str, Any]) -> tuple[bool, str]:
    status = policy.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("type") == "Ready":
            return condition.get("status") == "True", _clean(condition.get("message") or condition.get("reason") or "")
    if "ready" in status:  # before Kyverno 1.10's conditions
        return status.get("ready") is True, ""
    return False, "no Ready condition yet"


def policies_check(expected: Sequence[str], cluster_policies: Iterable[Mapping[str, Any]], apply: str) -> Check:
    """Every ClusterPolicy of the bundle exists and is Ready."""
    present = {str((p.get("metadata") or {}).get("name")): p for p in cluster_policies}
    missing = [name for name in expected if name not in present]
    unready = []
    for name in expected:
        if name in present:
            ready, why = _ready(present[name])
            if not ready:
                unready.append(f"{name} ({why})" if why else name)
    if not missing and not unready:
        return Check("cluster.policies", OK, f"{len(expected)} ClusterPolicies are Ready")
    found = []
    if missing:
        found.append("missing: " + ", ".join(missing))
    if unready:
        found.append("not Ready: " + _some(unready))
    fix = apply if missing else "`kubectl describe clusterpolicy NAME` shows why; " \
        "fix that (usually Kyverno's RBAC), then re-apply: " + apply
    return Check("cluster.policies", FAIL, "; ".join(found), fix, tuple(missing + unready))


def seed_secret_check(cluster_digest: str | None, host_seed: str | None, where: str, apply_seed: str) -> Check:
    """The seed Secret exists and holds the MAAS host's seed (compared by SHA-256 digest)."""
    name = "cluster.seed_secret"
    if cluster_digest is None:
        return Check(name, FAIL, f"Secret {where} is missing or has no key seed", apply_seed)
    if host_seed is None:
        return Check(name, WARN, f"Secret {where} exists; not compared (the MAAS host's seed file is unreadable)",
                     "fix maas.seed_file first")
    host_digest = hashlib.sha256(host_seed.encode("utf-8")).hexdigest()
    if hmac.compare_digest(cluster_digest, host_digest):
        return Check(name, OK, f"Secret {where} holds the MAAS host's seed (SHA-256 digests equal)")
    return Check(name, FAIL, f"Secret {where} holds another seed than the MAAS host's (SHA-256 digests differ): "
                 "the cluster's BMC passwords are not the ones MAAS is given", apply_seed)


def namespaces_check(namespaces: Sequence[Mapping[str, Any]], opt_in: str) -> Check:
    """Each opted-in namespace carries KubeMacPool's label, so its VMs keep their MACs."""
    if not namespaces:
        return Check("cluster.kubemacpool", WARN, f"no namespace is opted in ({opt_in})",
                     f"`kubectl label namespace NAMESPACE {opt_in} {policies.KUBEMACPOOL_LABEL}={KUBEMACPOOL_VALUE}`")
    unlabelled = sorted(
        str(ns["metadata"]["name"]) for ns in namespaces
        if (ns["metadata"].get("labels") or {}).get(policies.KUBEMACPOOL_LABEL) != KUBEMACPOOL_VALUE
    )
    if not unlabelled:
        return Check("cluster.kubemacpool", OK,
                     f"{len(namespaces)} opted-in namespace(s), each labelled {policies.KUBEMACPOOL_LABEL}={KUBEMACPOOL_VALUE}")
    return Check("cluster.kubemacpool", FAIL,
                 f"opted in without {policies.KUBEMACPOOL_LABEL}={KUBEMACPOOL_VALUE} (their VMs get a new MAC "
                 f"on every start and never finish commissioning): {_some(unlabelled)}",
                 "; ".join(f"`kubectl label namespace {ns} {policies.KUBEMACPOOL_LABEL}={KUBEMACPOOL_VALUE}`"
                           for ns in unlabelled[:LISTED]), tuple(unlabelled))


@dataclass(frozen=True)
class Generated:
    """What the bundle's generate rules name and stamp, read from the rendered policies."""
    names: Mapping[str, str]            # kind -> name template (Secret, VirtualMachineBMC, Ingress, NetworkPolicy)
    allowlist: Mapping[str, str]        # Ingress allowlist annotation -> value
    network_policy: Mapping[str, Any] = field(default_factory=dict)   # the NetworkPolicy's spec

    @classmethod
    def from_policies(cls, objects: Iterable[Mapping[str, Any]], allowlist_key: str) -> "Generated":
        """From the rendered ClusterPolicies; allowlist_key is the Ingress class's allowlist annotation."""
        names: dict[str, str] = {}
        allowlist: dict[str, str] = {}
        network_policy: dict[str, Any] = {}
        for obj in objects:
            if obj.get("kind") != "ClusterPolicy":
                continue
            for rule in obj["spec"].get("rules") or []:
                generate = rule.get("generate")
                if not isinstance(generate, dict) or generate.get("kind") not in (
                        "Secret", "VirtualMachineBMC", "Ingress", "NetworkPolicy"):
                    continue
                names[generate["kind"]] = generate["name"]
                if generate["kind"] == "Ingress":
                    annotations = ((generate.get("data") or {}).get("metadata") or {}).get("annotations") or {}
                    if allowlist_key in annotations:
                        allowlist[allowlist_key] = annotations[allowlist_key]
                if generate["kind"] == "NetworkPolicy":
                    network_policy = (generate.get("data") or {}).get("spec") or {}
        return cls(names, allowlist, network_policy)

    def name(self, kind: str, vm: str, namespace: str) -> str:
        text = re.sub(r"\{\{\s*request\.object\.metadata\.name\s*\}\}", vm, self.names[kind])
        return re.sub(r"\{\{\s*request\.object\.metadata\.namespace\s*\}\}", namespace, text)


def _interfaces(vm: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    spec = ((vm.get("spec") or {}).get("template") or {}).get("spec") or {}
    return ((spec.get("domain") or {}).get("devices") or {}).get("interfaces") or []


def vm_problems(vm: Mapping[str, Any], inventory: Inventory, generated: Generated) -> list[str]:
    """What one VM lacks: a MAC on an interface, its Secret, VirtualMachineBMC or Ingress."""
    name, namespace = str(vm["metadata"]["name"]), inventory.namespace
    problems = []
    if not re.match(policies.BMC_NAME_REGEX, name):
        return ["a name kubevirtBMC cannot serve (a DNS-1035 label of at most 55 characters): rename the VM"]
    interfaces = _interfaces(vm)
    if not interfaces:
        problems.append("no interface")
    for interface in interfaces:
        if not interface.get("macAddress"):
            problems.append(f"no MAC on interface {_clean(interface.get('name', '?'))}")
    ingress_names = {str((i.get("metadata") or {}).get("name")) for i in inventory.ingresses}
    for kind, have in (("Secret", inventory.secrets), ("VirtualMachineBMC", inventory.bmcs),
                       ("Ingress", ingress_names)):
        if kind in generated.names and generated.name(kind, name, namespace) not in have:
            problems.append(f"no {kind} {generated.name(kind, name, namespace)}")
    return problems


def vms_check(inventory: Inventory, generated: Generated, opt_in: str) -> Check:
    """Each VM of an opted-in namespace has a MAC on every interface, and its BMC objects."""
    name = f"cluster.vms/{inventory.namespace}"
    broken = []
    for vm in sorted(inventory.vms, key=lambda v: str(v["metadata"]["name"])):
        problems = vm_problems(vm, inventory, generated)
        if problems:
            broken.append(f"{vm['metadata']['name']}: {', '.join(problems)}")
    if not inventory.vms:
        return Check(name, OK, "no VirtualMachine yet")
    if not broken:
        kinds = [kind for kind in ("Secret", "VirtualMachineBMC", "Ingress") if kind in generated.names]
        return Check(name, OK, f"{len(inventory.vms)} VM(s), each with MACs, {', '.join(kinds[:-1])} and {kinds[-1]}"
                     if len(kinds) > 1 else f"{len(inventory.vms)} VM(s), each with MACs")
    fix = ("MACs: label the namespace for KubeMacPool and recreate the VM, or set "
           "spec.template.spec.domain.devices.interfaces[].macAddress; missing BMC objects: "
           f"check `kubectl get clusterpolicy` (Ready) and the namespace label {opt_in}")
    return Check(name, FAIL, f"{len(broken)} of {len(inventory.vms)} VM(s): {'; '.join(broken[:LISTED])}"
                 + (f"; and {len(broken) - LISTED} more" if len(broken) > LISTED else ""), fix,
                 tuple(b.split(":", 1)[0] for b in broken))


def _cidrs(text: Any) -> set[str]:
    return {part.strip() for part in str(text or "").split(",") if part.strip()}


def allowlist_check(inventories: Iterable[Inventory], generated: Generated, apply: str) -> Check:
    """Each BMC Ingress keeps the allowlist the policy gives it (a lost one opens the BMC)."""
    expected = {key: _cidrs(value) for key, value in generated.allowlist.items()}
    changed, count = [], 0
    for inventory in inventories:
        for vm in inventory.vms:
            wanted = generated.name("Ingress", str(vm["metadata"]["name"]), inventory.namespace) \
                if "Ingress" in generated.names else None
            for ingress in inventory.ingresses:
                metadata = ingress.get("metadata") or {}
                if metadata.get("name") != wanted:
                    continue
                count += 1
                annotations = metadata.get("annotations") or {}
                if any(_cidrs(annotations.get(key)) != cidrs for key, cidrs in expected.items()):
                    changed.append(f"{inventory.namespace}/{wanted}")
    if not expected:
        return Check("cluster.ingress_allowlist", FAIL, "the rendered policy sets no allowlist annotation",
                     "set ingress.source_ranges in the values and re-render")
    if changed:
        return Check("cluster.ingress_allowlist", FAIL,
                     f"{len(changed)} BMC Ingress(es) without the allowlist {', '.join(sorted(generated.allowlist.values()))}: "
                     f"{_some(sorted(changed))}",
                     "Kyverno re-syncs generated objects: delete the Ingress to have it regenerated "
                     "(`kubectl -n NAMESPACE delete ingress NAME`), and " + apply, tuple(sorted(changed)))
    return Check("cluster.ingress_allowlist", OK, f"{count} BMC Ingress(es) keep the allowlist")



def network_policies_check(found: Mapping[str, Iterable[Mapping[str, Any]]], generated: Generated,
                           apply: str) -> Check:
    """Each opted-in namespace holds the generated NetworkPolicy, as rendered.

    found: opted-in namespace -> its NetworkPolicies.
    """
    name = "cluster.network_policies"
    if "NetworkPolicy" not in generated.names:
        return Check(name, FAIL, "the rendered policies generate no NetworkPolicy", apply)
    wanted = generated.names["NetworkPolicy"]
    missing, changed = [], []
    for namespace, items in sorted(found.items()):
        by_name = {str((item.get("metadata") or {}).get("name")): item for item in items}
        if wanted not in by_name:
            missing.append(namespace)
        elif by_name[wanted].get("spec") != generated.network_policy:
            changed.append(namespace)
    if not missing and not changed:
        return Check(name, OK, f"{len(found)} opted-in namespace(s), each with NetworkPolicy {wanted}")
    problems = []
    if missing:
        problems.append(f"without NetworkPolicy {wanted} (any pod can reach their BMCs, past the Ingress "
                        f"allowlist): {_some(missing)}")
    if changed:
        problems.append(f"with NetworkPolicy {wanted} changed from the rendered one: {_some(changed)}")
    return Check(name, FAIL, "; ".join(problems),
                 f"`kubectl get clusterpolicy {policies.POLICY_NAMES['isolation']}` must be Ready (Kyverno "
                 f"generates the NetworkPolicy within seconds and puts back a changed one); then {apply}",
                 tuple(missing + changed))


def _enforces_network_policy(daemonset: Mapping[str, Any]) -> bool:
    name = str((daemonset.get("metadata") or {}).get("name") or "")
    return any(name == known or name.startswith(known + "-") for known in NETWORK_POLICY_CNIS)


def cni_check(daemonsets: Iterable[Mapping[str, Any]] | None) -> Check:
    """A CNI that enforces NetworkPolicy can be seen (a heuristic: known DaemonSet names).

    daemonsets: every DaemonSet of the cluster, or None when they may not be listed.
    """
    name = "cluster.cni"
    fix = ("use a CNI that enforces NetworkPolicy (Calico, Cilium, Antrea, kube-router, ...): without one, "
           "the generated NetworkPolicies admit every pod to the BMCs")
    if daemonsets is None:
        return Check(name, WARN, "cannot list DaemonSets: whether a CNI enforces NetworkPolicy is not known", fix)
    seen = sorted(f"{(d.get('metadata') or {}).get('namespace')}/{(d.get('metadata') or {}).get('name')}"
                  for d in daemonsets if _enforces_network_policy(d))
    if seen:
        return Check(name, OK, f"a CNI that enforces NetworkPolicy runs: {_some(seen)} (judged by DaemonSet name)")
    return Check(name, WARN, "no DaemonSet of a CNI known to enforce NetworkPolicy ("
                 + ", ".join(NETWORK_POLICY_CNIS) + "); a heuristic: yours may be named otherwise", fix)


def catch_all(ingress: Mapping[str, Any]) -> str | None:
    """Why an Ingress receives requests for hosts it does not name, or None."""
    spec = ingress.get("spec") or {}
    if spec.get("defaultBackend"):
        return "spec.defaultBackend"
    if any(not (rule or {}).get("host") for rule in spec.get("rules") or []):
        return "a rule without host"
    return None


def catch_all_check(ingresses: Iterable[Mapping[str, Any]] | None, class_name: str, allowed: bool) -> Check:
    """No Ingress of the BMC class catches requests for hosts without an Ingress of their own."""
    name = "cluster.catch_all"
    if ingresses is None:
        return Check(name, WARN, "cannot list the Ingresses of every namespace",
                     "run doctor with a kubeconfig that may list Ingresses cluster-wide")
    found = sorted(f"{(i.get('metadata') or {}).get('namespace')}/{(i.get('metadata') or {}).get('name')} ({why})"
                   for i in ingresses if class_name in ingress_classes(i) and (why := catch_all(i)))
    if not found:
        return Check(name, OK, f"no Ingress of class {class_name} catches hosts it does not name")
    what = (f"{len(found)} Ingress(es) of class {class_name} catch every request for a BMC host without "
            f"an Ingress (a deleted VM's, with its password): {_some(found)}")
    subjects = tuple(f.split(" ", 1)[0] for f in found)
    if allowed:
        return Check(name, WARN, what + "; allowed by ingress.allow_catch_all",
                     "set ingress.allow_catch_all: false unless this class must serve a catch-all", subjects)
    return Check(name, FAIL, what, "give each rule a host and remove spec.defaultBackend, or move the Ingress "
                 "to another class (the policy refuses new ones; these predate it)", subjects)


CLUSTER_CHECKS = ("cluster.crds", "cluster.kyverno", "cluster.kyverno_rbac", "cluster.policies",
                  "cluster.seed_secret", "cluster.kubemacpool", "cluster.vms", "cluster.ingress_allowlist",
                  "cluster.network_policies", "cluster.cni", "cluster.catch_all")


def cluster_check_names(values: Mapping[str, Any]) -> list[str]:
    """The cluster rows doctor makes for these values, in order (the per-namespace and per-role
    rows by their prefix): the Ingress allowlist row with exposure ingress, the exposure's rows."""
    names = [n for n in CLUSTER_CHECKS if values["exposure"] == "ingress" or n != "cluster.ingress_allowlist"]
    at = names.index("cluster.network_policies")
    return names[:at] + list(exposure_check_names(values)) + names[at:] + list(proxy_rows.check_names(values))


def proxy_checks(values: Mapping[str, Any], cluster: Any, ingresses: list[dict] | None,
                 inventories: Sequence[Inventory], fixes: _Fixes) -> list[Check]:
    """The BMC proxy's rows from the live Gateways (exposure gateway), Ingresses, and its Deployment and ConfigMap."""
    gateways = None
    if values["exposure"] == "gateway":
        gateways = _listed_or_none(cluster.gateways) if cluster.crd(GATEWAY_CRD) is not None else []
    proxies = _listed_or_none(lambda: cluster.deployments(f"app.kubernetes.io/name={bmc_proxy.NAME}"))
    checks = [proxy_rows.isolation_check(values, gateways, ingresses, expected_routes(inventories), proxies)]
    if bmc_proxy.rendered(dict(values)):
        config = cluster.configmap(values["ingress"]["controller_namespace"], bmc_proxy.NAME)
        checks.append(proxy_rows.allowlist_check(values, config, proxies, fixes.apply))
    return checks


def api_check(error: Exception) -> Check:
    """The row of an API server that stopped answering; the rows after it are skipped."""
    return Check("cluster.api", FAIL, _clean(error),
                 "check the kubeconfig's server and that its user may get and list these objects")


def cluster_checks(values: Mapping[str, Any], cluster: Any, seed: str | None, fixes: _Fixes,
                   reach: Reach) -> list[Check]:
    """The cluster checks (read-only), and one VM host per opted-in namespace for the DNS check."""
    from maas_kubevirt.kube import KubeError

    kubernetes, domain = values["kubernetes"], values["redfish"]["domain"]
    bundle = policies.objects(policies.render_kubernetes(dict(values), None))
    expected_policies = [o["metadata"]["name"] for o in bundle if o["kind"] == "ClusterPolicy"]
    expected_roles = [o for o in bundle if o["kind"] == "ClusterRole"
                      and any(k.startswith("rbac.kyverno.io/aggregate-to-") for k in o["metadata"].get("labels") or {})]
    generated = Generated.from_policies(bundle, policies.allowlist_annotation(values["ingress"]))
    opt_in = f"{kubernetes['opt_in_label']}={kubernetes['opt_in_value']}"
    checks: list[Check] = []
    try:
        checks.append(crds_check([crd for crd in CRDS if cluster.crd(crd) is not None]))
        policy_crd = cluster.crd(KYVERNO_POLICY_CRD)
        try:
            deployments = cluster.deployments(KYVERNO_CONTROLLERS)
        except KubeError as error:
            if error.status != 403:
                raise
            deployments = []
        checks.append(kyverno_version_check(deployments, policy_crd, upstream.proven().get("kyverno")))
        checks.extend(kyverno_rbac_checks(expected_roles, cluster.cluster_roles(), fixes.apply))
        checks.append(policies_check(expected_policies, cluster.cluster_policies() if policy_crd else [], fixes.apply))
        where = f"{kubernetes['system_namespace']}/{kubernetes['seed_secret']}"
        digest = cluster.secret_digest(kubernetes["system_namespace"], kubernetes["seed_secret"], "seed")
        checks.append(seed_secret_check(digest, seed, where, fixes.apply_seed))
        # A namespace being deleted takes its VMs with it: nothing there to fix.
        namespaces = [ns for ns in cluster.namespaces(opt_in) if not ns["metadata"].get("deletionTimestamp")]
        checks.append(namespaces_check(namespaces, opt_in))
        inventories = []
        for namespace in sorted(str(ns["metadata"]["name"]) for ns in namespaces):
            inventories.append(Inventory(
                namespace, cluster.virtual_machines(namespace), cluster.secret_names(namespace),
                {str(b["metadata"]["name"]) for b in cluster.virtual_machine_bmcs(namespace)},
                cluster.ingresses(namespace)))
        checks.extend(vms_check(inventory, generated, opt_in) for inventory in inventories)
        if values["exposure"] == "ingress":
            checks.append(allowlist_check(inventories, generated, fixes.apply))
        checks.extend(exposure_checks(values, cluster, namespaces, inventories, fixes))
        checks.append(network_policies_check(
            {inventory.namespace: cluster.network_policies(inventory.namespace) for inventory in inventories},
            generated, fixes.apply))
        checks.append(cni_check(_listed_or_none(cluster.daemonsets)))
        every_ingress = _listed_or_none(lambda: cluster.ingresses(None))
        checks.append(catch_all_check(every_ingress, values["ingress"]["class_name"], values["ingress"]["allow_catch_all"]))
        checks.extend(proxy_checks(values, cluster, every_ingress, inventories, fixes))
    except KubeError as error:
        done = {c.name.split("/")[0] for c in checks}
        checks.append(api_check(error))
        return checks + _skipped([n for n in cluster_check_names(values) if n not in done],
                                 "the API server did not answer")
    for inventory in inventories:
        if inventory.namespace in reach.hosts:
            continue
        for vm in sorted(str(v["metadata"]["name"]) for v in inventory.vms):
            try:
                reach.hosts[inventory.namespace] = identity.redfish_host(vm, inventory.namespace, domain)
                break
            except identity.IdentityError:
                continue
    return checks
