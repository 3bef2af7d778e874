"""The MAAS client: signing, URL building, retries, error lines, version check, API key."""

from __future__ import annotations

import http.client
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
import urllib3.exceptions
from hypothesis import given, strategies as st

sys.path.insert(0, str(Path(__file__).parent))

from conftest import require_tool  # noqa: E402
from maas_double import MaasDouble, populate  # noqa: E402

from maas_kubevirt import maas  # noqa: E402
from maas_kubevirt.maas import (  # noqa: E402
    MAASAuthError,
    MAASClient,
    MAASError,
    MAASForbidden,
    MAASTooLarge,
    MAASVersionError,
    Response,
    RetryPolicy,
    Signer,
    TransportError,
)
from maas_kubevirt.values import ValuesError  # noqa: E402

# Wall-clock bounds: run after the parallel workers, with the machine to itself (tests/conftest.py).
pytestmark = pytest.mark.timing

FAST = RetryPolicy(attempts=4, backoff=0.01, max_backoff=0.05, max_retry_after=0.2)


@pytest.fixture
def double():
    with MaasDouble() as running:
        yield running


def client_for(double: MaasDouble, **kw) -> MAASClient:
    kw.setdefault("retry", FAST)
    kw.setdefault("timeout", 1)
    return MAASClient(double.url, Signer(*double.api_key), **kw)


class Recorder:
    def __init__(self):
        self.sleeps: list[float] = []

    def __call__(self, seconds: float) -> bool:
        self.sleeps.append(seconds)
        return False


# --- signing and URLs ------------------------------------------------------------------------


def test_signer_plaintext_header_fresh_nonce_and_hidden_key():
    signer = Signer("ckey", "tkey", "tsecret")
    first = signer.headers("GET", "http://maas/MAAS/api/2.0/machines/")["Authorization"]
    second = signer.headers("GET", "http://maas/MAAS/api/2.0/machines/")["Authorization"]
    assert first.startswith("OAuth ")
    assert 'oauth_signature_method="PLAINTEXT"' in first
    assert 'oauth_signature="%26tsecret"' in first
    assert 'oauth_consumer_key="ckey"' in first and 'oauth_token="tkey"' in first
    nonce = lambda header: [p for p in header.split(", ") if "oauth_nonce" in p][0]  # noqa: E731
    assert nonce(first) != nonce(second)
    assert "tsecret" not in repr(signer) and "tkey" not in repr(signer)


@pytest.mark.parametrize("base", ["http://maas:5240/MAAS/", "http://maas:5240/MAAS", "http://maas:5240/MAAS/api/2.0/"])
def test_url_building(base):
    client = MAASClient(base, Signer("a", "b", "c"))
    assert client.url("machines/") == "http://maas:5240/MAAS/api/2.0/machines/"
    assert client.url("machines/", [("op", "power_parameters"), ("id", "a"), ("id", "b")]) == (
        "http://maas:5240/MAAS/api/2.0/machines/?op=power_parameters&id=a&id=b"
    )
    assert client.url("machines/x/", {"op": "commission"}).endswith("machines/x/?op=commission")


# --- readable errors -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, ctype, expected",
    [
        (b'{"hostname": ["Node with this Hostname already exists."]}', "application/json",
         "hostname: Node with this Hostname already exists."),
        (b'{"__all__": ["Commission is not available because of the current state of the node."]}',
         "application/json", "Commission is not available because of the current state of the node."),
        (b'{"name": ["a", "b"], "pool": ["c"]}', "application/json", "name: a b; pool: c"),
        (b"<html><head><title>Internal Server Error</title></head><body>x</body></html>", "text/html",
         "Internal Server Error"),
        (b"No Machine matches the given query.\n", "text/plain", "No Machine matches the given query."),
        (b"", "text/plain", "(no message)"),
        (b"line one\nline two", "text/plain", "line one line two"),
    ],
)
def test_readable_message(body, ctype, expected):
    assert maas.readable_message(body, ctype) == expected


def test_error_line_names_method_path_status_and_message(double):
    client = client_for(double)
    a = double.add_machine("taken")
    b = double.add_machine("other")
    with pytest.raises(MAASError) as caught:
        client.update_machine(b, hostname="taken")
    assert str(caught.value) == f"PUT machines/{b}/: 400: hostname: Node with this Hostname already exists."
    assert "\n" not in str(caught.value)
    double.set_status(a, "Deployed")
    with pytest.raises(MAASError) as caught:
        client.commission(a)
    assert str(caught.value) == (
        f"POST machines/{a}/?op=commission: 400: "
        "Commission is not available because of the current state of the node."
    )
    assert caught.value.is_race


# --- auth ------------------------------------------------------------------------------------


def test_bad_signature_is_401_auth_error(double):
    consumer, token, _ = double.api_key
    client = MAASClient(double.url, Signer(consumer, token, "wrong-secret"), retry=FAST, timeout=1)
    with pytest.raises(MAASAuthError) as caught:
        client.machines()
    assert caught.value.status == 401
    assert "wrong-secret" not in str(caught.value)
    assert double.request_count == 1  # never retried


def test_replayed_nonce_is_refused(double):
    class Replay(Signer):
        def headers(self, method, url):
            if not hasattr(self, "fixed"):
                self.fixed = super().headers(method, url)
            return self.fixed

    client = MAASClient(double.url, Replay(*double.api_key), retry=FAST, timeout=1)
    client.machines()
    with pytest.raises(MAASAuthError):
        client.machines()


FORBIDDEN = "(the API key's user lacks permission for this request: a MAAS administrator's key has it)"


def test_not_admin_is_403_on_that_request_only(double):
    double.admin = False
    sid = double.add_vm("web1", "vms")
    with pytest.raises(MAASForbidden) as caught:
        client_for(double).power_addresses([sid])
    assert caught.value.status == 403 and "withheld" in str(caught.value)
    assert not isinstance(caught.value, MAASAuthError)
    # @admin_method's message (src/maasserver/api/support.py, METHOD_RESERVED_ADMIN), seen when
    # the body is not withheld.
    with pytest.raises(MAASForbidden) as caught:
        client_for(double).call("GET", "machines/", [("op", "power_parameters"), ("id", sid)])
    assert str(caught.value) == ("GET machines/?op=power_parameters: 403: This method is reserved for "
                                 f"admin users. {FORBIDDEN}")


@pytest.mark.parametrize("call", ["update", "commission", "power", "pool"])
def test_admin_only_writes_are_403_with_an_empty_body(double, call):
    """get_node_or_404 and the pool form raise a bare PermissionDenied (empty 403 body)."""
    sid = double.add_vm("web1", "vms")
    double.admin = False
    client = client_for(double)
    action = {"update": lambda: client.update_machine(sid, hostname="x"),
              "commission": lambda: client.commission(sid),
              "power": lambda: client.call("GET", f"machines/{sid}/", [("op", "power_parameters")]),
              "pool": lambda: client.create_pool("vms")}[call]
    with pytest.raises(MAASForbidden) as caught:
        action()
    assert caught.value.status == 403 and "(no message)" in str(caught.value)
    assert not isinstance(caught.value, MAASAuthError)
    assert double.writes == [] and double.request_count == 1


def test_version_needs_no_authentication(double):
    consumer, token, _ = double.api_key
    client = MAASClient(double.url, Signer(consumer, token, "wrong-secret"), retry=FAST, timeout=1)
    assert client.version() == double.version
    with pytest.raises(MAASAuthError):
        client.machines()


# --- retries ---------------------------------------------------------------------------------


def test_503_honours_retry_after(double):
    sleep = Recorder()
    client = client_for(double, sleep=sleep, retry=RetryPolicy(attempts=4, backoff=0.01, max_retry_after=60))
    double.inject("503", retry_after="7", count=2)
    assert client.machines() == []
    assert sleep.sleeps == [7.0, 7.0]
    assert double.request_count == 3


def test_503_retry_after_is_capped_and_retries_are_bounded(double):
    sleep = Recorder()
    client = client_for(double, sleep=sleep, retry=RetryPolicy(attempts=3, backoff=0.01, max_retry_after=5))
    double.inject("503", retry_after="100000", count=10)
    with pytest.raises(MAASError) as caught:
        client.machines()
    assert caught.value.status == 503
    assert sleep.sleeps == [5.0, 5.0]
    assert double.request_count == 3


def test_503_from_the_double_says_retry_after_10(double):
    sleep = Recorder()
    client = client_for(double, sleep=sleep, retry=RetryPolicy(attempts=2, backoff=0.01, max_retry_after=60))
    double.inject("503")
    assert client.machines() == []
    assert sleep.sleeps == [10.0]  # src/maasserver/middleware.py: RETRY_AFTER_SERVICE_UNAVAILABLE


def test_409_with_retry_after_is_retried_like_503(double):
    sleep = Recorder()
    client = client_for(double, sleep=sleep, retry=RetryPolicy(attempts=3, backoff=0.01, max_retry_after=60))
    sid = double.add_vm("web1", "vms")
    double.inject("409", method="PUT", count=2)
    client.update_machine(sid, hostname="web1-vms")
    assert sleep.sleeps == [5.0, 5.0]  # src/maasserver/utils/views.py: RETRY_AFTER_CONFLICT
    assert double.machines[sid]["hostname"] == "web1-vms"


def test_409_with_retry_after_every_time_is_bounded(double):
    client = client_for(double, retry=RetryPolicy(attempts=3, backoff=0.01, max_retry_after=0.01))
    double.inject("409", count=5)
    with pytest.raises(MAASError) as caught:
        client.machines()
    assert str(caught.value) == "GET machines/: 409: Error: Conflict Error"
    assert double.request_count == 3


def test_409_without_retry_after_is_not_retried(double):
    double.inject("409", retry_after=None)
    with pytest.raises(MAASError) as caught:
        client_for(double).machines()
    assert caught.value.status == 409 and caught.value.is_race
    assert double.request_count == 1


class ThenOK:
    """503s carrying the given Retry-After values, then an empty machine list."""

    def __init__(self, *retry_after: str):
        self.replies = [Response(503, {"Retry-After": value}, b"busy") for value in retry_after]

    def send(self, method, url, headers, files, timeout):
        return self.replies.pop(0) if self.replies else Response(200, {"Content-Type": "application/json"}, b"[]")

    def close(self):
        pass


def test_503_retry_after_as_an_http_date():
    import email.utils

    sleep = Recorder()
    soon = email.utils.formatdate(time.time() + 30, usegmt=True)
    past = email.utils.formatdate(time.time() - 3600, usegmt=True)
    client = MAASClient("http://maas/MAAS/", Signer("c", "t", "s"), transport=ThenOK(soon, past, "soon"),
                        sleep=sleep, retry=RetryPolicy(attempts=4, backoff=0.01, max_backoff=0.05, max_retry_after=60))
    assert client.machines() == []
    in_30, at_once, unreadable = sleep.sleeps
    assert 27 <= in_30 <= 31 and at_once == 0.0 and 0.04 <= unreadable <= 0.05 * 1.1


def test_backoff_grows_without_retry_after(double):
    sleep = Recorder()
    client = client_for(double, sleep=sleep, retry=RetryPolicy(attempts=4, backoff=1.0, max_backoff=3))
    double.inject("503", retry_after=None, count=3)
    client.machines()
    assert [round(s) for s in sleep.sleeps] == [1, 2, 3]


def test_500_is_not_retried(double):
    double.inject("500")
    with pytest.raises(MAASError) as caught:
        client_for(double).pools()
    assert str(caught.value) == "GET resourcepools/: 500: Internal Server Error"
    assert double.request_count == 1


def test_hang_past_timeout_is_retried(double):
    double.inject("hang", hang=1.6)
    started = time.monotonic()
    assert client_for(double, timeout=1).machines() == []
    assert 0.9 < time.monotonic() - started < 5
    assert double.request_count == 2


def test_hang_every_time_reports_timeout(double):
    double.inject("hang", hang=1.4, count=2)
    client = client_for(double, timeout=1, retry=RetryPolicy(attempts=2, backoff=0.01))
    with pytest.raises(MAASError) as caught:
        client.machines()
    assert caught.value.kind == "timeout"
    assert str(caught.value) == f"GET machines/: timeout: no answer in time at {double.url}"


def test_reset_connection_is_retried(double):
    double.inject("reset", count=2)
    assert client_for(double).machines() == []
    assert double.request_count == 3


def test_connection_refused_is_one_line():
    client = MAASClient("http://127.0.0.1:9/MAAS/", Signer("a", "b", "c"),
                        retry=RetryPolicy(attempts=2, backoff=0.01), timeout=1)
    with pytest.raises(MAASError) as caught:
        client.machines()
    assert str(caught.value) == ("GET machines/: connection: connection refused at http://127.0.0.1:9/MAAS/: nothing "
                                 "listens there: check maas.url's host and port (e.g. http://HOST:5240/MAAS/) and "
                                 "that MAAS's region runs")


def test_stop_during_backoff_interrupts(double):
    double.inject("503", retry_after="30")
    client = client_for(double, sleep=lambda seconds: True,
                        retry=RetryPolicy(attempts=3, max_retry_after=60))
    with pytest.raises(MAASError) as caught:
        client.machines()
    assert caught.value.kind == "interrupted"


def test_malformed_json_withholds_the_body(double):
    sid = double.add_vm("web1", "vms", password="pw-VERY-SECRET-1")
    double.inject("malformed", path="power_parameters")
    with pytest.raises(MAASError) as caught:
        client_for(double).power_addresses([sid])
    assert caught.value.kind == "malformed"
    assert "pw-VERY-SECRET-1" not in str(caught.value)
    assert "power_pass" not in str(caught.value)


def test_power_parameter_error_bodies_are_withheld():
    class Echo:
        def send(self, method, url, headers, files, timeout):
            return Response(500, {"Content-Type": "application/json"},
                            b'{"power_pass": ["hunter2-SECRET"]}')

        def close(self):
            pass

    client = MAASClient("http://maas/MAAS/", Signer("a", "b", "c"), transport=Echo(), retry=FAST)
    with pytest.raises(MAASError) as caught:
        client.power_addresses(["abc"])
    assert "hunter2-SECRET" not in str(caught.value)


@pytest.mark.parametrize("status", [400, 401, 403])
def test_api_secret_echoed_by_maas_is_scrubbed(status):
    class Echo:
        def send(self, method, url, headers, files, timeout):
            return Response(status, {"Content-Type": "text/plain"}, headers["Authorization"].encode())

        def close(self):
            pass

    client = MAASClient("http://maas/MAAS/", Signer("consumerX", "tokenXY", "secretXYZ"),
                        transport=Echo(), retry=FAST)
    with pytest.raises({401: MAASAuthError, 403: MAASForbidden}.get(status, MAASError)) as caught:
        client.machines()
    assert "<withheld>" in str(caught.value)
    for part in ("consumerX", "tokenXY", "secretXYZ"):
        assert part not in str(caught.value)


@pytest.mark.parametrize("body, ctype", [
    (b"taken\x1b[2J\x1b]0;owned\x07 name", "text/plain"),
    (b'{"hostname": ["taken\\u001b[31m red \\u202e evil"]}', "application/json"),
])
def test_control_characters_in_maas_text_are_escaped(body, ctype):
    class Hostile:
        def send(self, method, url, headers, files, timeout):
            return Response(400, {"Content-Type": ctype}, body)

        def close(self):
            pass

    client = MAASClient("http://maas/MAAS/", Signer("a", "b", "c"), transport=Hostile(), retry=FAST)
    with pytest.raises(MAASError) as caught:
        client.update_machine("abc", hostname="x")
    text = str(caught.value)
    assert text.isprintable(), text
    assert "\\x1b" in text


def test_transport_errors_are_classified():
    calls = []

    class Flaky:
        def send(self, method, url, headers, files, timeout):
            calls.append(url)
            if len(calls) == 1:
                raise TransportError("connection", "connection closed by the server")
            if len(calls) == 2:
                raise TransportError("timeout", "no answer in time")
            return Response(200, {}, b"[]")

        def close(self):
            pass

    client = MAASClient("http://maas/MAAS/", Signer("a", "b", "c"), transport=Flaky(), retry=FAST)
    assert client.machines() == []
    assert len(calls) == 3


# --- bulk power parameters -------------------------------------------------------------------


def test_power_addresses_in_bulk_chunks_without_passwords(double):
    ids = populate(double, 1000, vm_fraction=0.5)
    double.reset_counts()
    found = client_for(double).power_addresses(ids)
    assert len(found) == 500
    assert all(isinstance(v, str) and "bmc.example.com" in v for v in found.values())
    assert double.counts[("GET", "machines/?op=power_parameters")] == -(-500 // maas.POWER_PARAMETERS_CHUNK)
    assert not any("S3CRET" in str(v) for v in found.values())


def test_single_power_address(double):
    sid = double.add_vm("web1", "vms")
    assert client_for(double).power_address(sid) == "web1.vms.bmc.example.com"
    bare = double.add_vm("web2", "vms", scheme="")
    assert client_for(double).power_address(bare) == "web2.vms.bmc.example.com"


# --- version ---------------------------------------------------------------------------------


def test_version(double):
    double.version = "3.5.4-16300-g.1234abcd"
    assert client_for(double).version() == "3.5.4-16300-g.1234abcd"


@pytest.mark.parametrize("version", ["2.9.0", "2.9.2", "3.0.0", "3.5.4", "3.6.5", "3.7.3", "3.8.0~alpha1-1-g"])
def test_supported_versions_without_warning(version):
    assert maas.check_version(version) == []


@pytest.mark.parametrize("version", ["3.6.0", "3.6.2", "3.6.4", "3.7.0", "3.7.1", "3.7.2", "3.7.0~beta2"])
def test_dns_name_versions_warn(version):
    (warning,) = maas.check_version(version)
    assert "LP:2150892" in warning and "DNS" in warning


@pytest.mark.parametrize("version", ["2.8.2", "2.0", "1.9.5"])
def test_old_versions_refused(version):
    with pytest.raises(MAASVersionError, match="2.9.0 or later"):
        maas.check_version(version)


def test_minimum_version_is_the_boundary_and_the_one_named():
    assert maas.check_version("2.9.0") == []
    with pytest.raises(MAASVersionError, match=r"MAAS 2\.8\.99 is too old: maas-kubevirt needs MAAS 2\.9\.0 or later"):
        maas.check_version("2.8.99")
    assert maas.check_version("garbage") == [
        "cannot read the MAAS version 'garbage'; assuming at least 2.9.0"]


# --- limits: body cap, deadline, stop mid-request --------------------------------------------


def test_body_over_the_cap_is_refused_and_not_retried(double):
    populate(double, 300, vm_fraction=0.1)
    client = client_for(double, max_body=64 * 1024)
    with pytest.raises(MAASTooLarge) as caught:
        client.machines()
    assert caught.value.kind == "too-large" and "maas.max_response_mib" in str(caught.value)
    assert double.request_count == 1
    assert len(client_for(double).machines()) == 300  # the default cap is far above it


def test_body_without_content_length_is_capped_while_read():
    """A body sent without Content-Length (read until close) is counted as it arrives."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    sent = []

    def serve():
        connection, _ = server.accept()
        connection.recv(65536)
        connection.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n[")
        try:
            for _ in range(16384):           # 64 MiB: more than loopback buffers hold
                connection.sendall(b'"x",' * 1024)
                sent.append(1)
        except OSError:
            pass
        connection.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client = MAASClient(f"http://127.0.0.1:{server.getsockname()[1]}/MAAS/", Signer("a", "b", "c"),
                        retry=FAST, timeout=5, max_body=256 * 1024)
    with pytest.raises(MAASTooLarge):
        client.machines()
    thread.join(5)
    server.close()
    assert len(sent) < 16384  # the client hung up instead of reading 64 MiB


def test_deadline_ends_a_hanging_request(double):
    double.inject("hang", hang=6)
    client = client_for(double, timeout=30)
    started = time.monotonic()
    with client.within(1.0):
        with pytest.raises(MAASError) as caught:
            client.machines()
    assert caught.value.kind == "deadline" and "maas.cycle_deadline" in str(caught.value)
    assert time.monotonic() - started < 4  # the deadline (1 s) ended it, not the 6 s hang
    assert client.deadline is None and client.machines() == []


def test_deadline_stops_retrying(double):
    double.inject("503", retry_after="5", count=3)
    client = client_for(double, retry=RetryPolicy(attempts=4, max_retry_after=60))
    started = time.monotonic()
    with client.within(2.0), pytest.raises(MAASError) as caught:
        client.machines()
    assert caught.value.status == 503 and time.monotonic() - started < 4  # no 5 s Retry-After sleep
    assert double.request_count == 1


def test_stop_ends_a_request_in_flight(double):
    double.inject("hang", hang=6)
    stop = threading.Event()
    client = client_for(double, timeout=30, stop=stop)
    threading.Timer(0.3, stop.set).start()
    started = time.monotonic()
    with pytest.raises(MAASError) as caught:
        client.machines()
    assert caught.value.kind == "interrupted"
    assert time.monotonic() - started < 3  # the stop (0.3 s) ended it, not the 6 s hang


# --- hostnames over all nodes ----------------------------------------------------------------


def test_taken_hostnames_cover_devices_and_controllers_in_one_request(double):
    machine = double.add_machine("web1-vms")
    device = double.add_node("web2-vms", "device")
    rack = double.add_node("web3-vms", "rack_controller")
    double.add_node("WEB4-VMS", "device")
    double.reset_counts()
    taken = client_for(double).taken_hostnames(["web1-vms", "web2-vms", "web3-vms", "web4-vms", "free-vms"])
    # MAAS filters by exact hostname (hostname__in, src/maasserver/api/nodes.py).
    assert taken == {"web1-vms": machine, "web2-vms": device, "web3-vms": rack}
    assert double.counts == {("GET", "nodes/"): 1}


def test_taken_hostnames_split_only_past_the_query_budget(double):
    names = [f"{i:03d}-" + "x" * 58 for i in range(300)]
    for name in names[::7]:
        double.add_node(name)
    double.reset_counts()
    taken = client_for(double).taken_hostnames(names)
    assert set(taken) == set(names[::7])
    requests = double.counts[("GET", "nodes/")]
    assert 1 < requests <= len(names) * 70 // maas.MAX_QUERY + 1
    assert all(len(entry) < 8192 for entry in double.urls)


def test_double_refuses_a_hostname_held_by_a_device(double):
    sid = double.add_vm("web1", "vms")
    double.add_node("web1-vms", "device")
    with pytest.raises(MAASError) as caught:
        client_for(double).update_machine(sid, hostname="web1-vms")
    assert str(caught.value) == f"PUT machines/{sid}/: 400: hostname: Node with this Hostname already exists."


# --- API key ---------------------------------------------------------------------------------


def test_api_key_from_file_and_env(tmp_path, monkeypatch):
    monkeypatch.delenv("MAAS_API_KEY", raising=False)
    key = tmp_path / "api-key"
    key.write_text("c1:t1:s1\n")
    key.chmod(0o600)
    warnings = []
    assert maas.load_api_key({"api_key_file": str(key)}, warnings.append) == ("c1", "t1", "s1")
    assert warnings == []
    monkeypatch.setenv("MAAS_API_KEY", "c2:t2:s2")
    assert maas.load_api_key({"api_key_file": str(key)}, warnings.append) == ("c2", "t2", "s2")


@pytest.mark.parametrize("mode, warned", [(0o600, False), (0o400, False), (0o700, False), (0o640, True),
                                           (0o610, True), (0o604, True), (0o601, True)])
def test_api_key_group_or_other_bits_warn(tmp_path, monkeypatch, mode, warned):
    monkeypatch.delenv("MAAS_API_KEY", raising=False)
    key = tmp_path / "api-key"
    key.write_text("c1:t1:s1secret")
    key.chmod(mode)
    warnings = []
    assert maas.load_api_key({"api_key_file": str(key)}, warnings.append) == ("c1", "t1", "s1secret")
    assert len(warnings) == warned
    if warned:
        assert f"mode {mode:04o}" in warnings[0] and "s1secret" not in warnings[0]


def test_api_key_readable_by_others_warns(tmp_path, monkeypatch):
    monkeypatch.delenv("MAAS_API_KEY", raising=False)
    key = tmp_path / "api-key"
    key.write_text("c1:t1:s1secret")
    key.chmod(0o644)
    warnings = []
    maas.load_api_key({"api_key_file": str(key)}, warnings.append)
    (warning,) = warnings
    assert "0644" in warning and "chmod 600" in warning and "s1secret" not in warning


def test_api_key_missing_file_is_a_values_error(tmp_path, monkeypatch):
    monkeypatch.delenv("MAAS_API_KEY", raising=False)
    with pytest.raises(ValuesError) as caught:
        maas.load_api_key({"api_key_file": str(tmp_path / "nope")}, print)
    assert str(caught.value).startswith("maas.api_key_file: expected a readable file")


@pytest.mark.parametrize("text", ["onlyone", "a:b", "a::c", "a:b:c:d", "a b:c:d"])
def test_malformed_api_key_never_echoed(tmp_path, monkeypatch, text):
    monkeypatch.delenv("MAAS_API_KEY", raising=False)
    key = tmp_path / "api-key"
    key.write_text(text)
    os.chmod(key, 0o600)
    with pytest.raises(ValuesError) as caught:
        maas.load_api_key({"api_key_file": str(key)}, print)
    message = str(caught.value)
    assert message.startswith("maas.api_key_file: expected a MAAS API key of the form consumer:token:secret")
    assert str(key) in message
    assert text not in message


def test_several_keys_in_the_file_say_how_to_choose(tmp_path, monkeypatch):
    monkeypatch.delenv("MAAS_API_KEY", raising=False)
    key = tmp_path / "api-key"
    key.write_text("c1:t1:s1secret\nc2:t2:s2secret\n")  # `maas apikey --username admin` with two keys
    key.chmod(0o600)
    with pytest.raises(ValuesError) as caught:
        maas.load_api_key({"api_key_file": str(key)}, print)
    message = str(caught.value)
    assert message.startswith(f"maas.api_key_file: expected one MAAS API key in {key}, found 2 lines")
    assert "--with-names" in message and "--generate" in message
    assert "s1secret" not in message and "s2secret" not in message


def test_key_with_its_name_says_to_remove_the_name(tmp_path, monkeypatch):
    monkeypatch.delenv("MAAS_API_KEY", raising=False)
    key = tmp_path / "api-key"
    key.write_text("c1:t1:s1secret maas-kubevirt\n")  # `--with-names` output
    key.chmod(0o600)
    with pytest.raises(ValuesError, match="remove the key's name"):
        maas.load_api_key({"api_key_file": str(key)}, print)


@pytest.mark.parametrize("text", ["garbage", "a:b", "c1:t1:s1\nc2:t2:s2", "   "])
def test_bad_env_key_names_the_variable_not_the_file(tmp_path, monkeypatch, text):
    key = tmp_path / "api-key"
    key.write_text("c1:t1:s1\n")
    key.chmod(0o600)
    monkeypatch.setenv("MAAS_API_KEY", text)
    with pytest.raises(ValuesError) as caught:
        maas.load_api_key({"api_key_file": str(key)}, print)
    message = str(caught.value)
    assert message.startswith("MAAS_API_KEY: expected") and "environment variable" in message
    assert "api_key_file" not in message and str(key) not in message


def test_refused_env_key_names_the_variable(double, monkeypatch):
    consumer, token, _ = double.api_key
    monkeypatch.setenv("MAAS_API_KEY", f"{consumer}:{token}:wrong-secret")
    values = {"maas": {"url": double.url, "api_key_file": "/nonexistent", "timeout": 1,
                       "commission_timeout": 1, "max_response_mib": 1}}
    client = maas.client_from_values(values, print)
    with pytest.raises(MAASAuthError) as caught:
        client.machines()
    assert str(caught.value).endswith("(the API key was refused: check MAAS_API_KEY)")


@pytest.mark.parametrize("url, warns", [
    ("http://maas.example.com:5240/MAAS/", True),
    ("http://10.0.0.5:5240/MAAS/", True),
    ("http://[2001:db8::1]:5240/MAAS/", True),
    ("http://localhost:5240/MAAS/", False),
    ("http://127.0.0.1:5240/MAAS/", False),
    ("http://127.8.9.10:5240/MAAS/", False),
    ("http://[::1]:5240/MAAS/", False),
    ("https://maas.example.com:5443/MAAS/", False),
])
def test_cleartext_warning(url, warns):
    warning = maas.cleartext_warning(url)
    assert bool(warning) == warns
    if warns:
        assert "PLAINTEXT" in warning and "token secret" in warning and "https://" in warning


def test_default_cap_holds_ten_thousand_real_machines_with_room(double):
    """Machine objects of MAAS's size (tests/maas_objects.py) at 10,000 machines, three times
    over (servers with more interfaces and disks than the double's), fit the default cap."""
    from maas_kubevirt.values import load_values

    for _ in range(20):
        double.add_machine(power_type="ipmi", status="Deployed")
    body = client_for(double).call("GET", "machines/", json_reply=False)
    per_machine = len(body) / 20
    assert per_machine > 10_000, "the double's machine objects are not of MAAS's size"
    default_cap = load_values()["maas"]["max_response_mib"] * 2**20
    assert default_cap == maas.DEFAULT_MAX_RESPONSE
    assert 10_000 * per_machine * 3 < default_cap


# --- the one line an operator reads ----------------------------------------------------------


def test_signer_repr_names_no_part_of_the_key():
    assert repr(Signer("ckey", "tkey", "tsecret")) == "Signer(<API key withheld>)"


@pytest.mark.parametrize(
    "body, ctype, expected",
    [
        # Structures with nothing in them still say something.
        (b"{}", "application/json", "(no message)"),
        (b'{"__all__": []}', "application/json", "(no message)"),
        (b"[]", "application/json", "(no message)"),
        (b'["Machine is locked.", "Try later."]', "application/json", "Machine is locked. Try later."),
        (b'"No Script matches the given query."', "application/json", "No Script matches the given query."),
        # Old Apache and IIS pages shout their tags; a title may span lines.
        (b"<HTML><HEAD><TITLE>502 Proxy Error</TITLE></HEAD><BODY>x</BODY></HTML>", "text/html",
         "502 Proxy Error"),
        (b"<html><title>\n  Service\n  Unavailable\n</title></html>", "text/html", "Service Unavailable"),
        # Without a title the tags go, and each leaves a space so words stay apart.
        (b"<html><body><h1>Bad</h1><p>Gateway</p></body></html>", "text/html", "Bad Gateway"),
        (b"<html><title></title><body></body></html>", "text/html", "(no message)"),
        (b"<p></p>", "text/plain", "(no message)"),
        # An HTML page is known by its type even when it does not open with a tag (a BOM here).
        (b"\xef\xbb\xbf<html><title>Gateway Timeout</title></html>", "Text/HTML; charset=utf-8",
         "Gateway Timeout"),
        # Plain text keeps its angle brackets.
        (b"power_address: expected <host>:<port>", "text/plain", "power_address: expected <host>:<port>"),
        # Bytes that are not UTF-8 do not hide the rest of the message.
        (b"Caf\xe9 not found", "text/plain", "Caf\ufffd not found"),
    ],
)
def test_readable_message_edges(body, ctype, expected):
    assert maas.readable_message(body, ctype) == expected


@pytest.mark.parametrize("length", [maas.MAX_MESSAGE - 1, maas.MAX_MESSAGE, maas.MAX_MESSAGE + 1, 5000])
def test_a_long_message_is_cut_to_the_limit_with_an_ellipsis(length):
    text = ("word " * 2000)[: length - 1] + "!"
    line = maas.readable_message(text.encode(), "text/plain")
    if length <= maas.MAX_MESSAGE:
        assert line == text
    else:
        assert len(line) == maas.MAX_MESSAGE and line.endswith("...")
        assert text.startswith(line[:-3])


class Answer:
    """A transport that answers every request with one reply and records the requests."""

    def __init__(self, status: int, body: bytes, ctype: str = "application/json"):
        self.reply = Response(status, {"Content-Type": ctype}, body)
        self.sent: list[tuple[str, str]] = []

    def send(self, method, url, headers, files, timeout):
        self.sent.append((method, url))
        return self.reply

    def close(self):
        pass


def test_short_strings_are_not_scrubbed_but_secrets_of_four_characters_are():
    """A secret of 4 characters or more is withheld; a shorter one would blank common words."""
    answer = Answer(400, b"signature &abcd for token xy refused", "text/plain")
    client = MAASClient("http://maas/MAAS/", Signer("c1", "xy", "abcd"), transport=answer, retry=FAST)
    with pytest.raises(MAASError) as caught:
        client.machines()
    assert str(caught.value) == "GET machines/: 400: signature &<withheld> for token xy refused"


# --- why no answer came ----------------------------------------------------------------------

CLOSED = "connection closed by the server"


@pytest.mark.parametrize("inner, reason", [
    (ConnectionRefusedError(111, "Connection refused"), "connection refused"),
    (ConnectionResetError(104, "Connection reset by peer"), CLOSED),
    (ConnectionAbortedError(103, "Software caused connection abort"), CLOSED),
    (BrokenPipeError(32, "Broken pipe"), CLOSED),
    (http.client.RemoteDisconnected("Remote end closed connection without response"), CLOSED),
    (http.client.IncompleteRead(b"[{", 4096), CLOSED),
    (urllib3.exceptions.IncompleteRead(2, 4096), CLOSED),
    # urllib3 puts the cause second: ("Connection aborted.", RemoteDisconnected(...)).
    (urllib3.exceptions.ProtocolError("Connection aborted.", http.client.RemoteDisconnected("closed")), CLOSED),
    (ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number"), "TLS error"),
    (urllib3.exceptions.SSLError("certificate verify failed"), "TLS error, certificate not trusted"),
    (ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] unable to get local issuer certificate"),
     "TLS error, certificate not trusted"),
    (socket.gaierror(-2, "Name or service not known"), "cannot resolve the MAAS host name"),
    (urllib3.exceptions.NameResolutionError("maas.example.com", None, socket.gaierror(-3, "Temporary failure")),
     "cannot resolve the MAAS host name"),
    (OSError(113, "No route to host"), "connection failed"),
])
def test_each_cause_of_a_failed_connection_has_its_reason(inner, reason):
    """requests wraps the cause as ConnectionError(cause); each known cause names itself."""
    assert maas._connection_reason(requests.ConnectionError(inner)) == reason


def _cause_only():
    try:
        raise requests.ConnectionError("Max retries exceeded") from ConnectionResetError(104, "reset")
    except requests.ConnectionError as error:
        return error


def _context_only():
    try:
        try:
            raise ConnectionResetError(104, "reset")
        except ConnectionResetError:
            raise requests.ConnectionError("Max retries exceeded")  # noqa: B904 - context only
    except requests.ConnectionError as error:
        return error


@pytest.mark.parametrize("make", [
    lambda: requests.ConnectionError(ConnectionResetError(104, "reset")),                 # args
    _cause_only,                                                                           # __cause__
    _context_only,                                                                         # __context__
    lambda: urllib3.exceptions.MaxRetryError(None, "/MAAS/", reason=ConnectionResetError(104, "reset")),
], ids=["args", "cause", "context", "reason"])
def test_the_reason_is_found_down_any_link_of_the_chain(make):
    """urllib3 and requests link causes by args, raise-from, implicit context or .reason,
    differently from one version to the next: each link alone leads to the cause."""
    error = make()
    assert maas._connection_reason(error) == CLOSED


def test_a_chain_without_a_known_cause_or_looping_back_says_connection_failed():
    assert maas._connection_reason(requests.ConnectionError("Max retries exceeded")) == "connection failed"
    first, second = requests.ConnectionError("a"), OSError("b")
    first.__context__, second.__context__ = second, first
    result = []
    worker = threading.Thread(target=lambda: result.append(maas._connection_reason(first)), daemon=True)
    worker.start()
    worker.join(5)
    assert result == ["connection failed"]  # and it returned at all


def test_https_to_a_plain_http_port_is_a_tls_error(double):
    client = MAASClient(double.url.replace("http://", "https://"), Signer(*double.api_key),
                        retry=RetryPolicy(attempts=1), timeout=2)
    with pytest.raises(MAASError) as caught:
        client.machines()
    assert str(caught.value) == (f"GET machines/: connection: TLS error at {double.url.replace('http://', 'https://')}: "
                                 "is maas.url https:// on MAAS's plain-HTTP port? MAAS serves HTTPS on port 5443 "
                                 "after `maas config-tls enable`; a private CA goes in REQUESTS_CA_BUNDLE")


def test_a_server_that_hangs_up_without_answering():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)

    def serve():
        for _ in range(2):
            connection, _ = server.accept()
            connection.recv(65536)
            connection.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.getsockname()[1]}/MAAS/"
    client = MAASClient(url, Signer("a", "b", "c"), retry=RetryPolicy(attempts=2, backoff=0.01), timeout=2)
    with pytest.raises(MAASError) as caught:
        client.machines()
    thread.join(5)
    server.close()
    assert str(caught.value) == f"GET machines/: connection: {CLOSED} at {url}"


# --- too large -------------------------------------------------------------------------------


def test_too_large_names_the_cap_and_what_was_found():
    client = MAASClient("http://maas/MAAS/", Signer("a", "b", "c"), retry=FAST, max_body=2**20,
                        transport=Answer(200, b" " * (6 * 2**20)))
    with pytest.raises(MAASTooLarge) as caught:
        client.machines()
    assert str(caught.value) == (
        "GET machines/: too-large: response body larger than maas.max_response_mib (1 MiB; found 6 MiB): "
        "raise maas.max_response_mib if this MAAS really has that much to say")


def test_too_large_while_read_says_more():
    """Without a declared length the reader stops at the cap and cannot say how much more came."""
    assert maas._too_large(2**18) == (
        "response body larger than maas.max_response_mib (0.25 MiB; found more): "
        "raise maas.max_response_mib if this MAAS really has that much to say")


# --- a request abandoned ---------------------------------------------------------------------


def test_a_request_abandoned_by_a_signal_keeps_its_connection_and_the_session_goes_on(double):
    """The abandoned request keeps its connection in its worker thread; the next one takes another."""
    double.inject("hang", hang=3)
    stop = threading.Event()
    client = client_for(double, timeout=30, stop=stop)
    before = client.transport.session
    threading.Timer(0.3, stop.set).start()
    with pytest.raises(MAASError) as caught:
        client.machines()
    assert str(caught.value) == "GET machines/: interrupted: stopped by a signal during the request"
    assert caught.value.in_flight
    stop.clear()
    started = time.monotonic()
    assert client.machines() == [] and time.monotonic() - started < 1  # not after the 3 s hang
    assert client.transport.session is before


def test_a_request_still_running_at_the_deadline_is_abandoned():
    class Stuck:
        """Ignores its timeout, as a DNS lookup does."""

        def send(self, method, url, headers, files, timeout):
            time.sleep(2)
            return Response(200, {}, b"[]")

    client = MAASClient("http://maas/MAAS/", Signer("a", "b", "c"), transport=Stuck(), retry=FAST)
    with client.within(0.3), pytest.raises(MAASError) as caught:
        client.machines()
    assert str(caught.value) == ("GET machines/: deadline: the cycle's deadline (maas.cycle_deadline) "
                                 "passed during the request")
    assert caught.value.in_flight


def test_a_stop_set_before_the_request_interrupts_it_in_flight():
    class Slow:
        def send(self, method, url, headers, files, timeout):
            time.sleep(2)
            return Response(200, {}, b"[]")

    stop = threading.Event()
    stop.set()
    client = MAASClient("http://maas/MAAS/", Signer("a", "b", "c"), transport=Slow(), retry=FAST, stop=stop)
    with pytest.raises(MAASError) as caught:
        client.machines()
    assert str(caught.value) == "GET machines/: interrupted: stopped by a signal during the request"
    assert caught.value.in_flight


# --- several threads at once -----------------------------------------------------------------
# The reconciler's apply sends different machines' changes from worker threads, through one client.


def delay_answers(double: MaasDouble, seconds: float, which) -> None:
    """The double answers the requests ``which(request)`` picks ``seconds`` late (as a region does
    while a power action runs), others at once."""
    handle = double.handle

    def delayed(request):
        if which(request):
            time.sleep(seconds)
        return handle(request)

    double.handle = delayed


def in_threads(count: int, work) -> list:
    """work(index) in ``count`` threads started together; what each returned or raised, in order."""
    results: list = [None] * count
    start = threading.Barrier(count)

    def run(index: int) -> None:
        start.wait()
        try:
            results[index] = work(index)
        except Exception as error:  # noqa: BLE001 - the test looks at it
            results[index] = error

    threads = [threading.Thread(target=run, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not any(thread.is_alive() for thread in threads)
    return results


def wait_for(condition, seconds: float = 5.0) -> None:
    give_up = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < give_up, "timed out"
        time.sleep(0.01)


def test_eight_threads_of_requests_all_succeed_counted_exactly_on_a_connection_each(double):
    system_ids = [double.add_machine(f"m{index}", status="Ready") for index in range(8)]
    client = client_for(double, timeout=10)

    def work(index: int) -> int:
        for round in range(25):
            if round % 5 == 0:
                client.update_machine(system_ids[index], hostname=f"m{index}-{round}")
            else:
                assert len(client.machines()) == 8
        return index

    assert in_threads(8, work) == list(range(8))
    assert client.requests == 200 and double.request_count == 200
    assert sorted(m["hostname"] for m in double.machines.values()) == [f"m{index}-20" for index in range(8)]
    pools = client.transport.session.get_adapter(client.base).poolmanager.pools
    used = [pools[key] for key in pools.keys() if pools[key].num_requests]
    # Each thread had one connection at a time, and they were kept for the next requests.
    assert len(used) == 1 and used[0].num_requests == 200 and used[0].num_connections <= 8
    # The pool keeps as many as maas.concurrency can use (requests' default keeps 10), on either scheme.
    for scheme in ("http", "https"):
        adapter = client.transport.session.get_adapter(f"{scheme}://maas.example.com/MAAS/")
        assert adapter.poolmanager.connection_pool_kw["maxsize"] == maas.transport.CONNECTIONS == 64


def test_a_stop_ends_the_requests_of_every_thread_within_a_poll(double):
    double.inject("hang", path="^machines/$", count=4, hang=6)
    stop = threading.Event()
    client = client_for(double, timeout=30, stop=stop)
    stopped: list[float] = []

    def stop_once_all_wait() -> None:
        wait_for(lambda: double.request_count == 4)
        stopped.append(time.monotonic())
        stop.set()

    threading.Thread(target=stop_once_all_wait).start()

    def work(index: int):
        try:
            client.machines()
        except MAASError as error:
            return error, time.monotonic()

    results = in_threads(4, work)
    assert [error.kind for error, _ in results] == ["interrupted"] * 4
    assert all(error.in_flight for error, _ in results)
    assert max(ended for _, ended in results) - stopped[0] < 5 * maas.POLL  # not the 6 s hang


def test_the_cycles_deadline_ends_the_requests_of_every_thread(double):
    double.inject("hang", path="^machines/$", count=3, hang=6)
    client = client_for(double, timeout=30)
    started = time.monotonic()
    with client.within(0.5):  # in the cycle's thread, as the Reconciler does
        results = in_threads(3, lambda index: client.machines())
    assert [error.kind for error in results] == ["deadline"] * 3
    assert time.monotonic() - started < 0.5 + 5 * maas.POLL
    assert client.deadline is None and client.machines() == []


def test_a_request_abandoned_in_one_thread_fails_no_other_threads_request(double):
    """The session and its other connections go on while the abandoned attempt still runs."""
    double.inject("hang", path="^machines/$", count=1, hang=3)
    client = client_for(double, timeout=30)
    with client.within(0.3), pytest.raises(MAASError) as caught:
        client.machines()
    assert caught.value.kind == "deadline"
    # Its attempt hangs on at the double for about 3 s more, on its own connection.
    assert any(t.name == "maas-request" and t.is_alive() for t in threading.enumerate())

    def work(index: int) -> int:
        for _ in range(10):
            assert client.machines() == [] and client.version() == "3.6.5"
            time.sleep(0.1)  # the abandoned attempt ends (the double hangs up) among these
        return index

    assert in_threads(4, work) == list(range(4))


def test_a_request_in_flight_outlives_another_clients_abandoned_one_on_a_shared_transport(double):
    """A stop abandons only the requests of the client it belongs to, not the Transport's others."""
    double.inject("hang", path="^machines/$", count=1, hang=3)
    delay_answers(double, 1.0, lambda request: request.path == "version/")
    transport = maas.Transport()
    stop = threading.Event()
    stopped = client_for(double, timeout=30, stop=stop, transport=transport)
    going = client_for(double, timeout=30, transport=transport)

    def work(index: int):
        if index == 0:
            threading.Timer(0.3, stop.set).start()
            with pytest.raises(MAASError) as caught:
                stopped.machines()
            return caught.value.kind
        return going.version()

    assert in_threads(3, work) == ["interrupted", "3.6.5", "3.6.5"]


def test_a_cookie_is_refused_so_that_threads_never_write_the_shared_jar():
    body = b"[]"
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def serve() -> None:
        connection, _ = server.accept()
        connection.recv(65536)
        connection.sendall(b"HTTP/1.1 200 OK\r\nSet-Cookie: sticky=1; Path=/\r\nContent-Type: application/json\r\n"
                           + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        connection.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client = MAASClient(f"http://127.0.0.1:{port}/MAAS/", Signer("a", "b", "c"), retry=FAST)
    assert client.machines() == []
    thread.join(5)
    server.close()
    assert len(client.transport.session.cookies) == 0


# --- the cleartext warning -------------------------------------------------------------------


@pytest.mark.parametrize("url", ["http://localhost.:5240/MAAS/", "http://maas.localhost:5240/MAAS/",
                                 "http://LOCALHOST:5240/MAAS/"])
def test_localhost_in_any_spelling_is_not_cleartext_on_the_wire(url):
    assert maas.cleartext_warning(url) is None


def test_the_cleartext_warning_names_the_host_and_both_ways_out():
    assert maas.cleartext_warning("http://MAAS.Example.COM.:5240/MAAS/") == (
        "maas.url is http:// on maas.example.com: OAuth PLAINTEXT sends the API key's token secret in clear "
        "with every request; use https:// (MAAS serves TLS on port 5443 after `maas config-tls enable`) "
        "or run maas-kubevirt on the region host with http://localhost:5240/MAAS/")


def test_the_cleartext_warning_for_a_url_without_a_host_invents_none():
    assert maas.cleartext_warning("http://:5240/MAAS/").startswith("maas.url is http:// on : OAuth")


# --- URLs ------------------------------------------------------------------------------------


def test_a_mapping_value_that_is_a_list_repeats_the_key():
    client = MAASClient("http://maas:5240/MAAS/", Signer("a", "b", "c"))
    assert client.url("machines/", {"id": ["a", "b"]}) == "http://maas:5240/MAAS/api/2.0/machines/?id=a&id=b"


# --- machines by id and power addresses ------------------------------------------------------


def test_machines_by_id_asks_for_those_ids_only(double):
    a, b = double.add_machine("a"), double.add_machine("b")
    double.add_machine("c")
    found = client_for(double).machines_by_id([b, a, "nosuchid", a])
    assert sorted(m["system_id"] for m in found) == sorted([a, b])


def test_machines_by_id_splits_only_past_the_query_budget(double):
    ids = [f"{i:06x}" for i in range(1500)]          # 15,000 characters of id=...& in all
    client_for(double).machines_by_id(ids)
    assert 1 < double.counts[("GET", "machines/")] <= len(ids) * 10 // maas.MAX_QUERY + 1
    assert all(len(url) < 8192 for url in double.urls)


@pytest.mark.parametrize("body", [{"id": "x"}, '"not a list"', "null"])
def test_machines_by_id_refuses_what_is_not_a_list(double, body):
    double.inject("reply", status=200, body=body, path="machines/")
    with pytest.raises(MAASError) as caught:
        client_for(double).machines_by_id(["abc"])
    assert caught.value.kind == "malformed"
    assert str(caught.value) == "GET machines/?id=...: 200: expected a list of machines"


def test_method_names_are_upper_case_in_error_lines(double):
    sid = double.add_vm("web1", "vms")
    double.inject("500", count=2)
    client = client_for(double)
    with pytest.raises(MAASError) as caught:
        client.machines_by_id([sid])
    assert str(caught.value).startswith("GET machines/: 500:")
    with pytest.raises(MAASError) as caught:
        client.power_address(sid)
    assert str(caught.value).startswith(f"GET machines/{sid}/?op=power_parameters: 500:")


def test_a_single_power_address_error_withholds_the_body(double):
    sid = double.add_vm("web1", "vms")
    double.inject("reply", status=400, body={"power_pass": ["hunter2-SECRET is wrong"]}, path="power_parameters")
    with pytest.raises(MAASError) as caught:
        client_for(double).power_address(sid)
    assert str(caught.value) == (f"GET machines/{sid}/?op=power_parameters: 400: "
                                 "response body withheld (it may hold credentials)")


@pytest.mark.parametrize("body", [{"power_address": 42}, {"power_address": ["a"]}, {"power_user": "x"}, [], "null"])
def test_a_power_address_that_is_not_text_is_none(double, body):
    sid = double.add_vm("web1", "vms")
    double.inject("reply", status=200, body=body, path="power_parameters")
    assert client_for(double).power_address(sid) is None


def test_power_addresses_that_are_not_text_are_none(double):
    a, b = double.add_vm("web1", "vms"), double.add_vm("web2", "vms")
    double.inject("reply", status=200, body={a: {"power_address": 42}, b: "junk"}, path="power_parameters")
    assert client_for(double).power_addresses([a, b]) == {a: None, b: None}


# --- the client made from the values ---------------------------------------------------------


def values_for(double, key_file, url=None):
    return {"maas": {"url": url or double.url, "api_key_file": str(key_file), "timeout": 7,
                     "commission_timeout": 45, "max_response_mib": 3}}


def test_client_from_values_warns_stops_and_takes_its_limits(double, tmp_path, monkeypatch):
    monkeypatch.delenv("MAAS_API_KEY", raising=False)
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    key = tmp_path / "api-key"
    key.write_text(double.api_key_text)
    key.chmod(0o644)
    warnings = []
    stop = threading.Event()
    client = maas.client_from_values(values_for(double, key, "http://maas.example.com:5240/MAAS/"),
                                     warnings.append, stop)
    assert [w.split(" ")[1:5] for w in warnings] == [["is", "readable", "by", "group"],
                                                     ["is", "http://", "on", "maas.example.com:"]]
    assert (client.timeout, client.commission_timeout, client.max_body) == (7.0, 45.0, 3 * 2**20)
    monkeypatch.setattr(maas, "RETRY", RetryPolicy(attempts=1))
    client = maas.client_from_values(values_for(double, key), warnings.append, stop)
    double.inject("hang", hang=2)
    stop.set()  # SIGTERM: a request under way ends at once
    with pytest.raises(MAASError) as caught:
        client.machines()
    assert caught.value.kind == "interrupted"


# --- the API key from a systemd credential ---------------------------------------------------


@pytest.fixture
def credentials(tmp_path, monkeypatch):
    monkeypatch.delenv("MAAS_API_KEY", raising=False)
    directory = tmp_path / "credentials"
    directory.mkdir()
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(directory))
    return directory


def test_the_credential_takes_the_place_of_the_key_file(credentials, tmp_path, monkeypatch):
    (credentials / "api-key").write_text("c1:t1:s1secret\n")
    (credentials / "api-key").chmod(0o440)   # 0400 and the ACL entry systemd adds
    warnings = []
    key, source = maas.load_api_key_with_source({"api_key_file": "/nonexistent"}, warnings.append)
    assert key == ("c1", "t1", "s1secret") and warnings == []
    assert source == f"credential api-key ({credentials / 'api-key'})"
    monkeypatch.setenv("MAAS_API_KEY", "c2:t2:s2secret")  # the environment comes first
    assert maas.load_api_key_with_source({}, print) == (("c2", "t2", "s2secret"), "MAAS_API_KEY")


def test_a_credential_with_two_keys_names_the_credential(credentials):
    (credentials / "api-key").write_text("c1:t1:s1secret\nc2:t2:s2secret\n")
    with pytest.raises(ValuesError) as caught:
        maas.load_api_key({"api_key_file": "/nonexistent"}, print)
    assert str(caught.value).startswith(
        f"credential api-key: expected one MAAS API key in {credentials / 'api-key'}, found 2 lines")


@pytest.mark.parametrize("make, reason", [
    (lambda path: path.mkdir(), "Is a directory"),
    (lambda path: path.write_bytes(b"c1:t1:\xff\xfe\n"), "UnicodeDecodeError"),
])
def test_an_unreadable_credential_says_why(credentials, make, reason):
    make(credentials / "api-key")
    with pytest.raises(ValuesError) as caught:
        maas.load_api_key({"api_key_file": "/nonexistent"}, print)
    assert str(caught.value) == (
        f"credential api-key: expected a readable MAAS API key in {credentials / 'api-key'}: {reason}")


# --- the API key's messages, whole -----------------------------------------------------------


def test_the_key_file_messages_in_full(tmp_path, monkeypatch):
    monkeypatch.delenv("MAAS_API_KEY", raising=False)
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    missing = tmp_path / "nope"
    with pytest.raises(ValuesError) as caught:
        maas.load_api_key({"api_key_file": str(missing)}, print)
    assert str(caught.value) == (
        f"maas.api_key_file: expected a readable file holding the MAAS API key (consumer:token:secret), "
        f"found {str(missing)!r}: No such file or directory (or set MAAS_API_KEY)")
    with pytest.raises(ValuesError) as caught:
        maas.load_api_key({}, print)   # no file named at all
    assert "found '': No such file or directory" in str(caught.value)
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe")
    binary.chmod(0o600)
    with pytest.raises(ValuesError) as caught:
        maas.load_api_key({"api_key_file": str(binary)}, print)
    assert f"found {str(binary)!r}: UnicodeDecodeError (or set MAAS_API_KEY)" in str(caught.value)
    key = tmp_path / "api-key"
    key.write_text("c1:t1:s1secret")
    key.chmod(0o660)
    warnings = []
    maas.load_api_key({"api_key_file": str(key)}, warnings.append)
    assert warnings == [f"{key} is readable by group or others (mode 0660): run `chmod 600 {key}`; "
                        "it holds an administrator's MAAS API key"]


@pytest.mark.parametrize("text, found", [
    ("", "found nothing"),
    ("a:b", "found 2 colon-separated part(s)"),
    ("c1:t1:s1 maas-kubevirt", "found 3 colon-separated part(s) (text after the key: remove the key's "
                               "name that `--with-names` prints)"),
    ("c1:t1:s1 maas kubevirt", "found 3 colon-separated part(s)"),
    ("c1:t1 maas-kubevirt", "found 2 colon-separated part(s)"),
])
def test_a_malformed_key_message_in_full(text, found):
    with pytest.raises(ValuesError) as caught:
        maas.parse_api_key(text, "MAAS_API_KEY", " in the environment variable")
    assert str(caught.value) == ("MAAS_API_KEY: expected a MAAS API key of the form consumer:token:secret in "
                                 f"the environment variable (from `maas apikey --username USER`), {found}")


def test_several_keys_message_in_full():
    with pytest.raises(ValuesError) as caught:
        maas.parse_api_key("a:b:c\n\n d:e:f \n", "maas.api_key_file", " in /etc/key")
    assert str(caught.value) == (
        "maas.api_key_file: expected one MAAS API key in /etc/key, found 2 lines: keep only the key "
        "maas-kubevirt should use (`maas apikey --username USER --with-names` names each key; "
        "`maas apikey --username USER --generate --name maas-kubevirt` makes a dedicated one)")


def test_the_environment_key_is_named_as_the_environment_variable(monkeypatch):
    monkeypatch.setenv("MAAS_API_KEY", "a:b")
    with pytest.raises(ValuesError) as caught:
        maas.load_api_key({}, print)
    assert str(caught.value).startswith(
        "MAAS_API_KEY: expected a MAAS API key of the form consumer:token:secret in the environment "
        "variable (from")


# --- versions --------------------------------------------------------------------------------


@pytest.mark.parametrize("text, version", [
    ("3.5.0~beta1-14800-g1234", (3, 5, 0)), ("3.4", (3, 4, 0)), (" 2.9.1", (2, 9, 1)),
    ("10.20.30", (10, 20, 30)), ("garbage", None), ("3", None), ("", None),
    ("3.8.0a1", (3, 8, 0)), ("3.8.0~a1", (3, 8, 0)),
])
def test_parse_version(text, version):
    assert maas.parse_version(text) == version


@pytest.mark.parametrize("text, key", [
    # master's pyproject.toml says 3.8.0a1; its version/ serves MAASVersion's short_version, 3.8.0~a1
    # (src/provisioningserver/utils/version.py, src/maasserver/api/version.py).
    ("3.8.0a1", (3, 8, 0, -3, 1)), ("3.8.0~a1", (3, 8, 0, -3, 1)), ("3.8.0~alpha1-16517-g.4c8b7a1", (3, 8, 0, -3, 1)),
    ("3.5.0~beta1-14800-g1234", (3, 5, 0, -2, 1)), ("3.6.0~rc2", (3, 6, 0, -1, 2)),
    ("3.6.5-16517-g.4c8b7a1", (3, 6, 5, 0, 0)), ("3.4", (3, 4, 0, 0, 0)), ("garbage", None), ("", None),
])
def test_release_key(text, key):
    assert maas.release_key(text) == key


def test_version_messages_in_full():
    with pytest.raises(MAASVersionError) as caught:
        maas.check_version("2.8.2")
    assert str(caught.value) == ("MAAS 2.8.2 is too old: maas-kubevirt needs MAAS 2.9.0 or later (the "
                                 "commissioning script hands MAAS the power parameters through BMC_CONFIG_PATH)")
    assert maas.check_version("3.6.2") == [
        "MAAS 3.6.2 rejects DNS names in a redfish power address (LP:2150892; affects 3.6.0-3.6.4 and "
        "3.7.0-3.7.2): enlistment of KubeVirt VMs fails; upgrade MAAS"]
    # MAAS's text is cut to 40 characters: it is quoted, not trusted.
    assert maas.check_version("x" * 100) == [f"cannot read the MAAS version '{'x' * 37}...'; assuming at least 2.9.0"]


def test_version_refuses_an_answer_without_a_version():
    client = MAASClient("http://maas/MAAS/", Signer("a", "b", "c"), retry=FAST,
                        transport=Answer(200, b'{"subversion": "x"}'))
    with pytest.raises(MAASError) as caught:
        client.version()
    assert caught.value.kind == "malformed"
    assert str(caught.value) == "GET version/: 200: no version in the response"


# --- scripts, the user and settings ----------------------------------------------------------


def test_a_script_is_created_read_updated_and_downloaded(double):
    client = client_for(double)
    assert client.script("probe") is None and client.script_exists("probe") is False
    created = client.create_script("probe", b"#!/bin/sh\necho one\n", tags="a,b", timeout="00:05:00")
    assert created["name"] == "probe" and {"a", "b"} <= set(created["tags"])
    assert client.script_exists("probe") is True
    assert client.script("probe")["history"][0]["comment"] == ""   # no comment unless one is given
    assert client.script_text("probe") == b"#!/bin/sh\necho one\n"  # bytes as stored, not JSON
    client.update_script("probe", b"#!/bin/sh\necho two\n", "second", timeout="00:10:00")
    client.update_script("probe", b"#!/bin/sh\necho three\n")
    stored = client.script("probe")
    assert [h["comment"] for h in stored["history"]] == ["", "second", ""] and stored["timeout"] == "0:10:00"
    assert client.script_text("probe") == b"#!/bin/sh\necho three\n"
    assert [w[:2] for w in double.writes] == [("POST", "scripts/"), ("PUT", "scripts/probe"), ("PUT", "scripts/probe")]
    client.create_script("probe2", b"#!/bin/sh\n", "first")
    assert client.script("probe2")["history"][0]["comment"] == "first"


def test_script_errors_other_than_404_are_raised(double):
    client = client_for(double)
    double.inject("500", path="scripts/probe")
    with pytest.raises(MAASError) as caught:
        client.script("probe")
    assert caught.value.status == 500
    double.inject("reply", status=405, body="Method not allowed", path="scripts/probe")
    with pytest.raises(MAASError) as caught:
        client.script("probe")
    assert caught.value.status == 405
    double.inject("reply", status=200, body=["probe"], path="scripts/probe")
    with pytest.raises(MAASError) as caught:
        client.script("probe")
    assert caught.value.kind == "malformed"
    assert str(caught.value) == "GET scripts/probe: 200: expected a script object"


def test_whoami_and_config(double):
    client = client_for(double)
    assert client.whoami()["is_superuser"] is True
    double.admin = False
    assert client.whoami()["is_superuser"] is False
    assert client.config("enlist_commissioning") is True
    double.settings["enlist_commissioning"] = False
    assert client.config("enlist_commissioning") is False
    assert double.log[-1] == ("GET", "maas/", "get_config")


@pytest.mark.parametrize("body", [{"username": "admin"}, {"is_superuser": "true"}, ["admin"]])
def test_whoami_refuses_a_user_without_is_superuser(double, body):
    double.inject("reply", status=200, body=body, path="users/")
    with pytest.raises(MAASError) as caught:
        client_for(double).whoami()
    assert caught.value.kind == "malformed"
    assert str(caught.value) == "GET users/?op=whoami: 200: expected a user with is_superuser"


# --- what each attempt is given, and its limits ----------------------------------------------


class Recording:
    """A transport that records the timeout each attempt is given and answers an empty list."""

    def __init__(self, body: bytes = b"[]"):
        self.timeouts: list[float] = []
        self.body = body

    def send(self, method, url, headers, files, timeout):
        self.timeouts.append(timeout)
        return Response(200, {"Content-Type": "application/json"}, self.body)

    def close(self):
        pass


def test_an_attempt_gets_the_timeout_or_what_is_left_of_the_deadline():
    transport = Recording()
    client = MAASClient("http://maas/MAAS/", Signer("a", "b", "c"), transport=transport, timeout=30, retry=FAST)
    client.machines()
    with client.within(5):
        client.machines()
    with client.within(60):
        client.machines()
    full, left, capped = transport.timeouts
    assert full == 30.0 and 4 < left <= 5 and capped == 30.0


def test_a_commission_attempt_gets_commission_timeout_or_what_is_left_of_the_deadline():
    transport = Recording(b"{}")
    client = MAASClient("http://maas/MAAS/", Signer("a", "b", "c"), transport=transport, timeout=30,
                        commission_timeout=200, retry=FAST)
    client.commission("abc123")
    client.update_machine("abc123", hostname="x")
    with client.within(100):
        client.commission("abc123")
    with client.within(500):
        client.commission("abc123")
    commission, put, left, capped = transport.timeouts
    assert commission == 200.0 and put == 30.0 and 99 < left <= 100 and capped == 200.0


def test_a_deadline_already_passed_sends_nothing():
    transport = Recording()
    client = MAASClient("http://maas/MAAS/", Signer("a", "b", "c"), transport=transport, retry=FAST)
    with client.within(-1), pytest.raises(MAASError) as caught:
        client.machines()
    assert str(caught.value) == "GET machines/: deadline: the cycle's deadline (maas.cycle_deadline) passed"
    assert not caught.value.in_flight and transport.timeouts == []
    assert client.deadline is None  # within() gives the old deadline back


def test_a_body_of_exactly_the_cap_is_accepted():
    body = b"[" + b" " * 1022 + b"]"
    client = MAASClient("http://maas/MAAS/", Signer("a", "b", "c"), transport=Recording(body), retry=FAST,
                        max_body=len(body))
    assert client.machines() == []
    client.max_body = len(body) - 1
    with pytest.raises(MAASTooLarge):
        client.machines()


def test_an_abandoned_attempt_lives_on_in_a_daemon_thread():
    """It cannot hold up the process's exit; its name says what it is in a thread dump."""
    release = threading.Event()

    class Stuck:
        def send(self, method, url, headers, files, timeout):
            release.wait(5)
            return Response(200, {}, b"[]")

    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    client = MAASClient("http://maas/MAAS/", Signer("a", "b", "c"), transport=Stuck(), retry=FAST, stop=stop)
    with pytest.raises(MAASError):
        client.machines()
    workers = [t for t in threading.enumerate() if t.name == "maas-request" and t.is_alive()]
    release.set()
    assert workers and all(t.daemon for t in workers)


def test_defaults():
    client = MAASClient("http://maas/MAAS/", Signer("a", "b", "c"))
    assert client.timeout == 30.0 and client.max_body == maas.DEFAULT_MAX_RESPONSE
    assert client.commission_timeout == 300.0
    assert client.transport.max_body == maas.DEFAULT_MAX_RESPONSE and client.transport.verify is True
    assert client.retry == RetryPolicy(attempts=4, backoff=1.0, max_backoff=30.0, max_retry_after=120.0)


# --- statuses, bodies and retries ------------------------------------------------------------


@pytest.mark.parametrize("status, body, expected", [
    (200, b'{"id": 1}', {"id": 1}), (201, b'{"id": 2}', {"id": 2}), (204, b"", None), (200, b" \n", None),
])
def test_success_statuses_and_empty_bodies(status, body, expected):
    client = MAASClient("http://maas/MAAS/", Signer("a", "b", "c"), transport=Answer(status, body), retry=FAST)
    assert client.call("POST", "resourcepools/") == expected


def test_malformed_json_line_and_no_retry():
    answer = Answer(200, b'[{"a"')
    client = MAASClient("http://maas/MAAS/", Signer("a", "b", "c"), transport=answer, retry=FAST)
    with pytest.raises(MAASError) as caught:
        client.machines()
    assert str(caught.value) == "GET machines/: 200: malformed JSON in the response (5 bytes)"
    assert caught.value.kind == "malformed" and len(answer.sent) == 1


def test_an_http_error_is_of_kind_http_and_was_not_left_in_flight():
    client = MAASClient("http://maas/MAAS/", Signer("a", "b", "c"), transport=Answer(500, b"boom", "text/plain"),
                        retry=FAST)
    with pytest.raises(MAASError) as caught:
        client.machines()
    assert (caught.value.kind, caught.value.in_flight, caught.value.status) == ("http", False, 500)


def test_a_refused_key_names_where_it_came_from_by_default():
    client = MAASClient("http://maas/MAAS/", Signer("a", "b", "c"), retry=FAST,
                        transport=Answer(401, b"Expired timestamp", "text/plain"))
    with pytest.raises(MAASAuthError) as caught:
        client.machines()
    assert str(caught.value) == ("GET machines/: 401: Expired timestamp "
                                 "(the API key was refused: check the MAAS API key)")


def test_an_html_error_page_is_known_by_its_content_type():
    client = MAASClient("http://maas/MAAS/", Signer("a", "b", "c"), retry=FAST,
                        transport=Answer(502, b"\xef\xbb\xbf<html><title>Bad Gateway</title></html>", "text/html"))
    with pytest.raises(MAASError) as caught:
        client.machines()
    assert str(caught.value) == "GET machines/: 502: Bad Gateway"


def test_retry_after_on_another_status_does_not_make_it_retried():
    answer = Answer(500, b"boom", "text/plain")
    answer.reply.headers["Retry-After"] = "1"
    client = MAASClient("http://maas/MAAS/", Signer("a", "b", "c"), transport=answer, retry=FAST, sleep=Recorder())
    with pytest.raises(MAASError):
        client.machines()
    assert len(answer.sent) == 1 and client.sleep.sleeps == []


def test_backoff_jitter_adds_at_most_a_tenth(double, monkeypatch):
    for pick, expected in ((lambda low, high: low, [1.0, 2.0, 3.0]), (lambda low, high: high, [1.1, 2.2, 3.3])):
        monkeypatch.setattr(maas.client.random, "uniform", pick)
        double.inject("503", retry_after=None, count=3)
        sleep = Recorder()
        client = client_for(double, sleep=sleep, retry=RetryPolicy(attempts=4, backoff=1.0, max_backoff=3))
        client.machines()
        assert sleep.sleeps == pytest.approx(expected)
        assert client.requests == 4  # every attempt counts


def test_a_retry_the_deadline_would_pass_is_not_made(double):
    double.inject("503", retry_after="5")
    client = client_for(double, retry=RetryPolicy(attempts=4, max_retry_after=60))
    with client.within(2.0), pytest.raises(MAASError) as caught:
        client.machines()
    assert caught.value.kind == "deadline"
    assert str(caught.value) == (
        "GET machines/: 503: Unable to connect to any rack controller; please try again later.; not retried: "
        "the cycle's deadline (maas.cycle_deadline) comes first")


def test_a_signal_while_waiting_to_retry_ends_the_call(double):
    double.inject("503", retry_after="30")
    client = client_for(double, sleep=lambda seconds: True, retry=RetryPolicy(attempts=3, max_retry_after=60))
    with pytest.raises(MAASError) as caught:
        client.machines()
    assert str(caught.value) == "GET machines/: interrupted: stopped by a signal while waiting to retry"


# --- the HTTP transport ----------------------------------------------------------------------


def raw_server(*replies: bytes, tls=None):
    """A socket server on 127.0.0.1 that answers each connection with the next of ``replies``
    as raw bytes and hangs up; its port."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)

    def serve():
        for reply in replies:
            connection, _ = server.accept()
            try:
                if tls:
                    connection = tls.wrap_socket(connection, server_side=True)
                connection.recv(65536)
                connection.sendall(reply)
            except OSError:
                pass
            finally:
                connection.close()
        server.close()

    threading.Thread(target=serve, daemon=True).start()
    return server.getsockname()[1]


def once(port, **kw) -> MAASClient:
    return MAASClient(f"http://127.0.0.1:{port}/MAAS/", Signer("a", "b", "c"),
                      retry=RetryPolicy(attempts=1), timeout=3, **kw)


def test_a_redirect_is_reported_not_followed():
    """Following it would send the signed request to wherever MAAS (or a proxy) points."""
    port = raw_server(b"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:9/elsewhere\r\nContent-Length: 0\r\n\r\n")
    with pytest.raises(MAASError) as caught:
        once(port).machines()
    assert str(caught.value) == (f"GET machines/: 302: (no message): no MAAS API at http://127.0.0.1:{port}/MAAS/: "
                                 "maas.url must be the region's URL (e.g. http://HOST:5240/MAAS/)")


def test_a_declared_length_over_the_cap_is_refused_before_reading():
    port = raw_server(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 3145728\r\n\r\n[")
    with pytest.raises(MAASTooLarge) as caught:
        once(port, max_body=2**20).machines()
    assert "(1 MiB; found 3 MiB)" in str(caught.value)


@pytest.mark.parametrize("framing", ["declared", "chunked", "until-close"])
def test_a_body_of_exactly_the_cap_is_read(framing):
    body = b"[" + b" " * 1022 + b"]"
    head = {"declared": f"Content-Length: {len(body)}\r\n", "chunked": "Transfer-Encoding: chunked\r\n",
            "until-close": "Connection: close\r\n"}[framing]
    payload = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body) if framing == "chunked" else body
    port = raw_server(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + head.encode() + b"\r\n" + payload)
    assert once(port, max_body=len(body)).machines() == []


@pytest.mark.parametrize("framing", ["chunked", "until-close"])
def test_a_body_past_the_cap_without_a_declared_length_is_refused_as_it_comes(framing):
    body = b"[" + b" " * 1023 + b"]"
    head = {"chunked": "Transfer-Encoding: chunked\r\n", "until-close": "Connection: close\r\n"}[framing]
    payload = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body) if framing == "chunked" else body
    port = raw_server(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + head.encode() + b"\r\n" + payload)
    with pytest.raises(MAASTooLarge) as caught:
        once(port, max_body=1024).machines()
    assert str(caught.value) == f"GET machines/: too-large: {maas._too_large(1024)}"


def test_a_broken_chunked_body_is_a_connection_failure_named_by_its_type():
    port = raw_server(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
    with pytest.raises(MAASError) as caught:
        once(port).machines()
    assert str(caught.value) == f"GET machines/: connection: ChunkedEncodingError at http://127.0.0.1:{port}/MAAS/"


def test_proxies_from_the_environment_are_used(double, monkeypatch):
    """An operator behind an HTTP proxy sets HTTP_PROXY, as for any requests-based tool."""
    for name in ("NO_PROXY", "no_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{double.port}")
    monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{double.port}")
    client = MAASClient("http://127.0.0.2:9/MAAS/", Signer(*double.api_key), retry=RetryPolicy(attempts=1),
                        timeout=3)
    assert client.machines() == []  # nothing listens on 127.0.0.2:9: the proxy (the double) answered


def test_tls_is_verified_against_the_system_or_the_given_authorities(tmp_path):
    openssl = require_tool("openssl", "openssl makes the self-signed certificate of the HTTPS test")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    ok = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n[]"
    port = raw_server(ok, ok, tls=context)
    url = f"https://127.0.0.1:{port}/MAAS/"
    client = MAASClient(url, Signer("a", "b", "c"), retry=RetryPolicy(attempts=1), timeout=3)
    with pytest.raises(MAASError) as caught:
        client.machines()
    assert str(caught.value) == (f"GET machines/: connection: TLS error, certificate not trusted at {url}: "
                                 "set REQUESTS_CA_BUNDLE to the file of the CA that signed MAAS's certificate")
    # A region with a private CA: the Transport is given its certificate.
    client = MAASClient(url, Signer("a", "b", "c"), retry=RetryPolicy(attempts=1), timeout=3,
                        transport=maas.Transport(verify=str(cert)))
    assert client.machines() == []


def test_an_error_line_keeps_the_path_as_given_when_the_query_has_no_op():
    answer = Answer(404, b"No Tag matches the given query.", "text/plain")
    client = MAASClient("http://maas/MAAS/", Signer("a", "b", "c"), transport=answer, retry=FAST)
    with pytest.raises(MAASError) as caught:
        client.call("GET", "tags/GPU-X", [("id", "abc")])
    assert str(caught.value) == "GET tags/GPU-X: 404: No Tag matches the given query."
    assert answer.sent == [("GET", "http://maas/MAAS/api/2.0/tags/GPU-X?id=abc")]


# --- every call's error line and answer shape ------------------------------------------------


CALLS = {  # what the client does -> how its error lines begin
    "version": (lambda c, sid: c.version(), "GET version/"),
    "machines": (lambda c, sid: c.machines(), "GET machines/"),
    "machines_by_id": (lambda c, sid: c.machines_by_id([sid]), "GET machines/"),
    "taken_hostnames": (lambda c, sid: c.taken_hostnames(["web1-vms"]), "GET nodes/"),
    "power_addresses": (lambda c, sid: c.power_addresses([sid]), "GET machines/?op=power_parameters"),
    "power_address": (lambda c, sid: c.power_address(sid), "GET machines/{sid}/?op=power_parameters"),
    "events": (lambda c, sid: c.events("DEBUG"), "GET events/?op=query"),
    "pools": (lambda c, sid: c.pools(), "GET resourcepools/"),
    "create_pool": (lambda c, sid: c.create_pool("vms"), "POST resourcepools/"),
    "update_machine": (lambda c, sid: c.update_machine(sid, hostname="x"), "PUT machines/{sid}/"),
    "update_machine power_pass": (lambda c, sid: c.update_machine(sid, power_parameters_power_pass="pw-long"),
                                  "PUT machines/{sid}/"),
    "commission": (lambda c, sid: c.commission(sid), "POST machines/{sid}/?op=commission"),
    "commission by mapping": (lambda c, sid: c.call("POST", f"machines/{sid}/", {"op": "commission"}),
                              "POST machines/{sid}/?op=commission"),
    "script": (lambda c, sid: c.script("probe"), "GET scripts/probe"),
    "script_text": (lambda c, sid: c.script_text("probe"), "GET scripts/probe?op=download"),
    "create_script": (lambda c, sid: c.create_script("probe", b"#!/bin/sh\n"), "POST scripts/"),
    "update_script": (lambda c, sid: c.update_script("probe", b"#!/bin/sh\n"), "PUT scripts/probe"),
    "whoami": (lambda c, sid: c.whoami(), "GET users/?op=whoami"),
    "config": (lambda c, sid: c.config("enlist_commissioning"), "GET maas/?op=get_config"),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_each_call_names_its_method_and_path_in_an_error(double, name):
    sid = double.add_vm("web1", "vms")
    action, start = CALLS[name]
    double.inject("500")
    with pytest.raises(MAASError) as caught:
        action(client_for(double), sid)
    before, status, _ = str(caught.value).split(": ", 2)
    assert (before, status) == (start.format(sid=sid), "500")


@pytest.mark.parametrize("name, body, line", [
    ("machines", {"machines": []}, "GET machines/: 200: expected a list of machines"),
    ("taken_hostnames", {"nodes": []}, "GET nodes/: 200: expected a list of nodes"),
    ("power_addresses", [], "GET machines/?op=power_parameters: 200: expected a mapping of system_id to parameters"),
    ("events", [], "GET events/?op=query: 200: expected an object with a list of events"),
    ("events", {"events": {}}, "GET events/?op=query: 200: expected an object with a list of events"),
    ("pools", {"pools": []}, "GET resourcepools/: 200: expected a list of resource pools"),
    ("version", ["3.5.4"], "GET version/: 200: no version in the response"),
])
def test_each_listing_refuses_the_wrong_shape(double, name, body, line):
    sid = double.add_vm("web1", "vms")
    double.inject("reply", status=200, body=body)
    with pytest.raises(MAASError) as caught:
        CALLS[name][0](client_for(double), sid)
    assert caught.value.kind == "malformed" and str(caught.value) == line


def test_events_asks_for_one_page_after_an_id(double):
    client = client_for(double)
    sid = double.add_vm("web1", "vms")
    double.set_status(sid, "Commissioning")  # MAAS records the transition
    newest = client.events("DEBUG")
    assert [event["type"] for event in newest] == ["Node changed status"]
    assert double.urls[-1].endswith("/events/?op=query&level=DEBUG&limit=1000")
    client.events("INFO", after=5, limit=10)
    assert double.urls[-1].endswith("/events/?op=query&level=INFO&limit=10&after=5")


def test_taken_hostnames_skip_records_that_are_not_nodes(double):
    held = double.add_node("web1-vms", "device")
    junk = ["web2-vms", {"hostname": None, "system_id": "x"}, {"system_id": "y"}]
    double.inject("reply", status=200, body=junk + [{"hostname": "web1-vms", "system_id": held}])
    assert client_for(double).taken_hostnames(["web1-vms", "web2-vms"]) == {"web1-vms": held}


def test_commission_sends_skip_bmc_config_unless_told_not_to(double):
    sid = double.add_vm("web1", "vms")
    client = client_for(double)
    client.commission(sid)
    double.set_status(sid, "Ready")
    client.commission(sid, skip_bmc_config=False)
    assert double.commissions == [(sid, True), (sid, False)]


# --- a commission waits for the power-on -----------------------------------------------------
# MAAS answers POST machines/{id}/?op=commission only once the rack has powered the machine on
# (src/maasserver/utils/views.py, get_response; DeferredHooks.fire in
# src/maasserver/utils/asynchronous.py): as long as the VM takes to start.


def is_commission(request) -> bool:
    return request.op == "commission"


def test_a_commission_answered_after_timeout_but_within_commission_timeout_succeeds(double):
    sid = double.add_vm("web1", "vms")
    delay_answers(double, 1.5, is_commission)
    client = client_for(double, timeout=0.5, commission_timeout=5)
    started = time.monotonic()
    client.commission(sid)
    assert time.monotonic() - started >= 1.5
    assert double.commissions == [(sid, True)] and double.machines[sid]["status_name"] == "Commissioning"
    assert client.requests == 1


def test_only_a_commission_waits_commission_timeout(double):
    sid = double.add_vm("web1", "vms")
    delay_answers(double, 1.5, lambda request: request.method == "PUT")
    client = client_for(double, timeout=0.5, commission_timeout=5)
    started = time.monotonic()
    with pytest.raises(MAASError) as caught:
        client.update_machine(sid, hostname="web1-vms")
    assert (caught.value.kind, caught.value.in_flight) == ("timeout", True)
    assert time.monotonic() - started < 1.5


def test_a_commission_slower_than_commission_timeout_times_out_in_flight_sent_once(double):
    sid = double.add_vm("web1", "vms")
    delay_answers(double, 2, is_commission)
    client = client_for(double, timeout=10, commission_timeout=0.5)
    started = time.monotonic()
    with pytest.raises(MAASError) as caught:
        client.commission(sid)
    assert (caught.value.kind, caught.value.in_flight) == ("timeout", True)
    assert time.monotonic() - started < 1.5  # commission_timeout, not timeout
    assert client.requests == 1


def test_the_cycles_deadline_still_bounds_a_commission(double):
    sid = double.add_vm("web1", "vms")
    delay_answers(double, 3, is_commission)
    client = client_for(double, timeout=0.5, commission_timeout=10)
    started = time.monotonic()
    with client.within(0.8), pytest.raises(MAASError) as caught:
        client.commission(sid)
    # The attempt's read timeout is what is left of the deadline, so it and the poll of the
    # deadline end it at the same moment: either may say so first.
    assert caught.value.kind in ("deadline", "timeout") and caught.value.in_flight
    assert time.monotonic() - started < 0.8 + 5 * maas.POLL


def test_what_the_form_fields_hold_on_the_wire():
    """MAAS's forms read the multipart fields: each value is sent as text, files as files."""
    sent = []

    class Capture:
        def send(self, method, url, headers, files, timeout):
            sent.append((method, url.split("/api/2.0/")[1], files))
            return Response(200, {"Content-Type": "application/json"}, b"{}")

    client = MAASClient("http://maas/MAAS/", Signer("a", "b", "c"), transport=Capture(), retry=FAST)
    client.commission("abc")
    client.create_pool("vms")
    client.update_machine("abc", power_parameters_power_pass="pw-long")
    client.create_script("probe", b"#!/bin/sh\n")
    assert sent == [
        ("POST", "machines/abc/?op=commission", {"skip_bmc_config": (None, "1")}),
        ("POST", "resourcepools/", {"name": (None, "vms"), "description": (None, "")}),
        ("PUT", "machines/abc/", {"power_parameters_power_pass": (None, "pw-long")}),
        ("POST", "scripts/", {"name": (None, "probe"), "comment": (None, ""), "script": ("probe", b"#!/bin/sh\n")}),
    ]
    client.commission("abc", skip_bmc_config=False)
    assert sent[-1] == ("POST", "machines/abc/?op=commission", None)


def test_a_power_password_echoed_back_is_withheld(double):
    sid = double.add_vm("web1", "vms")
    double.inject("echo", method="PUT")
    with pytest.raises(MAASError) as caught:
        client_for(double).update_machine(sid, power_parameters_power_pass="Sup3r-Secret-pw")
    assert str(caught.value) == f"PUT machines/{sid}/: 400: power_parameters_power_pass=<withheld>"


# --- the deadline's edge, on a clock the test moves ------------------------------------------


class Clock:
    """time.monotonic() reading the given values in turn, then the last one for ever."""

    def __init__(self, *readings: float):
        self.readings = list(readings)

    def __call__(self) -> float:
        return self.readings.pop(0) if len(self.readings) > 1 else self.readings[0]


def test_a_deadline_reached_exactly_sends_nothing(monkeypatch):
    monkeypatch.setattr(maas.client.time, "monotonic", Clock(100.0))
    transport = Recording()
    client = MAASClient("http://maas/MAAS/", Signer("a", "b", "c"), transport=transport, retry=FAST)
    with client.within(0), pytest.raises(MAASError) as caught:
        client.machines()
    assert caught.value.kind == "deadline" and transport.timeouts == []


def test_a_request_running_when_the_deadline_is_reached_exactly_is_abandoned(monkeypatch):
    class Slow:
        def send(self, method, url, headers, files, timeout):
            time.sleep(0.5)
            return Response(200, {}, b"[]")

    # within() reads 100 (deadline 101), the attempt 100 (1 s left), the first poll 101.
    monkeypatch.setattr(maas.client.time, "monotonic", Clock(100.0, 100.0, 101.0))
    client = MAASClient("http://maas/MAAS/", Signer("a", "b", "c"), transport=Slow(), retry=FAST)
    with client.within(1), pytest.raises(MAASError) as caught:
        client.machines()
    assert caught.value.kind == "deadline" and caught.value.in_flight


def test_a_retry_due_exactly_at_the_deadline_is_not_made(monkeypatch):
    monkeypatch.setattr(maas.client.time, "monotonic", Clock(100.0))
    client = MAASClient("http://maas/MAAS/", Signer("a", "b", "c"), transport=ThenOK("5"), sleep=Recorder(),
                        retry=RetryPolicy(attempts=3, max_retry_after=60))
    with client.within(5), pytest.raises(MAASError) as caught:
        client.machines()
    assert caught.value.kind == "deadline" and client.sleep.sleeps == []


def test_connect_waits_at_most_ten_seconds_and_reads_wait_the_timeout(monkeypatch):
    """A region that does not accept connections is known in 10 s; a slow answer gets the whole timeout."""
    given = []

    class Reply:
        status_code, headers = 200, {"Content-Length": "2"}

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def iter_content(self, size):
            yield b"[]"

    transport = maas.Transport()
    monkeypatch.setattr(transport.session, "request", lambda *a, **kw: given.append(kw["timeout"]) or Reply())
    transport.send("GET", "http://maas/MAAS/api/2.0/machines/", {}, None, 30.0)
    transport.send("GET", "http://maas/MAAS/api/2.0/machines/", {}, None, 2.0)
    assert given == [(10.0, 30.0), (2.0, 2.0)]


def test_the_key_is_read_as_utf_8_whatever_the_locale(tmp_path):
    """A service may run in the C locale without coercion (ASCII): the key and its file still read as UTF-8."""
    key = tmp_path / "api-key"
    key.write_text("cl\u00e9:t1:s1secret\n", encoding="utf-8")
    key.chmod(0o600)
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    (credentials / "api-key").write_text("cr\u00e9:t2:s2secret\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("MAAS_API_KEY", "CREDENTIALS_DIRECTORY")}
    env.update(LC_ALL="C", LANG="C", PYTHONCOERCECLOCALE="0", PYTHONUTF8="0",
               PYTHONPATH=os.pathsep.join(sys.path))
    program = ("import sys; from maas_kubevirt import maas; "
               f"print(ascii(maas.load_api_key({{'api_key_file': {str(key)!r}}}, print)))")
    for extra, expected in (({}, "('cl\\xe9', 't1', 's1secret')"),
                            ({"CREDENTIALS_DIRECTORY": str(credentials)}, "('cr\\xe9', 't2', 's2secret')")):
        run = subprocess.run([sys.executable, "-c", program], env={**env, **extra}, capture_output=True, text=True)
        assert run.stdout.strip() == expected, run.stderr


def test_a_key_error_says_nothing_of_where_unless_told():
    with pytest.raises(ValuesError) as caught:
        maas.parse_api_key("a:b", "MAAS_API_KEY")
    assert str(caught.value) == ("MAAS_API_KEY: expected a MAAS API key of the form consumer:token:secret "
                                 "(from `maas apikey --username USER`), found 2 colon-separated part(s)")


@pytest.mark.parametrize("base", ["https://proxy.example/SITE-X", "https://proxy.example/SITE-X/",
                                  "https://proxy.example/SITE-X//"])
def test_a_region_behind_a_proxy_keeps_its_path_whatever_it_ends_with(base):
    client = MAASClient(base, Signer("a", "b", "c"))
    assert client.url("version/") == "https://proxy.example/SITE-X/api/2.0/version/"


@pytest.mark.parametrize("path", ["version/", "/version/", "//version/"])
def test_an_api_path_with_or_without_a_leading_slash_is_the_same_resource(path):
    client = MAASClient("https://maas.example:5443/MAAS/", Signer("a", "b", "c"))
    assert client.url(path, {"op": "x"}) == "https://maas.example:5443/MAAS/api/2.0/version/?op=x"


# --- a change is sent once unless MAAS asks for it again (issue 17) ---------------------------


class Scripted:
    """Answers each attempt with the next outcome (a Response, or a TransportError it raises),
    then 200 with ``{}``; records every attempt."""

    def __init__(self, *outcomes):
        self.outcomes = list(outcomes)
        self.sent: list[tuple[str, str]] = []

    def send(self, method, url, headers, files, timeout):
        self.sent.append((method, url.split("/api/2.0/")[1]))
        outcome = self.outcomes.pop(0) if self.outcomes else Response(200, {"Content-Type": "application/json"}, b"{}")
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def close(self):
        pass


def scripted(*outcomes, retry=RetryPolicy(attempts=4, backoff=0.01, max_backoff=0.05, max_retry_after=60)):
    transport, sleep = Scripted(*outcomes), Recorder()
    return MAASClient("http://maas/MAAS/", Signer("a", "b", "c"), transport=transport, sleep=sleep,
                      retry=retry), transport, sleep


CHANGES = {
    "commission": lambda c: c.commission("abc"),
    "update_machine": lambda c: c.update_machine("abc", hostname="web1-vms", pool="vms"),
    "update_machine power_pass": lambda c: c.update_machine("abc", power_parameters_power_pass="pw-long"),
    "create_pool": lambda c: c.create_pool("vms"),
    "delete": lambda c: c.call("DELETE", "machines/abc/"),
}
MAY_HAVE_ARRIVED = {
    "reset": TransportError("connection", CLOSED),
    "read timeout": TransportError("timeout", "no answer in time"),
}
NEVER_LEFT = {
    "refused": TransportError("connection", "connection refused", sent=False),
    "no DNS answer": TransportError("connection", "cannot resolve the MAAS host name", sent=False),
    "connect timeout": TransportError("timeout", "no connection in time", sent=False),
}
SERVICE_UNAVAILABLE = Response(503, {"Content-Type": "text/plain"}, b"Unable to power on")


@pytest.mark.parametrize("failure", sorted(MAY_HAVE_ARRIVED))
@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_change_that_may_have_reached_maas_is_sent_once_and_in_flight(change, failure):
    client, transport, sleep = scripted(MAY_HAVE_ARRIVED[failure])
    with pytest.raises(MAASError) as caught:
        CHANGES[change](client)
    assert len(transport.sent) == 1 and sleep.sleeps == []
    assert caught.value.in_flight and caught.value.status is None
    assert caught.value.kind == MAY_HAVE_ARRIVED[failure].kind
    assert str(caught.value).endswith("after the request was sent: MAAS may have carried it out; not sent again")


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_change_answered_503_without_retry_after_is_sent_once(change):
    """MAAS 3.6.5 answers a commission whose power-on failed so, after it started commissioning."""
    client, transport, sleep = scripted(SERVICE_UNAVAILABLE)
    with pytest.raises(MAASError) as caught:
        CHANGES[change](client)
    assert len(transport.sent) == 1 and sleep.sleeps == []
    assert caught.value.status == 503 and not caught.value.in_flight
    assert str(caught.value).endswith(": 503: Unable to power on")


@pytest.mark.parametrize("failure", sorted(NEVER_LEFT))
@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_change_that_never_left_is_sent_again(change, failure):
    client, transport, sleep = scripted(NEVER_LEFT[failure], NEVER_LEFT[failure])
    CHANGES[change](client)
    assert len(transport.sent) == 3 and len(sleep.sleeps) == 2
    assert transport.sent[0] == transport.sent[1] == transport.sent[2]


@pytest.mark.parametrize("status, retry_after", [(503, "10"), (409, "5")])
@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_change_maas_asks_for_again_is_sent_again(change, status, retry_after):
    """Retry-After: MAAS rolled the view back and wants the request again (middleware.py, views.py)."""
    client, transport, sleep = scripted(Response(status, {"Retry-After": retry_after}, b"busy"))
    CHANGES[change](client)
    assert len(transport.sent) == 2 and sleep.sleeps == [float(retry_after)]


@pytest.mark.parametrize("failure", ["reset", "read timeout", "503"])
def test_a_read_is_asked_again_after_the_same_failures(failure):
    outcome = SERVICE_UNAVAILABLE if failure == "503" else MAY_HAVE_ARRIVED[failure]
    client, transport, sleep = scripted(outcome, outcome)
    assert client.call("GET", "machines/") == {}
    assert len(transport.sent) == 3


def test_a_change_sent_again_is_bounded_like_a_read():
    client, transport, _ = scripted(*[NEVER_LEFT["refused"]] * 10, retry=RetryPolicy(attempts=3, backoff=0.01))
    with pytest.raises(MAASError) as caught:
        client.commission("abc")
    assert len(transport.sent) == 3 and not caught.value.in_flight
    assert str(caught.value).startswith("POST machines/abc/?op=commission: connection: connection refused at "
                                        "http://maas/MAAS/: nothing listens there")


def test_a_change_whose_answer_is_too_large_may_have_been_made():
    client, _, _ = scripted(TransportError("too-large", "response body larger than ..."))
    with pytest.raises(MAASTooLarge) as caught:
        client.commission("abc")
    assert caught.value.in_flight
    client, _, _ = scripted(TransportError("too-large", "response body larger than ..."))
    with pytest.raises(MAASTooLarge) as caught:
        client.machines()
    assert not caught.value.in_flight


def test_commission_answered_503_by_the_double_is_sent_once(double):
    sid = double.add_vm("web1", "vms")
    double.inject("503", retry_after=None, path="op=commission")
    with pytest.raises(MAASError) as caught:
        client_for(double).commission(sid)
    assert caught.value.status == 503
    assert double.counts[("POST", "machines/{id}/?op=commission")] == 1


@pytest.mark.parametrize("fault", ["reset", "hang"])
def test_a_change_cut_off_on_the_wire_is_sent_once(double, fault):
    sid = double.add_vm("web1", "vms")
    double.inject(fault, method="PUT", hang=1.5, count=5)
    with pytest.raises(MAASError) as caught:
        client_for(double, timeout=1).update_machine(sid, hostname="web1-vms")
    assert caught.value.in_flight and caught.value.kind == ("timeout" if fault == "hang" else "connection")
    assert double.request_count == 1


class Counting(maas.Transport):
    """The real transport, counting its attempts."""

    def __init__(self):
        super().__init__()
        self.attempts = 0

    def send(self, *args, **kw):
        self.attempts += 1
        return super().send(*args, **kw)


def test_a_change_to_a_port_that_refuses_is_tried_again_on_the_real_transport():
    transport = Counting()
    client = MAASClient("http://127.0.0.1:9/MAAS/", Signer("a", "b", "c"), transport=transport,
                        retry=RetryPolicy(attempts=3, backoff=0.01), timeout=1)
    with pytest.raises(MAASError) as caught:
        client.update_machine("abc", hostname="x")
    assert transport.attempts == 3 and not caught.value.in_flight
    assert caught.value.kind == "connection"


def test_a_server_that_hangs_up_after_reading_a_change_gets_it_once():
    port = raw_server(b"", b"")
    transport = Counting()
    client = MAASClient(f"http://127.0.0.1:{port}/MAAS/", Signer("a", "b", "c"), transport=transport,
                        retry=RetryPolicy(attempts=3, backoff=0.01), timeout=2)
    with pytest.raises(MAASError) as caught:
        client.commission("abc")
    assert transport.attempts == 1 and caught.value.in_flight
    assert str(caught.value) == (f"POST machines/abc/?op=commission: connection: {CLOSED} after the "
                                 "request was sent: MAAS may have carried it out; not sent again")


@pytest.mark.parametrize("error, never_sent", [
    (requests.ConnectionError(ConnectionRefusedError(111, "Connection refused")), True),
    (requests.ConnectionError(urllib3.exceptions.NewConnectionError(None, "No route to host")), True),
    (requests.ConnectionError(urllib3.exceptions.NameResolutionError(
        "maas.example.com", None, socket.gaierror(-3, "Temporary failure"))), True),
    (requests.ConnectionError(socket.gaierror(-2, "Name or service not known")), True),
    (requests.ConnectTimeout(urllib3.exceptions.ConnectTimeoutError(None, "connect timed out")), True),
    (requests.exceptions.SSLError(ssl.SSLCertVerificationError(1, "certificate verify failed")), True),
    (requests.ConnectionError(ConnectionResetError(104, "Connection reset by peer")), False),
    (requests.ConnectionError(http.client.RemoteDisconnected("closed")), False),
    (requests.ConnectionError(urllib3.exceptions.ProtocolError("Connection aborted.", BrokenPipeError(32, "x"))), False),
    (requests.ConnectionError(urllib3.exceptions.ReadTimeoutError(None, "/", "read timed out")), False),
    (requests.exceptions.SSLError(ssl.SSLError(1, "[SSL: DECRYPTION_FAILED_OR_BAD_RECORD_MAC]")), False),
    (requests.ConnectionError("Max retries exceeded"), False),
])
def test_only_a_connection_never_made_counts_as_never_sent(error, never_sent):
    assert maas._never_sent(error) is never_sent


def test_the_transport_says_whether_the_request_left(monkeypatch):
    transport = maas.Transport()

    def raising(error):
        def request(*args, **kw):
            raise error
        return request

    for error, sent in [(requests.ConnectTimeout("connect"), False), (requests.ReadTimeout("read"), True),
                        (requests.ConnectionError(ConnectionRefusedError(111, "x")), False),
                        (requests.ConnectionError(ConnectionResetError(104, "x")), True)]:
        monkeypatch.setattr(transport.session, "request", raising(error))
        with pytest.raises(TransportError) as caught:
            transport.send("PUT", "http://maas/MAAS/api/2.0/machines/abc/", {}, None, 1)
        assert caught.value.sent is sent, error


# --- one PUT with several fields, one of them secret ------------------------------------------


SECRET = "3f9c1e0b7a5d42c8e6b1f0a9d3c7e5b2"  # shaped like a derived BMC password


def test_update_machine_sends_every_field_in_one_put():
    client, transport, _ = scripted()
    captured = []
    transport.send = lambda method, url, headers, files, timeout: (
        captured.append((method, url.split("/api/2.0/")[1], files))
        or Response(200, {"Content-Type": "application/json"}, b"{}"))
    client.update_machine("abc", hide=(SECRET,), hostname="web1-vms", pool="vms",
                          power_parameters_power_address="web1.vms.bmc.example.com",
                          power_parameters_power_pass=SECRET)
    assert captured == [("PUT", "machines/abc/", {
        "hostname": (None, "web1-vms"), "pool": (None, "vms"),
        "power_parameters_power_address": (None, "web1.vms.bmc.example.com"),
        "power_parameters_power_pass": (None, SECRET)})]


def everything_said(error: BaseException) -> str:
    """Every way an exception reaches an output channel: str, repr, args, message, traceback."""
    import traceback

    return "\n".join([str(error), repr(error), repr(error.args), getattr(error, "message", ""),
                      "".join(traceback.format_exception(error))])


def assert_withheld(error: BaseException, secret: str = SECRET) -> None:
    said = everything_said(error)
    for start in range(0, len(secret) - 7):  # no 8 characters of it either
        assert secret[start:start + 8] not in said, said


ECHOES = {
    "400 JSON": Response(400, {"Content-Type": "application/json"},
                         f'{{"power_parameters_power_pass": ["{SECRET} is not valid"]}}'.encode()),
    "400 text": Response(400, {"Content-Type": "text/plain"}, f"bad power_pass={SECRET}".encode()),
    "400 at the cut": Response(400, {"Content-Type": "text/plain"}, ("x" * 290 + SECRET).encode()),
    "400 url-encoded": Response(400, {"Content-Type": "text/plain"}, f"pass%3D{SECRET}".encode()),
    "400 HTML": Response(400, {"Content-Type": "text/html"},
                         f"<html><title>bad {SECRET}</title></html>".encode()),
    "409": Response(409, {"Content-Type": "text/plain"}, f"conflict on {SECRET}".encode()),
    "500": Response(500, {"Content-Type": "text/html"}, f"<html><body>Traceback: {SECRET}</body></html>".encode()),
    "503": Response(503, {"Content-Type": "text/plain"}, f"power on with {SECRET} failed".encode()),
    "malformed 200": Response(200, {"Content-Type": "application/json"}, f'{{"echo": "{SECRET}'.encode()),
    "too deep 200": Response(200, {"Content-Type": "application/json"},
                             ("[" * 80 + f'"{SECRET}"' + "]" * 80).encode()),
    "timeout": TransportError("timeout", "no answer in time"),
    "reset": TransportError("connection", CLOSED),
    "too large": TransportError("too-large", "response body larger than maas.max_response_mib"),
}


@pytest.mark.parametrize("failure", sorted(ECHOES))
@pytest.mark.parametrize("how", ["update_machine", "power_pass alone"])
def test_the_secret_of_a_put_never_reaches_a_message(failure, how):
    client, _, _ = scripted(ECHOES[failure], retry=RetryPolicy(attempts=1))
    with pytest.raises(MAASError) as caught:
        if how == "power_pass alone":
            client.update_machine("abc", power_parameters_power_pass=SECRET)
        else:
            client.update_machine("abc", hide=(SECRET,), hostname="web1-vms", power_parameters_power_pass=SECRET)
    assert_withheld(caught.value)


def test_a_field_named_power_pass_is_withheld_even_when_not_listed_in_hide():
    client, _, _ = scripted(ECHOES["400 text"])
    with pytest.raises(MAASError) as caught:
        client.update_machine("abc", power_parameters_power_pass=SECRET)
    assert str(caught.value) == "PUT machines/abc/: 400: bad power_pass=<withheld>"


def test_a_secret_under_another_field_name_is_withheld_when_listed(double):
    sid = double.add_vm("web1", "vms")
    double.inject("echo", method="PUT")
    with pytest.raises(MAASError) as caught:
        client_for(double).update_machine(sid, hide=(SECRET,), hostname="web1-vms", description=SECRET)
    assert str(caught.value) == f"PUT machines/{sid}/: 400: hostname=web1-vms description=<withheld>"


@pytest.mark.parametrize("fault", ["echo", "500", "hang", "reset"])
def test_the_double_echoing_or_failing_a_password_put_never_shows_it(double, fault):
    sid = double.add_vm("web1", "vms")
    double.inject(fault, method="PUT", hang=1.5)
    with pytest.raises(MAASError) as caught:
        client_for(double, timeout=1).update_machine(
            sid, hide=(SECRET,), hostname="web1-vms", power_parameters_power_address="web1.vms.bmc.example.com",
            power_parameters_power_pass=SECRET)
    assert_withheld(caught.value)
    assert double.request_count == 1


def test_a_put_of_the_password_alone_keeps_the_other_power_parameters(double):
    sid = double.add_vm("web1", "vms")
    before = dict(double.power[sid])
    client_for(double).update_machine(sid, power_parameters_power_pass=SECRET)
    assert double.power[sid] == {**before, "power_pass": SECRET}
    assert double.counts[("PUT", "machines/{id}/")] == 1


# --- a system_id goes into a URL only as MAAS makes them (issue 18) ---------------------------


HOSTILE_IDS = ["x/../../machines/abc", "../abc", "..", ".", "abc/", "abc/../def", "ABC", "abc?op=delete",
               "abc#x", "abc%2F..%2Fdef", "", " abc", "abc\n", "abc\x1b[2J", "ａｂｃ", "\u0430bc",
               "a" * 42, "abc;rm", "abc\\..\\def", None, 42, ["abc"]]
MACHINE_CALLS = {
    "power_address": (lambda c, sid: c.power_address(sid), "GET machines/?op=power_parameters"),
    "update_machine": (lambda c, sid: c.update_machine(sid, hostname="x"), "PUT machines/"),
    "update_machine power_pass": (lambda c, sid: c.update_machine(sid, power_parameters_power_pass=SECRET),
                                  "PUT machines/"),
    "commission": (lambda c, sid: c.commission(sid), "POST machines/?op=commission"),
}


@pytest.mark.parametrize("name", sorted(MACHINE_CALLS))
@pytest.mark.parametrize("system_id", HOSTILE_IDS, ids=repr)
def test_a_system_id_maas_would_not_make_sends_nothing(system_id, name):
    client, transport, _ = scripted()
    call, start = MACHINE_CALLS[name]
    with pytest.raises(MAASError) as caught:
        call(client, system_id)
    assert transport.sent == []
    assert caught.value.kind == "malformed" and caught.value.status is None and not caught.value.in_flight
    text = str(caught.value)
    assert text.startswith(f"{start}: malformed: refused system_id ") and text.isprintable()
    assert text.endswith("MAAS makes them of lower-case letters and digits (at most 41); no request sent")
    assert maas._one_line(repr(system_id), 80) in text


def test_a_hostile_system_id_never_reaches_the_machine_it_points_at(double):
    """The attack of issue 18: the HTTP client resolved dot segments and the PUT landed on <other>."""
    other = double.add_machine("foreign", power_type="ipmi", power_pass="ipmi-S3CRET-1", status="Deployed")
    client = client_for(double)
    for hostile in (f"x/../../machines/{other}", f"../{other}", f"x/..%2F{other}"):
        with pytest.raises(MAASError):
            client.update_machine(hostile, power_parameters_power_pass=SECRET)
        with pytest.raises(MAASError):
            client.commission(hostile)
    assert double.request_count == 0 and double.writes == [] and double.commissions == []


@pytest.mark.parametrize("system_id", ["abc123", "4y3h7n", "a", "0" * 41])
def test_system_ids_as_maas_makes_them_are_sent_as_they_are(system_id):
    client, transport, _ = scripted()
    client.commission(system_id)
    client.update_machine(system_id, hostname="x")
    assert transport.sent == [("POST", f"machines/{system_id}/?op=commission"), ("PUT", f"machines/{system_id}/")]


def test_a_script_name_is_one_path_segment():
    client, transport, _ = scripted(Response(404, {}, b""))
    client.script("../machines/abc")
    client.update_script("a/b?c#d", b"#!/bin/sh\n")
    client.script_text("..")
    assert transport.sent == [("GET", "scripts/..%2Fmachines%2Fabc"), ("PUT", "scripts/a%2Fb%3Fc%23d"),
                              ("GET", "scripts/%2E%2E?op=download")]


# --- deep JSON is malformed, never a crash (issue 18) ------------------------------------------


@pytest.mark.parametrize("depth, refused", [(maas.MAX_JSON_DEPTH, False), (maas.MAX_JSON_DEPTH + 1, True),
                                            (5000, True), (200000, True)])
def test_json_nested_past_the_bound_is_malformed(depth, refused):
    body = ("[" * depth + "]" * depth).encode()
    client, _, _ = scripted(Response(200, {"Content-Type": "application/json"}, body))
    if not refused:
        assert client.call("GET", "machines/") is not None
        return
    with pytest.raises(MAASError) as caught:
        client.call("GET", "machines/")
    assert caught.value.kind == "malformed" and caught.value.status == 200
    assert str(caught.value) == (f"GET machines/: 200: JSON nested deeper than {maas.MAX_JSON_DEPTH} levels "
                                 f"in the response ({len(body)} bytes)")


@pytest.mark.parametrize("name", ["machines", "machines_by_id", "taken_hostnames", "power_addresses", "events",
                                  "pools", "version", "whoami", "config", "script", "power_address"])
def test_every_call_refuses_deep_json_as_malformed(name):
    deep = b'{"a": ' * 100 + b"1" + b"}" * 100
    client, _, _ = scripted(*[Response(200, {"Content-Type": "application/json"}, deep)] * 4)
    with pytest.raises(MAASError) as caught:
        CALLS[name][0](client, "abc")
    assert caught.value.kind == "malformed"


def test_a_deep_error_body_is_shown_as_text_not_walked():
    deep = b'{"hostname": ' * 100000 + b'"x"' + b"}" * 100000
    client, _, _ = scripted(Response(400, {"Content-Type": "application/json"}, deep))
    with pytest.raises(MAASError) as caught:
        client.update_machine("abc", hostname="x")
    assert caught.value.status == 400 and str(caught.value).startswith('PUT machines/abc/: 400: {"hostname": ')
    assert len(caught.value.message) == maas.MAX_MESSAGE


def test_deep_json_from_the_double_is_malformed(double):
    double.inject("reply", path=r"^machines/$", status=200, body=b"[" * 3000 + b"]" * 3000)
    with pytest.raises(MAASError) as caught:
        client_for(double).machines()
    assert caught.value.kind == "malformed"


# --- a 403 fails that request; only the key's own checks stop the service ---------------------


@pytest.mark.parametrize("call, line", [
    (lambda c: c.version(), "GET version/"),
    (lambda c: c.whoami(), "GET users/?op=whoami"),
])
def test_a_403_on_the_keys_own_checks_is_an_auth_error(call, line):
    client, _, _ = scripted(Response(403, {"Content-Type": "text/plain"}, b"Forbidden"))
    with pytest.raises(MAASAuthError) as caught:
        call(client)
    assert str(caught.value) == f"{line}: 403: Forbidden (the API key's user is not a MAAS administrator)"


@pytest.mark.parametrize("name", sorted(set(CALLS) - {"version", "whoami"}))
def test_a_403_anywhere_else_fails_that_request_only(name):
    client, transport, _ = scripted(Response(403, {"Content-Type": "text/plain"}, b""))
    with pytest.raises(MAASForbidden) as caught:
        CALLS[name][0](client, "abc")
    assert not isinstance(caught.value, MAASAuthError) and caught.value.status == 403
    assert ": 403: " in str(caught.value) and str(caught.value).endswith(FORBIDDEN)
    assert len(transport.sent) == 1


def test_a_401_anywhere_is_an_auth_error():
    for name in sorted(CALLS):
        client, _, _ = scripted(Response(401, {"Content-Type": "text/plain"}, b"Invalid signature"))
        with pytest.raises(MAASAuthError):
            CALLS[name][0](client, "abc")


def test_require_administrator(double):
    client = client_for(double)
    assert client.require_administrator()["is_superuser"] is True
    double.admin = False
    with pytest.raises(MAASAuthError) as caught:
        client.require_administrator()
    assert str(caught.value) == ("GET users/?op=whoami: not-admin: the API key's user 'admin' is not a MAAS "
                                 "administrator: use an administrator's key (`maas apikey --username ADMIN`)")


# --- where the request went and what to fix ----------------------------------------------------


def test_a_url_without_maas_is_a_404_that_says_maas_url_must_end_in_maas(double):
    url = double.url.replace("/MAAS/", "/")
    client = MAASClient(url, Signer(*double.api_key), retry=RetryPolicy(attempts=1), timeout=2)
    with pytest.raises(MAASError) as caught:
        client.version()
    assert caught.value.status == 404
    assert str(caught.value) == (f"GET version/: 404: Not Found: no MAAS API at {url}: maas.url must end in /MAAS/ "
                                 "(e.g. http://HOST:5240/MAAS/)")


def test_a_404_on_one_machine_is_only_that_it_is_gone(double):
    client = client_for(double)
    with pytest.raises(MAASError) as caught:
        client.call("GET", "machines/abc123/")
    assert caught.value.status == 404 and "no MAAS API" not in str(caught.value)


@pytest.mark.parametrize("url", ["http://admin:hunter2-secret@127.0.0.1:9/MAAS/?token=query-secret#frag-secret",
                                 "http://:only-password-secret@127.0.0.1:9/MAAS/"])
def test_no_credential_of_maas_url_is_in_a_message(url):
    client = MAASClient(url, Signer("consumer-secret", "token-secret", "signature-secret"),
                        retry=RetryPolicy(attempts=1), timeout=1)
    with pytest.raises(MAASError) as caught:
        client.machines()
    message = str(caught.value) + repr(client)
    assert "at http://127.0.0.1:9/MAAS/: nothing listens there" in message
    assert "secret" not in message and "admin" not in message and "frag" not in message


@given(st.sampled_from(["http", "https"]), st.text("abcdefgh:%@", max_size=12), st.text("abc:@%", max_size=12),
       st.sampled_from(["127.0.0.1", "maas.example.com", "[fd00::1]"]), st.sampled_from(["", ":5240"]),
       st.sampled_from(["/MAAS/", "/", ""]))
def test_shown_url_never_keeps_what_comes_before_the_host(scheme, user, password, host, port, path):
    from maas_kubevirt.unreachable import shown_url
    url = f"{scheme}://{user}:{password}@{host}{port}{path}?q=1"
    shown = shown_url(url)
    assert "@" not in shown and "?" not in shown
    assert shown in (f"{scheme}://{host}{port}{path}", "(an unreadable URL)")
