"""A derived credential stays the VM's whatever MAAS's anonymous enlistment does to the machine's
power type (issue 29 items 1 to 3), on the MAAS double: BMC enlistment (ipmi at the VM's own
address, no MAC) and MAC enlistment (ipmi or webhook at an attacker's host) keep power_user and
power_pass; the reconciler takes them back the cycle it sees the switch, through the new type's
own parameter names, even while the cluster cannot be read, and never derives a generation below
one it already used. The same attacks on MAAS's own region: tests/test_real_maas.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from maas_double import MaasDouble  # noqa: E402
from reconcile_helpers import SEED  # noqa: E402
from test_reconcile_security import Clock, double, fast_retries  # noqa: E402,F401  (fixtures)
from test_rotation import (DOMAIN, MAC, PLACEHOLDER, Rotations, password, re_point, reconciler_for,  # noqa: E402
                           records, user)

from maas_kubevirt import identity  # noqa: E402
from maas_kubevirt.reconcile import (RESET_PASSWORD, SET_PASSWORD, SKIP, Passwords, Power,  # noqa: E402
                                     Settings, plan)
from maas_kubevirt.reconcile.apply import _fields, _reset_fields  # noqa: E402

HOST = identity.redfish_host("web1", "vms", DOMAIN)
ATTACKER = "10.66.66.66"
HOOK = "https://hooks.attacker.example/power"

# The three switches of issue 29 item 1: what an anonymous POST machines/ sends, and whether it
# names the VM's MAC (BMC enlistment needs none: the VM's address is public).
SWITCHES = {
    "ipmi-own-address": ("ipmi", {"power_address": HOST}, False),
    "ipmi-by-mac": ("ipmi", {"power_address": ATTACKER}, True),
    "webhook-by-mac": ("webhook", {"power_on_uri": HOOK + "/on", "power_off_uri": HOOK + "/off",
                                   "power_query_uri": HOOK + "/query"}, True),
}


def switch(double: MaasDouble, name: str) -> None:
    power_type, params, by_mac = SWITCHES[name]
    fields = {"architecture": "amd64/generic", "power_type": power_type, "power_parameters": json.dumps(params)}
    if by_mac:
        fields["mac_addresses"] = [MAC]
    code, body = double.anonymous_enlist(fields)
    assert code == 200, body


def holders(double: MaasDouble, *secrets: str) -> dict[str, set[str]]:
    """system_id -> the names of its power parameters holding any of these values."""
    found: dict[str, set[str]] = {}
    for system_id in double.machines:
        names = {name for name, value in double.power[system_id].items() if isinstance(value, str) and value in secrets}
        if names:
            found[system_id] = names
    return found


@pytest.mark.parametrize("status", ["New", "Commissioning"])
@pytest.mark.parametrize("name", sorted(SWITCHES))
def test_a_power_type_switch_loses_the_derived_credentials_in_one_cycle_and_is_rotated(double, tmp_path, name,
                                                                                      status):
    rotations = Rotations()
    sid = double.add_vm("web1", "vms", status=status, mac_addresses=[MAC])
    other = double.add_vm("web2", "vms", status=status)
    reconciler = reconciler_for(double, tmp_path, rotations, Clock())
    reconciler.cycle()
    secrets = (password("web1", "vms"), user("web1", "vms"))
    assert holders(double, *secrets) == {sid: {"power_pass", "power_user"}}
    switch(double, name)
    power_type = SWITCHES[name][0]
    assert double.machines[sid]["power_type"] == power_type
    assert holders(double, *secrets) == {sid: {"power_pass", "power_user"}}   # MAAS kept them
    reconciler.cycle()
    assert holders(double, *secrets) == {}
    # Left where the enlistment put it (as a MAC re-point's address is), with nothing of the VM's.
    assert double.machines[sid]["power_type"] == power_type
    assert double.power[sid]["power_pass"] == PLACEHOLDER
    assert double.power[sid]["power_user"].startswith(identity.RESET_USER_PREFIX)
    (reset,) = records(tmp_path, "reset-password")
    assert (reset["system_id"], reset["outcome"], reset["leak"], reset["identity"]) == (sid, "ok", True, "web1.vms")
    assert f"power type switched to {power_type!r}" in reset["note"]
    assert rotations.bumps == [("web1", "vms")]
    assert double.power[other]["power_pass"] == password("web2", "vms")
    # Two more cycles: nothing is given back to the switched machine.
    reconciler.cycle()
    reconciler.cycle()
    assert holders(double, *secrets, password("web1", "vms", 1), user("web1", "vms", 1)) == {}
    assert len(records(tmp_path, "reset-password")) == 1


@pytest.mark.parametrize("name", sorted(SWITCHES))
def test_a_restarted_reconciler_takes_back_what_a_switch_kept_while_it_was_down(double, tmp_path, name):
    sid = double.add_vm("web1", "vms", status="New", mac_addresses=[MAC])
    reconciler_for(double, tmp_path, None, Clock()).cycle()
    switch(double, name)
    restarted = reconciler_for(double, tmp_path, None, Clock())
    restarted.restore(records(tmp_path))
    restarted.cycle()
    assert holders(double, password("web1", "vms"), user("web1", "vms")) == {}
    assert list(restarted.needing_rotation()) == [("web1", "vms")]
    assert sid in {r["system_id"] for r in records(tmp_path, "reset-password")}


def test_another_hosts_reconciler_knows_a_switched_machine_by_its_name_and_pool(double, tmp_path):
    """No audit record of it (a new lease holder): the name <vm>-<ns> in the pool <ns> is the hint."""
    sid = double.add_vm("web1", "vms", status="New", mac_addresses=[MAC])
    reconciler_for(double, tmp_path, None, Clock()).cycle()
    assert (double.machines[sid]["hostname"], double.machines[sid]["pool"]["name"]) == ("web1-vms", "vms")
    switch(double, "webhook-by-mac")
    (tmp_path / "elsewhere").mkdir()
    elsewhere = reconciler_for(double, tmp_path / "elsewhere", None, Clock())
    elsewhere.cycle()
    assert holders(double, password("web1", "vms"), user("web1", "vms")) == {}


def test_resets_do_not_wait_for_an_unreadable_cluster_but_new_passwords_do(double, tmp_path, capsys):
    rotations = Rotations()
    sid = double.add_vm("web1", "vms", status="New", mac_addresses=[MAC])
    reconciler = reconciler_for(double, tmp_path, rotations, Clock())
    reconciler.cycle()
    rotations.fail = "GET configmaps/maas-kubevirt-rotations: connection refused"
    re_point(double)
    late = double.add_vm("web2", "vms", status="New")
    reconciler.log.request_resync("test: see web2, which an administrator added (no event)")
    result = reconciler.cycle()
    assert double.power[sid]["power_pass"] == PLACEHOLDER        # taken back at once
    assert double.power[late]["power_pass"] == PLACEHOLDER       # not derived while unreadable
    assert result.failed and "cannot be read from the cluster" in result.withheld
    assert any(a.kind == SKIP and a.system_id == late and "not derived while" in a.note for a in result.actions)
    assert rotations.bumps == [] and list(reconciler.needing_rotation()) == [("web1", "vms")]
    err = capsys.readouterr().err
    assert err.count("credentials are still taken back") == 1 and "connection refused" in err
    reconciler.cycle()
    assert "credentials are still taken back" not in capsys.readouterr().err   # said once
    rotations.fail = ""
    reconciler.cycle()
    assert rotations.bumps == [("web1", "vms")]
    assert double.power[late]["power_pass"] == password("web2", "vms")
    assert "can be read from the cluster again" in capsys.readouterr().err


def test_a_restart_while_the_cluster_is_unreadable_judges_with_the_generations_it_audited(double, tmp_path):
    """Generation 2 was set before the restart: a MAC re-point of its password is still recognised."""
    rotations = Rotations()
    rotations.generations[("web1", "vms")] = 2
    sid = double.add_vm("web1", "vms", status="New", mac_addresses=[MAC])
    reconciler_for(double, tmp_path, rotations, Clock()).cycle()
    assert double.power[sid]["power_pass"] == password("web1", "vms", 2)
    (done,) = records(tmp_path, SET_PASSWORD)
    assert done["generation"] == 2
    re_point(double)
    rotations.fail = "no answer"
    restarted = reconciler_for(double, tmp_path, rotations, Clock())
    restarted.restore(records(tmp_path))
    restarted.cycle()
    assert double.power[sid]["power_pass"] == PLACEHOLDER


def test_a_generation_lowered_in_the_cluster_is_never_derived(double, tmp_path, capsys):
    """The ConfigMap deleted and applied again empty: generation 0 would bring rotated-away credentials back."""
    rotations = Rotations()
    rotations.generations[("web1", "vms")] = 3
    sid = double.add_vm("web1", "vms", status="New", mac_addresses=[MAC])
    reconciler_for(double, tmp_path, rotations, Clock()).cycle()
    rotations.generations.clear()
    double.power[sid]["power_pass"] = PLACEHOLDER        # the VM enlisted again meanwhile
    restarted = reconciler_for(double, tmp_path, rotations, Clock())
    restarted.restore(records(tmp_path))
    result = restarted.cycle()
    assert double.power[sid]["power_pass"] == PLACEHOLDER
    assert password("web1", "vms", 0) not in double.power[sid].values()
    (skip,) = [a for a in result.actions if a.kind == SKIP and a.system_id == sid and "generation" in a.note]
    assert "says credential generation 0, below generation 3" in skip.note
    err = capsys.readouterr().err
    fix = """kubectl -n <system namespace> patch configmap maas-kubevirt-rotations --type merge -p '{"data":{"web1.vms":"3"}}'"""
    assert err.count("this reconciler already used") == 1 and fix in err
    assert restarted.lowered == {("web1", "vms"): 0}
    rotations.generations[("web1", "vms")] = 3           # put back as the warning says
    restarted.cycle()
    assert double.power[sid]["power_pass"] == password("web1", "vms", 3) and restarted.lowered == {}


def test_every_password_put_says_redfish_and_undoes_a_switch_landing_after_the_re_read(double, tmp_path):
    """A BMC enlistment between the re-read and the PUT: the PUT makes the machine redfish at the
    canonical address again, so the password never joins an ipmi row."""
    sid = double.add_vm("web1", "vms", status="New", mac_addresses=[MAC])
    passwords = Passwords(SEED)
    settings = Settings(domain=DOMAIN, commission="never")
    power = {sid: passwords.judge(double.power[sid], DOMAIN)}
    actions = plan([double.machines[sid]], power, [], settings)
    (setter,) = [a for a in actions if a.kind == SET_PASSWORD]
    assert _fields(setter, passwords)["power_type"] == "redfish"
    switch(double, "ipmi-own-address")
    assert double.machines[sid]["power_type"] == "ipmi"
    reconciler = reconciler_for(double, tmp_path, None, Clock())
    reconciler.client.update_machine(sid, **_fields(setter, passwords))
    assert double.machines[sid]["power_type"] == "redfish"
    assert double.power[sid]["power_address"] == HOST


def test_a_switch_seen_by_the_re_read_leaves_the_machine_alone_that_cycle(double, tmp_path):
    """The re-read before a change compares the parameter names, which follow the power type."""
    sid = double.add_vm("web1", "vms", status="New", mac_addresses=[MAC])
    reconciler = reconciler_for(double, tmp_path, None, Clock())
    machines, power, matches = reconciler.observe(everything=True)
    switch(double, "ipmi-own-address")
    actions = reconciler.plan_for(machines, power, matches)
    assert not any(a.kind == SET_PASSWORD for a in actions)
    assert any(a.kind == SKIP and a.system_id == sid and "power type changed since it was read" in a.note
               for a in actions)


def test_a_redfish_reset_replaces_the_derived_user_and_keeps_the_address(double, tmp_path):
    sid = double.add_vm("web1", "vms", status="New", mac_addresses=[MAC])
    reconciler = reconciler_for(double, tmp_path, None, Clock())
    reconciler.cycle()
    re_point(double, "moved.attacker.example")
    reconciler.cycle()
    assert double.machines[sid]["power_type"] == "redfish"
    assert double.power[sid]["power_address"] == "moved.attacker.example"
    assert double.power[sid]["power_pass"] == PLACEHOLDER
    assert holders(double, password("web1", "vms"), user("web1", "vms")) == {}


def test_the_reset_goes_through_the_names_that_hold_the_credentials():
    """A webhook row holding the derived password under power_token too: both names are overwritten."""
    passwords = Passwords(SEED)
    parameters = {"power_query_uri": HOOK, "power_user": user("web1", "vms"),
                  "power_pass": password("web1", "vms"), "power_token": password("web1", "vms")}
    judged = passwords.judge(parameters, DOMAIN, ("web1", "vms"))
    assert judged.held == ("web1", "vms")
    assert set(judged.derived) == {("power_pass", "password"), ("power_token", "password"), ("power_user", "user")}
    machine = {"system_id": "abc123", "hostname": "web1-vms", "power_type": "webhook", "status_name": "New",
               "status": 0, "pool": {"name": "vms"}, "tag_names": []}
    (reset,) = [a for a in plan([machine], {"abc123": judged}, [], Settings(domain=DOMAIN)) if a.kind == RESET_PASSWORD]
    fields = _reset_fields(reset, passwords)
    assert set(fields) == {"power_parameters_power_pass", "power_parameters_power_token", "power_parameters_power_user"}
    assert fields["power_parameters_power_pass"] == fields["power_parameters_power_token"] == PLACEHOLDER
    assert fields["power_parameters_power_user"] == identity.reset_user(SEED, "abc123")
    assert "power_type" not in fields   # its own type stays: no 400 for names another type lacks


def test_a_machine_of_another_type_holding_nothing_of_ours_is_left_alone(double, tmp_path):
    admin = double.add_machine("bare1", power_type="ipmi", power_address="10.0.0.9", power_user="admin",
                               power_pass="not-ours")
    reconciler = reconciler_for(double, tmp_path, None, Clock())
    reconciler.cycle()
    assert double.power[admin]["power_pass"] == "not-ours" and records(tmp_path, "reset-password") == []


def test_a_judged_power_names_no_secret():
    judged = Passwords(SEED).judge({"power_address": HOST, "power_user": user("web1", "vms"),
                                    "power_pass": password("web1", "vms"), "node_id": "1"}, DOMAIN)
    assert isinstance(judged, Power)
    assert password("web1", "vms") not in repr(judged) and user("web1", "vms") not in repr(judged)


def test_a_cycle_that_could_derive_nothing_counts_as_failed_in_the_metrics(double, tmp_path):
    """last_success_timestamp_seconds stops advancing while the cluster is unreadable, so it alerts."""
    from maas_kubevirt.loop import cycle_outcome

    rotations = Rotations()
    double.add_vm("web1", "vms", status="New")
    reconciler = reconciler_for(double, tmp_path, rotations, Clock())
    assert cycle_outcome(reconciler.cycle(), stopped=False) == "ok"
    rotations.fail = "no answer"
    assert cycle_outcome(reconciler.cycle(), stopped=False) == "failed"
