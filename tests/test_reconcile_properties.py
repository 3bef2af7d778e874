"""Properties of the plan, and of whole cycles against the MAAS double, over random MAAS
inventories (hypothesis).

Inventories mix KubeVirt VMs (some sharing a VM identity, some with odd address forms, every
state of the stored password), physical IPMI servers, lookalike domains such as
web1.vms.bmc.example.com.evil.io, other power types pointing at our names, machines without
power parameters, every status, hostnames that hold a VM's name or fallback name, and pools
chosen by operators.
"""

from __future__ import annotations

import copy
import re
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings as hypothesis_settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))

from branches import branch, branches_taken  # noqa: E402
from maas_double import POWER_SETTINGS, MaasDouble  # noqa: E402
from reconcile_helpers import GOOD_RECORD, SEED, Args, assert_no_secrets, derived, write_values  # noqa: E402

from maas_kubevirt import cli, identity, maas  # noqa: E402
from maas_kubevirt.audit import Audit  # noqa: E402
from maas_kubevirt.maas import RetryPolicy  # noqa: E402
from maas_kubevirt.reconcile import (  # noqa: E402
    pool_description,
    COMMISSION,
    CREATE_POOL,
    DUPLICATE,
    MOVE_POOL,
    PLACEHOLDER,
    RENAME,
    RIGHT,
    SET_PASSWORD,
    RESET_PASSWORD,
    ROTATE,
    SKIP,
    SUSPECT,
    Action,
    Match,
    Passwords,
    Power,
    Reconciler,
    Settings,
    assign_hostnames,
    in_default_pool,
    is_new,
    machine_problem,
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
    """The canonical address: the bare host, in any ASCII case."""
    host = f"{vm}.{ns}.{DOMAIN}"
    return st.sampled_from([host, host.upper()])


def suspects(vm: str, ns: str):
    """The bare host dressed up as an attacker would: each still names the VM, none is canonical."""
    return st.builds(
        lambda scheme, user, upper, dot, port, path: (
            f"{scheme}{user}{(vm + '.' + ns + '.' + DOMAIN).upper() if upper else vm + '.' + ns + '.' + DOMAIN}"
            f"{dot}{port}{path}"
        ),
        st.sampled_from(["https://", "http://", ""]),
        st.sampled_from(["", "maas@"]),
        st.booleans(),
        st.sampled_from(["", "."]),
        st.sampled_from(["", ":443", ":31234"]),
        st.sampled_from(["", "/redfish/v1/Systems/1", "/", "?x", "#"]),
    ).filter(lambda address: address.lower() != f"{vm}.{ns}.{DOMAIN}")


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
    kind = draw(st.sampled_from(["vm", "vm", "vm", "ipmi", "lookalike", "suspect", "other-type", "no-params"]))
    power_type = {"vm": "redfish", "lookalike": "redfish", "suspect": "redfish", "no-params": "redfish",
                  "ipmi": "ipmi", "other-type": draw(st.sampled_from(["virsh", "manual", "lxd", ""]))}[kind]
    if kind in ("vm", "other-type", "ipmi") and draw(st.booleans()):
        address = draw(ours(vm, ns))
    elif kind == "suspect":
        address = draw(suspects(vm, ns))
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
        "password": draw(st.sampled_from([RIGHT, RIGHT, PLACEHOLDER, "unset", "other"])),
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
            power[sid] = Power(spec["address"], spec["password"], user=RIGHT)
    pools = draw(st.lists(st.sampled_from(["default", "ops", *NAMESPACES]), unique=True))
    settings = Settings(
        domain=DOMAIN,
        commission=draw(st.sampled_from(["auto", "approved", "never"])),
        approval_tag="kubevirt-approved",
        on_hostname_taken=draw(st.sampled_from(["fallback", "skip"])),
    )
    return machines, power, pools, settings


# The oracles do not call identity.py, which the plan uses. Canonical: exactly one of the generated
# <vm>.<ns>.<domain> hosts, ASCII, in any case. Suspect: one of them inside other text, between
# what may stand around a host (a scheme or userinfo before; a dot, port, path, query or
# fragment after).
OUR_HOSTS = {f"{vm}.{ns}.{DOMAIN}": (vm, ns) for vm, ns in IDENTITIES}


def claim_of(address):
    """(vm, namespace) when the address is canonically one of the generated VMs, else None."""
    return OUR_HOSTS.get(address.lower()) if isinstance(address, str) and address.isascii() else None


def suspect_of(address):
    """(vm, namespace) a non-canonical address names, else None."""
    if not isinstance(address, str) or claim_of(address) is not None:
        return None
    for host, claimed in OUR_HOSTS.items():
        if re.search(rf"(^|[/@\s]){re.escape(host)}($|[.:/?#\s])", address.lower()):
            return claimed
    return None


def matching_ids(machines, power):
    """Independent of the plan: redfish and a canonical address naming one of the generated VMs."""
    return {
        m["system_id"] for m in machines
        if m["power_type"] == "redfish" and m["system_id"] in power
        and claim_of(power[m["system_id"]].address) is not None
    }


def suspect_ids(machines, power):
    return {
        m["system_id"] for m in machines
        if m["power_type"] == "redfish" and m["system_id"] in power
        and suspect_of(power[m["system_id"]].address) is not None
    }


def duplicate_ids(machines, power):
    """Independent of the plan: matching machines whose <vm>.<namespace> another one claims too."""
    ours = matching_ids(machines, power)
    claimed = {sid: claim_of(power[sid].address) for sid in ours}
    counts = Counter(claimed.values())
    return {sid for sid, claim in claimed.items() if counts[claim] > 1}


def simulate(machines, power, pools, actions):
    """Apply actions with MAAS's rules (unique hostnames, pool must exist, commission states)."""
    machines = copy.deepcopy(machines)
    power = dict(power)
    by_id = {m["system_id"]: m for m in machines}
    pools = {p for p in pools} | {m["pool"]["name"] for m in machines}
    for action in actions:
        if action.kind == SET_PASSWORD:
            power[action.system_id] = Power(action.address, RIGHT, user=RIGHT)
        elif action.kind == RESET_PASSWORD:
            power[action.system_id] = Power(power[action.system_id].address, PLACEHOLDER)
        elif action.kind == CREATE_POOL:
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
    return machines, power, sorted(p for p in pools if p)


@branches_taken(ours=0.5, not_ours=0.5)
@given(inventories())
def test_no_action_names_a_machine_that_is_not_ours(inventory):
    machines, power, pools, settings = inventory
    allowed = matching_ids(machines, power)
    dressed = suspect_ids(machines, power)
    branch("ours", allowed)
    branch("not_ours", len(allowed) < len(machines))
    for action in plan(machines, power, pools, settings):
        if action.kind in (CREATE_POOL, DUPLICATE):
            assert action.system_id is None
        elif action.kind == SUSPECT:
            assert action.system_id in dressed
        elif action.kind == RESET_PASSWORD:
            assert action.system_id in allowed | dressed and power[action.system_id].password == RIGHT
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
    after, power_after, pools_after = simulate(machines, power, pools, [a for a in actions if a.changes])
    again = plan(after, power_after, pools_after, settings)
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


@given(inventories())
def test_plan_does_not_depend_on_the_order_maas_lists_machines(inventory):
    machines, power, pools, settings = inventory
    assert plan(machines[::-1], power, pools[::-1], settings) == plan(machines, power, pools, settings)


@given(inventories())
def test_no_password_or_other_change_for_a_machine_not_ours_or_claimed_twice(inventory):
    machines, power, pools, settings = inventory
    ours, twice = matching_ids(machines, power), duplicate_ids(machines, power)
    for action in plan(machines, power, pools, settings):
        if action.changes and action.kind not in (CREATE_POOL, RESET_PASSWORD):
            assert action.system_id in ours and action.system_id not in twice
        if action.kind == SET_PASSWORD:
            assert power[action.system_id].password != RIGHT
            assert (action.before, action.after) == (power[action.system_id].password, "derived")


@given(inventories())
def test_fail_closed_every_derived_password_off_a_trusted_machine_is_reset(inventory):
    """A suspect or any claimant of a duplicate that holds its derived password gets the placeholder."""
    machines, power, pools, settings = inventory
    exposed = (duplicate_ids(machines, power) | suspect_ids(machines, power))
    actions = plan(machines, power, pools, settings)
    reset = sorted(a.system_id for a in actions if a.kind == RESET_PASSWORD)
    assert reset == sorted(sid for sid in exposed if power[sid].password == RIGHT)
    for action in actions:
        if action.kind == RESET_PASSWORD:
            assert (action.before, action.after) == ("derived", PLACEHOLDER)
    suspected = sorted(a.system_id for a in actions if a.kind == SUSPECT)
    assert suspected == sorted(suspect_ids(machines, power))


@given(inventories())
def test_every_duplicate_claim_is_reported_with_all_its_machines(inventory):
    machines, power, pools, settings = inventory
    twice = duplicate_ids(machines, power)
    reported = [a for a in plan(machines, power, pools, settings) if a.kind == DUPLICATE]
    named = [sid for a in reported for sid in a.after.split(",")]
    assert sorted(named) == sorted(twice) and not any(a.changes for a in reported)
    for action in reported:
        for sid in action.after.split(","):
            assert identity.parse_redfish_address(power[sid].address, DOMAIN) == (action.vm, action.namespace)


@given(inventories())
def test_every_wrong_password_is_set_and_commission_follows_it(inventory):
    machines, power, pools, settings = inventory
    single = matching_ids(machines, power) - duplicate_ids(machines, power)
    tags = {m["system_id"]: m["tag_names"] for m in machines}
    actions = plan(machines, power, pools, settings)
    set_for = [a.system_id for a in actions if a.kind == SET_PASSWORD]
    # Under maas.commission: approved, only once approved.
    assert sorted(set_for) == sorted(sid for sid in single if power[sid].password != RIGHT and (
        settings.commission != "approved" or settings.approval_tag in tags[sid]))
    for action in actions:
        if action.kind == SET_PASSWORD:
            assert action.address == identity.redfish_host(action.vm, action.namespace, DOMAIN)
    for index, action in enumerate(actions):
        if action.kind == COMMISSION and power[action.system_id].password != RIGHT:
            assert any(a.kind == SET_PASSWORD and a.system_id == action.system_id for a in actions[:index])
        if action.system_id in set_for and action.changes and action.kind != SET_PASSWORD:
            assert any(a.kind == SET_PASSWORD and a.system_id == action.system_id for a in actions[:index])


# --- machine records -------------------------------------------------------------------------

JUNK = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=5), st.lists(st.integers(), max_size=2),
                 st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


@given(st.sampled_from(sorted(GOOD_RECORD)), JUNK)
def test_a_wrong_field_makes_a_record_unusable(key, value):
    record = dict(GOOD_RECORD, **{key: value})
    valid = machine_problem(record) is None
    if valid:  # only values of the right shape pass
        assert type(value) is type(GOOD_RECORD[key]) or (key == "pool" and isinstance(value, dict))
    else:
        assert machine_problem(record) == f"unusable {key}"


def test_a_good_record_is_usable():
    assert machine_problem(GOOD_RECORD) is None
    assert machine_problem(dict(GOOD_RECORD, tag_names="a")) == "unusable tag_names"


@pytest.mark.parametrize("record, problem", [
    (["system_id", "abc123"], "not an object"),
    ("abc123", "not an object"),
    (dict(GOOD_RECORD, system_id=""), "unusable system_id"),
    ({k: v for k, v in GOOD_RECORD.items() if k != "hostname"}, "unusable hostname"),
    (dict(GOOD_RECORD, system_id=7, status="0", pool={"id": 0}), "unusable system_id, status, pool"),
])
def test_what_makes_a_record_unusable_is_named(record, problem):
    assert machine_problem(record) == problem


# --- the rules plan builds on ---------------------------------------------------------------


@pytest.mark.parametrize("machine, new", [
    ({"status_name": "New", "status": 0}, True),
    ({"status_name": "New"}, True),
    ({"status_name": "New", "status": 4}, False),     # the name and the code disagree
    ({"status_name": "Ready", "status": 0}, False),
    ({"status": 0}, True),                            # the code alone, when the name is missing
    ({"status": 1}, False),
    ({}, False),
])
def test_new_by_status_name_and_code(machine, new):
    assert is_new(machine) is new


@pytest.mark.parametrize("pool, default", [
    ({"name": "default", "id": 0}, True),
    ({"name": "default", "id": 7}, True),   # the name decides
    ({"id": 0}, True),                      # the id of MAAS's default pool, when no name is given
    ({"name": "vms", "id": 0}, False),
    ({"name": "vms", "id": 3}, False),
    ("default", True),
    ("vms", False),
    (None, False),
])
def test_in_the_default_pool_by_name_or_by_id_alone(pool, default):
    assert in_default_pool({"pool": pool}) is default


def hostname_claim(system_id: str, hostname, vm: str, namespace: str = "vms") -> tuple[dict, Match]:
    machine = {"system_id": system_id, "hostname": hostname}
    return machine, Match(machine, vm, namespace)


def test_a_machine_without_a_hostname_takes_its_name():
    machine, match = hostname_claim("m1", None, "web1")
    assert assign_hostnames([machine], [match], "skip") == (["m1"], {"m1": ("web1-vms", "")}, {})


def test_a_rename_frees_only_a_name_the_machine_holds():
    """Hostnames compare without case: "WEB2-VMS" renamed away leaves web2-vms to its holder."""
    holder = {"system_id": "other", "hostname": "web2-vms"}
    renamed, first = hostname_claim("m1", "WEB2-VMS", "web1")
    waiting, second = hostname_claim("m2", "random", "web2")
    order, renames, skipped = assign_hostnames([holder, renamed, waiting], [first, second], "skip")
    assert (order, renames) == (["m1"], {"m1": ("web1-vms", "")})
    assert skipped == {"m2": "rename: web2-vms is held by other (maas.on_hostname_taken: skip)"}


def test_a_name_freed_early_in_a_round_is_handed_out_in_the_next():
    """b renamed away frees a-vms for a, which came before it; c's rename after frees nothing wanted."""
    machines, matches = zip(hostname_claim("ma", "x1", "a"), hostname_claim("mb", "a-vms", "b"),
                            hostname_claim("mc", "x3", "c"))
    order, renames, skipped = assign_hostnames(list(machines), list(matches), "skip")
    assert (order, skipped) == (["mb", "mc", "ma"], {})
    assert renames == {"ma": ("a-vms", ""), "mb": ("b-vms", ""), "mc": ("c-vms", "")}


def test_with_both_names_held_the_skip_names_both_holders():
    machine, match = hostname_claim("m1", "random", "web1")
    fallback = identity.fallback_hostname("web1", "vms")
    taken = {"web1-vms": "dev1", fallback: "dev2"}
    assert assign_hostnames([machine], [match], "fallback", taken) == ([], {}, {
        "m1": f"rename: web1-vms is held by dev1 and the fallback {fallback} by dev2"})


@pytest.mark.parametrize("mode", ["skip", "fallback"])
def test_a_name_handed_out_is_held_by_its_new_owner(mode):
    """a-b.c and a.b-c share the primary name a-b-c: the second is told who took it."""
    first_machine, first = hostname_claim("m1", "one", "a-b", "c")
    second_machine, second = hostname_claim("m2", "two", "a", "b-c")
    order, renames, skipped = assign_hostnames([first_machine, second_machine], [first, second], mode)
    fallback = identity.fallback_hostname("a", "b-c")
    if mode == "skip":
        assert (order, renames) == (["m1"], {"m1": ("a-b-c", "")})
        assert skipped == {"m2": "rename: a-b-c is held by m1 (maas.on_hostname_taken: skip)"}
    else:
        assert (order, skipped) == (["m1", "m2"], {})
        assert renames["m2"] == (fallback, "a-b-c is held by m1: using the fallback name")


def plan_machine(system_id: str, pool: str = "default", status: str = "Deployed") -> dict:
    return {"system_id": system_id, "hostname": system_id, "power_type": "redfish", "status_name": status,
            "status": STATUS_CODE[status], "pool": {"name": pool, "id": 0 if pool == "default" else 9,
                                                    "description": pool_description(pool)},
            "tag_names": []}


def test_a_pool_a_machine_is_in_exists_without_the_pool_list():
    machines = [plan_machine("m1", pool="vms"), plan_machine("m2")]
    power = {"m1": f"web1.vms.{DOMAIN}",
             "m2": f"web2.vms.{DOMAIN}"}
    kinds = [a.kind for a in plan(machines, power, [], Settings(domain=DOMAIN))]
    assert MOVE_POOL in kinds and CREATE_POOL not in kinds


def test_duplicate_claims_are_reported_by_namespace_then_vm():
    claims = [("z", "alpha"), ("a", "beta"), ("b", "alpha")]
    machines, power = [], {}
    for index, (vm, namespace) in enumerate(claims * 2):
        machines.append(plan_machine(f"m{index}"))
        power[f"m{index}"] = f"{vm}.{namespace}.{DOMAIN}"
    reported = [(a.namespace, a.vm) for a in plan(machines, power, [], Settings(domain=DOMAIN))
                if a.kind == DUPLICATE]
    assert reported == [("alpha", "b"), ("alpha", "z"), ("beta", "a")]


@pytest.mark.parametrize("commission", ["auto", "approved", "never"])
def test_what_is_left_alone_is_said_with_the_value_it_keeps(commission):
    """Skips keep before == after (the rename, the operator's pool, the wait to commission)."""
    held = dict(plan_machine("m1", pool="ops", status="New"), hostname="random", tag_names=["kubevirt-approved"])
    untagged = dict(plan_machine("m2", pool="vms", status="New"), hostname="web2-vms")
    power = {"m1": Power(f"web1.vms.{DOMAIN}", RIGHT, user=RIGHT),
             "m2": Power(f"web2.vms.{DOMAIN}", RIGHT, user=RIGHT)}
    settings = Settings(domain=DOMAIN, commission=commission, on_hostname_taken="skip")
    first = dict(system_id="m1", hostname="random", vm="web1", namespace="vms")
    second = dict(system_id="m2", hostname="web2-vms", vm="web2", namespace="vms")
    commissions = {
        "auto": [Action(COMMISSION, before="New", after="Commissioning", **first),
                 Action(COMMISSION, before="New", after="Commissioning", **second)],
        "approved": [Action(COMMISSION, before="New", after="Commissioning", note="tagged kubevirt-approved", **first),
                     Action(SKIP, before="New", after="New", note="commission: waiting for the tag kubevirt-approved",
                            **second)],
        "never": [Action(SKIP, before="New", after="New", note="commission: maas.commission is never", **first),
                  Action(SKIP, before="New", after="New", note="commission: maas.commission is never", **second)],
    }[commission]
    assert plan([held, untagged], power, ["ops", "vms"], settings, {"web1-vms": "dev1"}) == [
        Action(SKIP, before="random", after="random",
               note="rename: web1-vms is held by dev1 (maas.on_hostname_taken: skip)", **first),
        Action(SKIP, before="ops", after="ops", note="pool: in 'ops', filed by an operator: left there", **first),
        *commissions,
    ]


def test_a_machine_new_by_its_status_code_alone_is_commissioned_from_new():
    machine = {k: v for k, v in plan_machine("m1", status="New").items() if k != "status_name"}
    power = {"m1": Power(f"web1.vms.{DOMAIN}", RIGHT, user=RIGHT)}
    (commission,) = [a for a in plan([machine], power, [], Settings(domain=DOMAIN)) if a.kind == COMMISSION]
    assert (commission.before, commission.after) == ("New", "Commissioning")


# --- whole cycles against the MAAS double -----------------------------------------------------


def filed_identity(machine) -> tuple[str, str] | None:
    """Oracle: (vm, ns) when the machine is named <vm>-<ns>, lower case, in the pool <ns>."""
    pool, hostname = machine["pool"]["name"], machine["hostname"]
    vm = hostname[: -len(pool) - 1] if hostname.endswith("-" + pool) else ""
    if pool in NAMESPACES and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", vm):
        return vm, pool
    return None


def populate_double(double, machines, power):
    """The inventory as MAAS machines; each password state becomes a stored power_pass."""
    ids = {}
    for machine in machines:
        sid, params = machine["system_id"], power.get(machine["system_id"])
        address = params.address if params else None
        parsed = (identity.parse_redfish_address(address, DOMAIN)
                  or identity.suspect_identity(address, DOMAIN)) if params else None
        stored = {RIGHT: identity.bmc_password(SEED, identity.format_serial(*parsed)) if parsed else "pw-S3CRET-x",
                  PLACEHOLDER: identity.PLACEHOLDER_PASSWORD, "unset": "",
                  "other": f"pw-{sid}-S3CRET"}[params.password] if params else "pw-S3CRET-none"
        power_type = machine["power_type"] or "manual"
        ids[sid] = double.add_machine(
            machine["hostname"], power_type=power_type, power_address=address or "",
            power_pass=stored, status=machine["status_name"], pool=machine["pool"]["name"],
            tag_names=machine["tag_names"], system_id=sid,
        )
        if params is None:
            double.power[sid] = {}
        elif power_type == "redfish":
            double.power[sid]["power_pass"] = stored
    return ids


@pytest.mark.filterwarnings("ignore")
@hypothesis_settings(max_examples=25, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(inventories(), st.booleans())
def test_cycles_never_set_a_password_they_should_not_and_never_print_one(tmp_path_factory, inventory, echo):
    machines, power, pools, settings = inventory
    tmp_path = tmp_path_factory.mktemp("cycle")
    saved, maas.RETRY = maas.RETRY, RetryPolicy(attempts=1)
    try:
        run_cycles(tmp_path, inventory, echo)
    finally:
        maas.RETRY = saved


def run_cycles(tmp_path, inventory, echo):
    machines, power, pools, settings = inventory
    with MaasDouble() as double:
        populate_double(double, machines, power)
        for name in pools:
            if name not in double.pools:
                double.add_pool(name)
        values = write_values(tmp_path, double, commission=settings.commission,
                              on_hostname_taken=settings.on_hostname_taken)
        redfish = {sid for sid, m in double.machines.items() if m["power_type"] == "redfish"}
        ours = {sid for sid in redfish if identity.parse_redfish_address(double.power[sid].get("power_address"), DOMAIN)}
        dressed = {sid: claimed for sid in redfish
                   if (claimed := identity.suspect_identity(double.power[sid].get("power_address"), DOMAIN))}
        claims = Counter(identity.parse_redfish_address(double.power[sid]["power_address"], DOMAIN)
                         for sid in ours)
        twice = {sid for sid in ours
                 if claims[identity.parse_redfish_address(double.power[sid]["power_address"], DOMAIN)] > 1}
        # Another power type still holding a VM's derived user or password: MAAS kept them across a
        # switch of type, so they are taken back (every --once is a full resync, which reads every
        # machine of every type). The identities judged are the one its name and pool say it was
        # filed as and the one its address names (as a suspect too): the only ones whose derived
        # values the inventory stores.
        switched: dict[str, tuple[set[str], set[str]]] = {}
        for machine in machines:
            sid, filed = machine["system_id"], filed_identity(machine)
            stored = double.power[sid]
            if machine["power_type"] == "redfish":
                continue
            address = stored.get("power_address")
            named = identity.parse_redfish_address(address, DOMAIN) or identity.suspect_identity(address, DOMAIN)
            serials = {identity.format_serial(*who) for who in (filed, named) if who}
            passwords = {identity.bmc_password(SEED, serial) for serial in serials}
            users = {identity.bmc_user(SEED, serial) for serial in serials}
            # Only under a name the type has: MAAS keeps no other across a switch (a manual machine
            # has none), and refuses a PUT naming one (the double's POWER_SETTINGS).
            names = POWER_SETTINGS.get(machine["power_type"], {})
            if any(value in passwords | users for name, value in stored.items() if isinstance(value, str)
                   and name in names):
                switched[sid] = (passwords, users)
        foreign = {sid for sid in double.machines if sid not in ours and sid not in dressed and sid not in switched}
        exposed = twice | set(dressed)
        before = copy.deepcopy({sid: double.power[sid] for sid in foreign | exposed})
        before_switched = copy.deepcopy({sid: double.power[sid] for sid in switched})
        if echo:  # a MAAS that repeats the request in its error: the password must not get out
            double.inject("echo", method="PUT", count=3)
        outputs = []
        capture = _Capture()
        for command in (["reconcile", "--dry-run"], ["reconcile", "--once"], ["reconcile", "--once"],
                        ["status"]):
            with capture:
                cli.main(["--values", str(values), *command])
            outputs.append(capture.text)
        audit_log = (tmp_path / "audit.log").read_text() if (tmp_path / "audit.log").exists() else ""
        # Machines that name no VM are never touched.
        assert {sid: double.power[sid] for sid in foreign} == {sid: before[sid] for sid in foreign}
        assert not {w[1] for w in double.writes} & foreign
        # A suspect or a duplicate claimant ends without its derived password, and is given nothing else.
        for sid in exposed:
            vm, namespace = dressed.get(sid) or identity.parse_redfish_address(before[sid]["power_address"], DOMAIN)
            held = (before[sid].get("power_pass") == derived(vm, namespace)
                    or before[sid].get("power_user") == identity.bmc_user(SEED, f"{vm}.{namespace}"))
            # Taken back whole: the placeholder and a reset user, no VM's (claimants of one address
            # may share a row, which then holds the last one reset's).
            resets = {identity.reset_user(SEED, other) for other in exposed}
            after = dict(double.power[sid])
            if echo and held and after == before[sid]:
                continue  # the reset PUTs were refused (echo): tried again next cycle
            if held:
                assert after.pop("power_user") in resets
                assert after == {k: v for k, v in before[sid].items() if k != "power_user"} | {
                    "power_pass": identity.PLACEHOLDER_PASSWORD}
            else:
                assert after == before[sid]
        for sid, (passwords, users) in switched.items():
            after, was = dict(double.power[sid]), before_switched[sid]
            if echo and after == was:
                continue  # the reset PUTs were refused (echo): tried again next cycle
            # Each parameter holding one is overwritten, under the type's own names.
            expected = {name: value if not isinstance(value, str) else identity.PLACEHOLDER_PASSWORD
                        if value in passwords else identity.reset_user(SEED, sid) if value in users else value
                        for name, value in was.items()}
            assert after == expected
        for method, sid, fields in double.writes:
            if sid in switched:
                assert method == "PUT" and fields.get("power_type", "") != "redfish"
                assert {name for name in fields if name != "power_type"} <= {
                    f"power_parameters_{name}" for name in before_switched[sid]}
            if sid in exposed:
                assert (method, set(fields)) == ("PUT", {"power_type", "power_parameters_power_user",
                                                         "power_parameters_power_pass"})
                assert fields["power_type"] == "redfish"
        assert_no_secrets(double, *outputs, audit_log)


class _Capture:
    """stdout and stderr of one CLI call, as text (hypothesis cannot use capsys per example)."""

    def __enter__(self):
        import io

        self._saved = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = self._buffer = io.StringIO()
        return self

    def __exit__(self, *exc):
        sys.stdout, sys.stderr = self._saved
        self.text = self._buffer.getvalue()


# --- a VM's credential generation: the audit log's highest against the rotations ConfigMap -------

WEB1, WEB2 = ("web1", "vms"), ("web2", "vms")
# What restore counts as a generation used: a password set (or maybe set), a rotation done.
COUNTED = {(SET_PASSWORD, "ok"), (SET_PASSWORD, "unknown"), (ROTATE, "ok")}
_audited = st.lists(st.tuples(st.sampled_from([(SET_PASSWORD, "ok"), (SET_PASSWORD, "unknown"), (ROTATE, "ok"),
                                               (SET_PASSWORD, "failed"), (ROTATE, "failed")]),
                              st.integers(0, 12)), max_size=6)


class _SaidRotations:
    """The rotations ConfigMap as Reconciler.read_generations reads it (a VM at 0 has no key)."""

    def __init__(self, generations: dict[tuple[str, str], int]):
        self.generations = {who: g for who, g in generations.items() if g}

    def read(self) -> dict[tuple[str, str], int]:
        return dict(self.generations)


def _audit_records(vm: tuple[str, str], audited: list) -> list[dict]:
    """The audit records apply.py and rotate write for these (kind, outcome) and generations, as read back."""
    import json

    log, serial, records = Audit(), identity.format_serial(*vm), []
    for (kind, outcome), generation in audited:
        if kind == SET_PASSWORD:
            record = log.write(SET_PASSWORD, "abc123", f"{vm[0]}-{vm[1]}", "wrong", "derived", outcome,
                               identity=serial, generation=generation)
        else:
            record = log.write(ROTATE, "abc123", None, str(max(generation - 1, 0)), str(generation), outcome,
                               identity=serial)
        records.append(json.loads(json.dumps(record)))
    return records


@example(audited=[((SET_PASSWORD, "ok"), 3), ((SET_PASSWORD, "ok"), 1)], said=2, other=0)
@example(audited=[((ROTATE, "ok"), 5), ((SET_PASSWORD, "unknown"), 4)], said=1, other=9)
@example(audited=[((SET_PASSWORD, "ok"), 3)], said=1, other=0)
@example(audited=[((SET_PASSWORD, "ok"), 2)], said=0, other=0)
@example(audited=[((SET_PASSWORD, "ok"), 1)], said=4, other=7)
@given(audited=_audited, said=st.integers(0, 12), other=st.integers(0, 12))
def test_the_generation_derived_is_the_higher_of_the_configmap_and_the_audit_log(audited, said, other):
    """A ConfigMap generation below the highest the audit log records for the VM never wins: the
    reconciler judges and derives at the highest (and notes the lower one); a higher one is followed."""
    records = _audit_records(WEB1, audited) + _audit_records(WEB2, [((SET_PASSWORD, "ok"), other)])
    reconciler = Reconciler(None, Settings(domain=DOMAIN, commission="never"), Audit(), passwords=Passwords(SEED))
    reconciler.rotator = _SaidRotations({WEB1: said, WEB2: other})
    with _Capture():
        reconciler.restore(records)
        reconciler.read_generations()
    highest = max((g for kind, g in audited if kind in COUNTED), default=0)
    assert reconciler.passwords.generation(*WEB1) == max(highest, said)
    assert reconciler.passwords.password(*WEB1) == identity.bmc_password(SEED, "web1.vms", max(highest, said))
    assert reconciler.passwords.user(*WEB1) == identity.bmc_user(SEED, "web1.vms", max(highest, said))
    assert reconciler.lowered.get(WEB1) == (said if said < highest else None)
    assert reconciler.passwords.generation(*WEB2) == other and WEB2 not in reconciler.lowered
