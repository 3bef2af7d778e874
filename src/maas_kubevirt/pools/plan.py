"""The pool stage's plan, pure: from what the cluster and MAAS say of each pool, the VMs to create,
the machines to tag and the VMs (with their machines) to retire.

A pool counts only the VMs it made (``vm.owned``: its label and the reconciler's proof), never a
hand-made VM, and a machine only when its address names one of those VMs, it is the sole
claimant, and its boot MAC is the VM's (``observe``): a PXE host claiming a pool VM's identity is
neither counted, tagged nor deleted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from maas_kubevirt.pools.spec import RECREATE, Pool

# MAAS's status names (NODE_STATUS_CHOICES, src/maasserver/enum.py in 3.5-3.7,
# src/maascommon/enums/node.py on master). A spare is Ready; a machine on its way will be
# Ready without anyone's help; a failed one waits for a person; every other state is a user's.
READY = "Ready"
ON_THE_WAY = frozenset({"New", "Commissioning", "Testing"})
FAILED = frozenset({"Failed commissioning", "Failed testing"})
# Where MAAS's users hold a machine: it is theirs to release, never the reconciler's to delete.
HELD = frozenset({"Allocated", "Deploying", "Deployed", "Releasing", "Disk erasing", "Failed deployment",
                  "Failed releasing", "Failed disk erasing", "Rescue mode", "Entering rescue mode",
                  "Exiting rescue mode", "Failed to enter rescue mode", "Failed to exit rescue mode",
                  "Broken", "Reserved", "Retired", "Missing", "Deployed ephemeral"})

CREATE, TAG, RETIRE = "create-vm", "tag-machine", "retire-vm"


@dataclass(frozen=True)
class PoolVM:
    """A VM a pool made, as the cluster lists it."""

    name: str
    namespace: str
    pool: str
    mac: str | None = None
    deleting: bool = False


@dataclass(frozen=True)
class PoolMachine:
    """The MAAS machine of a pool VM: its status, tags, and whether a user ever had it."""

    system_id: str
    hostname: str
    vm: str
    namespace: str
    status: str
    tags: tuple[str, ...] = ()
    # MAAS keeps current_installation_result_id from a deployment until the machine is deleted
    # (Node._release clears only the deployment's script set, src/maasserver/models/node.py);
    # an allocation seen by the reconciler is recorded too (``Seen.used``).
    used: bool = False


@dataclass(frozen=True)
class PoolAction:
    kind: str
    pool: str
    namespace: str
    vm: str | None = None
    system_id: str | None = None
    hostname: str | None = None
    tags: tuple[str, ...] = ()
    reason: str = ""


@dataclass
class Tally:
    """One pool's counts, for status and metrics."""

    pool: str
    ready: int = 0
    on_the_way: int = 0
    held: int = 0
    failed: int = 0
    retiring: int = 0
    total: int = 0
    max: int = 0
    wanted: int = 0
    creating: int = 0
    waiting: list[str] = field(default_factory=list)


def _retire_reason(machine: PoolMachine) -> str:
    return f"MAAS released {machine.hostname}: its VM and disk are deleted and made again (on_release recreate)"


def plan_pool(pool: Pool, vms: Iterable[PoolVM], machines: Mapping[tuple[str, str], PoolMachine],
              retiring: set[tuple[str, str]] = frozenset()) -> tuple[list[PoolAction], Tally]:
    """One pool: retire what MAAS released (recreate), tag new spares, create up to ``ready``
    spares counting those on their way, never beyond ``max`` VMs in all."""
    actions: list[PoolAction] = []
    tally = Tally(pool.name, max=pool.max, wanted=pool.ready)
    for vm in sorted(vms, key=lambda v: v.name):
        if vm.pool != pool.name or vm.namespace != pool.namespace:
            continue
        tally.total += 1
        machine = machines.get((vm.name, vm.namespace))
        if vm.deleting or (vm.name, vm.namespace) in retiring:
            tally.retiring += 1
            if (vm.name, vm.namespace) in retiring and not vm.deleting:
                actions.append(PoolAction(RETIRE, pool.name, pool.namespace, vm.name,
                                          machine and machine.system_id, machine and machine.hostname,
                                          reason="a retirement left unfinished"))
            continue
        if machine is None or machine.status in ON_THE_WAY:
            tally.on_the_way += 1
            continue
        if machine.status == READY:
            if machine.used and pool.on_release == RECREATE:
                tally.retiring += 1
                actions.append(PoolAction(RETIRE, pool.name, pool.namespace, vm.name, machine.system_id,
                                          machine.hostname, reason=_retire_reason(machine)))
                continue
            tally.ready += 1
            missing = tuple(tag for tag in pool.maas_tags if tag not in machine.tags)
            if missing:
                actions.append(PoolAction(TAG, pool.name, pool.namespace, vm.name, machine.system_id,
                                          machine.hostname, missing))
        elif machine.status in FAILED:
            tally.failed += 1
            tally.waiting.append(f"{machine.hostname}: {machine.status}")
        else:
            tally.held += 1
    short = pool.ready - tally.ready - tally.on_the_way
    room = pool.max - tally.total
    tally.creating = max(0, min(short, room))
    actions.extend(PoolAction(CREATE, pool.name, pool.namespace) for _ in range(tally.creating))
    return actions, tally


def plan(pools: Iterable[Pool], vms: Iterable[PoolVM], machines: Mapping[tuple[str, str], PoolMachine],
         retiring: set[tuple[str, str]] = frozenset()) -> tuple[list[PoolAction], list[Tally]]:
    """Every pool, in the values' order: retirements and tags first, then creates."""
    vms = list(vms)
    actions: list[PoolAction] = []
    tallies: list[Tally] = []
    for pool in pools:
        done, tally = plan_pool(pool, vms, machines, retiring)
        actions.extend(done)
        tallies.append(tally)
    order = {RETIRE: 0, TAG: 1, CREATE: 2}
    return sorted(actions, key=lambda action: order[action.kind]), tallies
