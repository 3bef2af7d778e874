"""The reconciler as an attacker would try it: a BMC password reaches that VM's BMC and nowhere
else (issue 18), and a commission MAAS refuses is not repeated blindly (issue 17).

Against the MAAS double: every hostile power address in tests/hostile_addresses.py, the
duplicate-claim race in both orders, an address changed after the password was set, the one
PUT that carries the password with its canonical address, and the backoff of a refused
commission.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from hostile_addresses import CANONICAL, DOMAIN, HOSTILE  # noqa: E402
from maas_double import MaasDouble  # noqa: E402
from reconcile_helpers import (  # noqa: E402
    SEED,
    Args,
    RecordingAudit,
    assert_no_secrets,
    audit_records,
    derived,
    derived_user,
    values_for,
)

from maas_kubevirt import doctor, identity, loop, maas, status  # noqa: E402
from maas_kubevirt.maas import MAASClient, RetryPolicy, Signer  # noqa: E402
from maas_kubevirt.reconcile import MAX_BACKOFF, Passwords, Reconciler, Settings  # noqa: E402

PLACEHOLDER = identity.PLACEHOLDER_PASSWORD
WEB1 = derived("web1", "vms")


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch):
    monkeypatch.setattr(maas, "RETRY", RetryPolicy(attempts=3, backoff=0.01, max_backoff=0.05, max_retry_after=0.05))


@pytest.fixture
def double():
    with MaasDouble() as double:
        yield double


def reconciler_for(double: MaasDouble, clock: Clock | None = None, wall: Clock | None = None,
                   **settings: object) -> Reconciler:
    client = MAASClient(double.url, Signer(*double.api_key), timeout=5)
    clock, wall = clock or Clock(), wall or Clock()
    return Reconciler(client, Settings(domain=DOMAIN, **settings), RecordingAudit(), passwords=Passwords(SEED),
                      clock=clock, wall=wall)


def writes_to(double: MaasDouble, system_id: str) -> list[tuple]:
    return [w for w in double.writes if w[1] == system_id]


# --- hostile addresses -----------------------------------------------------------------------


@pytest.mark.parametrize("address", HOSTILE, ids=[ascii(a) for a in HOSTILE])
def test_a_hostile_address_enlisted_gets_nothing(double, address):
    """Enlisted with a look-alike of web1.vms: no password, name, pool or commission, ever."""
    sid = double.add_machine("intruder", power_type="redfish", power_address=address, power_pass=PLACEHOLDER)
    reconciler = reconciler_for(double)
    for _ in range(2):
        reconciler.cycle()
    assert double.power[sid]["power_pass"] == PLACEHOLDER
    assert double.power[sid]["power_address"] == address
    assert writes_to(double, sid) == [] and double.commissions == []
    assert double.machines[sid]["hostname"] == "intruder"


@pytest.mark.parametrize("address", HOSTILE, ids=[ascii(a) for a in HOSTILE])
def test_a_password_never_stays_behind_an_address_changed_to_a_hostile_one(double, address):
    """The real VM got its password; then its address is changed (by the API, or by the machine
    through the metadata API): within one power check the password is taken back."""
    clock = Clock()
    sid = double.add_vm("web1", "vms", status="Deployed")
    reconciler = reconciler_for(double, clock=clock)
    reconciler.cycle()
    assert double.power[sid]["power_pass"] == WEB1
    double.set_power_address(sid, address)  # MAAS records no event for it
    reconciler.cycle()
    clock.now += reconciler.settings.power_check_interval
    reconciler.cycle()
    assert double.power[sid]["power_pass"] == PLACEHOLDER
    assert double.power[sid]["power_address"] == address  # left as it is: only the password goes
    (reset,) = [r for r in reconciler.audit.records if r[0] == "reset-password"]
    assert reset[1:3] == (sid, "ok")


def test_an_address_changed_is_seen_at_the_next_resync_too(double):
    clock = Clock()
    sid = double.add_vm("web1", "vms", status="Deployed")
    reconciler = reconciler_for(double, clock=clock, power_check_interval=86400.0)
    reconciler.cycle()
    double.set_power_address(sid, "bmc.elsewhere.example.org")
    clock.now += reconciler.settings.resync_interval
    reconciler.cycle()
    assert double.power[sid]["power_pass"] == PLACEHOLDER


def test_a_power_check_costs_one_request_for_our_machines_only(double):
    clock = Clock()
    ours = [double.add_vm(f"web{i}", "vms", status="Deployed") for i in range(3)]
    for i in range(5):
        double.add_machine(power_type="ipmi", power_address=f"10.0.0.{i}", power_pass="ipmi-S3CRET")
    reconciler = reconciler_for(double, clock=clock)
    reconciler.cycle()
    reconciler.cycle()
    double.reset_counts()
    reconciler.cycle()
    assert double.request_count == 2  # idle: the event log only
    clock.now += reconciler.settings.power_check_interval
    double.reset_counts()
    reconciler.cycle()
    assert double.request_count == 3
    [(_, _, op)] = [entry for entry in double.log if entry[2] == "power_parameters"]
    [url] = [u for u in double.urls if "power_parameters" in u]
    assert sorted(part.split("=")[1] for part in url.split("?")[1].split("&") if part.startswith("id=")) == sorted(ours)


# --- duplicate claims ---------------------------------------------------------------------------


@pytest.mark.parametrize("impostor_first", [True, False])
def test_a_duplicate_claim_leaves_every_claimant_on_the_placeholder(double, impostor_first):
    reconciler = reconciler_for(double)
    first = double.enlist("web1", "vms")
    reconciler.cycle()
    assert double.power[first]["power_pass"] == WEB1  # alone, it was trusted
    second = double.enlist("web1", "vms")
    reconciler.cycle()
    reconciler.cycle()
    for sid in (first, second):
        assert double.power[sid]["power_pass"] == PLACEHOLDER
    assert [r[1:3] for r in reconciler.audit.records if r[0] == "reset-password"] == [(first, "ok")]
    (record,) = [r for r in reconciler.audit.records if r[0] == "duplicate-claim"]
    assert record[2] == "refused"
    # Neither is given anything while both claim it; deleting the impostor hands it back.
    impostor = first if impostor_first else second
    real = second if impostor_first else first
    double.delete_machine(impostor, via="ui")
    reconciler.cycle()
    assert double.power[real]["power_pass"] == WEB1


def test_the_password_goes_in_the_put_that_writes_the_canonical_address(double):
    sid = double.add_vm("web1", "vms")
    double.power[sid]["power_address"] = CANONICAL.upper()   # ASCII, another case: still ours
    reconciler = reconciler_for(double)
    reconciler.cycle()
    puts = [w for w in writes_to(double, sid) if w[0] == "PUT"]
    assert puts == [("PUT", sid, {"power_type": "redfish", "power_parameters_power_address": CANONICAL,
                                  "power_parameters_power_user": derived_user("web1", "vms"),
                                  "power_parameters_power_pass": "(withheld)",
                                  "hostname": "web1-vms", "pool": "vms"})]
    assert double.power[sid] == {**double.power[sid], "power_address": CANONICAL, "power_pass": WEB1}
    # Two requests for the VM (that PUT, then the commission) and one pool for the namespace.
    assert [(w[0], w[1]) for w in double.writes] == [("POST", "resourcepools/"), ("PUT", sid), ("POST", sid)]


def test_a_name_taken_meanwhile_never_holds_back_the_password(double):
    """MAAS refuses the whole PUT (400: the hostname is taken): each field is sent on its own."""
    sid = double.add_vm("web1", "vms")
    double.inject("race-rename", method="PUT", path=f"^machines/{sid}/$")
    reconciler = reconciler_for(double)
    outcome = reconciler.cycle().outcome
    assert double.power[sid]["power_pass"] == WEB1
    assert double.machines[sid]["pool"]["name"] == "vms"
    outcomes = {r[0]: r[2] for r in reconciler.audit.records if r[1] == sid}
    assert outcomes == {"set-password": "ok", "rename": "skipped", "move-pool": "ok", "commission": "ok"}
    assert outcome.failed == 0


@pytest.mark.parametrize("status", [409, 404])
def test_no_commission_after_a_password_put_refused(double, status):
    sid = double.add_vm("web1", "vms", hostname="web1-vms", pool="vms")
    double.inject("reply", method="PUT", path=f"^machines/{sid}/$", status=status, body="refused")
    reconciler = reconciler_for(double)
    reconciler.cycle()
    assert double.commissions == []
    assert double.machines[sid]["status_name"] == "New"
    assert [(r[0], r[2]) for r in reconciler.audit.records] == [
        ("set-password", "skipped"), ("commission", "skipped")]


def test_under_approved_a_password_only_once_approved(double):
    sid = double.add_vm("web1", "vms", hostname="web1-vms", pool="vms")
    reconciler = reconciler_for(double, commission="approved")
    reconciler.cycle()
    assert double.power[sid]["power_pass"] == PLACEHOLDER and double.writes == []
    double.machines[sid]["tag_names"] = ["kubevirt-approved"]   # tags record no event: watched
    reconciler.cycle()
    assert double.power[sid]["power_pass"] == WEB1
    assert double.commissions == [(sid, True)]


# --- a commission MAAS refuses --------------------------------------------------------------------

NO_RACK = "Unable to connect to any rack controller; please try again later."


def refuse_commissions(double: MaasDouble) -> None:
    """What a region with no rack able to reach the BMC answers: 503 without Retry-After."""
    double.inject("reply", path="op=commission", status=503, body=NO_RACK, count=1000)


def test_a_refused_commission_is_sent_once_per_backoff_step(double):
    """One machine, cycles every 3 s for 10 minutes: the commission goes at 0, 3, 9, 21, 45, 93,
    189, 381 s (waits of one interval, doubling), never twice in one step."""
    wall = Clock()
    sid = double.add_vm("web1", "vms", hostname="web1-vms", pool="vms", password=WEB1)
    refuse_commissions(double)
    reconciler = reconciler_for(double, wall=wall, interval=3.0)
    sent = []
    for second in range(0, 600, 3):
        wall.now = 1_000_000.0 + second
        before = double.counts[("POST", "machines/{id}/?op=commission")]
        reconciler.cycle()
        if double.counts[("POST", "machines/{id}/?op=commission")] > before:
            sent.append(second)
    assert sent == [0, 3, 9, 21, 45, 93, 189, 381]
    failures = [r for r in reconciler.audit.records if r[0] == "commission"]
    assert len(failures) == len(sent) and all(r[2] == "failed" and NO_RACK in r[3] for r in failures)


def test_each_refusal_is_audited_with_the_next_attempt(tmp_path, double, capsys):
    sid = double.add_vm("web1", "vms", hostname="web1-vms", pool="vms", password=WEB1)
    refuse_commissions(double)
    values = values_for(tmp_path, double, interval=60)
    assert loop.main(values, Args(once=True)) == 1
    (record,) = [r for r in audit_records(capsys.readouterr().out) if r["action"] == "commission"]
    assert (record["outcome"], record["failures"]) == ("failed", 1)
    assert record["reason"] == f"POST machines/{sid}/?op=commission: 503: {NO_RACK}"
    retry_at = datetime.strptime(record["retry_at"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    assert 59 <= (retry_at - datetime.now(timezone.utc)).total_seconds() <= 61
    # A restart (or the next --once) keeps the wait, from the audit log.
    assert loop.main(values, Args(once=True)) == 0
    assert double.counts[("POST", "machines/{id}/?op=commission")] == 1
    # status says why it waits and until when.
    assert status.main(values, Args()) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if sid in line)
    assert f"waiting until {record['retry_at']} after 1 failed attempt(s): POST machines/{sid}/?op=commission: 503" in row


def test_the_backoff_survives_the_status_events_of_maas_own_revert(double):
    """MAAS reverts the machine to New and records it: the events name it, the wait holds."""
    wall = Clock()
    sid = double.add_vm("web1", "vms", hostname="web1-vms", pool="vms", password=WEB1)
    refuse_commissions(double)
    reconciler = reconciler_for(double, wall=wall, interval=60.0)
    reconciler.cycle()
    double.set_status(sid, "Commissioning")   # what MAAS records before it reverts
    double.set_status(sid, "New")
    for _ in range(3):
        wall.now += 10
        result = reconciler.cycle()
        assert not any(a.changes for a in result.actions)
    assert double.counts[("POST", "machines/{id}/?op=commission")] == 1


def test_the_backoff_is_capped_at_an_hour_and_ends_when_maas_commissions(double):
    wall = Clock()
    sid = double.add_vm("web1", "vms", hostname="web1-vms", pool="vms", password=WEB1)
    refuse_commissions(double)
    reconciler = reconciler_for(double, wall=wall, interval=60.0)
    for failures in range(1, 11):
        reconciler.cycle()
        waits = reconciler.backoff.waits[sid]
        # Measured before the clock moves on: one interval, doubling, and never past the cap.
        assert (waits.failures, waits.until - wall.now) == (failures, min(60.0 * 2 ** (failures - 1), MAX_BACKOFF))
        wall.now = waits.until
    assert waits.until - (wall.now - MAX_BACKOFF) == MAX_BACKOFF
    double.clear_faults()
    reconciler.cycle()
    assert double.commissions[-1] == (sid, True) and sid not in reconciler.backoff.waits


def test_no_secret_in_any_output_of_these_attacks(tmp_path, double, capsys):
    for address in HOSTILE[:10]:
        double.add_machine(power_type="redfish", power_address=address, power_pass=WEB1)
    double.add_vm("web1", "vms")
    values = values_for(tmp_path, double)
    loop.main(values, Args(once=True))
    status.main(values, Args())
    out, err = capsys.readouterr()
    assert_no_secrets(double, out, err, (tmp_path / "audit.log").read_text())
    records = [json.loads(line) for line in (tmp_path / "audit.log").read_text().splitlines()]
    assert {r["action"] for r in records} >= {"suspect-address", "reset-password"}


# --- no naming error stops a cycle (issue 21 item 4) -------------------------------------------

# Every label valid, 262 characters in all: MAAS stores it (a host name with no "/"), but
# <vm>.<namespace>.<domain> cannot be longer than a DNS name's 253.
OVERLONG_VM = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 50])
OVERLONG = f"{OVERLONG_VM}.vms.{DOMAIN}"


def test_an_overlong_address_is_a_suspect_and_the_cycle_status_and_doctor_complete(tmp_path, double, capsys):
    assert len(OVERLONG) == 262
    intruder = double.add_machine("long", power_type="redfish", power_address=OVERLONG, power_pass=WEB1)
    web1 = double.add_vm("web1", "vms")
    reconciler = reconciler_for(double)
    result = reconciler.cycle()
    assert not result.error and result.outcome.failed == 0
    suspects = [a for a in result.actions if a.kind == "suspect-address"]
    assert [(a.system_id, a.vm, a.namespace) for a in suspects] == [(intruder, OVERLONG_VM, "vms")]
    assert double.power[web1]["power_pass"] == WEB1               # the rest of the cycle went on
    values = values_for(tmp_path, double)
    code = status.main(values, Args())
    out = capsys.readouterr().out
    assert code == 0 and intruder in out and "suspect" in out

    def unresolvable(host: str) -> list[str]:
        raise OSError(-2, "Name or service not known")

    checks = {c.name: c for c in doctor.run(values, reconciler.client, None, doctor.Options(resolve=unresolvable))}
    assert checks["maas.suspects"].status == "fail" and intruder in checks["maas.suspects"].found



# --- rules that hold, each pinned (issue 21 item 9) ---------------------------------------------


@pytest.mark.parametrize("address", HOSTILE, ids=[ascii(a) for a in HOSTILE])
def test_each_hostile_address_is_a_suspect_of_the_identity_it_imitates(address):
    imitated = ("kube", "vms") if address.startswith("\u212a") else ("web1", "vms")   # KELVIN SIGN reads as k
    assert identity.suspect_identity(address, DOMAIN) == imitated


def test_a_restart_finds_several_refusals_of_one_machine_and_keeps_the_newest():
    from maas_kubevirt.reconcile import Backoff

    backoff = Backoff(60.0, clock=Clock())
    backoff.restore([
        {"action": "commission", "system_id": "abc123", "outcome": "failed", "failures": 1,
         "retry_at": "2026-12-01T10:01:00Z", "reason": "first"},
        {"action": "commission", "system_id": "abc123", "outcome": "failed", "failures": 3,
         "retry_at": "2026-12-01T10:09:00Z", "reason": "third"},
        {"action": "commission", "system_id": "abc123", "outcome": "unknown", "failures": 2,
         "retry_at": "2026-12-01T10:05:00Z", "reason": "second, written last"},
    ])
    wait = backoff.waits["abc123"]
    assert (wait.failures, wait.reason) == (2, "second, written last")
    assert wait.until == datetime(2026, 12, 1, 10, 5, tzinfo=timezone.utc).timestamp()


def test_the_power_check_reads_the_power_parameters_of_our_machines_only(double):
    """Reading a machine's power parameters fetches its BMC password: never another server's."""
    clock = Clock()
    ours = {double.add_vm(f"web{i}", "vms", status="Deployed") for i in range(2)}
    others = {double.add_machine(power_type="redfish", power_address=f"bmc{i}.example.org", power_pass="S3CRET-x")
              for i in range(3)}
    reconciler = reconciler_for(double, clock=clock)
    reconciler.cycle()
    reconciler.cycle()
    double.reset_counts()
    clock.now += reconciler.settings.power_check_interval
    reconciler.cycle()
    asked = set()
    for url in double.urls:
        if "power_parameters" in url:
            asked |= set(parse_qs(urlsplit(url).query).get("id", []))
    assert asked == ours and not asked & others


def test_a_machine_deleted_without_an_event_does_not_break_the_next_power_check(double):
    clock = Clock()
    gone = double.add_vm("web1", "vms", status="Deployed")
    kept = double.add_vm("web2", "vms", status="Deployed")
    reconciler = reconciler_for(double, clock=clock)
    reconciler.cycle()
    double.delete_machine(gone, via="api")
    double.events[:] = [e for e in double.events if e.get("node") != gone]   # as if no event named it
    double.set_power_address(kept, "bmc.elsewhere.example.org")
    clock.now += reconciler.settings.power_check_interval
    result = reconciler.cycle()
    assert not result.error
    assert double.power[kept]["power_pass"] == PLACEHOLDER


# --- pools the reconciler does not own stay closed (issue 21 item 6) ----------------------------


def test_an_administrators_pool_named_like_a_namespace_never_receives_a_machine(tmp_path, double, capsys):
    """An anonymous enlistment as x.gpu-prod: the namespace need not exist, the pool does."""
    double.add_pool("gpu-prod", "GPU servers for production")
    rogue = double.add_vm("x", "gpu-prod")
    reconciler = reconciler_for(double)
    for _ in range(2):
        result = reconciler.cycle()
    assert double.machines[rogue]["pool"]["name"] == "default"
    assert not [a for a in result.actions if a.kind == "move-pool"]
    assert double.counts[("POST", "resourcepools/")] == 0
    values = values_for(tmp_path, double)
    capsys.readouterr()
    assert status.main(values, Args()) == 0
    out = capsys.readouterr().out
    assert f"{rogue} " in out and "'gpu-prod' exists but was not created by maas-kubevirt" in out
    # Named in maas.adopt_pools, it is the operator's choice: then it is used.
    adopting = reconciler_for(double, adopt_pools=("gpu-prod",))
    adopting.cycle()
    assert double.machines[rogue]["pool"]["name"] == "gpu-prod"


# --- MAC enlistment re-points a VM's own machine (issue 25 item 1) -----------------------------


@pytest.mark.parametrize("password", [None, "the-attackers-own"], ids=["no-password", "own-password"])
@pytest.mark.parametrize("status", ["New", "Commissioning"])
def test_a_mac_re_point_holds_no_derived_password_after_one_cycle(double, status, password):
    """An anonymous POST machines/ with the VM's MAC updates the VM's own machine, no event: the
    next cycle (not the power check) takes a derived password back."""
    mac = "52:54:00:12:34:56"
    sid = double.add_vm("web1", "vms", status=status, mac_addresses=[mac])
    reconciler = reconciler_for(double, commission="never")
    reconciler.cycle()
    assert double.power[sid]["power_pass"] == WEB1
    params = {"power_address": "mac.harvest.attacker.example", "power_user": "maas", "node_id": "1"}
    if password:
        params["power_pass"] = password
    code, _ = double.anonymous_enlist({"architecture": "amd64/generic", "mac_addresses": [mac],
                                       "power_type": "redfish", "power_parameters": json.dumps(params)})
    assert code == 200 and double.power[sid]["power_address"] == "mac.harvest.attacker.example"
    reconciler.cycle()   # the clock stands still: no power check is due
    assert double.power[sid]["power_pass"] != WEB1
    resets = [r for r in reconciler.audit.records if r[0] == "reset-password"]
    assert [r[1:3] for r in resets] == ([(sid, "ok")] if password is None else [])


def test_a_reconciler_without_the_audit_log_still_takes_back_a_password_its_name_and_pool_tell():
    """A new lease holder on another host has none of the old one's audit records: a machine the
    old one filed as web1-vms in pool vms, moved since, still gets its derived password taken back."""
    from maas_kubevirt.reconcile.owners import filed_as

    assert filed_as({"hostname": "web1-vms", "pool": {"name": "vms"}}) == ("web1", "vms")
    assert filed_as({"hostname": "web1-vms", "pool": {"name": "default"}}) is None
    assert filed_as({"hostname": "lucky-cat", "pool": {"name": "vms"}}) is None


def test_a_new_holder_resets_a_moved_password_from_the_machines_name_and_pool(double):
    sid = double.add_vm("web1", "vms", hostname="web1-vms", pool="vms", status="Deployed", password=WEB1)
    double.set_power_address(sid, "harvest.attacker.example")
    reconciler = reconciler_for(double)        # knows nothing of who set that password
    reconciler.cycle()
    assert double.power[sid]["power_pass"] == PLACEHOLDER
    (reset,) = [r for r in reconciler.audit.records if r[0] == "reset-password"]
    assert reset[1:3] == (sid, "ok")
