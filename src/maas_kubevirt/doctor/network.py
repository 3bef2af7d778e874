"""doctor's network checks: the Ingress allowlist holds only a few hosts, the BMC host names
resolve, and Redfish answers MAAS's credentials."""

from __future__ import annotations

import base64
import http.client
import ipaddress
import posixpath
import socket
import time
from dataclasses import dataclass, field
from typing import Iterable, Mapping
from urllib.parse import urlsplit

from maas_kubevirt import route
from maas_kubevirt.doctor import FAIL, OK, SKIP, WARN, Check, Resolver, _some

REDFISH_DEADLINE = 5.0
# MAAS's Redfish driver reaches a bare-host power address over https on the default port.
HTTPS_PORT = 443


# A BMC password is worth something only from inside ingress.source_ranges, so those should
# hold the MAAS rack controllers and nothing else. A site has one to a few rack controllers,
# each one address (or one per IP version): 16 addresses leave room for several racks,
# dual-stack, as 16 /32s or one /28, while anything wider is a subnet in which other hosts
# (PXE-booting machines, tenants' VMs) could use a leaked password.
MAX_ALLOWED_ADDRESSES = 16


def allowed_addresses(ranges: Iterable[str]) -> tuple[int, list[str]]:
    """(how many addresses the ranges admit together, overlaps counted once; the items that are
    not a CIDR). A host bit set is read as its network, as the Ingress controller reads it."""
    networks: dict[int, list] = {4: [], 6: []}
    unparsed = []
    for item in ranges:
        try:
            network = ipaddress.ip_network(str(item).strip(), strict=False)
        except ValueError:
            unparsed.append(str(item))
            continue
        networks[network.version].append(network)
    total = sum(n.num_addresses for nets in networks.values() for n in ipaddress.collapse_addresses(nets))
    return total, unparsed


def _how_many(count: int) -> str:
    """A count of addresses as a person reads it: 2^64 rather than twenty digits."""
    if count >= 2 ** 32 and count & (count - 1) == 0:
        return f"2^{count.bit_length() - 1}"
    return f"about 2^{count.bit_length() - 1}" if count > 2 ** 32 else f"{count:,}"


def _version(cidr: str) -> str:
    return f"IPv{ipaddress.ip_network(cidr.strip(), strict=False).version}"


def source_ranges_check(ranges: Iterable[str], apply: str, rack_controllers: int | None = None) -> Check:
    """ingress.source_ranges admits at most MAX_ALLOWED_ADDRESSES addresses: the rack controllers.

    rack_controllers: how many MAAS lists, when it was asked (the row then says how many
    addresses that leaves each one)."""
    ranges = [str(item) for item in ranges]
    total, unparsed = allowed_addresses(ranges)
    shown = _some(ranges)
    per_rack = "; MAAS lists no rack controller" if rack_controllers == 0 else ""
    if rack_controllers:
        per_rack = f"; MAAS lists {rack_controllers} rack controller(s): {_how_many(-(-total // rack_controllers))} " \
                   "address(es) allowed per rack controller"
    whole = [r for r in ranges if r not in unparsed and ipaddress.ip_network(r.strip(), strict=False).prefixlen == 0]
    fix = ("list only the MAAS rack controllers' addresses in ingress.source_ranges, each as /32 (IPv4) or /128 "
           "(IPv6), e.g. `source_ranges: [10.0.0.5/32, 10.0.0.6/32]` (MAAS lists its rack controllers and their "
           f"addresses: `maas $PROFILE rack-controllers read`, or GET /MAAS/api/2.0/rackcontrollers/), then {apply}")
    if whole:
        return Check("ingress.source_ranges", WARN,
                     f"{_some(whole)}: every {' and '.join(sorted({_version(r) for r in whole}))} address may reach "
                     "the BMCs, so anyone who learns a BMC password can use it" + per_rack, fix, tuple(whole))
    if unparsed:
        return Check("ingress.source_ranges", WARN, f"not a CIDR: {_some(unparsed)}", fix, tuple(unparsed))
    if total > MAX_ALLOWED_ADDRESSES:
        return Check("ingress.source_ranges", WARN,
                     f"{shown}: {_how_many(total)} addresses may reach the BMCs (more than {MAX_ALLOWED_ADDRESSES}: "
                     "a BMC password is worth something from anywhere in them)" + per_rack, fix, tuple(ranges))
    return Check("ingress.source_ranges", OK, f"{shown}: {total} address(es) may reach the BMCs" + per_rack)


# The addresses a host name resolves to, as the system resolver answers: check-route's lookup.
system_resolve = route.system_resolve


def dns_check(hosts: Mapping[str, str], resolve: Resolver, domain: str) -> Check:
    """``<vm>.<ns>.<domain>`` resolves, for one VM per namespace."""
    if not hosts:
        return Check("network.dns", SKIP, "no VM known in MAAS or the cluster yet")
    failed, answered, unresolved = [], [], []
    for namespace, host in sorted(hosts.items()):
        try:
            addresses = resolve(host)
        except (OSError, UnicodeError) as error:
            failed.append(f"{host} ({getattr(error, 'strerror', None) or type(error).__name__})")
            unresolved.append(namespace)
            continue
        if not addresses:
            failed.append(f"{host} (no address)")
            unresolved.append(namespace)
        else:
            answered.append(f"{host} -> {', '.join(addresses[:2])}")
    if failed:
        # docs/how-to/dns-tls.md "DNS": one wildcard record per opted-in namespace, or a delegation.
        records = ", ".join(f"*.{namespace}.{domain}" for namespace in unresolved)
        return Check("network.dns", FAIL, f"does not resolve: {_some(failed)}",
                     f"add the wildcard DNS record {records} for the Ingress controller's address (one per "
                     f"opted-in namespace), or delegate {domain} to a server that answers for it, resolvable "
                     "from the MAAS rack controllers", tuple(failed))
    return Check("network.dns", OK, _some(answered))


def route_check(hosts: Mapping[str, str], expected: str, resolve: Resolver, https_port: int = HTTPS_PORT) -> Check:
    """For one VM per namespace, the route as MAAS's driver takes it (check-route): DNS, the proxy's
    address, TLS without SNI, a Redfish service root without credentials. Needs no MAAS key, and
    works for a VM that never booted."""
    if not hosts:
        return Check("network.route", SKIP, "no VM known in MAAS or the cluster yet")
    failed, passed = [], []
    for namespace, host in sorted(hosts.items()):
        report = route.check(host, expected=expected, port=https_port, resolve=resolve, timeout=REDFISH_DEADLINE)
        if report.ok:
            passed.append(f"{host}: {report.hops[-1].found}")
        else:
            hop = next(h for h in report.hops if h.status == route.FAIL)
            failed.append((f"{host}: {hop.name}: {hop.found}", hop.fix, host))
    if failed:
        return Check("network.route", FAIL, _some([found for found, _, _ in failed]),
                     f"{failed[0][1]}; each hop: `maas-kubevirt check-route VM.NAMESPACE` on a rack controller",
                     tuple(host for _, _, host in failed))
    return Check("network.route", OK, _some(passed))


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
        token = base64.b64encode(f"{credentials.user}:{credentials.password}".encode("utf-8")).decode("ascii")
        headers = {"User-Agent": "MAAS", "Authorization": f"Basic {token}"}
        del token
        channel = socket.create_connection((address, port), timeout=remaining)
        try:
            if url.scheme == "https":   # as MAAS's driver and check-route: no SNI, nothing verified
                channel = route.tls_as_maas(channel)
            status, _ = route.get_over(channel, url.netloc.rpartition("@")[2], url.path or "/", remaining, headers)
        finally:
            channel.close()
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
