"""docs/reference/prerequisites.md states each component's versions once, and they are the lock
file's; the PXE network's node bridge example (examples/netplan-br-pxe.yaml) has netplan's shape."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from reference_pages import cells, sections

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "reference" / "prerequisites.md"
# The components issue 43 item 6 asks the table for, each once.
COMPONENTS = ("Kubernetes", "KubeVirt", "CDI", "kubevirtBMC", "cert-manager", "KubeMacPool", "Multus", "Kyverno",
              "The BMC proxy", "MAAS")


def lock() -> dict[str, str]:
    """upstream.lock.yaml's "name: version" lines (the shape shell scripts read too)."""
    return dict(re.findall(r"^([\w-]+):\s*(\S.*?)\s*$", (ROOT / "upstream.lock.yaml").read_text(), re.M))


def table() -> list[list[str]]:
    rows = [cells(line) for line in PAGE.read_text().splitlines() if line.startswith("|")]
    assert rows and rows[0][:3] == ["Component", "Lock key", "Proven"], "the page lost its table's shape"
    return rows[2:]


def test_every_component_has_one_row():
    names = [row[0] for row in table()]
    for component in COMPONENTS:
        assert len([n for n in names if n.startswith(component)]) == 1, f"{component}: not one row in {names}"


def test_each_proven_version_is_the_lock_files():
    pins = lock()
    for component, key, proven, _required in table():
        # No component is left to the reader's pick of a release (issue 43): each row names its pin.
        assert key != "—", f"{component}: no lock key; pin its release in upstream.lock.yaml"
        key = key.strip("`")
        assert key in pins, f"{component}: upstream.lock.yaml has no {key!r}"
        assert proven == ", ".join(pins[key].split()), f"{component}: the page says {proven!r}, the lock file {pins[key]!r}"


def test_every_component_the_lock_file_pins_has_its_row():
    keys = {row[1].strip("`") for row in table()}
    # etcd comes with the control plane, maas with maas-proven, envoy-gateway is an alternative to
    # the BMC proxy (docs/how-to/gateway.md), maas-commits names sources: none is a separate install.
    pinned = set(lock()) - {"etcd", "maas", "maas-commits", "envoy-gateway"}
    assert pinned <= keys, f"upstream.lock.yaml pins {sorted(pinned - keys)}, which the page does not list"


# The section of the page whose install commands install each pinned component (the BMC proxy
# has none, the bundle renders it; MAAS's snap names a channel, which tests/test_docs.py checks).
BMC_SECTION = "kubevirtBMC, with cert-manager"
SECTIONS = {"Kubernetes": "Kubernetes", "KubeVirt": "KubeVirt", "CDI": "CDI", "kubevirtBMC": BMC_SECTION,
            "cert-manager": BMC_SECTION, "KubeMacPool": "KubeMacPool", "Multus": "Multus", "Kyverno": "Kyverno"}


def test_each_install_command_names_the_tables_release():
    """Every command of a component's section names the release its row gives (which is the lock
    file's, above); none leaves the release to the reader ($VERSION) or to a branch (master)."""
    text = PAGE.read_text()
    under = sections(text, "##")
    for component, _key, proven, _required in table():
        name = next((c for c in SECTIONS if component.startswith(c)), None)
        if name is None:
            continue
        blocks = re.findall(r"^```sh\n(.*?)^```$", under[SECTIONS[name]], re.M | re.S)
        assert blocks, f"{component}: no install command under ## {SECTIONS[name]}"
        for block in blocks:
            assert proven in block, f"{component}: ## {SECTIONS[name]}'s command does not name {proven}"
    for block in re.findall(r"^```sh\n(.*?)^```$", text, re.M | re.S):
        assert "$VERSION" not in block and "/master/" not in block, f"a command with no release: {block}"


def test_the_kyverno_floor_is_stated_as_the_design_states_it():
    """Issue 43 item 3: install.md said 1.13 or later, the tutorial 1.19.1; the table gives both,
    as required and proven, and the design's contract is the floor."""
    row = next(r for r in table() if r[0] == "Kyverno")
    assert "1.13 or later" in row[3]
    assert "**Kyverno 1.13 or later**" in (ROOT / "docs" / "explanation" / "design.md").read_text()


# --- examples/netplan-br-pxe.yaml: netplan's documented keys (netplan itself does not run here) ---

def test_the_netplan_example_bridges_the_pxe_vlan_without_an_address():
    network = yaml.safe_load((ROOT / "examples" / "netplan-br-pxe.yaml").read_text())["network"]
    assert network["version"] == 2
    assert set(network) <= {"version", "renderer", "ethernets", "vlans", "bridges"}
    vlans, bridges = network["vlans"], network["bridges"]
    bridge = bridges["br-pxe"]   # the name examples/pxe-nad.yaml's bridge CNI attaches to
    assert bridge["interfaces"] and set(bridge["interfaces"]) <= set(vlans)
    for name in bridge["interfaces"]:
        assert isinstance(vlans[name]["id"], int) and 1 <= vlans[name]["id"] <= 4094
        assert vlans[name]["link"] in network.get("ethernets", {}), f"{name}'s link is not an interface the file names"
    # The node takes no part in the PXE segment: MAAS's rack answers DHCP there, for the VMs.
    assert bridge.get("dhcp4") is False and bridge.get("dhcp6") is False and "addresses" not in bridge
    assert bridge.get("parameters", {}).get("stp") is False


def test_the_nad_attaches_to_the_bridge_the_netplan_example_makes():
    import json
    nad = yaml.safe_load((ROOT / "examples" / "pxe-nad.yaml").read_text())
    config = json.loads(nad["spec"]["config"])
    network = yaml.safe_load((ROOT / "examples" / "netplan-br-pxe.yaml").read_text())["network"]
    assert config["type"] == "bridge" and config["bridge"] in network["bridges"]
    assert not config.get("ipam") and not config.get("isGateway") and not config.get("ipMasq")
    assert "br-pxe" in (ROOT / "examples" / "nm-br-pxe.sh").read_text()
