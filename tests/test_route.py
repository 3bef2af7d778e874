"""check-route against a TLS responder on loopback: each hop's verdict, sent as MAAS's driver sends
(no SNI), and the --address parser (hypothesis). The real proxy: test_traffic_tier.py."""

from __future__ import annotations

import http.server
import ipaddress
import json
import ssl
import threading

import pytest
from hypothesis import given, strategies as st

from conftest import require
from maas_kubevirt import route

HOST = "web1.tenant-a.bmc.example.com"
ROOT = {"@odata.id": "/redfish/v1", "@odata.type": "#ServiceRoot.v1_16_1.ServiceRoot", "RedfishVersion": "1.16.1"}


class Responder:
    """HTTPS on 127.0.0.1 answering GET /redfish/v1/ with (status, body); records each SNI it saw."""

    def __init__(self, tmp_path, status=200, body=ROOT):
        from gateway_api import certificate

        cert, key = certificate(tmp_path, "responder", HOST)
        self.status, self.body, self.sni = status, body, []
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        context.sni_callback = lambda sock, name, ctx: self.sni.append(name)
        responder = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                data = json.dumps(responder.body).encode() if isinstance(responder.body, dict) else responder.body
                self.send_response(responder.status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def responder(tmp_path):
    require("openssl", "makes the responder's certificate")
    made = []

    def make(**kwargs):
        made.append(Responder(tmp_path, **kwargs))
        return made[-1]

    yield make
    for one in made:
        one.close()


def hops(report):
    return [(hop.name, hop.status) for hop in report.hops]


def test_a_working_route_reaches_a_service_root_without_sni(responder):
    served = responder()
    report = route.check(HOST, expected="127.0.0.1", port=served.port, resolve=lambda host: ["127.0.0.1"])
    assert report.ok and hops(report) == [("dns", "ok"), ("address", "ok"), ("tcp", "ok"), ("tls", "ok"),
                                          ("http", "ok"), ("redfish", "ok")]
    assert served.sni == [None], "MAAS's driver names no server: neither may the check"
    assert "1.16.1" in report.hops[-1].found


def test_a_name_that_does_not_resolve_says_which_record_to_add():
    def nowhere(host):
        raise OSError(-2, "Name or service not known")

    report = route.check(HOST, expected="10.0.0.40", resolve=nowhere)
    assert not report.ok and hops(report) == [("dns", "fail")]
    assert "*.tenant-a.bmc.example.com" in report.hops[0].fix and "10.0.0.40" in report.hops[0].fix


def test_a_wrong_dns_answer_stops_before_any_connection(responder):
    served = responder()
    report = route.check(HOST, expected="10.0.0.40", port=served.port, resolve=lambda host: ["127.0.0.1"])
    assert hops(report) == [("dns", "ok"), ("address", "fail")] and served.sni == []


def test_the_allowlists_403_names_the_address_the_proxy_saw(responder):
    served = responder(status=403, body=b"Forbidden")
    report = route.check(HOST, connect="127.0.0.1", port=served.port)
    assert hops(report)[-1] == ("http", "fail")
    assert "127.0.0.1" in report.hops[-1].found and "127.0.0.1/32" in report.hops[-1].fix


def test_no_route_for_the_host_is_a_404(responder):
    served = responder(status=404, body=b"404 page not found")
    report = route.check(HOST, connect="127.0.0.1", port=served.port)
    assert hops(report)[-1] == ("http", "fail") and "no route" in report.hops[-1].found


def test_something_that_is_not_a_bmc_is_said_so(responder):
    served = responder(body={"hello": "world"})
    report = route.check(HOST, connect="127.0.0.1", port=served.port)
    assert hops(report)[-1] == ("redfish", "fail") and not report.ok


def test_a_closed_port_and_a_plain_http_server_fail_at_their_hop():
    import socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
    report = route.check(HOST, connect="127.0.0.1", port=port, timeout=2)
    assert hops(report)[-1] == ("tcp", "fail")
    plain = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=plain.serve_forever, daemon=True).start()
    try:
        report = route.check(HOST, connect="127.0.0.1", port=plain.server_address[1], timeout=5)
    finally:
        plain.shutdown()
        plain.server_close()
    assert hops(report)[-1] == ("tls", "fail")


@given(st.ip_addresses(), st.one_of(st.none(), st.integers(1, 65535)))
def test_an_address_with_or_without_a_port_is_parsed(address, port):
    text = str(address) if port is None else (f"[{address}]:{port}" if address.version == 6 else f"{address}:{port}")
    assert route.parse_address(text) == (str(address), port or 443)


@given(st.text(max_size=30))
def test_anything_else_is_refused_with_what_is_expected(text):
    try:
        address, port = route.parse_address(text)
    except ValueError as failure:
        assert "expected" in str(failure)
    else:
        assert ipaddress.ip_address(address) and 0 < port < 65536


@pytest.mark.parametrize("output", ["json", "yaml"])
def test_the_report_as_json_or_yaml_is_one_document(responder, capsys, output):
    """-o json|yaml as the other commands print them: the host, ok, and every hop."""
    import argparse
    import yaml

    from maas_kubevirt.values import load_values

    served = responder()
    values = load_values(None)
    args = argparse.Namespace(serial="web1.tenant-a", address=f"127.0.0.1:{served.port}", source=None, output=output)
    assert route.main(values, args) == 0
    printed = capsys.readouterr().out
    found = json.loads(printed) if output == "json" else yaml.safe_load(printed)
    assert found["ok"] and found["host"] == "web1.tenant-a." + values["redfish"]["domain"]
    assert [hop["name"] for hop in found["hops"]] == ["dns", "address", "tcp", "tls", "http", "redfish"]
