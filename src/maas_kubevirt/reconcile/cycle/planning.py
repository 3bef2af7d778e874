"""Planning what was observed: the pools and names the plan needs, commissions MAAS reverted, and
one bulk re-read of the machines about to change."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from maas_kubevirt.reconcile.plan import (COMMISSION, COMMISSIONING, NEW, SKIP, Action, Match, Power, claim_of,
                                          names_to_check, needs_pools, plan)


class Planning:
    """The Reconciler's plan, and the machines to read again next cycle (``pending``)."""

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
        actions = plan(machines, power, pools, self.settings, taken, self.backoff.waiting(), settling, withheld,
                       self.approved_ids())
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
                     self.withheld_note(), self.approved_ids())
        return [a for a in again if not a.changes or a.system_id is None or a.system_id in planned] + moved
