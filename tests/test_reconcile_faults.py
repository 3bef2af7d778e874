"""The reconciler under injected MAAS faults: it keeps running, never writes to a machine that
is not ours, converges once the fault clears, and no secret reaches any output channel."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from maas_double import MaasDouble  # noqa: E402
from reconcile_helpers import (  # noqa: E402
    DOMAIN,
    add_noise,
    assert_no_secrets,
    audit_records,
    converged,
    matching_ids,
    write_values,
)

from maas_kubevirt import cli, maas  # noqa: E402
from maas_kubevirt.maas import MAASClient, RetryPolicy, Signer  # noqa: E402
from maas_kubevirt.reconcile import Audit, Reconciler, Settings  # noqa: E402

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
            assert record["outcome"] in ("ok", "skipped", "failed")
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
        reconciler = Reconciler(client, Settings(domain=DOMAIN), Audit(str(tmp_path / "audit.log")))
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
