"""The reconciler: the pure plan, apply with audit records, the CLI entry points, the loop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from maas_double import MaasDouble, populate  # noqa: E402
from reconcile_helpers import (  # noqa: E402
    DOMAIN,
    Args,
    add_noise,
    assert_no_secrets,
    audit_records,
    converged,
    values_for,
    write_values,
)

from maas_kubevirt import cli, identity, loop, maas, reconcile, status  # noqa: E402
from maas_kubevirt.maas import MAASClient, RetryPolicy, Signer  # noqa: E402
from maas_kubevirt.reconcile import (  # noqa: E402
    COMMISSION,
    CREATE_POOL,
    MOVE_POOL,
    RENAME,
    SKIP,
    Action,
    Audit,
    Reconciler,
    Settings,
    plan,
)
from maas_kubevirt.values import ValuesError  # noqa: E402

SETTINGS = Settings(domain=DOMAIN)


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch):
    monkeypatch.setattr(maas, "RETRY", RetryPolicy(attempts=3, backoff=0.01, max_backoff=0.05,
                                                         max_retry_after=0.05))
    monkeypatch.delenv("MAAS_API_KEY", raising=False)


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


def addr(vm, ns, domain=DOMAIN):
    return f"https://{vm}.{ns}.{domain}/redfish/v1/Systems/1"


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
    actions = plan(machines, {"aaa": {"power_address": addr("web1", "vms")}}, [{"name": "vms", "id": 3}],
                   SETTINGS)
    assert kinds(actions) == [RENAME, MOVE_POOL, COMMISSION]


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
    assert plan(machines, power, ["default"], SETTINGS) == []


def test_address_forms_that_match():
    for address in ("web1.vms.bmc.example.com", "http://WEB1.vms.BMC.example.com:8443/redfish/v1/Systems/1",
                    "https://web1.vms.bmc.example.com."):
        actions = plan([machine("aaa", "web1-vms", pool="vms", status="Ready")], {"aaa": address}, [], SETTINGS)
        assert actions == []  # already converged, and matched (no error)
        actions = plan([machine("aaa", "x")], {"aaa": address}, ["vms"], SETTINGS)
        assert kinds(actions) == [RENAME, MOVE_POOL, COMMISSION], address


def test_converged_machine_needs_nothing():
    machines = [machine("aaa", "web1-vms", status="Deployed", pool="vms")]
    assert plan(machines, {"aaa": addr("web1", "vms")}, ["vms"], SETTINGS) == []


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


def test_two_machines_of_one_vm_never_claim_one_name():
    machines = [machine("aaa", "one", status="Ready", pool="vms"),
                machine("bbb", "two", status="Ready", pool="vms"),
                machine("ccc", "three", status="Ready", pool="vms")]
    power = {sid: addr("web1", "vms") for sid in ("aaa", "bbb", "ccc")}
    actions = plan(machines, power, [], SETTINGS)
    assert [(a.system_id, a.kind, a.after) for a in actions] == [
        ("aaa", RENAME, "web1-vms"),
        ("bbb", RENAME, identity.fallback_hostname("web1", "vms")),
        ("ccc", SKIP, "three"),
    ]


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


def test_once_converges_and_audits(tmp_path, double, capsys):
    noise = add_noise(double)
    vms = [double.add_vm("web1", "vms"), double.add_vm("db.primary", "vms"), double.add_vm("web1", "team-b")]
    values = values_for(tmp_path, double)
    code, out, err = run(capsys, loop.main, values, Args(once=True))
    assert code == 0, err
    records = audit_records(out)
    assert {r["action"] for r in records} == {CREATE_POOL, RENAME, MOVE_POOL, COMMISSION}
    for record in records:
        assert list(record)[:7] == ["time", "system_id", "hostname", "action", "before", "after", "outcome"]
        assert record["outcome"] == "ok"
        assert record["time"].endswith("Z")
    assert len(records) == 2 + 3 * 3
    assert audit_records((tmp_path / "audit.log").read_text()) == records
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
    reconciler = Reconciler(client, SETTINGS, Audit(""))
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
        double.add_vm(f"vm{i}", ns, hostname=identity.maas_hostname(f"vm{i}", ns), pool=ns, status="Deployed")
    client = MAASClient(double.url, Signer(*double.api_key), timeout=30)
    reconciler = Reconciler(client, SETTINGS, Audit(""))
    started = time.monotonic()
    assert reconciler.cycle().actions == []
    double.reset_counts()
    assert reconciler.cycle().actions == []
    assert double.request_count <= 2
    assert time.monotonic() - started < 30
    assert all("S3CRET" not in str(v) for v in reconciler.known.values())


def test_power_parameters_refetched_only_for_new_or_changed(double):
    a = double.add_vm("web1", "vms", status="Ready", pool="vms", hostname="web1-vms")
    client = MAASClient(double.url, Signer(*double.api_key), timeout=5)
    reconciler = Reconciler(client, SETTINGS, Audit(""))
    reconciler.cycle()
    double.reset_counts()
    double.add_vm("web2", "vms", status="Ready", pool="vms", hostname="web2-vms")
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

    result = Reconciler(client, SETTINGS, StopAfterFirst(""), stop).cycle()
    assert result.outcome.ok == 1 and result.outcome.interrupted
    assert sum(double.machines[sid]["hostname"].endswith("-vms") for sid in ids) == 1


def test_failed_action_does_not_stop_the_rest(tmp_path, double, capsys):
    a = double.add_vm("web1", "vms", pool="vms", status="Ready")
    b = double.add_vm("web2", "vms", pool="vms", status="Ready")
    double.inject("500", method="PUT", path=f"machines/{a}/")
    values = values_for(tmp_path, double)
    code, out, err = run(capsys, loop.main, values, Args(once=True))
    assert code == 1
    records = {r["system_id"]: r for r in audit_records(out)}
    assert records[a]["outcome"] == "failed"
    assert records[a]["reason"] == f"PUT machines/{a}/: 500: Internal Server Error"
    assert records[b]["outcome"] == "ok"
    code, out, err = run(capsys, loop.main, values, Args(once=True))
    assert code == 0 and converged(double, [a, b])


def test_failed_pool_creation_fails_its_moves_without_requests(tmp_path, double, capsys):
    a = double.add_vm("web1", "vms", hostname="web1-vms", status="Ready")
    double.inject("500", method="POST", path="resourcepools/")
    code, out, err = run(capsys, loop.main, values_for(tmp_path, double), Args(once=True))
    assert code == 1
    outcomes = [(r["action"], r["outcome"]) for r in audit_records(out)]
    assert outcomes == [(CREATE_POOL, "failed"), (MOVE_POOL, "failed")]
    assert ("PUT", f"machines/{{id}}/") not in double.counts
    assert double.machines[a]["pool"]["name"] == "default"


def test_pool_created_meanwhile_is_fine(tmp_path, double, capsys):
    a = double.add_vm("web1", "vms", hostname="web1-vms", status="Ready")
    values = values_for(tmp_path, double)
    client = MAASClient(double.url, Signer(*double.api_key), timeout=5)
    actions = Reconciler(client, SETTINGS).make_plan()
    double.add_pool("vms")
    outcome = reconcile.apply(client, actions, Audit(""))
    out = capsys.readouterr().out
    assert (outcome.ok, outcome.skipped, outcome.failed) == (1, 1, 0)
    assert [r["outcome"] for r in audit_records(out)] == ["skipped", "ok"]
    assert double.machines[a]["pool"]["name"] == "vms"
    assert values  # values file written for the double


def test_dry_run_prints_a_table_and_changes_nothing(tmp_path, double, capsys):
    add_noise(double)
    double.add_vm("web1", "vms")
    code, out, err = run(capsys, loop.main, values_for(tmp_path, double),
                         Args(dry_run=True))
    assert code == 0
    assert double.writes == []
    assert audit_records(out) == []
    assert "ACTION" in out and "web1-vms" in out and "create-pool" in out
    assert "4 change(s) planned for 1 machine(s); dry run: nothing changed" in out
    assert not (tmp_path / "audit.log").exists() or (tmp_path / "audit.log").read_text() == ""
    assert_no_secrets(double, out, err)


def test_status_table(tmp_path, double, capsys):
    add_noise(double)
    sid = double.add_vm("web1", "vms", hostname="web1-vms", pool="vms", status="Deployed")
    double.machines[sid]["power_state"] = "on"
    code, out, err = run(capsys, status.main, values_for(tmp_path, double), Args())
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["VM", "NAMESPACE", "HOSTNAME", "SYSTEM_ID", "STATUS", "POOL", "POWER"]
    assert lines[1].split() == ["web1", "vms", "web1-vms", sid, "Deployed", "vms", "on"]
    assert lines[2] == "1 MAAS machine(s) with a Redfish power address under bmc.example.com"
    assert_no_secrets(double, out, err)


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
    with pytest.raises(ValuesError, match="maas.audit_log: expected a file the reconciler can append to"):
        loop.main(values, Args(once=True))


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
    assert len(audit_records(out)) == 1 + 3 * 3
    assert_no_secrets(double, out, err)


def test_a_name_freed_in_the_plan_is_taken_after_it_is_freed(tmp_path, double, capsys):
    # "web1-vms" is held by the machine of VM web2; that machine is renamed away first.
    a = double.add_vm("web1", "vms", hostname="lucky-cat", pool="vms", status="Ready")
    b = double.add_vm("web2", "vms", hostname="web1-vms", pool="vms", status="Ready")
    client = MAASClient(double.url, Signer(*double.api_key), timeout=5)
    actions = Reconciler(client, SETTINGS).make_plan()
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
