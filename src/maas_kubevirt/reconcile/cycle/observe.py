"""Which machines a cycle reads: those MAAS's event log names and those watched, or all of them
in a full resync, and every power_check_interval our machines' power parameters."""

from __future__ import annotations

from typing import Any

from maas_kubevirt.console import note
from maas_kubevirt.maas import MAASAuthError, MAASError, MAASVersionError
from maas_kubevirt.reconcile.plan import NEW, REREAD_STATUSES, RIGHT, Action, Match, Power, claim_of, matching


class Observing:
    """The Reconciler's choice of machines to read, and its event log (``log``)."""

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
