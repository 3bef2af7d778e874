"""The reconciler under injected MAAS faults: it keeps running, never writes to a machine that
is not ours, converges once the fault clears, and no secret reaches any output channel."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from maas_double import MaasDouble  # noqa: E402
from reconcile_helpers import (  # noqa: E402
    DOMAIN,
    SEED,
    credentials,
    derived_user,
    derived,
    add_noise,
    assert_no_secrets,
    audit_records,
    converged,
    matching_ids,
    write_values,
)

from maas_kubevirt import cli, maas  # noqa: E402
from maas_kubevirt.maas import MAASClient, RetryPolicy, Signer  # noqa: E402
from maas_kubevirt.reconcile import Audit, Passwords, Reconciler, Settings  # noqa: E402

# Wall-clock bounds: run after the parallel workers, with the machine to itself (tests/conftest.py).
pytestmark = pytest.mark.timing

MACHINE = r"^machines/[^/?]+/$"
FAULTS = [
    ("503", r"^machines/$", 3), ("503", "power_parameters", 3), ("503", "op=commission", 3),
    ("503", "^resourcepools/$", 3), ("503", "^version/$", 3), ("503", MACHINE, 1),
    ("500", r"^machines/$", 1), ("500", "power_parameters", 1), ("500", MACHINE, 2),
    ("500", "op=commission", 2), ("500", "^resourcepools/$", 1),
    ("hang", r"^machines/$", 3), ("hang", "power_parameters", 1), ("hang", MACHINE, 1),
    ("hang", "op=commission", 1),
    ("reset", r"^machines/$", 3), ("reset", "power_parameters", 3), ("reset", MACHINE, 3),
    ("reset", "op=commission", 1), ("reset", "^resourcepools/$", 1),
    ("malformed", r"^machines/$", 1), ("malformed", "power_parameters", 2), ("malformed", MACHINE, 2),
    ("malformed", "op=commission", 1), ("malformed", "^version/$", 1), ("malformed", "^resourcepools/$", 1),
    ("race-commission", None, 2), ("race-rename", None, 2),
]


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch):
    monkeypatch.setattr(maas, "RETRY", RetryPolicy(attempts=3, backoff=0.01, max_backoff=0.05,
                                                         max_retry_after=0.05))
    monkeypatch.delenv("MAAS_API_KEY", raising=False)
    monkeypatch.delenv("MAAS_KUBEVIRT_DEBUG", raising=False)


def fleet(double: MaasDouble) -> tuple[list[str], list[str]]:
    noise = add_noise(double)
    double.add_machine("web9-vms", power_type="ipmi", power_pass="ipmi-S3CRET-held", status="Deployed")
    vms = [
        double.add_vm("web1", "vms"),
        double.add_vm("web2", "vms", tag_names=["kubevirt-approved"]),
        double.add_vm("db.primary", "team-b"),
        double.add_vm("web9", "vms"),               # its primary name is held: fallback
        double.add_vm("old", "vms", status="Deployed", pool="ops"),
    ]
    return vms, noise


def wait_out_backoffs(audit_log: Path) -> None:
    """Sleep until the last commission backoff in the audit log is over (maas.interval is 1 s here)."""
    records = audit_records(audit_log.read_text()) if audit_log.exists() else []
    ends = [datetime.strptime(r["retry_at"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()
            for r in records if "retry_at" in r]
    if ends:
        time.sleep(min(3.0, max(0.0, max(ends) - time.time())))


def run_cli(capsys, argv):
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("kind, path, count", FAULTS, ids=[f"{k}-{p}-{c}" for k, p, c in FAULTS])
def test_once_under_fault(tmp_path, capsys, kind, path, count):
    with MaasDouble() as double:
        vms, noise = fleet(double)
        ours = matching_ids(double)
        values = write_values(tmp_path, double, timeout=1)
        double.inject(kind, path=path, count=count, retry_after="1", hang=1.3)
        outputs = []
        codes = []
        for _ in range(6):
            code, out, err = run_cli(capsys, ["--values", str(values), "reconcile", "--once"])
            codes.append(code)
            outputs += [out, err]
            assert code in (0, 1), err
            assert "internal error" not in err and "Traceback" not in err
            for line in err.splitlines():
                assert line.startswith("maas-kubevirt: "), line
            if code == 0 and not double.faults and converged(double, vms[:4]):
                break
            wait_out_backoffs(tmp_path / "audit.log")
        assert not double.faults, "the fault was never hit"
        assert converged(double, vms[:4]), codes
        assert double.machines[vms[4]]["pool"]["name"] == "ops"
        touched = {w[1] for w in double.writes if not w[1].endswith("/")}
        assert touched <= ours and not touched & set(noise)
        # Converged: one more run changes nothing.
        code, out, err = run_cli(capsys, ["--values", str(values), "reconcile", "--once"])
        assert code == 0 and audit_records(out) == []
        outputs += [out, err, (tmp_path / "audit.log").read_text()]
        assert_no_secrets(double, *outputs)
        for record in audit_records((tmp_path / "audit.log").read_text()):
            if record["outcome"] == "refused":  # the look-alike in the noise, named
                assert record["action"] == "suspect-address" and record["system_id"] in noise
                continue
            assert record["outcome"] in ("ok", "skipped", "failed", "unknown")
            assert record["system_id"] in ours or record["action"] == "create-pool"


def test_race_rename_ends_on_the_fallback(tmp_path, capsys):
    with MaasDouble() as double:
        sid = double.add_vm("web1", "vms")
        values = write_values(tmp_path, double)
        double.inject("race-rename")
        code, out, err = run_cli(capsys, ["--values", str(values), "reconcile", "--once"])
        assert code == 0
        (rename,) = [r for r in audit_records(out) if r["action"] == "rename"]
        assert rename["outcome"] == "skipped" and "hostname: Node with this Hostname already exists." in rename["reason"]
        code, out, err = run_cli(capsys, ["--values", str(values), "reconcile", "--once"])
        assert double.machines[sid]["hostname"].startswith("web1-vms-")
        (rename,) = [r for r in audit_records(out) if r["action"] == "rename"]
        assert "web1-vms is held by" in rename["note"] and "fallback" in rename["note"]


def test_race_commission_is_a_skip(tmp_path, capsys):
    with MaasDouble() as double:
        sid = double.add_vm("web1", "vms")
        values = write_values(tmp_path, double)
        double.inject("race-commission")
        code, out, err = run_cli(capsys, ["--values", str(values), "reconcile", "--once"])
        assert code == 0
        (record,) = [r for r in audit_records(out) if r["action"] == "commission"]
        assert record["outcome"] == "skipped"
        assert record["reason"].endswith(
            "400: Commission is not available because of the current state of the node.")
        assert double.machines[sid]["status_name"] == "Commissioning"


def test_loop_keeps_running_through_every_fault(tmp_path, capsys):
    """One long-lived Reconciler (the loop's body) across a storm of faults, then convergence."""
    with MaasDouble() as double:
        vms, noise = fleet(double)
        ours = matching_ids(double)
        client = MAASClient(double.url, Signer(*double.api_key), timeout=1,
                            retry=RetryPolicy(attempts=2, backoff=0.01, max_retry_after=0.01))
        # A commission refused waits one interval: a short one, so the storm passes in a few cycles.
        reconciler = Reconciler(client, Settings(domain=DOMAIN, interval=0.001), Audit(str(tmp_path / "audit.log")),
                                passwords=Passwords(SEED))
        for kind, path, count in FAULTS:
            # (hangs cost real seconds; renames raced twice may leave a machine with both of its
            # names held, a skip by design, covered in test_once_under_fault)
            if kind not in ("hang", "race-rename"):
                double.inject(kind, path=path, count=count)
        double.inject("race-rename", count=1)
        for _ in range(40):
            reconciler.cycle()  # never raises for a transient fault
            double.advance()
            if not double.faults and converged(double, vms[:4]):
                break
        assert converged(double, vms[:4]), ([double.machines[v] for v in vms], double.faults)
        assert {w[1] for w in double.writes if not w[1].endswith("/")} <= ours
        out, err = capsys.readouterr()
        assert_no_secrets(double, out, err, (tmp_path / "audit.log").read_text())
        assert not any(a.changes for a in reconciler.cycle().actions)


@pytest.mark.parametrize("kind", ["503", "500", "reset", "malformed"])
def test_status_under_fault(tmp_path, capsys, kind):
    with MaasDouble() as double:
        fleet(double)
        values = write_values(tmp_path, double)
        double.inject(kind, path="power_parameters", count=3 if kind in ("503", "reset") else 1)
        code, out, err = run_cli(capsys, ["--values", str(values), "status"])
        assert code == 1 and "internal error" not in err
        assert err.startswith("maas-kubevirt: error: GET machines/?op=power_parameters: ")
        code, out, err2 = run_cli(capsys, ["--values", str(values), "status"])
        assert code == 0 and "web1" in out
        assert_no_secrets(double, out, err, err2)


def test_dry_run_under_fault_changes_nothing(tmp_path, capsys):
    with MaasDouble() as double:
        fleet(double)
        values = write_values(tmp_path, double)
        double.inject("malformed", path="power_parameters")
        code, out, err = run_cli(capsys, ["--values", str(values), "reconcile", "--dry-run"])
        assert code == 1 and double.writes == []
        code, out, err2 = run_cli(capsys, ["--values", str(values), "reconcile", "--dry-run"])
        assert code == 0 and double.writes == [] and "web1-vms" in out
        assert_no_secrets(double, out, err, err2)


# --- issue 10: MAAS as it is, and a bad MAAS -------------------------------------------------


def test_hostname_held_by_a_device_takes_the_fallback_at_once(tmp_path, capsys):
    """machines/ does not list devices; nodes/ does: the first cycle plans the fallback."""
    with MaasDouble() as double:
        sid = double.add_vm("web1", "vms")
        device = double.add_node("web1-vms", "device")
        values = write_values(tmp_path, double)
        code, out, err = run_cli(capsys, ["--values", str(values), "reconcile", "--once"])
        assert code == 0, err
        (rename,) = [r for r in audit_records(out) if r["action"] == "rename"]
        assert rename["outcome"] == "ok" and rename["after"].startswith("web1-vms-")
        assert f"web1-vms is held by {device}" in rename["note"]
        assert double.counts[("GET", "nodes/")] == 1
        assert not any(w for w in double.writes if w[2].get("hostname") == "web1-vms")
        # Idle: no nodes/ request.
        double.reset_counts()
        code, out, err = run_cli(capsys, ["--values", str(values), "reconcile", "--once"])
        assert code == 0 and ("GET", "nodes/") not in double.counts
        assert double.machines[sid]["hostname"] == rename["after"]


def test_hostname_held_by_a_controller_with_skip_is_skipped_never_tried(tmp_path, capsys):
    with MaasDouble() as double:
        sid = double.add_vm("web1", "vms")
        rack = double.add_node("web1-vms", "rack_controller")
        values = write_values(tmp_path, double, on_hostname_taken="skip")
        for _ in range(2):
            double.reset_counts()
            code, out, err = run_cli(capsys, ["--values", str(values), "reconcile", "--once"])
            assert code == 0 and not [r for r in audit_records(out) if r["action"] == "rename"]
            assert f"rename: web1-vms is held by {rack} (maas.on_hostname_taken: skip)" in err
            assert double.counts[("GET", "nodes/")] == 1
        assert not [w for w in double.writes if "hostname" in w[2]]
        assert double.machines[sid]["hostname"] != "web1-vms"


def test_409_retry_after_is_retried_within_the_cycle(tmp_path, capsys):
    with MaasDouble() as double:
        vms, _ = fleet(double)
        values = write_values(tmp_path, double)
        double.inject("409", method="PUT", count=2)
        code, out, err = run_cli(capsys, ["--values", str(values), "reconcile", "--once"])
        assert code == 0, err
        assert all(r["outcome"] == "ok" for r in audit_records(out) if r["action"] != "suspect-address")
        assert not double.faults and converged(double, vms[:4])


@pytest.mark.parametrize("record, problem", [
    ({"hostname": "ghost"}, "(no system_id)"),
    ("not a machine", "(no system_id)"),
    ({"system_id": "bad001", "hostname": "x", "power_type": "redfish", "status_name": "New", "status": 0,
      "pool": None, "tag_names": []}, "machine bad001: skipped"),
    ({"system_id": "bad002", "hostname": "x", "power_type": "redfish", "status_name": "New", "status": "0",
      "pool": {"name": "default", "id": 0}, "tag_names": []}, "machine bad002: skipped"),
])
def test_a_malformed_record_never_aborts_the_cycle(tmp_path, capsys, record, problem):
    with MaasDouble() as double:
        vms, _ = fleet(double)
        double.extra_records.append(record)
        values = write_values(tmp_path, double)
        code, out, err = run_cli(capsys, ["--values", str(values), "reconcile", "--once"])
        assert code == 0, err
        assert converged(double, vms[:4])
        (warning,) = [line for line in err.splitlines() if "malformed record" in line]
        assert warning.startswith("maas-kubevirt: warning: ") and problem in warning


def test_a_malformed_record_is_warned_about_once(tmp_path, capsys):
    with MaasDouble() as double:
        double.add_vm("web1", "vms")
        sid = double.add_vm("web2", "vms")
        double.machines[sid]["tag_names"] = "kubevirt-approved"
        client = MAASClient(double.url, Signer(*double.api_key), timeout=2)
        reconciler = Reconciler(client, Settings(domain=DOMAIN), Audit(""), passwords=Passwords(SEED))
        for _ in range(3):
            assert not reconciler.cycle().failed
        err = capsys.readouterr().err
        assert err.count(f"machine {sid}: skipped") == 1 and "unusable tag_names" in err
        assert double.machines[sid]["hostname"] != "web2-vms"  # never touched


def test_tag_names_as_a_string_never_approves(tmp_path, capsys):
    """"not-kubevirt-approved" holds "kubevirt-approved" as a substring, not as a tag."""
    with MaasDouble() as double:
        sid = double.add_vm("web1", "vms")
        double.machines[sid]["tag_names"] = "not-kubevirt-approved"
        values = write_values(tmp_path, double, commission="approved")
        code, out, err = run_cli(capsys, ["--values", str(values), "reconcile", "--once"])
        assert code == 0 and double.machines[sid]["status_name"] == "New"
        assert not [w for w in double.writes if w[2].get("op") == "commission"]


def test_response_over_the_cap_fails_the_cycle_with_the_key_to_raise(tmp_path, capsys):
    with MaasDouble() as double:
        for i in range(300):        # a real machine object is 10-20 KB: several MiB in all
            double.add_machine(power_type="ipmi", status="Deployed")
        values = write_values(tmp_path, double, max_response_mib=1, timeout=10)
        code, out, err = run_cli(capsys, ["--values", str(values), "reconcile", "--once"])
        assert code == 1
        assert "GET machines/: too-large: response body larger than maas.max_response_mib (1 MiB" in err
        assert double.counts[("GET", "machines/")] == 1   # never retried


def test_cycle_deadline_bounds_a_hanging_maas():
    with MaasDouble() as double:
        double.add_vm("web1", "vms")
        double.inject("hang", path=r"^machines/$", hang=8)
        client = MAASClient(double.url, Signer(*double.api_key), timeout=30)
        reconciler = Reconciler(client, Settings(domain=DOMAIN, cycle_deadline=1), Audit(""),
                                passwords=Passwords(SEED))
        started = time.monotonic()
        result = reconciler.cycle()
        assert time.monotonic() - started < 5  # the 1 s deadline, not the 8 s hang
        assert result.failed and "deadline" in result.error
        double.clear_faults()
        assert not reconciler.cycle().failed  # the next cycle has its own deadline


HOSTILE = "bad\x1b[2J\x1b]0;pwned\x07 \u202eevil"


def test_maas_error_text_is_printed_escaped(tmp_path, capsys):
    with MaasDouble() as double:
        double.add_vm("web1", "vms")
        values = write_values(tmp_path, double)
        double.inject("reply", path=r"^machines/$", status=400, body=HOSTILE)
        code, out, err = run_cli(capsys, ["--values", str(values), "reconcile", "--once"])
        assert code == 1 and all(line.isprintable() for line in err.splitlines())
        assert "cycle failed: GET machines/: 400: bad\\x1b[2J\\x1b]0;pwned\\x07 \\u202eevil" in err
        # In an audit record's reason too (the JSON line then carries the escape as text).
        double.inject("reply", method="POST", path="resourcepools/", status=400, body={"name": [HOSTILE]})
        code, out, err = run_cli(capsys, ["--values", str(values), "reconcile", "--once"])
        (record,) = [r for r in audit_records(out) if r["action"] == "create-pool"]
        assert record["reason"] == "POST resourcepools/: 400: name: bad\\x1b[2J\\x1b]0;pwned\\x07 \\u202eevil"


def test_not_admin_exits_2_with_maas_message(tmp_path, capsys):
    with MaasDouble() as double:
        double.add_vm("web1", "vms")
        double.admin = False
        values = write_values(tmp_path, double)
        code, out, err = run_cli(capsys, ["--values", str(values), "reconcile", "--once"])
        assert code == 2 and double.writes == []
        assert err == ("maas-kubevirt: error: GET users/?op=whoami: not-admin: the API key's user 'admin' is not "
                       "a MAAS administrator: use an administrator's key (`maas apikey --username ADMIN`)\n")


def test_key_file_with_several_keys_exits_2_saying_how_to_choose(tmp_path, capsys):
    with MaasDouble() as double:
        values = write_values(tmp_path, double)
        key = tmp_path / "api-key"
        key.write_text(double.api_key_text + "\nc2:t2:other-S3CRET\n")
        code, out, err = run_cli(capsys, ["--values", str(values), "status"])
        assert code == 2 and double.request_count == 0
        assert "expected one MAAS API key" in err and "--with-names" in err
        assert_no_secrets(double, out, err)
        assert "other-S3CRET" not in err


def test_bad_env_key_exits_2_naming_the_variable(tmp_path, capsys, monkeypatch):
    with MaasDouble() as double:
        values = write_values(tmp_path, double)
        monkeypatch.setenv("MAAS_API_KEY", "not-a-key")
        code, out, err = run_cli(capsys, ["--values", str(values), "status"])
        assert code == 2 and err.startswith("maas-kubevirt: error: MAAS_API_KEY: expected")
        assert "api_key_file" not in err and "not-a-key" not in err


def test_plaintext_url_off_loopback_warns(tmp_path, capsys):
    with MaasDouble() as double:
        # TEST-NET-1: never answers; the warning comes before the first request.
        values = write_values(tmp_path, double, url="http://192.0.2.1:5240/MAAS/", timeout=1)
        code, out, err = run_cli(capsys, ["--values", str(values), "status"])
        assert code == 1
        (warning,) = [line for line in err.splitlines() if "PLAINTEXT" in line]
        assert "maas.url is http:// on 192.0.2.1" in warning and "token secret" in warning
        values = write_values(tmp_path, double)
        code, out, err = run_cli(capsys, ["--values", str(values), "status"])
        assert code == 0 and "PLAINTEXT" not in err


def test_sigterm_during_a_hanging_request_exits_without_waiting_it_out(tmp_path):
    """The real thing: a subprocess in the middle of a request that MAAS answers only after 60 s.
    It must end well before that; the bound leaves a loaded machine room to tear an interpreter down."""
    with MaasDouble() as double:
        double.add_vm("web1", "vms")
        values = write_values(tmp_path, double, timeout=60, interval=1)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("MAAS_API_KEY", None)
        double.inject("hang", path=r"^machines/$", hang=60)
        process = subprocess.Popen(
            [sys.executable, "-m", "maas_kubevirt", "--values", str(values), "reconcile"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        try:
            deadline = time.monotonic() + 30
            while ("GET", "machines/") not in double.counts and time.monotonic() < deadline:
                time.sleep(0.02)
            assert ("GET", "machines/") in double.counts, "the request never started"
            time.sleep(0.3)  # well inside the request: MAAS has not answered
            sent = time.monotonic()
            process.send_signal(signal.SIGTERM)
            out, err = process.communicate(timeout=30)
            took = time.monotonic() - sent
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        assert took < 15.0, took
        assert process.returncode == 0, err
        assert "Traceback" not in err and "cycle failed" not in err


def test_a_write_abandoned_in_flight_is_audited_as_unknown(tmp_path, capsys):
    """SIGTERM during a PUT: MAAS may still carry it out, so the record says so, not "failed"."""
    with MaasDouble() as double:
        double.add_vm("web1", "vms", pool="vms", status="Ready", **credentials("web1", "vms"))
        double.inject("hang", method="PUT", hang=4)
        stop = threading.Event()
        client = MAASClient(double.url, Signer(*double.api_key), timeout=30, stop=stop)
        reconciler = Reconciler(client, Settings(domain=DOMAIN), Audit(""), stop, passwords=Passwords(SEED))
        threading.Timer(0.5, stop.set).start()
        started = time.monotonic()
        result = reconciler.cycle()
        assert time.monotonic() - started < 3  # the stop at 0.5 s, not the 4 s hang
        assert result.outcome.interrupted
        (record,) = audit_records(capsys.readouterr().out)
        assert (record["action"], record["outcome"]) == ("rename", "unknown")
        assert record["reason"].endswith("interrupted: stopped by a signal during the request")


def test_hostile_hostnames_are_escaped_in_status_and_notes(tmp_path, capsys):
    with MaasDouble() as double:
        double.add_vm("web1", "vms", hostname="x\x1b[31mred\u202e", pool="ops", status="Deployed")
        values = write_values(tmp_path, double)
        code, out, err = run_cli(capsys, ["--values", str(values), "status"])
        assert code == 0 and "x\\x1b[31mred\\u202e" in out
        code, out2, err2 = run_cli(capsys, ["--values", str(values), "reconcile", "--dry-run"])
        for text in (out, err, out2, err2):
            assert all(line.isprintable() for line in text.splitlines())


# --- issue 18 item 6: a hostile MAAS answer costs one machine, never the loop -----------------


def run_subprocess(values: Path, *command: str) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key not in ("MAAS_API_KEY", "CREDENTIALS_DIRECTORY")}
    return subprocess.run([sys.executable, "-m", "maas_kubevirt", "--values", str(values), *command],
                          capture_output=True, text=True, env=env, timeout=120)


def test_status_exits_2_on_a_refused_api_key(tmp_path):
    with MaasDouble() as double:
        double.add_vm("web1", "vms")
        values = write_values(tmp_path, double)
        (tmp_path / "api-key").write_text("other:keyxx:secretxx-REFUSED\n")
        result = run_subprocess(values, "status")
        assert result.returncode == 2, result.stderr
        assert ": 401: " in result.stderr and "the API key was refused" in result.stderr
        assert "secretxx-REFUSED" not in result.stdout + result.stderr
        assert double.writes == []


def test_doctor_exits_2_on_a_refused_api_key(tmp_path):
    with MaasDouble() as double:
        values = write_values(tmp_path, double)
        (tmp_path / "api-key").write_text("other:keyxx:secretxx-REFUSED\n")
        result = run_subprocess(values, "doctor")
        assert "the API key was refused" in result.stdout
        assert "secretxx-REFUSED" not in result.stdout + result.stderr
        assert result.returncode == 2, result.stdout + result.stderr


def test_a_403_on_one_change_fails_that_change_and_the_cycle_goes_on(tmp_path, capsys):
    """MAAS RBAC can refuse one pool: that machine waits, the others converge, nothing exits 2."""
    with MaasDouble() as double:
        vms, _ = fleet(double)
        values = write_values(tmp_path, double)
        double.inject("reply", method="PUT", path=f"^machines/{vms[1]}/$", status=403, body="", count=100)
        code, out, err = run_cli(capsys, ["--values", str(values), "reconcile", "--once"])
        assert code == 1, err
        refused = [r for r in audit_records(out) if r["system_id"] == vms[1]]
        assert refused and all(r["outcome"] in ("failed", "skipped") for r in refused)
        assert any(": 403: " in r["reason"] and "lacks permission" in r["reason"] for r in refused)
        other = [r for r in audit_records(out) if r["system_id"] == vms[2]]
        assert other and all(r["outcome"] == "ok" for r in other)
        assert double.power[vms[2]]["power_pass"] == derived("db.primary", "team-b")
        assert_no_secrets(double, out, err)


def test_a_hostile_system_id_never_reaches_another_machine(tmp_path, capsys):
    """Issue 18: a record whose system_id walks to another machine's path; no request carries it."""
    with MaasDouble() as double:
        victim = double.add_machine("foreign", power_type="ipmi", power_pass="ipmi-S3CRET-victim", status="Ready")
        hostile = f"x/../../machines/{victim}"
        double.add_vm("web1", "vms", system_id=hostile)
        good = double.add_vm("web2", "vms")
        values = write_values(tmp_path, double)
        before = dict(double.machines[victim])
        for _ in range(2):
            code, out, err = run_cli(capsys, ["--values", str(values), "reconcile", "--once"])
            assert code in (0, 1) and "Traceback" not in err
        assert double.machines[victim] == before
        assert double.power[victim]["power_pass"] == "ipmi-S3CRET-victim"
        assert not [w for w in double.writes if victim in w[1] or hostile in w[1]]
        assert not any("/../" in url or "%2F" in url for url in double.urls)
        # The victim is named only as itself, in the sweep's bulk read of every machine's power.
        assert all(url.startswith("/MAAS/api/2.0/machines/?op=power_parameters&id=")
                   for url in double.urls if victim in url)
        assert double.power[good]["power_pass"] == derived("web2", "vms")


def test_deeply_nested_json_costs_a_cycle_not_the_loop(tmp_path, capsys):
    with MaasDouble() as double:
        vms, _ = fleet(double)
        values = write_values(tmp_path, double)
        double.inject("reply", path=r"^machines/$", status=200, body=b"[" * 50000 + b"]" * 50000)
        code, out, err = run_cli(capsys, ["--values", str(values), "reconcile", "--once"])
        assert code == 1 and "Traceback" not in err and "internal error" not in err
        assert "JSON nested deeper than 64 levels" in err
        code, out, err = run_cli(capsys, ["--values", str(values), "reconcile", "--once"])
        assert double.power[vms[2]]["power_pass"] == derived("db.primary", "team-b")
