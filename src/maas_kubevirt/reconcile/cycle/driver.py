"""The cycle driver: one Reconciler made of the stages, each cycle's steps in order, and what a
restart takes back from the audit log."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from maas_kubevirt import events, identity
from maas_kubevirt.audit import Audit
from maas_kubevirt.console import error, note, warn
from maas_kubevirt.kube import KubeError
from maas_kubevirt.maas import MAASAuthError, MAASClient, MAASError, MAASVersionError, check_version, valid_system_id
from maas_kubevirt.reconcile.apply import Outcome, apply
from maas_kubevirt.reconcile.backoff import Backoff, Wait
from maas_kubevirt.reconcile.cycle.duplicates import Duplicates
from maas_kubevirt.reconcile.cycle.generations import Generations
from maas_kubevirt.reconcile.cycle.observe import Observing
from maas_kubevirt.reconcile.cycle.planning import Planning
from maas_kubevirt.reconcile.cycle.read import Reading
from maas_kubevirt.reconcile.cycle.rotation import ROTATE, Exposure, Rotation
from maas_kubevirt.reconcile.cycle.switches import Switched, Switches
from maas_kubevirt.reconcile.owners import Owners
from maas_kubevirt.reconcile.plan import (OTHER, PASSWORD_KEY, PLACEHOLDER, RESET_PASSWORD, RIGHT, SET_PASSWORD,
                                          SKIP, SUSPECT, USER_KEY, Action, Passwords, Power, Settings)


@dataclass
class Cycle:
    actions: list[Action] = field(default_factory=list)
    outcome: Outcome = field(default_factory=Outcome)
    error: str = ""
    # Why no password could be derived this cycle (the generations unreadable); resets still ran.
    withheld: str = ""
    # The pool stage's plan and what it did (pools/stage.py), when the values have pools.
    pool_actions: list[Any] = field(default_factory=list)
    pool_failed: int = 0

    @property
    def failed(self) -> bool:
        return bool(self.error) or bool(self.withheld) or self.outcome.failed > 0 or self.pool_failed > 0


class Reconciler(Observing, Reading, Planning, Generations, Rotation, Switches, Duplicates):
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
        # The warm pools' stage (pools/stage.py), run after the machines' in each cycle; None: no pools.
        self.pool_stage: Any = None
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

    def cycle(self, dry_run: bool = False) -> Cycle:
        """One cycle, all of its requests within settings.cycle_deadline."""
        with self.client.within(self.settings.cycle_deadline):
            return self._cycle(dry_run)

    def _cycle(self, dry_run: bool) -> Cycle:
        """The stages in order: what MAAS and the cluster say, the plan, then what it changes."""
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
            self._run_pools(result, dry_run=True)
            return result
        self.report_duplicates(result.actions)
        reverted = self._audit_reverted()
        self._note_skips(result.actions)
        result.outcome = apply(self.client, result.actions, self.audit, self.stop, self.passwords,
                               self.backoff, self.settings.concurrency, self.may_write)
        result.outcome.failed += reverted
        self._remember(result.outcome.done)
        self.rotate_exposed()
        self._run_pools(result, dry_run=False)
        return result

    def _run_pools(self, result: Cycle, dry_run: bool) -> None:
        """The pool stage, after the machines': what it cannot read fails the cycle, not the machines'."""
        if self.pool_stage is None:
            return
        try:
            done = self.pool_stage.run(dry_run)
        except (KubeError, MAASError) as failure:
            if isinstance(failure, MAASError) and failure.kind == "interrupted":
                return
            error(f"pools: {failure}")
            result.pool_failed += 1
            return
        result.pool_actions = list(self.pool_stage.actions)
        result.pool_failed += len(done.failed)

    def approved_ids(self) -> frozenset[str]:
        """The machines a pool of the values approves (as the approval tag would), as last seen."""
        return frozenset() if self.pool_stage is None else self.pool_stage.machine_ids
    def _audit_reverted(self) -> int:
        """Audit the commissions MAAS reverted, kept since the last cycle that was no dry run; how many."""
        reverted, self.reverted = self.reverted, []
        for action, wait in reverted:
            self.audit.record(action, "failed", wait.reason, **wait.audited())
        return len(reverted)

    def _note_skips(self, actions: Sequence[Action]) -> None:
        """One journal line per machine left alone, again only when why changes."""
        for action in actions:
            if action.kind == SKIP and (action.system_id, action.note) not in self._reported:
                self._reported.add((action.system_id, action.note))
                note(f"{action.system_id} {action.hostname}: {action.note}")

    def _remember(self, done: Sequence[Action]) -> None:
        """What the passwords set and taken back change of what the reconciler knows."""
        for action in done:
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
