"""The reconciler: the pure plan, apply with audit records, the CLI entry points, the loop."""

from __future__ import annotations

import dataclasses

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))

from maas_double import MaasDouble, populate  # noqa: E402
from reconcile_helpers import (  # noqa: E402
    DOMAIN,
    SEED,
    credentials,
    derived_user,
    owned,
    Args,
    GOOD_RECORD,
    RecordingAudit,
    derived,
    write_seed,
    add_noise,
    assert_no_secrets,
    audit_records,
    converged,
    values_for,
    write_values,
)

from maas_kubevirt import cli, console, identity, loop, maas, reconcile, status  # noqa: E402
from maas_kubevirt.maas import MAASClient, MAASError, RetryPolicy, Signer  # noqa: E402
from maas_kubevirt.reconcile import (  # noqa: E402
    pool_description,
    COMMISSION,
    CREATE_POOL,
    MOVE_POOL,
    RENAME,
    DUPLICATE,
    PLACEHOLDER,
    RESET_PASSWORD,
    SUSPECT,
    RIGHT,
    SET_PASSWORD,
    SKIP,
    Action,
    Audit,
    Passwords,
    Power,
    Reconciler,
    Settings,
    plan,
)
from maas_kubevirt.values import ValuesError, load_values  # noqa: E402

# Wall-clock bounds: run after the parallel workers, with the machine to itself (tests/conftest.py).
pytestmark = pytest.mark.timing

SETTINGS = Settings(domain=DOMAIN)
PASSWORDS = Passwords(SEED)


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch):
    monkeypatch.setattr(maas, "RETRY", RetryPolicy(attempts=3, backoff=0.01, max_backoff=0.05,
                                                         max_retry_after=0.05))
    monkeypatch.delenv("MAAS_API_KEY", raising=False)
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)


@pytest.fixture
def double():
    with MaasDouble() as running:
        yield running


def machine(sid, hostname, *, power_type="redfish", status="New", pool="default", pool_id=None, tags=()):
    return {
        "system_id": sid, "hostname": hostname, "power_type": power_type, "status_name": status,
        "status": {"New": 0, "Commissioning": 1, "Ready": 4, "Deployed": 6}.get(status, 8),
        "pool": {"name": pool, "id": 0 if pool == "default" else (pool_id or 7)}, "tag_names": list(tags),
    }


def addr(vm, ns, domain=DOMAIN, password=RIGHT):
    """A machine's power facts: its address and (by default) the right password."""
    return Power(f"{vm}.{ns}.{domain}", password, user=RIGHT)


def kinds(actions, sid=None):
    return [a.kind for a in actions if sid is None or a.system_id == sid]


# --- the plan --------------------------------------------------------------------------------


def test_plan_for_a_new_vm():
    machines = [machine("aaa", "lucky-cat")]
    actions = plan(machines, {"aaa": addr("web1", "vms")}, ["default"], SETTINGS)
    assert actions == [
        Action(CREATE_POOL, None, None, namespace="vms", before=None, after="vms"),
        Action(RENAME, "aaa", "lucky-cat", "web1", "vms", "lucky-cat", "web1-vms"),
        Action(MOVE_POOL, "aaa", "lucky-cat", "web1", "vms", "default", "vms"),
        Action(COMMISSION, "aaa", "lucky-cat", "web1", "vms", "New", "Commissioning"),
    ]


def test_plan_accepts_power_parameter_mappings_and_existing_pools():
    machines = [machine("aaa", "lucky-cat")]
    actions = plan(machines, {"aaa": {"power_address": addr("web1", "vms").address}},
                   [{**owned("vms"), "id": 3}], SETTINGS)
    assert kinds(actions) == [SET_PASSWORD, RENAME, MOVE_POOL, COMMISSION]


def test_plan_ignores_everything_not_ours():
    machines = [
        machine("ipmi", "p1", power_type="ipmi"),
        machine("look", "p2"),
        machine("look2", "p3"),
        machine("short", "p4"),
        machine("virsh", "p5", power_type="virsh"),
        machine("nopower", "p6"),
        machine("badname", "p7"),
    ]
    power = {
        "ipmi": addr("web1", "vms"),
        "look": "https://web1.vms.bmc.example.com.evil.io/redfish/v1/Systems/1",
        "look2": "https://web1.vms.notbmc.example.com",
        "short": "https://vms.bmc.example.com",
        "virsh": addr("web1", "vms"),
        "badname": "https://Web_1.vms.bmc.example.com",
    }
    # Only the look-alike that still names web1.vms is worth a word (a suspect); nothing changes.
    assert [(a.kind, a.system_id, a.vm, a.namespace) for a in plan(machines, power, ["default"], SETTINGS)] == [
        (SUSPECT, "look", "web1", "vms")]


def test_address_forms_that_match():
    for address in ("web1.vms.bmc.example.com", "WEB1.vms.BMC.example.com"):
        power = {"aaa": Power(address, RIGHT, user=RIGHT)}
        actions = plan([machine("aaa", "web1-vms", pool="vms", status="Ready")], power, [], SETTINGS)
        assert actions == []  # already converged, and matched (no error)
        actions = plan([machine("aaa", "x")], power, [owned("vms")], SETTINGS)
        assert kinds(actions) == [RENAME, MOVE_POOL, COMMISSION], address
        # A bare address says nothing of the password: it is set first, with the canonical address.
        actions = plan([machine("aaa", "x")], {"aaa": address}, [owned("vms")], SETTINGS)
        assert kinds(actions) == [SET_PASSWORD, RENAME, MOVE_POOL, COMMISSION], address
        assert actions[0].address == "web1.vms.bmc.example.com"


@pytest.mark.parametrize("address", ["http://WEB1.vms.BMC.example.com:8443/redfish/v1/Systems/1",
                                     "https://web1.vms.bmc.example.com.", "web1.vms.bmc.example.com:31234"])
def test_look_alike_addresses_get_nothing_and_lose_a_derived_password(address):
    """A suspect is reported; holding the derived password, it gets the placeholder back; nothing else."""
    actions = plan([machine("aaa", "x")], {"aaa": Power(address, PLACEHOLDER)}, [owned("vms")], SETTINGS)
    assert kinds(actions) == [SUSPECT]
    actions = plan([machine("aaa", "x")], {"aaa": Power(address, RIGHT, user=RIGHT)}, [owned("vms")], SETTINGS)
    assert kinds(actions) == [SUSPECT, RESET_PASSWORD]
    assert (actions[1].before, actions[1].after) == (reconcile.DERIVED, PLACEHOLDER)


def test_converged_machine_needs_nothing():
    machines = [machine("aaa", "web1-vms", status="Deployed", pool="vms")]
    assert plan(machines, {"aaa": addr("web1", "vms")}, [owned("vms")], SETTINGS) == []


def test_vm_name_with_dots():
    actions = plan([machine("aaa", "x", status="Ready", pool="vms")], {"aaa": addr("db.primary", "vms")},
                   [], SETTINGS)
    assert [(a.kind, a.after) for a in actions] == [(RENAME, "db-primary-vms")]


def test_long_names_use_the_hashed_form():
    vm = "v" * 60
    actions = plan([machine("aaa", "x", status="Ready", pool="vms")], {"aaa": addr(vm, "vms")}, [], SETTINGS)
    assert actions[0].after == identity.fallback_hostname(vm, "vms")
    assert len(actions[0].after) <= 63


def test_held_hostname_uses_fallback_and_says_so():
    machines = [machine("other", "web1-vms", power_type="ipmi", status="Deployed"),
                machine("aaa", "lucky-cat", status="Ready", pool="vms")]
    (action,) = plan(machines, {"aaa": addr("web1", "vms")}, [], SETTINGS)
    assert action.kind == RENAME
    assert action.after == identity.fallback_hostname("web1", "vms")
    assert "web1-vms is held by other" in action.note and "fallback" in action.note


def test_held_hostname_skip_mode():
    machines = [machine("other", "web1-vms", power_type="ipmi", status="Deployed"),
                machine("aaa", "lucky-cat", status="Ready", pool="vms")]
    settings = Settings(domain=DOMAIN, on_hostname_taken="skip")
    (action,) = plan(machines, {"aaa": addr("web1", "vms")}, [], settings)
    assert action.kind == SKIP and not action.changes
    assert "held by other" in action.note and "on_hostname_taken: skip" in action.note


def test_a_machine_already_on_its_fallback_stays():
    fallback = identity.fallback_hostname("web1", "vms")
    machines = [machine("aaa", fallback, status="Ready", pool="vms")]
    assert plan(machines, {"aaa": addr("web1", "vms")}, [], SETTINGS) == []


def test_a_duplicate_claim_touches_none_of_its_machines():
    machines = [machine("aaa", "one", status="New"),
                machine("bbb", "two", status="Ready", pool="vms"),
                machine("ccc", "three", status="Ready", pool="vms"),
                machine("ddd", "lucky-cat", status="Ready", pool="vms")]
    power = {sid: addr("web1", "vms", password="other") for sid in ("aaa", "bbb", "ccc")}
    power["ddd"] = addr("web2", "vms", password="placeholder")
    actions = plan(machines, power, [], SETTINGS)
    assert [(a.system_id, a.kind, a.after) for a in actions] == [
        (None, DUPLICATE, "aaa,bbb,ccc"),
        ("ddd", SET_PASSWORD, "derived"),
        ("ddd", RENAME, "web2-vms"),
    ]
    assert actions[0].note == (
        "web1.vms is claimed by 3 machines: aaa (one), bbb (two), ccc (three); none of them gets a "
        "password, rename, pool or commission until only one claims it")
    assert not actions[0].changes


@pytest.mark.parametrize("password", ["placeholder", "unset", "other", "unknown"])
def test_a_wrong_password_is_set_before_anything_else_in_any_status(password):
    for status in ("New", "Commissioning", "Ready", "Deployed", "Testing", "Broken"):
        machines = [machine("aaa", "web1-vms", status=status, pool="vms")]
        actions = plan(machines, {"aaa": addr("web1", "vms", password=password)}, [], SETTINGS)
        assert actions[0] == Action(SET_PASSWORD, "aaa", "web1-vms", "web1", "vms", password, "derived")
        assert kinds(actions)[1:] == ([COMMISSION] if status == "New" else [])


def test_pool_only_from_default():
    machines = [machine("aaa", "web1-vms", status="Ready", pool="ops", pool_id=5),
                machine("bbb", "web2-vms", status="Ready", pool="default")]
    power = {"aaa": addr("web1", "vms"), "bbb": addr("web2", "vms")}
    actions = plan(machines, power, ["default", "ops"], SETTINGS)
    assert [(a.kind, a.system_id) for a in actions] == [
        (CREATE_POOL, None), (SKIP, "aaa"), (MOVE_POOL, "bbb")]
    assert "filed by an operator" in actions[1].note


def test_one_create_pool_per_namespace():
    machines = [machine(f"m{i}", f"web{i}-vms", status="Ready") for i in range(3)]
    power = {f"m{i}": addr(f"web{i}", "vms") for i in range(3)}
    actions = plan(machines, power, [], SETTINGS)
    assert kinds(actions) == [CREATE_POOL, MOVE_POOL, MOVE_POOL, MOVE_POOL]


@pytest.mark.parametrize("status", ["Commissioning", "Failed commissioning", "Ready", "Deployed", "Broken",
                                    "Deploying", "Testing", "Allocated", "Rescue mode", "Releasing"])
def test_never_commission_outside_new(status):
    machines = [machine("aaa", "web1-vms", status=status, pool="vms")]
    assert COMMISSION not in kinds(plan(machines, {"aaa": addr("web1", "vms")}, [], SETTINGS))


def test_status_code_must_agree_with_new():
    m = machine("aaa", "web1-vms", pool="vms")
    m["status"] = 4
    assert plan([m], {"aaa": addr("web1", "vms")}, [], SETTINGS) == []


def test_commission_modes():
    untagged = machine("aaa", "web1-vms", pool="vms")
    tagged = machine("bbb", "web2-vms", pool="vms", tags=["kubevirt-approved"])
    power = {"aaa": addr("web1", "vms"), "bbb": addr("web2", "vms")}
    auto = plan([untagged, tagged], power, [], Settings(domain=DOMAIN, commission="auto"))
    assert [(a.kind, a.system_id) for a in auto] == [(COMMISSION, "aaa"), (COMMISSION, "bbb")]
    approved = plan([untagged, tagged], power, [], Settings(domain=DOMAIN, commission="approved"))
    assert [(a.kind, a.system_id) for a in approved] == [(SKIP, "aaa"), (COMMISSION, "bbb")]
    assert "waiting for the tag kubevirt-approved" in approved[0].note
    never = plan([untagged, tagged], power, [], Settings(domain=DOMAIN, commission="never"))
    assert not any(a.changes for a in never)


# --- the table -------------------------------------------------------------------------------


def test_plan_table_is_readable():
    machines = [machine("aaa", "lucky-cat")]
    text = loop.plan_table(plan(machines, {"aaa": addr("web1", "vms")}, [], SETTINGS))
    lines = text.splitlines()
    assert lines[0].split() == ["ACTION", "SYSTEM_ID", "HOSTNAME", "VM", "NAMESPACE", "BEFORE", "AFTER", "NOTE"]
    assert lines[1].split() == ["create-pool", "-", "-", "-", "vms", "-", "vms"]
    assert lines[2].split() == ["rename", "aaa", "lucky-cat", "web1", "vms", "lucky-cat", "web1-vms"]


# --- against the double ----------------------------------------------------------------------


def run(capsys, function, values, args):
    code = function(values, args)
    out, err = capsys.readouterr()
    return code, out, err


CYCLE_LINE = re.compile(r"maas-kubevirt: cycle (\d+): (ok|failed|error|interrupted) in \d+\.\d s; (\d+) machine\(s\): "
                        r"(\d+) converged, (\d+) waiting, (\d+) refused; (\d+) change\(s\): (\d+) done, "
                        r"(\d+) failed; (\d+) error\(s\)")


def test_each_foreground_cycle_says_one_short_line(tmp_path, double, capsys, monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    vms = [double.add_vm("web1", "vms"), double.add_vm("db1", "vms")]
    values = values_for(tmp_path, double)
    code, out, err = run(capsys, loop.main, values, Args(once=True))
    assert code == 0, err
    lines = [line for line in err.splitlines() if " cycle " in line and "machine(s)" in line]
    assert len(lines) == 1 and len(lines[0]) < 160, err
    match = CYCLE_LINE.fullmatch(lines[0])
    assert match, lines[0]
    assert (match[2], match[3], match[9], match[10]) == ("ok", "2", "0", "0")
    assert int(match[8]) == int(match[7]) > 0            # every change planned was done
    assert_no_secrets(double, out, err, "")
    code, out, err = run(capsys, loop.main, values, Args(once=True))
    assert CYCLE_LINE.fullmatch(err.strip()).groups()[1:] == ("ok", "2", "2", "0", "0", "0", "0", "0", "0")
    assert all(vm not in err for vm in vms)       # counts, no name
    values["maas"]["url"] = "http://127.0.0.1:9/MAAS/"
    code, out, err = run(capsys, loop.main, values, Args(once=True))
    assert code == 1 and CYCLE_LINE.search(err)[2] == "error" and CYCLE_LINE.search(err)[10] == "1"


def test_the_service_says_its_cycle_in_status_not_in_a_journal_line(tmp_path, double, capsys, monkeypatch):
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "no-such-socket"))
    double.add_vm("web1", "vms")
    code, out, err = run(capsys, loop.main, values_for(tmp_path, double), Args(once=True))
    assert code == 0 and not CYCLE_LINE.search(err), err


def test_once_converges_and_audits(tmp_path, double, capsys):
    noise = add_noise(double)
    vms = [double.add_vm("web1", "vms"), double.add_vm("db.primary", "vms"), double.add_vm("web1", "team-b")]
    values = values_for(tmp_path, double)
    code, out, err = run(capsys, loop.main, values, Args(once=True))
    assert code == 0, err
    records = every = audit_records(out)
    # The look-alike evil1 (web1.vms.<domain>.evil.io) is named once, and left as it is.
    (suspect,) = [r for r in records if r["action"] == SUSPECT]
    assert (suspect["system_id"], suspect["outcome"]) == (noise[2], "refused")
    records = [r for r in records if r is not suspect]
    assert {r["action"] for r in records} == {CREATE_POOL, SET_PASSWORD, RENAME, MOVE_POOL, COMMISSION}
    for record in records:
        assert list(record)[:7] == ["time", "system_id", "hostname", "action", "before", "after", "outcome"]
        assert record["outcome"] == "ok"
        assert record["time"].endswith("Z")
    assert len(records) == 2 + 3 * 4
    passwords = [r for r in records if r["action"] == SET_PASSWORD]
    assert [(r["before"], r["after"]) for r in passwords] == [("placeholder", "derived")] * 3
    assert sorted(double.commissions) == sorted((sid, True) for sid in vms)  # skip_bmc_config=1
    assert audit_records((tmp_path / "audit.log").read_text()) == every
    assert converged(double, vms)
    assert {w[1] for w in double.writes if w[0] != "POST" or w[1] != "resourcepools/"} <= set(vms)
    assert all(double.machines[sid]["hostname"].startswith(("phys", "evil", "short", "virsh")) for sid in noise)
    assert double.machines[vms[1]]["hostname"] == "db-primary-vms"
    assert_no_secrets(double, out, err, (tmp_path / "audit.log").read_text())

    # Second run: nothing to do, no records, at most 2 requests after the version check.
    double.reset_counts()
    code, out, err = run(capsys, loop.main, values, Args(once=True))
    assert code == 0 and audit_records(out) == []


def test_idle_cycle_costs_at_most_two_requests(double):
    populate(double, 2000, vm_fraction=0.1)
    client = MAASClient(double.url, Signer(*double.api_key), timeout=5)
    reconciler = Reconciler(client, SETTINGS, Audit(""), passwords=PASSWORDS)
    for _ in range(4):
        reconciler.cycle()
        double.advance()
    double.reset_counts()
    result = reconciler.cycle()
    assert not any(a.changes for a in result.actions)
    assert double.request_count <= 2
    assert ("GET", "machines/?op=power_parameters") not in double.counts


def test_idle_cycle_at_ten_thousand_machines(double):
    for i in range(9000):
        double.add_machine(power_type="ipmi", power_pass=f"S3CRET{i}", status="Deployed")
    for i in range(1000):
        ns = f"ns{i % 10}"
        double.add_vm(f"vm{i}", ns, hostname=identity.maas_hostname(f"vm{i}", ns), pool=ns, status="Deployed",
                      **credentials(f"vm{i}", ns))
    client = MAASClient(double.url, Signer(*double.api_key), timeout=30)
    reconciler = Reconciler(client, SETTINGS, Audit(""), passwords=PASSWORDS)
    assert reconciler.cycle().actions == []
    double.reset_counts()
    assert reconciler.cycle().actions == []
    assert double.request_count <= 2
    assert all("S3CRET" not in str(v) for v in reconciler.known.values())


def test_power_parameters_refetched_only_for_new_or_changed(double):
    a = double.add_vm("web1", "vms", status="Ready", pool="vms", hostname="web1-vms")
    client = MAASClient(double.url, Signer(*double.api_key), timeout=5)
    reconciler = Reconciler(client, SETTINGS, Audit(""), passwords=PASSWORDS)
    reconciler.cycle()
    double.reset_counts()
    double.add_vm("web2", "vms", status="Ready", pool="vms", hostname="web2-vms",
                  **credentials("web2", "vms"))
    reconciler.cycle()
    (log,) = [entry for entry in double.log if entry[2] == "power_parameters"]
    assert double.counts[("GET", "machines/?op=power_parameters")] == 1
    double.reset_counts()
    double.set_status(a, "Deployed")
    reconciler.cycle()
    assert double.counts[("GET", "machines/?op=power_parameters")] == 1
    del double.machines[a]
    reconciler.cycle()
    assert a not in reconciler.known


def test_loop_stops_between_actions(double):
    ids = [double.add_vm(f"web{i}", "vms", pool="vms", status="Ready") for i in range(5)]
    client = MAASClient(double.url, Signer(*double.api_key), timeout=5)
    stop = threading.Event()

    class StopAfterFirst(Audit):
        def write(self, *args, **kw):
            stop.set()
            return super().write(*args, **kw)

    result = Reconciler(client, SETTINGS, StopAfterFirst(""), stop, passwords=PASSWORDS).cycle()
    # The first machine's password and rename were one request; nothing after it was sent.
    assert result.outcome.ok == 2 and result.outcome.interrupted
    assert double.counts[("PUT", "machines/{id}/")] == 1
    assert sum(double.machines[sid]["hostname"].endswith("-vms") for sid in ids) == 1
    assert sum(double.power[sid]["power_pass"] == derived(f"web{i}", "vms") for i, sid in enumerate(ids)) == 1


def test_failed_action_does_not_stop_the_rest(tmp_path, double, capsys):
    a = double.add_vm("web1", "vms", pool="vms", status="Ready")
    b = double.add_vm("web2", "vms", pool="vms", status="Ready")
    double.inject("500", method="PUT", path=f"machines/{a}/")
    values = values_for(tmp_path, double)
    code, out, err = run(capsys, loop.main, values, Args(once=True))
    assert code == 1
    records = audit_records(out)
    # The password and the rename went in one PUT, which failed: both are failed, nothing half-done.
    assert [(r["action"], r["outcome"], r["reason"]) for r in records if r["system_id"] == a] == [
        (SET_PASSWORD, "failed", f"PUT machines/{a}/: 500: Internal Server Error"),
        (RENAME, "failed", f"PUT machines/{a}/: 500: Internal Server Error")]
    assert {r["outcome"] for r in records if r["system_id"] == b} == {"ok"}
    code, out, err = run(capsys, loop.main, values, Args(once=True))
    assert code == 0 and converged(double, [a, b])


def test_failed_pool_creation_fails_its_moves_without_requests(tmp_path, double, capsys):
    a = double.add_vm("web1", "vms", hostname="web1-vms", status="Ready", **credentials("web1", "vms"))
    double.inject("500", method="POST", path="resourcepools/")
    code, out, err = run(capsys, loop.main, values_for(tmp_path, double), Args(once=True))
    assert code == 1
    outcomes = [(r["action"], r["outcome"]) for r in audit_records(out)]
    assert outcomes == [(CREATE_POOL, "failed"), (MOVE_POOL, "failed")]
    assert ("PUT", f"machines/{{id}}/") not in double.counts
    assert double.machines[a]["pool"]["name"] == "default"


def test_a_pool_created_meanwhile_by_someone_else_receives_nothing(tmp_path, double, capsys):
    a = double.add_vm("web1", "vms", hostname="web1-vms", status="Ready")
    client = MAASClient(double.url, Signer(*double.api_key), timeout=5)
    actions = Reconciler(client, SETTINGS, passwords=PASSWORDS).make_plan()
    double.add_pool("vms")   # an administrator's, with a description of their own
    outcome = reconcile.apply(client, actions, Audit(""), passwords=PASSWORDS)
    out = capsys.readouterr().out
    assert (outcome.ok, outcome.skipped, outcome.failed) == (1, 2, 0)
    # The move is held back, and recorded so, before its machine's PUT goes.
    assert [(r["action"], r["outcome"]) for r in audit_records(out)] == [
        (CREATE_POOL, "skipped"), (MOVE_POOL, "skipped"), (SET_PASSWORD, "ok")]
    assert double.machines[a]["pool"]["name"] == "default"
    # The next cycle reads whose pool it is, and leaves the machine in default with a note.
    later = Reconciler(client, SETTINGS, passwords=PASSWORDS).make_plan()
    assert [(x.kind, x.after) for x in later if x.system_id == a] == [(SKIP, "default")]
    assert "not created by maas-kubevirt" in later[0].note


def test_dry_run_prints_a_table_and_changes_nothing(tmp_path, double, capsys):
    add_noise(double)
    double.add_vm("web1", "vms")
    code, out, err = run(capsys, loop.main, values_for(tmp_path, double),
                         Args(dry_run=True))
    assert code == 0
    assert double.writes == []
    assert audit_records(out) == []
    assert "ACTION" in out and "web1-vms" in out and "create-pool" in out
    assert "5 change(s) planned for 1 machine(s); dry run: nothing changed" in out
    assert "set-password" in out and "placeholder" in out and "derived" in out
    assert not (tmp_path / "audit.log").exists() or (tmp_path / "audit.log").read_text() == ""
    assert_no_secrets(double, out, err)


def test_dry_run_json_is_the_plan_and_the_detailed_exit_code_says_changes_are_pending(tmp_path, double, capsys):
    add_noise(double)
    double.add_vm("web1", "vms")
    path = write_values(tmp_path, double)
    assert cli.main(["--values", str(path), "reconcile", "--dry-run", "--json"]) == 0
    out, err = capsys.readouterr()
    plan = json.loads(out)
    assert plan["dry_run"] is True and plan["summary"] == {"changes": 5, "machines": 1, "pool_actions": 0}
    assert {a["action"] for a in plan["actions"]} >= {"create-pool", "set-password", "rename", "move-pool", "commission"}
    assert all(set(a) == {"action", "system_id", "hostname", "vm", "namespace", "before", "after", "note", "changes"}
               for a in plan["actions"])
    (password,) = [a for a in plan["actions"] if a["action"] == "set-password"]
    assert (password["before"], password["after"], password["vm"]) == ("placeholder", "derived", "web1")
    assert double.writes == [] and not CYCLE_LINE.search(err)
    assert_no_secrets(double, out, err)
    # As terraform plan -detailed-exitcode, but 3: 2 is a configuration error here.
    assert cli.main(["--values", str(path), "reconcile", "--dry-run", "--detailed-exitcode"]) == loop.EXIT_PENDING == 3
    assert "5 change(s) planned" in capsys.readouterr().out
    assert cli.main(["--values", str(path), "reconcile", "--once"]) == 0
    capsys.readouterr()
    assert cli.main(["--values", str(path), "reconcile", "--dry-run", "--json", "--detailed-exitcode"]) == 0
    assert json.loads(capsys.readouterr().out)["summary"] == {"changes": 0, "machines": 0, "pool_actions": 0}


@pytest.mark.parametrize("options, named", [(["--json"], "-o/--json"), (["-o", "yaml"], "-o/--json"),
                                            (["--detailed-exitcode"], "--detailed-exitcode")])
def test_the_plan_options_need_a_dry_run(options, named, capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["reconcile", *options])
    assert exited.value.code == 2
    assert f"reconcile: {named} only with --dry-run" in capsys.readouterr().err


def test_the_plan_and_status_print_as_o_says_as_kubectl(tmp_path, double, capsys):
    """-o json and -o yaml are one document, --json (deprecated) is -o json, -o wide is the
    table (it leaves no column out and never wraps)."""
    add_noise(double)
    double.add_vm("web1", "vms")
    path = write_values(tmp_path, double)
    for command in (["reconcile", "--dry-run"], ["status"]):
        printed = {}
        for output in ([], ["-o", "wide"], ["-o", "json"], ["--output", "yaml"], ["--json"]):
            assert cli.main(["--values", str(path), *command, *output]) == 0
            printed[" ".join(output)] = capsys.readouterr().out
        assert printed["-o wide"] == printed[""], command
        assert yaml.safe_load(printed["--output yaml"]) == json.loads(printed["-o json"]), command
        assert printed["--json"] == printed["-o json"], command
        assert_no_secrets(double, *printed.values())


def test_status_watch_prints_until_interrupted_and_exits_0(tmp_path, double):
    """`status --watch --interval 1`, piped: a table each second, a blank line between; SIGINT ends it with 0,
    even started as a background job is, with SIGINT ignored (as CI's shells may start the suite)."""
    double.add_vm("web1", "vms")
    path = write_values(tmp_path, double)
    watching = subprocess.Popen([sys.executable, "-m", "maas_kubevirt", "--values", str(path), "status", "--watch",
                                 "--interval", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        deadline = time.monotonic() + 60
        seen = ""
        while seen.count("MAAS machine(s) with a Redfish power address") < 2:
            assert time.monotonic() < deadline and watching.poll() is None, seen
            seen += watching.stdout.readline()
    finally:
        watching.send_signal(signal.SIGINT)
        out, err = watching.communicate(timeout=30)
    assert watching.returncode == 0, err
    assert err == "" and "\n\nVM " in seen


def test_status_interval_needs_watch(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["status", "--interval", "3"])
    assert exited.value.code == 2
    assert "status: --interval only with --watch" in capsys.readouterr().err


def test_status_table(tmp_path, double, capsys):
    add_noise(double)
    sid = double.add_vm("web1", "vms", hostname="web1-vms", pool="vms", status="Deployed")
    double.machines[sid]["power_state"] = "on"
    code, out, err = run(capsys, status.main, values_for(tmp_path, double), Args())
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["VM", "NAMESPACE", "HOSTNAME", "SYSTEM_ID", "STATUS", "POOL", "POWER", "PASSWORD",
                                "ADDRESS", "WAITING"]
    rows = {line.split()[3]: line for line in lines[1:3]}
    assert rows[sid].split() == ["web1", "vms", "web1-vms", sid, "Deployed", "vms", "on", "placeholder",
                                 "web1.vms.bmc.example.com", "-"]
    # The look-alike evil1 is shown with its address, marked.
    evil = next(s for s, m in double.machines.items() if m["hostname"] == "evil1")
    assert rows[evil].split()[:4] == ["web1", "vms", "evil1", evil]
    assert "https://web1.vms.bmc.example.com.evil.io/redfish/v1/Systems/1 (suspect: not the bare host)" in rows[evil]
    assert lines[3] == ("1 MAAS machine(s) with a Redfish power address under bmc.example.com, "
                        "and 1 suspect(s) that only imitate one")
    assert_no_secrets(double, out, err)


def test_status_json_has_the_tables_rows_and_no_secret(tmp_path, double, capsys):
    """--json: one document with the table's rows (the suspect mark a boolean, waiting null when
    nothing waits), the duplicate claims, the refused pools, the lease (null: not configured) and
    the counts; MAAS's control characters escaped, no password, seed or derived user in it."""
    add_noise(double)
    web1 = double.add_vm("web1", "vms")
    path = write_values(tmp_path, double)
    assert cli.main(["--values", str(path), "reconcile", "--once"]) == 0
    assert double.power[web1]["power_user"] == derived_user("web1", "vms")   # something to leak
    hostile = "web2\x1b[2J\u202eevil\n"
    web2 = double.add_vm("web2", "vms", hostname=hostile)
    first, second = double.add_vm("db", "team-b", hostname="first"), double.add_vm("db", "team-b", hostname="second")
    double.add_pool("gpu-prod", "GPU servers for production")
    rogue = double.add_vm("x", "gpu-prod", hostname="rogue")
    (tmp_path / "audit.log").write_text(json.dumps({
        "time": "2026-12-01T00:00:00.000000Z", "system_id": web2, "hostname": "x", "action": "commission",
        "before": "New", "after": "Commissioning", "outcome": "failed", "reason": "POST: 503: no rack",
        "retry_at": "2999-01-01T00:00:00Z", "failures": 3}) + "\n")
    capsys.readouterr()
    assert cli.main(["--values", str(path), "status", "--json"]) == 0
    out, err = capsys.readouterr()
    assert all(c.isprintable() or c == "\n" for c in out)            # json.dumps escaped them
    report = json.loads(out)
    assert set(report) == {"domain", "rows", "duplicates", "pool_refused", "notes", "lease", "rotations", "switched",
                           "pools", "pools_unread", "summary"}
    rows = {r["system_id"]: r for r in report["rows"]}
    evil = next(s for s, m in double.machines.items() if m["hostname"] == "evil1")
    assert set(rows) == {web1, web2, first, second, rogue, evil}
    assert rows[web1] == {"vm": "web1", "namespace": "vms", "hostname": "web1-vms", "system_id": web1,
                          "status": "Commissioning", "pool": "vms", "power": double.machines[web1].get("power_state"),
                          "password": RIGHT, "address": "web1.vms.bmc.example.com", "suspect": False,
                          "waiting": None}
    assert rows[web2]["hostname"] == hostile and rows[web2]["password"] == PLACEHOLDER
    assert rows[web2]["waiting"] == "waiting until 2999-01-01T00:00:00Z after 3 failed attempt(s): POST: 503: no rack"
    assert rows[evil]["suspect"] is True
    assert rows[evil]["address"] == "https://web1.vms.bmc.example.com.evil.io/redfish/v1/Systems/1"
    (duplicate,) = report["duplicates"]
    assert (duplicate["vm"], duplicate["namespace"]) == ("db", "team-b")
    assert duplicate["machines"] == [{"system_id": first, "hostname": "first"},
                                     {"system_id": second, "hostname": "second"}]
    (refused,) = report["pool_refused"]
    assert (refused["system_id"], refused["hostname"], refused["pool"]) == (rogue, "rogue", "default")
    assert report["lease"] is None and report["notes"] == []
    assert report["summary"] == {"machines": 5, "suspects": 1, "waiting": 1, "duplicates": 1, "pool_refused": 1,
                                 "rotations": 0, "switched": 0}
    # No secret, and no power parameter but the address: not even the derived user.
    users = [derived_user(vm, ns) for vm, ns in (("web1", "vms"), ("web2", "vms"), ("db", "team-b"), ("x", "gpu-prod"))]
    assert_no_secrets(double, out, err)
    assert not [u for u in users if u in out] and "power_user" not in out and "power_pass" not in out
    assert all(set(r) == set(rows[web1]) for r in report["rows"])
    # The table has the same rows, in the same order, and the same lines after them.
    assert cli.main(["--values", str(path), "status"]) == 0
    table_out = capsys.readouterr().out
    expected = console.table(status.HEADERS, [
        (r["vm"], r["namespace"], r["hostname"], r["system_id"], r["status"], r["pool"], r["power"], r["password"],
         ascii(r["address"])[1:-1] + (status.SUSPECT_MARK if r["suspect"] else ""), r["waiting"] or "-")
        for r in report["rows"]])
    assert table_out.startswith(expected + "\n")
    assert "\x1b" not in table_out and "web2\\x1b[2J\\u202eevil\\n" in table_out   # the table's own escaping
    after = table_out[len(expected) + 1:].splitlines()
    assert after == [
        "5 MAAS machine(s) with a Redfish power address under bmc.example.com, and 1 suspect(s) that only imitate one",
        f"duplicate claim: {duplicate['note']}", f"{rogue} rogue: {refused['note']}"]


def test_approved_mode_against_double(tmp_path, double, capsys):
    a = double.add_vm("web1", "vms", hostname="web1-vms", pool="vms")
    b = double.add_vm("web2", "vms", hostname="web2-vms", pool="vms", tag_names=["go-ahead"])
    values = values_for(tmp_path, double, commission="approved", approval_tag="go-ahead")
    code, out, err = run(capsys, loop.main, values, Args(once=True))
    assert code == 0
    assert double.machines[a]["status_name"] == "New"
    assert double.machines[b]["status_name"] == "Commissioning"
    assert "waiting for the tag go-ahead" in err


def test_version_too_old_is_a_config_error(tmp_path, double, capsys):
    double.version = "2.8.2"
    double.add_vm("web1", "vms")
    code, out, err = run(capsys, loop.main, values_for(tmp_path, double), Args(once=True))
    assert code == 2 and "2.9.0 or later" in err and double.writes == []


def test_dns_name_version_warns(tmp_path, double, capsys):
    double.version = "3.6.2"
    code, out, err = run(capsys, loop.main, values_for(tmp_path, double), Args(once=True))
    assert code == 0 and "LP:2150892" in err


def test_bad_key_is_a_config_error(tmp_path, double, capsys):
    (tmp_path / "api-key").write_text("a:b:wrong-secret-value")
    (tmp_path / "api-key").chmod(0o600)
    code, out, err = run(capsys, loop.main, values_for(tmp_path, double), Args(once=True))
    assert code == 2 and "401" in err and "wrong-secret-value" not in out + err


def test_missing_key_file_via_cli(tmp_path, double, capsys):
    path = write_values(tmp_path, double)
    (tmp_path / "api-key").unlink()
    assert cli.main(["--values", str(path), "reconcile", "--once"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("maas-kubevirt: error: maas.api_key_file: expected a readable file")


def test_key_file_mode_warns(tmp_path, double, capsys):
    values = values_for(tmp_path, double)
    (tmp_path / "api-key").chmod(0o640)
    code, out, err = run(capsys, loop.main, values, Args(once=True))
    assert code == 0 and "readable by group or others (mode 0640)" in err


def test_env_key_overrides_file(tmp_path, double, capsys, monkeypatch):
    values = values_for(tmp_path, double)
    (tmp_path / "api-key").unlink()
    monkeypatch.setenv("MAAS_API_KEY", double.api_key_text)
    code, out, err = run(capsys, loop.main, values, Args(once=True))
    assert code == 0, err


def test_unwritable_audit_log_is_a_config_error(tmp_path, double):
    values = values_for(tmp_path, double, audit_log=str(tmp_path / "missing-dir" / "audit.log"))
    with pytest.raises(ValuesError, match="maas.audit_log: expected a file the reconciler can append to") as raised:
        loop.main(values, Args(once=True))
    # A missing directory is the package's before its service first started (LogsDirectory=).
    assert "start the service first" in str(raised.value)
    (tmp_path / "missing-dir").mkdir(mode=0o500)
    if os.geteuid() != 0:   # root appends whatever the mode
        with pytest.raises(ValuesError, match="Permission denied") as raised:
            loop.main(values, Args(once=True))
        assert "start the service first" not in str(raised.value)


def test_unreachable_maas_once_exits_1(tmp_path, double, capsys):
    values = values_for(tmp_path, double)
    values["maas"]["url"] = "http://127.0.0.1:9/MAAS/"
    code, out, err = run(capsys, loop.main, values, Args(once=True))
    assert code == 1
    assert "cycle failed: GET version/: connection: connection refused" in err


# --- the loop as a process: SIGTERM / SIGINT -------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_loop_exits_cleanly_on_signal(tmp_path, double, signum):
    for i in range(3):
        double.add_vm(f"web{i}", "vms")
    values = write_values(tmp_path, double, interval=1)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("MAAS_API_KEY", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "maas_kubevirt", "--values", str(values), "reconcile"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        deadline = time.monotonic() + 30
        while double.counts[("GET", "machines/")] < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert double.counts[("GET", "machines/")] >= 2, "the loop did not run two cycles"
        process.send_signal(signum)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, err
    assert "Traceback" not in err
    assert len(audit_records(out)) == 1 + 3 * 4
    assert_no_secrets(double, out, err)


def test_a_name_freed_in_the_plan_is_taken_after_it_is_freed(tmp_path, double, capsys):
    # "web1-vms" is held by the machine of VM web2; that machine is renamed away first.
    a = double.add_vm("web1", "vms", hostname="lucky-cat", pool="vms", status="Ready",
                      **credentials("web1", "vms"))
    b = double.add_vm("web2", "vms", hostname="web1-vms", pool="vms", status="Ready",
                      **credentials("web2", "vms"))
    client = MAASClient(double.url, Signer(*double.api_key), timeout=5)
    actions = Reconciler(client, SETTINGS, passwords=PASSWORDS).make_plan()
    assert [(x.system_id, x.kind, x.after) for x in actions] == [(b, RENAME, "web2-vms"), (a, RENAME, "web1-vms")]
    outcome = reconcile.apply(client, actions, Audit(""))
    assert outcome.ok == 2 and double.machines[a]["hostname"] == "web1-vms"
    capsys.readouterr()


def test_two_machines_swapping_names_skip_rather_than_fight():
    machines = [machine("aaa", "web2-vms", status="Ready", pool="vms"),
                machine("bbb", "web1-vms", status="Ready", pool="vms")]
    power = {"aaa": addr("web1", "vms"), "bbb": addr("web2", "vms")}
    actions = plan(machines, power, [], Settings(domain=DOMAIN, on_hostname_taken="skip"))
    assert [(a.system_id, a.kind) for a in actions] == [("aaa", SKIP), ("bbb", SKIP)]
    actions = plan(machines, power, [], SETTINGS)
    assert [(a.system_id, a.kind, a.after) for a in actions] == [
        ("aaa", RENAME, identity.fallback_hostname("web1", "vms")),
        ("bbb", RENAME, "web2-vms"),   # the name aaa freed
    ]


# --- credentials: the derived password, the placeholder, the seed ----------------------------


def reconciler_for(double, seed_text=SEED, audit=None, full_list=False, client=None):
    """full_list: list every machine each cycle (request counts below are that strategy's;
    tests/test_events.py counts the event-driven ones). client: one of the double's, changed."""
    client = client or MAASClient(double.url, Signer(*double.api_key), timeout=5)
    settings = Settings(domain=DOMAIN, resync_interval=None) if full_list else SETTINGS
    return Reconciler(client, settings, audit or Audit(""), passwords=Passwords(seed_text))


def power_parameter_reads(double):
    return double.counts[("GET", "machines/?op=power_parameters")]


def test_the_double_sets_power_parameters_as_maas_does(double):
    sid = double.add_vm("web1", "vms")
    before = dict(double.power[sid])
    client = MAASClient(double.url, Signer(*double.api_key), timeout=5)
    client.update_machine(sid, power_parameters_power_pass="a-new-password")
    assert double.power[sid] == {**before, "power_pass": "a-new-password"}  # the others are kept
    with pytest.raises(maas.MAASError, match=r"400: power_parameters: Unknown parameter\(s\): power_driver"):
        client.call("PUT", f"machines/{sid}/", fields={"power_parameters_power_driver": "LAN_2_0"})
    with pytest.raises(maas.MAASError, match="Redfish password: This field is required"):
        client.call("PUT", f"machines/{sid}/", fields={"power_parameters_power_pass": ""})
    assert double.power[sid]["power_pass"] == "a-new-password"
    client.commission(sid)
    assert double.power[sid]["power_pass"] == "a-new-password"   # bmc-config scripts skipped
    double.advance()
    client.call("POST", f"machines/{sid}/", [("op", "commission")], fields={"skip_bmc_config": "0"})
    assert double.commissions == [(sid, True), (sid, False)]
    assert double.power[sid]["power_pass"] == identity.PLACEHOLDER_PASSWORD  # the script ran


def test_a_password_sent_is_scrubbed_from_an_echoed_error(double):
    sid = double.add_vm("web1", "vms")
    double.inject("echo", method="PUT")
    client = MAASClient(double.url, Signer(*double.api_key), timeout=5)
    with pytest.raises(maas.MAASError) as raised:
        client.update_machine(sid, power_parameters_power_pass="Sup3r-S3CRET-value")
    assert "Sup3r-S3CRET-value" not in str(raised.value)
    assert "power_parameters_power_pass=<withheld>" in str(raised.value)


def test_the_placeholder_is_replaced_then_left_alone(double, capsys):
    sid = double.add_vm("web1", "vms", hostname="web1-vms", pool="vms", status="Ready")
    reconciler = reconciler_for(double, full_list=True)
    result = reconciler.cycle()
    assert [(a.kind, a.before, a.after) for a in result.actions] == [(SET_PASSWORD, "placeholder", "derived")]
    assert double.power[sid]["power_pass"] == derived("web1", "vms")
    (record,) = audit_records(capsys.readouterr().out)
    assert (record["action"], record["before"], record["after"], record["outcome"]) == (
        SET_PASSWORD, "placeholder", "derived", "ok")
    assert reconciler.known[sid][1] == Power(double.power[sid]["power_address"], RIGHT, user=RIGHT,
                                             names=tuple(sorted(double.power[sid])))
    double.reset_counts()
    assert reconciler.cycle().actions == []
    # Without the event log, every cycle lists the machines and reads every redfish machine's power.
    assert double.request_count == 2 and power_parameter_reads(double) == 1


def test_commission_only_with_the_password_in_place(tmp_path, double, capsys):
    sid = double.add_vm("web1", "vms", hostname="web1-vms", pool="vms")
    double.inject("500", method="PUT", path=f"machines/{sid}/")
    code, out, err = run(capsys, loop.main, values_for(tmp_path, double), Args(once=True))
    assert code == 1
    assert [(r["action"], r["outcome"]) for r in audit_records(out)] == [
        (SET_PASSWORD, "failed"), (COMMISSION, "skipped")]
    assert "the BMC password is not in place" in audit_records(out)[1]["reason"]
    assert double.machines[sid]["status_name"] == "New" and double.commissions == []
    code, out, err = run(capsys, loop.main, values_for(tmp_path, double), Args(once=True))
    assert code == 0 and double.commissions == [(sid, True)]
    assert double.power[sid]["power_pass"] == derived("web1", "vms")


def test_a_commission_started_by_hand_is_repaired_within_one_cycle(double):
    sid = double.add_vm("web1", "vms", hostname="web1-vms", pool="vms", status="Ready")
    other = double.add_vm("web2", "vms", hostname="web2-vms", pool="vms", status="Deployed",
                          **credentials("web2", "vms"))
    reconciler = reconciler_for(double, full_list=True)
    reconciler.cycle()
    assert double.power[sid]["power_pass"] == derived("web1", "vms")
    # An operator commissions by hand, without skip_bmc_config: the script writes the placeholder.
    client = MAASClient(double.url, Signer(*double.api_key), timeout=5)
    client.call("POST", f"machines/{sid}/", [("op", "commission")], fields={})
    assert double.power[sid]["power_pass"] == identity.PLACEHOLDER_PASSWORD
    double.reset_counts()
    result = reconciler.cycle()
    assert [(a.system_id, a.kind, a.before) for a in result.actions if a.changes] == [
        (sid, SET_PASSWORD, "placeholder")]
    assert double.power[sid]["power_pass"] == derived("web1", "vms")
    # One bulk read of ours in Commissioning, one re-read of the machine about to change.
    assert power_parameter_reads(double) == 2
    ids = [entry for entry in double.log if entry[2] == "power_parameters"]
    assert len(ids) == 2
    # While it stays in Commissioning, each cycle reads its parameters again (one request), and
    # nothing else is asked about.
    double.reset_counts()
    assert not any(a.changes for a in reconciler.cycle().actions)
    assert power_parameter_reads(double) == 1 and double.request_count == 2
    double.advance()
    double.reset_counts()
    reconciler.cycle()          # Ready now: the status changed, so it is read once more
    double.reset_counts()
    reconciler.cycle()
    assert double.request_count == 2 and power_parameter_reads(double) == 1
    assert double.power[other]["power_pass"] == derived("web2", "vms")


def test_a_machine_whose_address_changed_before_acting_is_left_alone(double, capsys):
    sid = double.add_vm("web1", "vms")
    steady = double.add_vm("web2", "vms")
    reconciler = reconciler_for(double)
    real = reconciler.client.power_parameters
    calls = []

    def readdress_after_first_read(ids, reduce, hints=None):
        found = real(ids, reduce, hints)
        if not calls:  # between the plan and the re-read, someone points sid at another BMC
            double.power[sid]["power_address"] = "web9.team-b.bmc.example.com"
        calls.append(list(ids))
        return found

    reconciler.client.power_parameters = readdress_after_first_read
    result = reconciler.cycle()
    assert calls[1] == sorted([sid, steady])           # one bulk re-read of the machines to change
    assert not any(a.changes for a in result.actions if a.system_id == sid)
    (skip,) = [a for a in result.actions if a.system_id == sid]
    assert skip.kind == SKIP and "power address changed" in skip.note
    assert double.power[sid]["power_pass"] == identity.PLACEHOLDER_PASSWORD
    assert double.machines[sid]["status_name"] == "New"
    assert double.power[steady]["power_pass"] == derived("web2", "vms")
    assert double.machines[steady]["status_name"] == "Commissioning"
    # Next cycle it is read afresh and handled under its new identity.
    reconciler.client.power_parameters = real
    reconciler.cycle()
    assert double.power[sid]["power_pass"] == derived("web9", "team-b")
    capsys.readouterr()


def test_a_password_set_meanwhile_is_not_set_again(double):
    sid = double.add_vm("web1", "vms", hostname="web1-vms", pool="vms", status="Deployed")
    reconciler = reconciler_for(double)
    real = reconciler.client.power_parameters

    def fixed_meanwhile(ids, reduce, hints=None):
        found = real(ids, reduce, hints)
        double.power[sid].update(power_pass=derived("web1", "vms"), power_user=derived_user("web1", "vms"))
        return found

    reconciler.client.power_parameters = fixed_meanwhile
    result = reconciler.cycle()
    assert result.actions == [] and ("PUT", "machines/{id}/") not in double.counts


def test_duplicate_claims_are_left_alone_and_reported_once_per_set(tmp_path, double, capsys):
    a = double.add_vm("web1", "vms", hostname="first")
    b = double.add_vm("web1", "vms", hostname="second", status="Ready")
    sole = double.add_vm("web2", "vms")
    audit = Audit(str(tmp_path / "audit.log"))
    reconciler = reconciler_for(double, audit=audit)
    reconciler.cycle()
    out, err = capsys.readouterr()
    for sid, hostname in ((a, "first"), (b, "second")):
        assert double.power[sid]["power_pass"] == identity.PLACEHOLDER_PASSWORD
        assert double.machines[sid]["hostname"] == hostname
        assert double.machines[sid]["pool"]["name"] == "default"
    assert double.machines[a]["status_name"] == "New"
    assert {w[1] for w in double.writes} <= {sole, "resourcepools/"}
    (record,) = [r for r in audit_records(out) if r["action"] == DUPLICATE]
    assert record["outcome"] == "refused" and record["after"] == f"{a},{b}"
    assert f"{a} (first), {b} (second)" in record["note"]
    assert err.count("web1.vms is claimed by 2 machines") == 1
    reconciler.cycle()
    out, err = capsys.readouterr()
    assert [r for r in audit_records(out) if r["action"] == DUPLICATE] == [] and "claimed" not in err
    c = double.add_vm("web1", "vms", hostname="third", status="Deployed")
    reconciler.cycle()
    out, err = capsys.readouterr()
    (record,) = [r for r in audit_records(out) if r["action"] == DUPLICATE]
    assert record["after"] == f"{a},{b},{c}" and "claimed by 3 machines" in err
    code, out, err = run(capsys, status.main, values_for(tmp_path, double), Args())
    assert code == 0
    assert f"duplicate claim: web1.vms is claimed by 3 machines: {a} (first), {b} (second), {c} (third)" in out
    # Once only one machine claims it, that one is handled.
    del double.machines[b], double.machines[c]
    reconciler.cycle()
    assert double.power[a]["power_pass"] == derived("web1", "vms")
    assert double.machines[a]["hostname"] == "web1-vms"
    assert_no_secrets(double, out, err, (tmp_path / "audit.log").read_text())


def test_seed_rotation_resets_every_machine(tmp_path, double, capsys):
    vms = [double.add_vm("web1", "vms"), double.add_vm("db.primary", "team-b", status="Deployed"),
           double.add_vm("web2", "vms", status="Ready")]
    values = values_for(tmp_path, double)
    code, out, err = run(capsys, loop.main, values, Args(once=True))
    assert code == 0 and converged(double, vms)
    old = {sid: double.power[sid]["power_pass"] for sid in vms}
    rotated = "e41a7c09d3b58f62a0c7e9d41b3f5a86c2d07e9b14f3a5c68e0d2b7f91c4a36d"
    write_seed(tmp_path, rotated)          # the operator replaces the seed file and restarts
    code, out, err = run(capsys, loop.main, values, Args(once=True))
    assert code == 0
    records = [r for r in audit_records(out) if r["action"] == SET_PASSWORD]
    assert sorted(r["system_id"] for r in records) == sorted(vms)
    assert {(r["before"], r["after"], r["outcome"]) for r in records} == {("other", "derived", "ok")}
    assert converged(double, vms, seed=rotated)
    assert all(double.power[sid]["power_pass"] != old[sid] for sid in vms)
    assert_no_secrets(double, out, err, (tmp_path / "audit.log").read_text(), seeds=(SEED, rotated))


@pytest.mark.parametrize("problem, fix", [
    ("missing", "expected a readable seed file"),
    ("short", "64 or more hexadecimal digits"),
    ("mode", "has mode 0640"),
    ("unset", "seed.file: expected the seed file the bundle was rendered with"),
])
def test_a_bad_seed_is_a_configuration_error(tmp_path, double, capsys, problem, fix):
    double.add_vm("web1", "vms")
    path = write_values(tmp_path, double)
    seed_file = tmp_path / "seed"
    if problem == "missing":
        seed_file.unlink()
    elif problem == "short":
        seed_file.write_text("5eed" * 8 + "\n")
    elif problem == "mode":
        seed_file.chmod(0o640)
    else:
        path.write_text(path.read_text().replace(str(seed_file), "''"))
    for command in (["reconcile", "--once"], ["reconcile", "--dry-run"], ["status"]):
        assert cli.main(["--values", str(path), *command]) == 2
        err = capsys.readouterr().err
        assert fix in err and err.count("\n") == 1, err
        assert "5eed" not in err
    assert double.request_count == 0 and double.writes == []


def test_the_service_reads_its_secrets_as_systemd_credentials(tmp_path, double, capsys, monkeypatch):
    """As the unit runs it: DynamicUser, LoadCredential=api-key:... and seed:..., and values
    that name neither file (the conffile's defaults)."""
    sid = double.add_vm("web1", "vms")
    path = write_values(tmp_path, double)
    (tmp_path / "api-key").unlink()
    path.write_text(path.read_text().replace(str(tmp_path / "seed"), "''"))
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    for name, text in (("api-key", double.api_key_text), ("seed", SEED)):
        (credentials / name).write_text(text + "\n")
        (credentials / name).chmod(0o440)  # 0400 plus the ACL entry for the service's user
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(credentials))
    assert cli.main(["--values", str(path), "reconcile", "--once"]) == 0
    out, err = capsys.readouterr()
    assert double.power[sid]["power_pass"] == derived("web1", "vms")
    assert "readable by group" not in err
    assert_no_secrets(double, out, err)


def test_the_docs_name_the_placeholder_the_code_uses():
    page = (Path(__file__).resolve().parents[1] / "docs" / "explanation" / "measurements.md").read_text()
    assert f"`{identity.PLACEHOLDER_PASSWORD}`" in page


# (not in test_render.py: the package build runs that file without docs/)
def test_the_docs_seed_rotation_commands_make_a_new_private_seed_and_render_with_it(tmp_path):
    page = (Path(__file__).resolve().parents[1] / "docs" / "how-to" / "rotate.md").read_text()
    section = page[page.index("## Rotate the seed"):]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    # The workstation's commands; the cluster's apply runs in test_docs.py on the control plane.
    block = "".join(line for line in block.splitlines(keepends=True) if not line.startswith("kubectl "))
    cli_command = f"{sys.executable} -m maas_kubevirt"
    script = block.replace(".venv/bin/maas-kubevirt", cli_command)
    assert script != block, "the rotation block no longer runs the CLI"
    assert subprocess.run([sys.executable, "-m", "maas_kubevirt", "render", "--output", "build"],
                          cwd=tmp_path, capture_output=True).returncode == 0
    old = (tmp_path / "build" / "seed").read_text()
    (tmp_path / "site.yaml").write_text("redfish:\n  domain: bmc.rotation.example\n")
    subprocess.run(["sh", "-eu", "-c", "umask 022\n" + script], cwd=tmp_path, check=True, capture_output=True)
    new = (tmp_path / "build" / "seed").read_text()
    assert new != old and (tmp_path / "build" / "seed").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "build" / "seed.old").read_text() == old
    assert "bmc.rotation.example" in (tmp_path / "build" / "kubernetes" / "kustomization.yaml").read_text() + "".join(
        p.read_text() for p in (tmp_path / "build" / "kubernetes").glob("policy-*.yaml"))
    assert not (tmp_path / "build" / "seed.new").exists()
    secret = (tmp_path / "build" / "kubernetes" / "seed-secret.yaml").read_text()
    assert new.strip() in secret and old.strip() not in secret

# --- cases a plausible bug would get wrong (issue 12) ---------------------------------------


def test_plan_does_not_depend_on_the_order_maas_lists_machines():
    machines = [machine("aaa", "web1-vms"), machine("bbb", "lucky-cat"), machine("ccc", "web2-vms", status="Ready"),
                machine("ddd", "x", pool="ops", pool_id=4)]
    power = {"aaa": addr("web2", "vms"), "bbb": addr("web1", "vms"), "ccc": addr("web3", "team-b"),
             "ddd": addr("web1", "team-b")}
    forward = plan(machines, power, ["default", "ops"], SETTINGS)
    assert kinds(forward) and plan(machines[::-1], power, ["ops", "default"], SETTINGS) == forward


def test_pool_given_as_a_name_string():
    power = {"aaa": addr("web1", "vms")}
    moved = plan([dict(machine("aaa", "web1-vms", status="Ready"), pool="default")], power, [owned("vms")], SETTINGS)
    assert [(a.kind, a.before, a.after) for a in moved] == [(MOVE_POOL, "default", "vms")]
    assert plan([dict(machine("aaa", "web1-vms", status="Ready"), pool="vms")], power, [], SETTINGS) == []
    kept = plan([dict(machine("aaa", "web1-vms", status="Ready"), pool="ops")], power, [], SETTINGS)
    assert [(a.kind, a.before) for a in kept] == [(SKIP, "ops")]


def test_existing_empty_namespace_pool_is_not_created_again(tmp_path, double, capsys):
    double.add_pool("vms", pool_description("vms"))   # made by an earlier cycle
    sid = double.add_vm("web1", "vms", hostname="web1-vms", status="Ready")
    assert kinds(plan([machine("aaa", "web1-vms", status="Ready")], {"aaa": addr("web1", "vms")}, ["default", owned("vms")],
                      SETTINGS)) == [MOVE_POOL]
    outcome = reconciler_for(double, full_list=True).cycle().outcome
    assert outcome.ok >= 1 and outcome.failed == 0
    assert ("POST", "resourcepools/") not in double.counts
    assert double.machines[sid]["pool"]["name"] == "vms"


@pytest.mark.parametrize("hostname", ["WEB1-VMS", "Web1-Vms"])
def test_upper_case_hostname_is_not_renamed(hostname):
    machines = [machine("aaa", hostname, status="Ready", pool="vms")]
    assert plan(machines, {"aaa": addr("web1", "vms")}, [owned("vms")], SETTINGS) == []


class RefusingClient:
    """A MAAS client whose every change is refused with one status, as when a machine moves on mid-cycle."""

    def __init__(self, status: int):
        self.status = status
        self.calls: list[str] = []

    def _refuse(self, method: str, path: str) -> None:
        self.calls.append(f"{method} {path}")
        raise MAASError(method, path, self.status, "the machine moved on")

    def create_pool(self, name, description):
        self._refuse("POST", "resourcepools/")

    def update_machine(self, system_id, hide=(), **fields):
        self._refuse("PUT", f"machines/{system_id}/")

    def commission(self, system_id, **options):
        self._refuse("POST", f"machines/{system_id}/?op=commission")


@pytest.mark.parametrize("status, machines, expected, requests", [
    # The rename and the pool move go in one PUT.
    (404, [machine("aaa", "lucky-cat")], [CREATE_POOL, RENAME, MOVE_POOL, COMMISSION], 3),
    (409, [machine("aaa", "lucky-cat", pool="vms", pool_id=3)], [RENAME, COMMISSION], 2),
])
def test_gone_or_conflict_between_plan_and_apply_is_a_skip(capsys, status, machines, expected, requests):
    actions = plan(machines, {"aaa": addr("web1", "vms")}, [], SETTINGS)
    assert kinds(actions) == expected
    client = RefusingClient(status)
    outcome = reconcile.apply(client, actions, Audit(""))
    assert (outcome.ok, outcome.skipped, outcome.failed) == (0, len(expected), 0)
    assert len(client.calls) == requests
    records = audit_records(capsys.readouterr().out)
    # A move whose pool was not created is recorded as it is held back, before its machine's PUT.
    assert sorted((r["action"], r["outcome"]) for r in records) == sorted((kind, "skipped") for kind in expected)


def test_id_left_out_of_a_bulk_power_parameters_reply_is_asked_for_again():
    class Partial:
        def __init__(self):
            self.asked: list[list[str]] = []

        def power_parameters(self, system_ids, reduce, hints=None):
            self.asked.append(sorted(system_ids))
            return {sid: addr("web1", "vms") for sid in system_ids if sid != "bbb" or len(self.asked) > 2}

    machines = [machine("aaa", "web1-vms", status="Ready"), machine("bbb", "web2-vms", status="Ready")]
    client = Partial()
    reconciler = Reconciler(client, SETTINGS, Audit(""), passwords=PASSWORDS)
    assert reconciler.power_facts(machines) == {"aaa": addr("web1", "vms")}
    assert reconciler.power_facts(machines) == {"aaa": addr("web1", "vms")}
    assert reconciler.power_facts(machines) == {"aaa": addr("web1", "vms"), "bbb": addr("web1", "vms")}
    assert reconciler.power_facts(machines) == {"aaa": addr("web1", "vms"), "bbb": addr("web1", "vms")}
    assert client.asked == [["aaa", "bbb"], ["bbb"], ["bbb"]]


# --- how a refused change is counted, and what a cycle re-reads --------------------------------


def refusal(status, message="refused"):
    return MAASError("POST", "machines/abc/", status, message)


@pytest.mark.parametrize("kind, status, message, result", [
    (RENAME, 404, "", "skipped"),              # the machine is gone: nothing to do
    (MOVE_POOL, 404, "", "skipped"),
    (SET_PASSWORD, 409, "", "skipped"),        # MAAS is busy with the machine: next cycle
    (MOVE_POOL, 409, "", "failed"),
    (SET_PASSWORD, 410, "", "failed"),
    (SET_PASSWORD, 400, "", "failed"),         # MAAS refused the password itself
    (COMMISSION, 400, "", "skipped"),          # the machine left New in between
    (COMMISSION, 409, "", "skipped"),
    (RENAME, 409, "", "skipped"),
    (COMMISSION, 503, "", "failed"),
    (CREATE_POOL, 400, "Resource pool with this Name already exists.", "skipped"),
    (CREATE_POOL, 400, "Name is not valid.", "failed"),
    (CREATE_POOL, 409, "Resource pool with this Name already exists.", "failed"),
    (MOVE_POOL, 400, "Resource pool with this Name already exists.", "failed"),
])
def test_a_refusal_is_a_skip_only_where_maas_moved_on(kind, status, message, result):
    action = Action(kind, "abc", "web-vms", "web", "vms", after="vms")
    assert reconcile._classify(action, refusal(status, message)) == result


def test_passwords_never_show_the_seed():
    assert repr(PASSWORDS) == "Passwords(<seed withheld>)" and SEED not in str(PASSWORDS)


def test_setting_a_password_without_the_seed_names_the_fix():
    action = Action(SET_PASSWORD, "abc", "web-vms", "web", "vms")
    with pytest.raises(ValueError) as raised:
        reconcile.apply(None, [action], Audit(""))
    assert str(raised.value) == "set-password needs the seed: pass apply(..., passwords=Passwords(seed))"


class NoClient:
    """A MAAS that must not be asked: any request fails the test."""

    def __getattr__(self, name):
        raise AssertionError(f"MAAS was asked ({name})")


# Commissioning and Testing, and New where a derived password is held (MAC enlistment re-points a
# machine in New or Commissioning with no event), or all of New under approved (tags are no event).
@pytest.mark.parametrize("commission, watched", [
    ("auto", {"ours-commissioning", "ours-testing", "ours-new"}),
    ("never", {"ours-commissioning", "ours-testing", "ours-new"}),
    ("approved", {"ours-commissioning", "ours-testing", "ours-new", "ours-new-placeholder"}),
])
def test_watched_are_ours_in_the_statuses_that_end_without_an_event(commission, watched):
    reconciler = Reconciler(NoClient(), Settings(domain=DOMAIN, commission=commission), passwords=PASSWORDS)
    reconciler.known = {
        "ours-commissioning": ("Commissioning", addr("a", "vms")),
        "ours-testing": ("Testing", addr("b", "vms")),
        "ours-new": ("New", addr("c", "vms")),
        "ours-new-placeholder": ("New", addr("e", "vms", password=PLACEHOLDER)),
        "ours-ready": ("Ready", addr("d", "vms")),
        "other-commissioning": ("Commissioning", Power("https://bmc.elsewhere.example/redfish/v1/Systems/1")),
        "unknown-address": ("Testing", Power(None)),
    }
    assert reconciler.watched() | reconciler.records_watched() == watched


def test_malformed_records_are_skipped_each_named_once(capsys):
    records = [GOOD_RECORD, dict(GOOD_RECORD, system_id=""), "junk", dict(GOOD_RECORD, system_id=7),
               dict(GOOD_RECORD, system_id="xyz", status="0")]
    reconciler = Reconciler(NoClient(), SETTINGS, passwords=PASSWORDS)
    assert reconciler.well_formed(records) == [GOOD_RECORD]
    assert capsys.readouterr().err.splitlines() == [
        "maas-kubevirt: warning: machine record 2 of 5 (no system_id): skipped, MAAS sent a malformed "
        "record (unusable system_id)",
        "maas-kubevirt: warning: machine record 3 of 5 (no system_id): skipped, MAAS sent a malformed "
        "record (not an object)",
        "maas-kubevirt: warning: machine record 4 of 5 (no system_id): skipped, MAAS sent a malformed "
        "record (unusable system_id)",
        "maas-kubevirt: warning: machine xyz: skipped, MAAS sent a malformed record (unusable status)",
    ]
    assert reconciler.well_formed(records) == [GOOD_RECORD]
    assert capsys.readouterr().err == "", "each once, not every cycle"


def test_without_an_audit_the_records_go_to_stdout_only(double, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    sid = double.add_vm("web1", "vms")
    Reconciler(MAASClient(double.url, Signer(*double.api_key), timeout=5), SETTINGS, passwords=PASSWORDS).cycle()
    assert {r["system_id"] for r in audit_records(capsys.readouterr().out)} >= {sid}
    assert os.listdir(tmp_path) == []


def test_reading_no_machine_asks_nothing_and_a_vanished_machine_is_forgotten(double):
    gone = double.add_vm("gone", "vms")
    kept = double.add_vm("kept", "vms")
    reconciler = Reconciler(NoClient(), SETTINGS, passwords=PASSWORDS)
    reconciler.known = {"elsewhere": ("Ready", addr("x", "vms"))}
    assert reconciler.read_by_id(set()) == []
    reconciler.client = MAASClient(double.url, Signer(*double.api_key), timeout=5)
    reconciler.known.update({gone: ("New", addr("gone", "vms")), kept: ("New", addr("kept", "vms"))})
    double.delete_machine(gone)
    assert [m["system_id"] for m in reconciler.read_by_id({gone, kept, "never-seen"})] == [kept]
    assert set(reconciler.known) == {"elsewhere", kept}


def test_settings_come_from_every_reconciler_value(tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text("redfish:\n  domain: BMC.Site.Example.\n"
                    "maas:\n  commission: approved\n  approval_tag: vm-ok\n  on_hostname_taken: skip\n"
                    "  cycle_deadline: 45\n  resync_interval: 900\n  concurrency: 3\n  adopt_pools: [gpu, ops]\n")
    assert Settings.from_values(load_values(str(site))) == Settings(
        domain="bmc.site.example", commission="approved", approval_tag="vm-ok", on_hostname_taken="skip",
        cycle_deadline=45, resync_interval=900, concurrency=3, adopt_pools=("gpu", "ops"))


def test_a_namespace_pool_says_what_it_is_for(double):
    double.add_vm("web", "vms")
    reconciler_for(double).cycle()
    assert double.pools["vms"]["description"] == "KubeVirt VMs of namespace vms (maas-kubevirt)"


def test_an_action_that_changes_nothing_is_never_sent(double):
    client = MAASClient(double.url, Signer(*double.api_key), timeout=5)
    for kind in (SKIP, DUPLICATE):
        with pytest.raises(ValueError) as raised:
            reconcile._perform(client, [Action(kind, "abc", "web-vms", "web", "vms")], PASSWORDS)
        assert str(raised.value) == f"unknown action {kind}"
    assert double.request_count == 0


class ScriptedClient:
    """MAAS as apply sees it: each call recorded; the pool and one password are refused."""

    def __init__(self):
        self.calls = []

    def create_pool(self, name, description=""):
        self.calls.append(("create_pool", name))
        raise MAASError("POST", "resourcepools/", 400, "Name is not valid.")

    def commission(self, system_id, skip_bmc_config=True):
        self.calls.append(("commission", system_id))

    def update_machine(self, system_id, hide=(), **fields):
        if "power_parameters_power_pass" in fields:
            self.calls.append(("password", system_id))
            raise MAASError("PUT", f"machines/{system_id}/", 503, "Service Unavailable")
        self.calls.append(("update_machine", system_id))
        if system_id == "gone":
            raise MAASError("PUT", "machines/gone/", 404, "Not Found")


def test_a_refused_pool_or_password_holds_back_only_what_depends_on_it():
    actions = [
        Action(CREATE_POOL, None, None, namespace="vms", after="vms"),
        Action(MOVE_POOL, "a", "a-vms", "a", "vms", "default", "vms"),
        Action(MOVE_POOL, "b", "b-vms", "b", "vms", "default", "vms"),
        Action(SET_PASSWORD, "c", "c-vms", "c", "vms", address="c.vms.bmc.example.com"),
        Action(RENAME, "gone", "old", "g", "vms", "old", "g-vms"),
        Action(COMMISSION, "c", "c-vms", "c", "vms"),
        Action(COMMISSION, "d", "d-vms", "d", "vms"),
        Action(RENAME, "e", "old", "e", "vms", "old", "e-vms"),
    ]
    client, audit = ScriptedClient(), RecordingAudit()
    outcome = reconcile.apply(client, actions, audit, passwords=PASSWORDS)
    assert (outcome.ok, outcome.skipped, outcome.failed, outcome.interrupted) == (2, 2, 4, False)
    assert client.calls == [("create_pool", "vms"), ("password", "c"), ("update_machine", "gone"), ("commission", "d"),
                            ("update_machine", "e")]
    assert audit.records == [
        (CREATE_POOL, None, "failed", "POST resourcepools/: 400: Name is not valid."),
        (MOVE_POOL, "a", "failed", "the pool vms could not be created"),
        (MOVE_POOL, "b", "failed", "the pool vms could not be created"),
        (SET_PASSWORD, "c", "failed", "PUT machines/c/: 503: Service Unavailable"),
        (RENAME, "gone", "skipped", "PUT machines/gone/: 404: Not Found"),
        (COMMISSION, "c", "skipped", "the BMC password is not in place: not commissioned"),
        (COMMISSION, "d", "ok", ""),
        (RENAME, "e", "ok", ""),
    ]
    assert [a.system_id for a in outcome.done] == ["d", "e"]


@pytest.mark.parametrize("kind", ["deadline", "interrupted"])
@pytest.mark.parametrize("in_flight, result", [(False, "failed"), (True, "unknown")])
def test_a_cycle_out_of_time_stops_at_once_and_says_whether_the_change_may_have_happened(kind, in_flight, result):
    class OutOfTime(ScriptedClient):
        def update_machine(self, system_id, hide=(), **fields):
            self.calls.append(("update_machine", system_id))
            raise MAASError("PUT", f"machines/{system_id}/", None, "stopped", kind, in_flight=in_flight)

    actions = [Action(RENAME, "a", "old", "a", "vms", "old", "a-vms"),
               Action(COMMISSION, "b", "b-vms", "b", "vms")]
    client, audit = OutOfTime(), RecordingAudit()
    outcome = reconcile.apply(client, actions, audit, passwords=PASSWORDS)
    assert client.calls == [("update_machine", "a")], "every later request would fail alike"
    assert audit.records == [(RENAME, "a", result, f"PUT machines/a/: {kind}: stopped")]
    assert (outcome.failed, outcome.interrupted) == (1, True)


# --- what a cycle reads before it acts ---------------------------------------------------------


def pool_reads(double):
    return double.counts[("GET", "resourcepools/")]


@pytest.mark.parametrize("namespace, pool", [
    ("default", "default"),   # a namespace named default: its pool is the default pool
    ("vms", "vms"),           # already filed
    ("vms", "special"),       # filed by an operator elsewhere: left there
])
def test_the_pools_are_read_only_when_a_machine_may_move(double, namespace, pool):
    if pool != "default":
        double.add_pool(pool)
    double.add_vm("web", namespace, hostname=f"web-{namespace}", pool=pool, status="Deployed",
                  **credentials("web", namespace))
    reconciler_for(double, full_list=True).cycle()
    assert pool_reads(double) == 0


def test_every_name_a_rename_may_take_is_asked_about(double):
    """Each machine to rename has its primary and fallback checked against devices and controllers."""
    double.add_node("alpha-vms", "device")
    double.add_node("beta-vms", "rack_controller")
    alpha = double.add_vm("alpha", "vms", hostname="a1", pool="vms", status="Deployed", **credentials("alpha", "vms"))
    beta = double.add_vm("beta", "vms", hostname="b1", pool="vms", status="Deployed", **credentials("beta", "vms"))
    actions = reconciler_for(double, full_list=True).cycle().actions
    renames = {a.system_id: a.after for a in actions if a.kind == RENAME}
    assert renames == {alpha: identity.fallback_hostname("alpha", "vms"), beta: identity.fallback_hostname("beta", "vms")}


class ChangingMAAS(MAASClient):
    """A MAAS that changes between a cycle's plan and its re-read of the machines about to change."""

    def __init__(self, double, change):
        super().__init__(double.url, Signer(*double.api_key), timeout=5)
        self.change, self.reads = change, 0

    def power_parameters(self, system_ids, reduce, hints=None):
        self.reads += 1
        if self.reads == 2:   # the first cycle's re-read before acting
            self.change()
        return super().power_parameters(system_ids, reduce, hints)


def test_machines_changed_before_the_re_read_are_left_alone_then_planned_afresh(double):
    web = double.add_vm("web", "vms", hostname="web-vms", pool="vms", status="Deployed")
    db = double.add_vm("db", "vms", hostname="db-vms", pool="vms", status="Deployed")

    def change():
        double.set_power_address(web, f"app.vms.{DOMAIN}")
        double.delete_machine(db)

    client = ChangingMAAS(double, change)
    reconciler = reconciler_for(double, full_list=True, client=client)
    first = reconciler.cycle().actions
    assert {(a.kind, a.system_id, a.hostname, a.vm) for a in first} == {
        (SKIP, db, "db-vms", "db"), (SKIP, web, "web-vms", "web")}
    assert {a.note for a in first} == {"power address changed since it was read: left alone until the next cycle"}
    assert double.power[web]["power_pass"] == identity.PLACEHOLDER_PASSWORD, "nothing was set"
    assert set(reconciler.known) == set()
    second = reconciler.cycle().actions
    assert {(a.kind, a.after) for a in second if a.changes} == {(SET_PASSWORD, "derived"), (RENAME, "app-vms")}


def test_a_plan_made_again_after_the_re_read_still_avoids_names_other_nodes_hold(double):
    """The re-read finds the password already set (by another run): the new plan keeps the
    fallback name, because a device holds the primary."""
    double.add_node("web-vms", "device")
    web = double.add_vm("web", "vms", hostname="w1", pool="vms", status="Deployed")
    client = ChangingMAAS(double, lambda: double.power[web].update(power_pass=derived("web", "vms"), power_user=derived_user("web", "vms")))
    reconciler = reconciler_for(double, full_list=True, client=client)
    actions = reconciler.cycle().actions
    assert [(a.kind, a.after) for a in actions if a.changes] == [(RENAME, identity.fallback_hostname("web", "vms"))]


def test_a_plan_made_again_after_the_re_read_keeps_what_it_says_of_the_other_machines(double):
    double.add_pool("special")
    filed = double.add_vm("db", "vms", hostname="db-vms", pool="special", status="Deployed",
                          **credentials("db", "vms"))
    web = double.add_vm("web", "vms", hostname="w1", pool="vms", status="Deployed")
    client = ChangingMAAS(double, lambda: double.power[web].update(power_pass=derived("web", "vms"), power_user=derived_user("web", "vms")))
    reconciler = reconciler_for(double, full_list=True, client=client)
    actions = reconciler.cycle().actions
    assert [(a.system_id, a.kind, a.note) for a in actions if a.system_id == filed] == [
        (filed, SKIP, "pool: in 'special', filed by an operator: left there")]
    assert [(a.system_id, a.kind) for a in actions if a.changes] == [(web, RENAME)]


# --- what is kept of a machine's power parameters ------------------------------------------------

OURS = f"web.vms.{DOMAIN}"
USER = PASSWORDS.user("web", "vms")


@pytest.mark.parametrize("parameters, power", [
    ({"power_address": OURS, "power_user": USER, "power_pass": derived("web", "vms")},
     Power(OURS, reconcile.RIGHT, user=reconcile.RIGHT)),
    ({"power_address": OURS, "power_user": "maas", "power_pass": derived("web", "vms")},
     Power(OURS, reconcile.RIGHT, user=reconcile.OTHER)),   # the old fixed user: the PUT replaces it
    ({"power_address": OURS, "power_user": PASSWORDS.user("db", "vms"), "power_pass": derived("web", "vms")},
     Power(OURS, reconcile.RIGHT, user=reconcile.OTHER)),   # another VM's derived user
    ({"power_address": OURS, "power_pass": identity.PLACEHOLDER_PASSWORD}, Power(OURS, reconcile.PLACEHOLDER,
                                                                              user=reconcile.OTHER)),
    ({"power_address": OURS, "power_user": USER, "power_pass": identity.PLACEHOLDER_PASSWORD},
     Power(OURS, reconcile.PLACEHOLDER, user=reconcile.RIGHT)),
    ({"power_address": OURS, "power_pass": derived("db", "vms")}, Power(OURS, reconcile.OTHER, user=reconcile.OTHER)),
    ({"power_address": OURS, "power_pass": ""}, Power(OURS, reconcile.UNSET, user=reconcile.OTHER)),
    ({"power_address": OURS}, Power(OURS, reconcile.UNSET, user=reconcile.OTHER)),
    ({"power_address": OURS, "power_user": 7, "power_pass": 12345},
     Power(OURS, reconcile.UNSET, user=reconcile.OTHER)),   # not text: never compared
    ({"power_address": "https://bmc.elsewhere.example/redfish/v1/Systems/1", "power_pass": "x"},
     Power("https://bmc.elsewhere.example/redfish/v1/Systems/1", reconcile.UNKNOWN)),  # not ours: not judged
    ({"power_address": 12345, "power_pass": derived("web", "vms")}, Power(None, reconcile.UNKNOWN)),
    ({}, Power(None, reconcile.UNKNOWN)),
])
def test_power_parameters_are_reduced_to_the_address_and_a_verdict(parameters, power):
    """The parameter names are kept too (they follow the power type); no value is."""
    assert PASSWORDS.judge(parameters, DOMAIN) == dataclasses.replace(power, names=tuple(sorted(parameters)))


def test_a_note_on_a_machine_left_alone_is_printed_once_until_it_changes(double, capsys):
    double.add_pool("special")
    double.add_vm("web", "vms", hostname="web-vms", pool="special", status="Deployed", **credentials("web", "vms"))
    reconciler = reconciler_for(double, full_list=True)
    reconciler.cycle()
    reconciler.cycle()
    assert capsys.readouterr().err.count("pool: in 'special', filed by an operator: left there") == 1


def test_only_a_password_set_is_remembered_as_right(double):
    """The rename went through, the password did not: the next cycle must still see it wrong."""
    class NoPassword(MAASClient):
        def update_machine(self, system_id, hide=(), **fields):
            if "power_parameters_power_pass" in fields and "hostname" in fields:  # the PUT of both: refused
                raise MAASError("PUT", f"machines/{system_id}/", 400, "hostname: refused with the password")
            if "power_parameters_power_pass" in fields:
                raise MAASError("PUT", f"machines/{system_id}/", 503, "Unable to connect to any rack controller")
            return super().update_machine(system_id, hide=hide, **fields)

    sid = double.add_vm("web", "vms", hostname="w1", pool="vms", status="Deployed")
    client = NoPassword(double.url, Signer(*double.api_key), timeout=5)
    reconciler = reconciler_for(double, full_list=True, client=client)
    outcome = reconciler.cycle().outcome
    assert (outcome.ok, outcome.failed) == (1, 1)
    assert double.machines[sid]["hostname"] == "web-vms"
    assert reconciler.known[sid][1].password == reconcile.PLACEHOLDER


def test_an_interrupted_cycle_is_quiet_and_a_failed_one_says_why(double, capsys):
    reconciler = reconciler_for(double, full_list=True)
    double.inject("hang", path=r"^machines/$", hang=3)
    threading.Timer(0.3, reconciler.client.stop.set).start()   # SIGTERM during the cycle
    assert "interrupted" in reconciler.cycle().error
    assert "cycle failed" not in capsys.readouterr().err
    reconciler.client.stop.clear()
    double.inject("500", path=r"^machines/$", count=10)
    result = reconciler.cycle()
    assert result.error and f"cycle failed: {result.error}" in capsys.readouterr().err


def test_a_resync_off_the_schedule_says_why(double, capsys):
    reconciler = reconciler_for(double)
    reconciler.cycle()
    capsys.readouterr()
    reconciler.log.request_resync("the event ids have a gap")
    reconciler.cycle()
    assert "full resync: the event ids have a gap" in capsys.readouterr().err
    assert reconciler.resyncs == 2


# --- a machine whose password was set before the derived user was ---------------------------------


@pytest.mark.parametrize("user", [{"user": reconcile.OTHER}, {}], ids=["another-user", "user-not-judged"])
def test_the_right_password_beside_another_user_still_gets_the_derived_user(user):
    """Set up before the derived user existed: the password alone is no convergence."""
    machines = [machine("aaa", "web1-vms", status="Deployed", pool="vms")]
    power = {"aaa": Power(f"web1.vms.{DOMAIN}", RIGHT, **user)}
    assert plan(machines, power, [owned("vms")], SETTINGS) == [
        Action(SET_PASSWORD, "aaa", "web1-vms", "web1", "vms", RIGHT, reconcile.DERIVED,
               note="the BMC user is not the derived one")]


def test_a_cycle_gives_a_machine_with_the_right_password_its_derived_user(double):
    sid = double.add_vm("web1", "vms", hostname="web1-vms", pool="vms", status="Deployed",
                        password=derived("web1", "vms"), power_user="maas")
    outcome = reconciler_for(double, full_list=True).cycle().outcome
    assert (outcome.ok, outcome.failed) == (1, 0)
    (put,) = [fields for method, target, fields in double.writes if (method, target) == ("PUT", sid)]
    assert put["power_parameters_power_user"] == derived_user("web1", "vms")
    assert double.power[sid]["power_user"] == derived_user("web1", "vms")
    assert double.power[sid]["power_pass"] == derived("web1", "vms")
