"""The plan: a pure function from what MAAS holds to the actions that bring our machines to
their password, name, pool and commissioning (no request is made here)."""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from maas_kubevirt import events, identity
from maas_kubevirt.maas import valid_system_id

DEFAULT_POOL = "default"
DEFAULT_POOL_ID = 0
NEW = "New"
# What MAAS shows while a commission it took runs.
COMMISSIONING = "Commissioning"

# The kinds of action that change MAAS; "skip", "duplicate-claim" and "suspect-address" only explain.
CREATE_POOL, SET_PASSWORD, RESET_PASSWORD, RENAME, MOVE_POOL, COMMISSION = (
    "create-pool", "set-password", "reset-password", "rename", "move-pool", "commission")
SKIP, DUPLICATE, SUSPECT = "skip", "duplicate-claim", "suspect-address"

CHANGES = (CREATE_POOL, SET_PASSWORD, RESET_PASSWORD, RENAME, MOVE_POOL, COMMISSION)
# What one PUT machines/{id}/ carries together: MAAS's form is all or nothing
# (src/maasserver/api/machines.py update, AdminMachineForm), so the password is never stored
# beside an address the reconciler did not write.
UPDATES = (SET_PASSWORD, RENAME, MOVE_POOL)

# Statuses in which a commissioning script may write the power parameters again.
REREAD_STATUSES = (COMMISSIONING, "Testing")

# What is known of a machine's stored power_pass (the value itself is never kept).
RIGHT, PLACEHOLDER, UNSET, OTHER, UNKNOWN = "right", "placeholder", "unset", "other", "unknown"
DERIVED = "derived"
# What a power parameter holding a derived credential holds: the VM's BMC user or its password.
USER_KEY, PASSWORD_KEY = "user", "password"
# The power type every VM's BMC is: a derived credential anywhere else is taken back.
REDFISH = "redfish"


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
    concurrency: int = 1                 # machines whose changes go to MAAS at once

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
            concurrency=maas["concurrency"],
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
    # reset-password only: the address beside the password was not the VM's own BMC, so MAAS
    # may have sent it there (its rack queries power within minutes): the VM's credentials need
    # rotating. Follows from the note's reason, so it takes no part in comparisons either.
    leak: bool = field(default=False, compare=False)
    # reset-password only: the machine's power type when planned, and (parameter name, USER_KEY or
    # PASSWORD_KEY) of each parameter holding a derived credential: a machine that is no longer
    # redfish is reset through its own type's names (Power.derived).
    power_type: str | None = field(default=None, compare=False)
    keys: tuple[tuple[str, str], ...] = field(default=(), compare=False)

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
    # The identity whose derived password or user the machine still holds although its address
    # no longer names it (the address, or the power type, changed after they were set).
    held: tuple[str, str] | None = None
    # Whether power_user is the derived user of the identity the address names (RIGHT), or not.
    user: str = UNKNOWN
    # The names of the parameters MAAS holds: they follow the power type, which anonymous
    # enlistment switches with no event (AnonMachinesHandler.create, src/maasserver/api/machines.py).
    names: tuple[str, ...] = ()
    # (parameter name, USER_KEY or PASSWORD_KEY) of each parameter that holds a derived credential
    # of the identity the address names or of ``held``: MAAS's form carries power_user and
    # power_pass into whatever type a machine is switched to (AdminMachineForm), so taking them
    # back goes by what holds them, not by the redfish names.
    derived: tuple[tuple[str, str], ...] = field(default=(), compare=False)

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

    def __init__(self, seed_text: str, generations: Mapping[tuple[str, str], int] | None = None):
        self._seed = seed_text
        # (vm, namespace) -> credential generation, as the rotations ConfigMap holds it; absent: 0.
        self.generations: dict[tuple[str, str], int] = dict(generations or {})

    def __repr__(self) -> str:
        return "Passwords(<seed withheld>)"

    def generation(self, vm: str, namespace: str) -> int:
        return self.generations.get((vm, namespace), 0)

    def password(self, vm: str, namespace: str) -> str:
        return identity.bmc_password(self._seed, identity.format_serial(vm, namespace),
                                     self.generation(vm, namespace))

    def user(self, vm: str, namespace: str) -> str:
        return identity.bmc_user(self._seed, identity.format_serial(vm, namespace), self.generation(vm, namespace))

    def judge(self, parameters: Mapping[str, Any], domain: str,
              previous: tuple[str, str] | None = None) -> Power:
        """Reduce one machine's power parameters, of any power type, to a Power at once.

        Every parameter is compared in constant time with the derived user and password of the
        identity the address names (canonically or as a suspect), and of ``previous``, the
        identity the machine was known by before, when it names no other now.
        """
        address = parameters.get("power_address")
        address = address if isinstance(address, str) else None
        claimed, _ = claim_of(address, domain)
        names = tuple(sorted(str(name) for name in parameters))
        mine = self._holding(parameters, claimed)
        before = self._holding(parameters, previous) if previous != claimed else ()
        held = previous if before else None
        derived = tuple(sorted(set(mine) | set(before)))
        if claimed is None:
            return Power(address, UNKNOWN, held=held, names=names, derived=derived)
        stored = parameters.get("power_pass")
        stored = stored if isinstance(stored, str) else ""
        user = RIGHT if ("power_user", USER_KEY) in mine else OTHER
        if ("power_pass", PASSWORD_KEY) in mine:
            password = RIGHT
        elif not stored:
            password = UNSET
        else:
            password = PLACEHOLDER if stored == identity.PLACEHOLDER_PASSWORD else OTHER
        return Power(address, password, held=None if password == RIGHT else held, user=user, names=names,
                     derived=derived)

    def _holding(self, parameters: Mapping[str, Any], who: tuple[str, str] | None) -> tuple[tuple[str, str], ...]:
        """(name, USER_KEY or PASSWORD_KEY) of each parameter holding who's derived user or password."""
        if who is None:
            return ()
        wanted = ((USER_KEY, self.user(*who)), (PASSWORD_KEY, self.password(*who)))
        return tuple((str(name), kind) for name, value in parameters.items() if isinstance(value, str) and value
                     for kind, derived in wanted if _same(value, derived))

    def reset_user(self, system_id: str) -> str:
        return identity.reset_user(self._seed, system_id)


def _same(stored: str, derived: str) -> bool:
    return hmac.compare_digest(stored.encode("utf-8"), derived.encode("utf-8"))


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
        if machine.get("power_type") != REDFISH:
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
    settling: Mapping[tuple[str, str], str] | None = None,
    withheld: str = "",
    approved_ids: frozenset[str] | set[str] = frozenset(),
) -> list[Action]:
    """The actions that bring the matching machines to their password, name, pool and commissioning.

    machines: MAAS machine objects (system_id, hostname, status, status_name, power_type, pool,
    tag_names). power_parameters: system_id -> Power (or a bare address, or a mapping holding
    it: the password is then unknown, so it is set); machines without an entry are not ours.
    pools: pool names or objects with a name. taken: hostname -> system_id of other nodes
    holding names (``GET nodes/?hostname=``). waiting: system_id -> why its commission waits
    (a backoff after MAAS refused one). settling: (vm, namespace) -> why its new password waits
    (a rotation Kyverno has not yet followed). withheld: why no password is derived at all (the
    credential generations cannot be read); taking one back never waits. approved_ids: system ids
    of pool machines, which a pool in the values approves as the approval tag would. Order: duplicate claims
    and suspects, password resets, pool creations, then each trusted machine's actions (password
    first, commission last),
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

    def reset(machine: Mapping[str, Any], vm: str, namespace: str, reason: str, leak: bool = True) -> None:
        power = power_parameters[machine["system_id"]]
        resets.append(Action(RESET_PASSWORD, str(machine["system_id"]), machine.get("hostname"), vm, namespace,
                             before=DERIVED, after=PLACEHOLDER, note=reason, leak=leak,
                             power_type=machine.get("power_type"), keys=power.derived if isinstance(power, Power) else ()))

    def holder(system_id: Any, claimed: tuple[str, str] | None) -> tuple[str, str]:
        """The identity whose derived credential an exposed machine holds: the one it claims, or before."""
        power = power_parameters[system_id]
        held = power.held if isinstance(power, Power) else None
        mine = _password(power) == RIGHT or (isinstance(power, Power) and power.user == RIGHT)
        return claimed if claimed is not None and (mine or held is None) else held  # type: ignore[return-value]

    def exposed(system_id: Any) -> bool:
        """Whether the machine holds a derived user or password: its own identity's, or one it had before."""
        power = power_parameters[system_id]
        return _password(power) == RIGHT or (isinstance(power, Power) and bool(power.derived))

    for (vm, namespace), group in duplicates.items():
        for match in group:
            if exposed(match.machine["system_id"]):
                # Every claimant's address is the VM's own BMC: the password went nowhere else.
                reset(match.machine, vm, namespace, f"duplicate claim: {vm}.{namespace} is claimed by "
                      f"{len(group)} machines", leak=False)
    for match in claimants:
        if match.canonical:
            continue
        system_id = str(match.machine["system_id"])
        address = _address(power_parameters[system_id])
        reported.append(Action(SUSPECT, system_id, match.machine.get("hostname"), match.vm, match.namespace,
                               before=address, note=suspect_note(match, address, settings.domain)))
        if exposed(system_id):
            reset(match.machine, *holder(system_id, (match.vm, match.namespace)),
                  f"suspect address {address!a} imitates {match.vm}.{match.namespace}")
    claimed = {m.machine["system_id"] for m in claimants}
    for machine in machines:
        system_id = machine.get("system_id")
        power = power_parameters.get(system_id)
        if not isinstance(power, Power) or system_id in claimed:
            continue
        power_type = machine.get("power_type")
        if power_type != REDFISH and power.derived:
            # Anonymous enlistment switched it (BMC or MAC enlistment): MAAS sends what it holds to
            # whatever the new type names, so it goes at once, whatever the address.
            owner = holder(system_id, claim_of(power.address, settings.domain)[0])
            reset(machine, *owner, f"power type switched to {power_type!a}: the derived credentials of "
                  f"{owner[0]}.{owner[1]} stay only on a redfish BMC at its bare host")
        elif power_type == REDFISH and power.held is not None:
            held = power.held
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
        approved = (isinstance(tags, list) and settings.approval_tag in tags) or system_id in approved_ids

        # Password and user: the derived ones, whatever the status (a seed rotation resets them
        # all), with the canonical address in the same PUT; under maas.commission: approved, once
        # approved. The user makes the VM's BMC row in MAAS one no other machine can name.
        password = _password(power_parameters[system_id])
        if not _converged(power_parameters[system_id]):
            if settings.commission == "approved" and not approved:
                if exposed(system_id):  # another VM's derived password, from before its address changed
                    owner = holder(system_id, (vm, namespace))
                    reset(machine, *owner, "power address changed to another VM's; not yet approved",
                          leak=owner != (vm, namespace))
                actions.append(Action(SKIP, before=password, after=password, note=(
                    f"password: waiting for the tag {settings.approval_tag} (maas.commission: approved)"),
                    **common))
            elif settling and (vm, namespace) in settling:
                actions.append(Action(SKIP, before=password, after=password, note=settling[(vm, namespace)],
                                      **common))
            elif withheld:
                actions.append(Action(SKIP, before=password, after=password, note=withheld, **common))
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
                actions.append(Action(COMMISSION, before=NEW, after=COMMISSIONING, note=note, **common))
    return reported + resets + created + actions


