"""Two reconcilers on one site share one Lease (issue 23).

First, fast: two `reconcile` loops in threads of this process on the MAAS double, their Lease a
fake CoordinationV1Api (test_lease.py). Then where it runs: an API server of the control-plane
tier (etcd and kube-apiserver from CONTROLPLANE_BIN, RBAC on, the bundle's ServiceAccount, Role
and RoleBinding applied, a kubeconfig made with a bounded token as the README says) and the
real-MAAS tier's region, two `maas-kubevirt reconcile` processes each with its own audit log and
its own recording proxy in front of MAAS. What MAAS received is read from those proxies (every
request, with its start and end), from MAAS's events and from the power actions MAAS handed on
(the rack stand-in's BMC, or the power stub's lines in the region's log): never from the
reconcilers' own logs.

Short timings keep it fast: lease duration 14 s, renew deadline 4 s, retry period 1 s, interval 8 s,
and MAAS requests of at most 10 s (maas.timeout: the duration must cover the renew deadline and
one request); an outside holder's Lease says 28 s, which ours wait instead of their own 14 s.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from loopback import LoopbackServer
from maas_double import MaasDouble
from reconcile_helpers import SEED, Args, values_for, write_values
from test_lease import IDENTITY, NAME, NAMESPACE, T0, Clock, FakeCoordination, LeaseServer, LeaseStore

from maas_kubevirt import identity, lease, loop, status
from maas_kubevirt.audit import Audit
from maas_kubevirt.maas import MAASClient, MAASError, Signer
from maas_kubevirt.reconcile import (
    COMMISSION, CREATE_POOL, MOVE_POOL, RENAME, SET_PASSWORD, Action, Passwords, Reconciler, Settings, apply,
)

# The Lease is Kubernetes' and the reconciler's own: MAAS answers these cases as it answers
# test_real_maas.py's, which run on every release. On the pinned release only, to keep CI in its
# budget (docs/development.md).
pytestmark = [pytest.mark.pinned_maas, pytest.mark.timing]

# A standby sees the holder's last renewal up to one jittered retry (2.2 x retry_period) late and
# tries again as late after the duration: it takes over within duration + 4.4 x retry_period.
DURATION, RENEW_DEADLINE, RETRY_PERIOD, INTERVAL, TIMEOUT = 14, 4, 1, 8, 10
OUTSIDE = 2 * DURATION   # the leaseDurationSeconds an outside holder writes
FAST = {"duration": 3, "renew_deadline": 2, "retry_period": 1}
ROTATIONS = identity.ROTATIONS_CONFIGMAP


# --- fast: two loops in this process, the MAAS double, a fake Lease ------------------------------


@pytest.fixture
def shared_lease(monkeypatch):
    """Every candidate of this test on one in-memory Lease. Each names itself (lease.holder_identity):
    two loops in one process, one hostname and one PID, are still two candidates."""
    store = LeaseStore()
    monkeypatch.setattr(lease.config, "coordination_api", lambda path: FakeCoordination(store))
    # The same access reads the credential generations: none rotated here (test_rotation.py has them).
    monkeypatch.setattr(loop, "rotator_from_values", lambda values: NoRotations())
    monkeypatch.delenv("MAAS_API_KEY", raising=False)
    return store


class NoRotations:
    """The rotations ConfigMap of a site that never rotated."""

    def read(self) -> dict:
        return {}

    def bump(self, vm: str, namespace: str) -> int:
        raise AssertionError(f"nothing here should need rotating, yet {vm}.{namespace} did")


def leased_values(directory: Path, double: MaasDouble, **timings: int) -> dict:
    directory.mkdir()
    values = values_for(directory, double)
    values["reconciler"]["lease"].update(kubeconfig=str(directory / "kubeconfig"), **(timings or FAST))
    return values


def test_two_loops_on_one_lease_write_each_vm_once(tmp_path, shared_lease, capsys):
    """Both run `reconcile --once`: one holds the Lease, cycles and releases it; the other then
    holds it, resyncs and finds nothing to do (or gives up waiting): one PUT, one commission each."""
    with MaasDouble() as double:
        vms = [double.add_vm(f"web{n}", "lease-fast") for n in range(4)]
        codes: list[int] = []
        threads = [threading.Thread(target=lambda v=v: codes.append(loop.main(v, Args(once=True))))
                   for v in (leased_values(tmp_path / "a", double), leased_values(tmp_path / "b", double))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert codes == [0, 0], capsys.readouterr().err
        for sid in vms:
            assert [m for m, target, _ in double.writes if target == sid and m == "PUT"] == ["PUT"], double.writes
            assert [sid for sid2, _ in double.commissions if sid2 == sid] == [sid]
        assert [w[2]["name"] for w in double.writes if w[1] == "resourcepools/"] == ["lease-fast"]
    err = capsys.readouterr().err
    assert err.count("held by this process") >= 1 and "released" in err
    assert shared_lease.leases[NAME]["spec"]["holderIdentity"] == ""   # the last one released it
    names = {w["spec"]["holderIdentity"] for w in shared_lease.writes} - {""}
    assert 1 <= len(names) <= 2 and all(IDENTITY.match(name) for name in names), names


def test_a_standby_sends_maas_nothing_and_says_who_holds_the_lease(tmp_path, shared_lease, capsys):
    shared_lease.put_outside(NAME, "elsewhere_7")
    stop = threading.Event()

    def renew() -> None:   # someone else's holder, renewing every half second
        while not stop.wait(0.5):
            shared_lease.put_outside(NAME, "elsewhere_7", renewTime=lease.micro_time(lease._utc_now()))

    renewer = threading.Thread(target=renew, daemon=True)
    renewer.start()
    try:
        with MaasDouble() as double:
            double.add_vm("web1", "lease-standby")
            started = time.monotonic()
            code = loop.main(leased_values(tmp_path / "a", double), Args(once=True))
            waited = time.monotonic() - started
            assert code == 0
            assert double.request_count == 0 and double.writes == []
    finally:
        stop.set()
        renewer.join()
    err = capsys.readouterr().err
    assert f"lease {NAMESPACE}/{NAME}: standby, held by elsewhere_7" in err
    assert "standby, nothing done" in err
    assert err.count("standby, held by elsewhere_7") == 1      # one line per change of state
    assert FAST["duration"] + 3 * FAST["retry_period"] <= waited < FAST["duration"] + 3 * FAST["retry_period"] + 5


def kubeconfig_of(server: LeaseServer, path: Path) -> Path:
    """A kubeconfig naming the LeaseServer, with no credential (it asks for none)."""
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": f"http://127.0.0.1:{server.http.server_address[1]}"}}],
        "users": [{"name": "u", "user": {}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
    return path


def test_status_shows_who_holds_the_lease_and_since_when(tmp_path, capsys, monkeypatch):
    store = LeaseStore()
    store.put_outside(NAME, "region-2_4242", acquireTime="2026-12-01T10:00:00.000001Z",
                      renewTime=lease.micro_time(lease._utc_now()))
    monkeypatch.delenv("MAAS_API_KEY", raising=False)
    with MaasDouble() as double, LeaseServer(store) as server:
        kubeconfig = kubeconfig_of(server, tmp_path / "kubeconfig")
        values = values_for(tmp_path, double)
        values["reconciler"]["lease"]["kubeconfig"] = str(kubeconfig)
        assert status.main(values, Args()) == 0
        out = capsys.readouterr().out
        assert (f"lease {NAMESPACE}/{NAME}: held by region-2_4242 since 2026-12-01T10:00:00.000001Z, renewed "
                in out.splitlines()[-1])
        assert out.splitlines()[-1].endswith("(another host: a reconciler running here stands by)")
        # --json: the same Lease as fields, and the table's sentence as "line".
        assert status.main(values, Args(json=True)) == 0
        held = json.loads(capsys.readouterr().out)["lease"]
        assert {k: v for k, v in held.items() if k != "line"} == {
            "namespace": NAMESPACE, "name": NAME, "exists": True, "holder": "region-2_4242",
            "acquired": "2026-12-01T10:00:00.000001Z", "renewed": held["renewed"], "this_host": False, "error": None}
        assert held["line"].startswith(f"lease {NAMESPACE}/{NAME}: held by region-2_4242 since ")
        store.put_outside(NAME, f"{socket.gethostname()}_1", renewTime=lease.micro_time(lease._utc_now()))
        assert status.main(values, Args()) == 0
        assert capsys.readouterr().out.splitlines()[-1].endswith("(this host)")
        store.delete(NAME)
        assert status.main(values, Args()) == 0
        assert capsys.readouterr().out.splitlines()[-1] == (
            f"lease {NAMESPACE}/{NAME}: does not exist: no reconciler has taken part yet")
        values["reconciler"]["lease"]["kubeconfig"] = str(tmp_path / "missing")
        assert status.main(values, Args()) == 0
        assert "cannot be read: reconciler.lease.kubeconfig: cannot read" in capsys.readouterr().out
        assert status.main(values, Args(json=True)) == 0
        unread = json.loads(capsys.readouterr().out)["lease"]
        assert unread["exists"] is None and unread["error"].startswith("reconciler.lease.kubeconfig: cannot read")
        values["reconciler"]["lease"]["kubeconfig"] = ""
        assert status.main(values, Args()) == 0
        assert "lease" not in capsys.readouterr().out    # no lease configured: status as before
        assert status.main(values, Args(json=True)) == 0
        assert json.loads(capsys.readouterr().out)["lease"] is None


def waited(check, what: str, timeout: float = 60.0):
    """check()'s first true value, asked every 0.2 s; AssertionError after timeout (no timing is asserted)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_two_reconciler_processes_on_one_host_are_two_candidates_with_their_own_names(tmp_path):
    """Two `maas-kubevirt reconcile` processes of one host on one Lease: each writes it under its own
    `<hostname>_<pid>-<random>`; the standby names the holder, and takes over once it stops."""
    store = LeaseStore()
    with MaasDouble() as double, LeaseServer(store) as server:
        sid = double.add_vm("web1", "lease-procs")
        path = write_values(tmp_path, double)
        settings = yaml.safe_load(path.read_text())
        settings["reconciler"] = {"lease": {"kubeconfig": str(kubeconfig_of(server, tmp_path / "kubeconfig")), **FAST}}
        path.write_text(yaml.safe_dump(settings))
        env = {k: v for k, v in os.environ.items() if k not in ("MAAS_API_KEY", "CREDENTIALS_DIRECTORY")}
        processes = []
        try:
            for name in ("a", "b"):
                with open(tmp_path / f"{name}.err", "wb") as err:
                    processes.append(subprocess.Popen(
                        [sys.executable, "-m", "maas_kubevirt", "--values", str(path), "reconcile"], env=env,
                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err))

            def holding():
                holder = store.leases.get(NAME, {}).get("spec", {}).get("holderIdentity") or ""
                found = IDENTITY.match(holder)
                if found and found["host"] == socket.gethostname():
                    return next(((p, holder) for p in processes if found["pid"] == str(p.pid)), None)
                return None

            first, first_name = waited(holding, "a holder")
            second = next(p for p in processes if p is not first)
            waited(lambda: f"standby, held by {first_name}" in (tmp_path / f"{'ab'[processes.index(second)]}.err")
                   .read_text(), "the standby naming the holder")
            first.send_signal(signal.SIGTERM)      # releases the Lease
            assert first.wait(30) == 0
            taken, second_name = waited(lambda: (holding() or (None, ""))[0] is second and holding(), "the takeover")
            assert second_name != first_name and lease.host_of(second_name) == lease.host_of(first_name)
            second.send_signal(signal.SIGTERM)
            assert second.wait(30) == 0
        finally:
            for process in processes:
                if process.poll() is None:
                    process.kill()
                    process.wait(10)
        assert [m for m, target, _ in double.writes if target == sid and m == "PUT"] == ["PUT"]
    assert {w["spec"]["holderIdentity"] for w in store.writes} == {first_name, second_name, ""}


# --- no request outlasts the lease, no rotation without it (issue 29) ---------------------------


class LeasedMaas:
    """MAAS as apply sees it, each request taking ``takes`` seconds of the test's clock (a commission
    ``commission_takes``, then raising ``commission_failure`` if set); every start is kept."""

    timeout, commission_timeout = 8.0, 300.0

    def __init__(self, clock: Clock, commission_takes: float = 3.0, commission_failure: Exception | None = None):
        self.clock, self.commission_takes, self.commission_failure = clock, commission_takes, commission_failure
        self.started: list[tuple[str, float]] = []

    def _request(self, kind: str, takes: float) -> dict:
        self.started.append((kind, self.clock.now))
        self.clock.now += takes
        return {}

    def update_machine(self, system_id, hide=(), **fields):
        return self._request("PUT", 3.0)

    def create_pool(self, name, description=""):
        return self._request("pool", 3.0)

    def commission(self, system_id, skip_bmc_config=True):
        self._request("commission", self.commission_takes)
        if self.commission_failure is not None:
            raise self.commission_failure
        return {}

    def machines_by_id(self, system_ids):
        return [{"system_id": system_ids[0], "status_name": "Commissioning"}]


class NotedAudit(Audit):
    """Audit records kept in memory with their notes, nothing printed."""

    def __init__(self) -> None:
        super().__init__("")
        self.records: list[dict] = []

    def write(self, action, system_id, hostname, before, after, outcome, reason="", note="", **extra):
        self.records.append({"action": action, "system_id": system_id, "outcome": outcome, "reason": reason,
                             "note": note})
        return {}


def two_new_vms() -> list[Action]:
    actions = [Action(CREATE_POOL, None, None, namespace="vms", after="vms")]
    for n in range(2):
        common = dict(system_id=f"m{n:05d}", hostname=f"lucky-{n}", vm=f"web{n}", namespace="vms")
        actions += [Action(SET_PASSWORD, before="placeholder", after="derived",
                           address=f"web{n}.vms.bmc.example.com", **common),
                    Action(RENAME, before=f"lucky-{n}", after=f"web{n}-vms", **common),
                    Action(MOVE_POOL, before="default", after="vms", **common),
                    Action(COMMISSION, before="New", after="Commissioning", **common)]
    return actions


def holding_candidate(clock: Clock, store: LeaseStore | None = None) -> tuple[lease.Candidate, float]:
    """A candidate (duration 15, renew deadline 10) that holds the Lease from the returned moment
    and will not renew it again: cut off from the API server."""
    api = FakeCoordination(store or LeaseStore())
    holder = lease.Candidate(api, NAMESPACE, NAME, "a_1-00000000", duration=15, renew_deadline=10, retry_period=2,
                             clock=clock, wall=lambda: T0 + timedelta(seconds=clock.now), jitter=lambda: 0.0,
                             say=lambda line: None)
    holder.attempt()
    clock.now = renewed = 1016.0
    assert holder.attempt() and holder.held()
    api.failing = OSError("unreachable")
    return holder, renewed


def test_no_maas_request_starts_that_could_end_after_a_standby_may_take_over(capsys):
    """Requests of up to 8 s, 3 s each here, from a holder renewed at 1016 s and cut off: a standby may
    take over at 1031 s, so the last request may start at 1023 s, though the holder still holds it until 1026 s."""
    clock = Clock()
    holder, renewed = holding_candidate(clock)
    client = LeasedMaas(clock)
    outcome = apply(client, two_new_vms(), NotedAudit(), passwords=Passwords(SEED), may_write=holder.may_write)
    assert [kind for kind, _ in client.started] == ["pool", "PUT", "commission"]
    assert all(start + client.timeout <= renewed + 15 for _, start in client.started), client.started
    assert outcome.interrupted and outcome.ok == 5
    assert clock.now == renewed + 9 and holder.held()    # the next PUT was refused for its timeout alone


@pytest.mark.parametrize("failure, outcome, what", [
    (None, "ok", "MAAS accepted the commission"),
    (MAASError("POST", "machines/m00000/?op=commission", None, "timed out", "timeout", in_flight=True), "ok",
     "MAAS went on, it shows the machine Commissioning"),
    (MAASError("POST", "machines/m00000/?op=commission", 400, "Commission is not available"), "skipped",
     "MAAS refused it"),
])
def test_a_commission_answered_after_the_lease_was_lost_is_audited_so_and_ends_the_cycles_writes(
        capsys, failure, outcome, what):
    """A commission may take longer than any lease (MAAS answers once the VM is on): it starts only
    while held, and its answer is checked against the lease."""
    clock = Clock()
    holder, renewed = holding_candidate(clock)
    client, audit = LeasedMaas(clock, commission_takes=12.0, commission_failure=failure), NotedAudit()
    result = apply(client, two_new_vms(), audit, passwords=Passwords(SEED), may_write=holder.may_write)
    assert [kind for kind, _ in client.started] == ["pool", "PUT", "commission"] and not holder.held()
    (commission,) = [r for r in audit.records if r["action"] == COMMISSION]
    assert commission["outcome"] == outcome and commission["system_id"] == "m00000"
    assert commission["note"] == f"the lease was lost while MAAS answered: {what}; no further write from this cycle"
    assert result.interrupted
    assert [r["note"] for r in audit.records if r["action"] != COMMISSION] == ["", "", "", ""]


class Rotations:
    """The rotations ConfigMap, every bump kept."""

    def __init__(self) -> None:
        self.bumps: list[tuple[str, str]] = []

    def read(self) -> dict:
        return {}

    def bump(self, vm: str, namespace: str) -> int:
        self.bumps.append((vm, namespace))
        return len(self.bumps)


def test_a_reconciler_that_does_not_hold_the_lease_never_writes_a_credential_generation(tmp_path, capsys):
    """A password found beside another address may have leaked: only the holder bumps its VM's
    generation; a standby, and a holder whose lease has lapsed, leave the ConfigMap alone."""
    clock, store = Clock(), LeaseStore()
    with MaasDouble() as double:
        sid = double.add_vm("web1", "vms", status="Deployed")
        reconciler = Reconciler(MAASClient(double.url, Signer(*double.api_key), timeout=1),
                                Settings(domain="bmc.example.com", commission="never"), Audit(""),
                                passwords=Passwords(SEED))
        reconciler.restore([{"action": "reset-password", "system_id": sid, "outcome": "ok", "leak": True,
                             "identity": "web1.vms", "generation": 0}])
        assert set(reconciler.needing_rotation()) == {("web1", "vms")}
        reconciler.rotator = rotations = Rotations()
        store.put_outside(NAME, "elsewhere_7-00000000")
        standby = lease.Candidate(FakeCoordination(store), NAMESPACE, NAME, "b_2-00000000", duration=15,
                                  renew_deadline=10, retry_period=2, clock=clock,
                                  wall=lambda: T0 + timedelta(seconds=clock.now), jitter=lambda: 0.0,
                                  say=lambda line: None)
        assert not standby.attempt()
        reconciler.may_write = standby.may_write
        reconciler.cycle()
        reconciler.rotate_exposed()
        assert rotations.bumps == []
        clock.now += 15.1                       # elsewhere_7 never renewed: standby takes it
        assert standby.attempt() and standby.held()
        clock.now += 10.5                       # and lets it lapse (no renewal for the renew deadline)
        assert not standby.held()
        reconciler.rotate_exposed()
        assert rotations.bumps == []
        assert standby.attempt() and standby.held()
        reconciler.rotate_exposed()             # held: the one bump
        assert rotations.bumps == [("web1", "vms")]


# --- where it runs: the control-plane tier's API server and MAAS's own region ---------------------


def _maas_tier():
    """SEED and helpers of the real-MAAS tier (the same seed: doctor there checks every VM's password)."""
    import test_real_maas

    return test_real_maas


@dataclass
class Entry:
    """One request MAAS received through a proxy: when it started and ended (monotonic seconds)."""

    method: str
    path: str
    status: int | None
    started: float
    ended: float

    @property
    def write(self) -> bool:
        return self.method != "GET"


class MaasRequestLog(LoopbackServer):
    """MAAS's API on another port of 127.0.0.1, passed through whole (a request whose client died
    still reaches MAAS, as on a real region), every request recorded."""

    def __init__(self, target_port: int, name: str):
        self.target = f"http://127.0.0.1:{target_port}"
        self.name = name
        self.entries: list[Entry] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/MAAS/"

    def start(self) -> "MaasRequestLog":
        log = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def forward(self) -> None:
                started = time.monotonic()
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("host", "connection", "content-length", "accept-encoding")}
                status = None
                try:
                    reply = requests.request(self.command, log.target + self.path, data=body, headers=headers,
                                             allow_redirects=False, timeout=900)
                    status = reply.status_code
                except requests.RequestException:
                    self.close_connection = True
                    return
                finally:
                    with log.lock:
                        log.entries.append(Entry(self.command, self.path, status, started, time.monotonic()))
                try:
                    self.send_response(reply.status_code)
                    for name, value in reply.headers.items():
                        if name.lower() not in ("connection", "content-length", "transfer-encoding",
                                                "content-encoding", "date", "server"):
                            self.send_header(name, value)
                    self.send_header("Content-Length", str(len(reply.content)))
                    self.end_headers()
                    self.wfile.write(reply.content)
                except OSError:
                    pass   # the reconciler is gone (SIGKILL): MAAS has done the request anyway

            do_GET = do_POST = do_PUT = do_DELETE = forward

        self.serve(ThreadingHTTPServer(("127.0.0.1", 0), Handler), f"maas-log-{self.name}")
        return self

    def snapshot(self) -> list[Entry]:
        with self.lock:
            return list(self.entries)


@dataclass
class Process:
    """One `maas-kubevirt reconcile` with its own values, audit log and proxy."""

    name: str
    values: Path
    proxy: MaasRequestLog
    popen: subprocess.Popen
    stderr: Path

    def named(self, holder: str | None) -> bool:
        """Whether a holderIdentity is this process's (``<hostname>_<pid>-<random>``)."""
        found = IDENTITY.match(holder or "")
        return bool(found) and found["host"] == socket.gethostname() and found["pid"] == str(self.popen.pid)

    def log(self) -> str:
        return self.stderr.read_text(errors="replace")


@pytest.fixture(scope="module")
def lease_plane(tmp_path_factory):
    """etcd and kube-apiserver of the control-plane tier, with the bundle's reconciler RBAC applied."""
    from controlplane import APIServerOnly, binaries_dir

    plane = APIServerOnly(bin_dir=binaries_dir(), work=tmp_path_factory.mktemp("lease-plane"))
    try:
        plane.start()
    except BaseException as failure:
        plane.stop()
        pytest.fail(f"the API server did not start: {failure}\n{plane.log_tail('kube-apiserver', 30)}", pytrace=False)
    yield plane
    plane.stop()


@pytest.fixture(scope="module")
def lease_site(lease_plane, real_maas, tmp_path_factory):
    """The bundle rendered with the lease configured, its namespace and reconciler RBAC applied, and
    the kubeconfig the MAAS hosts use, made from the ServiceAccount as the README says."""
    tier = _maas_tier()
    directory = tmp_path_factory.mktemp("lease-site")
    seed = directory / "seed"
    seed.write_text(tier.SEED + "\n")
    seed.chmod(0o600)
    key = directory / "api-key"
    key.write_text(real_maas.api_key + "\n")
    key.chmod(0o600)
    kubeconfig = directory / "reconciler.kubeconfig"
    base = {"redfish": {"domain": tier.DOMAIN}, "seed": {"file": str(seed)},
            "maas": {"url": real_maas.url, "api_key_file": str(key), "interval": INTERVAL, "timeout": TIMEOUT},
            "reconciler": {"lease": {"kubeconfig": str(kubeconfig), "duration": DURATION,
                                     "renew_deadline": RENEW_DEADLINE, "retry_period": RETRY_PERIOD}}}
    values = directory / "values.yaml"
    values.write_text(yaml.safe_dump(base))
    output = directory / "build"
    rendered = subprocess.run([str(tier.CLI), "--values", str(values), "render", "--output", str(output)],
                              capture_output=True, text=True, timeout=120)
    assert rendered.returncode == 0, rendered.stderr
    # The API server alone runs no Kyverno: the objects this feature adds, and their namespace.
    lease_plane.kubectl("apply", "-f", str(output / "kubernetes" / "system-namespace.yaml"),
                        "-f", str(output / "kubernetes" / "credential-rotations.yaml"),
                        "-f", str(output / "kubernetes" / "reconciler-rbac.yaml"))
    # docs/how-to/ha.md: a bounded token, then a kubeconfig of its own.
    account = "maas-kubevirt-reconciler"
    token = lease_plane.kubectl("-n", NAMESPACE, "create", "token", account, "--duration", "2h").stdout.strip()
    for args in (("set-cluster", "site", "--server", lease_plane.server, "--certificate-authority",
                  str(lease_plane.ca), "--embed-certs"),
                 ("set-credentials", "reconciler", "--token", token),
                 ("set-context", "reconciler", "--cluster", "site", "--user", "reconciler", "--namespace", NAMESPACE),
                 ("use-context", "reconciler")):
        done = subprocess.run([str(lease_plane.bin_dir / "kubectl"), "--kubeconfig", str(kubeconfig), "config", *args],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr.replace(token, "(token)")
    kubeconfig.chmod(0o600)
    del token
    return {"dir": directory, "base": base, "kubeconfig": kubeconfig, "output": output}


def as_reconciler(lease_plane, lease_site, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(lease_plane.bin_dir / "kubectl"), "--kubeconfig", str(lease_site["kubeconfig"]), *args],
                          capture_output=True, text=True, timeout=60)


def test_the_reconcilers_service_account_may_use_the_lease_and_the_rotations_configmap_and_nothing_else(
        lease_plane, lease_site):
    def can(*args: str) -> bool:
        done = as_reconciler(lease_plane, lease_site, "auth", "can-i", *args)
        assert done.stdout.strip() in ("yes", "no"), done.stdout + done.stderr
        return done.stdout.strip() == "yes"

    assert can("create", "leases", "-n", NAMESPACE)
    assert can("get", f"leases/{NAME}", "-n", NAMESPACE) and can("update", f"leases/{NAME}", "-n", NAMESPACE)
    for verb, what in (("get", "leases/another"), ("update", "leases/another"), ("list", "leases"),
                       ("watch", "leases"), ("delete", f"leases/{NAME}"), ("patch", f"leases/{NAME}"),
                       ("get", "secrets"), ("get", "configmaps"), ("create", "pods"), ("get", "serviceaccounts"),
                       ("get", "configmaps/another"), ("list", "configmaps"), ("watch", "configmaps"),
                       ("create", "configmaps"), ("delete", f"configmaps/{ROTATIONS}"),
                       ("patch", f"configmaps/{ROTATIONS}")):
        assert not can(verb, what, "-n", NAMESPACE), (verb, what)
    # The credential generations (issue 25): read every cycle, bumped after a possible leak.
    assert can("get", f"configmaps/{ROTATIONS}", "-n", NAMESPACE)
    assert can("update", f"configmaps/{ROTATIONS}", "-n", NAMESPACE)
    assert not can("get", f"configmaps/{ROTATIONS}", "-n", "default")
    assert not can("create", "leases", "-n", "default") and not can("get", "namespaces")
    rules = as_reconciler(lease_plane, lease_site, "auth", "can-i", "--list", "-n", NAMESPACE).stdout
    # Resource rules first, then non-resource URLs (discovery, /healthz ...) as "[/path]".
    resources = {line.split()[0] for line in rules.splitlines()[1:] if line.strip()} - {
        word for word in rules.split() if word.startswith("[")}
    # Besides the Lease: what every authenticated user may (system:basic-user's self-reviews).
    assert resources - {"selfsubjectreviews.authentication.k8s.io", "selfsubjectaccessreviews.authorization.k8s.io",
                        "selfsubjectrulesreviews.authorization.k8s.io"} == {"leases.coordination.k8s.io",
                                                                          "configmaps"}, rules


# --- the scenarios ------------------------------------------------------------------------------


class Site:
    """MAAS, the Lease, and the reconciler processes of one scenario (each its own namespace)."""

    def __init__(self, real_maas, lease_plane, lease_site, work: Path, namespace: str):
        self.maas, self.plane, self.site, self.work, self.namespace = real_maas, lease_plane, lease_site, work, namespace
        self.processes: list[Process] = []
        self.vms: dict[str, str] = {}    # system_id -> its BMC host
        self.rack = hasattr(real_maas, "set_rack")

    # MAAS
    def enlist(self, count: int, first: int = 0) -> list[str]:
        """VMs as the script enlists them: the bare host, a fresh random user, the placeholder."""
        tier = _maas_tier()
        ids = []
        for n in range(first, first + count):
            host = f"vm{n}.{self.namespace}.{tier.DOMAIN}"
            enlisted = self.maas.enlist({"power_address": host, "power_user": identity.ENLIST_USER_PREFIX
                                         + secrets.token_hex(16), "power_pass": identity.PLACEHOLDER_PASSWORD,
                                         "node_id": "1"}, tier.new_mac())
            assert enlisted.status == 200, enlisted.body
            self.vms[enlisted.system_id] = host
            ids.append(enlisted.system_id)
        return ids

    def converged(self, ids) -> bool:
        for sid in ids:
            machine = self.maas.machine(sid)
            vm = self.vms[sid].split(".")[0]
            if machine["status_name"] != "Commissioning" or machine["hostname"] != f"{vm}-{self.namespace}":
                return False
        return True

    def wait(self, check, timeout: float, what: str, every: float = 0.5):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = check()
            if value:
                return value
            time.sleep(every)
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n" + self.logs())

    def power_actions(self, sid: str) -> int:
        """Power-ons MAAS handed on for the machine: the BMC's Reset On requests (rack stand-in),
        or the power stub's lines in the region's log."""
        if self.rack:
            return sum(1 for seen in self.maas.bmc.seen(self.vms[sid]) if seen.action == "Reset On")
        return self.maas.log.read_text(errors="replace").count(f"power stub: power_on for {sid} counted")

    def commissions_started(self, sid: str) -> int:
        return sum(1 for event in self.maas.events(sid) if event["type"] == _maas_tier().COMMISSION_EVENT)

    # the Lease
    def record(self):
        found = self.plane.kubectl("-n", NAMESPACE, "get", "lease", NAME, "-o", "json", check=False)
        if found.returncode != 0:
            return None
        import json

        return lease.record_of(json.loads(found.stdout))

    def holder(self) -> Process | None:
        record = self.record()
        return next((p for p in self.processes if record and p.named(record.holder)), None)

    # the reconcilers
    def start(self, name: str) -> Process:
        proxy = MaasRequestLog(self.maas.port, name).start()
        values = self.work / f"values-{name}.yaml"
        settings = yaml.safe_load(yaml.safe_dump(self.site["base"]))
        settings["maas"].update(url=proxy.url, audit_log=str(self.work / f"audit-{name}.log"))
        values.write_text(yaml.safe_dump(settings))
        stderr = self.work / f"reconcile-{name}.err"
        env = {k: v for k, v in os.environ.items() if k not in ("MAAS_API_KEY", "CREDENTIALS_DIRECTORY")}
        with open(stderr, "wb") as err, open(self.work / f"reconcile-{name}.out", "wb") as out:
            popen = subprocess.Popen([str(_maas_tier().CLI), "--values", str(values), "reconcile"], stdout=out,
                                     stderr=err, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        process = Process(name, values, proxy, popen, stderr)
        self.processes.append(process)
        return process

    def stop(self) -> None:
        for process in self.processes:
            if process.popen.poll() is None:
                os.killpg(process.popen.pid, signal.SIGTERM)
        for process in self.processes:
            try:
                process.popen.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.popen.pid, signal.SIGKILL)
                process.popen.wait(10)
            process.proxy.stop()
        # The next scenario starts from no Lease (its candidates wait one duration first).
        self.plane.kubectl("-n", NAMESPACE, "delete", "lease", NAME, "--ignore-not-found", check=False)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} (pid {p.popen.pid}) ---\n" + "\n".join(p.log().splitlines()[-25:])
                         for p in self.processes)

    # what MAAS received
    def entries(self) -> list[tuple[Process, Entry]]:
        return sorted(((p, e) for p in self.processes for e in p.proxy.snapshot()), key=lambda pe: pe[1].started)

    def writes_of(self, sid: str) -> dict[str, int]:
        path = f"/MAAS/api/2.0/machines/{sid}/"
        found = [e for _, e in self.entries() if e.path.split("?")[0] == path]
        return {"put": sum(e.method == "PUT" for e in found),
                "commission": sum(e.method == "POST" and "op=commission" in e.path for e in found)}

    def assert_each_vm_once(self, ids) -> None:
        for sid in ids:
            counts = self.writes_of(sid)
            assert counts == {"put": 1, "commission": 1}, (sid, counts, self.logs())
            assert self.commissions_started(sid) == 1, sid
            assert self.power_actions(sid) == 1, sid

    def assert_never_both_writing(self) -> None:
        """Writes change hands only with the Lease, and a new holder's first write starts no
        earlier than duration - renew_deadline after the old one's last (less what the request takes
        to reach the proxy)."""
        writes = [(p, e) for p, e in self.entries() if e.write]
        for (before, last), (after, first) in zip(writes, writes[1:]):
            if before is not after:
                assert first.started - last.started >= DURATION - RENEW_DEADLINE - 0.5, (
                    before.name, after.name, first.started - last.started, self.logs())


@pytest.fixture
def scenario(real_maas, lease_plane, lease_site, tmp_path):
    """A Site for one test, in a namespace named after it; its processes stopped and its Lease
    deleted at the end; the power mode put back as it was."""
    before = real_maas.power_mode if hasattr(real_maas, "power_mode") else None
    made: list[Site] = []

    def make(namespace: str) -> Site:
        site = Site(real_maas, lease_plane, lease_site, tmp_path, namespace)
        if site.rack:    # MAAS's own Redfish driver against the loopback BMC: a VM starts in 2 s
            real_maas.set_rack(2.0, _maas_tier().SEED)
        else:
            real_maas.set_stub(True)
        made.append(site)
        return site

    yield make
    for site in made:
        site.stop()
        print(site.logs())   # shown with a failure
    if before == "rack":
        real_maas.set_rack(real_maas.bmc.start_time, real_maas.bmc.seed)
    elif before is not None:
        real_maas.set_stub(before == "on")


def test_two_reconcilers_on_one_lease_write_each_vm_exactly_once(scenario):
    """Issue 23's measurement again: 10 VMs, two reconcilers, one region. Before the lease: 20 PUTs,
    20 commissions, 20 power actions. With it: 10, 10 and 10."""
    site = scenario("lease-a")
    ids = site.enlist(10)
    a, b = site.start("a"), site.start("b")
    first = site.wait(site.record, DURATION * 3, "the Lease made by one of them")
    site.wait(lambda: site.converged(ids), 240, "every VM renamed and commissioning")
    time.sleep(INTERVAL + 2)    # and one more cycle of the holder: nothing more to do
    site.assert_each_vm_once(ids)
    site.assert_never_both_writing()
    holder = site.holder()
    assert holder is not None, site.logs()
    standby = b if holder is a else a
    print(f"holder {holder.name}: {len(holder.proxy.snapshot())} requests; standby {standby.name}: "
          f"{len(standby.proxy.snapshot())}")
    assert "held by this process" in holder.log()
    assert f"lease {NAMESPACE}/{NAME}: standby" in standby.log()
    if site.record().transitions == first.transitions:   # the first holder held it throughout
        assert standby.proxy.snapshot() == [], "the standby sent MAAS requests while the holder held the lease"


def test_sigkill_of_the_holder_mid_cycle_the_standby_takes_over_and_converges_the_rest(scenario):
    site = scenario("lease-b")
    ids = site.enlist(10)
    site.start("a")
    site.start("b")
    holder = site.wait(site.holder, DURATION * 3, "a holder")
    site.wait(lambda: sum(e.method == "POST" and "op=commission" in e.path for e in holder.proxy.snapshot()) >= 3,
              120, "three commissions sent by the holder")
    killed = time.monotonic()
    os.killpg(holder.popen.pid, signal.SIGKILL)
    holder.popen.wait(10)
    done_before = sum(site.commissions_started(sid) for sid in ids)
    assert done_before < len(ids), "the holder finished before it was killed: nothing left to take over"
    standby = next(p for p in site.processes if p is not holder)
    first = site.wait(lambda: next((e for e in standby.proxy.snapshot()), None), DURATION + INTERVAL + 10,
                      "the standby's first MAAS request")
    took = first.started - killed
    print(f"takeover after SIGKILL: {took:.2f} s (lease duration {DURATION} s + interval {INTERVAL} s); "
          f"{done_before} of {len(ids)} commissions done by the killed holder")
    assert took <= DURATION + INTERVAL, site.logs()
    site.wait(lambda: site.converged(ids), 240, "the rest converged by the new holder")
    time.sleep(INTERVAL + 2)
    site.assert_each_vm_once(ids)
    site.assert_never_both_writing()
    assert site.holder() is standby
    assert any(e.write for e in standby.proxy.snapshot())


def test_a_holder_cut_off_from_the_api_server_stops_writing_within_the_renew_deadline(scenario, lease_plane):
    site = scenario("lease-c")
    ids = site.enlist(10)
    site.start("a")
    site.start("b")
    holder = site.wait(site.holder, DURATION * 3, "a holder")
    site.wait(lambda: sum(e.method == "POST" and "op=commission" in e.path for e in holder.proxy.snapshot()) >= 2,
              120, "two commissions sent by the holder")
    stopped = time.monotonic()
    lease_plane.stop_apiserver()
    try:
        time.sleep(RENEW_DEADLINE + 2 * INTERVAL)
        writes = [e for _, e in site.entries() if e.write]
        last = max(e.started for e in writes)
        print(f"last write started {last - stopped:.2f} s after the API server stopped "
              f"(renew deadline {RENEW_DEADLINE} s)")
        # The reconciler asks the Lease just before each request; the proxy sees it a moment later.
        assert last - stopped < RENEW_DEADLINE + 0.5, site.logs()
        assert not [e for _, e in site.entries() if e.started > stopped + RENEW_DEADLINE + 2], (
            "a reconciler without the lease still asks MAAS")
        assert sum(site.commissions_started(sid) for sid in ids) < len(ids), "nothing was left to do"
        assert "lost" in holder.log()
    finally:
        lease_plane.start_apiserver()
    site.wait(lambda: site.converged(ids), 300, "convergence once the API server is back")
    time.sleep(INTERVAL + 2)
    site.assert_each_vm_once(ids)
    site.assert_never_both_writing()


def test_an_outside_holder_or_a_deleted_lease_changes_only_who_holds_it(scenario, lease_plane):
    site = scenario("lease-d")
    ids = site.enlist(2)
    site.start("a")
    site.start("b")
    site.wait(lambda: site.converged(ids), 180, "two VMs converged")
    holder = site.wait(site.holder, DURATION * 3, "a holder")
    time.sleep(INTERVAL)

    # Deleted: its holder makes it again at its next retry; the standby waits a whole duration.
    lease_plane.kubectl("-n", NAMESPACE, "delete", "lease", NAME)
    site.wait(site.record, 5 * RETRY_PERIOD, "the Lease made again")
    for _ in range(DURATION + 2):
        assert site.holder() is holder, site.logs()
        time.sleep(1)

    # Held by a name from outside, for its own longer duration: ours stop writing at once and wait
    # for it to expire by that duration, not their own.
    record = site.record()
    patched = time.monotonic()
    lease_plane.kubectl("-n", NAMESPACE, "patch", "lease", NAME, "--type", "merge", "-p", (
        '{"spec": {"holderIdentity": "outsider", "leaseDurationSeconds": %d, "renewTime": "%s"}}'
        % (OUTSIDE, lease.micro_time(lease._utc_now()))))
    site.wait(lambda: "lost (held by outsider)" in holder.log(), 3 * RETRY_PERIOD + 2, "the holder standing down")
    quiet = time.monotonic()
    late = site.enlist(1, first=10)
    site.wait(lambda: (site.record() or record).holder not in ("outsider", ""), OUTSIDE + 10,
              "one of ours holding it again")
    retaken = time.monotonic()
    print(f"retaken {retaken - patched:.2f} s after the outsider's patch (its duration {OUTSIDE} s, ours {DURATION} s)")
    assert retaken - patched >= OUTSIDE - 0.5, site.logs()
    # Each candidate saw the outsider's record no earlier than the patch: none of ours holds the
    # Lease for the outsider's whole duration after it, so none writes to MAAS (a cycle under way
    # when the holder stood down may finish its reads), and the one that was standby throughout
    # sends nothing.
    meanwhile = [(p, e) for p, e in site.entries() if quiet < e.started < patched + OUTSIDE - 0.2]
    assert not [e for _, e in meanwhile if e.write], site.logs()
    assert not [e for p, e in meanwhile if p is not holder], site.logs()
    site.wait(lambda: site.converged(late), 120, "the VM enlisted meanwhile converged")
    time.sleep(INTERVAL + 2)
    site.assert_each_vm_once(ids + late)
    site.assert_never_both_writing()
    assert site.record().transitions >= record.transitions + 1
