"""Event-driven cycles: the event-log follower (pure), the double's events endpoint and machine
objects, and the reconciler's cycle cost and resync triggers against the MAAS double."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))

from conftest import require  # noqa: E402
from maas_double import MaasDouble, populate  # noqa: E402
from reconcile_helpers import DOMAIN, SEED, RecordingAudit, converged, credentials, derived  # noqa: E402

from maas_kubevirt import events, identity  # noqa: E402
from maas_kubevirt.identity import PLACEHOLDER_PASSWORD as PLACEHOLDER  # noqa: E402
from maas_kubevirt.events import AUDIT, DEBUG, EventLog, MalformedEvents, parse_events  # noqa: E402
from maas_kubevirt.maas import MAASClient, RetryPolicy, Signer  # noqa: E402
from maas_kubevirt.reconcile import Passwords, Reconciler, Settings  # noqa: E402

SETTINGS = Settings(domain=DOMAIN)

# DISPLAYED_MACHINE_FIELDS in src/maasserver/api/machines.py (canonical/maas master), plus the
# resource_uri every object carries.
DISPLAYED_MACHINE_FIELDS = """system_id hostname description hardware_uuid domain fqdn owner
owner_data locked cache_sets bcaches bios_boot_method boot_interface architecture min_hwe_kernel
hwe_kernel cpu_count cpu_speed memory swap_size storage status osystem distro_series
ephemeral_deploy error_description netboot power_type power_state tag_names address_ttl
ip_addresses interface_set zone pool disable_ipv4 constraints_by_type boot_disk blockdevice_set
physicalblockdevice_set virtualblockdevice_set volume_groups raids status_action status_message
status_name node_type node_type_name special_filesystems parent default_gateways
current_commissioning_result_id current_testing_result_id current_installation_result_id
commissioning_status commissioning_status_name testing_status testing_status_name
cpu_test_status cpu_test_status_name memory_test_status memory_test_status_name
network_test_status network_test_status_name storage_test_status storage_test_status_name
other_test_status other_test_status_name hardware_info interface_test_status
interface_test_status_name numanode_set workload_annotations last_sync sync_interval next_sync
enable_hw_sync enable_kernel_crash_dump is_dpu resource_uri""".split()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeLog:
    """An event log as MAAS serves it: ``query(level, after, limit)`` over a list of events."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self.next_id = 1
        self.queries: list[tuple[str, int | None, int]] = []

    def add(self, node: str | None, kind: str = events.STATUS_CHANGED, level: str = DEBUG) -> int:
        self.events.append({"id": self.next_id, "node": node, "type": kind, "level": level})
        self.next_id += 1
        return self.next_id - 1

    def query(self, level: str, after: int | None, limit: int) -> list[dict]:
        self.queries.append((level, after, limit))
        stream = [e for e in self.events if (e["level"] == AUDIT) == (level == AUDIT)]
        if after is None:
            return stream[::-1][:limit]
        return [e for e in stream if e["id"] > after][:limit][::-1]


def started(log: FakeLog, clock: Clock | None = None) -> EventLog:
    follower = EventLog(3600, clock or Clock())
    follower.begin_resync(follower.newest(log.query))
    follower.end_resync()
    return follower


# --- the follower (pure) --------------------------------------------------------------------


def test_parse_events_orders_oldest_first_and_keeps_what_matters():
    parsed = parse_events([{"id": 7, "node": "abc", "type": "Node changed status"},
                           {"id": 3, "node": None, "type": "Node"}])
    assert [(e.id, e.node, e.type) for e in parsed] == [(3, None, "Node"), (7, "abc", "Node changed status")]


@pytest.mark.parametrize("data", [None, {"events": []}, [1], [{"id": "7"}], [{"id": True}], [{"id": -1}]])
def test_parse_events_refuses_what_maas_never_sends(data):
    with pytest.raises(MalformedEvents):
        parse_events(data)


@given(st.lists(st.fixed_dictionaries({"id": st.integers(0, 10**9),
                                        "node": st.one_of(st.none(), st.text(max_size=8)),
                                        "type": st.text(max_size=20)}), max_size=30))
def test_parse_events_any_page_of_the_documented_shape(page):
    parsed = parse_events(page)
    assert sorted(e.id for e in parsed) == [e.id for e in parsed]
    assert sorted(e["id"] for e in page) == [e.id for e in parsed]


def test_resync_is_due_at_start_on_the_interval_and_when_asked():
    clock = Clock()
    log = FakeLog()
    follower = EventLog(3600, clock)
    assert follower.resync_due() == "start"
    follower.begin_resync(follower.newest(log.query))
    assert follower.resync_due() == "start", "a resync is done only once the listing succeeded"
    follower.end_resync()
    assert follower.resync_due() == ""
    clock.now += 3599
    assert follower.resync_due() == ""
    clock.now += 1
    assert "maas.resync_interval" in follower.resync_due()
    follower.end_resync()
    follower.request_resync("the event query failed")
    assert follower.resync_due() == "the event query failed"


def test_follow_names_the_machines_of_relevant_events_only():
    log = FakeLog()
    log.add("old")
    follower = started(log)
    log.add("aaa")
    log.add("bbb", "Node powered on")
    log.add("ccc", events.NODE_ACTION, AUDIT)
    log.add("ddd", "Tag", AUDIT)
    log.add(None)
    followed = follower.follow(log.query)
    assert followed.resync == "" and followed.system_ids == {"aaa", "ccc"}
    assert follower.follow(log.query).system_ids == set()


def test_follow_re_reads_the_cursor_event_and_finds_the_gap_when_it_is_gone():
    log = FakeLog()
    log.add("aaa")
    follower = started(log)
    log.add("bbb")
    assert follower.follow(log.query).system_ids == {"bbb"}
    cursor = follower.cursors[DEBUG]
    assert log.queries[-2] == (DEBUG, cursor - 2, events.PAGE_SIZE) or log.queries[-2][1] == cursor - 2
    log.add("ccc")
    del log.events[:2]   # pruned: the cursor's event (bbb) is gone, so may be more
    followed = follower.follow(log.query)
    assert "gap in the DEBUG events" in followed.resync and followed.system_ids == set()
    assert follower.cursors[DEBUG] == cursor, "a gap leaves the cursors alone"
    assert follower.resync_due() == followed.resync


def test_follow_pages_through_a_backlog_and_goes_on_next_cycle():
    log = FakeLog()
    follower = started(log)
    ids = [log.add(f"m{i}") for i in range(events.PAGE_SIZE * (events.MAX_PAGES + 1) + 10)]
    first = follower.follow(log.query)
    assert first.resync == "" and len(first.system_ids) == events.PAGE_SIZE * events.MAX_PAGES
    second = follower.follow(log.query)
    assert second.resync == ""
    assert first.system_ids | second.system_ids == {f"m{i}" for i in range(len(ids))}
    assert follower.cursors[DEBUG] == ids[-1]


def test_a_malformed_page_asks_for_a_resync():
    log = FakeLog()
    follower = started(log)
    followed = follower.follow(lambda level, after, limit: [{"id": "x"}])
    assert followed.resync.startswith("malformed DEBUG events")


@given(st.lists(st.one_of(
    st.tuples(st.just("add"), st.sampled_from(["a", "b", "c", None]), st.sampled_from([DEBUG, AUDIT]),
              st.booleans()),
    st.tuples(st.just("prune"), st.integers(0, 6)),
    st.tuples(st.just("follow")),
), max_size=40))
def test_no_relevant_event_is_missed_without_a_resync(steps):
    """Whatever the log does (appends, pruning), every relevant event is either reported by a
    follow or covered by a resync requested before it would be lost. The one exception is
    documented: a stream that was empty at the resync has no event to anchor on, so events
    appended and pruned between two cycles there go unnoticed until the next resync."""
    log = FakeLog()
    follower = started(log)
    unseen: dict[int, tuple[str, str]] = {}     # event id -> (stream, node)
    for step in steps:
        if step[0] == "add":
            _, node, level, relevant = step
            kind = (events.STATUS_CHANGED if level == DEBUG else events.NODE_ACTION) if relevant else "noise"
            event_id = log.add(node, kind, level)
            if relevant and node is not None:
                unseen[event_id] = (level, node)
        elif step[0] == "prune":
            del log.events[: step[1]]
        else:
            present = {e["id"] for e in log.events}
            unanchored = {stream for stream in (DEBUG, AUDIT) if follower.cursors[stream] == 0}
            followed = follower.follow(log.query)
            if followed.resync:
                follower.begin_resync(follower.newest(log.query))
                follower.end_resync()
                unseen.clear()
                continue
            lost = {i for i, (stream, _) in unseen.items() if i not in present and stream not in unanchored}
            assert not lost, f"events {lost} were pruned unseen and no resync was asked for"
            assert {node for i, (_, node) in unseen.items() if i in present} <= followed.system_ids
            unseen.clear()


# --- the double's event log and machine objects ----------------------------------------------


@pytest.fixture
def double():
    with MaasDouble() as running:
        yield running


def client_for(double: MaasDouble) -> MAASClient:
    return MAASClient(double.url, Signer(*double.api_key), timeout=5,
                      retry=RetryPolicy(attempts=2, backoff=0.01, max_backoff=0.02))


def test_machine_objects_carry_maas_fields_and_weight(double):
    server = double.add_machine(power_type="ipmi", status="Deployed")
    vm = double.add_vm("web1", "vms")
    for system_id, low, high in ((server, 15_000, 30_000), (vm, 8_000, 20_000)):
        body = double.machines[system_id].encoded()
        machine = json.loads(body)
        assert sorted(machine) == sorted(DISPLAYED_MACHINE_FIELDS)
        assert low <= len(body) <= high
        assert machine["interface_set"][0]["system_id"] == system_id
    double.machines[vm]["hostname"] = "renamed"
    assert json.loads(double.machines[vm].encoded())["hostname"] == "renamed", "the cache follows changes"


def test_events_endpoint_follows_maas_semantics(double):
    client = client_for(double)
    a = double.add_vm("web1", "vms")                    # created in New: no event, as in MAAS
    assert client.events(DEBUG) == []
    double.set_status(a, "Commissioning")
    double.move_to_pool(a, "vms", via="ui")
    double.move_to_pool(a, "default")                    # by the API: no event
    double.rename(a, "by-hand")                          # no event
    double.set_status(a, "Ready")
    debug = client.events(DEBUG)
    assert [e["type"] for e in debug] == ["Node changed status"] * 2
    assert [e["description"] for e in debug] == ["From 'Commissioning' to 'Ready'",
                                                  "From 'New' to 'Commissioning'"], "newest first"
    assert debug[0]["level"] == "DEBUG" and debug[0]["node"] == a
    assert client.events("INFO") == [], "NODE_CHANGED_STATUS is DEBUG, below the default INFO"
    audit = client.events(AUDIT)
    assert [(e["type"], e["level"]) for e in audit] == [("Node", "AUDIT")]
    first = debug[-1]["id"]
    assert [e["id"] for e in client.events(DEBUG, after=first)] == [debug[0]["id"]]
    assert len(client.events(DEBUG, after=0, limit=1)) == 1
    page = client.call("GET", "events/", [("op", "query"), ("level", "DEBUG"), ("after", "0"),
                                          ("limit", "1")])
    assert page["count"] == 1 and page["events"][0]["id"] == first
    assert page["next_uri"].endswith(f"after={first}") or f"after={first}" in page["next_uri"]
    for params, message in (([("limit", "1001")], "greater than limit: 1000"),
                            ([("level", "LOUD")], "Unrecognised log level"),
                            ([("after", "1"), ("before", "9")], "undetermined behaviour")):
        with pytest.raises(Exception) as failure:
            client.call("GET", "events/", [("op", "query"), *params])
        assert failure.value.status == 400 and message in str(failure.value)
    double.delete_machine(a)
    assert client.events(DEBUG) == [], "a deleted machine's events are detached"


def test_enlistment_records_maas_status_events(double):
    client = client_for(double)
    a = double.enlist("web1", "vms")
    assert double.machines[a]["status_name"] == "New"
    described = [e["description"] for e in client.events(DEBUG)[::-1] if e["type"] == "Node changed status"]
    assert described == ["From 'New' to 'Commissioning'", "From 'Commissioning' to 'New'"]


# --- the reconciler's event-driven cycles ---------------------------------------------------


def reconciler_for(double: MaasDouble, clock: Clock | None = None, settings: Settings = SETTINGS) -> Reconciler:
    return Reconciler(client_for(double), settings, RecordingAudit(), clock=clock or Clock(),
                      passwords=Passwords(SEED))


def settle(reconciler: Reconciler, limit: int = 6, double: MaasDouble | None = None) -> int:
    """Cycles until a plan changes nothing (the double finishing commissioning in between)."""
    for cycles in range(1, limit + 1):
        if double is not None:
            double.advance()
        result = reconciler.cycle()
        assert not result.error, result.error
        if not any(action.changes for action in result.actions):
            return cycles
    raise AssertionError("no convergence")


def idle_cost(double: MaasDouble, reconciler: Reconciler) -> tuple[int, int]:
    double.reset_counts()
    result = reconciler.cycle()
    assert not result.error and not any(a.changes for a in result.actions)
    return double.request_count, double.bytes_in + double.bytes_out


def test_idle_cycle_costs_two_small_requests(double):
    populate(double, 300, new=True)
    reconciler = reconciler_for(double)
    settle(reconciler, double=double)
    double.advance()
    reconciler.cycle()   # reads the machines that just finished commissioning
    requests, size = idle_cost(double, reconciler)
    assert requests == 2 and size <= 4096, (requests, size)
    assert set(double.counts) == {("GET", "events/?op=query")}


def test_enlistment_behind_the_back_is_read_alone(double):
    populate(double, 200, new=True)
    reconciler = reconciler_for(double)
    settle(reconciler, double=double)
    double.advance()
    reconciler.cycle()
    vm = double.enlist("late", "vms")
    double.reset_counts()
    result = reconciler.cycle()
    assert {a.system_id for a in result.actions if a.changes and a.system_id} == {vm}
    assert double.counts[("GET", "machines/")] == 1, "the machine by id"
    assert double.counts[("GET", "nodes/")] == 1, "the holders of the names it may take"
    assert double.bytes_out < 100_000, "one machine read and changed, not the fleet (3 MB)"
    settle(reconciler, double=double)
    double.advance()
    reconciler.cycle()
    assert converged(double, [vm])
    assert reconciler.resyncs == 1, "no resync was needed"
    assert idle_cost(double, reconciler)[0] == 2


def test_a_machine_no_longer_redfish_is_forgotten_event_driven(double):
    """Ours and commissioning, it was read every cycle; once on another power type, no more."""
    vm = double.add_vm("web1", "vms")
    reconciler = reconciler_for(double)
    reconciler.cycle()
    reconciler.cycle()
    assert double.machines[vm]["status_name"] == "Commissioning"
    double.set_power_type(vm, "manual", {})   # an API edit: no event; manual keeps no parameters
    double.set_status(vm, "Ready")
    reconciler.cycle()
    assert vm not in reconciler.known
    assert idle_cost(double, reconciler)[0] == 2
    assert set(double.counts) == {("GET", "events/?op=query")}


def test_hand_rename_waits_for_the_resync(double):
    clock = Clock()
    vm = double.add_vm("web1", "vms")
    reconciler = reconciler_for(double, clock)
    settle(reconciler, double=double)
    double.rename(vm, "by-hand")
    settle(reconciler, double=double)
    assert double.machines[vm]["hostname"] == "by-hand", "MAAS records no event for an API rename"
    clock.now += 3600
    settle(reconciler, double=double)
    assert double.machines[vm]["hostname"] == identity.maas_hostname("web1", "vms")
    assert reconciler.resyncs == 2


def test_ui_pool_move_is_seen_at_once(double):
    vm = double.add_vm("web1", "vms")
    reconciler = reconciler_for(double)
    settle(reconciler, double=double)
    double.move_to_pool(vm, "default", via="ui")
    settle(reconciler, double=double)
    assert double.machines[vm]["pool"]["name"] == "vms" and reconciler.resyncs == 1


def test_pruned_events_trigger_a_resync(double):
    vm = double.add_vm("web1", "vms")
    reconciler = reconciler_for(double)
    settle(reconciler, double=double)
    other = double.add_vm("web2", "vms")           # created in New: no event at all
    double.set_status(vm, "Broken")
    double.prune_events(0)
    settle(reconciler, double=double)
    assert reconciler.resyncs == 2 and converged(double, [other])


def test_a_failed_event_query_resyncs(double, capsys):
    vm = double.add_vm("web1", "vms")
    reconciler = reconciler_for(double)
    settle(reconciler, double=double)
    other = double.add_vm("web2", "vms")
    double.inject("500", path=r"^events/", count=1)
    settle(reconciler, double=double)
    assert reconciler.resyncs == 2 and converged(double, [vm, other])
    assert "full resync: the event query failed: GET events/" in capsys.readouterr().err


def test_an_interrupted_event_query_ends_the_cycle_without_a_resync(double, capsys):
    """A stop during the event query is no failure of MAAS: the next cycle follows on."""
    double.add_vm("web1", "vms")
    reconciler = reconciler_for(double)
    settle(reconciler, double=double)
    double.inject("hang", path=r"^events/", hang=3)
    threading.Timer(0.3, reconciler.client.stop.set).start()   # SIGTERM during the query
    assert "interrupted" in reconciler.cycle().error
    reconciler.client.stop.clear()
    double.clear_faults()
    assert not reconciler.cycle().error
    assert reconciler.resyncs == 1 and "full resync" not in capsys.readouterr().err


def test_a_duplicate_claim_resolved_then_made_again_is_reported_again_full_list(double, capsys):
    """Without events every cycle reads every machine: a claim gone from one is forgotten."""
    first = double.add_vm("web", "vms", hostname="first", status="Deployed")
    second = double.add_vm("web", "vms", hostname="second", status="Deployed")
    reconciler = reconciler_for(double, settings=Settings(domain=DOMAIN, resync_interval=None))
    reconciler.cycle()
    assert capsys.readouterr().err.count("web.vms is claimed by 2 machines") == 1
    for sid, vm in ((first, "one"), (second, "two")):   # re-read: their status changes too
        double.set_power_address(sid, f"{vm}.vms.{DOMAIN}")
        double.set_status(sid, "Broken")
    assert "duplicate-claim" not in [a.kind for a in reconciler.cycle().actions]
    for sid in (first, second):
        double.set_power_address(sid, f"web.vms.{DOMAIN}")
        double.set_status(sid, "Deployed")
    assert "duplicate-claim" in [a.kind for a in reconciler.cycle().actions]
    assert capsys.readouterr().err.count("web.vms is claimed by 2 machines") == 1


def test_the_full_list_strategy_is_still_there(double):
    populate(double, 50, new=True)
    reconciler = reconciler_for(double, settings=Settings(domain=DOMAIN, resync_interval=None))
    settle(reconciler, double=double)
    requests, _ = idle_cost(double, reconciler)
    assert requests == 2 and ("GET", "machines/") in double.counts
    assert ("GET", "machines/?op=power_parameters") in double.counts


def test_bench_meets_the_idle_cycle_goal_at_100_machines():
    """`make bench` at its smallest size: it runs, and says the goal is met (exit 0)."""
    bench = Path(__file__).resolve().parents[1] / "tools" / "bench.py"
    require(bench.exists(), "tools/bench.py is not shipped with the installed package")
    done = subprocess.run([sys.executable, str(bench)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "BENCH_SIZES": "100"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "met at every size" in done.stdout
    table, _, watched = done.stdout.partition("watched for a MAC re-point:")
    rows = [line.split() for line in table.splitlines() if line.strip().startswith("100 ")]
    assert [row[1] for row in rows] == ["events", "full", "per"]
    # A new VM converges in two changes: one PUT (password with its address, name, pool), one commission.
    assert rows[0][12] == "2.00"
    # Ours left in New, watched for a MAC re-point: the events query and one bulk power read.
    (line,) = [line for line in watched.splitlines() if line.strip().startswith("100 machines")]
    assert "10 in New: idle cycle 3 request(s)" in " ".join(line.split()), line


@pytest.mark.parametrize("body", [
    {"count": 1, "events": [{"id": "seven", "node": "x", "type": "Node changed status"}]},
    {"count": 0},
    ["not", "an", "object"],
])
def test_a_malformed_event_page_resyncs(double, body):
    vm = double.add_vm("web1", "vms")
    reconciler = reconciler_for(double)
    settle(reconciler, double=double)
    other = double.add_vm("web2", "vms")
    double.inject("reply", path=r"^events/", status=200, body=body)
    settle(reconciler, double=double)
    assert reconciler.resyncs == 2 and converged(double, [vm, other])


def test_machines_read_by_id_are_split_below_the_query_limit(double):
    ids = [double.add_machine(power_type="ipmi", status="Deployed") for _ in range(900)]
    client = client_for(double)
    found = client.machines_by_id(ids[::-1] + ["gone00"])
    assert sorted(m["system_id"] for m in found) == sorted(ids)
    assert double.counts[("GET", "machines/")] == 2, "900 ids of 6 characters: two requests"


# --- the credential guarantees (issue 8) hold in event-driven cycles --------------------------


def power_parameter_reads(double: MaasDouble) -> int:
    return sum(n for (method, shape), n in double.counts.items() if shape.endswith("?op=power_parameters"))


def test_the_placeholder_is_replaced_then_left_alone_event_driven(double):
    sid = double.add_vm("web1", "vms", hostname="web1-vms", pool="vms", status="Ready")
    reconciler = reconciler_for(double)
    assert [a.kind for a in reconciler.cycle().actions] == ["set-password"]
    assert double.power[sid]["power_pass"] == derived("web1", "vms")
    double.reset_counts()
    assert reconciler.cycle().actions == [], "read once more to see it through: nothing to do"
    assert power_parameter_reads(double) == 1
    double.reset_counts()
    assert reconciler.cycle().actions == []
    assert double.request_count == 2 and power_parameter_reads(double) == 0


def test_a_commission_started_by_hand_is_repaired_event_driven(double):
    sid = double.add_vm("web1", "vms", hostname="web1-vms", pool="vms", status="Ready")
    reconciler = reconciler_for(double)
    settle(reconciler, double=double)
    client_for(double).call("POST", f"machines/{sid}/", [("op", "commission")], fields={})
    assert double.power[sid]["power_pass"] == PLACEHOLDER, "the bmc-config script ran again"
    result = reconciler.cycle()    # the status event names it: read, repaired
    assert [(a.system_id, a.kind) for a in result.actions if a.changes] == [(sid, "set-password")]
    assert double.power[sid]["power_pass"] == derived("web1", "vms")
    # While it stays in Commissioning, each cycle reads it and its parameters again.
    double.power[sid]["power_pass"] = PLACEHOLDER   # written back mid-run: no event
    double.reset_counts()
    result = reconciler.cycle()
    assert [(a.system_id, a.kind) for a in result.actions if a.changes] == [(sid, "set-password")]
    double.advance()
    settle(reconciler, double=double)
    double.reset_counts()
    reconciler.cycle()
    assert double.request_count == 2 and power_parameter_reads(double) == 0


def test_a_second_claimant_read_alone_is_refused_event_driven(double):
    """A new machine claiming an identity another machine holds: both are refused, though only
    the new one was named in an event (the other comes from what the last resync learnt)."""
    first = double.add_vm("web1", "vms")
    reconciler = reconciler_for(double)
    settle(reconciler, double=double)
    assert double.power[first]["power_pass"] == derived("web1", "vms")
    second = double.enlist("web1", "vms")
    result = reconciler.cycle()
    (duplicate,) = [a for a in result.actions if a.kind == "duplicate-claim"]
    assert set(duplicate.after.split(",")) == {first, second}
    # Fail closed: the one that came first loses its password too; nothing else changes.
    assert [(a.kind, a.system_id) for a in result.actions if a.changes] == [("reset-password", first)]
    assert double.power[first]["power_pass"] == PLACEHOLDER
    assert double.power[second]["power_pass"] == PLACEHOLDER


def test_an_event_driven_read_takes_fresh_power_and_keeps_what_it_did_not_read(double):
    """An address edited by hand is no event; the next event naming the machine reads it afresh,
    and the machines that event did not name stay known."""
    web = double.add_vm("web", "vms", hostname="web-vms", pool="vms", status="Deployed",
                        **credentials("web", "vms"))
    db = double.add_vm("db", "vms", hostname="db-vms", pool="vms", status="Deployed",
                       **credentials("db", "vms"))
    reconciler = reconciler_for(double)
    settle(reconciler)
    assert set(reconciler.known) == {web, db}
    double.set_power_address(web, f"app.vms.{DOMAIN}")
    double.move_to_pool(web, "vms", via="ui")     # an audited event, status unchanged
    result = reconciler.cycle()
    assert reconciler.partial
    assert {(a.kind, a.after) for a in result.actions if a.changes} >= {("rename", "app-vms")}
    assert set(reconciler.known) == {web, db}
    assert reconciler.known[web][1].address == f"app.vms.{DOMAIN}"


def test_a_claimant_known_from_before_is_read_fresh_beside_the_machine_an_event_names(double):
    """A machine known to claim the <vm>.<namespace> of the one an event names is read again
    with it, its power afresh: here it has moved to another VM since, so no claim is shared."""
    first = double.add_vm("web", "vms", hostname="web-vms", pool="vms", status="Deployed",
                          **credentials("web", "vms"))
    other = double.add_vm("db", "vms", hostname="db-vms", pool="vms", status="Deployed",
                          **credentials("db", "vms"))
    reconciler = reconciler_for(double)
    settle(reconciler)
    double.set_power_address(first, f"app.vms.{DOMAIN}")  # no event
    second = double.add_vm("web", "vms", status="Deployed")
    double.record(second, "NODE", "Set the resource pool to 'default'.", username="admin")
    result = reconciler.cycle()
    assert reconciler.partial
    assert not [a for a in result.actions if a.kind == "duplicate-claim"]
    changed = {(a.system_id, a.kind) for a in result.actions if a.changes}
    assert {(first, "rename"), (second, "set-password")} <= changed
    assert set(reconciler.known) == {first, second, other}


def test_a_duplicate_claim_read_again_is_not_reported_again(double, capsys):
    """The same set of claimants, read again after an event or a full resync, is one report."""
    first = double.add_vm("web", "vms", hostname="first", status="Deployed")
    second = double.add_vm("web", "vms", hostname="second", status="Deployed")
    reconciler = reconciler_for(double)
    reconciler.cycle()
    assert capsys.readouterr().err.count("web.vms is claimed by 2 machines") == 1
    double.record(first, "NODE", "Set the resource pool to 'default'.", username="admin")
    assert [a.kind for a in reconciler.cycle().actions] == ["duplicate-claim"]
    reconciler.log.request_resync("a test asks for one")
    assert [a.kind for a in reconciler.cycle().actions] == ["duplicate-claim"]
    assert reconciler.resyncs == 2
    assert "claimed" not in capsys.readouterr().err
    refused = [r[:3] for r in reconciler.audit.records if r[0] == "duplicate-claim"]
    assert refused == [("duplicate-claim", None, "refused")]


def test_a_duplicate_claim_is_remembered_while_unread_and_forgotten_once_resolved(double, capsys):
    """Cycles that read other machines keep a claim's report; one that finds it resolved drops
    it, so the same set claiming again is reported again."""
    first = double.add_vm("web", "vms", hostname="first", status="Deployed")
    second = double.add_vm("web", "vms", hostname="second", status="Deployed")
    bystander = double.add_vm("db", "vms", hostname="db-vms", pool="vms", status="Deployed",
                              **credentials("db", "vms"))
    reconciler = reconciler_for(double)
    reconciler.cycle()
    capsys.readouterr()
    double.record(bystander, "NODE", "Set the resource pool to 'vms'.", username="admin")
    reconciler.cycle()                                     # reads the bystander only
    double.record(first, "NODE", "Set the resource pool to 'default'.", username="admin")
    assert [a.kind for a in reconciler.cycle().actions] == ["duplicate-claim"]
    assert "claimed" not in capsys.readouterr().err, "the same set, already reported"
    double.set_power_address(second, f"other.vms.{DOMAIN}")
    double.record(first, "NODE", "Set the resource pool to 'default'.", username="admin")
    assert "duplicate-claim" not in [a.kind for a in reconciler.cycle().actions]
    settle(reconciler)
    double.set_power_address(second, f"web.vms.{DOMAIN}")
    double.record(second, "NODE", "Set the resource pool to 'default'.", username="admin")
    assert "duplicate-claim" in [a.kind for a in reconciler.cycle().actions]
    assert capsys.readouterr().err.count("web.vms is claimed by 2 machines") == 1
