"""apply with maas.concurrency: several machines' changes at once, each machine's in order, pools
before the moves into them, one whole audit record per change, and a stop that ends the work
within one request's time (a refused PUT's changes sent one by one included)."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from maas_double import MaasDouble  # noqa: E402
from reconcile_helpers import DOMAIN, GOOD_RECORD, SEED, RecordingAudit  # noqa: E402

from maas_kubevirt import reconcile  # noqa: E402
from maas_kubevirt.audit import Audit  # noqa: E402
from maas_kubevirt.reconcile.apply import _lanes  # noqa: E402
from maas_kubevirt.maas import MAASClient, MAASError, Signer  # noqa: E402
from maas_kubevirt.reconcile import (  # noqa: E402
    COMMISSION, CREATE_POOL, MOVE_POOL, RENAME, RIGHT, SET_PASSWORD, Action, Passwords, Power, Reconciler,
    Settings, apply, plan,
)

# Wall-clock bounds: run after the parallel workers, with the machine to itself (tests/conftest.py).
pytestmark = pytest.mark.timing

PASSWORDS = Passwords(SEED)
SLOW = 0.2   # seconds each change takes in the timed client


class TimedClient:
    """Records when each change starts and ends, on which machine, and how many run at once."""

    def __init__(self, stop: threading.Event | None = None, stop_at: int = 0) -> None:
        self.stop_at = stop_at     # set stop as the stop_at-th request starts (a signal mid-work)
        self.stopped_at: float | None = None
        self.started = 0
        self.lock = threading.Lock()
        self.calls: list[tuple[str, str | None, float, float]] = []
        self.running = 0
        self.most = 0
        self.stop = stop

    def _call(self, kind: str, target: str | None) -> dict:
        start = time.monotonic()
        with self.lock:
            self.running += 1
            self.started += 1
            self.most = max(self.most, self.running)
            if self.stop is not None and self.started == self.stop_at:
                self.stopped_at = time.monotonic()
                self.stop.set()
        try:
            if self.stop is not None and self.stop.wait(SLOW):
                raise MAASError("PUT", f"machines/{target}/", None, "stopped by a signal during the request",
                                "interrupted", in_flight=True)
            if self.stop is None:
                time.sleep(SLOW)
        finally:
            with self.lock:
                self.running -= 1
                self.calls.append((kind, target, start, time.monotonic()))
        return {}

    def update_machine(self, system_id, hide=(), **fields):
        return self._call("PUT", system_id)

    def commission(self, system_id, skip_bmc_config=True):
        return self._call("commission", system_id)

    def create_pool(self, name, description=""):
        return self._call("pool", name)


def new_vm_actions(count: int, namespace: str = "vms") -> list[Action]:
    actions = [Action(CREATE_POOL, None, None, namespace=namespace, after=namespace)]
    for i in range(count):
        sid, vm = f"m{i:05d}", f"web{i}"
        common = dict(system_id=sid, hostname=f"lucky-{i}", vm=vm, namespace=namespace)
        actions += [
            Action(SET_PASSWORD, before="placeholder", after="derived", address=f"{vm}.{namespace}.{DOMAIN}", **common),
            Action(RENAME, before=f"lucky-{i}", after=f"{vm}-{namespace}", **common),
            Action(MOVE_POOL, before="default", after=namespace, **common),
            Action(COMMISSION, before="New", after="Commissioning", **common),
        ]
    return actions


def test_several_machines_at_once_within_the_budget_each_in_its_own_order(capsys):
    client = TimedClient()
    started = time.monotonic()
    outcome = apply(client, new_vm_actions(9), Audit(""), passwords=PASSWORDS, concurrency=3)
    took = time.monotonic() - started
    assert (outcome.ok, outcome.failed, outcome.interrupted) == (1 + 9 * 4, 0, False)
    assert 2 <= client.most <= 3
    # The pool first; 18 more requests three at a time: about 7 rounds, not 19 one by one.
    assert took < 19 * SLOW * 0.75, took
    (pool,) = [c for c in client.calls if c[0] == "pool"]
    for kind, sid, start, end in client.calls:
        if kind != "pool":
            assert start >= pool[3]
    for i in range(9):
        put, commission = (next(c for c in client.calls if c[:2] == (kind, f"m{i:05d}"))
                           for kind in ("PUT", "commission"))
        assert commission[2] >= put[3]


def test_every_change_is_one_whole_audit_record(tmp_path, capsys):
    log = tmp_path / "audit.log"
    apply(TimedClient(), new_vm_actions(12), Audit(str(log)), passwords=PASSWORDS, concurrency=4)
    lines = log.read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert len(records) == 1 + 12 * 4
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == records


def test_a_rename_into_a_name_another_rename_frees_waits_for_it(capsys):
    common_a = dict(system_id="aaaaaa", hostname="web2-vms", vm="web9", namespace="vms")
    common_b = dict(system_id="bbbbbb", hostname="lucky", vm="web2", namespace="vms")
    actions = [Action(RENAME, before="web2-vms", after="web9-vms", **common_a),
               Action(RENAME, before="lucky", after="web2-vms", **common_b)]
    assert [[b[0].system_id for b in lane] for lane in _lanes([[a] for a in actions])] == [
        ["aaaaaa", "bbbbbb"]]
    client = TimedClient()
    apply(client, actions, Audit(""), concurrency=4)
    first, second = client.calls
    assert (first[1], second[1]) == ("aaaaaa", "bbbbbb") and second[2] >= first[3]


def test_a_rename_into_a_name_a_mixed_case_hostname_frees_waits_for_it_in_its_lane(capsys):
    """MAAS keeps hostnames unique whatever their case: "Web2-VMS" renamed away frees web2-vms."""
    machines = [dict(GOOD_RECORD, system_id=sid, hostname=hostname, status_name="Deployed", status=6,
                     pool={"name": "vms", "id": 1}) for sid, hostname in (("aaaaaa", "Web2-VMS"), ("bbbbbb", "lucky"))]
    power = {"aaaaaa": Power(f"web9.vms.{DOMAIN}", RIGHT, user=RIGHT),
             "bbbbbb": Power(f"web2.vms.{DOMAIN}", RIGHT, user=RIGHT)}
    actions = plan(machines, power, [], Settings(domain=DOMAIN))
    assert [(a.kind, a.system_id, a.before, a.after) for a in actions] == [
        (RENAME, "aaaaaa", "Web2-VMS", "web9-vms"), (RENAME, "bbbbbb", "lucky", "web2-vms")]
    assert [[b[0].system_id for b in lane] for lane in _lanes([[a] for a in actions])] == [
        ["aaaaaa", "bbbbbb"]]
    client = TimedClient()
    outcome = apply(client, actions, Audit(""), concurrency=4)
    assert outcome.ok == 2
    first, second = client.calls
    assert (first[1], second[1]) == ("aaaaaa", "bbbbbb") and second[2] >= first[3]


def test_a_stop_ends_every_lane_within_one_request(capsys):
    stop = threading.Event()
    client = TimedClient(stop, stop_at=4)    # the signal comes as the third lane's PUT starts
    started = time.monotonic()
    outcome = apply(client, new_vm_actions(8), Audit(""), stop=stop, passwords=PASSWORDS, concurrency=3)
    assert time.monotonic() - started < SLOW * 4   # the pool, then the PUTs end at once, not after SLOW
    assert outcome.interrupted
    # No request started after the stop, and those in flight ended with it.
    assert all(start <= client.stopped_at for _, _, start, _ in client.calls)
    assert all(end - client.stopped_at < SLOW / 2 for kind, _, _, end in client.calls if kind != "pool")


@pytest.fixture
def double():
    with MaasDouble() as double:
        yield double


class TimesOutAfterCommissioning(MAASClient):
    """MAAS carries the commission out, but the answer comes after the request stopped waiting
    (a VM slower than the commission's timeout)."""

    def commission(self, system_id, skip_bmc_config=True):
        super().commission(system_id, skip_bmc_config)
        raise MAASError("POST", f"machines/{system_id}/?op=commission", None, "timed out after 300 s",
                        "timeout", in_flight=True)


def test_a_commission_that_timed_out_but_that_maas_carried_out_is_ok(double, capsys):
    sid = double.add_vm("web1", "vms")
    client = TimesOutAfterCommissioning(double.url, Signer(*double.api_key), timeout=5)
    reconciler = Reconciler(client, Settings(domain=DOMAIN, concurrency=2), passwords=PASSWORDS)
    result = reconciler.cycle()
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    (commission,) = [r for r in records if r["action"] == COMMISSION]
    assert commission["outcome"] == "ok" and "MAAS shows the machine Commissioning" in commission["reason"]
    assert "retry_at" not in commission and sid not in reconciler.backoff.waits
    assert result.outcome.failed == 0


def test_concurrent_cycles_converge_a_namespace_as_one_at_a_time_does(double):
    ids = [double.add_vm(f"web{i}", "vms") for i in range(12)]
    client = MAASClient(double.url, Signer(*double.api_key), timeout=5)
    reconciler = Reconciler(client, Settings(domain=DOMAIN, concurrency=4), passwords=PASSWORDS)
    reconciler.cycle()
    for sid in ids:
        machine = double.machines[sid]
        assert machine["pool"]["name"] == "vms" and machine["status_name"] == "Commissioning"
        assert double.power[sid]["power_pass"] == PASSWORDS.password(*reconcile.claim_of(
            double.power[sid]["power_address"], DOMAIN)[0])
    writes = {sid: [w[0] for w in double.writes if w[1] == sid] for sid in ids}
    assert all(kinds[0] == "PUT" and kinds[-1] != "PUT" for kinds in writes.values()), writes


def test_no_request_starts_once_may_write_says_no(capsys):
    """A leader whose lease could not be renewed: the changes in flight finish, no other starts."""
    client = TimedClient()
    allowed = iter([True, True, True])
    outcome = apply(client, new_vm_actions(4), Audit(""), passwords=PASSWORDS, concurrency=1,
                    may_write=lambda: next(allowed, False))
    assert outcome.interrupted and len(client.calls) == 3
    assert [c[0] for c in client.calls] == ["pool", "PUT", "commission"]


class RefusesTheWholePut:
    """MAAS refusing one machine's combined PUT (400), so that apply sends each change alone;
    ``interrupt`` names the change whose request a signal ends (as MAASClient raises it)."""

    def __init__(self, stop: threading.Event | None = None, interrupt: str | None = None) -> None:
        self.stop, self.interrupt = stop, interrupt
        self.sent: list[tuple[str, ...]] = []   # each request, as the changes it carries

    def update_machine(self, system_id, hide=(), **fields):
        changes = tuple(change for change, key in (("password", "power_parameters_power_pass"),
                                                   ("hostname", "hostname"), ("pool", "pool")) if key in fields)
        self.sent.append(changes)
        if len(changes) > 1:
            raise MAASError("PUT", f"machines/{system_id}/", 400, "hostname: Node with this Hostname already exists.")
        if self.interrupt in changes:
            self.stop.set()
            raise MAASError("PUT", f"machines/{system_id}/", None, "stopped by a signal during the request",
                            "interrupted", in_flight=True)
        return {}

    def commission(self, system_id, skip_bmc_config=True):
        self.sent.append(("commission",))


def one_vm_to_split() -> list[Action]:
    common = dict(system_id="m00000", hostname="lucky", vm="web1", namespace="vms")
    return [Action(SET_PASSWORD, before="placeholder", after="derived", address=f"web1.vms.{DOMAIN}", **common),
            Action(RENAME, before="lucky", after="web1-vms", **common),
            Action(MOVE_POOL, before="default", after="vms", **common),
            Action(COMMISSION, before="New", after="Commissioning", **common)]


WHOLE = ("password", "hostname", "pool")


def test_a_stop_while_a_refused_put_goes_field_by_field_sends_no_further_field():
    stop = threading.Event()
    client, audit = RefusesTheWholePut(stop, interrupt="hostname"), RecordingAudit()
    outcome = apply(client, one_vm_to_split(), audit, stop=stop, passwords=PASSWORDS)
    assert client.sent == [WHOLE, ("password",), ("hostname",)], "neither the pool alone nor the commission"
    assert [(kind, result) for kind, _, result, _ in audit.records] == [(SET_PASSWORD, "ok"), (RENAME, "unknown")]
    assert outcome.interrupted


def test_a_stop_between_two_fields_of_a_split_put_sends_no_further_field():
    """The signal arrives just after the password field's answer, no request on the wire."""
    stop = threading.Event()

    class StopsAfterThePassword(RefusesTheWholePut):
        def update_machine(self, system_id, hide=(), **fields):
            answer = super().update_machine(system_id, hide=hide, **fields)
            if list(fields) == ["power_type", "power_parameters_power_address", "power_parameters_power_user",
                                "power_parameters_power_pass"]:
                stop.set()
            return answer

    client, audit = StopsAfterThePassword(), RecordingAudit()
    outcome = apply(client, one_vm_to_split(), audit, stop=stop, passwords=PASSWORDS)
    assert client.sent == [WHOLE, ("password",)]
    assert [(kind, result) for kind, _, result, _ in audit.records] == [(SET_PASSWORD, "ok")]
    assert outcome.interrupted


def test_a_lease_lost_while_a_refused_put_goes_field_by_field_sends_no_further_field():
    # Held again at the next renewal: the cycle that lost it stops all the same.
    answers = iter([True, True, False])
    client, audit = RefusesTheWholePut(), RecordingAudit()
    outcome = apply(client, one_vm_to_split(), audit, passwords=PASSWORDS,
                    may_write=lambda *args: next(answers, True))
    assert client.sent == [WHOLE, ("password",)]
    assert [(kind, result) for kind, _, result, _ in audit.records] == [(SET_PASSWORD, "ok")]
    assert outcome.interrupted
