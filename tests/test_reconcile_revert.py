"""A commission MAAS took and then reverted to New counts as a failed one for the backoff.

MAAS 3.5 answers a commission only after its power-on gave up (about 12 minutes when the BMC
refuses the password), long after maas.commission_timeout: the reconciler records the commission
ok (MAAS shows Commissioning), then MAAS puts the machine back in New. Without this rule every
such revert brought another commission at once; only a status past Commissioning ends the backoff.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given, settings as hypothesis_settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent))

from maas_double import MaasDouble  # noqa: E402
from reconcile_helpers import DOMAIN, SEED, Args, RecordingAudit, audit_records, derived, values_for  # noqa: E402
from test_reconcile_apply import TimesOutAfterCommissioning, double  # noqa: E402,F401 - a fixture

from maas_kubevirt import loop, status  # noqa: E402
from maas_kubevirt.maas import MAASClient, Signer  # noqa: E402
from maas_kubevirt.reconcile import (  # noqa: E402
    COMMISSION, MAX_BACKOFF, RIGHT, Backoff, Passwords, Power, Reconciler, Settings, plan,
)
from maas_kubevirt.reconcile.backoff import REVERTED  # noqa: E402

INTERVAL = 60.0
WEB1 = derived("web1", "vms")
COMMISSIONS = ("POST", "machines/{id}/?op=commission")


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def machine(status: str, system_id: str = "abc123") -> dict:
    codes = {"New": 0, "Commissioning": 1, "Failed commissioning": 2, "Ready": 4, "Testing": 21}
    return {"system_id": system_id, "hostname": "web1-vms", "power_type": "redfish", "status_name": status,
            "status": codes[status], "pool": {"name": "vms"}, "tag_names": []}


# --- the rule, pure ---------------------------------------------------------------------------


def test_back_in_new_after_a_commission_maas_took_is_a_failed_commission():
    wall = Clock()
    backoff = Backoff(INTERVAL, clock=wall)
    backoff.commissioned("abc123")
    assert backoff.seen(machine("Commissioning")) is None and backoff.pending() == {}
    wall.now += 700     # MAAS 3.5's power-on gives up about 12 minutes later
    wait = backoff.seen(machine("New"))
    assert wait is not None and (wait.failures, wait.until - wall.now, wait.reason) == (1, INTERVAL, REVERTED)
    assert "BMC credentials" in backoff.waiting()["abc123"] and "network.redfish" in wait.reason
    assert backoff.seen(machine("New")) is None, "one revert is one failure, however often it is read"


def test_new_with_no_commission_taken_starts_no_wait():
    backoff = Backoff(INTERVAL, clock=Clock())
    assert backoff.seen(machine("New")) is None and backoff.waits == {}


@pytest.mark.parametrize("past", ["Ready", "Testing", "Failed commissioning"])
def test_a_status_past_commissioning_ends_the_backoff(past):
    wall = Clock()
    backoff = Backoff(INTERVAL, clock=wall)
    backoff.commissioned("abc123")
    backoff.seen(machine("New"))
    backoff.commissioned("abc123")
    backoff.seen(machine(past))
    assert backoff.failures("abc123") == 0
    backoff.commissioned("abc123")
    wait = backoff.seen(machine("New"))
    assert wait is not None and wait.failures == 1


def test_reverts_grow_the_wait_as_refusals_do_up_to_the_cap():
    wall = Clock()
    backoff = Backoff(INTERVAL, clock=wall)
    for failures in range(1, 10):
        backoff.commissioned("abc123")
        backoff.seen(machine("Commissioning"))
        wait = backoff.seen(machine("New"))
        assert wait is not None
        assert (wait.failures, wait.until - wall.now) == (failures, min(INTERVAL * 2 ** (failures - 1), MAX_BACKOFF))
        wall.now = wait.until


def test_a_wait_of_a_machine_found_commissioning_carries_its_failures_on():
    """A commission in doubt (no answer, status unread) that MAAS carried out, then reverted."""
    wall = Clock()
    backoff = Backoff(INTERVAL, clock=wall)
    backoff.failed("abc123", "no answer")
    assert backoff.seen(machine("Commissioning")) is None and backoff.pending() == {}
    wait = backoff.seen(machine("New"))
    assert wait is not None and wait.failures == 2


def test_a_restart_between_the_commission_and_the_revert_still_backs_off():
    """The audit log says the commission was ok; the machine is back in New at the first cycle."""
    records = [
        {"action": "commission", "system_id": "abc123", "outcome": "failed", "failures": 1,
         "retry_at": "2026-12-01T10:01:00Z", "reason": REVERTED},
        {"action": "commission", "system_id": "abc123", "outcome": "ok"},
    ]
    wall = Clock()
    backoff = Backoff(INTERVAL, clock=wall)
    backoff.restore(records)
    assert backoff.pending() == {}
    wait = backoff.seen(machine("New"))
    assert wait is not None and (wait.failures, wait.until - wall.now) == (2, 2 * INTERVAL)
    # Restarted again: the revert's own record holds the wait, and counts no second failure.
    again = Backoff(INTERVAL, clock=wall)
    again.restore([*records, {"action": "commission", "system_id": "abc123", "outcome": "failed", **wait.audited(),
                              "reason": REVERTED}])
    assert again.seen(machine("New")) is None and again.waits["abc123"].failures == 2


def settled() -> Power:
    return Power(f"web1.vms.{DOMAIN}", RIGHT, user=RIGHT)


def test_the_plan_commissions_a_reverted_machine_only_once_its_wait_is_over():
    wall = Clock()
    backoff = Backoff(INTERVAL, clock=wall)
    settings = Settings(domain=DOMAIN)

    def kinds() -> list[str]:
        return [a.kind for a in plan([machine("New")], {"abc123": settled()}, ["vms"], settings,
                                     waiting=backoff.waiting())]

    assert kinds() == [COMMISSION]
    backoff.commissioned("abc123")
    backoff.seen(machine("New"))
    assert kinds() == ["skip"]
    wall.now += INTERVAL
    assert kinds() == [COMMISSION]


# Each step: seconds until the next cycle, and what MAAS does with a commission it took by then
# (revert it to New, leave it Commissioning).
STEPS = st.lists(st.tuples(st.integers(1, 900), st.sampled_from(["revert", "stay"])), min_size=1, max_size=60)


@hypothesis_settings(derandomize=True, max_examples=300, deadline=None)
@given(STEPS)
def test_new_commissioning_new_never_commissions_more_often_than_the_backoff_allows(steps):
    """Statuses New -> Commissioning -> New -> ...: the k-th commission after k-1 reverts comes at
    least min(interval * 2**(k-2), MAX_BACKOFF) after the one before, and a machine in New whose
    wait is over is commissioned."""
    wall = Clock()
    backoff = Backoff(INTERVAL, clock=wall)
    settings = Settings(domain=DOMAIN)
    status, sent = "New", []
    for seconds, maas_does in steps:
        wall.now += seconds
        backoff.seen(machine(status))
        actions = plan([machine(status)], {"abc123": settled()}, ["vms"], settings, waiting=backoff.waiting())
        if any(a.kind == COMMISSION for a in actions):
            sent.append(wall.now)
            backoff.commissioned("abc123")
            status = "Commissioning"
        else:
            assert status == "Commissioning" or "abc123" in backoff.pending()
        if maas_does == "revert":
            status = "New"
    for k in range(1, len(sent)):
        assert sent[k] - sent[k - 1] >= min(INTERVAL * 2 ** (k - 1), MAX_BACKOFF)


# --- against the MAAS double --------------------------------------------------------------------


def reconciler_for(double: MaasDouble, wall: Clock, client: type[MAASClient] = MAASClient) -> Reconciler:
    return Reconciler(client(double.url, Signer(*double.api_key), timeout=5),
                      Settings(domain=DOMAIN, interval=INTERVAL), RecordingAudit(), passwords=Passwords(SEED),
                      wall=wall)


def test_a_timed_out_commission_maas_reverts_later_waits_the_next_step_each_time(double):
    """MAAS 3.5.13 and a BMC refusing the password: recorded ok at the timeout, New 12 minutes on."""
    wall = Clock()
    sid = double.add_vm("web1", "vms", hostname="web1-vms", pool="vms", password=WEB1)
    reconciler = reconciler_for(double, wall, TimesOutAfterCommissioning)
    for failures in (1, 2, 3):
        reconciler.cycle()
        assert double.counts[COMMISSIONS] == failures
        assert reconciler.audit.records[-1][:3] == ("commission", sid, "ok")
        wall.now += 420
        double.abort_commissioning(sid)
        result = reconciler.cycle()
        assert reconciler.audit.records[-1] == ("commission", sid, "failed", REVERTED)
        assert result.outcome.failed == 1 and not any(a.changes for a in result.actions)
        wait = reconciler.backoff.waits[sid]
        assert (wait.failures, wait.until - wall.now) == (failures, INTERVAL * 2 ** (failures - 1))
        wall.now = wait.until - 1
        reconciler.cycle()
        assert double.counts[COMMISSIONS] == failures, "not before the wait is over"
        wall.now = wait.until


def test_once_commissioning_passes_the_backoff_ends(double):
    wall = Clock()
    sid = double.add_vm("web1", "vms", hostname="web1-vms", pool="vms", password=WEB1)
    reconciler = reconciler_for(double, wall)
    reconciler.cycle()
    double.abort_commissioning(sid)
    reconciler.cycle()
    wall.now = reconciler.backoff.waits[sid].until
    reconciler.cycle()
    assert double.counts[COMMISSIONS] == 2 and reconciler.backoff.failures(sid) == 1
    double.advance()     # Ready
    reconciler.cycle()
    assert reconciler.backoff.failures(sid) == 0 and reconciler.backoff.waits == {}


def test_a_machine_deleted_while_its_commission_runs_leaves_no_backoff_behind(double):
    wall = Clock()
    sid = double.add_vm("web1", "vms", hostname="web1-vms", pool="vms", password=WEB1)
    reconciler = reconciler_for(double, wall, TimesOutAfterCommissioning)
    reconciler.cycle()
    assert reconciler.backoff.taken == {sid: 0}
    double.delete_machine(sid)
    reconciler.cycle()
    assert reconciler.backoff.taken == {} and reconciler.backoff.waits == {}


def test_a_restarted_reconciler_backs_off_a_revert_it_did_not_see_and_status_shows_the_wait(
        tmp_path, double, capsys):
    sid = double.add_vm("web1", "vms", hostname="web1-vms", pool="vms", password=WEB1)
    values = values_for(tmp_path, double, interval=60)
    assert loop.main(values, Args(once=True)) == 0
    assert double.counts[COMMISSIONS] == 1
    double.abort_commissioning(sid)    # while no reconciler runs
    capsys.readouterr()
    assert loop.main(values, Args(once=True)) == 1
    (record,) = [r for r in audit_records(capsys.readouterr().out) if r["action"] == "commission"]
    assert (record["outcome"], record["failures"], record["reason"]) == ("failed", 1, REVERTED)
    assert (record["before"], record["after"]) == ("Commissioning", "New")
    assert double.counts[COMMISSIONS] == 1
    # Another restart keeps the wait, from the audit log.
    assert loop.main(values, Args(once=True)) == 0
    assert double.counts[COMMISSIONS] == 1
    assert status.main(values, Args()) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if sid in line)
    assert f"waiting until {record['retry_at']}" in row and "reverted the machine to New" in row
