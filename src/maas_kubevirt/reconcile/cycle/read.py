"""Reading machines and their power parameters from MAAS, each judged against the identity it
named, and which machines concern the reconciler."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from maas_kubevirt.console import warn
from maas_kubevirt.reconcile.owners import filed_as
from maas_kubevirt.reconcile.plan import REDFISH, REREAD_STATUSES, RIGHT, Power, claim_of, machine_problem


class Reading:
    """The Reconciler's reads: what it knows of each machine (``known``) and whom it ``credited``."""

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

    def read_by_id(self, wanted: set[str]) -> list[dict]:
        """The usable records of these machines; a machine gone from MAAS is forgotten."""
        machines = self.well_formed(self.client.machines_by_id(wanted)) if wanted else []
        for system_id in wanted - {m["system_id"] for m in machines}:
            self.known.pop(system_id, None)
            self.backoff.clear(system_id)
        return machines
