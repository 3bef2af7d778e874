"""``maas-kubevirt decompose HOSTNAME|SYSTEM_ID``: delete a pool VM and its machine, as MAAS's
``machine delete`` of a composed VM did. A machine no pool made is always refused; one a user
holds only with ``--force``."""

from __future__ import annotations

import sys
from typing import Any

from maas_kubevirt import EXIT_FAILED, EXIT_OK, EXIT_USAGE, identity, seed
from maas_kubevirt.audit import Audit
from maas_kubevirt.console import error, note
from maas_kubevirt.kube import KubeError
from maas_kubevirt.maas import MAASError, client_from_values, valid_system_id
from maas_kubevirt.pools import access, observe
from maas_kubevirt.pools import vm as pool_vm
from maas_kubevirt.pools.apply import Applier, Records
from maas_kubevirt.pools.plan import HELD, RETIRE, PoolAction
from maas_kubevirt.pools.spec import by_name, from_values


class Refused(Exception):
    """The machine is not one decompose may delete; the message says why."""


def find_machine(client: Any, target: str) -> dict:
    """The machine with this system_id or hostname."""
    if valid_system_id(target):
        found = [m for m in client.machines_by_id([target]) if isinstance(m, dict)]
        if found:
            return found[0]
    system_id = client.taken_hostnames([target]).get(target)
    found = [m for m in client.machines_by_id([system_id]) if isinstance(m, dict)] if system_id else []
    if not found:
        raise Refused(f"MAAS has no machine with the system_id or hostname {target!r}")
    return found[0]


def pool_vm_of(values: dict, client: Any, cluster: Any, machine: dict, seed_text: str) -> tuple[Any, Any]:
    """(the pool, the PoolVM) that this machine is, or Refused saying why it is none."""
    system_id = machine["system_id"]
    address = client.power_addresses([system_id]).get(system_id)
    claimed = identity.parse_redfish_address(address, values["redfish"]["domain"])
    if claimed is None:
        raise Refused(f"{machine.get('hostname')} ({system_id}) is not a KubeVirt VM's machine: no pool made it")
    vm_name, namespace = claimed
    pools = from_values(values)
    vms = {(vm.name, vm.namespace): vm for vm in observe.pool_vms(cluster, pools, seed_text)}
    vm = vms.get(claimed)
    if vm is None:
        raise Refused(f"{machine.get('hostname')} ({system_id}) is VM {vm_name} in {namespace}, which no pool made "
                      "(its pool label and proof are not the reconciler's): delete it by hand if you mean to")
    if (vm.name, vm.namespace) not in observe.pool_machines(client, [vm], values["redfish"]["domain"]):
        raise Refused(f"{machine.get('hostname')} ({system_id}) claims pool VM {vm_name} in {namespace} but does "
                      "not have its MAC: it is not that VM")
    return by_name(pools)[vm.pool], vm


def main(values: dict, args: Any) -> int:
    """0 deleted, 1 refused or failed, 2 usage or configuration."""
    try:
        cluster = access.cluster(values)
        seed_text = seed.load(values)
        client = client_from_values(values, note)
    except access.PoolsConfigError as failure:
        error(f"decompose: {failure}")
        return EXIT_USAGE
    try:
        machine = find_machine(client, args.machine)
        pool, vm = pool_vm_of(values, client, cluster, machine, seed_text)
        status = machine.get("status_name")
        if status in HELD and not args.force:
            raise Refused(f"{machine.get('hostname')} is {status}: a user holds it; release it in MAAS first, "
                          "or give --force to delete it anyway")
        applier = Applier(cluster, client, Audit(values["maas"].get("audit_log", ""), sys.stderr), Records(),
                          {pool.name: pool}, seed_text)
        retired = applier.retire(
            PoolAction(RETIRE, pool.name, pool.namespace, vm.name, machine["system_id"], machine.get("hostname"),
                       reason="decompose" + (" --force" if args.force else "")),
            may_delete=lambda now: args.force or now not in HELD)
        if not retired:
            raise Refused(f"{machine.get('hostname')} was taken by a user meanwhile: release it in MAAS first, "
                          "or give --force")
    except Refused as refusal:
        error(f"decompose: {refusal}")
        return EXIT_FAILED
    except (KubeError, MAASError) as failure:
        error(f"decompose {args.machine}: {failure}")
        return EXIT_FAILED
    print(f"{machine.get('hostname')}\t{machine['system_id']}\tdeleted, with VM {vm.name} and its disk "
          f"{pool_vm.disk_name(vm.name)} in {vm.namespace}", flush=True)
    return EXIT_OK
