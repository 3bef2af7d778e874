"""doctor's network checks: the BMC host names resolve, and Redfish answers MAAS's credentials."""

from __future__ import annotations

import base64
import http.client
import posixpath
import socket
import ssl
import time
from dataclasses import dataclass, field
from typing import Mapping
from urllib.parse import urlsplit

from maas_kubevirt.doctor import FAIL, OK, SKIP, Check, Resolver, _some

REDFISH_DEADLINE = 5.0
# MAAS's Redfish driver reaches a bare-host power address over https on the default port.
HTTPS_PORT = 443


def system_resolve(host: str) -> list[str]:
    """The addresses a host name resolves to, as the system resolver answers (raises OSError)."""
    return sorted({info[4][0] for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)})


def dns_check(hosts: Mapping[str, str], resolve: Resolver, domain: str) -> Check:
    """``<vm>.<ns>.<domain>`` resolves, for one VM per namespace."""
    if not hosts:
        return Check("network.dns", SKIP, "no VM known in MAAS or the cluster yet")
    failed, answered = [], []
    for namespace, host in sorted(hosts.items()):
        try:
            addresses = resolve(host)
        except (OSError, UnicodeError) as error:
            failed.append(f"{host} ({getattr(error, 'strerror', None) or type(error).__name__})")
            continue
        if not addresses:
            failed.append(f"{host} (no address)")
        else:
            answered.append(f"{host} -> {', '.join(addresses[:2])}")
    if failed:
        return Check("network.dns", FAIL, f"does not resolve: {_some(failed)}",
                     f"add a wildcard DNS record *.{domain} for the Ingress controller's address, "
                     "resolvable from the MAAS rack controllers", tuple(failed))
    return Check("network.dns", OK, _some(answered))


@dataclass(frozen=True)
class Credentials:
    """A machine's Redfish power parameters as MAAS holds them; the repr hides the password."""
    system_id: str
    address: str
    user: str
    password: str = field(repr=False)
    node_id: str = "1"


def redfish_url(address: str, node_id: str) -> str:
    """The URL MAAS's Redfish driver asks for (src/provisioningserver/drivers/power/redfish.py:
    ``https://`` prepended when the address contains no "http", then ``redfish/v1/Systems/<id>``
    joined on)."""
    if "http" not in address:
        address = "https://" + address
    return posixpath.join(address, f"redfish/v1/Systems/{node_id or '1'}")


class _HTTPSConnection(http.client.HTTPSConnection):
    """HTTPS to an address already resolved, with the host name as SNI; unverified, as MAAS does."""

    def __init__(self, address: str, port: int, server_name: str, timeout: float):
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        super().__init__(address, port, timeout=timeout, context=context)
        self._server_name = server_name
        self._ssl_context = context

    def connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), self.timeout)
        self.sock = self._ssl_context.wrap_socket(sock, server_hostname=self._server_name)


def redfish_probe(credentials: Credentials, resolve: Resolver, deadline: float = REDFISH_DEADLINE,
                  https_port: int = HTTPS_PORT) -> tuple[int | None, float, str]:
    """GET the Redfish system with MAAS's credentials: (status, seconds, problem).

    https_port: where an address without a port is reached over https (tests point it at a responder).
    """
    url = urlsplit(redfish_url(credentials.address, credentials.node_id))
    host = url.hostname or ""
    port = url.port or (https_port if url.scheme == "https" else 80)
    start = time.monotonic()
    try:
        address = resolve(host)[0]
        remaining = max(0.1, deadline - (time.monotonic() - start))
        if url.scheme == "https":
            connection: http.client.HTTPConnection = _HTTPSConnection(address, port, host, remaining)
        else:
            connection = http.client.HTTPConnection(address, port, timeout=remaining)
        token = base64.b64encode(f"{credentials.user}:{credentials.password}".encode("utf-8")).decode("ascii")
        try:
            connection.request("GET", url.path or "/", headers={
                "Host": url.netloc.rpartition("@")[2], "User-Agent": "MAAS", "Accept": "application/json",
                "Authorization": f"Basic {token}",
            })
            del token
            response = connection.getresponse()
            response.read(65536)
            status = response.status
        finally:
            connection.close()
    except (OSError, http.client.HTTPException, IndexError, ValueError) as error:
        elapsed = time.monotonic() - start
        if isinstance(error, (socket.timeout, TimeoutError)):
            return None, elapsed, f"no answer within {deadline:g} s"
        return None, elapsed, getattr(error, "strerror", None) or type(error).__name__
    elapsed = time.monotonic() - start
    if elapsed > deadline:
        return status, elapsed, f"answered after {elapsed:.1f} s"
    return status, elapsed, ""


def redfish_check(targets: Mapping[str, Credentials], resolve: Resolver,
                  deadline: float = REDFISH_DEADLINE, https_port: int = HTTPS_PORT) -> Check:
    """For one machine per namespace: GET /redfish/v1/Systems/1 with MAAS's credentials is 200 in time."""
    if not targets:
        return Check("network.redfish", SKIP, "no MAAS machine of a KubeVirt VM yet")
    failed, passed = [], []
    for namespace, credentials in sorted(targets.items()):
        status, elapsed, problem = redfish_probe(credentials, resolve, deadline, https_port)
        where = f"{credentials.system_id} {urlsplit(redfish_url(credentials.address, credentials.node_id)).hostname}"
        if problem or status != 200:
            why = problem or (f"HTTP {status}" + (" (MAAS's credentials refused)" if status == 401 else ""))
            failed.append(f"{where}: {why}")
        else:
            passed.append(f"{where}: 200 in {elapsed:.1f} s")
    if failed:
        return Check("network.redfish", FAIL, _some(failed),
                     "from a rack controller: `curl -k -u USER https://VM.NAMESPACE.DOMAIN/redfish/v1/Systems/1`; "
                     "401: run the reconciler (it sets the password); timeouts or 403: the Ingress allowlist "
                     "(ingress.source_ranges) must hold the rack controllers' addresses",
                     tuple(f.split(":", 1)[0] for f in failed))
    return Check("network.redfish", OK, _some(passed))
