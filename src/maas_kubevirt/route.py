"""``maas-kubevirt check-route VM.NAMESPACE``: the path from this host to one VM's BMC, hop by hop,
sent exactly as MAAS's Redfish driver sends it, before the VM ever boots; no MAAS key needed.

MAAS's driver reaches ``https://<vm>.<ns>.<domain>`` on port 443 with no SNI and no certificate
check (src/provisioningserver/drivers/power/redfish.py: a bare-host address gets ``https://``;
its Twisted agent names no server). kubevirtBMC serves the service root ``/redfish/v1/`` to
anyone (its router leaves it outside the auth middleware), so an unauthenticated GET of it tells
a working route from every way one fails, without a password. Each hop: what was found and, when
it failed, what to do.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import socket
import ssl
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from maas_kubevirt import EXIT_FAILED, EXIT_OK, EXIT_USAGE, identity
from maas_kubevirt.console import JSON, YAML, document, error, table

SERVICE_ROOT = "/redfish/v1/"
HTTPS_PORT = 443
TIMEOUT = 10.0
# What the service root's @odata.type starts with (DMTF Redfish schema ServiceRoot.v1_x_y).
SERVICE_ROOT_TYPE = "#ServiceRoot."

DNS, ADDRESS, TCP, TLS, HTTP, REDFISH = "dns", "address", "tcp", "tls", "http", "redfish"
OK, FAIL, WARN, SKIP = "ok", "fail", "warn", "skip"


@dataclass
class Hop:
    name: str
    status: str
    found: str
    fix: str = ""


@dataclass
class Report:
    host: str
    hops: list[Hop] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(hop.status in (OK, WARN, SKIP) for hop in self.hops) and self.hops[-1].name == REDFISH

    def add(self, name: str, status: str, found: str, fix: str = "") -> bool:
        self.hops.append(Hop(name, status, found, fix))
        return status != FAIL


def system_resolve(host: str) -> list[str]:
    """The IPv4 and IPv6 addresses the system resolver gives for host, as the rack's resolver would."""
    return sorted({info[4][0] for info in socket.getaddrinfo(host, HTTPS_PORT, proto=socket.IPPROTO_TCP)})


def _connect(address: str, port: int, source: str | None, timeout: float) -> socket.socket:
    return socket.create_connection((address, port), timeout=timeout,
                                    source_address=(source, 0) if source else None)


def tls_as_maas(sock: socket.socket) -> ssl.SSLSocket:
    """TLS as MAAS's driver speaks it: no server name (SNI), nothing verified. doctor's Redfish
    probe speaks it too."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context.wrap_socket(sock, server_hostname=None)


def get_over(channel: socket.socket, host: str, path: str, timeout: float,
             headers: dict[str, str] | None = None) -> tuple[int, str]:
    """GET path with Host: host over an established connection, TLS or not: (status, the body's
    first 64 KiB)."""
    connection = http.client.HTTPConnection(host, timeout=timeout)
    connection.sock = channel
    connection.request("GET", path, headers={"Host": host, "Accept": "application/json", **(headers or {})})
    response = connection.getresponse()
    return response.status, response.read(65536).decode("utf-8", "replace")


def _redfish_root(body: str) -> str | None:
    """The service root's Redfish version when body is one, else None."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if isinstance(data, dict) and str(data.get("@odata.type", "")).startswith(SERVICE_ROOT_TYPE):
        return str(data.get("RedfishVersion") or "?")
    return None


def _short(body: str) -> str:
    return " ".join(body.split())[:120] or "(empty)"


def check(host: str, *, expected: str = "", connect: str = "", port: int = HTTPS_PORT, source: str | None = None,
          resolve: Callable[[str], list[str]] = system_resolve, timeout: float = TIMEOUT) -> Report:
    """Every hop from here to host's BMC. expected: the address DNS should give (bmc_proxy.address);
    connect: an address to use in place of DNS's answer (as curl --resolve)."""
    report = Report(host)
    if connect:
        report.add(DNS, SKIP, f"not asked: --address {connect} given")
        addresses = [connect]
    else:
        try:
            addresses = resolve(host)
        except (OSError, UnicodeError) as failure:
            addresses = []
            reason = getattr(failure, "strerror", None) or type(failure).__name__
            report.add(DNS, FAIL, f"{host} does not resolve ({reason})", _dns_fix(host, expected))
            return report
        if not addresses:
            report.add(DNS, FAIL, f"{host}: no address", _dns_fix(host, expected))
            return report
        report.add(DNS, OK, f"{host} -> {', '.join(addresses)}")
    address = addresses[0]
    if expected and not connect:
        if expected in addresses:
            report.add(ADDRESS, OK, f"{address}, the BMC proxy's (bmc_proxy.address)")
        else:
            report.add(ADDRESS, FAIL, f"{', '.join(addresses)}, not the BMC proxy's {expected} (bmc_proxy.address)",
                       _dns_fix(host, expected))
            return report
    else:
        report.add(ADDRESS, OK if connect else WARN, address if connect else
                   f"{address} (bmc_proxy.address is not set: nothing to compare with)")
    began = time.monotonic()
    try:
        sock = _connect(address, port, source, timeout)
    except OSError as failure:
        reason = "no answer" if isinstance(failure, (socket.timeout, TimeoutError)) else \
            (getattr(failure, "strerror", None) or type(failure).__name__)
        report.add(TCP, FAIL, f"{address} port {port}: {reason}",
                   "the BMC proxy's Service must answer on port 443 at that address: `kubectl -n <ingress."
                   "controller_namespace> get service maas-kubevirt-bmc-proxy`; a firewall between this host and "
                   "it must let TCP 443 through")
        return report
    local = sock.getsockname()[0]
    report.add(TCP, OK, f"{address} port {port}, from {local}")
    try:
        tls = tls_as_maas(sock)
    except (OSError, ssl.SSLError) as failure:
        sock.close()
        report.add(TLS, FAIL, f"no TLS handshake without SNI: {failure}",
                   "the BMC proxy must serve TLS to a client that names no server (MAAS's driver sends no SNI): "
                   "a default certificate on its entry point, or the Gateway listener's")
        return report
    try:
        report.add(TLS, OK, f"{tls.version()}, no SNI, certificate not checked (as MAAS)")
        try:
            status, body = get_over(tls, host, SERVICE_ROOT, max(1.0, timeout - (time.monotonic() - began)),
                                    {"User-Agent": "maas-kubevirt check-route"})
        except (OSError, http.client.HTTPException) as failure:
            report.add(HTTP, FAIL, f"no HTTP answer: {getattr(failure, 'strerror', None) or failure}",
                       "the proxy closed the connection: check its log for this host")
            return report
    finally:
        tls.close()
    if status == 403:
        report.add(HTTP, FAIL, f"403 from the proxy: the allowlist refused this host, seen as {local} (unless a "
                   "NAT on the way rewrote it)",
                   f"add {_cidr(local)} (this rack controller) to ingress.source_ranges and apply the bundle again; "
                   "if it is there, the proxy sees another address: its Service needs externalTrafficPolicy: Local")
        return report
    if status == 404:
        report.add(HTTP, FAIL, f"404: the proxy has no route for {host}",
                   "the VM's namespace must be opted in and the VM exist (Kyverno then generates its route): "
                   "`kubectl -n NAMESPACE get httproute,ingress -l app.kubernetes.io/part-of=maas-kubevirt`")
        return report
    version = _redfish_root(body) if status == 200 else None
    report.add(HTTP, OK if status == 200 else FAIL, f"{status}" + ("" if status == 200 else f": {_short(body)}"),
               "" if status == 200 else "the route reaches something that is not the VM's BMC: check which "
               "backend the proxy sends this host to")
    if status != 200:
        return report
    if version is None:
        report.add(REDFISH, FAIL, f"not a Redfish service root: {_short(body)}",
                   "the route's backend is not kubevirtBMC: check the VM's route and its <vm>-virtbmc Service")
    else:
        report.add(REDFISH, OK, f"a Redfish {version} service root: MAAS's driver will reach this BMC")
    return report


def parse_address(text: str) -> tuple[str, int]:
    """``ADDRESS``, ``ADDRESS:PORT`` (IPv4) or ``[IPv6]:PORT`` -> (address, port; 443 when none)."""
    host, port = text, ""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest and not rest.startswith(":"):
            raise ValueError("expected [IPv6]:PORT")
        port = rest[1:]
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
    try:
        address = str(ipaddress.ip_address(host))
    except ValueError:
        raise ValueError("expected an IP address, optionally with :PORT ([IPv6]:PORT)") from None
    if port and not (port.isdigit() and 0 < int(port) < 65536 and port.isascii()):
        raise ValueError(f"expected a port from 1 to 65535, found {port!r}")
    return address, int(port) if port else HTTPS_PORT


def _cidr(address: str) -> str:
    ip = ipaddress.ip_address(address)
    return f"{ip}/{ip.max_prefixlen}"


def _dns_fix(host: str, expected: str) -> str:
    zone = host.split(".", 1)[1]
    target = expected or "the BMC proxy's address (bmc_proxy.address)"
    return (f"point the wildcard record *.{zone} at {target}, resolvable from the MAAS rack controllers "
            "(docs/how-to/dns-tls.md)")


def render_text(report: Report) -> str:
    rows = [(hop.name, hop.status, hop.found, hop.fix) for hop in report.hops]
    return table(("HOP", "STATUS", "FOUND", "FIX"), rows)


def main(values: dict, args: Any) -> int:
    """0 a Redfish service root answered, 1 some hop failed, 2 usage."""
    try:
        vm, namespace = identity.parse_serial(args.serial)
    except identity.IdentityError as failure:
        error(f"check-route: {failure}")
        return EXIT_USAGE
    host = identity.redfish_host(vm, namespace, values["redfish"]["domain"])
    try:
        connect, port = parse_address(args.address) if args.address else ("", HTTPS_PORT)
    except ValueError as failure:
        error(f"check-route: --address {args.address!r}: {failure}")
        return EXIT_USAGE
    report = check(host, expected=values["bmc_proxy"]["address"], connect=connect, port=port, source=args.source)
    if args.output in (JSON, YAML):
        print(document({"host": report.host, "ok": report.ok, "hops": [asdict(hop) for hop in report.hops]},
                       args.output))
    else:
        print(render_text(report))
    return EXIT_OK if report.ok else EXIT_FAILED
