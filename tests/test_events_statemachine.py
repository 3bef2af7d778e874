"""Event-driven reconciliation ends where full-list reconciliation ends, within one resync.

Two MAAS doubles receive the same random changes: enlistments, status transitions, renames
and pool moves by hand (by the API, which MAAS does not record, or the UI, which it audits),
power-address edits, deletions, commissioning finishing and event pruning (also of events the
reconciler has not read yet). After each change
a long-lived event-driven reconciler runs on one until it has nothing left to do, and a fresh
full-list reconciler on the other. Their MAAS states must be equal; when they differ, some
change since the last resync must be one MAAS records no event for, and one resync must make
them equal.

Each VM identity is claimed by one machine at a time: with two claimants, which one gets the
name depends on the order the machines were seen (history, not state), so the two strategies
could legitimately differ.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from hypothesis import HealthCheck, assume, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

sys.path.insert(0, str(Path(__file__).parent))

from maas_double import API_PREFIX, MaasDouble, Request  # noqa: E402
from reconcile_helpers import DOMAIN, SEED, RecordingAudit  # noqa: E402

from maas_kubevirt.maas import MAASClient, Response, RetryPolicy, Signer  # noqa: E402
from maas_kubevirt.reconcile import Passwords, Reconciler, Settings  # noqa: E402

RESYNC = 3600.0
SETTINGS = Settings(domain=DOMAIN, resync_interval=RESYNC)
FULL_LIST = Settings(domain=DOMAIN, resync_interval=None)
PASSWORDS = Passwords(SEED)
IDENTITIES = [("web1", "vms"), ("web2", "vms"), ("db.primary", "vms"), ("web1", "team-b"),
              ("cache", "team-b"), ("api", "prod")]
HAND_NAMES = ["by-hand", "spare", "web1-vms", "web2-vms", "cache-team-b", "api-prod"]
STATUSES = ["New", "Commissioning", "Failed commissioning", "Ready", "Deployed", "Broken", "Testing"]
POOLS = ["default", "vms", "ops"]


class DirectTransport:
    """The double's API without sockets: the same handler, signed requests, JSON bodies."""

    url = "http://maas.invalid/MAAS/"

    def __init__(self, double: MaasDouble):
        self.double = double

    def send(self, method, url, headers, files, timeout):
        split = urlsplit(url)
        fields = {key: value[1] for key, value in (files or {}).items() if value[0] is None}
        uploads = {key: value[1] for key, value in (files or {}).items() if value[0] is not None}
        request = Request(method, split.path.split(API_PREFIX, 1)[1],
                          parse_qs(split.query, keep_blank_values=True), fields, uploads)
        status, payload, extra = self.double.handle(request)
        if isinstance(payload, (dict, list)):
            body = json.dumps(payload).encode()
        else:
            body = payload if isinstance(payload, bytes) else str(payload).encode()
        return Response(status, {"Content-Type": "application/json", **extra}, body)

    def close(self) -> None:
        pass


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def client_for(double: MaasDouble) -> MAASClient:
    return MAASClient(DirectTransport.url, Signer(*double.api_key), transport=DirectTransport(double),
                      retry=RetryPolicy(attempts=1))


def settle(reconciler: Reconciler) -> None:
    for _ in range(6):
        result = reconciler.cycle()
        assert not result.error, result.error
        if not any(action.changes for action in result.actions):
            return
    raise AssertionError("the reconciler did not converge in 6 cycles")


def state(double: MaasDouble) -> dict:
    return {
        system_id: (machine["hostname"], machine["pool"]["name"], machine["status_name"],
                    machine["power_type"], tuple(sorted(double.power[system_id].items())))
        for system_id, machine in double.machines.items()
    }


class EventsMatchFullList(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.events_world = MaasDouble(realistic=False)
        self.full_world = MaasDouble(realistic=False)
        self.worlds = (self.events_world, self.full_world)
        for world in self.worlds:
            for status in ("Deployed", "Ready", "New"):
                world.add_machine(power_type="ipmi", status=status)
            world.add_vm("web1", "vms")
        self.claimed = {("web1", "vms")}
        self.clock = Clock()
        self.reconciler = Reconciler(client_for(self.events_world), SETTINGS, RecordingAudit(), clock=self.clock,
                                     passwords=PASSWORDS)
        # Long-lived too: what a reconciler did remembers (a password it set, an address it saw).
        self.full_reconciler = Reconciler(client_for(self.full_world), FULL_LIST, RecordingAudit(),
                                          passwords=PASSWORDS)
        self.resyncs = 0
        self.unevented: list[str] = []     # changes since the last resync that MAAS does not record

    def both(self, method: str, *args, **kw):
        results = [getattr(world, method)(*args, **kw) for world in self.worlds]
        assert results[0] == results[1]
        return results[0]

    def machine_ids(self) -> list[str]:
        return sorted(self.events_world.machines)

    # --- changes in MAAS -------------------------------------------------------------------
    def unclaimed(self) -> list:
        return [identity for identity in IDENTITIES if identity not in self.claimed]

    def redfish(self) -> list[str]:
        return [sid for sid in self.machine_ids() if self.events_world.machines[sid]["power_type"] == "redfish"]

    @precondition(lambda self: self.unclaimed())
    @rule(data=st.data())
    def enlist(self, data):
        identity = data.draw(st.sampled_from(self.unclaimed()))
        self.claimed.add(identity)
        self.both("enlist", *identity)

    @precondition(lambda self: self.machine_ids())
    @rule(data=st.data(), status=st.sampled_from(STATUSES))
    def change_status(self, data, status):
        self.both("set_status", data.draw(st.sampled_from(self.machine_ids())), status)

    @precondition(lambda self: self.machine_ids())
    @rule(data=st.data())
    def rename_by_hand(self, data):
        free = [name for name in HAND_NAMES if self.events_world.hostname_holder(name) is None]
        assume(free)
        self.both("rename", data.draw(st.sampled_from(self.machine_ids())), data.draw(st.sampled_from(free)))
        self.unevented.append("rename")

    @precondition(lambda self: self.machine_ids())
    @rule(data=st.data(), pool=st.sampled_from(POOLS), via=st.sampled_from(["api", "ui"]))
    def move_by_hand(self, data, pool, via):
        self.both("move_to_pool", data.draw(st.sampled_from(self.machine_ids())), pool, via=via)
        if via == "api":
            self.unevented.append("pool move by the API")

    @precondition(lambda self: self.redfish())
    @rule(data=st.data())
    def edit_power_address(self, data):
        claim = data.draw(st.one_of(st.none(), st.sampled_from(self.unclaimed())) if self.unclaimed()
                          else st.none())
        system_id = data.draw(st.sampled_from(self.redfish()))
        old = self.claim_of(system_id)
        address = (f"{claim[0]}.{claim[1]}.{DOMAIN}" if claim
                   else "https://bmc.elsewhere.example.org/redfish/v1/Systems/1")
        self.both("set_power_address", system_id, address)
        self.claimed.discard(old)
        if claim:
            self.claimed.add(claim)
        self.unevented.append("power address edit")

    @precondition(lambda self: self.machine_ids())
    @rule(data=st.data(), via=st.sampled_from(["api", "ui"]))
    def delete(self, data, via):
        system_id = data.draw(st.sampled_from(self.machine_ids()))
        self.claimed.discard(self.claim_of(system_id))
        self.both("delete_machine", system_id, via=via)
        self.unevented.append("deletion")

    @rule()
    def commissioning_finishes(self):
        self.both("advance")

    @rule(keep=st.integers(0, 12))
    def prune_events(self, keep):
        self.events_world.prune_events(keep)

    @precondition(lambda self: self.machine_ids())
    @rule(data=st.data(), status=st.sampled_from(STATUSES), keep=st.integers(0, 3))
    def change_status_then_prune(self, data, status, keep):
        """A change the reconciler has not seen yet, then its events pruned (a long outage)."""
        self.both("set_status", data.draw(st.sampled_from(self.machine_ids())), status)
        self.events_world.prune_events(keep)

    def claim_of(self, system_id: str):
        address = self.events_world.power[system_id].get("power_address", "")
        for identity in IDENTITIES:
            if address == f"{identity[0]}.{identity[1]}.{DOMAIN}":
                return identity
        return None

    # --- after every step --------------------------------------------------------------------
    @invariant()
    def event_driven_matches_full_list(self):
        settle(self.reconciler)
        settle(self.full_reconciler)
        if self.reconciler.resyncs != self.resyncs:
            self.unevented.clear()
        if state(self.events_world) != state(self.full_world):
            assert self.unevented, "only changes MAAS records no event for may wait for a resync"
            self.clock.now += RESYNC
            settle(self.reconciler)
            assert state(self.events_world) == state(self.full_world)
            self.unevented.clear()
        self.resyncs = self.reconciler.resyncs


EventsMatchFullList.TestCase.settings = settings(
    max_examples=200 if os.environ.get("HYPOTHESIS_PROFILE") == "ci" else 25,
    stateful_step_count=12, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestEventsMatchFullList = EventsMatchFullList.TestCase
