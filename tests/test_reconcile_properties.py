"""Properties of the plan over random MAAS inventories (hypothesis).

Inventories mix KubeVirt VMs (some sharing a VM identity, some with odd address forms),
physical IPMI servers, lookalike domains such as web1.vms.bmc.example.com.evil.io, other power
types pointing at our names, machines without power parameters, every status, hostnames that
hold a VM's name or fallback name, and pools chosen by operators.
"""

from __future__ import annotations

import copy

from hypothesis import given
from hypothesis import strategies as st

from maas_kubevirt import identity
from maas_kubevirt.reconcile import (
    COMMISSION,
    CREATE_POOL,
    MOVE_POOL,
    RENAME,
    Settings,
    in_default_pool,
    is_new,
    plan,
)

DOMAIN = "bmc.example.com"
STATUSES = ["New", "Commissioning", "Failed commissioning", "Missing", "Ready", "Reserved", "Deployed",
            "Retired", "Broken", "Deploying", "Allocated", "Failed deployment", "Releasing",
            "Rescue mode", "Testing", "Failed testing"]
STATUS_CODE = {name: code for code, name in enumerate(STATUSES)}
COMMISSION_FROM = ("New", "Failed commissioning", "Ready", "Broken")
VMS = ["web1", "web2", "db.primary", "a" * 58, "x"]
NAMESPACES = ["vms", "team-b", "n" * 40]
IDENTITIES = [(vm, ns) for vm in VMS for ns in NAMESPACES]


def ours(vm: str, ns: str):
    return st.builds(
        lambda scheme, upper, port, path: (
            f"{scheme}{(vm + '.' + ns + '.' + DOMAIN).upper() if upper else vm + '.' + ns + '.' + DOMAIN}"
            f"{port}{path}"
        ),
        st.sampled_from(["https://", "http://", ""]),
        st.booleans(),
        st.sampled_from(["", ":443", ":8000"]),
        st.sampled_from(["", "/redfish/v1/Systems/1", "/"]),
    )


def lookalikes(vm: str, ns: str):
    return st.sampled_from([
        f"https://{vm}.{ns}.{DOMAIN}.evil.io/redfish/v1/Systems/1",
        f"https://{vm}.{ns}.x{DOMAIN}",
        f"https://{vm}.{ns}-{DOMAIN}",
        f"https://{ns}.{DOMAIN}",
        f"https://{DOMAIN}",
        f"https://{vm}_{ns}.{DOMAIN}",
        f"ftp://{vm}.{ns}.{DOMAIN}",
        f"https://evil.io/{vm}.{ns}.{DOMAIN}",
        "10.0.0.7",
        "",
    ])


@st.composite
def machine_specs(draw):
    vm, ns = draw(st.sampled_from(IDENTITIES))
    kind = draw(st.sampled_from(["vm", "vm", "vm", "ipmi", "lookalike", "other-type", "no-params"]))
    power_type = {"vm": "redfish", "lookalike": "redfish", "no-params": "redfish", "ipmi": "ipmi",
                  "other-type": draw(st.sampled_from(["virsh", "manual", "lxd", ""]))}[kind]
    if kind in ("vm", "other-type", "ipmi") and draw(st.booleans()):
        address = draw(ours(vm, ns))
    elif kind in ("lookalike", "ipmi"):
        address = draw(lookalikes(vm, ns))
    else:
        address = draw(ours(vm, ns))
    hostname = draw(st.one_of(
        st.sampled_from([identity.maas_hostname(v, n) for v, n in IDENTITIES]),
        st.sampled_from([identity.fallback_hostname(v, n) for v, n in IDENTITIES]),
        st.sampled_from(["lucky-cat", "brave-fox", "node1", "web1-vms", "WEB1-VMS"]),
    ))
    pool = draw(st.sampled_from(["default", "default", "ops", *NAMESPACES]))
    return {
        "kind": kind, "power_type": power_type, "address": address, "hostname": hostname,
        "status": draw(st.sampled_from(STATUSES)), "pool": pool,
        "tags": draw(st.lists(st.sampled_from(["kubevirt-approved", "gpu", "virtual"]), max_size=2, unique=True)),
    }


@st.composite
def inventories(draw):
    specs = draw(st.lists(machine_specs(), max_size=25))
    machines, power, seen = [], {}, set()
    for index, spec in enumerate(specs):
        hostname = spec["hostname"]
        if hostname.lower() in seen:  # MAAS keeps hostnames unique
            hostname = f"{hostname[:50]}-dup{index}"
        seen.add(hostname.lower())
        sid = f"s{index:04d}"
        pool_id = 0 if spec["pool"] == "default" else 1 + (["ops", *NAMESPACES].index(spec["pool"]))
        machines.append({
            "system_id": sid, "hostname": hostname, "power_type": spec["power_type"],
            "status_name": spec["status"], "status": STATUS_CODE[spec["status"]],
            "pool": {"name": spec["pool"], "id": pool_id}, "tag_names": spec["tags"],
        })
        if spec["kind"] != "no-params":
            power[sid] = {"power_address": spec["address"], "power_user": "maas", "power_pass": "pw-" + sid}
    pools = draw(st.lists(st.sampled_from(["default", "ops", *NAMESPACES]), unique=True))
    settings = Settings(
        domain=DOMAIN,
        commission=draw(st.sampled_from(["auto", "approved", "never"])),
        approval_tag="kubevirt-approved",
        on_hostname_taken=draw(st.sampled_from(["fallback", "skip"])),
    )
    return machines, power, pools, settings


def matching_ids(machines, power):
    """Independent of the plan: redfish and an address that parses for the domain."""
    return {
        m["system_id"] for m in machines
        if m["power_type"] == "redfish" and m["system_id"] in power
        and identity.parse_redfish_address(power[m["system_id"]]["power_address"], DOMAIN) is not None
    }


def simulate(machines, pools, actions):
    """Apply actions with MAAS's rules (unique hostnames, pool must exist, commission states)."""
    machines = copy.deepcopy(machines)
    by_id = {m["system_id"]: m for m in machines}
    pools = {p for p in pools} | {m["pool"]["name"] for m in machines}
    for action in actions:
        if action.kind == CREATE_POOL:
            pools.add(action.after)
        elif action.kind == RENAME:
            if any(m["hostname"].lower() == action.after.lower() for m in machines
                   if m["system_id"] != action.system_id):
                continue  # 400: MAAS refuses; the plan must not have asked
            by_id[action.system_id]["hostname"] = action.after
        elif action.kind == MOVE_POOL:
            assert action.after in pools, "move into a pool that does not exist"
            by_id[action.system_id]["pool"] = {"name": action.after, "id": 99}
        elif action.kind == COMMISSION:
            machine = by_id[action.system_id]
            if machine["status_name"] in COMMISSION_FROM:
                machine["status_name"], machine["status"] = "Commissioning", 1
    return machines, sorted(p for p in pools if p)


@given(inventories())
def test_no_action_names_a_machine_that_is_not_ours(inventory):
    machines, power, pools, settings = inventory
    allowed = matching_ids(machines, power)
    for action in plan(machines, power, pools, settings):
        if action.kind == CREATE_POOL:
            assert action.system_id is None
        else:
            assert action.system_id in allowed


@given(inventories())
def test_commission_only_new_and_as_allowed(inventory):
    machines, power, pools, settings = inventory
    by_id = {m["system_id"]: m for m in machines}
    for action in plan(machines, power, pools, settings):
        if action.kind == COMMISSION:
            machine = by_id[action.system_id]
            assert machine["status_name"] == "New" and is_new(machine)
            assert settings.commission != "never"
            if settings.commission == "approved":
                assert settings.approval_tag in machine["tag_names"]


@given(inventories())
def test_moves_only_out_of_default_into_the_namespace_pool(inventory):
    machines, power, pools, settings = inventory
    by_id = {m["system_id"]: m for m in machines}
    created = []
    for action in plan(machines, power, pools, settings):
        if action.kind == CREATE_POOL:
            assert action.after not in pools and action.after not in created
            created.append(action.after)
        if action.kind == MOVE_POOL:
            assert in_default_pool(by_id[action.system_id])
            assert action.after == identity.pool_name(action.namespace)
            assert action.after in pools or action.after in created or any(
                m["pool"]["name"] == action.after for m in machines)


@given(inventories())
def test_renames_never_collide(inventory):
    """Applied in plan order, every rename takes a name no other machine holds at that moment."""
    machines, power, pools, settings = inventory
    held = {m["hostname"].lower(): m["system_id"] for m in machines}
    current = {m["system_id"]: m["hostname"].lower() for m in machines}
    for action in plan(machines, power, pools, settings):
        if action.kind == RENAME:
            assert held.get(action.after.lower(), action.system_id) == action.system_id
            del held[current[action.system_id]]
            current[action.system_id] = action.after.lower()
            held[action.after.lower()] = action.system_id
            assert action.after in (identity.maas_hostname(action.vm, action.namespace),
                                    identity.fallback_hostname(action.vm, action.namespace))
            if settings.on_hostname_taken == "skip":
                assert action.after == identity.maas_hostname(action.vm, action.namespace)


@given(inventories())
def test_apply_then_plan_again_is_idle(inventory):
    machines, power, pools, settings = inventory
    actions = plan(machines, power, pools, settings)
    after, pools_after = simulate(machines, pools, [a for a in actions if a.changes])
    again = plan(after, power, pools_after, settings)
    assert [a for a in again if a.changes] == []
    # The explanations are stable too: the same skips, nothing new to say.
    assert len(again) <= len(actions)


@given(inventories())
def test_plan_is_pure(inventory):
    machines, power, pools, settings = inventory
    before = copy.deepcopy((machines, power, pools))
    first = plan(machines, power, pools, settings)
    assert (machines, power, pools) == before
    assert plan(machines, power, pools, settings) == first
