"""The reconciler: MAAS machines whose Redfish power address is exactly the bare host
``<vm>.<namespace>.<domain>`` get their BMC password (derived from the seed), are renamed
``<vm>-<namespace>``, filed in the pool ``<namespace>`` and, in New and with the password in
place, commissioned.

- ``plan(machines, power, pools, settings, taken, waiting)`` is pure: it returns the actions.
  ``power`` holds per machine only its address and whether its password is right (``Power``),
  never a password; ``taken``: hostnames other nodes hold, devices and controllers included;
  ``waiting``: machines whose commission backs off.
- Fail closed: the password goes only to the sole claimant of an identity whose address is
  canonical, in the same PUT that writes that address. A look-alike address (a suspect), a
  duplicate claim, or an address changed after the password was set: a derived password found
  there is put back to the placeholder (``reset-password``).
- ``apply(client, actions, audit, stop, passwords, backoff)`` carries them out; a machine's
  password, rename and pool move are one ``PUT machines/{id}/`` (one at a time when MAAS refuses
  the whole with a 400); each change is one JSON audit record; a commission MAAS refuses backs
  that machine off (``Backoff``).
- ``Reconciler`` runs cycles. A cycle asks MAAS's event log what happened since the last one
  (``events.py``: two small requests when nothing did) and reads only the machines named there,
  ours in Commissioning or Testing and those whose backoff ended (``GET machines/?id=``), with
  their power parameters in one bulk request; a full resync (one ``GET machines/``, every redfish
  machine's power parameters) runs at start, every ``maas.resync_interval`` and when the log
  cannot be trusted, and every ``maas.power_check_interval`` one bulk read of our machines' power
  parameters catches an address edited without an event. The pools are read only when a machine
  may need moving, ``nodes/?hostname=`` only when a rename may happen; then, only when
  something is to change, one bulk re-read of the addresses of the machines about to change. An
  idle cycle costs 2 small requests. A malformed machine record is skipped with one warning; the
  whole cycle runs within ``maas.cycle_deadline``.
- Two or more machines claiming one ``<vm>.<namespace>``: none of them gets anything, and one
  audit record names them all each time that set changes; a suspect likewise, once per address.

The commands that run it live elsewhere: ``loop`` (reconcile), ``status``.
"""

from __future__ import annotations

import hmac
import math
import threading
import time
from datetime import datetime, timezone
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from maas_kubevirt import events, identity
from maas_kubevirt.audit import NAME_LIMIT, Audit, cap
from maas_kubevirt.console import error, note, warn
from maas_kubevirt.maas import (
    MAASAuthError,
    MAASClient,
    MAASError,
    MAASVersionError,
    check_version,
    valid_system_id,
)


DEFAULT_POOL = "default"
DEFAULT_POOL_ID = 0
NEW = "New"

# The kinds of action that change MAAS; "skip", "duplicate-claim" and "suspect-address" only explain.
CREATE_POOL, SET_PASSWORD, RESET_PASSWORD, RENAME, MOVE_POOL, COMMISSION = (
    "create-pool", "set-password", "reset-password", "rename", "move-pool", "commission")
SKIP, DUPLICATE, SUSPECT = "skip", "duplicate-claim", "suspect-address"

CHANGES = (CREATE_POOL, SET_PASSWORD, RESET_PASSWORD, RENAME, MOVE_POOL, COMMISSION)
# What one PUT machines/{id}/ carries together: MAAS's form is all or nothing
# (src/maasserver/api/machines.py update, AdminMachineForm), so the password is never stored
# beside an address the reconciler did not write.
UPDATES = (SET_PASSWORD, RENAME, MOVE_POOL)

# A commission MAAS refused waits one interval, then twice as long each time, at most this.
MAX_BACKOFF = 3600.0

# Statuses in which a commissioning script may write the power parameters again.
REREAD_STATUSES = ("Commissioning", "Testing")

# What is known of a machine's stored power_pass (the value itself is never kept).
RIGHT, PLACEHOLDER, UNSET, OTHER, UNKNOWN = "right", "placeholder", "unset", "other", "unknown"
DERIVED = "derived"

# --- plan -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    domain: str
    commission: str = "auto"            # auto | approved | never
    approval_tag: str = "kubevirt-approved"
    on_hostname_taken: str = "fallback"  # fallback | skip
    cycle_deadline: float | None = None  # seconds a whole cycle may take (None: no limit)
    # seconds between full resyncs; None: list every machine in every cycle (no event log)
    resync_interval: float | None = events.DEFAULT_RESYNC_INTERVAL
    interval: float = 60.0               # seconds between cycles: the first commission backoff
    # seconds between bulk re-reads of our machines' power parameters, which catch an address
    # edited by the API or the metadata API (MAAS records no event for either)
    power_check_interval: float = 300.0
    # pools the reconciler may file VMs in although it did not create them
    adopt_pools: tuple[str, ...] = ()

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> "Settings":
        maas = values["maas"]
        return cls(
            domain=identity.validate_domain(values["redfish"]["domain"]),
            commission=maas["commission"],
            approval_tag=maas["approval_tag"],
            on_hostname_taken=maas["on_hostname_taken"],
            cycle_deadline=maas["cycle_deadline"],
            resync_interval=maas["resync_interval"],
            interval=maas["interval"],
            power_check_interval=maas["power_check_interval"],
            adopt_pools=tuple(maas["adopt_pools"]),
        )


@dataclass(frozen=True)
class Action:
    kind: str
    system_id: str | None
    hostname: str | None           # the machine's hostname when planned
    vm: str | None = None
    namespace: str | None = None
    before: str | None = None
    after: str | None = None
    note: str = ""
    # set-password only: the canonical address written in the same PUT as the password (it
    # follows from vm, namespace and the domain, so it takes no part in comparisons).
    address: str | None = field(default=None, compare=False)

    @property
    def changes(self) -> bool:
        return self.kind in CHANGES


@dataclass(frozen=True)
class Match:
    """A redfish machine whose power address names ``<vm>.<namespace>``: exactly (canonical),
    or as a look-alike (a suspect, never trusted with a password)."""

    machine: Mapping[str, Any]
    vm: str
    namespace: str
    canonical: bool = True


@dataclass(frozen=True)
class Power:
    """What the reconciler keeps of a machine's power parameters: the address, and whether the
    stored password is the derived one (RIGHT) or what it is instead. Never the password."""

    address: str | None
    password: str = UNKNOWN
    # The identity whose derived password the machine still holds although its address no
    # longer names it (the address changed after the password was set).
    held: tuple[str, str] | None = None
    # Whether power_user is the derived user of the identity the address names (RIGHT), or not.
    user: str = UNKNOWN

    @property
    def converged(self) -> bool:
        """The derived password and user are both in place."""
        return self.password == RIGHT and self.user == RIGHT


def claim_of(address: Any, domain: str) -> tuple[tuple[str, str] | None, bool]:
    """(the identity an address names, whether it names it canonically)."""
    canonical = identity.parse_redfish_address(address, domain)
    if canonical is not None:
        return canonical, True
    return identity.suspect_identity(address, domain), False


class Passwords:
    """The BMC password rule under the site seed; its repr hides the seed."""

    def __init__(self, seed_text: str):
        self._seed = seed_text

    def __repr__(self) -> str:
        return "Passwords(<seed withheld>)"

    def password(self, vm: str, namespace: str) -> str:
        return identity.bmc_password(self._seed, identity.format_serial(vm, namespace))

    def user(self, vm: str, namespace: str) -> str:
        return identity.bmc_user(self._seed, identity.format_serial(vm, namespace))

    def judge(self, parameters: Mapping[str, Any], domain: str,
              previous: tuple[str, str] | None = None) -> Power:
        """Reduce one machine's power parameters to a Power at once.

        The password is compared in constant time with the derived password of the identity
        the address names (canonically or as a suspect), and of ``previous``, the identity it
        named before, when it names no other now.
        """
        address = parameters.get("power_address")
        address = address if isinstance(address, str) else None
        claimed, _ = claim_of(address, domain)
        stored = parameters.get("power_pass")
        stored = stored if isinstance(stored, str) else ""
        held = previous if (previous is not None and previous != claimed and stored
                            and self.matches(stored, *previous)) else None
        if claimed is None:
            return Power(address, UNKNOWN, held=held)
        user = parameters.get("power_user")
        user = RIGHT if isinstance(user, str) and hmac.compare_digest(
            user.encode("utf-8"), self.user(*claimed).encode("utf-8")) else OTHER
        if self.matches(stored, *claimed):
            return Power(address, RIGHT, user=user)
        if not stored:
            return Power(address, UNSET, held=held, user=user)
        return Power(address, PLACEHOLDER if stored == identity.PLACEHOLDER_PASSWORD else OTHER, held=held,
                     user=user)

    def matches(self, stored: str, vm: str, namespace: str) -> bool:
        return hmac.compare_digest(stored.encode("utf-8"), self.password(vm, namespace).encode("utf-8"))


def _address(parameters: Any) -> Any:
    if isinstance(parameters, Power):
        return parameters.address
    if isinstance(parameters, Mapping):
        return parameters.get("power_address")
    return parameters


def _password(parameters: Any) -> str:
    return parameters.password if isinstance(parameters, Power) else UNKNOWN


def _converged(parameters: Any) -> bool:
    return isinstance(parameters, Power) and parameters.converged


def pool_description(namespace: str) -> str:
    """The description of the pools the reconciler creates: how it knows them again as its own."""
    return f"KubeVirt VMs of namespace {namespace} (maas-kubevirt)"


def owned_pools(pools: Iterable[Any], adopted: Iterable[str]) -> set[str]:
    """The pools a machine may be moved into: those the reconciler created (by their description)
    and those the values adopt. A pool named like a namespace is no proof of anything: an
    administrator's ``gpu-prod`` must not fill up with whatever enlists as ``x.gpu-prod``."""
    owned = set(adopted)
    for pool in pools:
        if isinstance(pool, Mapping) and isinstance(pool.get("name"), str):
            namespace = pool["name"]
            if pool.get("description") == pool_description(namespace):
                owned.add(namespace)
    return owned


def pool_of(machine: Mapping[str, Any]) -> tuple[str | None, int | None]:
    pool = machine.get("pool")
    if isinstance(pool, Mapping):
        return pool.get("name"), pool.get("id")
    if isinstance(pool, str):
        return pool, None
    return None, None


def in_default_pool(machine: Mapping[str, Any]) -> bool:
    name, pool_id = pool_of(machine)
    return name == DEFAULT_POOL or (pool_id == DEFAULT_POOL_ID and name in (None, DEFAULT_POOL))


def is_new(machine: Mapping[str, Any]) -> bool:
    """In New by both the status name and (when given) the status code 0."""
    name, code = machine.get("status_name"), machine.get("status")
    if name is not None:
        return name == NEW and code in (None, 0)
    return code == 0


def machine_problem(machine: Any) -> str | None:
    """What makes a MAAS machine record unusable, or None. The plan reads these fields only."""
    if not isinstance(machine, Mapping):
        return "not an object"
    checks = (
        # As MAAS makes them: anything else would go into a URL path (x/../../machines/<other>).
        ("system_id", valid_system_id),
        ("hostname", lambda v: isinstance(v, str)),
        ("power_type", lambda v: isinstance(v, str)),
        ("status_name", lambda v: isinstance(v, str)),
        ("status", lambda v: isinstance(v, int) and not isinstance(v, bool)),
        ("pool", lambda v: isinstance(v, Mapping) and isinstance(v.get("name"), str)),
        # A list of names: a string would let "kubevirt-approved" match "not-kubevirt-approved".
        ("tag_names", lambda v: isinstance(v, list) and all(isinstance(t, str) for t in v)),
    )
    wrong = [name for name, valid in checks if not valid(machine.get(name))]
    return f"unusable {', '.join(wrong)}" if wrong else None


def names_to_check(matches: Iterable[Match]) -> set[str]:
    """The names a rename might take: each trusted machine not yet on its primary or fallback."""
    names: set[str] = set()
    for match in trusted(matches):
        hostname = match.machine.get("hostname")
        primary = identity.maas_hostname(match.vm, match.namespace)
        fallback = identity.fallback_hostname(match.vm, match.namespace)
        if not isinstance(hostname, str) or hostname.lower() not in (primary, fallback):
            names |= {primary, fallback}
    return names


def matching(
    machines: Iterable[Mapping[str, Any]], power_parameters: Mapping[str, Any], domain: str
) -> list[Match]:
    """The redfish machines whose power address names a ``<vm>.<namespace>``: the canonical
    bare host ``<vm>.<namespace>.<domain>``, or a look-alike of it (a suspect)."""
    found = []
    for machine in machines:
        if machine.get("power_type") != "redfish":
            continue
        system_id = machine.get("system_id")
        if not isinstance(system_id, str) or system_id not in power_parameters:
            continue
        claimed, canonical = claim_of(_address(power_parameters[system_id]), domain)
        if claimed is not None:
            found.append(Match(machine, *claimed, canonical=canonical))
    found.sort(key=lambda m: (m.namespace, m.vm, m.machine["system_id"]))
    return found


def claims(matches: Iterable[Match]) -> tuple[list[Match], dict[tuple[str, str], list[Match]]]:
    """(sole claimants, (vm, namespace) -> the machines claiming it when two or more do), among
    the canonical addresses: a suspect never gets a password anyway, so it blocks no one."""
    by_identity: dict[tuple[str, str], list[Match]] = {}
    for match in matches:
        if not match.canonical:
            continue
        by_identity.setdefault((match.vm, match.namespace), []).append(match)
    sole = [group[0] for group in by_identity.values() if len(group) == 1]
    return sole, {key: group for key, group in by_identity.items() if len(group) > 1}


def duplicate_note(vm: str, namespace: str, group: Sequence[Match]) -> str:
    machines = ", ".join(f"{m.machine.get('system_id')} ({m.machine.get('hostname')})" for m in group)
    return (f"{vm}.{namespace} is claimed by {len(group)} machines: {machines}; none of them gets a "
            "password, rename, pool or commission until only one claims it")


def suspect_note(match: Match, address: Any, domain: str) -> str:
    canonical = identity.claimed_host(match.vm, match.namespace, domain)
    return (f"power address {address!a} is not the bare host {canonical}: no password, rename, pool or "
            "commission (MAAS would send the password where it points)")


def trusted(matches: Iterable[Match]) -> list[Match]:
    """The canonical sole claimants: the only machines that get a password, name, pool or commission."""
    return claims(matches)[0]


def needs_pools(matches: Iterable[Match]) -> bool:
    """Whether any trusted machine may be moved (so the pool list is worth a request)."""
    return any(
        pool_of(m.machine)[0] != identity.pool_name(m.namespace) and in_default_pool(m.machine)
        for m in trusted(matches)
    )


def assign_hostnames(
    machines: Sequence[Mapping[str, Any]], matches: Sequence[Match], on_hostname_taken: str,
    taken: Mapping[str, str] | None = None,
) -> tuple[list[str], dict[str, tuple[str, str]], dict[str, str]]:
    """Which matching machines get which name, and in which order to rename them.

    A name is free when no other machine holds it once the renames before it are done, so a
    machine renamed away frees its old name for a later one (renames are ordered that way).
    Primary names are handed out first; the fallback (``on_hostname_taken: fallback``) only to
    a machine whose primary stays held. A machine already on its primary or fallback keeps it.
    ``taken`` (hostname -> system_id) adds the names held by nodes that are not in
    ``machines``: devices and controllers (MAAS keeps hostnames unique over all nodes).
    Returns (order, system_id -> (new name, note), system_id -> reason for not renaming).
    """
    names: dict[str, str] = {}          # lower-cased name -> system_id, as it will be
    for machine in machines:
        hostname = machine.get("hostname")
        if isinstance(hostname, str):
            names.setdefault(hostname.lower(), str(machine.get("system_id")))
    for hostname, holder in (taken or {}).items():
        names.setdefault(hostname.lower(), holder)
    pending: list[tuple[str, Any, str, str]] = []
    for match in matches:
        hostname = match.machine.get("hostname")
        primary = identity.maas_hostname(match.vm, match.namespace)
        fallback = identity.fallback_hostname(match.vm, match.namespace)
        if not isinstance(hostname, str) or hostname.lower() not in (primary, fallback):
            pending.append((str(match.machine["system_id"]), hostname, primary, fallback))

    order: list[str] = []
    renames: dict[str, tuple[str, str]] = {}

    def take(system_id: str, hostname: Any, target: str, note: str) -> str | None:
        """Rename in the plan; returns the name this frees."""
        old = hostname.lower() if isinstance(hostname, str) else None
        if old is not None and names.get(old) == system_id:
            del names[old]
        names[target] = system_id
        order.append(system_id)
        renames[system_id] = (target, note)
        return old

    while pending:
        # Primary names first. A name freed by a rename may be someone's primary: go round again.
        wanted = {item[2] for item in pending}
        rest, freed_wanted = [], False
        for system_id, hostname, primary, fallback in pending:
            if primary not in names:  # a pending machine holds neither of its names
                freed_wanted |= take(system_id, hostname, primary, "") in wanted
            else:
                rest.append((system_id, hostname, primary, fallback))
        pending = rest
        if freed_wanted:
            continue
        if on_hostname_taken != "fallback":
            break
        # Then fallbacks, stopping early when one frees a name that is still someone's primary.
        wanted = {item[2] for item in pending}
        rest, progress, freed_wanted = [], False, False
        for system_id, hostname, primary, fallback in pending:
            if not freed_wanted and fallback not in names:
                note = f"{primary} is held by {names.get(primary)}: using the fallback name"
                freed_wanted = take(system_id, hostname, fallback, note) in wanted
                progress = True
            else:
                rest.append((system_id, hostname, primary, fallback))
        pending = rest
        if not progress:
            break
    skipped: dict[str, str] = {}
    for system_id, hostname, primary, fallback in pending:
        holder = names.get(primary)
        if on_hostname_taken == "fallback":
            skipped[system_id] = (f"rename: {primary} is held by {holder} and the fallback "
                                  f"{fallback} by {names.get(fallback)}")
        else:
            skipped[system_id] = f"rename: {primary} is held by {holder} (maas.on_hostname_taken: skip)"
    return order, renames, skipped


def plan(
    machines: Sequence[Mapping[str, Any]],
    power_parameters: Mapping[str, Any],
    pools: Iterable[Any],
    settings: Settings,
    taken: Mapping[str, str] | None = None,
    waiting: Mapping[str, str] | None = None,
) -> list[Action]:
    """The actions that bring the matching machines to their password, name, pool and commissioning.

    machines: MAAS machine objects (system_id, hostname, status, status_name, power_type, pool,
    tag_names). power_parameters: system_id -> Power (or a bare address, or a mapping holding
    it: the password is then unknown, so it is set); machines without an entry are not ours.
    pools: pool names or objects with a name. taken: hostname -> system_id of other nodes
    holding names (``GET nodes/?hostname=``). waiting: system_id -> why its commission waits
    (a backoff after MAAS refused one). Order: duplicate claims and suspects, password resets,
    pool creations, then each trusted machine's actions (password first, commission last),
    machines in the order their renames must happen (one that frees a name before the one that
    takes it).

    Fail closed: a password goes only to the sole claimant of an identity whose address is the
    canonical bare host; every other machine found holding a derived password gets the
    placeholder back.
    """
    pools = list(pools)
    existing = {p.get("name") if isinstance(p, Mapping) else p for p in pools}
    existing |= {pool_of(m)[0] for m in machines}
    # A machine's record carries its pool's description too (src/maasserver/api/machines.py).
    owned = owned_pools(pools + [m.get("pool") for m in machines], settings.adopt_pools)
    claimants = matching(machines, power_parameters, settings.domain)
    matches, duplicates = claims(claimants)
    order, renames, rename_skips = assign_hostnames(machines, matches, settings.on_hostname_taken, taken)
    rank = {system_id: index for index, system_id in enumerate(order)}
    matches = sorted(matches, key=lambda m: rank.get(str(m.machine["system_id"]), len(rank)))
    reported = [
        Action(DUPLICATE, None, None, vm=vm, namespace=namespace,
               after=",".join(str(m.machine["system_id"]) for m in group),
               note=duplicate_note(vm, namespace, group))
        for (vm, namespace), group in duplicates.items()  # in matching's order: namespace, then vm
    ]
    resets: list[Action] = []

    def reset(machine: Mapping[str, Any], vm: str, namespace: str, reason: str) -> None:
        resets.append(Action(RESET_PASSWORD, str(machine["system_id"]), machine.get("hostname"), vm, namespace,
                             before=DERIVED, after=PLACEHOLDER, note=reason))

    def exposed(system_id: Any) -> bool:
        """Whether the machine holds a derived password: its own identity's, or one it had before."""
        power = power_parameters[system_id]
        return _password(power) == RIGHT or (isinstance(power, Power) and power.held is not None)

    for (vm, namespace), group in duplicates.items():
        for match in group:
            if exposed(match.machine["system_id"]):
                reset(match.machine, vm, namespace, f"duplicate claim: {vm}.{namespace} is claimed by "
                      f"{len(group)} machines")
    for match in claimants:
        if match.canonical:
            continue
        system_id = str(match.machine["system_id"])
        address = _address(power_parameters[system_id])
        reported.append(Action(SUSPECT, system_id, match.machine.get("hostname"), match.vm, match.namespace,
                               before=address, note=suspect_note(match, address, settings.domain)))
        if exposed(system_id):
            reset(match.machine, match.vm, match.namespace,
                  f"suspect address {address!a} imitates {match.vm}.{match.namespace}")
    claimed = {m.machine["system_id"] for m in claimants}
    for machine in machines:
        power = power_parameters.get(machine.get("system_id"))
        held = power.held if isinstance(power, Power) else None
        if held is not None and machine["system_id"] not in claimed and machine.get("power_type") == "redfish":
            reset(machine, *held, f"power address changed to {power.address!a}, which no longer names "
                  f"{held[0]}.{held[1]}")

    created: list[Action] = []
    actions: list[Action] = []
    for match in matches:
        machine, vm, namespace = match.machine, match.vm, match.namespace
        system_id = str(machine["system_id"])
        hostname = machine.get("hostname")
        common = dict(system_id=system_id, hostname=hostname, vm=vm, namespace=namespace)
        tags = machine.get("tag_names")
        approved = isinstance(tags, list) and settings.approval_tag in tags

        # Password and user: the derived ones, whatever the status (a seed rotation resets them
        # all), with the canonical address in the same PUT; under maas.commission: approved, once
        # approved. The user makes the VM's BMC row in MAAS one no other machine can name.
        password = _password(power_parameters[system_id])
        if not _converged(power_parameters[system_id]):
            if settings.commission == "approved" and not approved:
                if exposed(system_id):  # another VM's derived password, from before its address changed
                    reset(machine, vm, namespace, "power address changed to another VM's; not yet approved")
                actions.append(Action(SKIP, before=password, after=password, note=(
                    f"password: waiting for the tag {settings.approval_tag} (maas.commission: approved)"),
                    **common))
            else:
                note = "" if password != RIGHT else "the BMC user is not the derived one"
                actions.append(Action(SET_PASSWORD, before=password, after=DERIVED, note=note,
                                      address=identity.redfish_host(vm, namespace, settings.domain), **common))

        # Hostname: the primary name, else (when held) the fallback or a skip; never fight.
        if system_id in renames:
            target, reason = renames[system_id]
            actions.append(Action(RENAME, before=hostname, after=target, note=reason, **common))
        elif system_id in rename_skips:
            actions.append(Action(SKIP, before=hostname, after=hostname, note=rename_skips[system_id],
                                  **common))

        # Pool: only out of the default pool (an operator's choice stays), and only into a pool
        # the reconciler created or the values adopt.
        target = identity.pool_name(namespace)
        current, _ = pool_of(machine)
        if current != target:
            if in_default_pool(machine) and target in existing and target not in owned:
                actions.append(Action(
                    SKIP, before=current, after=current, note=(
                        f"pool: {target!r} exists but was not created by maas-kubevirt (its description "
                        f"differs) and maas.adopt_pools does not name it: left in {current!r}"), **common))
            elif in_default_pool(machine):
                if target not in existing:
                    created.append(Action(CREATE_POOL, None, None, namespace=namespace, after=target))
                    existing.add(target)
                    owned.add(target)
                actions.append(Action(MOVE_POOL, before=current, after=target, **common))
            else:
                actions.append(Action(
                    SKIP, before=current, after=current,
                    note=f"pool: in {current!r}, filed by an operator: left there", **common,
                ))

        # Commission: only in New, as maas.commission allows, and not while backing off.
        if is_new(machine):
            if settings.commission == "never":
                actions.append(Action(SKIP, before=NEW, after=NEW,
                                      note="commission: maas.commission is never", **common))
            elif settings.commission == "approved" and not approved:
                actions.append(Action(
                    SKIP, before=NEW, after=NEW,
                    note=f"commission: waiting for the tag {settings.approval_tag}", **common,
                ))
            elif waiting and system_id in waiting:
                actions.append(Action(SKIP, before=NEW, after=NEW, note=waiting[system_id], **common))
            else:
                note = f"tagged {settings.approval_tag}" if settings.commission == "approved" else ""
                actions.append(Action(COMMISSION, before=NEW, after="Commissioning", note=note, **common))
    return reported + resets + created + actions


# --- apply ----------------------------------------------------------------------------------


@dataclass
class Outcome:
    ok: int = 0
    skipped: int = 0
    failed: int = 0
    interrupted: bool = False
    done: list[Action] = field(default_factory=list)


def _classify(action: Action, failure: MAASError) -> str:
    """"skipped" when MAAS moved on (the next cycle re-plans), "unknown" when the request may have
    been carried out (the next cycle reads it back), else "failed"."""
    if failure.in_flight:
        return "unknown"
    if failure.status == 404 or (action.kind in (SET_PASSWORD, RESET_PASSWORD) and failure.status == 409):
        return "skipped"
    if action.kind in (COMMISSION, RENAME) and failure.status in (400, 409):
        return "skipped"
    if action.kind == CREATE_POOL and failure.status == 400 and "already exist" in failure.message.lower():
        return "skipped"
    return "failed"


def _fields(action: Action, passwords: Passwords | None) -> dict[str, str]:
    """The PUT machines/{id}/ fields of one update (the client withholds power_pass from messages)."""
    if action.kind == SET_PASSWORD:
        if passwords is None:
            raise ValueError("set-password needs the seed: pass apply(..., passwords=Passwords(seed))")
        if not action.address:
            raise ValueError("set-password needs the canonical address it is written with")
        # The three BMC-row fields together: MAAS then updates the VM's own row in place
        # (Node.set_power_config, src/maasserver/models/node.py), a row no other machine can join.
        return {"power_parameters_power_address": action.address,
                "power_parameters_power_user": passwords.user(action.vm, action.namespace),
                "power_parameters_power_pass": passwords.password(action.vm, action.namespace)}
    if action.kind == RENAME:
        return {"hostname": action.after}
    return {"pool": action.after}


def _perform(client: MAASClient, actions: Sequence[Action], passwords: Passwords | None) -> None:
    """One request: one of each kind, or the password, rename and pool move of one machine together."""
    action = actions[0]
    if action.kind in UPDATES:
        fields: dict[str, str] = {}
        for each in actions:
            fields.update(_fields(each, passwords))
        client.update_machine(action.system_id, **fields)
    elif action.kind == RESET_PASSWORD:
        client.update_machine(action.system_id, power_parameters_power_pass=identity.PLACEHOLDER_PASSWORD)
    elif action.kind == CREATE_POOL:
        client.create_pool(action.after, pool_description(action.namespace))
    elif action.kind == COMMISSION:
        client.commission(action.system_id, skip_bmc_config=True)
    else:  # pragma: no cover - plan makes no other kind that changes
        raise ValueError(f"unknown action {action.kind}")


@dataclass(frozen=True)
class Wait:
    """A commission MAAS refused: how many times in a row, the next attempt's time, and why."""

    failures: int
    until: float        # time.time()
    reason: str

    def why(self) -> str:
        return f"waiting until {_wall(self.until)} after {self.failures} refused attempt(s): {self.reason}"


# How an audit record writes a wait's end (retry_at), and how a restart reads it back.
WALL_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def _wall(seconds: float) -> str:
    """A time in UTC to the second, rounded up: a wait read back from it is never shorter."""
    return datetime.fromtimestamp(math.ceil(seconds), timezone.utc).strftime(WALL_FORMAT)


class Backoff:
    """Per machine, commissions MAAS refused: the next waits one interval, then twice as long each
    time, at most MAX_BACKOFF. MAAS reverts such a machine to New and records a status event, so
    without this every cycle would commission it again."""

    def __init__(self, interval: float, maximum: float = MAX_BACKOFF, clock: Callable[[], float] = time.time):
        self.interval = float(interval)
        self.maximum = float(maximum)
        self.clock = clock
        self.waits: dict[str, Wait] = {}

    def failed(self, system_id: str, reason: str) -> Wait:
        failures = self.waits[system_id].failures + 1 if system_id in self.waits else 1
        delay = min(self.interval * 2 ** (failures - 1), self.maximum)
        self.waits[system_id] = Wait(failures, self.clock() + delay, reason)
        return self.waits[system_id]

    def clear(self, system_id: str) -> None:
        self.waits.pop(system_id, None)

    def pending(self) -> dict[str, Wait]:
        """The waits not over yet."""
        now = self.clock()
        return {sid: wait for sid, wait in self.waits.items() if wait.until > now}

    def waiting(self) -> dict[str, str]:
        """system_id -> why its commission waits, as the plan's note, for the waits not over yet."""
        return {sid: f"commission: {wait.why()}" for sid, wait in self.pending().items()}

    def due(self) -> set[str]:
        """The machines whose wait is over: nothing MAAS records says so, so they are read again."""
        now = self.clock()
        return {sid for sid, wait in self.waits.items() if wait.until <= now}

    def restore(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Take the waits back from earlier audit records (oldest first), so a restart keeps them."""
        for record in records:
            system_id = record.get("system_id")
            if record.get("action") != COMMISSION or not isinstance(system_id, str):
                continue
            until, failures = record.get("retry_at"), record.get("failures")
            if record.get("outcome") == "ok":
                self.clear(system_id)
            elif isinstance(until, str) and isinstance(failures, int) and failures > 0:
                try:
                    when = datetime.strptime(until, WALL_FORMAT).replace(tzinfo=timezone.utc)
                except ValueError:
                    continue
                self.waits[system_id] = Wait(failures, when.timestamp(), str(record.get("reason", "")))


def _batches(actions: Sequence[Action]) -> list[list[Action]]:
    """The changing actions in order, a machine's consecutive password, rename and pool move as one."""
    batches: list[list[Action]] = []
    for action in actions:
        if not action.changes:
            continue
        last = batches[-1] if batches else None
        if (last and action.kind in UPDATES and last[-1].kind in UPDATES
                and last[-1].system_id == action.system_id):
            last.append(action)
        else:
            batches.append([action])
    return batches


def apply(client: MAASClient, actions: Iterable[Action], audit: Audit,
          stop: threading.Event | None = None, passwords: Passwords | None = None,
          backoff: Backoff | None = None) -> Outcome:
    """Carry out the changing actions; one audit record per attempted change.

    A machine's password, rename and pool move go in one PUT; when MAAS refuses it (400) each is
    sent on its own, so that a taken name never holds back the password. A move waits for its
    pool and a commission for its machine's password. A commission MAAS refuses starts or
    lengthens that machine's backoff, named in its audit record.
    """
    outcome = Outcome()
    failed_pools: set[str] = set()
    other_pools: set[str] = set()   # refused as existing (someone else's, as far as is known) or unknown
    no_password: set[str | None] = set()

    def record(action: Action, result: str, reason: str = "") -> None:
        if result == "ok":
            outcome.ok += 1
            outcome.done.append(action)
        elif result == "skipped":
            outcome.skipped += 1
        else:
            outcome.failed += 1
        if action.kind == SET_PASSWORD and result != "ok":
            no_password.add(action.system_id)
        if action.kind == CREATE_POOL and result != "ok":
            (failed_pools if result == "failed" else other_pools).add(action.after)
        if action.kind == COMMISSION and backoff is not None:
            if result == "ok":
                backoff.clear(action.system_id)
            elif result in ("failed", "unknown"):
                wait = backoff.failed(action.system_id, reason)
                audit.record(action, result, reason, retry_at=_wall(wait.until), failures=wait.failures)
                return
        if action.kind in (SET_PASSWORD, RESET_PASSWORD):  # restored after a restart (Reconciler.restore)
            audit.record(action, result, reason, identity=f"{action.vm}.{action.namespace}")
            return
        audit.record(action, result, reason)

    def send(batch: list[Action]) -> bool:
        """Carry out one batch; False when the cycle must stop (a signal, the deadline)."""
        try:
            _perform(client, batch, passwords)
        except MAASAuthError:
            raise
        except MAASError as failure:
            if len(batch) > 1 and failure.status == 400:
                return all(send([action]) for action in batch)
            stopped = failure.kind in ("interrupted", "deadline")  # every later request fails alike
            for action in batch:
                record(action, ("unknown" if failure.in_flight else "failed") if stopped
                       else _classify(action, failure), str(failure))
            return not stopped
        for action in batch:
            record(action, "ok")
        return True

    for batch in _batches(list(actions)):
        if stop is not None and stop.is_set():
            outcome.interrupted = True
            break
        ready = []
        for action in batch:
            if action.kind == MOVE_POOL and action.after in failed_pools:
                record(action, "failed", f"the pool {action.after} could not be created")
            elif action.kind == MOVE_POOL and action.after in other_pools:
                # Made by someone else meanwhile, perhaps: never filled until a re-read shows whose.
                record(action, "skipped", f"the pool {action.after} was not created by this cycle: "
                       "moved only once the next cycle has read whose it is")
            elif action.kind == COMMISSION and action.system_id in no_password:
                record(action, "skipped", "the BMC password is not in place: not commissioned")
            else:
                ready.append(action)
        if ready and not send(ready):
            outcome.interrupted = True
            break
    return outcome


# --- the cycle ------------------------------------------------------------------------------


def _as_audited(value: Any) -> Any:
    """A MAAS-supplied string as an audit record keeps it."""
    return cap(value, NAME_LIMIT) if isinstance(value, str) else value


@dataclass
class Cycle:
    actions: list[Action] = field(default_factory=list)
    outcome: Outcome = field(default_factory=Outcome)
    error: str = ""

    @property
    def failed(self) -> bool:
        return bool(self.error) or self.outcome.failed > 0


class Reconciler:
    """Cycles against one MAAS, remembering of each redfish machine its address and whether its
    password was right (never the password).

    With ``settings.resync_interval`` (the default) a cycle follows MAAS's event log
    (``events.EventLog``) and reads only the machines named in new events, those it planned
    changes for in the last cycle and those it watches (``watched``); it lists every machine
    at start, every resync_interval seconds and whenever the log cannot be trusted. Without it
    every cycle lists every machine and reads every redfish machine's power parameters.
    """

    def __init__(self, client: MAASClient, settings: Settings, audit: Audit | None = None,
                 stop: threading.Event | None = None, *, passwords: Passwords,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time):
        self.client = client
        self.settings = settings
        self.passwords = passwords
        self.audit = audit or Audit()
        self.stop = stop or threading.Event()
        # system_id -> (status_name when read, Power). Never power_pass.
        self.known: dict[str, tuple[Any, Power]] = {}
        self.version: str | None = None
        self._reported: set[tuple[str | None, str]] = set()
        self._malformed: set[tuple[str, str]] = set()
        self._duplicates: dict[tuple[str | None, str | None], Any] = {}
        self.log = (events.EventLog(settings.resync_interval, clock)
                    if settings.resync_interval is not None else None)
        # Machines with changes planned in the last cycle: read again to see them through.
        self.pending: set[str] = set()
        self.resyncs = 0
        self.partial = False   # whether the last plan saw only some machines (event-driven)
        self.clock = clock
        self.backoff = Backoff(settings.interval, clock=wall)
        self._suspects: dict[str, Any] = {}
        self.last_power_check: float | None = None
        # system_id -> the identity whose derived password was set on it (or may have been: an
        # outcome unknown), kept across restarts through the audit log: a password left behind
        # an address that moved while the reconciler was down is still recognised.
        self.credited: dict[str, tuple[str, str]] = {}

    def restore(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Take back, from earlier audit records (oldest first), what a restart would forget: the
        commission backoffs, and which suspect addresses were already reported."""
        records = list(records)
        self.backoff.restore(records)
        for record in records:
            system_id, action = record.get("system_id"), record.get("action")
            if not isinstance(system_id, str):
                continue
            if action == SUSPECT:
                self._suspects[system_id] = record.get("before")
            elif action == SET_PASSWORD and record.get("outcome") in ("ok", "unknown"):
                self._credit(system_id, record.get("identity"))
            elif action == RESET_PASSWORD and record.get("outcome") == "ok":
                self.credited.pop(system_id, None)

    def _credit(self, system_id: Any, serial: Any) -> None:
        """Remember an identity read back from an audit record, when both parts are well formed."""
        if not (isinstance(system_id, str) and valid_system_id(system_id) and isinstance(serial, str)):
            return
        try:
            self.credited[system_id] = identity.parse_serial(serial)
        except identity.IdentityError:
            pass

    def check_version(self) -> None:
        """MAAS's version, and that the key is an administrator's, once: either wrong stops the service."""
        if self.version is None:
            version = self.client.version()
            for message in check_version(version):
                warn(message)
            self.client.require_administrator()
            self.version = version

    def _judge(self, parameters: Mapping[str, Any], previous: tuple[str, str] | None = None) -> Power:
        return self.passwords.judge(parameters, self.settings.domain, previous)

    def _ours(self, power: Power) -> bool:
        """Whether a machine concerns the reconciler: its address names an identity, or it holds a
        derived password its address no longer names."""
        return claim_of(power.address, self.settings.domain)[0] is not None or power.held is not None

    def read_power(self, system_ids: Iterable[str]) -> dict[str, Power]:
        """Power of these machines in bulk, each judged against the identity it named before too
        (so a derived password left behind an address that changed is recognised)."""
        system_ids = list(system_ids)
        hints = {}
        for system_id in system_ids:
            entry = self.known.get(system_id)
            before = None
            if entry is not None:
                power = entry[1]
                claimed, canonical = claim_of(power.address, self.settings.domain)
                before = claimed if canonical and power.password == RIGHT else power.held
            before = before or self.credited.get(system_id)
            if before is not None:
                hints[system_id] = before
        fetched = self.client.power_parameters(system_ids, self._judge, hints)
        for system_id, power in fetched.items():
            claimed, canonical = claim_of(power.address, self.settings.domain)
            if canonical and power.password == RIGHT:
                self.credited[system_id] = claimed
        return fetched

    def power_facts(self, machines: Sequence[Mapping[str, Any]], complete: bool = True,
                    everything: bool = False) -> dict[str, Power]:
        """Power of every redfish machine. One bulk request for those not seen before, whose
        status changed, or that are ours and in Commissioning or Testing.

        complete: machines is every machine (the others are forgotten). Otherwise they are the
        few an event-driven cycle is about to plan for: all of them are read (an edit of the
        power address alone is no event) and the others are kept.
        """
        current: dict[str, tuple[Any, Power]] = {}
        wanted: list[str] = []
        statuses: dict[str, Any] = {}
        for machine in machines:
            if machine.get("power_type") != "redfish":
                continue
            system_id = machine["system_id"]  # a string: every caller passes well_formed records
            status = statuses[system_id] = machine.get("status_name")
            entry = self.known.get(system_id) if complete and not everything else None
            if entry is not None and entry[0] == status and not (
                    status in REREAD_STATUSES and self._ours(entry[1])):
                current[system_id] = entry
            else:
                wanted.append(system_id)
        if wanted:
            fetched = self.read_power(wanted)  # bulk: one op=power_parameters
            for system_id in wanted:
                if system_id in fetched:
                    current[system_id] = (statuses[system_id], fetched[system_id])
        if complete:
            self.known = current
            self.credited = {sid: who for sid, who in self.credited.items() if sid in current}
        else:
            for machine in machines:
                self.known.pop(machine["system_id"], None)
            self.known.update(current)
        return {system_id: entry[1] for system_id, entry in current.items()}

    def well_formed(self, records: Sequence[Any]) -> list[dict]:
        """The usable machine records; each unusable one is skipped with one warning naming it."""
        usable = []
        for index, record in enumerate(records):
            problem = machine_problem(record)
            if problem is None:
                usable.append(record)
                continue
            system_id = record.get("system_id") if isinstance(record, Mapping) else None
            name = system_id if isinstance(system_id, str) and system_id else \
                f"record {index + 1} of {len(records)} (no system_id)"
            if (name, problem) not in self._malformed:
                self._malformed.add((name, problem))
                warn(f"machine {name}: skipped, MAAS sent a malformed record ({problem})")
        return usable

    def observe(self, everything: bool = False) -> tuple[list[dict], dict[str, Power], list[Match]]:
        """Every machine; the power parameters of those new, changed or (everything) all redfish."""
        machines = self.well_formed(self.client.machines())
        power = self.power_facts(machines, everything=everything)
        return machines, power, matching(machines, power, self.settings.domain)

    def watched(self) -> set[str]:
        """Our machines read every cycle because what ends their wait is not an event.

        Commissioning and Testing (REREAD_STATUSES): a commissioning script can write the power
        parameters back mid-run. New under ``maas.commission: approved``: the approval tag is
        audited without the machine (src/maasserver/api/tags.py). The claimants of a duplicate
        claim: deleting one (the usual fix) detaches its events. A machine whose backoff is over.
        """
        statuses = set(REREAD_STATUSES) | ({NEW} if self.settings.commission == "approved" else set())
        disputed = {sid for claimants in self._duplicates.values() if claimants for sid in claimants.split(",")}
        return {system_id for system_id, (status, power) in self.known.items()
                if status in statuses and self._ours(power)} | (
            (self.backoff.due() | disputed) & set(self.known))

    def power_check_due(self) -> bool:
        if self.last_power_check is None:
            self.last_power_check = self.clock()
            return False
        return self.clock() - self.last_power_check >= self.settings.power_check_interval

    def check_power(self) -> set[str]:
        """The machines of ours whose power address changed since read: one bulk read of our
        machines only, every maas.power_check_interval, because MAAS records no event for an API
        or metadata-API edit of power parameters (src/maasserver/api/machines.py update,
        src/metadataserver/api.py store_node_power_parameters)."""
        self.last_power_check = self.clock()
        ours = sorted(sid for sid, (_, power) in self.known.items() if self._ours(power))
        if not ours:
            return set()
        fresh = self.read_power(ours)
        return {sid for sid in ours if sid not in fresh or fresh[sid] != self.known[sid][1]}

    def make_plan(self) -> list[Action]:
        self.partial = False
        if self.log is None:  # no event log to follow, nor power checks: every cycle reads it all
            return self.plan_for(*self.observe(everything=True))
        reason = self.log.resync_due()
        if not reason:
            try:
                followed = self.log.follow(self.client.events)
                changed = self.check_power() if self.power_check_due() else set()
            except (MAASAuthError, MAASVersionError):
                raise
            except MAASError as failure:
                if failure.kind == "interrupted":
                    raise
                reason = f"the event query failed: {failure}"
                self.log.request_resync(reason)
            else:
                reason = followed.resync
                if not reason:
                    self.partial = True
                    return self.plan_for(*self.observe_changed(followed.system_ids | changed))
        return self.resync(reason)

    def resync(self, reason: str) -> list[Action]:
        """List every machine and re-read every redfish machine's power parameters."""
        assert self.log is not None
        if self.log.reason:  # beyond the schedule: worth a line in the journal
            note(f"full resync: {reason}")
        self.log.begin_resync(self.log.newest(self.client.events))  # before listing: no gap
        actions = self.plan_for(*self.observe(everything=True))
        self.last_power_check = self.clock()
        self.log.end_resync()
        self.resyncs += 1
        return actions

    def observe_changed(self, changed: set[str]) -> tuple[list[dict], dict[str, Power], list[Match]]:
        """The machines named in new events, pending or watched, read by id, with every other
        machine known to claim the same ``<vm>.<namespace>`` (a duplicate claim must be seen)."""
        machines = self.read_by_id(changed | self.pending | self.watched())
        power = self.power_facts(machines, complete=False)
        claimed = {claim_of(p.address, self.settings.domain)[0] for p in power.values()}
        read = {m["system_id"] for m in machines}
        others = {system_id for system_id, (_, p) in self.known.items() if system_id not in read
                  and claim_of(p.address, self.settings.domain)[0] in claimed - {None}}
        if others:
            more = self.read_by_id(others)
            machines += more
            power.update(self.power_facts(more, complete=False))
        return machines, power, matching(machines, power, self.settings.domain)

    def read_by_id(self, wanted: set[str]) -> list[dict]:
        """The usable records of these machines; a machine gone from MAAS is forgotten."""
        machines = self.well_formed(self.client.machines_by_id(wanted)) if wanted else []
        for system_id in wanted - {m["system_id"] for m in machines}:
            self.known.pop(system_id, None)
        return machines

    def plan_for(self, machines: list[dict], power: dict[str, Power], matches: list[Match]) -> list[Action]:
        pools: list[Any] = self.client.pools() if needs_pools(matches) else []
        # Only when a rename is possible: an idle cycle asks nothing more.
        wanted = names_to_check(matches)
        taken = self.client.taken_hostnames(wanted) if wanted else {}
        for machine in machines:
            if not is_new(machine):
                self.backoff.clear(machine["system_id"])
        actions = plan(machines, power, pools, self.settings, taken, self.backoff.waiting())
        # Read again next cycle, even when the re-read below makes the plan leave them alone.
        self.pending = {a.system_id for a in actions if a.changes and a.system_id}
        return self.refresh(machines, power, pools, taken, actions)

    def refresh(self, machines: Sequence[Mapping[str, Any]], power: Mapping[str, Power],
                pools: Sequence[Any], taken: Mapping[str, str], actions: list[Action]) -> list[Action]:
        """Re-read, in one bulk request, the power parameters of the machines about to change.

        A machine whose address no longer names the VM it was planned for is left alone this
        cycle; for the others the plan is made again with what was just read (a password set
        meanwhile, or written back by a commissioning script).
        """
        planned = {a.system_id: (a.vm, a.namespace) for a in actions if a.changes and a.system_id}
        if not planned:
            return actions
        fresh = self.read_power(sorted(planned))
        statuses = {m.get("system_id"): m.get("status_name") for m in machines}
        updated = dict(power)
        moved: list[Action] = []
        for system_id, claimed in planned.items():
            now = fresh.get(system_id)
            parsed = None if now is None else (claim_of(now.address, self.settings.domain)[0] or now.held)
            if parsed != claimed:
                updated.pop(system_id, None)
                self.known.pop(system_id, None)
                hostname = next((a.hostname for a in actions if a.system_id == system_id), None)
                moved.append(Action(SKIP, system_id, hostname, *claimed, note=(
                    "power address changed since it was read: left alone until the next cycle")))
            else:
                updated[system_id] = now
                self.known[system_id] = (statuses.get(system_id), now)
        if not moved and all(updated[sid] == power.get(sid) for sid in planned):
            return actions
        again = plan(machines, updated, pools, self.settings, taken, self.backoff.waiting())
        return [a for a in again if not a.changes or a.system_id is None or a.system_id in planned] + moved

    def report_duplicates(self, actions: Sequence[Action]) -> None:
        """One audit record and one warning per duplicate claim and per suspect address, again
        only when the claim's set of machines (or the suspect's address) changes."""
        current = {(a.vm, a.namespace): a.after for a in actions if a.kind == DUPLICATE}
        # As the audit record keeps it (capped), so that a restart compares like with like.
        suspects = {a.system_id: _as_audited(a.before) for a in actions if a.kind == SUSPECT}
        for action in actions:
            if action.kind == DUPLICATE and self._duplicates.get((action.vm, action.namespace)) != action.after:
                self.audit.record(action, "refused")
                warn(action.note)
            if action.kind == SUSPECT and self._suspects.get(action.system_id) != suspects[action.system_id]:
                self.audit.record(action, "refused")
                warn(f"{action.system_id} {action.hostname}: {action.note}")
        if self.partial:  # the claims of machines not read this cycle stand as they were
            considered = {(a.vm, a.namespace) for a in actions if a.vm is not None}
            current = {**{k: v for k, v in self._duplicates.items() if k not in considered}, **current}
            seen = {a.system_id for a in actions}
            suspects = {**{k: v for k, v in self._suspects.items() if k not in seen}, **suspects}
        self._duplicates = current
        self._suspects = suspects

    def cycle(self, dry_run: bool = False) -> Cycle:
        """One cycle, all of its requests within settings.cycle_deadline."""
        with self.client.within(self.settings.cycle_deadline):
            return self._cycle(dry_run)

    def _cycle(self, dry_run: bool) -> Cycle:
        result = Cycle()
        try:
            self.check_version()
            result.actions = self.make_plan()
        except (MAASAuthError, MAASVersionError):
            raise
        except MAASError as failure:
            result.error = str(failure)
            if failure.kind != "interrupted":
                error(f"cycle failed: {failure}")
            return result
        if dry_run:
            return result
        self.report_duplicates(result.actions)
        for action in result.actions:
            if action.kind == SKIP and (action.system_id, action.note) not in self._reported:
                self._reported.add((action.system_id, action.note))
                note(f"{action.system_id} {action.hostname}: {action.note}")
        result.outcome = apply(self.client, result.actions, self.audit, self.stop, self.passwords,
                               self.backoff)
        for action in result.outcome.done:
            if action.kind == SET_PASSWORD:
                self.credited[action.system_id] = (action.vm, action.namespace)
                if action.system_id in self.known:
                    status, _ = self.known[action.system_id]
                    self.known[action.system_id] = (status, Power(action.address, RIGHT, user=RIGHT))
            elif action.kind == RESET_PASSWORD:
                self.credited.pop(action.system_id, None)
                if action.system_id in self.known:
                    status, power = self.known[action.system_id]
                    self.known[action.system_id] = (status, Power(power.address, PLACEHOLDER, user=power.user))
        return result
