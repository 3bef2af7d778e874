"""``maas-kubevirt doctor``: check a whole site (MAAS, the cluster, the network) and say how to fix it.

Each check gives one row: its name, ok / warn / fail / skip, what it found and the exact fix.
The checks themselves are pure functions over what MAAS, the API server and the local system
answer; ``run`` gathers those answers (read-only everywhere) and ``main`` prints them
as a table or as JSON. Exit status: 0 when nothing fails, 1 otherwise, 2 for usage or
configuration errors.

Secrets: the seed, the BMC passwords and the API key are compared (in constant time, or by
SHA-256 digest) and never printed; the seed Secret's value never leaves :mod:`kube`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
import json
import os
import posixpath
import pwd
import re
import shlex
import socket
import ssl
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence
from urllib.parse import urlsplit

from maas_kubevirt import EXIT_FAILED, EXIT_OK, EXIT_USAGE, PROG, identity, policies
from maas_kubevirt import seed as seeds
from maas_kubevirt.maas import (
    DNS_NAME_REJECTED,
    MIN_MAAS_VERSION,
    MAASAuthError,
    MAASClient,
    MAASError,
    parse_version,
)
from maas_kubevirt.console import error, table, warn
from maas_kubevirt.paths import SCRIPT_NAME
from maas_kubevirt.reconcile import RIGHT, Match, Passwords, matching
# What upload-script checks before it uploads is what doctor checks in MAAS.
from maas_kubevirt.render import REQUIRED_TAGS, rendering_problem
from maas_kubevirt.values import ValuesError

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
STATUSES = (OK, WARN, FAIL, SKIP)

# `render`'s default output directory, named in the fixes.
RENDER_DIR = "build"
FIXED_DNS_VERSIONS = "upgrade to 3.6.5 or 3.7.3"
CRDS = {
    "virtualmachines.kubevirt.io": "KubeVirt",
    "virtualmachinebmcs.bmc.kubevirt.io": "kubevirtBMC",
}
KYVERNO_POLICY_CRD = "clusterpolicies.kyverno.io"
KYVERNO_MIN = tuple(int(part) for part in policies.KYVERNO_MIN_VERSION.split("."))
KYVERNO_CONTROLLERS = "app.kubernetes.io/part-of=kyverno,app.kubernetes.io/component in (admission-controller,background-controller)"
KUBEMACPOOL_VALUE = "allocate"
REDFISH_DEADLINE = 5.0
LISTED = 5  # offenders named in one row; the JSON "subjects" holds them all

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


def _some(items: Sequence[str]) -> str:
    shown = ", ".join(items[:LISTED])
    return shown + (f" and {len(items) - LISTED} more" if len(items) > LISTED else "")


def _version_text(version: Sequence[int]) -> str:
    return ".".join(map(str, version))


# --- MAAS ------------------------------------------------------------------------------------


def version_check(text: str) -> Check:
    """MAAS 2.9 or later, and not one that refuses DNS names in a redfish power address."""
    version = parse_version(text)
    name = "maas.version"
    if version is None:
        return Check(name, WARN, f"cannot read the MAAS version {_clean(text)!r}",
                     "check that maas.url points at a MAAS region (`maas --version` on the region)")
    if version < MIN_MAAS_VERSION:
        return Check(name, FAIL, f"MAAS {_clean(text)}: older than {_version_text(MIN_MAAS_VERSION)}, "
                     "which first hands a commissioning script's power parameters to MAAS (BMC_CONFIG_PATH)",
                     f"upgrade MAAS to {_version_text(MIN_MAAS_VERSION)} or later; {FIXED_DNS_VERSIONS}")
    for low, high in DNS_NAME_REJECTED:
        if low <= version <= high:
            return Check(name, FAIL, f"MAAS {_clean(text)} refuses DNS names in a redfish power address "
                         f"({_version_text(low)}-{_version_text(high)}, LP:2150892): VMs enlist without power",
                         FIXED_DNS_VERSIONS)
    return Check(name, OK, f"MAAS {_clean(text)}")


def admin_check(user: Mapping[str, Any], key_source: str) -> Check:
    """The API key's user is a MAAS administrator (users/?op=whoami: is_superuser)."""
    username = _clean(user.get("username", "?"))
    if user.get("is_superuser") is True:
        return Check("maas.admin", OK, f"the API key belongs to {username}, an administrator")
    return Check("maas.admin", FAIL,
                 f"the API key belongs to {username}, who is not an administrator "
                 "(power parameters and script uploads need one)",
                 f"store an administrator's key in {key_source}: `sudo maas apikey --username ADMIN "
                 f"--generate > {key_source}` (one key, mode 0600)")


def script_check(script: Mapping[str, Any] | None, render_problem: str | None, upload: str) -> Check:
    """The commissioning script is in MAAS, tagged, and its stored text is the render of these values.

    render_problem: why the stored text is not that render (``render.rendering_problem``), or None.
    """
    name = "maas.script"
    if script is None:
        return Check(name, FAIL, f"MAAS has no script {SCRIPT_NAME}", upload)
    problems = []
    tags = script.get("tags")
    tags = [str(t) for t in tags] if isinstance(tags, list) else []
    missing = [tag for tag in REQUIRED_TAGS if tag not in tags]
    if missing:
        problems.append(f"not tagged {', '.join(missing)} (tags: {_clean(', '.join(tags)) or 'none'})")
    if render_problem:
        problems.append(_clean(render_problem))
    if not problems:
        return Check(name, OK, f"{SCRIPT_NAME} is current and tagged {', '.join(REQUIRED_TAGS)}")
    return Check(name, FAIL, f"{SCRIPT_NAME}: " + "; ".join(problems), upload)


def enlist_commissioning_check(value: Any, profile_fix: str) -> Check:
    """enlist_commissioning on: MAAS then runs the built-ins and scripts tagged enlisting."""
    name = "maas.enlist_commissioning"
    if value is True:
        return Check(name, OK, "on: enlistment runs the built-in scripts and those tagged enlisting")
    return Check(name, WARN,
                 f"{'off' if value is False else _clean(repr(value))}: enlistment runs only scripts tagged "
                 "bmc-config (src/metadataserver/api.py), so VMs enlist without hardware details",
                 profile_fix)


def seed_file_check(path: str) -> tuple[Check, str | None]:
    """The seed file passes the reconciler's own checks (:func:`seed.read`): a regular file, not
    a symlink, mode 0600 or 0400, owned by root or this user, 32 or more random bytes.

    Returns the check and, when it passes, the seed, for the checks that compare with it.
    """
    name = "maas.seed_file"
    install = (f"`install -m 600 -o root SEEDFILE {shlex.quote(path or '/etc/maas-kubevirt/seed')}`, "
               "SEEDFILE holding the seed the cluster's seed Secret was rendered from "
               f"({seeds.ACCEPTED})")
    if not path:
        return Check(name, FAIL, "seed.file is empty: the MAAS host has no seed",
                     f"set seed.file in the values, e.g. /etc/maas-kubevirt/seed, then {install}"), None
    try:
        seed = seeds.read(Path(path), "seed.file", follow_symlinks=False)
    except ValuesError as failure:
        return Check(name, FAIL, _clean(failure), install), None
    info = os.stat(path)
    return Check(name, OK, f"{path}: mode {stat.S_IMODE(info.st_mode):04o}, owned by {_user_name(info.st_uid)}, "
                 f"{seeds.random_bytes(seed)} random bytes"), seed


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def claims(matches: Iterable[Match]) -> dict[str, list[str]]:
    """serial ``<vm>.<namespace>`` -> system_ids of the machines whose power address claims it."""
    found: dict[str, list[str]] = {}
    for match in matches:
        found.setdefault(f"{match.vm}.{match.namespace}", []).append(str(match.machine["system_id"]))
    return found


def claims_check(claimed: Mapping[str, Sequence[str]]) -> Check:
    """No VM is claimed by two or more MAAS machines."""
    duplicates = {serial: ids for serial, ids in sorted(claimed.items()) if len(ids) > 1}
    if not duplicates:
        return Check("maas.claims", OK, f"{len(claimed)} VM(s), each claimed by one MAAS machine")
    described = [f"{serial} by {' and '.join(ids)}" for serial, ids in duplicates.items()]
    return Check("maas.claims", FAIL,
                 f"{len(duplicates)} VM(s) claimed by more than one machine: {_some(described)}; "
                 "none of them gets a password, a name, a pool or a commission",
                 "keep the machine whose boot MAC is the VM's and delete the others: "
                 "`maas $PROFILE machine delete SYSTEM_ID`",
                 tuple(sid for ids in duplicates.values() for sid in ids))


def password_check(verdicts: Mapping[str, bool], reconcile: str) -> Check:
    """Every sole claimant's stored power_pass is the one derived from the seed."""
    wrong = sorted(sid for sid, right in verdicts.items() if not right)
    if not wrong:
        return Check("maas.power_password", OK,
                     f"{len(verdicts)} machine(s) hold the BMC password derived from the seed")
    return Check("maas.power_password", FAIL,
                 f"{len(wrong)} machine(s) hold a power password other than the one derived from the seed: "
                 f"{_some(wrong)}", f"`{reconcile} reconcile --once` sets it", tuple(wrong))


# --- cluster -----------------------------------------------------------------------------------


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


def kyverno_version_check(deployments: Iterable[Mapping[str, Any]], policy_crd: Mapping[str, Any] | None) -> Check:
    """Kyverno 1.13 or later: from the controllers' image tags, else from the ClusterPolicy CRD."""
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
        return Check(name, OK, f"Kyverno {_version_text(oldest)} ({_clean(where)})")
    if _has_rule_level_generate_existing(policy_crd):
        return Check(name, OK, f"Kyverno {minimum} or later (the ClusterPolicy CRD has rule-level "
                     "generateExisting; no versioned controller Deployment found)")
    return Check(name, FAIL, f"Kyverno older than {minimum} (the ClusterPolicy CRD lacks rule-level "
                 "generateExisting)", fix)


def _selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector matching labels (matchLabels and matchExpressions)."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator = expression.get("key"), expression.get("operator")
        values = expression.get("values") or []
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and key in labels and labels[key] in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


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
    names: Mapping[str, str]            # kind -> name template (Secret, VirtualMachineBMC, Ingress)
    allowlist: Mapping[str, str]        # Ingress allowlist annotation -> value

    @classmethod
    def from_policies(cls, objects: Iterable[Mapping[str, Any]], allowlist_key: str) -> "Generated":
        """From the rendered ClusterPolicies; allowlist_key is the Ingress class's allowlist annotation."""
        names: dict[str, str] = {}
        allowlist: dict[str, str] = {}
        for obj in objects:
            if obj.get("kind") != "ClusterPolicy":
                continue
            for rule in obj["spec"].get("rules") or []:
                generate = rule.get("generate")
                if not isinstance(generate, dict) or generate.get("kind") not in ("Secret", "VirtualMachineBMC", "Ingress"):
                    continue
                names[generate["kind"]] = generate["name"]
                if generate["kind"] == "Ingress":
                    annotations = ((generate.get("data") or {}).get("metadata") or {}).get("annotations") or {}
                    if allowlist_key in annotations:
                        allowlist[allowlist_key] = annotations[allowlist_key]
        return cls(names, allowlist)

    def name(self, kind: str, vm: str, namespace: str) -> str:
        text = re.sub(r"\{\{\s*request\.object\.metadata\.name\s*\}\}", vm, self.names[kind])
        return re.sub(r"\{\{\s*request\.object\.metadata\.namespace\s*\}\}", namespace, text)


@dataclass
class Inventory:
    """One opted-in namespace as the API server lists it."""
    namespace: str
    vms: list[Mapping[str, Any]]
    secrets: set[str]
    bmcs: set[str]
    ingresses: list[Mapping[str, Any]]


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
        return Check(name, OK, f"{len(inventory.vms)} VM(s), each with MACs, Secret, VirtualMachineBMC and Ingress")
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


# --- network -----------------------------------------------------------------------------------


def system_resolve(host: str) -> list[str]:
    """The addresses a host name resolves to, as the system resolver answers (raises OSError)."""
    return sorted({info[4][0] for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)})


def dns_check(hosts: Mapping[str, str], resolve: Resolver, domain: str) -> Check:
    """``<vm>.<ns>.<domain>`` resolves, for one VM per namespace."""
    if not hosts:
        return Check("network.dns", SKIP, "no VM known in MAAS or the cluster yet")
    failed, answered = [], []
    for namespace, host in sorted(hosts.items()):
        try:
            addresses = resolve(host)
        except (OSError, UnicodeError) as error:
            failed.append(f"{host} ({getattr(error, 'strerror', None) or type(error).__name__})")
            continue
        if not addresses:
            failed.append(f"{host} (no address)")
        else:
            answered.append(f"{host} -> {', '.join(addresses[:2])}")
    if failed:
        return Check("network.dns", FAIL, f"does not resolve: {_some(failed)}",
                     f"add a wildcard DNS record *.{domain} for the Ingress controller's address, "
                     "resolvable from the MAAS rack controllers", tuple(failed))
    return Check("network.dns", OK, _some(answered))


@dataclass(frozen=True)
class Credentials:
    """A machine's Redfish power parameters as MAAS holds them; the repr hides the password."""
    system_id: str
    address: str
    user: str
    password: str = field(repr=False)
    node_id: str = "1"


def redfish_url(address: str, node_id: str) -> str:
    """The URL MAAS's Redfish driver asks for (src/provisioningserver/drivers/power/redfish.py:
    ``https://`` prepended when the address contains no "http", then ``redfish/v1/Systems/<id>``
    joined on)."""
    if "http" not in address:
        address = "https://" + address
    return posixpath.join(address, f"redfish/v1/Systems/{node_id or '1'}")


class _HTTPSConnection(http.client.HTTPSConnection):
    """HTTPS to an address already resolved, with the host name as SNI; unverified, as MAAS does."""

    def __init__(self, address: str, port: int, server_name: str, timeout: float):
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        super().__init__(address, port, timeout=timeout, context=context)
        self._server_name = server_name
        self._ssl_context = context

    def connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), self.timeout)
        self.sock = self._ssl_context.wrap_socket(sock, server_hostname=self._server_name)


def redfish_probe(credentials: Credentials, resolve: Resolver, deadline: float = REDFISH_DEADLINE) -> tuple[int | None, float, str]:
    """GET the Redfish system with MAAS's credentials: (status, seconds, problem)."""
    url = urlsplit(redfish_url(credentials.address, credentials.node_id))
    host = url.hostname or ""
    port = url.port or (443 if url.scheme == "https" else 80)
    start = time.monotonic()
    try:
        address = resolve(host)[0]
        remaining = max(0.1, deadline - (time.monotonic() - start))
        if url.scheme == "https":
            connection: http.client.HTTPConnection = _HTTPSConnection(address, port, host, remaining)
        else:
            connection = http.client.HTTPConnection(address, port, timeout=remaining)
        token = base64.b64encode(f"{credentials.user}:{credentials.password}".encode("utf-8")).decode("ascii")
        try:
            connection.request("GET", url.path or "/", headers={
                "Host": url.netloc.rpartition("@")[2], "User-Agent": "MAAS", "Accept": "application/json",
                "Authorization": f"Basic {token}",
            })
            del token
            response = connection.getresponse()
            response.read(65536)
            status = response.status
        finally:
            connection.close()
    except (OSError, http.client.HTTPException, IndexError, ValueError) as error:
        elapsed = time.monotonic() - start
        if isinstance(error, (socket.timeout, TimeoutError)):
            return None, elapsed, f"no answer within {deadline:g} s"
        return None, elapsed, getattr(error, "strerror", None) or type(error).__name__
    elapsed = time.monotonic() - start
    if elapsed > deadline:
        return status, elapsed, f"answered after {elapsed:.1f} s"
    return status, elapsed, ""


def redfish_check(targets: Mapping[str, Credentials], resolve: Resolver,
                  deadline: float = REDFISH_DEADLINE) -> Check:
    """For one machine per namespace: GET /redfish/v1/Systems/1 with MAAS's credentials is 200 in time."""
    if not targets:
        return Check("network.redfish", SKIP, "no MAAS machine of a KubeVirt VM yet")
    failed, passed = [], []
    for namespace, credentials in sorted(targets.items()):
        status, elapsed, problem = redfish_probe(credentials, resolve, deadline)
        where = f"{credentials.system_id} {urlsplit(redfish_url(credentials.address, credentials.node_id)).hostname}"
        if problem or status != 200:
            why = problem or (f"HTTP {status}" + (" (MAAS's credentials refused)" if status == 401 else ""))
            failed.append(f"{where}: {why}")
        else:
            passed.append(f"{where}: 200 in {elapsed:.1f} s")
    if failed:
        return Check("network.redfish", FAIL, _some(failed),
                     "from a rack controller: `curl -k -u USER https://VM.NAMESPACE.DOMAIN/redfish/v1/Systems/1`; "
                     "401: run the reconciler (it sets the password); timeouts or 403: the Ingress allowlist "
                     "(ingress.source_ranges) must hold the rack controllers' addresses",
                     tuple(f.split(":", 1)[0] for f in failed))
    return Check("network.redfish", OK, _some(passed))


# --- gathering: read-only requests, then the checks above ------------------------------------


@dataclass
class Options:
    kubeconfig: str | None = None
    context: str | None = None
    command: str = PROG                      # how the operator runs us, for the fixes
    resolve: Resolver | None = None         # None: the system resolver
    redfish_deadline: float = REDFISH_DEADLINE


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
        self.upload = f"`{render} && {command} upload-script --script {RENDER_DIR}/commissioning/{SCRIPT_NAME}`"
        self.enlist = "`maas $PROFILE maas set-config name=enlist_commissioning value=true`"
        self.reconcile = command
        self.key_source = "MAAS_API_KEY" if os.environ.get("MAAS_API_KEY") else values["maas"]["api_key_file"]


def _skipped(names: Iterable[str], reason: str) -> list[Check]:
    return [Check(name, SKIP, reason) for name in names]


def _refused(error: MAASError, fixes: _Fixes) -> Check:
    return Check("maas.admin", FAIL, f"the API key was refused: {_clean(error)}",
                 f"store a valid administrator's key in {fixes.key_source}: "
                 "`sudo maas apikey --username ADMIN --generate`")


MAAS_CHECKS = ("maas.version", "maas.admin", "maas.script", "maas.enlist_commissioning",
               "maas.claims", "maas.power_password")


def maas_checks(values: Mapping[str, Any], client: MAASClient, seed: str | None, fixes: _Fixes,
                reach: Reach) -> list[Check]:
    """The MAAS checks, and the hosts and credentials the network checks will use."""
    domain = values["redfish"]["domain"]
    checks: list[Check] = []
    try:
        checks.append(version_check(client.version()))
    except MAASAuthError as error:
        # MAAS answers version/ without authentication, but refuses a request signed by a bad key.
        checks.append(Check("maas.version", SKIP, "not read: the API key was refused"))
        checks.append(_refused(error, fixes))
        return checks + _skipped(MAAS_CHECKS[2:], "the API key was refused")
    except MAASError as error:
        checks.append(Check("maas.version", FAIL, f"no answer from MAAS at {values['maas']['url']}: {_clean(error)}",
                            "check maas.url: the region API answers `curl URL/api/2.0/version/`"))
        return checks + _skipped(MAAS_CHECKS[1:], "MAAS did not answer")
    try:
        user = client.whoami()
    except MAASAuthError as error:
        checks.append(_refused(error, fixes))
        return checks + _skipped(MAAS_CHECKS[2:], "the API key was refused")
    except MAASError as error:
        checks.append(Check("maas.admin", FAIL, _clean(error), "check the MAAS region's logs"))
        user = {}
    else:
        checks.append(admin_check(user, fixes.key_source))
    admin = user.get("is_superuser") is True
    try:
        script = client.script(SCRIPT_NAME)
        problem = None
        if script is not None:
            stored = client.script_text(SCRIPT_NAME).decode("utf-8", "replace")
            problem = rendering_problem(stored, dict(values), "the text MAAS stores")
        checks.append(script_check(script, problem, fixes.upload))
    except MAASError as error:
        checks.append(Check("maas.script", FAIL, f"cannot read the script: {_clean(error)}", fixes.upload))
    try:
        checks.append(enlist_commissioning_check(client.config("enlist_commissioning"), fixes.enlist))
    except MAASError as error:
        checks.append(Check("maas.enlist_commissioning", FAIL, f"cannot read it: {_clean(error)}", fixes.enlist))
    if not admin:
        return checks + _skipped(MAAS_CHECKS[4:], "power parameters need an administrator's key")
    try:
        machines = client.machines()
        redfish = [str(m["system_id"]) for m in machines if m.get("power_type") == "redfish"]
        matches = matching(machines, client.power_addresses(redfish), domain)
        claimed = claims(matches)
        checks.append(claims_check(claimed))
        sole = {serial: ids[0] for serial, ids in claimed.items() if len(ids) == 1}
        chosen: set[tuple[str, str]] = set()      # (vm, namespace): one per namespace, for Redfish
        for serial in sorted(sole, key=lambda s: identity.parse_serial(s)[::-1]):
            vm, namespace = identity.parse_serial(serial)
            if namespace not in reach.hosts:
                reach.hosts[namespace] = identity.redfish_host(vm, namespace, domain)
                chosen.add((vm, namespace))

        passwords = Passwords(seed) if seed else None   # the reconciler's own comparison

        def keep(parameters: Mapping[str, Any]) -> bool | None:
            """Whether the password is right; MAAS's credentials kept only for the chosen VMs."""
            parsed = identity.parse_redfish_address(parameters.get("power_address"), domain)
            if parsed is None:
                return None
            if parsed in chosen:
                reach.credentials[parsed[1]] = Credentials(
                    sole[identity.format_serial(*parsed)], str(parameters.get("power_address")),
                    str(parameters.get("power_user") or ""), str(parameters.get("power_pass") or ""),
                    str(parameters.get("node_id") or "1"))
            return passwords.judge(parameters, domain).password == RIGHT if passwords else None

        verdicts = client.power_parameters(sole.values(), keep)
        if seed is None:
            checks.append(Check("maas.power_password", SKIP, "no seed to derive the passwords from (see maas.seed_file)"))
        else:
            checks.append(password_check({sid: bool(v) for sid, v in verdicts.items() if v is not None}, fixes.reconcile))
    except MAASError as error:
        checks.append(Check("maas.claims", FAIL, f"cannot read the machines: {_clean(error)}", "check the MAAS region's logs"))
    return checks


CLUSTER_CHECKS = ("cluster.crds", "cluster.kyverno", "cluster.kyverno_rbac", "cluster.policies",
                  "cluster.seed_secret", "cluster.kubemacpool", "cluster.vms", "cluster.ingress_allowlist")


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
        checks.append(kyverno_version_check(deployments, policy_crd))
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
        checks.append(allowlist_check(inventories, generated, fixes.apply))
    except KubeError as error:
        done = {c.name.split("/")[0] for c in checks}
        checks.append(Check("cluster.api", FAIL, _clean(error),
                            "check the kubeconfig's server and that its user may get and list these objects"))
        return checks + _skipped([n for n in CLUSTER_CHECKS if n not in done], "the API server did not answer")
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


def run(values: Mapping[str, Any], client: MAASClient, cluster: Any | None, options: Options) -> list[Check]:
    """Every check, in order: MAAS, the seed file, the cluster, the network."""
    fixes = _Fixes(options.command, values)
    reach = Reach()
    seed_check, seed = seed_file_check(values["seed"]["file"])
    checks = maas_checks(values, client, seed, fixes, reach)
    checks.append(seed_check)
    if cluster is None:
        checks.append(Check("cluster", SKIP, "no --kubeconfig given: the cluster was not checked",
                            f"`{options.command} doctor --kubeconfig FILE` (read access is enough)"))
    else:
        checks.extend(cluster_checks(values, cluster, seed, fixes, reach))
    resolve = options.resolve or system_resolve
    checks.append(dns_check(reach.hosts, resolve, values["redfish"]["domain"]))
    checks.append(redfish_check(reach.credentials, resolve, options.redfish_deadline))
    reach.credentials.clear()
    return checks


def summary(checks: Sequence[Check]) -> dict[str, int]:
    return {status: sum(c.status == status for c in checks) for status in STATUSES}


def render_table(checks: Sequence[Check]) -> str:
    rows = [(c.name, c.status, c.found, c.fix or "-") for c in checks]
    counts = summary(checks)
    return table(("CHECK", "STATUS", "FOUND", "FIX"), rows) + "\n" + \
        ", ".join(f"{n} {status}" for status, n in counts.items())


def render_json(checks: Sequence[Check]) -> str:
    return json.dumps({"checks": [c.as_dict() for c in checks], "summary": summary(checks)}, indent=2)


def main(values: dict, args: Any) -> int:
    """``doctor [--kubeconfig FILE [--context NAME]] [--json]``: 0 nothing fails, 1 something does."""
    from maas_kubevirt.maas import RetryPolicy, client_from_values

    command = PROG + (f" --values {shlex.quote(args.values)}" if getattr(args, "values", None) else "")
    options = Options(kubeconfig=getattr(args, "kubeconfig", None), context=getattr(args, "context", None),
                      command=command)
    cluster = None
    if options.kubeconfig:
        from maas_kubevirt.kube import Cluster, KubeConfigError

        try:
            cluster = Cluster(options.kubeconfig, options.context)
        except KubeConfigError as failure:
            error(str(failure))
            return EXIT_USAGE
        if cluster.insecure:
            warn(f"the kubeconfig skips verifying the API server's certificate ({cluster.host})")
    client = client_from_values(values, warn)
    # A diagnosis should not sit through the reconciler's patient retries.
    client.retry = RetryPolicy(attempts=2, backoff=1.0, max_retry_after=5.0)
    try:
        checks = run(values, client, cluster, options)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
    print(render_json(checks) if getattr(args, "json", False) else render_table(checks), flush=True)
    return EXIT_FAILED if any(c.status == FAIL for c in checks) else EXIT_OK
