"""The reconciler: MAAS machines whose Redfish power address is ``<vm>.<namespace>.<domain>``
get their BMC password (derived from the seed), are renamed ``<vm>-<namespace>``, filed in the
pool ``<namespace>`` and, in New and with the password in place, commissioned.

- ``plan(machines, power, pools, settings, taken)`` is pure: it returns the actions. ``power``
  holds per machine only its address and whether its password is right (``Power``), never a
  password; ``taken``: hostnames other nodes hold, devices and controllers included.
- ``apply(client, actions, audit, stop, passwords)`` carries them out one by one; each change
  is one JSON audit record, a 400 because MAAS moved the machine on is a skip, and a machine
  whose password could not be set is not commissioned.
- ``Reconciler`` runs cycles. A cycle asks MAAS's event log what happened since the last one
  (``events.py``: two small requests when nothing did) and reads only the machines named there
  and ours in Commissioning or Testing (``GET machines/?id=``), with their power parameters in
  one bulk request; a full resync (one ``GET machines/``, every redfish machine's power
  parameters) runs at start, every ``maas.resync_interval`` and when the log cannot be
  trusted. The pools are read only when a machine may need moving, ``nodes/?hostname=`` only
  when a rename may happen; then, only when something is to change, one bulk re-read of the
  addresses of the machines about to change. An idle cycle costs 2 small requests. A
  malformed machine record is skipped with one warning; the whole cycle runs within
  ``maas.cycle_deadline``.
- Two or more machines claiming one ``<vm>.<namespace>``: none of them is touched, and one
  audit record names them all each time that set changes.

The commands that run it live elsewhere: ``loop`` (reconcile), ``status``.
"""

from __future__ import annotations

import hmac
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from maas_kubevirt import events, identity
from maas_kubevirt.audit import Audit
from maas_kubevirt.console import error, note, warn
from maas_kubevirt.maas import (
    MAASAuthError,
    MAASClient,
    MAASError,
    MAASVersionError,
    check_version,
)


DEFAULT_POOL = "default"
DEFAULT_POOL_ID = 0
NEW = "New"

# The kinds of action that change MAAS; "skip" and "duplicate-claim" only explain.
CREATE_POOL, SET_PASSWORD, RENAME, MOVE_POOL, COMMISSION = (
    "create-pool", "set-password", "rename", "move-pool", "commission")
SKIP, DUPLICATE = "skip", "duplicate-claim"
CHANGES = (CREATE_POOL, SET_PASSWORD, RENAME, MOVE_POOL, COMMISSION)

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

    @property
    def changes(self) -> bool:
        return self.kind in CHANGES


@dataclass(frozen=True)
class Match:
    machine: Mapping[str, Any]
    vm: str
    namespace: str


@dataclass(frozen=True)
class Power:
    """What the reconciler keeps of a machine's power parameters: the address, and whether the
    stored password is the derived one (RIGHT) or what it is instead. Never the password."""

    address: str | None
    password: str = UNKNOWN


class Passwords:
    """The BMC password rule under the site seed; its repr hides the seed."""

    def __init__(self, seed_text: str):
        self._seed = seed_text

    def __repr__(self) -> str:
        return "Passwords(<seed withheld>)"

    def password(self, vm: str, namespace: str) -> str:
        return identity.bmc_password(self._seed, identity.format_serial(vm, namespace))

    def judge(self, parameters: Mapping[str, Any], domain: str) -> Power:
        """Reduce one machine's power parameters to a Power at once.

        The password is compared in constant time, and only for a machine that is ours.
        """
        address = parameters.get("power_address")
        address = address if isinstance(address, str) else None
        parsed = identity.parse_redfish_address(address, domain)
        if parsed is None:
            return Power(address)
        stored = parameters.get("power_pass")
        stored = stored if isinstance(stored, str) else ""
        derived = self.password(*parsed)
        if hmac.compare_digest(stored.encode("utf-8"), derived.encode("utf-8")):
            return Power(address, RIGHT)
        if not stored:
            return Power(address, UNSET)
        return Power(address, PLACEHOLDER if stored == identity.PLACEHOLDER_PASSWORD else OTHER)


def _address(parameters: Any) -> Any:
    if isinstance(parameters, Power):
        return parameters.address
    if isinstance(parameters, Mapping):
        return parameters.get("power_address")
    return parameters


def _password(parameters: Any) -> str:
    return parameters.password if isinstance(parameters, Power) else UNKNOWN


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
        ("system_id", lambda v: isinstance(v, str) and v != ""),
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
    """The names a rename might take: each matching machine not yet on its primary or fallback."""
    names: set[str] = set()
    for match in matches:
        hostname = match.machine.get("hostname")
        primary = identity.maas_hostname(match.vm, match.namespace)
        fallback = identity.fallback_hostname(match.vm, match.namespace)
        if not isinstance(hostname, str) or hostname.lower() not in (primary, fallback):
            names |= {primary, fallback}
    return names


def matching(
    machines: Iterable[Mapping[str, Any]], power_parameters: Mapping[str, Any], domain: str
) -> list[Match]:
    """The machines that are ours: power_type redfish and power_address <vm>.<namespace>.<domain>."""
    found = []
    for machine in machines:
        if machine.get("power_type") != "redfish":
            continue
        system_id = machine.get("system_id")
        if not isinstance(system_id, str) or system_id not in power_parameters:
            continue
        parsed = identity.parse_redfish_address(_address(power_parameters[system_id]), domain)
        if parsed is not None:
            found.append(Match(machine, *parsed))
    found.sort(key=lambda m: (m.namespace, m.vm, m.machine["system_id"]))
    return found


def claims(matches: Iterable[Match]) -> tuple[list[Match], dict[tuple[str, str], list[Match]]]:
    """(sole claimants, (vm, namespace) -> the machines claiming it when two or more do)."""
    by_identity: dict[tuple[str, str], list[Match]] = {}
    for match in matches:
        by_identity.setdefault((match.vm, match.namespace), []).append(match)
    sole = [group[0] for group in by_identity.values() if len(group) == 1]
    return sole, {key: group for key, group in by_identity.items() if len(group) > 1}


def duplicate_note(vm: str, namespace: str, group: Sequence[Match]) -> str:
    machines = ", ".join(f"{m.machine.get('system_id')} ({m.machine.get('hostname')})" for m in group)
    return (f"{vm}.{namespace} is claimed by {len(group)} machines: {machines}; none of them gets a "
            "password, rename, pool or commission until only one claims it")


def needs_pools(matches: Iterable[Match]) -> bool:
    """Whether any matching machine may be moved (so the pool list is worth a request)."""
    return any(
        pool_of(m.machine)[0] != identity.pool_name(m.namespace) and in_default_pool(m.machine)
        for m in matches
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
) -> list[Action]:
    """The actions that bring the matching machines to their password, name, pool and commissioning.

    machines: MAAS machine objects (system_id, hostname, status, status_name, power_type, pool,
    tag_names). power_parameters: system_id -> Power (or a bare address, or a mapping holding
    it: the password is then unknown, so it is set); machines without an entry are not ours.
    pools: pool names or objects with a name. taken: hostname -> system_id of other nodes
    holding names (``GET nodes/?hostname=``). Order: duplicate claims, pool creations, then
    each machine's actions (password first, commission last), machines in the order their
    renames must happen (one that frees a name before the one that takes it).
    """
    existing = {p.get("name") if isinstance(p, Mapping) else p for p in pools}
    existing |= {pool_of(m)[0] for m in machines}
    matches, duplicates = claims(matching(machines, power_parameters, settings.domain))
    order, renames, rename_skips = assign_hostnames(machines, matches, settings.on_hostname_taken, taken)
    rank = {system_id: index for index, system_id in enumerate(order)}
    matches = sorted(matches, key=lambda m: rank.get(str(m.machine["system_id"]), len(rank)))
    reported = [
        Action(DUPLICATE, None, None, vm=vm, namespace=namespace,
               after=",".join(str(m.machine["system_id"]) for m in group),
               note=duplicate_note(vm, namespace, group))
        for (vm, namespace), group in duplicates.items()  # in matching's order: namespace, then vm
    ]
    created: list[Action] = []
    actions: list[Action] = []

    for match in matches:
        machine, vm, namespace = match.machine, match.vm, match.namespace
        system_id = str(machine["system_id"])
        hostname = machine.get("hostname")
        common = dict(system_id=system_id, hostname=hostname, vm=vm, namespace=namespace)

        # Password: the derived one, whatever the status (a seed rotation resets them all).
        password = _password(power_parameters[system_id])
        if password != RIGHT:
            actions.append(Action(SET_PASSWORD, before=password, after=DERIVED, **common))

        # Hostname: the primary name, else (when held) the fallback or a skip; never fight.
        if system_id in renames:
            target, reason = renames[system_id]
            actions.append(Action(RENAME, before=hostname, after=target, note=reason, **common))
        elif system_id in rename_skips:
            actions.append(Action(SKIP, before=hostname, after=hostname, note=rename_skips[system_id],
                                  **common))

        # Pool: only out of the default pool; an operator's choice stays.
        target = identity.pool_name(namespace)
        current, _ = pool_of(machine)
        if current != target:
            if in_default_pool(machine):
                if target not in existing:
                    created.append(Action(CREATE_POOL, None, None, namespace=namespace, after=target))
                    existing.add(target)
                actions.append(Action(MOVE_POOL, before=current, after=target, **common))
            else:
                actions.append(Action(
                    SKIP, before=current, after=current,
                    note=f"pool: in {current!r}, filed by an operator: left there", **common,
                ))

        # Commission: only in New, and only as maas.commission allows.
        if is_new(machine):
            if settings.commission == "auto":
                actions.append(Action(COMMISSION, before=NEW, after="Commissioning", **common))
            elif settings.commission == "approved":
                tags = machine.get("tag_names")
                if isinstance(tags, list) and settings.approval_tag in tags:
                    actions.append(Action(COMMISSION, before=NEW, after="Commissioning",
                                          note=f"tagged {settings.approval_tag}", **common))
                else:
                    actions.append(Action(
                        SKIP, before=NEW, after=NEW,
                        note=f"commission: waiting for the tag {settings.approval_tag}", **common,
                    ))
            else:
                actions.append(Action(SKIP, before=NEW, after=NEW,
                                      note="commission: maas.commission is never", **common))
    return reported + created + actions


# --- apply ----------------------------------------------------------------------------------


@dataclass
class Outcome:
    ok: int = 0
    skipped: int = 0
    failed: int = 0
    interrupted: bool = False
    done: list[Action] = field(default_factory=list)


def _classify(action: Action, failure: MAASError) -> str:
    """"skipped" when MAAS moved on (the next cycle re-plans), else "failed"."""
    if failure.status == 404 or (action.kind == SET_PASSWORD and failure.status == 409):
        return "skipped"
    if action.kind in (COMMISSION, RENAME) and failure.status in (400, 409):
        return "skipped"
    if action.kind == CREATE_POOL and failure.status == 400 and "already exist" in failure.message.lower():
        return "skipped"
    return "failed"


def _perform(client: MAASClient, action: Action, passwords: Passwords | None) -> None:
    if action.kind == SET_PASSWORD:
        if passwords is None:
            raise ValueError("set-password needs the seed: pass apply(..., passwords=Passwords(seed))")
        client.set_power_pass(action.system_id, passwords.password(action.vm, action.namespace))
    elif action.kind == CREATE_POOL:
        client.create_pool(action.after, f"KubeVirt VMs of namespace {action.namespace} (maas-kubevirt)")
    elif action.kind == RENAME:
        client.update_machine(action.system_id, hostname=action.after)
    elif action.kind == MOVE_POOL:
        client.update_machine(action.system_id, pool=action.after)
    elif action.kind == COMMISSION:
        client.commission(action.system_id, skip_bmc_config=True)
    else:  # pragma: no cover - plan makes no other kind that changes
        raise ValueError(f"unknown action {action.kind}")


def apply(client: MAASClient, actions: Iterable[Action], audit: Audit,
          stop: threading.Event | None = None, passwords: Passwords | None = None) -> Outcome:
    """Carry out each changing action; one audit record per attempted change.

    Each is independent, except that a move waits for its pool and a commission for its
    machine's password: one whose password was not set this cycle is skipped.
    """
    outcome = Outcome()
    failed_pools: set[str] = set()
    no_password: set[str | None] = set()
    for action in actions:
        if not action.changes:
            continue
        if stop is not None and stop.is_set():
            outcome.interrupted = True
            break
        if action.kind == MOVE_POOL and action.after in failed_pools:
            audit.record(action, "failed", f"the pool {action.after} could not be created")
            outcome.failed += 1
            continue
        if action.kind == COMMISSION and action.system_id in no_password:
            audit.record(action, "skipped", "the BMC password is not in place: not commissioned")
            outcome.skipped += 1
            continue
        try:
            _perform(client, action, passwords)
        except MAASAuthError:
            raise
        except MAASError as failure:
            stopped = failure.kind in ("interrupted", "deadline")  # every later request fails alike
            # Abandoned after it was sent: MAAS may have made the change; the next cycle re-reads.
            result = ("unknown" if failure.in_flight else "failed") if stopped else _classify(action, failure)
            if action.kind == CREATE_POOL and result == "failed":
                failed_pools.add(action.after)
            if action.kind == SET_PASSWORD:
                no_password.add(action.system_id)
            audit.record(action, result, str(failure))
            if result == "skipped":
                outcome.skipped += 1
            else:
                outcome.failed += 1
            if stopped:
                outcome.interrupted = True
                break
        else:
            audit.record(action, "ok")
            outcome.ok += 1
            outcome.done.append(action)
    return outcome


# --- the cycle ------------------------------------------------------------------------------


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
    every cycle lists every machine.
    """

    def __init__(self, client: MAASClient, settings: Settings, audit: Audit | None = None,
                 stop: threading.Event | None = None, *, passwords: Passwords,
                 clock: Callable[[], float] = time.monotonic):
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

    def check_version(self) -> None:
        if self.version is None:
            version = self.client.version()
            for message in check_version(version):
                warn(message)
            self.version = version

    def _judge(self, parameters: Mapping[str, Any]) -> Power:
        return self.passwords.judge(parameters, self.settings.domain)

    def _ours(self, power: Power) -> bool:
        return identity.parse_redfish_address(power.address, self.settings.domain) is not None

    def power_facts(self, machines: Sequence[Mapping[str, Any]], complete: bool = True) -> dict[str, Power]:
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
            entry = self.known.get(system_id) if complete else None
            if entry is not None and entry[0] == status and not (
                    status in REREAD_STATUSES and self._ours(entry[1])):
                current[system_id] = entry
            else:
                wanted.append(system_id)
        if wanted:
            fetched = self.client.power_parameters(wanted, self._judge)  # bulk: one op=power_parameters
            for system_id in wanted:
                if system_id in fetched:
                    current[system_id] = (statuses[system_id], fetched[system_id])
        if complete:
            self.known = current
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

    def observe(self) -> tuple[list[dict], dict[str, Power], list[Match]]:
        machines = self.well_formed(self.client.machines())
        power = self.power_facts(machines)
        return machines, power, matching(machines, power, self.settings.domain)

    def watched(self) -> set[str]:
        """Our machines read every cycle because what ends their wait is not an event.

        Commissioning and Testing (REREAD_STATUSES): a commissioning script can write the power
        parameters back mid-run. New under ``maas.commission: approved``: the approval tag is
        audited without the machine (src/maasserver/api/tags.py).
        """
        statuses = set(REREAD_STATUSES) | ({NEW} if self.settings.commission == "approved" else set())
        return {system_id for system_id, (status, power) in self.known.items()
                if status in statuses and self._ours(power)}

    def make_plan(self) -> list[Action]:
        self.partial = False
        if self.log is None:
            return self.plan_for(*self.observe())
        reason = self.log.resync_due()
        if not reason:
            try:
                followed = self.log.follow(self.client.events)
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
                    return self.plan_for(*self.observe_changed(followed.system_ids))
        return self.resync(reason)

    def resync(self, reason: str) -> list[Action]:
        """List every machine and re-read every redfish machine's power parameters."""
        assert self.log is not None
        if self.log.reason:  # beyond the schedule: worth a line in the journal
            note(f"full resync: {reason}")
        self.log.begin_resync(self.log.newest(self.client.events))  # before listing: no gap
        self.known = {}
        actions = self.plan_for(*self.observe())
        self.log.end_resync()
        self.resyncs += 1
        return actions

    def observe_changed(self, changed: set[str]) -> tuple[list[dict], dict[str, Power], list[Match]]:
        """The machines named in new events, pending or watched, read by id, with every other
        machine known to claim the same ``<vm>.<namespace>`` (a duplicate claim must be seen)."""
        machines = self.read_by_id(changed | self.pending | self.watched())
        power = self.power_facts(machines, complete=False)
        claimed = {identity.parse_redfish_address(p.address, self.settings.domain) for p in power.values()}
        read = {m["system_id"] for m in machines}
        others = {system_id for system_id, (_, p) in self.known.items() if system_id not in read
                  and identity.parse_redfish_address(p.address, self.settings.domain) in claimed - {None}}
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
        actions = plan(machines, power, pools, self.settings, taken)
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
        fresh = self.client.power_parameters(sorted(planned), self._judge)
        statuses = {m.get("system_id"): m.get("status_name") for m in machines}
        updated = dict(power)
        moved: list[Action] = []
        for system_id, claimed in planned.items():
            now = fresh.get(system_id)
            parsed = None if now is None else identity.parse_redfish_address(now.address, self.settings.domain)
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
        again = plan(machines, updated, pools, self.settings, taken)
        return [a for a in again if not a.changes or a.system_id is None or a.system_id in planned] + moved

    def report_duplicates(self, actions: Sequence[Action]) -> None:
        """One audit record and one warning per duplicate claim, again only when its set changes."""
        current = {(a.vm, a.namespace): a.after for a in actions if a.kind == DUPLICATE}
        for action in actions:
            if action.kind == DUPLICATE and self._duplicates.get((action.vm, action.namespace)) != action.after:
                self.audit.record(action, "refused")
                warn(action.note)
        if self.partial:  # the claims of machines not read this cycle stand as they were
            considered = {(a.vm, a.namespace) for a in actions if a.vm is not None}
            current = {**{k: v for k, v in self._duplicates.items() if k not in considered}, **current}
        self._duplicates = current

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
        result.outcome = apply(self.client, result.actions, self.audit, self.stop, self.passwords)
        for action in result.outcome.done:
            if action.kind == SET_PASSWORD and action.system_id in self.known:
                status, power = self.known[action.system_id]
                self.known[action.system_id] = (status, Power(power.address, RIGHT))
        return result
