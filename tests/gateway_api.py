"""What the traffic tier (tests/test_traffic_tier.py) runs besides the control plane: a real proxy,
a test host for the BMC, certificates, and clients that show what crossed the wire.

- `Traefik`: the binary `tools/build-traefik` builds (TRAEFIK), out of cluster, as a process, in
  two roles. `bmc_proxy_traefik`: the BMC proxy exactly as the rendered bmc-proxy.yaml deploys it
  (its Deployment's args, its ConfigMap as the file provider's file), with its own ServiceAccount's
  token, each entry point on a free port of 127.0.0.1. `tenant_traefik`: the tenants' own proxy, as
  a shared cluster runs one, with the admin kubeconfig and three providers (Gateway API for every
  Traefik class, the CRD provider, the NGINX provider for class nginx) on one HTTPS entry point.
- `TestHost`: a network namespace with a veth pair to this one, on a /30 of 198.51.100.0/24
  (TEST-NET-2) that nothing on this machine uses. The API server refuses loopback addresses in an
  EndpointSlice, so the BMC lives there, at a real address the proxy reaches through the veth.
  `listen(port)` makes a listening socket inside it (from a thread that enters the namespace:
  setns moves only the calling thread), so the BMC stand-in still runs in the test process.
- `bmc_backend(...)`: what kubevirtBMC and Kubernetes would make for one VM's BMC: a pod labelled
  `kubevirt.io/virtualmachinebmc-name` (never scheduled; its status.podIPs patched to the test
  host's address, as a kubelet would report it), Service `<vm>-virtbmc` (port 80 `redfish` to
  10080) selecting it, and the EndpointSlice the endpoint-slice controller would write, written as
  that controller (kubectl --as system:serviceaccount:kube-system:endpointslice-controller).
- `HelloRelay`: a TCP relay on 127.0.0.1 in front of the proxy that reads each connection's TLS
  ClientHello and records its server_name extension (None when there is none), then passes the
  bytes through untouched: how the tier shows that MAAS's driver sends no SNI.
- `https(...)`: one HTTPS request to the proxy from a chosen source address, with or without SNI,
  returning the status, the body and the certificate the proxy served.

The CRDs come from tools/build-traefik's crds/ (installed by tests/controlplane.py before Kyverno
starts): Gateway API's at the version Traefik serves (v1.4.0), Traefik's own, and Envoy Gateway's
SecurityPolicy, taken from github.com/envoyproxy/gateway's module; the envoy-gateway allowlist is
rendered and admitted there, not traffic-proven (no Envoy runs here).
"""

from __future__ import annotations

import base64
import ctypes
import hashlib
import http.client
import ipaddress
import json
import os
import re
import secrets
import socket
import ssl
import subprocess
import threading
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from controlplane import ControlPlane, free_port, stop_process_group, wait_for

TEST_NET = ipaddress.ip_network("198.51.100.0/24")
BMC_PORT = 10080                      # kubevirtBMC's Redfish, plain HTTP (TLS is the proxy's)
BMC_LABEL = "kubevirt.io/virtualmachinebmc-name"
ENDPOINTSLICE_CONTROLLER = "system:serviceaccount:kube-system:endpointslice-controller"
GATEWAY_CONTROLLER = "traefik.io/gateway-controller"
NGINX_CONTROLLER = "k8s.io/ingress-nginx"
CLONE_NEWNET = 0x40000000


def _run(*args: str) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


# --- the test host ---------------------------------------------------------------------------


def _used_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network this machine has an address or a route in (`ip -4 addr`, `ip -4 route`)."""
    found = []
    text = _run("ip", "-4", "-o", "addr", "show") + _run("ip", "-4", "route", "show", "table", "all")
    for match in re.finditer(r"\b(\d+\.\d+\.\d+\.\d+(?:/\d+)?)\b", text):
        try:
            found.append(ipaddress.ip_network(match.group(1), strict=False))
        except ValueError:
            pass
    return found


@dataclass
class TestHost:
    """A network namespace reached from here through a veth pair; see the module docstring."""

    __test__ = False  # not a pytest class

    name: str = field(default_factory=lambda: f"mkt-{os.getpid()}-{secrets.token_hex(2)}")
    address: str = ""     # the test host's own address (the BMC pod's IP)
    gateway: str = ""     # this side's address on the veth
    outer: str = ""       # the veth's name on this side

    def start(self) -> "TestHost":
        used = _used_networks()
        free = next((net for net in TEST_NET.subnets(new_prefix=30)
                     if not any(net.overlaps(other) for other in used if other.prefixlen > 0)), None)
        if free is None:
            raise RuntimeError(f"no free /30 in {TEST_NET}: every one overlaps an address or route of this machine")
        near, far = list(free.hosts())
        self.gateway, self.address = str(near), str(far)
        tag = self.name.rsplit("-", 1)[-1]
        self.outer, inner = f"mkt{tag}o", f"mkt{tag}i"
        _run("ip", "netns", "add", self.name)
        try:
            _run("ip", "link", "add", self.outer, "type", "veth", "peer", "name", inner)
            _run("ip", "link", "set", inner, "netns", self.name)
            _run("ip", "addr", "add", f"{near}/30", "dev", self.outer)
            _run("ip", "link", "set", self.outer, "up")
            _run("ip", "-n", self.name, "addr", "add", f"{far}/30", "dev", inner)
            _run("ip", "-n", self.name, "link", "set", inner, "up")
            _run("ip", "-n", self.name, "link", "set", "lo", "up")
            route = _run("ip", "route", "get", self.address)
            if f"dev {self.outer} " not in route + " ":
                raise RuntimeError(f"{self.address} is not routed through {self.outer}: {route.strip()}")
        except BaseException:
            self.stop()
            raise
        return self

    def listen(self, port: int) -> socket.socket:
        """A TCP socket listening on the test host's address, made inside its namespace."""
        made: dict = {}

        def inside() -> None:
            try:
                libc = ctypes.CDLL("libc.so.6", use_errno=True)
                with open(f"/run/netns/{self.name}", "rb") as handle:
                    if libc.setns(handle.fileno(), CLONE_NEWNET) != 0:
                        raise OSError(ctypes.get_errno(), "setns into the test host's network namespace")
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((self.address, port))
                sock.listen(16)
                made["socket"] = sock
            except BaseException as error:  # reported in the caller's thread
                made["error"] = error

        # The thread ends in the test host's namespace; it is never reused (a thread of its own).
        thread = threading.Thread(target=inside, name=f"{self.name}-listen")
        thread.start()
        thread.join()
        if "error" in made:
            raise made["error"]
        return made["socket"]

    def stop(self) -> None:
        if self.outer:
            subprocess.run(["ip", "link", "del", self.outer], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, check=False)


# --- certificates ----------------------------------------------------------------------------


def certificate(directory: Path, name: str, dns: str) -> tuple[Path, Path]:
    """A self-signed certificate whose subjectAltName is DNS:<dns> (Traefik picks a certificate by
    matching the client's SNI against its certificates' names), and its key."""
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "2", "-subj", f"/CN={dns}", "-addext", f"subjectAltName=DNS:{dns}",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


def der_of(cert: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(cert.read_text())


def tls_secret(name: str, namespace: str, cert: Path, key: Path) -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": name, "namespace": namespace},
            "data": {"tls.crt": base64.b64encode(cert.read_bytes()).decode(),
                     "tls.key": base64.b64encode(key.read_bytes()).decode()}}


# --- the proxy -------------------------------------------------------------------------------


@dataclass
class Traefik:
    """One Traefik process out of cluster: its command line, its entry points' ports, its log."""

    binary: Path
    kubeconfig: Path
    work: Path
    name: str
    args: list = field(default_factory=list)
    ports: dict = field(default_factory=dict)
    process: subprocess.Popen | None = None

    @property
    def log(self) -> Path:
        return self.work / f"{self.name}.log"

    def start(self) -> "Traefik":
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen([str(self.binary), *self.args], stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=env, cwd=self.work, start_new_session=True)

        def pings() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited {self.process.returncode}:\n{self.log_tail(30)}")
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ports['ping']}/ping", timeout=2) as answer:
                return answer.status == 200

        wait_for(pings, 60, f"{self.name} to answer /ping")
        return self

    def stop(self) -> None:
        if self.process is not None:
            stop_process_group(self.process)

    def log_tail(self, lines: int = 40) -> str:
        if not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def tenant_traefik(binary: Path, kubeconfig: Path, work: Path) -> Traefik:
    """The tenants' own Traefik, as a shared cluster runs one: the Gateway provider for every class of
    Traefik's (``traefik`` among them), its CRD provider, and its NGINX provider (class ``nginx``);
    one HTTPS entry point, ``web``, the default one. Whatever tenants publish lands here."""
    ports = {"web": free_port(), "ping": free_port()}
    args = ["--global.checkNewVersion=false", "--global.sendAnonymousUsage=false", "--log.level=INFO",
            "--ping.entryPoint=ping", f"--entryPoints.ping.address=127.0.0.1:{ports['ping']}",
            f"--entryPoints.web.address=127.0.0.1:{ports['web']}", "--entryPoints.web.asDefault=true",
            "--entryPoints.web.http.tls=true",
            "--providers.kubernetesGateway=true", "--providers.kubernetesGateway.statusAddress.ip=127.0.0.1",
            "--providers.kubernetesCRD=true", "--providers.kubernetesIngressNGINX=true"]
    return Traefik(binary, kubeconfig, work, "tenant-traefik", args, ports)


def bmc_proxy_traefik(binary: Path, kubeconfig: Path, work: Path, rendered: Path, name: str) -> Traefik:
    """The BMC proxy exactly as bmc-proxy.yaml deploys it (its container's args, its ConfigMap as the
    file provider's file), out of cluster: each entry point's address becomes a free port of
    127.0.0.1, the file provider reads the ConfigMap's data from ``work``, and the Gateway's status
    address is 127.0.0.1 rather than the Service's load balancer's (there is none). Nothing else changes."""
    from maas_kubevirt import bmc_proxy

    documents = [doc for doc in yaml.safe_load_all(rendered.read_text()) if doc]
    [deployment] = [doc for doc in documents if doc["kind"] == "Deployment"]
    [config] = [doc for doc in documents if doc["kind"] == "ConfigMap"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    dynamic = work / f"{name}-{bmc_proxy.DYNAMIC_FILE}"
    dynamic.write_text(config["data"][bmc_proxy.DYNAMIC_FILE])
    ports = {"bmc": free_port(), "ping": free_port()}
    replaced = {f"--entryPoints.{bmc_proxy.ENTRY_POINT}.address": f"127.0.0.1:{ports['bmc']}",
                f"--entryPoints.{bmc_proxy.PING_ENTRY_POINT}.address": f"127.0.0.1:{ports['ping']}",
                "--providers.file.filename": str(dynamic)}
    args = []
    for arg in container["args"]:
        option = arg.split("=", 1)[0]
        if option.startswith("--providers.kubernetesGateway.statusAddress."):
            # The proxy's Service has no load balancer here: the Gateway's status gets this address.
            option, arg = "--providers.kubernetesGateway.statusAddress.ip", "--providers.kubernetesGateway.statusAddress.ip=127.0.0.1"
            if arg in args:
                continue
        args.append(f"{option}={replaced[option]}" if option in replaced else arg)
    assert all(f"{option}=" in " ".join(container["args"]) for option in replaced), container["args"]
    return Traefik(binary, kubeconfig, work, name, args, ports)


def gateway_class(name: str) -> dict:
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
            "metadata": {"name": name}, "spec": {"controllerName": GATEWAY_CONTROLLER}}


def ingress_class(name: str) -> dict:
    return {"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass",
            "metadata": {"name": name}, "spec": {"controller": NGINX_CONTROLLER}}


def bmc_gateway(example: Path, namespace: str, name: str, class_name: str, port: int,
                listeners: dict[str, str]) -> dict:
    """The site's BMC Gateway as examples/bmc-gateway.yaml gives it, for these namespaces: one HTTPS
    listener per opted-in namespace (hostname *.<ns>.<domain>, its certificate <ns>-tls beside the
    Gateway), each admitting routes from its own namespace only. ``port`` stands for the entry
    point's 8443 (Traefik attaches a listener to the entry point of its port). ``listeners``:
    namespace -> hostname."""
    gateway = yaml.safe_load(example.read_text())
    [template] = gateway["spec"]["listeners"]
    gateway["metadata"] = {"name": name, "namespace": namespace}
    gateway["spec"]["gatewayClassName"] = class_name
    listed = []
    for ns, hostname in listeners.items():
        listener = json.loads(json.dumps(template))
        listener.update(name=ns, hostname=hostname, port=port)
        listener["tls"]["certificateRefs"] = [{"group": "", "kind": "Secret", "name": f"{ns}-tls"}]
        listener["allowedRoutes"]["namespaces"]["selector"]["matchLabels"] = {"kubernetes.io/metadata.name": ns}
        listed.append(listener)
    gateway["spec"]["listeners"] = listed
    return gateway


# --- one VM's BMC backend --------------------------------------------------------------------


def bmc_backend(cp: ControlPlane, vm: str, namespace: str, address: str) -> None:
    """The pod, Service and EndpointSlice behind <vm>-virtbmc, as the module docstring says."""
    backend(cp, f"{vm}-virtbmc", namespace, address, BMC_PORT, {BMC_LABEL: vm}, f"virtbmc-{vm}")


def backend(cp: ControlPlane, service: str, namespace: str, address: str, port: int, labels: dict, pod: str) -> None:
    """A never-scheduled pod at ``address`` (its status patched as a kubelet would report it), a
    Service (port 80 to ``port``) selecting it, and the EndpointSlice the endpoint-slice controller
    would write, written as that controller."""
    cp.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod, "namespace": namespace, "labels": labels},
        "spec": {"automountServiceAccountToken": False,
                 "containers": [{"name": "server", "image": "server.invalid/never-pulled:test",
                                 "ports": [{"name": "http", "containerPort": port}]}]},
    }))
    cp.kubectl("patch", "pod", pod, "-n", namespace, "--subresource=status", "--type=merge", "-p", json.dumps(
        {"status": {"podIP": address, "podIPs": [{"ip": address}]}}))
    uid = cp.get("pod", pod, namespace)["metadata"]["uid"]
    cp.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": service, "namespace": namespace},
        "spec": {"selector": labels,
                 "ports": [{"name": "redfish", "port": 80, "targetPort": port, "protocol": "TCP"}]},
    }))
    cp.kubectl("create", "--as", ENDPOINTSLICE_CONTROLLER, "--as-group", "system:serviceaccounts",
               "-f", "-", input=json.dumps({
                   "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                   "metadata": {"name": f"{service}-{secrets.token_hex(3)}", "namespace": namespace,
                                "labels": {"kubernetes.io/service-name": service,
                                           "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
                   "addressType": "IPv4",
                   "endpoints": [{"addresses": [address],
                                  "conditions": {"ready": True, "serving": True, "terminating": False},
                                  "targetRef": {"kind": "Pod", "name": pod, "namespace": namespace, "uid": uid}}],
                   "ports": [{"name": "redfish", "port": port, "protocol": "TCP"}],
               }))


# --- clients ---------------------------------------------------------------------------------


@dataclass
class Answer:
    status: int
    body: str
    certificate: bytes     # DER of the certificate the proxy served


def https(port: int, host: str, path: str = "/redfish/v1/Systems/1", *, method: str = "GET",
          auth: tuple[str, str] | None = None, source: str = "127.0.0.1", sni: str | None = None,
          body: dict | None = None, timeout: float = 10) -> Answer:
    """One HTTPS request to 127.0.0.1:port from ``source``, Host ``host``, SNI ``sni`` (None: no
    server_name extension, as MAAS's driver sends), verifying nothing (as MAAS's driver)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    raw = socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(source, 0))
    with context.wrap_socket(raw, server_hostname=sni) as tls:
        served = tls.getpeercert(binary_form=True) or b""
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        connection.sock = tls
        headers = {"Host": host, "User-Agent": "maas-kubevirt-traffic-tier", "Accept": "application/json"}
        if auth:
            headers["Authorization"] = "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        connection.request(method, path, body=data, headers=headers)
        response = connection.getresponse()
        text = response.read().decode(errors="replace")
        return Answer(response.status, text, served)


def fingerprint(der: bytes) -> str:
    return hashlib.sha256(der).hexdigest()[:16]


class HelloRelay:
    """127.0.0.1:<port> -> 127.0.0.1:<target>, recording each connection's first TLS record: whether
    it is a ClientHello and the server_name it carries (None for none)."""

    def __init__(self, target: int):
        self.target = target
        self.hellos: list[dict] = []
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.running = True
        threading.Thread(target=self._accept, name="hello-relay", daemon=True).start()

    def stop(self) -> None:
        self.running = False
        self.sock.close()

    def _accept(self) -> None:
        while self.running:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        try:
            first = _read_record(client)
            self.hellos.append(client_hello(first))
            upstream = socket.create_connection(("127.0.0.1", self.target), timeout=30)
        except OSError:
            client.close()
            return
        upstream.sendall(first)

        def pump(source: socket.socket, sink: socket.socket) -> None:
            try:
                while data := source.recv(65536):
                    sink.sendall(data)
            except OSError:
                pass
            finally:
                for end in (source, sink):
                    try:
                        end.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

        back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
        back.start()
        pump(client, upstream)
        back.join(30)
        client.close()
        upstream.close()


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise OSError("the client closed before its first TLS record was complete")
        data += chunk
    return data


def _read_record(sock: socket.socket) -> bytes:
    header = _read_exactly(sock, 5)
    return header + _read_exactly(sock, int.from_bytes(header[3:5], "big"))


def client_hello(record: bytes) -> dict:
    """{"tls": is a TLS handshake record holding a ClientHello, "server_name": SNI or None}
    (RFC 8446 4.1.2 ClientHello, RFC 6066 3 server_name)."""
    if len(record) < 9 or record[0] != 22 or record[5] != 1:
        return {"tls": False, "server_name": None}
    body = record[9:]
    at = 2 + 32                                    # legacy_version, random
    at += 1 + body[at]                             # legacy_session_id
    at += 2 + int.from_bytes(body[at:at + 2], "big")  # cipher_suites
    at += 1 + body[at]                             # legacy_compression_methods
    if at + 2 > len(body):
        return {"tls": True, "server_name": None}
    end = at + 2 + int.from_bytes(body[at:at + 2], "big")
    at += 2
    while at + 4 <= min(end, len(body)):
        kind, size = int.from_bytes(body[at:at + 2], "big"), int.from_bytes(body[at + 2:at + 4], "big")
        data = body[at + 4:at + 4 + size]
        if kind == 0 and len(data) >= 5:           # server_name: list length, type host_name (0), name
            length = int.from_bytes(data[3:5], "big")
            return {"tls": True, "server_name": data[5:5 + length].decode("ascii", "replace")}
        at += 4 + size
    return {"tls": True, "server_name": None}


def run_power(region_python: Path, script: Path, command: str, address: str, user: str, password: str,
              domain: str, port: int, timeout: float = 120) -> subprocess.CompletedProcess:
    """tools/maas-region/power.py with the region's Python: MAAS's Redfish driver, the password on stdin."""
    return subprocess.run([str(region_python), str(script), command, "--address", address, "--user", user,
                           "--domain", domain, "--port", str(port)],
                          input=password + "\n", capture_output=True, text=True, timeout=timeout,
                          env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8",
                               "HOME": os.environ.get("HOME", "/tmp")})
