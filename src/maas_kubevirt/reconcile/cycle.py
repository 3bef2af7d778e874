"""The cycle: observe MAAS (the event log, the machines it names, their power parameters), plan,
apply; what a restart must keep comes back from the audit log."""

from __future__ import annotations

import shlex
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from maas_kubevirt import events, identity
from maas_kubevirt.audit import NAME_LIMIT, Audit, cap
from maas_kubevirt.console import error, note, warn
from maas_kubevirt.maas import MAASAuthError, MAASClient, MAASError, MAASVersionError, check_version, valid_system_id
from maas_kubevirt.reconcile.apply import Outcome, apply
from maas_kubevirt.reconcile.backoff import Backoff, Wait
from maas_kubevirt.reconcile.owners import Owners, filed_as
from maas_kubevirt.reconcile.plan import (
    COMMISSION, COMMISSIONING, DUPLICATE, NEW, OTHER, PASSWORD_KEY, PLACEHOLDER, REDFISH, REREAD_STATUSES,
    RESET_PASSWORD, RIGHT, SET_PASSWORD, SKIP, SUSPECT, USER_KEY, Action, Match, Passwords, Power, Settings, claim_of,
    machine_problem, matching, names_to_check, needs_pools, plan, pool_of,
)


# How long a new credential generation waits before its password goes to MAAS: Kyverno's
# rotation rule and the generate rule behind it re-derive <vm>-bmc within seconds on the
# control-plane tier (tests/test_rotation_tier.py); MAAS holding a password the BMC does not
# take yet would fail its power actions on the VM meanwhile.
ROTATION_SETTLE = 30.0
ROTATE = "rotate"


@dataclass(frozen=True)
class Switched:
    """A machine that an enlistment switched to another power type, its VM's credentials taken back."""

    who: tuple[str, str]
    power_type: str

    def fix(self) -> str:
        vm, namespace = self.who
        return (f"if the switch was not an administrator's, let {vm} enlist again (it PXE-boots, MAAS knows it "
                f"by its MAC and its script writes its redfish BMC back): `virtctl restart {vm} -n {namespace}`")


@dataclass(frozen=True)
class Exposure:
    """A VM's derived password found beside an address that is not its BMC, and taken back: it may
    have leaked, so the VM's credentials need a generation past ``generation``."""

    system_id: str
    generation: int


def rotate_command(vm: str, namespace: str, values_path: str | None = None) -> str:
    """The exact command line that rotates one VM's credentials, with these values."""
    values = f" --values {shlex.quote(values_path)}" if values_path else ""
    return f"maas-kubevirt{values} rotate {vm}.{namespace}"


def lowered_fix(who: tuple[str, str], generation: int, system_namespace: str = "<system namespace>") -> str:
    """The command that puts a VM's generation back where the reconciler last used it."""
    patch = shlex.quote(f'{{"data":{{"{identity.format_serial(*who)}":"{generation}"}}}}')
    return (f"kubectl -n {system_namespace} patch configmap {identity.ROTATIONS_CONFIGMAP} --type merge "
            f"-p {patch}")


def lowered_generations(highest: Mapping[tuple[str, str], int],
                        said: Mapping[tuple[str, str], int]) -> dict[tuple[str, str], int]:
    """(vm, namespace) -> the generation the cluster says, for each VM it says one below the highest used."""
    return {who: said.get(who, 0) for who, used in sorted(highest.items()) if said.get(who, 0) < used}


def _audited_generation(serial: Any, generation: Any) -> tuple[tuple[str, str], int] | None:
    """((vm, namespace), generation) of an audit record's fields, or None when either is malformed."""
    try:
        return identity.parse_serial(serial), identity.parse_generation(str(generation))
    except identity.IdentityError:
        return None


def _as_audited(value: Any) -> Any:
    """A MAAS-supplied string as an audit record keeps it."""
    return cap(value, NAME_LIMIT) if isinstance(value, str) else value


@dataclass
class Cycle:
    actions: list[Action] = field(default_factory=list)
    outcome: Outcome = field(default_factory=Outcome)
    error: str = ""
    # Why no password could be derived this cycle (the generations unreadable); resets still ran.
    withheld: str = ""

    @property
    def failed(self) -> bool:
        return bool(self.error) or bool(self.withheld) or self.outcome.failed > 0


class Reconciler:
    """Cycles against one MAAS, remembering of each redfish machine its address and whether its
    password was right (never the password).

    With ``settings.resync_interval`` (the default) a cycle follows MAAS's event log
    (``events.EventLog``) and reads only the machines named in new events, those it planned
    changes for in the last cycle and those it watches (``watched``); it lists every machine
    at start, every resync_interval seconds and whenever the log cannot be trusted, and then
    reads every machine's power parameters, of every type (a sweep: ``Owners``). Without it every
    cycle lists every machine and reads every redfish machine's power parameters, and every
    machine's every power_check_interval seconds.
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
        # Commissions MAAS took and then reverted (``Backoff.seen``), each with the wait it
        # started: audited by the next cycle that is no dry run.
        self.reverted: list[tuple[Action, Wait]] = []
        self._suspects: dict[str, Any] = {}
        self.last_power_check: float | None = None
        # system_id -> the identity whose derived password was set on it (or may have been: an
        # outcome unknown), kept across restarts through the audit log: a password left behind
        # an address that moved while the reconciler was down is still recognised.
        self.credited: dict[str, tuple[str, str]] = {}
        # Asked before every write (None: always): a lease holder that could not renew says no.
        self.may_write: Callable[[], bool] | None = None
        # The cluster side of rotation, with read() -> {(vm, namespace): generation} and
        # bump(vm, namespace) -> the new generation (rotations.py); None: no cluster access.
        self.rotator: Any = None
        # (vm, namespace) -> its password's exposure, until a rotation moves past it.
        self.exposures: dict[tuple[str, str], Exposure] = {}
        # (vm, namespace) -> the wall time its rotated password may go to MAAS.
        self.settling: dict[tuple[str, str], float] = {}
        self.wall = wall
        self._told_rotation: set[tuple[tuple[str, str], int]] = set()
        self.values_path: str | None = None   # the --values file, for the commands it prints
        self._generations_read = False
        # Why the generations could not be read in the last cycle ("" when they were): the cycle
        # then derives nothing new, and judges with what it last knew.
        self.generations_unread = ""
        # (vm, namespace) -> the highest credential generation this reconciler has written or
        # rotated to (from the audit log): it never derives a lower one, whatever the cluster says.
        self.highest: dict[tuple[str, str], int] = {}
        # (vm, namespace) -> the lower generation the cluster says, while it says one.
        self.lowered: dict[tuple[str, str], int] = {}
        # system_id -> (the identity, the power type) of each machine whose derived credentials were
        # taken back because an enlistment switched its power type: it has no power control of the
        # VM until the VM enlists again (``Switched``), which status and doctor say.
        self.switched: dict[str, Switched] = {}
        # Whose derived credentials a machine holds when no record of this process says: the
        # identities every machine's name and address could be, indexed by their derived values.
        self.owners = Owners(passwords)
        self.last_sweep: float | None = None   # without the event log: when every machine was read

    def restore(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Take back, from earlier audit records (oldest first), what a restart would forget: the
        commission backoffs, and which suspect addresses were already reported."""
        records = list(records)
        self.backoff.restore(records)
        for record in records:
            system_id, action = record.get("system_id"), record.get("action")
            if action == ROTATE and record.get("outcome") == "ok":   # `rotate` by hand names no machine
                self._rotated(record.get("identity"), record.get("after"))
                self._used(record.get("identity"), record.get("after"))
            if not isinstance(system_id, str):
                continue
            if action == SUSPECT:
                self._suspects[system_id] = record.get("before")
            elif action == SET_PASSWORD and record.get("outcome") in ("ok", "unknown"):
                self._credit(system_id, record.get("identity"))
                self._used(record.get("identity"), record.get("generation", 0))
                self.switched.pop(system_id, None)
            elif action == RESET_PASSWORD and record.get("outcome") == "ok":
                self.credited.pop(system_id, None)
                if record.get("leak") is True:
                    self._expose(system_id, record.get("identity"), record.get("generation"))
                try:
                    who: tuple[str, str] | None = identity.parse_serial(record.get("identity"))
                except identity.IdentityError:
                    who = None
                self._switch(system_id, who, record.get("power_type"))

    def _switch(self, system_id: str, who: tuple[str, str] | None, power_type: Any) -> None:
        """A machine whose credentials were taken back from another power type (or, redfish, not);
        ``who`` None: a malformed audit record, which changes nothing of another type."""
        if not (isinstance(power_type, str) and power_type != REDFISH and valid_system_id(system_id)):
            self.switched.pop(system_id, None)
        elif who is not None:
            self.switched[system_id] = Switched(who, cap(power_type, NAME_LIMIT))

    def still_switched(self, machines: Iterable[Mapping[str, Any]]) -> dict[str, Switched]:
        """The switched machines that MAAS still shows with another power type than redfish."""
        types = {m.get("system_id"): m.get("power_type") for m in machines}
        return {sid: s for sid, s in sorted(self.switched.items()) if sid in types and types[sid] != REDFISH}

    def _used(self, serial: Any, generation: Any) -> None:
        """An audited generation of a VM's credentials, when both fields are well formed."""
        audited = _audited_generation(serial, generation)
        if audited is not None:
            self._use(*audited)

    def _use(self, who: tuple[str, str], generation: int) -> None:
        """A generation of a VM's credentials set or rotated to: the least it may ever be derived at again."""
        if generation > self.highest.get(who, 0):
            self.highest[who] = generation
        if not self._generations_read and generation > self.passwords.generations.get(who, 0):
            self.passwords.generations[who] = generation   # judged so until the cluster is read

    def _expose(self, system_id: str, serial: Any, generation: Any) -> None:
        audited = _audited_generation(serial, generation)
        if audited is not None:
            self.exposures[audited[0]] = Exposure(system_id, audited[1])

    def _rotated(self, serial: Any, generation: Any) -> None:
        """An audit record of a rotation (the reconciler's or ``rotate``'s) to ``generation``."""
        audited = _audited_generation(serial, generation)
        exposure = self.exposures.get(audited[0]) if audited is not None else None
        if exposure is not None and audited[1] > exposure.generation:
            del self.exposures[audited[0]]

    def needing_rotation(self) -> dict[tuple[str, str], Exposure]:
        """The identities whose password may have leaked and has not been rotated since."""
        return {who: e for who, e in self.exposures.items() if self.passwords.generation(*who) <= e.generation}

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
        """Judged against the identity its address names and ``previous``; when neither's derived
        credential is there, against the candidate whose derived user or password it holds."""
        power = self.passwords.judge(parameters, self.settings.domain, previous)
        if power.derived or power.password == RIGHT:
            return power
        owner = self.owners.owner(parameters, self.candidates)
        if owner is None or owner == previous:
            return power
        return self.passwords.judge(parameters, self.settings.domain, owner)

    def candidates(self) -> set[tuple[str, str]]:
        """The identities besides the listed names' that a credential found may be: those any
        machine's address named when read, those the audit log credits, those the cluster rotated."""
        claimed = {claim_of(power.address, self.settings.domain)[0] for _, power in self.known.values()}
        held = {power.held for _, power in self.known.values()}
        return ((claimed | held) - {None}) | set(self.credited.values()) | set(self.highest) | {  # type: ignore[operator]
            who for who, generation in self.passwords.generations.items() if generation}

    def _ours(self, power: Power) -> bool:
        """Whether a machine concerns the reconciler: its address names an identity, or it holds a
        derived credential its address no longer names."""
        return (claim_of(power.address, self.settings.domain)[0] is not None or power.held is not None
                or bool(power.derived))

    def read_power(self, system_ids: Iterable[str]) -> dict[str, Power]:
        """Power of these machines in bulk, each judged against the identity it named before too
        (so a derived password left behind an address that changed is recognised): as last read,
        or from the audit log; without either, by the candidate whose derived value it holds."""
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
        self.owners.stale()
        fetched = self.client.power_parameters(system_ids, self._judge, hints)
        for system_id, power in fetched.items():
            claimed, canonical = claim_of(power.address, self.settings.domain)
            if canonical and power.password == RIGHT:
                self.credited[system_id] = claimed
            elif not power.derived and claimed is None:   # holds nothing of a VM's any more
                self.credited.pop(system_id, None)
        return fetched

    def tracked(self, machine: Mapping[str, Any]) -> bool:
        """Whether a machine's power parameters are read between sweeps: every redfish machine, and
        one of any other type that the reconciler knows as its own (it gave it a derived credential,
        by the audit log, or its name says it filed it), because MAAS keeps the user and password
        across a switch of power type (AdminMachineForm, src/maasserver/forms/__init__.py)."""
        system_id = machine["system_id"]
        if machine.get("power_type") == REDFISH or system_id in self.credited:
            return True
        entry = self.known.get(system_id)
        return (entry is not None and self._ours(entry[1])) or filed_as(machine) is not None

    def power_facts(self, machines: Sequence[Mapping[str, Any]], complete: bool = True,
                    everything: bool = False, sweep: bool = False) -> dict[str, Power]:
        """Power of every tracked machine. One bulk request for those not seen before, whose
        status changed, or that are ours and in Commissioning or Testing.

        complete: machines is every machine (the others are forgotten). Otherwise they are the
        few an event-driven cycle is about to plan for: all of them are read (an edit of the
        power address alone is no event) and the others are kept. sweep: every machine of every
        power type is read, so that one holding a derived credential under any name, in any pool
        and of any type is found without a record of it (``Owners``).
        """
        self.owners.listed(machines, complete)
        current: dict[str, tuple[Any, Power]] = {}
        wanted: list[str] = []
        statuses: dict[str, Any] = {}
        for machine in machines:
            if not (sweep or self.tracked(machine)):
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
            records = {m["system_id"]: m for m in machines}
            fetched = self.read_power(wanted)  # bulk: one op=power_parameters per 200 machines
            for system_id in wanted:
                # Another type holding nothing of a VM's is no longer the reconciler's concern.
                if system_id in fetched and (records[system_id].get("power_type") == REDFISH
                                             or self._ours(fetched[system_id])):
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

    def observe(self, everything: bool = False, sweep: bool = False) -> tuple[list[dict], dict[str, Power], list[Match]]:
        """Every machine; the power parameters of those new, changed, (everything) all tracked, or
        (sweep) all."""
        machines = self.well_formed(self.client.machines())
        power = self.power_facts(machines, everything=everything or sweep, sweep=sweep)
        return machines, power, matching(machines, power, self.settings.domain)

    def watched(self) -> set[str]:
        """Our machines whose power parameters are read every cycle, because what changes them is
        not an event; their records are read only when those changed (``power_watched``).

        Commissioning and Testing (REREAD_STATUSES): a commissioning script can write the power
        parameters back mid-run, and MAC enlistment re-points a machine in Commissioning with no
        event (AnonMachinesHandler.create in src/maasserver/api/machines.py). New, where MAC
        enlistment reaches too: those holding a derived password, so one left beside a moved
        address is taken back within one cycle.
        """
        def watch(status: Any, power: Power) -> bool:
            if status in REREAD_STATUSES:
                return self._ours(power)
            return status == NEW and (power.password == RIGHT or power.held is not None)

        return {system_id for system_id, (status, power) in self.known.items() if watch(status, power)}

    def records_watched(self) -> set[str]:
        """Our machines whose records are read every cycle: under ``maas.commission: approved`` all
        of ours in New, as the approval tag is audited without the machine
        (src/maasserver/api/tags.py); the claimants of a duplicate claim, as deleting one (the
        usual fix) detaches its events; a machine whose backoff is over."""
        approved = {system_id for system_id, (status, power) in self.known.items()
                    if self.settings.commission == "approved" and status == NEW and self._ours(power)}
        disputed = {sid for claimants in self._duplicates.values() if claimants for sid in claimants.split(",")}
        return approved | ((self.backoff.due() | disputed) & set(self.known))

    def power_watched(self, skip: set[str]) -> set[str]:
        """The watched machines (not in ``skip``) whose power parameters changed since read: one
        bulk request of power parameters alone, a few hundred bytes a machine."""
        wanted = sorted(self.watched() - skip)
        if not wanted:
            return set()
        fresh = self.read_power(wanted)
        return {sid for sid in wanted if sid not in fresh or fresh[sid] != self.known[sid][1]}

    def sweep_due(self) -> bool:
        """Without the event log: whether this cycle reads every machine's power parameters (the
        first cycle, then every maas.power_check_interval); with it, each resync does."""
        now = self.clock()
        if self.last_sweep is not None and now - self.last_sweep < self.settings.power_check_interval:
            return False
        self.last_sweep = now
        return True

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
            return self.plan_for(*self.observe(everything=True, sweep=self.sweep_due()))
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
        """List every machine and re-read every machine's power parameters (a sweep)."""
        assert self.log is not None
        if self.log.reason:  # beyond the schedule: worth a line in the journal
            note(f"full resync: {reason}")
        self.log.begin_resync(self.log.newest(self.client.events))  # before listing: no gap
        actions = self.plan_for(*self.observe(sweep=True))
        self.last_power_check = self.clock()
        self.log.end_resync()
        self.resyncs += 1
        return actions

    def observe_changed(self, changed: set[str]) -> tuple[list[dict], dict[str, Power], list[Match]]:
        """The machines named in new events, pending or watched, read by id, with every other
        machine known to claim the same ``<vm>.<namespace>`` (a duplicate claim must be seen)."""
        records = changed | self.pending | self.records_watched()
        machines = self.read_by_id(records | self.power_watched(records))
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
            self.backoff.clear(system_id)
        return machines

    def plan_for(self, machines: list[dict], power: dict[str, Power], matches: list[Match]) -> list[Action]:
        pools: list[Any] = self.client.pools() if needs_pools(matches) else []
        # Only when a rename is possible: an idle cycle asks nothing more.
        wanted = names_to_check(matches)
        taken = self.client.taken_hostnames(wanted) if wanted else {}
        for machine in machines:
            wait = self.backoff.seen(machine)
            if wait is not None:
                self.reverted.append((Action(COMMISSION, machine["system_id"], machine.get("hostname"),
                                             before=COMMISSIONING, after=NEW), wait))
        settling, withheld = self.settling_notes(), self.withheld_note()
        actions = plan(machines, power, pools, self.settings, taken, self.backoff.waiting(), settling, withheld)
        # Read again next cycle, even when the re-read below makes the plan leave them alone; and
        # while a password waits (a rotation settling, the cluster unreadable), as its wait ending
        # is no event either.
        self.pending = {a.system_id for a in actions if a.system_id and (
            a.changes or (a.kind == SKIP and ((a.vm, a.namespace) in settling or a.note == withheld)))}
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
            named = set() if now is None else {claim_of(now.address, self.settings.domain)[0], now.held}
            before = power.get(system_id)
            # Other parameter names are another power type: an enlistment switched it meanwhile.
            switched = now is not None and isinstance(before, Power) and now.names != before.names
            if claimed not in named or switched:
                updated.pop(system_id, None)
                self.known.pop(system_id, None)
                hostname = next((a.hostname for a in actions if a.system_id == system_id), None)
                moved.append(Action(SKIP, system_id, hostname, *claimed, note=(
                    f"power {'type' if switched else 'address'} changed since it was read: left alone "
                    "until the next cycle")))
            else:
                updated[system_id] = now
                self.known[system_id] = (statuses.get(system_id), now)
        if not moved and all(updated[sid] == power.get(sid) for sid in planned):
            return actions
        again = plan(machines, updated, pools, self.settings, taken, self.backoff.waiting(), self.settling_notes(),
                     self.withheld_note())
        return [a for a in again if not a.changes or a.system_id is None or a.system_id in planned] + moved

    def settling_notes(self) -> dict[tuple[str, str], str]:
        """(vm, namespace) -> why its password is not set this cycle: a rotation Kyverno has not yet
        followed, or a generation the cluster says that is below one already used."""
        now = self.wall()
        self.settling = {who: until for who, until in self.settling.items() if until > now}
        notes = {who: (f"password: generation {self.passwords.generation(*who)} goes to MAAS in "
                       f"{until - now:.0f} s, once Kyverno has re-derived {who[0]}-bmc")
                 for who, until in self.settling.items()}
        for who, said in self.lowered.items():
            notes[who] = (f"password: the cluster says credential generation {said}, below generation "
                          f"{self.highest[who]} already used: not derived again "
                          f"({lowered_fix(who, self.highest[who], self.system_namespace)})")
        return notes

    @property
    def system_namespace(self) -> str:
        """Where the rotations ConfigMap is, as the commands printed name it."""
        return getattr(self.rotator, "system_namespace", "<system namespace>")

    def _lowered(self, said: Mapping[tuple[str, str], int]) -> None:
        """Note, and warn once each, the VMs whose generation the cluster says below one already used."""
        lowered = lowered_generations(self.highest, said)
        for who, generation in lowered.items():
            if self.lowered.get(who) != generation:
                warn(f"{identity.format_serial(*who)}: the cluster says credential generation {generation}, below generation "
                     f"{self.highest[who]} this reconciler already used (the rotations ConfigMap was emptied, "
                     f"deleted or edited): its password is not derived again until it is put back: "
                     f"{lowered_fix(who, self.highest[who], self.system_namespace)}")
        self.lowered = lowered

    def withheld_note(self) -> str:
        """Why no password is derived this cycle ("" when one may be)."""
        return f"password: not derived while {self.generations_unread}" if self.generations_unread else ""

    def read_generations(self) -> None:
        """Every VM's credential generation, from the cluster, before any password is judged. When
        they cannot be read, what was last known stands (the audit log's at start): resets go on,
        and no new password is derived (``generations_unread``)."""
        if self.rotator is None:
            return
        try:
            said = {who: g for who, g in self.rotator.read().items() if g}
        except Exception as failure:  # noqa: BLE001 - any failure: no password may be derived
            unread = f"the credential generations cannot be read from the cluster ({failure})"
            if unread != self.generations_unread:
                error(f"{unread}: credentials are still taken back where they stand beside another address "
                      "or power type, but no password is derived until they can be read")
            self.generations_unread = unread
            return
        if self.generations_unread:
            note("the credential generations can be read from the cluster again")
        self.generations_unread = ""
        self._lowered(said)
        # Never below a generation already used: a ConfigMap emptied or lowered must not bring
        # rotated-away credentials back.
        generations = {**said, **{who: g for who, g in self.highest.items() if g > said.get(who, 0)}}
        if generations != self.passwords.generations:
            changed = {who for who in set(generations) | set(self.passwords.generations)
                       if generations.get(who, 0) != self.passwords.generation(*who)}
            if self._generations_read:   # not at start: a rotation (`rotate`) since the last cycle
                until = self.wall() + ROTATION_SETTLE
                self.settling.update((who, until) for who in changed if who not in self.settling)
            self.passwords.generations = dict(generations)
            # What was judged under other generations must be judged again.
            self.known.clear()
            if self.log is not None:
                self.log.request_resync("the credential generations changed")
        self._generations_read = True

    def rotate_exposed(self) -> None:
        """Give each VM whose password may have leaked a new credential generation (with cluster
        access), or say once which command does it (without)."""
        for who, exposure in sorted(self.needing_rotation().items()):
            vm, namespace = who
            generation = self.passwords.generation(vm, namespace)
            if self.rotator is None:
                if (who, generation) not in self._told_rotation:
                    self._told_rotation.add((who, generation))
                    warn(f"{vm}.{namespace}: its password may have leaked (it sat beside another "
                         f"address on {exposure.system_id}); rotate it: "
                         f"{rotate_command(vm, namespace, self.values_path)} "
                         "(needs reconciler.lease, whose cluster access the reconciler reads "
                         "generations with)")
                continue
            if self.generations_unread or who in self.lowered:   # a bump needs the generation it raises
                continue
            if self.stop.is_set() or (self.may_write is not None and not self.may_write()):
                return
            serial = f"{vm}.{namespace}"
            try:
                after = self.rotator.bump(vm, namespace)
            except Exception as failure:  # noqa: BLE001 - one VM's failure stops no other
                self.audit.write(ROTATE, exposure.system_id, None, str(generation), None, "failed",
                                 f"{failure}", identity=serial)
                continue
            self.audit.write(ROTATE, exposure.system_id, None, str(generation), str(after), "ok",
                             note=f"its password may have leaked; Kyverno re-derives {vm}-bmc",
                             identity=serial)
            self.passwords.generations[who] = after
            self._use(who, after)
            self.settling[who] = self.wall() + ROTATION_SETTLE
            del self.exposures[who]   # rotated past it: after is above the generation exposed

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
            self.read_generations()
            result.withheld = self.generations_unread
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
        reverted, self.reverted = self.reverted, []
        for action, wait in reverted:
            self.audit.record(action, "failed", wait.reason, **wait.audited())
        for action in result.actions:
            if action.kind == SKIP and (action.system_id, action.note) not in self._reported:
                self._reported.add((action.system_id, action.note))
                note(f"{action.system_id} {action.hostname}: {action.note}")
        result.outcome = apply(self.client, result.actions, self.audit, self.stop, self.passwords,
                               self.backoff, self.settings.concurrency, self.may_write)
        result.outcome.failed += len(reverted)
        for action in result.outcome.done:
            if action.kind == SET_PASSWORD:
                self.credited[action.system_id] = (action.vm, action.namespace)
                self.switched.pop(action.system_id, None)
                self._use((action.vm, action.namespace), self.passwords.generation(action.vm, action.namespace))
                if action.system_id in self.known:
                    status, power = self.known[action.system_id]
                    self.known[action.system_id] = (status, Power(
                        action.address, RIGHT, user=RIGHT, names=power.names,
                        derived=(("power_pass", PASSWORD_KEY), ("power_user", USER_KEY))))
            elif action.kind == RESET_PASSWORD:
                self.credited.pop(action.system_id, None)
                self._switch(action.system_id, (action.vm, action.namespace), action.power_type)
                if action.system_id in self.known:
                    status, power = self.known[action.system_id]
                    self.known[action.system_id] = (status, Power(power.address, PLACEHOLDER, user=OTHER,
                                                                  names=power.names))
                if action.leak:
                    self.exposures[(action.vm, action.namespace)] = Exposure(
                        action.system_id, self.passwords.generation(action.vm, action.namespace))
        self.rotate_exposed()
        return result
