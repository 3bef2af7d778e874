"""The pool stage of a reconcile cycle: observe, plan, apply, as the machine stages do."""

from __future__ import annotations

from typing import Any, Callable, Mapping

from maas_kubevirt.audit import Audit
from maas_kubevirt.pools import access, observe, spec
from maas_kubevirt.pools.apply import Applier, Done, Records
from maas_kubevirt.pools.plan import PoolAction, Tally, plan
from maas_kubevirt.pools.spec import Pool, by_name


class PoolStage:
    """Keeps each pool of the values at ``ready`` spares within ``max`` VMs, once per cycle."""

    def __init__(self, pools: tuple[Pool, ...], cluster: Any, client: Any, seed: str, domain: str,
                 audit: Audit, metrics: Any = None, may_write: Callable[[], bool] | None = None):
        self.pools, self.cluster, self.client, self.seed, self.domain = pools, cluster, client, seed, domain
        self.records = Records()
        self.metrics = metrics
        self.applier = Applier(cluster, client, audit, self.records, by_name(pools), seed, may_write)
        self.tallies: list[Tally] = []
        self.actions: list[PoolAction] = []
        # The pool machines last seen: the values' pools approve them for commissioning.
        self.machine_ids: frozenset[str] = frozenset()

    def observe(self) -> tuple[list, dict]:
        vms = observe.pool_vms(self.cluster, self.pools, self.seed)
        return vms, observe.pool_machines(self.client, vms, self.domain, self.records.used)

    def run(self, dry_run: bool = False) -> Done:
        """One pass; with dry_run the plan only (``actions``, ``tallies``)."""
        vms, machines = self.observe()
        self.machine_ids = frozenset(machine.system_id for machine in machines.values())
        self.actions, self.tallies = plan(self.pools, vms, machines, self.records.retiring)
        if self.metrics is not None:
            self.metrics.pool_tallies(self.tallies)
        if dry_run:
            return Done()
        self.applier.note_used(machines.values())
        done = self.applier.apply(self.actions, {vm.name for vm in vms})
        if self.metrics is not None:
            for action in done.done:
                self.metrics.pool_action(action.pool, action.kind, "ok")
            for action in done.withdrawn:
                self.metrics.pool_action(action.pool, action.kind, "withdrawn")
            for action, _ in done.failed:
                self.metrics.pool_action(action.pool, action.kind, "failed")
        return done


def from_values(values: Mapping[str, Any], client: Any, audit: Audit, seed: str, domain: str, metrics: Any = None,
                may_write: Callable[[], bool] | None = None) -> PoolStage | None:
    """The values' pools' stage on their own cluster access, its records restored from
    maas.audit_log; None without pools. PoolsConfigError without usable access."""
    pools = spec.from_values(values)
    if not pools:
        return None
    stage = PoolStage(pools, access.cluster(values), client, seed, domain, audit, metrics, may_write)
    stage.records.restore(Audit.read_file(values["maas"].get("audit_log", "")))
    return stage
