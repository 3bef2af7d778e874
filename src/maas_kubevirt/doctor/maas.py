"""doctor's MAAS checks: version, administrator key, script, enlistment setting, seed file,
claims, suspect addresses, stored power passwords and refused commissions."""

from __future__ import annotations

import os
import pwd
import shlex
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from maas_kubevirt import identity, lease, upstream
from maas_kubevirt import seed as seeds
from maas_kubevirt.audit import Audit
from maas_kubevirt.doctor import FAIL, OK, SKIP, WARN, Check, _clean, _skipped, _some, _version_text
from maas_kubevirt.doctor.network import Credentials
from maas_kubevirt.maas import (
    DNS_NAME_REJECTED,
    MIN_MAAS_VERSION,
    MAASAuthError,
    MAASClient,
    MAASError,
    nearest_proven,
    parse_version,
    release_key,
)
from maas_kubevirt.paths import SCRIPT_NAME
from maas_kubevirt.reconcile import (RIGHT, Backoff, Exposure, Match, Passwords, Reconciler, Settings, Switched, Wait,
                                     in_default_pool, lowered_fix, lowered_generations, is_new, matching, owned_pools, pool_of, trusted)
# What upload-script checks before it uploads is what doctor checks in MAAS.
from maas_kubevirt.render import REQUIRED_TAGS, rendering_problem
from maas_kubevirt.values import ValuesError

if TYPE_CHECKING:
    from maas_kubevirt.doctor import Reach, _Fixes

FIXED_DNS_VERSIONS = "upgrade to 3.6.5 or 3.7.3"


def version_check(text: str, proven: "Sequence[str] | str | None" = None) -> Check:
    """MAAS 2.9 or later, not one that refuses DNS names in a redfish power address (fail), and
    one of the releases the real-MAAS tier proves the bundle on (upstream.lock.yaml's
    `maas-proven:`): ok on one of those, a warning naming the nearest on any other release."""
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
    releases = proven.split() if isinstance(proven, str) else list(proven or ())
    # Compared with their pre-releases: 3.8.0~a1 is proven 3.8.0a1, and neither is 3.8.0.
    parsed = {release_key(release): release for release in releases}
    parsed.pop(None, None)
    if not parsed:
        return Check(name, OK, f"MAAS {_clean(text)}")
    listed = ", ".join(parsed[release] for release in sorted(parsed))
    key = release_key(text)
    if key in parsed:
        return Check(name, OK, f"MAAS {_clean(text)} (proven on {listed})")
    nearest = parsed[nearest_proven(key, list(parsed))]
    return Check(name, WARN, f"MAAS {_clean(text)}: not a release maas-kubevirt is proven on ({listed}, "
                 f"{upstream.LOCK_NAME}); the nearest proven is {nearest}",
                 f"run MAAS {nearest}, the nearest proven release")


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
    install = (f"`install -m 600 -o root SEEDFILE {shlex.quote(path or str(seeds.INSTALLED_SEED))}`, "
               "SEEDFILE holding the seed the cluster's seed Secret was rendered from "
               f"({seeds.ACCEPTED})")
    if not path:
        return Check(name, FAIL, "seed.file is empty: the MAAS host has no seed",
                     _empty_seed_fix(install)), None
    try:
        seed = seeds.read(Path(path), "seed.file", follow_symlinks=False)
    except ValuesError as failure:
        return Check(name, FAIL, _clean(failure), install), None
    info = os.stat(path)
    return Check(name, OK, f"{path}: mode {stat.S_IMODE(info.st_mode):04o}, owned by {_user_name(info.st_uid)}, "
                 f"{seeds.random_bytes(seed)} random bytes"), seed


def _empty_seed_fix(install: str) -> str:
    """Point seed.file at a seed file that exists here, else say how to install one."""
    found = seeds.existing_seed_files()
    if found:
        return seeds.where_to_point()
    return f"set seed.file in the values, e.g. {seeds.INSTALLED_SEED}, then {install}"


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def claims(matches: Iterable[Match]) -> dict[str, list[str]]:
    """serial ``<vm>.<namespace>`` -> system_ids of the machines whose canonical power address claims it."""
    found: dict[str, list[str]] = {}
    for match in matches:
        if not match.canonical:
            continue
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


def password_check(verdicts: Mapping[str, bool], reconcile: str, unread: str = "") -> Check:
    """Every sole claimant's stored power_pass is the one derived from the seed (and its VM's
    credential generation; ``unread`` says why the generations are not known)."""
    wrong = sorted(sid for sid, right in verdicts.items() if not right)
    if not wrong:
        return Check("maas.power_password", OK,
                     f"{len(verdicts)} machine(s) hold the BMC password derived from the seed")
    caveat = f" (credential generations not read: {unread}; a rotated VM's password shows as other)" if unread else ""
    return Check("maas.power_password", FAIL,
                 f"{len(wrong)} machine(s) hold a power password other than the one derived from the seed: "
                 f"{_some(wrong)}{caveat}", f"`{reconcile} reconcile --once` sets it", tuple(wrong))


def rotations_check(needing: Mapping[tuple[str, str], Exposure], command: str, audit_log: str,
                    automatic: bool) -> Check:
    """No VM's password waits to be rotated after it sat beside another address (from the audit log)."""
    name = "maas.rotations"
    if not audit_log:
        return Check(name, SKIP, "maas.audit_log is not set: a password taken back from beside another "
                     "address is not recorded")
    if not needing:
        return Check(name, OK, "no VM's password waits to be rotated")
    named = [f"{vm}.{namespace} (taken back from {e.system_id} at generation {e.generation})"
             for (vm, namespace), e in sorted(needing.items())]
    commands = "; ".join(f"`{command} rotate {vm}.{namespace}`" for vm, namespace in sorted(needing))
    fix = ("the reconciler rotates them at its next cycle on reconciler.lease's cluster access; by hand: "
           if automatic else "configure reconciler.lease (the reconciler then rotates by itself), then: ")
    return Check(name, WARN, f"{len(named)} VM(s) whose password may have leaked (MAAS held it beside an "
                 f"address that is not the VM's BMC) and is not rotated: {_some(named)}", fix + commands,
                 tuple(f"{vm}.{namespace}" for vm, namespace in sorted(needing)))



def generations_check(highest: Mapping[tuple[str, str], int], generations: Mapping[tuple[str, str], int] | None,
                      unread: str, audit_log: str, system_namespace: str) -> Check:
    """The cluster's credential generations can be read, and none is below one the reconciler used."""
    name = "maas.generations"
    if generations is None:
        return Check(name, SKIP if unread.startswith("no cluster access") else FAIL,
                     f"the credential generations cannot be read: {unread}; the reconciler still takes derived "
                     "credentials back, but derives no password until it can read them",
                     "check reconciler.lease's cluster access and that ConfigMap "
                     f"{system_namespace}/{identity.ROTATIONS_CONFIGMAP} exists: "
                     f"`kubectl -n {system_namespace} get configmap {identity.ROTATIONS_CONFIGMAP}`")
    if not audit_log:
        return Check(name, SKIP, "maas.audit_log is not set: the generations the reconciler used are not recorded")
    lowered = lowered_generations(highest, generations)
    if not lowered:
        return Check(name, OK, f"{len(generations)} VM(s) past generation 0; none below a generation the "
                     "reconciler already used")
    named = [f"{vm}.{namespace} (the cluster says {said}, {highest[(vm, namespace)]} was used)"
             for (vm, namespace), said in lowered.items()]
    return Check(name, FAIL, f"{len(named)} VM(s) whose generation the cluster says lower than the reconciler "
                 f"already used, so it derives none of their passwords (rotated-away credentials would come "
                 f"back): {_some(named)}", "put each back: " + "; ".join(
                     f"`{lowered_fix(who, highest[who], system_namespace)}`" for who in lowered),
                 tuple(f"{vm}.{namespace}" for vm, namespace in lowered))


def switched_check(switched: Mapping[str, Switched], audit_log: str) -> Check:
    """No machine whose VM's credentials were taken back after an enlistment switched its power type stays so."""
    name = "maas.power_types"
    if not audit_log:
        return Check(name, SKIP, "maas.audit_log is not set: a switch of power type is not recorded")
    if not switched:
        return Check(name, OK, "no VM's machine is left on another power type than redfish")
    named = [f"{s.who[0]}.{s.who[1]} on {sid} ({s.power_type})" for sid, s in switched.items()]
    return Check(name, WARN, f"{len(named)} VM machine(s) switched to another power type by an enlistment; "
                 f"their derived credentials were taken back, so MAAS cannot power those VMs: {_some(named)}",
                 "; ".join(s.fix() for s in switched.values()), tuple(switched))


KEY_REFUSED = "the API key was refused"


def _refused(error: MAASError, fixes: _Fixes) -> Check:
    return Check("maas.admin", FAIL, f"{KEY_REFUSED}: {_clean(error)}",
                 f"store a valid administrator's key in {fixes.key_source}: "
                 "`sudo maas apikey --username ADMIN --generate`")


def suspects_check(suspects: Mapping[str, tuple[str, str, str]], domain: str) -> Check:
    """No machine's power address only imitates a BMC host (system_id -> (vm, namespace, address))."""
    name = "maas.suspects"
    if not suspects:
        return Check(name, OK, f"every Redfish address under {domain} is a bare <vm>.<namespace>.{domain}")
    named = [f"{sid} ({_clean(ascii(address))} imitates {identity.claimed_host(vm, ns, domain)})"
             for sid, (vm, ns, address) in sorted(suspects.items())]
    return Check(name, FAIL, f"{len(named)} machine(s) whose power address imitates a BMC host, so they get no "
                 f"password: {_some(named)}",
                 "if the machine is that VM, set the bare host: `maas $PROFILE machine update SYSTEM_ID "
                 "power_parameters_power_address=<vm>.<namespace>.<domain>`; otherwise delete it "
                 "(a port, path or scheme in front of the BMC is not supported)",
                 tuple(sorted(suspects)))


def pools_check(kept: Mapping[str, tuple[str, str]]) -> Check:
    """No VM is held in default because its namespace's pool is not the reconciler's (system_id -> (serial, pool))."""
    name = "maas.pools"
    if not kept:
        return Check(name, OK, "every VM's namespace pool is maas-kubevirt's own, or adopted, or not there yet")
    named = [f"{sid} ({serial}: pool {_clean(repr(pool))})" for sid, (serial, pool) in sorted(kept.items())]
    return Check(name, WARN, f"{len(named)} VM machine(s) left in default because a pool named like their namespace "
                 f"exists and was not created by maas-kubevirt: {_some(named)}",
                 "if the pool is meant for these VMs, name it in maas.adopt_pools; otherwise rename that pool, or "
                 "delete the machines if they are not your VMs (anyone on the PXE network can enlist as <vm>.<pool>)",
                 tuple(sorted(kept)))


def commission_check(waits: Mapping[str, Wait], hosts: Mapping[str, str], audit_log: str) -> Check:
    """No VM waits because its commission failed (the reconciler's backoff, from its audit log)."""
    name = "maas.commission"
    if not audit_log:
        return Check(name, SKIP, "maas.audit_log is not set: the reconciler's failed commissions are not recorded")
    if not waits:
        return Check(name, OK, "no failed commission is waiting")
    named = [f"{sid} ({hosts.get(sid, '?')}): {_clean(wait.why())}" for sid, wait in sorted(waits.items())]
    return Check(name, WARN, f"{len(named)} VM(s) whose commission failed: {_some(named)}",
                 "MAAS refused it or could not power the VM on: usually no rack controller can reach the BMC, or the "
                 "BMC refused the password (MAAS then reverts the machine to New); check that <vm>.<namespace>.<domain> "
                 "resolves on the rack controllers (network.dns), that its Ingress exists and answers "
                 "(network.redfish), and that ingress.source_ranges holds the rack controllers' addresses; "
                 "the reconciler tries again when the wait is over",
                 tuple(sorted(waits)))


MAAS_CHECKS = ("maas.version", "maas.admin", "maas.script", "maas.enlist_commissioning",
               "maas.claims", "maas.suspects", "maas.pools", "maas.power_password", "maas.commission",
               "maas.rotations", "maas.generations", "maas.power_types")


def maas_checks(values: Mapping[str, Any], client: MAASClient, seed: str | None, fixes: _Fixes,
                reach: Reach, generations: Mapping[tuple[str, str], int] | None = None,
                unread: str = "") -> list[Check]:
    """The MAAS checks, and the hosts and credentials the network checks will use. ``generations``:
    every VM's credential generation, when read (else ``unread`` says why)."""
    domain = values["redfish"]["domain"]
    checks: list[Check] = []
    try:
        checks.append(version_check(client.version(), upstream.proven_releases("maas")))
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
        stored = client.power_addresses(redfish)
        matches = matching(machines, stored, domain)
        claimed = claims(matches)
        checks.append(claims_check(claimed))
        addresses = {str(m.machine["system_id"]): m for m in matches}
        checks.append(suspects_check({sid: (m.vm, m.namespace, str(stored.get(sid)))
                                      for sid, m in addresses.items() if not m.canonical}, domain))
        waiting_for_pool = [m for m in trusted(matches) if in_default_pool(m.machine)
                            and pool_of(m.machine)[0] != identity.pool_name(m.namespace)]
        pools = client.pools() if waiting_for_pool else []
        owned = owned_pools(pools + [m.get("pool") for m in machines if isinstance(m, Mapping)],
                            values["maas"].get("adopt_pools", []))
        existing = {p.get("name") for p in pools if isinstance(p, Mapping)}
        checks.append(pools_check({str(m.machine["system_id"]): (identity.format_serial(m.vm, m.namespace),
                                                                  identity.pool_name(m.namespace))
                                   for m in waiting_for_pool
                                   if identity.pool_name(m.namespace) in existing - owned}))
        sole = {serial: ids[0] for serial, ids in claimed.items() if len(ids) == 1}
        chosen: set[tuple[str, str]] = set()      # (vm, namespace): one per namespace, for Redfish
        for serial in sorted(sole, key=lambda s: identity.parse_serial(s)[::-1]):
            vm, namespace = identity.parse_serial(serial)
            if namespace not in reach.hosts:
                reach.hosts[namespace] = identity.redfish_host(vm, namespace, domain)
                chosen.add((vm, namespace))

        passwords = Passwords(seed, generations) if seed else None   # the reconciler's own comparison

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
            checks.append(password_check({sid: bool(v) for sid, v in verdicts.items() if v is not None}, fixes.reconcile,
                                         unread if generations is None else ""))
        audit_log = values["maas"].get("audit_log", "")
        records = Audit.read_file(audit_log)
        backoff = Backoff(values["maas"]["interval"])
        backoff.restore(records)
        new = {str(m.machine["system_id"]) for m in matches if m.canonical and is_new(m.machine)}
        waits = {sid: wait for sid, wait in backoff.pending().items() if sid in new}
        checks.append(commission_check(
            waits, {sid: identity.claimed_host(m.vm, m.namespace, domain) for sid, m in addresses.items()}, audit_log))
        # What the reconciler would rotate: its own fold of the audit records.
        restored = Reconciler(client, Settings.from_values(values), passwords=Passwords(seed or "-", generations))
        restored.restore(records)
        checks.append(rotations_check(restored.needing_rotation(), fixes.reconcile, audit_log,
                                      lease.configured(values)))
        checks.append(generations_check(restored.highest, generations, unread, audit_log,
                                        values["kubernetes"]["system_namespace"]))
        checks.append(switched_check(restored.still_switched(machines), audit_log))
    except MAASError as error:
        checks.append(Check("maas.claims", FAIL, f"cannot read the machines: {_clean(error)}", "check the MAAS region's logs"))
    return checks
