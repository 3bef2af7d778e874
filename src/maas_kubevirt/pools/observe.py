"""What the cluster and MAAS say of the pools: the VMs each pool made, and their machines.

Per cycle: one list of VMs per pool namespace (the pool label selects them; ``vm.owned`` keeps
only those the reconciler made), one ``machines/?mac_address=`` and one bulk read of those
machines' power addresses. A machine is a pool VM's only when its boot MAC is the VM's
(KubeMacPool's) and its power address is exactly the VM's ``<vm>.<namespace>.<domain>``.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from maas_kubevirt import identity
from maas_kubevirt.pools import vm as pool_vm
from maas_kubevirt.pools.plan import PoolMachine, PoolVM
from maas_kubevirt.pools.spec import POOL_LABEL, Pool


def vms_path(namespace: str, name: str = "") -> str:
    base = f"/apis/kubevirt.io/v1/namespaces/{identity.validate_namespace(namespace)}/virtualmachines"
    return f"{base}/{identity.validate_vm_name(name)}" if name else base


def mac_of(vm: Mapping[str, Any]) -> str | None:
    """The MAC of the VM's PXE interface, lower-case, as KubeMacPool set it; None before it has."""
    template = ((vm.get("spec") or {}).get("template") or {}).get("spec") or {}
    interfaces = ((template.get("domain") or {}).get("devices") or {}).get("interfaces") or []
    for interface in interfaces:
        if isinstance(interface, dict) and interface.get("name") == pool_vm.INTERFACE:
            mac = interface.get("macAddress")
            return mac.lower() if isinstance(mac, str) and mac else None
    return None


def pool_vms(cluster: Any, pools: Iterable[Pool], seed: str) -> list[PoolVM]:
    """Every VM a pool made, in every pool namespace."""
    by_name = {pool.name: pool for pool in pools}
    found = []
    for namespace in sorted({pool.namespace for pool in by_name.values()}):
        for item in cluster.items(vms_path(namespace), label_selector=POOL_LABEL):
            pool = pool_vm.owned(item, by_name, seed)
            if pool is not None:
                metadata = item["metadata"]
                found.append(PoolVM(metadata["name"], namespace, pool.name, mac_of(item),
                                    bool(metadata.get("deletionTimestamp"))))
    return found


def _macs(machine: Mapping[str, Any]) -> set[str]:
    interfaces = [machine.get("boot_interface"), *(machine.get("interface_set") or [])]
    return {i["mac_address"].lower() for i in interfaces
            if isinstance(i, dict) and isinstance(i.get("mac_address"), str)}


def _used(machine: Mapping[str, Any]) -> bool:
    return machine.get("current_installation_result_id") is not None


def pool_machines(client: Any, vms: Iterable[PoolVM], domain: str,
                  used: set[str] = frozenset()) -> dict[tuple[str, str], PoolMachine]:
    """(vm, namespace) -> its machine, for the VMs whose MAC a machine of MAAS has and whose
    power address names that VM exactly; ``used``: system ids the reconciler saw allocated."""
    by_mac = {vm.mac: vm for vm in vms if vm.mac}
    if not by_mac:
        return {}
    machines = [m for m in client.machines_by_mac(by_mac) if isinstance(m, dict)
                and isinstance(m.get("system_id"), str)]
    addresses = client.power_addresses([m["system_id"] for m in machines]) if machines else {}
    found: dict[tuple[str, str], PoolMachine] = {}
    twice: set[tuple[str, str]] = set()
    for machine in machines:
        claimed = identity.parse_redfish_address(addresses.get(machine["system_id"]), domain)
        for mac in _macs(machine) & set(by_mac):
            vm = by_mac[mac]
            if claimed != (vm.name, vm.namespace):
                continue
            tags = tuple(t for t in machine.get("tag_names") or [] if isinstance(t, str))
            if claimed in found:
                twice.add(claimed)
            found[claimed] = PoolMachine(
                machine["system_id"], str(machine.get("hostname") or ""), vm.name, vm.namespace,
                str(machine.get("status_name") or ""), tags,
                _used(machine) or machine["system_id"] in used)
    # Two machines with the VM's MAC and address: neither is trusted as the VM's.
    return {key: machine for key, machine in found.items() if key not in twice}
