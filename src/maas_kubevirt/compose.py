"""``maas-kubevirt compose POOL``: one more VM of a pool now, beyond ``ready`` but within ``max``,
as MAAS's ``vm-host compose`` made one; with ``--wait``, until MAAS has its machine Ready.
With ``--name`` of a VM the pool already made, nothing is made: it reports (and waits for) that one,
so the same command can be run again after a timeout or a lost session.

The VM goes through the pools' own access (reconciler.pools.kubeconfig); the reconciler then
does for its machine what it does for every VM's, and counts it among the pool's spares.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Callable

from maas_kubevirt import EXIT_FAILED, EXIT_OK, EXIT_USAGE, identity, seed
from maas_kubevirt.audit import Audit
from maas_kubevirt.console import JSON, YAML, document, error, note
from maas_kubevirt.kube import KubeError
from maas_kubevirt.maas import MAASError, client_from_values
from maas_kubevirt.pools import access, observe
from maas_kubevirt.pools.apply import Applier, Records
from maas_kubevirt.pools.plan import CREATE, FAILED, ON_THE_WAY, READY, PoolAction
from maas_kubevirt.pools.spec import Pool, by_name, from_values

POLL = 5.0
# Where a composed VM can stop on its way to Ready, as --wait names it.
CREATED, NO_ENLISTMENT, NEW, COMMISSIONING, COMMISSION_FAILED = (
    "VM created", "no enlistment", "New", "Commissioning", "Commissioning failed")


def pool_named(values: dict, name: str) -> Pool:
    """The pool of the values called name; ValueError saying which there are."""
    pools = by_name(from_values(values))
    if name not in pools:
        known = ", ".join(pools) or "none: the values file's pools list is empty"
        raise ValueError(f"no pool {name!r} in the values (pools: {known})")
    return pools[name]


def stage_of(vm: Any, machines: dict, pool: Pool, name: str) -> tuple[str, dict | None]:
    """Where the VM stands: one of the stages above, or Ready, with its machine when MAAS has one."""
    machine = machines.get((name, pool.namespace))
    if machine is None:
        return (NO_ENLISTMENT if vm is not None and vm.mac else CREATED), None
    if machine.status == READY:
        return READY, machine
    if machine.status in FAILED:
        return COMMISSION_FAILED, machine
    return (NEW if machine.status == "New" else COMMISSIONING if machine.status in ON_THE_WAY
            else machine.status), machine


def wait_ready(cluster: Any, client: Any, pool: Pool, name: str, seed_text: str, domain: str, timeout: float,
               clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep
               ) -> tuple[str, Any]:
    """Poll until the VM's machine is Ready, its commissioning failed, or timeout passed: (stage, machine)."""
    deadline = clock() + timeout
    while True:
        vms = {vm.name: vm for vm in observe.pool_vms(cluster, (pool,), seed_text)}
        stage, machine = stage_of(vms.get(name), observe.pool_machines(client, list(vms.values()), domain),
                                  pool, name)
        if stage in (READY, COMMISSION_FAILED) or clock() >= deadline:
            return stage, machine
        sleep(min(POLL, max(0.0, deadline - clock())))


def main(values: dict, args: Any) -> int:
    """0 made (and Ready with --wait), 1 the pool is full, the cluster refused or --wait ran out,
    2 usage or configuration."""
    try:
        pool = pool_named(values, args.pool)
        if args.name is not None and not identity.is_pool_vm_name(pool.name, args.name):
            raise ValueError(f"--name {args.name!r}: a pool's VM is named {pool.name}-<suffix>, one DNS label "
                             "(lower-case letters, digits and '-')")
        cluster = access.cluster(values)
        seed_text = seed.load(values)
    except (ValueError, access.PoolsConfigError) as failure:
        error(f"compose: {failure}")
        return EXIT_USAGE
    try:
        vms = observe.pool_vms(cluster, (pool,), seed_text)
        existing = args.name in {vm.name for vm in vms}
        name = args.name if existing else None
        if existing:
            note(f"compose: {name} is already pool {pool.name}'s VM: reporting on it, not making another")
        elif len(vms) >= pool.max:
            error(f"compose: pool {pool.name} holds {len(vms)} VMs, its max: raise pools[].max for it, or decompose "
                  "one of its machines")
            return EXIT_FAILED
        else:
            applier = Applier(cluster, None, Audit(values["maas"].get("audit_log", ""), sys.stderr), Records(),
                              {pool.name: pool}, seed_text)
            name = applier.create(PoolAction(CREATE, pool.name, pool.namespace), {vm.name for vm in vms},
                                  args.name).vm
    except KubeError as failure:
        error(f"compose: the cluster refused the VM: {failure}")
        return EXIT_FAILED
    assert name is not None
    result: dict[str, Any] = {"pool": pool.name, "namespace": pool.namespace, "vm": name,
                              "bmc": identity.redfish_host(name, pool.namespace, values["redfish"]["domain"]),
                              "stage": CREATED}
    if args.wait or existing:   # an existing VM's stage is read from MAAS, once without --wait
        try:
            client = client_from_values(values, note)
            stage, machine = wait_ready(cluster, client, pool, name, seed_text, values["redfish"]["domain"],
                                        args.timeout if args.wait else 0)
        except (KubeError, MAASError) as failure:
            error(f"compose {name}: {'found' if existing else 'made'}, but its progress could not be read: {failure}")
            return EXIT_FAILED
        result["stage"] = stage
        if machine is not None:
            result.update(system_id=machine.system_id, hostname=machine.hostname)
    print(json.dumps(result) if args.output == JSON else document(result, YAML) if args.output == YAML else
          "\t".join(str(result.get(key, "")) for key in ("vm", "namespace", "stage", "system_id", "hostname")),
          flush=True)
    if args.wait and result["stage"] != READY:
        error(f"compose {name}: not Ready after {args.timeout} s: stopped at {result['stage']}")
        return EXIT_FAILED
    return EXIT_OK
