#!/bin/sh
# The node bridge br-pxe onto the PXE VLAN with NetworkManager, the equivalent of
# examples/netplan-br-pxe.yaml for nodes that NetworkManager configures (docs/how-to/pxe-network.md).
# Run as root on each node that runs VMs MAAS boots; UPLINK and VLAN as for your site.
# No address on the bridge (ipv4/ipv6 disabled): only the VMs are on the PXE segment, and MAAS
# gives them their addresses. STP off: it would hold a PXE client's port while it learns.
set -eu
UPLINK=${UPLINK:-eno1}
VLAN=${VLAN:-100}
nmcli connection add type bridge ifname br-pxe con-name br-pxe \
    ipv4.method disabled ipv6.method disabled bridge.stp no
nmcli connection add type vlan ifname vlan-pxe con-name vlan-pxe \
    dev "$UPLINK" id "$VLAN" master br-pxe slave-type bridge
nmcli connection up br-pxe
