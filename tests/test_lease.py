"""The lease package against a fake CoordinationV1Api (an in-memory Lease with resourceVersion
checked, times as the API server parses them) and a fake clock: the election's rules one by one.
Then the official client itself (whichever is installed: PyPI's in the virtualenv, Debian's 22.6
in the package build) against the same Lease served over HTTP on 127.0.0.1."""

from __future__ import annotations

import json
import os
import re
import socket
import threading
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from kubernetes import client as k8s_client
from kubernetes.client.rest import ApiException

from maas_kubevirt import lease
from maas_kubevirt.lease import Candidate, Record, record_of

NAMESPACE, NAME = "maas-kubevirt", "maas-kubevirt-reconciler"
# What the API server's MicroTime accepts (time.Parse(RFC3339Micro, ...) in
# k8s.io/apimachinery/pkg/apis/meta/v1/micro_time.go): six fractional digits, always.
MICRO_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)\Z")
T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=timezone.utc)


class Clock:
    """Monotonic seconds that move only when a test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class LeaseStore:
    """One namespace's Leases as the API server keeps them: JSON, a resourceVersion bumped on every
    write, 409 for a stale resourceVersion or a second create, MicroTimes parsed strictly."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.leases: dict[str, dict] = {}
        self.version = 100
        self.writes: list[dict] = []

    def _check(self, body: dict) -> None:
        for key in ("acquireTime", "renewTime"):
            value = body.get("spec", {}).get(key)
            if value is not None and not MICRO_TIME.match(value):
                raise ApiException(status=400, reason=f"Bad Request: {key} {value!r} is not a MicroTime")

    def get(self, name: str) -> dict:
        with self.lock:
            if name not in self.leases:
                raise ApiException(status=404, reason="Not Found")
            return json.loads(json.dumps(self.leases[name]))

    def create(self, body: dict) -> dict:
        self._check(body)
        with self.lock:
            name = body["metadata"]["name"]
            if name in self.leases:
                raise ApiException(status=409, reason="Conflict")  # AlreadyExists
            return self._store(name, body)

    def replace(self, name: str, body: dict) -> dict:
        self._check(body)
        with self.lock:
            if name not in self.leases:
                raise ApiException(status=404, reason="Not Found")
            if body["metadata"].get("resourceVersion") != self.leases[name]["metadata"]["resourceVersion"]:
                raise ApiException(status=409, reason="Conflict")
            return self._store(name, body)

    def _store(self, name: str, body: dict) -> dict:
        self.version += 1
        stored = json.loads(json.dumps(body))
        stored["metadata"]["resourceVersion"] = str(self.version)
        self.leases[name] = stored
        self.writes.append(stored)
        return json.loads(json.dumps(stored))

    def put_outside(self, name: str, holder: str, **spec: object) -> None:
        """A write by someone who is no candidate (kubectl edit): holder and times of its choosing."""
        with self.lock:
            self.version += 1
            self.leases[name] = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                 "metadata": {"name": name, "namespace": NAMESPACE,
                                              "resourceVersion": str(self.version)},
                                 "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
                                          "renewTime": "2026-12-01T11:00:00.000000Z", **spec}}

    def delete(self, name: str) -> None:
        with self.lock:
            self.leases.pop(name, None)


def as_model(data: dict) -> k8s_client.V1Lease:
    """The JSON as CoordinationV1Api hands it back: a V1Lease, its times parsed to datetimes."""
    spec = data.get("spec", {})

    def when(key):
        return datetime.fromisoformat(spec[key].replace("Z", "+00:00")) if spec.get(key) else None

    return k8s_client.V1Lease(
        api_version="coordination.k8s.io/v1", kind="Lease",
        metadata=k8s_client.V1ObjectMeta(name=data["metadata"]["name"], namespace=NAMESPACE,
                                         resource_version=data["metadata"]["resourceVersion"]),
        spec=k8s_client.V1LeaseSpec(holder_identity=spec.get("holderIdentity") or None,
                                    lease_duration_seconds=spec.get("leaseDurationSeconds"),
                                    acquire_time=when("acquireTime"), renew_time=when("renewTime"),
                                    lease_transitions=spec.get("leaseTransitions")))


class FakeCoordination:
    """The three CoordinationV1Api calls the candidate makes, on a LeaseStore. ``failing`` makes every
    call raise it; ``before_write`` runs (once each) just before a write reaches the store;
    ``during`` runs inside each call (a slow API server: it moves the clock)."""

    def __init__(self, store: LeaseStore):
        self.store = store
        self.failing: BaseException | None = None
        self.before_write: list = []
        self.during = None
        self.calls: list[tuple[str, object]] = []

    def _enter(self, what: str, timeout: object) -> None:
        self.calls.append((what, timeout))
        if self.during:
            self.during()
        if self.failing is not None:
            raise self.failing

    def read_namespaced_lease(self, name, namespace, _request_timeout=None):
        assert namespace == NAMESPACE
        self._enter("read", _request_timeout)
        return as_model(self.store.get(name))

    def create_namespaced_lease(self, namespace, body, _request_timeout=None):
        self._enter("create", _request_timeout)
        while self.before_write:
            self.before_write.pop(0)()
        return as_model(self.store.create(body))

    def replace_namespaced_lease(self, name, namespace, body, _request_timeout=None):
        self._enter("replace", _request_timeout)
        while self.before_write:
            self.before_write.pop(0)()
        return as_model(self.store.replace(name, body))


def candidate(api, name: str, clock: Clock, said: list | None = None, **timings) -> Candidate:
    settings = {"duration": 15, "renew_deadline": 10, "retry_period": 2, **timings}
    return Candidate(api, NAMESPACE, NAME, name, clock=clock, wall=lambda: T0 + timedelta(seconds=clock.now),
                     jitter=lambda: 0.0, say=(said.append if said is not None else (lambda line: None)),
                     **settings)


@pytest.fixture
def site():
    store = LeaseStore()
    clock = Clock()
    return store, clock


def holder(store: LeaseStore) -> str:
    return store.leases[NAME]["spec"]["holderIdentity"]


# --- acquiring ---------------------------------------------------------------------------------


def test_a_missing_lease_is_made_only_after_a_whole_duration(site):
    """A standby cannot tell a Lease never made from one just deleted under a live holder, so it
    waits a duration (measured from when it first saw it missing) before making it."""
    store, clock = site
    a = candidate(FakeCoordination(store), "a_1", clock)
    assert not a.attempt() and not a.held() and NAME not in store.leases
    clock.now += 14.9
    assert not a.attempt() and NAME not in store.leases
    clock.now += 0.2
    assert a.attempt() and a.held()
    spec = store.leases[NAME]["spec"]
    assert spec["holderIdentity"] == "a_1" and spec["leaseDurationSeconds"] == 15
    assert spec["leaseTransitions"] == 0 and spec["acquireTime"] == spec["renewTime"]


def test_a_standby_takes_over_only_after_a_duration_without_change_by_its_own_clock(site):
    store, clock = site
    store.put_outside(NAME, "old_1", renewTime="2020-01-01T00:00:00.000000Z")  # its times mean nothing
    b = candidate(FakeCoordination(store), "b_2", clock)
    assert not b.attempt()                     # first seen now: a whole duration to go
    clock.now += 14.9
    assert not b.attempt() and holder(store) == "old_1"
    clock.now += 0.2
    assert b.attempt() and b.held() and holder(store) == "b_2"
    assert store.leases[NAME]["spec"]["leaseTransitions"] == 1


def test_a_renewing_holder_keeps_a_standby_out(site):
    store, clock = site
    a, b = (candidate(FakeCoordination(store), name, clock) for name in ("a_1", "b_2"))
    a.attempt()
    clock.now += 15.1
    assert a.attempt()
    for _ in range(20):                        # 40 s of renewals every retry period
        assert not b.attempt() and not b.held()
        clock.now += 2
        assert a.attempt() and a.held()
    assert holder(store) == "a_1" and store.leases[NAME]["spec"]["leaseTransitions"] == 0


def test_two_candidates_racing_one_wins_on_resource_version_the_other_gets_409(site):
    store, clock = site
    store.put_outside(NAME, "gone_9")
    api_a, api_b = FakeCoordination(store), FakeCoordination(store)
    a, b = candidate(api_a, "a_1", clock), candidate(api_b, "b_2", clock)
    a.attempt()
    b.attempt()
    clock.now += 15.1                           # both may take it over now
    api_b.before_write.append(a.attempt)        # a reads and writes between b's read and b's write
    assert not b.attempt()
    assert a.held() and not b.held() and holder(store) == "a_1"
    assert b._problem == "another candidate wrote it first"
    clock.now += 2
    assert not b.attempt() and a.attempt()      # and b now sees a as the holder


# --- losing ------------------------------------------------------------------------------------


def test_held_turns_false_at_the_renew_deadline_when_renewals_fail(site):
    store, clock = site
    api = FakeCoordination(store)
    a = candidate(api, "a_1", clock)
    a.attempt()
    clock.now += 15
    assert a.attempt()
    renewed = clock.now
    api.failing = ApiException(status=500, reason="Internal Server Error")
    for step in (2, 4, 6, 8):
        clock.now = renewed + step
        assert not a.attempt()
        assert a.held(), step                 # still within the renew deadline
    clock.now = renewed + 9.999
    assert a.held()
    clock.now = renewed + 10
    assert not a.held()
    api.failing = None                        # the API server is back: its own record, renewed
    assert a.attempt() and a.held()


def test_held_counts_from_when_the_renewal_began_not_when_it_answered(site):
    """A slow API server does not lengthen the holder's time: the deadline runs from the start of
    the attempt whose write succeeded (a standby saw that write no earlier than it began)."""
    store, clock = site
    api = FakeCoordination(store)
    a = candidate(api, "a_1", clock)
    a.attempt()
    clock.now += 15
    began = clock.now
    api.during = lambda: setattr(clock, "now", clock.now + 2)   # each call takes 2 s
    assert a.attempt()
    api.during = None
    assert clock.now == began + 4
    clock.now = began + 9.99
    assert a.held()
    clock.now = began + 10
    assert not a.held()


def test_an_unreachable_api_server_means_no_write_after_the_deadline(site):
    store, clock = site
    api = FakeCoordination(store)
    a = candidate(api, "a_1", clock, renew_deadline=4, duration=6, retry_period=1)
    a.attempt()
    clock.now += 6.1
    assert a.attempt()
    api.failing = OSError("connection refused")
    start = clock.now
    while a.held():
        clock.now += 0.5
        a.attempt()
    assert clock.now - start == pytest.approx(4.0)
    assert "no answer from the API server (OSError)" in a._problem


def test_a_holder_that_reads_another_name_stops_at_once(site):
    """Someone else's name in the record (a kubectl edit, or a candidate that judged the lease
    expired): the holder starts no further write, without waiting for its deadline."""
    store, clock = site
    a = candidate(FakeCoordination(store), "a_1", clock)
    a.attempt()
    clock.now += 15.1
    assert a.attempt()
    store.put_outside(NAME, "outsider")
    clock.now += 2
    assert not a.attempt() and not a.held()
    clock.now += 14.9
    assert not a.attempt()
    clock.now += 0.2                           # the outsider never renewed: a takes it back
    assert a.attempt() and holder(store) == "a_1"
    assert store.leases[NAME]["spec"]["leaseTransitions"] == 1


def test_a_deleted_lease_is_made_again_by_its_holder_and_a_standby_waits(site):
    store, clock = site
    a, b = (candidate(FakeCoordination(store), name, clock) for name in ("a_1", "b_2"))
    a.attempt()
    clock.now += 15.1
    assert a.attempt()
    assert not b.attempt()
    store.delete(NAME)
    clock.now += 1
    assert not b.attempt() and NAME not in store.leases   # b saw it missing: a duration to go
    clock.now += 1
    assert a.attempt() and a.held() and holder(store) == "a_1"
    for _ in range(10):
        clock.now += 2
        assert a.attempt() and not b.attempt()
    assert holder(store) == "a_1"


def test_release_empties_the_holder_and_a_standby_takes_it_at_its_next_try(site):
    store, clock = site
    said: list[str] = []
    a, b = candidate(FakeCoordination(store), "a_1", clock, said), candidate(FakeCoordination(store), "b_2", clock)
    a.attempt()
    clock.now += 15.1
    assert a.attempt()
    assert not b.attempt()
    assert a.release() and not a.held()
    spec = store.leases[NAME]["spec"]
    assert spec["holderIdentity"] == "" and spec["leaseDurationSeconds"] == 1
    assert said[-1] == f"lease {NAMESPACE}/{NAME}: released"
    clock.now += 2
    assert b.attempt() and holder(store) == "b_2"
    assert not a.release()                     # not the holder: nothing written
    assert holder(store) == "b_2"


# --- what it sends, and what it says ----------------------------------------------------------


def test_every_request_has_a_timeout_of_half_the_renew_deadline_and_at_least_one_second(site):
    store, clock = site
    api = FakeCoordination(store)
    a = candidate(api, "a_1", clock)
    a.attempt()
    clock.now += 16
    assert a.attempt()
    assert {timeout for _, timeout in api.calls} == {(5.0, 5.0)}
    small = candidate(FakeCoordination(store), "s_1", clock, duration=3, renew_deadline=1.5, retry_period=1)
    assert small.request_timeout == (1.0, 1.0)


def test_times_always_carry_six_digits_even_at_a_whole_second(site):
    store, clock = site
    a = candidate(FakeCoordination(store), "a_1", clock)
    clock.now = 0.0                            # the wall clock at T0 exactly: .000000
    a.attempt()
    clock.now = 15.5
    assert a.attempt()
    assert MICRO_TIME.match(store.leases[NAME]["spec"]["renewTime"])
    assert lease.micro_time(T0) == "2026-12-01T12:00:00.000000Z"
    assert lease._sendable(T0) == "2026-12-01T12:00:00.000001Z"


@pytest.mark.parametrize("timings", [dict(duration=10, renew_deadline=10, retry_period=2),
                                     dict(duration=15, renew_deadline=2.4, retry_period=2)])
def test_timings_client_go_refuses_are_refused(timings):
    with pytest.raises(ValueError):
        Candidate(FakeCoordination(LeaseStore()), NAMESPACE, NAME, "a_1", **timings)


def test_one_line_per_change_of_state(site):
    store, clock = site
    said: list[str] = []
    api = FakeCoordination(store)
    a = candidate(api, "a_1", clock, said)
    store.put_outside(NAME, "b_2")
    for _ in range(3):
        a.attempt()
        a.announce()
        clock.now += 2
    assert said == [f"lease {NAMESPACE}/{NAME}: standby, held by b_2"]
    clock.now += 15
    for _ in range(2):
        a.attempt()
        a.announce()
    assert said[1:] == [f"lease {NAMESPACE}/{NAME}: held by this process (a_1): it writes to MAAS"]
    api.failing = ApiException(status=401, reason="Unauthorized")
    for _ in range(8):
        clock.now += 2
        a.attempt()
        a.announce()
    assert len(said) == 3, said
    assert said[2].startswith(f"lease {NAMESPACE}/{NAME}: lost (cannot read it: 401 Unauthorized: the kubeconfig's "
                              "token was refused")
    assert said[2].endswith("no further MAAS write from this process, standby")


def test_records_read_from_a_model_and_from_json_agree():
    data = {"metadata": {"name": NAME, "resourceVersion": "7"},
            "spec": {"holderIdentity": "h_1", "leaseDurationSeconds": 15, "acquireTime": "2026-12-01T12:00:00.250000Z",
                     "renewTime": "2026-12-01T12:00:05.500000Z", "leaseTransitions": 3}}
    assert record_of(data) == record_of(as_model(data)) == Record(
        "h_1", 15, "2026-12-01T12:00:00.250000Z", "2026-12-01T12:00:05.500000Z", 3, "7")
    assert record_of({"metadata": {}, "spec": {}}) == Record("")


def test_describe_says_who_holds_it_since_when_and_whether_anyone_renews_it():
    now = datetime(2026, 12, 1, 12, 0, 30, tzinfo=timezone.utc)
    held = Record("host_1", 15, "2026-12-01T11:00:00.000001Z", "2026-12-01T12:00:28.000001Z", 0, "1")
    assert lease.describe(held, 15, now) == ("held by host_1 since 2026-12-01T11:00:00.000001Z, renewed "
                                             "2026-12-01T12:00:28.000001Z (2 s ago)")
    assert not lease.expired(held, 15, now)
    stale = Record("host_1", 15, "2026-12-01T11:00:00.000001Z", "2026-12-01T12:00:00.000001Z", 0, "1")
    assert lease.describe(stale, 15, now).endswith("not renewed for more than 15 s, so no reconciler is active")
    assert lease.expired(stale, 15, now) and lease.expired(None, 15, now)
    assert lease.describe(None, 15, now) == "does not exist: no reconciler has taken part yet"
    assert lease.describe(Record("", 1, None, "2026-12-01T12:00:00.000001Z"), 15, now).startswith("not held")


def test_the_token_expiry_is_read_from_a_service_account_token_never_shown(tmp_path):
    import base64

    def part(data: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")

    token = ".".join((part({"alg": "RS256"}), part({"exp": 1893456000, "sub": "system:serviceaccount:x:y"}), "c2ln"))
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
    assert lease.token_expiry(str(path)) == datetime(2030, 1, 1, tzinfo=timezone.utc)
    path.write_text(path.read_text().replace(token, "not-a-jwt"))
    assert lease.token_expiry(str(path)) is None


def test_an_unusable_kubeconfig_is_a_configuration_error(tmp_path):
    with pytest.raises(lease.LeaseConfigError, match="reconciler.lease.kubeconfig: cannot read"):
        lease.coordination_api(str(tmp_path / "missing"))
    (tmp_path / "bad").write_text("clusters: [")
    with pytest.raises(lease.LeaseConfigError, match="is not a YAML kubeconfig"):
        lease.coordination_api(str(tmp_path / "bad"))
    (tmp_path / "empty").write_text("{}\n")
    with pytest.raises(lease.LeaseConfigError, match="cannot be used"):
        lease.coordination_api(str(tmp_path / "empty"))


# --- the official client, over HTTP ------------------------------------------------------------


class LeaseServer:
    """The coordination.k8s.io/v1 Lease paths of one namespace on 127.0.0.1, on a LeaseStore, with
    every request body kept (to see the client's own serialisation)."""

    def __init__(self, store: LeaseStore):
        self.store = store
        self.bodies: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _reply(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _serve(self, method: str) -> None:
                prefix = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases"
                path = self.path.split("?")[0]
                body = None
                if method in ("POST", "PUT"):
                    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                    server.bodies.append(body)
                try:
                    if method == "GET" and path == f"{prefix}/{NAME}":
                        self._reply(200, server.store.get(NAME))
                    elif method == "POST" and path == prefix:
                        self._reply(201, server.store.create(body))
                    elif method == "PUT" and path == f"{prefix}/{NAME}":
                        self._reply(200, server.store.replace(NAME, body))
                    else:
                        self._reply(404, {"kind": "Status", "code": 404})
                except ApiException as error:
                    self._reply(error.status, {"kind": "Status", "code": error.status, "message": error.reason})

            def do_GET(self):
                self._serve("GET")

            def do_POST(self):
                self._serve("POST")

            def do_PUT(self):
                self._serve("PUT")

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)

    def __enter__(self) -> "LeaseServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.http.shutdown()
        self.http.server_close()

    def api(self) -> k8s_client.CoordinationV1Api:
        configuration = k8s_client.Configuration()
        configuration.host = f"http://127.0.0.1:{self.http.server_address[1]}"
        configuration.retries = 0
        return k8s_client.CoordinationV1Api(k8s_client.ApiClient(configuration))


def test_the_installed_client_acquires_renews_races_and_releases_over_http(site):
    store, clock = site
    with LeaseServer(store) as server:
        a, b = candidate(server.api(), "a_1", clock), candidate(server.api(), "b_2", clock)
        clock.now = 0.0   # whole seconds on the wall clock, the case the current client mangles
        assert not a.attempt()
        clock.now += 15.0
        assert a.attempt() and a.held()
        clock.now += 2.0
        assert a.attempt() and not b.attempt()
        assert record_of(store.get(NAME)).holder == "a_1"
        clock.now += 15.0 + 15.0           # a stopped renewing: b may take over; a races it
        b.attempt()
        store.put_outside(NAME, "gone_1")   # seen by both as a change: a duration for both
        assert not a.attempt() and not b.attempt()
        clock.now += 15.1
        real = b.api

        class Racing:
            """b's client, but a reads and writes between b's read and b's write."""

            read_namespaced_lease = staticmethod(real.read_namespaced_lease)

            @staticmethod
            def replace_namespaced_lease(*args, **kwargs):
                assert a.attempt()
                return real.replace_namespaced_lease(*args, **kwargs)

        b.api = Racing()
        assert not b.attempt() and a.held() and not b.held()
        assert b._problem == "another candidate wrote it first"
        assert a.release() and record_of(store.get(NAME)).holder == ""
    assert server.bodies and all(MICRO_TIME.match(body["spec"][key]) for body in server.bodies
                                 for key in ("acquireTime", "renewTime"))
    assert {body["apiVersion"] for body in server.bodies} == {"coordination.k8s.io/v1"}


def test_each_holding_period_is_counted_so_that_the_loop_resyncs_at_each(site):
    store, clock = site
    api = FakeCoordination(store)
    a = candidate(api, "a_1", clock)
    a.attempt()
    clock.now += 15.1
    assert a.attempt() and a.terms == 1
    for _ in range(3):
        clock.now += 2
        assert a.attempt() and a.terms == 1      # renewals: the same period
    api.failing = OSError("unreachable")
    clock.now += 10.5
    a.attempt()
    assert not a.held()
    api.failing = None
    clock.now += 1
    assert a.attempt() and a.terms == 2          # held again after a gap: a new period


# --- the holder's duration, not the standby's (issue 29) ---------------------------------------


@pytest.mark.parametrize("written, waited", [(40, 40), (5, 5), (None, 15), (0, 15), (-3, 15)])
def test_a_standby_times_the_holder_by_the_duration_written_in_the_lease(site, written, waited):
    """As client-go's isLeaseValid: the holder's leaseDurationSeconds, whatever the standby's own
    setting (15 here); missing or not positive: its own."""
    store, clock = site
    store.put_outside(NAME, "old_1", leaseDurationSeconds=written)
    b = candidate(FakeCoordination(store), "b_2", clock)
    assert not b.attempt()                     # first seen now
    clock.now += waited - 0.1
    assert not b.attempt() and holder(store) == "old_1"
    clock.now += 0.2
    assert b.attempt() and b.held() and holder(store) == "b_2"
    assert store.leases[NAME]["spec"]["leaseDurationSeconds"] == 15   # and it writes its own


@pytest.mark.parametrize("written", ["40", True, 1.5, None])
def test_a_duration_that_is_not_a_whole_number_is_none(written):
    """The API server's JSON as status and doctor read it; the typed client refuses such a Lease."""
    data = {"metadata": {"resourceVersion": "1"}, "spec": {"holderIdentity": "h_1", "leaseDurationSeconds": written}}
    assert record_of(data).duration is None and record_of(data).lasts(15) == 15


def test_two_hosts_given_different_durations_never_write_at_once(site):
    """a (duration 40, requests of up to 30 s) holds and is cut off from the API server; b, given
    15, must wait a's 40 from the last renewal it saw: by then every request a started has ended.
    Each step, a holder starts a request when may_write says so; none may run while the other holds."""
    store, clock = site
    store.put_outside(NAME, "")                # released: a, asking first, takes it at once
    api_a = FakeCoordination(store)
    a = candidate(api_a, "a_1", clock, duration=40, renew_deadline=10, retry_period=2)
    b = candidate(FakeCoordination(store), "b_2", clock, duration=15, renew_deadline=10, retry_period=2)
    in_flight = {"a_1": 0.0, "b_2": 0.0}      # when each one's last request ends
    took_over = None
    for step in range(400):                    # 200 s in half seconds
        if step % 4 == 0:
            a.attempt()
            b.attempt()
        if step == 40:
            api_a.failing = OSError("unreachable")   # a is cut off, b still reaches the API server
        for mine, other in ((a, b), (b, a)):
            if mine.may_write(30 if mine is a else 5):
                assert clock.now >= in_flight[other.identity], (mine.identity, clock.now, in_flight)
                in_flight[mine.identity] = clock.now + (30 if mine is a else 5)
        if took_over is None and b.held():
            took_over = clock.now
        clock.now += 0.5
    assert took_over is not None and holder(store) == "b_2"
    assert took_over >= 1000 + 20 + 40       # a's last renewal (step 40) + a's duration, not b's 15


# --- may_write: no request outlasts the lease (issue 29) ---------------------------------------


def test_may_write_is_true_only_for_a_request_that_ends_before_a_standby_may_take_over(site):
    store, clock = site
    api = FakeCoordination(store)
    a = candidate(api, "a_1", clock)           # duration 15, renew deadline 10
    assert not a.may_write() and not a.may_write(0)
    a.attempt()
    clock.now = renewed = 1024.0               # a whole duration later, in exact binary seconds
    assert a.attempt()
    api.failing = OSError("unreachable")       # no renewal from now on
    for elapsed, seconds, allowed in ((0, 15, True), (0, 15.01, False), (4.99, 10, True), (5.01, 10, False),
                                      (7, 8, True), (7.01, 8, False), (9.99, 5, True), (9.99, None, True),
                                      (10, 0, False), (10, None, False), (0, 300, False)):
        clock.now = renewed + elapsed
        assert a.may_write(seconds) is allowed, (elapsed, seconds)
        assert a.held() is (elapsed < 10)
    assert a.may_write.__defaults__ == (None,)   # called with no request: held now
    clock.now = renewed + 2
    api.failing = None
    assert a.attempt() and a.may_write(15)     # renewed: the whole duration again


def test_a_standby_never_may_write(site):
    store, clock = site
    store.put_outside(NAME, "b_2")
    a = candidate(FakeCoordination(store), "a_1", clock)
    for _ in range(5):
        a.attempt()
        assert not a.may_write() and not a.may_write(0) and not a.may_write(1)
        clock.now += 2


def test_the_duration_written_is_whole_seconds_and_what_may_write_counts_on(site):
    store, clock = site
    with pytest.raises(ValueError):            # 2.5 s would be written as 2, within the deadline
        candidate(FakeCoordination(store), "a_1", clock, duration=2.5, renew_deadline=2.2, retry_period=1)
    a = candidate(FakeCoordination(store), "a_1", clock, duration=6.9, renew_deadline=4, retry_period=1)
    a.attempt()
    clock.now += 6.95
    renewed = clock.now
    assert a.attempt() and store.leases[NAME]["spec"]["leaseDurationSeconds"] == 6
    clock.now = renewed + 1
    assert a.may_write(5) and not a.may_write(5.5)


# --- one holder identity per process start (issue 29) ----------------------------------------


IDENTITY = re.compile(r"(?P<host>.+)_(?P<pid>\d+)-[0-9a-f]{8}\Z")


def test_two_reconcilers_with_one_hostname_and_pid_are_two_candidates(site, monkeypatch):
    """Two cloned containers (one hostname, PID 1 in each), or a restart given the PID of one that
    died: each names itself afresh, so neither takes the other's Lease for its own."""
    store, clock = site
    monkeypatch.setattr(socket, "gethostname", lambda: "region-1")
    monkeypatch.setattr(os, "getpid", lambda: 1)
    values = {"kubernetes": {"system_namespace": NAMESPACE},
              "reconciler": {"lease": {"kubeconfig": "/etc/maas-kubevirt/kubeconfig", "namespace": "", "name": NAME,
                                       "duration": 15, "renew_deadline": 10, "retry_period": 2}}}
    a, b = (lease.candidate_from_values(values, api=FakeCoordination(store), say=lambda line: None) for _ in "ab")
    assert a.identity != b.identity
    for each in (a, b):
        assert IDENTITY.match(each.identity)["host"] == "region-1" and IDENTITY.match(each.identity)["pid"] == "1"
        assert lease.host_of(each.identity) == "region-1"
        each.clock, each.wall, each.jitter = clock, (lambda: T0 + timedelta(seconds=clock.now)), (lambda: 0.0)
    a.attempt()
    b.attempt()
    clock.now += 15.1
    assert a.attempt() and holder(store) == a.identity
    for _ in range(10):
        clock.now += 2
        assert not b.attempt() and a.attempt()
        assert a.held() and not b.held() and not b.may_write()
    assert store.leases[NAME]["spec"]["leaseTransitions"] == 0


def test_host_of_reads_the_hostname_of_new_and_old_identities():
    assert lease.host_of("region-2_4242-3f9a1c2b") == "region-2"
    assert lease.host_of("region-2_4242") == "region-2"
    assert lease.host_of("my_host_1-00000000") == "my_host"
    assert lease.host_of("outsider") == ""


def test_describe_and_expired_time_the_holder_by_the_duration_in_the_lease():
    """status and doctor read one Lease on any host: its holder's duration counts, not theirs."""
    now = datetime(2026, 12, 1, 12, 0, 30, tzinfo=timezone.utc)
    held = Record("host_1-00000000", 40, "2026-12-01T11:00:00.000001Z", "2026-12-01T12:00:05.000001Z", 0, "1")
    assert lease.describe(held, 15, now).endswith("(25 s ago)") and not lease.expired(held, 15, now)
    stale = Record("host_1-00000000", 20, "2026-12-01T11:00:00.000001Z", "2026-12-01T12:00:05.000001Z", 0, "1")
    assert lease.describe(stale, 40, now).endswith("not renewed for more than 20 s, so no reconciler is active")
    assert lease.expired(stale, 40, now)
    unknown = Record("host_1-00000000", None, None, "2026-12-01T12:00:05.000001Z", 0, "1")
    assert lease.expired(unknown, 15, now) and not lease.expired(unknown, 40, now)

