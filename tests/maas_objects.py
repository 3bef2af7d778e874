"""Machine objects of the size MAAS sends: the MAAS double's heavy fields.

MAAS serialises every field of ``DISPLAYED_MACHINE_FIELDS`` (src/maasserver/api/machines.py)
for each machine in ``GET machines/``, with the full interface set (each link embedding its
subnet, each subnet its VLAN), the block devices twice (``blockdevice_set`` and
``physicalblockdevice_set``) with their partitions and file systems, the boot interface and
boot disk again, and the NUMA nodes. MAAS's own API example of one machine
(src/maasserver/api/examples/machines.json, ``machines-allocate``: 6 interfaces, 3 block
devices) is 18 KB. So a server here gets 6 interfaces (2 physical ports, a bond over them, 3
VLANs on the bond) and 3 disks (about 18 KB in all); a KubeVirt VM gets 1 interface and 2 disks
(about 11 KB). Values are synthetic; shapes and key sets follow MAAS's serialisers.
"""

from __future__ import annotations

import json
from typing import Any

_FABRIC_VLANS = [(0, "untagged", 5001), (101, "storage", 5101), (102, "tenant", 5102), (103, "backup", 5103)]


def _vlan(vid: int, name: str, vlan_id: int) -> dict[str, Any]:
    return {
        "vid": vid, "mtu": 1500, "dhcp_on": vid == 0, "external_dhcp": None, "relay_vlan": None,
        "space": "management" if vid == 0 else name, "primary_rack": "7xtf67",
        "secondary_rack": "76y7pg", "fabric": "fabric-0", "id": vlan_id, "fabric_id": 0,
        "name": name, "resource_uri": f"/MAAS/api/2.0/vlans/{vlan_id}/",
    }


def _subnet(index: int, vid: int, name: str, vlan_id: int) -> dict[str, Any]:
    return {
        "name": f"{name}-net", "vlan": _vlan(vid, name, vlan_id), "cidr": f"10.{vid % 256}.0.0/16",
        "rdns_mode": 2, "gateway_ip": f"10.{vid % 256}.0.1",
        "dns_servers": ["10.0.0.2", "10.0.0.3"], "allow_dns": True, "allow_proxy": True,
        "active_discovery": False, "managed": True, "disabled_boot_architectures": [],
        "space": "management" if vid == 0 else name, "id": index,
        "resource_uri": f"/MAAS/api/2.0/subnets/{index}/",
    }


def _mac(number: int, port: int) -> str:
    value = (0x52_54_00 << 24) | ((number * 8 + port) & 0xFFFFFF)
    return ":".join(f"{(value >> shift) & 0xFF:02x}" for shift in range(40, -8, -8))


def _interface(system_id: str, number: int, iface_id: int, name: str, kind: str, mac: str,
               vlan: tuple[int, str, int], parents: list[str], children: list[str],
               address: str | None) -> dict[str, Any]:
    vid, vlan_name, vlan_id = vlan
    links = []
    if address is not None:
        links.append({"id": iface_id * 10, "mode": "auto", "ip_address": address,
                      "subnet": _subnet(1 + vid, vid, vlan_name, vlan_id)})
    return {
        "firmware_version": "1.2.3" if kind == "physical" else None,
        "vlan": _vlan(vid, vlan_name, vlan_id), "parents": parents, "effective_mtu": 1500,
        "system_id": system_id, "tags": ["sriov"] if kind == "physical" else [],
        "enabled": True, "product": "Ethernet Controller X710" if kind == "physical" else None,
        "links": links, "type": kind, "children": children,
        "vendor": "Intel Corporation" if kind == "physical" else None, "mac_address": mac,
        "discovered": [], "id": iface_id, "params": {"bond_mode": "802.3ad"} if kind == "bond" else "",
        "name": name, "numa_node": 0, "link_connected": True, "interface_speed": 10000,
        "link_speed": 10000 if kind == "physical" else 0, "sriov_max_vf": 8 if kind == "physical" else 0,
        "resource_uri": f"/MAAS/api/2.0/nodes/{system_id}/interfaces/{iface_id}/",
    }


def _interfaces(system_id: str, number: int, virtual: bool, macs: list[str] | None = None) -> list[dict[str, Any]]:
    """The interfaces, their MACs (the physical ports') ``macs`` when given, synthetic otherwise."""
    base = number * 8
    macs = (macs or []) + [_mac(number, port) for port in range(len(macs or []), 2)]
    octets = f"{number // 65536 % 256}.{number // 256 % 256}.{number % 256}"
    if virtual:
        return [_interface(system_id, number, base, "enp1s0", "physical", macs[0],
                           _FABRIC_VLANS[0], [], [], f"10.0.{number // 256 % 256}.{number % 256}")]
    ports = [_interface(system_id, number, base + i, f"eno{i + 1}", "physical", macs[i],
                        _FABRIC_VLANS[0], [], ["bond0"], None) for i in range(2)]
    vlans = [_interface(system_id, number, base + 3 + i, f"bond0.{vid}", "vlan", macs[0],
                        (vid, name, vlan_id), ["bond0"], [], f"10.{vid}.{octets}".rsplit(".", 1)[0])
             for i, (vid, name, vlan_id) in enumerate(_FABRIC_VLANS[1:])]
    bond = _interface(system_id, number, base + 2, "bond0", "bond", macs[0], _FABRIC_VLANS[0],
                      ["eno1", "eno2"], [v["name"] for v in vlans], f"10.0.{octets}".rsplit(".", 1)[0])
    return ports + [bond] + vlans


def _disk(system_id: str, number: int, index: int, virtual: bool) -> dict[str, Any]:
    device_id = number * 4 + index
    name = f"{'vd' if virtual else 'sd'}{'abcd'[index]}"
    size = (40 if virtual else 960) * 10**9
    partitions = []
    if index == 0:
        layout = [("/boot/efi", "fat32", 536870912), ("/", "ext4", size - 536870912 - 2**20)]
        for part, (mount, fstype, part_size) in enumerate(layout, start=1):
            partitions.append({
                "uuid": f"{device_id:08x}-0000-4000-8000-{part:012x}", "size": part_size,
                "bootable": part == 1, "tags": [], "system_id": system_id, "device_id": device_id,
                "type": "partition",
                "filesystem": {"fstype": fstype, "label": "efi" if part == 1 else "root",
                               "uuid": f"{device_id:08x}-1111-4000-8000-{part:012x}",
                               "mount_point": mount, "mount_options": None},
                "id": device_id * 10 + part, "path": f"/dev/disk/by-dname/{name}-part{part}",
                "used_for": f"{fstype} formatted filesystem mounted at {mount}",
                "resource_uri": f"/MAAS/api/2.0/nodes/{system_id}/blockdevices/{device_id}/partition/{part}",
            })
    return {
        "id_path": None if virtual else f"/dev/disk/by-id/wwn-0x5000c500{device_id:08x}",
        "size": size, "block_size": 512 if virtual else 4096,
        "tags": ["rotary"] if not virtual and index else ["ssd"],
        "system_id": system_id, "type": "physical", "uuid": None, "filesystem": None,
        "partitions": partitions, "partition_table_type": "GPT" if partitions else None,
        "model": "QEMU HARDDISK" if virtual else "SAMSUNG MZ7LH960", "storage_pool": None,
        "available_size": 0 if partitions else size, "id": device_id,
        "used_size": size - 2**20 if partitions else 0, "numa_node": 0,
        "path": f"/dev/disk/by-dname/{name}",
        "used_for": "GPT partitioned with 2 partitions" if partitions else "Unused",
        "serial": f"{'QM' if virtual else 'S4'}{device_id:010d}", "name": name,
        "firmware_version": "2.5+" if virtual else "HXT7404Q",
        "resource_uri": f"/MAAS/api/2.0/nodes/{system_id}/blockdevices/{device_id}/",
    }


def machine_fields(number: int, virtual: bool) -> dict[str, Any]:
    """The light fields of DISPLAYED_MACHINE_FIELDS the double does not otherwise set."""
    statuses = {f"{kind}_test_status": 2 for kind in ("cpu", "memory", "network", "storage", "other", "interface")}
    statuses.update({f"{kind}_test_status_name": "Passed"
                     for kind in ("cpu", "memory", "network", "storage", "other", "interface")})
    return {
        "description": "", "owner": None, "owner_data": {}, "locked": False, "cache_sets": [],
        "bcaches": [], "bios_boot_method": "uefi" if virtual else "pxe", "min_hwe_kernel": "",
        "hwe_kernel": None, "cpu_speed": 2400 if virtual else 3100,
        "swap_size": None, "storage": 80000.0 if virtual else 2880000.0, "ephemeral_deploy": False,
        "error_description": "", "netboot": True, "address_ttl": None,
        "ip_addresses": [f"10.0.{number // 256 % 256}.{number % 256}"], "disable_ipv4": False,
        "constraints_by_type": {}, "virtualblockdevice_set": [], "volume_groups": [], "raids": [],
        "status_action": "", "node_type": 0, "node_type_name": "Machine",
        "special_filesystems": [], "parent": None,
        "default_gateways": {"ipv4": {"gateway_ip": "10.0.0.1", "link_id": None},
                             "ipv6": {"gateway_ip": None, "link_id": None}},
        "current_commissioning_result_id": number * 3 + 1, "current_testing_result_id": number * 3 + 2,
        "current_installation_result_id": None, "commissioning_status": 2,
        "commissioning_status_name": "Passed", "testing_status": 2, "testing_status_name": "Passed",
        **statuses,
        "hardware_info": {
            "system_vendor": "KubeVirt" if virtual else "Dell Inc.",
            "system_product": "None" if virtual else "PowerEdge R650",
            "system_family": "KubeVirt" if virtual else "PowerEdge",
            "system_version": "pc-q35-rhel9.4.0" if virtual else "Unknown",
            "system_sku": "Unknown", "system_serial": f"SN{number:08d}",
            "cpu_model": "Intel Xeon Processor (Icelake)" if virtual else "Intel(R) Xeon(R) Gold 6338 CPU",
            "mainboard_vendor": "Unknown" if virtual else "Dell Inc.",
            "mainboard_product": "Unknown" if virtual else "0K6K6M",
            "mainboard_serial": "Unknown", "mainboard_version": "Unknown",
            "mainboard_firmware_vendor": "EFI Development Kit II / OVMF" if virtual else "Dell Inc.",
            "mainboard_firmware_date": "02/06/2015", "mainboard_firmware_version": "0.0.0",
            "chassis_vendor": "Unknown", "chassis_type": "Other" if virtual else "Rack Mount Chassis",
            "chassis_serial": "Unknown", "chassis_version": "Unknown",
        },
        "workload_annotations": {}, "last_sync": None, "sync_interval": None, "next_sync": None,
        "enable_hw_sync": False, "enable_kernel_crash_dump": False, "is_dpu": False,
    }


def machine_heavy_fields(system_id: str, number: int, virtual: bool, macs: list[str] | None = None) -> str:
    """The interfaces, block devices and NUMA nodes of one machine as a JSON object body
    (``"interface_set": [...], ...`` without braces), serialised once: they never change."""
    interfaces = _interfaces(system_id, number, virtual, macs)
    disks = [_disk(system_id, number, i, virtual) for i in range(2 if virtual else 3)]
    cores = 2 if virtual else 32
    numa = [{"index": n, "memory": 4096 if virtual else 131072, "cores": list(range(n * cores, (n + 1) * cores)),
             "hugepages_set": []} for n in range(1 if virtual else 2)]
    heavy = {
        "interface_set": interfaces, "boot_interface": interfaces[0],
        "blockdevice_set": disks, "physicalblockdevice_set": disks, "boot_disk": disks[0],
        "numanode_set": numa,
    }
    return json.dumps(heavy, separators=(", ", ": "))[1:-1]
