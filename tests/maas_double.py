"""A MAAS region API double: a real HTTP server on 127.0.0.1 (ephemeral port, in a thread).

It follows DESIGN.md section 4: the REST API 2.0 paths under /MAAS/api/2.0/, OAuth 1.0
PLAINTEXT checked on every request (401 on a bad signature, a replayed nonce or a wrong token),
the machine status machine (commission only from New, Failed commissioning, Ready, Broken;
otherwise 400 ``{"__all__": [...]}``), unique hostnames (400 ``{"hostname": [...]}``),
resource pools (duplicate name 400), bulk and per-machine power parameters (admin only),
scripts (POST scripts/, GET/PUT scripts/{name}) and version/.

It counts requests and injects faults into the next matching requests: "503" (with
Retry-After), "500", "hang" (past the client's timeout, then the connection is dropped),
"reset" (TCP RST), "malformed" (a truncated JSON body), "race-commission" (someone else
commissions the machine first) and "race-rename" (someone else takes the hostname first).

Run as a program (`python tests/maas_double.py --machines 1000`) it serves until killed and
prints its URL; GET /_double/stats (not counted, no auth) returns the request counts.
"""

from __future__ import annotations

import argparse
import email.parser
import email.policy
import itertools
import json
import random
import re
import socket
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

API_PREFIX = "/MAAS/api/2.0/"
DEFAULT_KEY = ("dblConsumerKey1", "dblTokenKey0001", "dblTokenSecretXyZ9876543210")

STATUS = {
    "New": 0, "Commissioning": 1, "Failed commissioning": 2, "Missing": 3, "Ready": 4,
    "Reserved": 5, "Deployed": 6, "Retired": 7, "Broken": 8, "Deploying": 9, "Allocated": 10,
    "Failed deployment": 11, "Releasing": 12, "Failed releasing": 13, "Disk erasing": 14,
    "Failed disk erasing": 15, "Rescue mode": 16, "Entering rescue mode": 17,
    "Failed to enter rescue mode": 18, "Exiting rescue mode": 19, "Failed to exit rescue mode": 20,
    "Testing": 21, "Failed testing": 22,
}
COMMISSION_FROM = ("New", "Failed commissioning", "Ready", "Broken")
NOT_AVAILABLE = "Commission is not available because of the current state of the node."
_HOSTNAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z", re.IGNORECASE)
_POOL = re.compile(r"^\w[ \w-]*\Z")


@dataclass
class Fault:
    kind: str
    method: str | None = None
    path: str | None = None          # regex searched in the path (after /MAAS/api/2.0/) + "?" + query
    count: int = 1
    retry_after: str | None = "1"
    hang: float = 3.0


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    fields: dict[str, str] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)

    @property
    def op(self) -> str | None:
        return (self.query.get("op") or [None])[0]


class MaasDouble:
    def __init__(self, api_key: tuple[str, str, str] = DEFAULT_KEY, version: str = "3.5.4",
                 admin: bool = True, auto_advance: bool = False, seed: int = 0):
        self.api_key = api_key
        self.version = version
        self.admin = admin
        self.auto_advance = auto_advance
        self.lock = threading.RLock()
        self.machines: dict[str, dict] = {}
        self._hostnames: dict[str, str] = {}   # lower-cased hostname -> system_id (an index)
        self.power: dict[str, dict] = {}
        self.pools: dict[str, dict] = {"default": {"id": 0, "name": "default",
                                                   "description": "Default pool"}}
        self.scripts: dict[str, dict] = {}
        self.faults: list[Fault] = []
        self.log: list[tuple[str, str, str | None]] = []
        self.counts: Counter = Counter()
        self.nonces: set[str] = set()
        self.writes: list[tuple[str, str, dict]] = []   # (method, system_id or path, fields)
        self._ids = itertools.count(1)
        self._pool_ids = itertools.count(1)
        self._random = random.Random(seed)
        self.server: ThreadingHTTPServer | None = None
        self.thread: threading.Thread | None = None

    # --- lifecycle -------------------------------------------------------------------------
    def start(self, port: int = 0) -> "MaasDouble":
        double = self

        class Handler(_Handler):
            pass

        Handler.double = double
        self.server = _QuietServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), name="maas-double", daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        if self.server:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def __enter__(self) -> "MaasDouble":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/MAAS/"

    @property
    def api_key_text(self) -> str:
        return ":".join(self.api_key)

    # --- inventory -------------------------------------------------------------------------
    def new_system_id(self) -> str:
        return "%06x" % (0xA00000 + next(self._ids))

    def add_pool(self, name: str, description: str = "") -> dict:
        with self.lock:
            pool = {"id": next(self._pool_ids), "name": name, "description": description}
            self.pools[name] = pool
            return pool

    def add_machine(self, hostname: str | None = None, *, power_type: str = "ipmi",
                    power_address: str | None = None, power_pass: str | None = None,
                    status: str = "New", pool: str = "default", tag_names: list[str] | None = None,
                    power_user: str = "maas", system_id: str | None = None) -> str:
        with self.lock:
            system_id = system_id or self.new_system_id()
            if hostname is None:
                hostname = f"{self._random.choice(_ADJ)}-{self._random.choice(_NOUN)}-{system_id}"
            if pool not in self.pools:
                self.add_pool(pool)
            self.machines[system_id] = {
                "system_id": system_id,
                "hostname": hostname,
                "fqdn": f"{hostname}.maas",
                "domain": {"id": 0, "name": "maas"},
                "status": STATUS[status],
                "status_name": status,
                "status_message": "",
                "power_type": power_type,
                "power_state": "off",
                "pool": None,  # filled by _pool_ref
                "zone": {"id": 1, "name": "default"},
                "tag_names": list(tag_names or []),
                "architecture": "amd64/generic",
                "cpu_count": 2,
                "memory": 4096,
                "osystem": "",
                "distro_series": "",
                "hardware_uuid": None,
                "resource_uri": f"/MAAS/api/2.0/machines/{system_id}/",
            }
            self._set_pool(system_id, pool)
            self._hostnames[hostname.lower()] = system_id
            params: dict[str, str] = {}
            if power_type == "redfish":
                params = {"power_address": power_address or "", "power_user": power_user,
                          "power_pass": power_pass or "", "node_id": "1"}
            elif power_type == "ipmi":
                params = {"power_address": power_address or "10.9.0.1", "power_user": "ADMIN",
                          "power_pass": power_pass or "", "power_driver": "LAN_2_0",
                          "power_boot_type": "auto", "cipher_suite_id": "3",
                          "privilege_level": "ADMIN", "k_g": "", "mac_address": "",
                          "workaround_flags": ["opensesspriv"]}
            elif power_address is not None:
                params = {"power_address": power_address, "power_pass": power_pass or ""}
            self.power[system_id] = params
            return system_id

    def add_vm(self, vm: str, namespace: str, domain: str = "bmc.example.com", *,
               scheme: str = "https", password: str | None = None, **kw: Any) -> str:
        address = f"{scheme}://{vm}.{namespace}.{domain}/redfish/v1/Systems/1" if scheme else \
            f"{vm}.{namespace}.{domain}"
        return self.add_machine(kw.pop("hostname", None), power_type="redfish", power_address=address,
                                power_pass=password or f"pw-{vm}-{namespace}-S3CRET", **kw)

    def _set_pool(self, system_id: str, name: str) -> None:
        pool = self.pools[name]
        self.machines[system_id]["pool"] = {
            "id": pool["id"], "name": pool["name"], "description": pool["description"],
            "resource_uri": f"/MAAS/api/2.0/resourcepool/{pool['id']}/",
        }

    def set_status(self, system_id: str, status: str) -> None:
        with self.lock:
            machine = self.machines[system_id]
            machine["status_name"] = status
            machine["status"] = STATUS[status]

    def advance(self) -> int:
        """Commissioning machines finish: Ready. Returns how many moved."""
        with self.lock:
            moved = 0
            for machine in self.machines.values():
                if machine["status_name"] == "Commissioning":
                    machine["status_name"], machine["status"] = "Ready", STATUS["Ready"]
                    machine["power_state"] = "off"
                    moved += 1
            return moved

    def hostname_holder(self, hostname: str) -> str | None:
        system_id = self._hostnames.get(hostname.lower())
        machine = self.machines.get(system_id) if system_id else None
        if machine is not None and machine["hostname"].lower() == hostname.lower():
            return system_id
        return None

    def passwords(self) -> list[str]:
        return [p["power_pass"] for p in self.power.values() if p.get("power_pass")]

    # --- faults and counts -----------------------------------------------------------------
    def inject(self, kind: str, *, method: str | None = None, path: str | None = None,
               count: int = 1, retry_after: str | None = "1", hang: float = 3.0) -> None:
        with self.lock:
            self.faults.append(Fault(kind, method, path, count, retry_after, hang))

    def clear_faults(self) -> None:
        with self.lock:
            self.faults.clear()

    def reset_counts(self) -> None:
        with self.lock:
            self.log.clear()
            self.counts.clear()

    @property
    def request_count(self) -> int:
        return sum(self.counts.values())

    def _take_fault(self, request: Request, target: str) -> Fault | None:
        with self.lock:
            for fault in self.faults:
                if fault.method and fault.method != request.method:
                    continue
                if fault.path and not re.search(fault.path, target):
                    continue
                if fault.kind == "race-commission" and request.op != "commission":
                    continue
                if fault.kind == "race-rename" and not (request.method == "PUT" and "hostname" in request.fields):
                    continue
                fault.count -= 1
                if fault.count <= 0:
                    self.faults.remove(fault)
                return fault
        return None

    # --- auth ------------------------------------------------------------------------------
    def check_auth(self, header: str | None) -> str | None:
        """None when the PLAINTEXT signature is right, else why not."""
        if not header or not header.startswith("OAuth "):
            return "Authorization header missing"
        params = {}
        for part in header[6:].split(","):
            key, _, value = part.strip().partition("=")
            params[key] = unquote(value.strip('"'))
        consumer, token, secret = self.api_key
        if params.get("oauth_signature_method") != "PLAINTEXT":
            return "expected oauth_signature_method PLAINTEXT"
        if params.get("oauth_consumer_key") != consumer or params.get("oauth_token") != token:
            return "Invalid consumer or access token"
        if params.get("oauth_signature") != f"&{secret}":
            return "Invalid signature"
        nonce, timestamp = params.get("oauth_nonce"), params.get("oauth_timestamp", "")
        if not nonce or not timestamp.isdigit() or abs(int(timestamp) - time.time()) > 300:
            return "Missing or stale nonce or timestamp"
        with self.lock:
            if nonce in self.nonces:
                return "Nonce already used"
            self.nonces.add(nonce)
        return None

    # --- the API ---------------------------------------------------------------------------
    def handle(self, request: Request) -> tuple[int, Any, dict[str, str]]:
        """(status, body: JSON-able or bytes/str, headers)."""
        path, method, op = request.path, request.method, request.op
        with self.lock:
            if path == "version/" and method == "GET":
                return 200, {"capabilities": ["networks-management", "static-ipaddresses"],
                             "version": self.version, "subversion": ""}, {}
            if path == "machines/":
                if method == "GET" and op == "power_parameters":
                    if not self.admin:
                        return 403, "You do not have permission to view power parameters.", {}
                    ids = request.query.get("id")
                    chosen = ids if ids is not None else list(self.machines)
                    return 200, {sid: self.power[sid] for sid in chosen if sid in self.machines}, {}
                if method == "GET" and op is None:
                    if self.auto_advance:
                        self.advance()
                    return 200, self._list_machines(request.query), {}
                return 400, f"Unrecognised signature: method={method} op={op}", {}
            match = re.fullmatch(r"machines/([^/]+)/", path)
            if match:
                return self._machine(request, match[1])
            if path == "resourcepools/":
                if method == "GET":
                    return 200, [self._pool_json(p) for p in self.pools.values()], {}
                if method == "POST":
                    name = request.fields.get("name", "")
                    if not name or not _POOL.match(name):
                        return 400, {"name": ["This field is required." if not name else
                                              "Enter a valid value."]}, {}
                    if name in self.pools:
                        return 400, {"name": ["Resource pool with this Name already exists."]}, {}
                    pool = self.add_pool(name, request.fields.get("description", ""))
                    self.writes.append(("POST", "resourcepools/", dict(request.fields)))
                    return 200, self._pool_json(pool), {}
            if path == "scripts/" and method == "POST":
                return self._script_write(request, None)
            match = re.fullmatch(r"scripts/([^/]+)", path)
            if match:
                name = match[1]
                if name not in self.scripts:
                    return 404, "No Script matches the given query.", {}
                if method == "GET":
                    return 200, {k: v for k, v in self.scripts[name].items() if k != "script"}, {}
                if method == "PUT":
                    return self._script_write(request, name)
            return 404, "Unknown API endpoint", {}

    def _list_machines(self, query: dict[str, list[str]]) -> list[dict]:
        machines = list(self.machines.values())
        if "id" in query:
            machines = [m for m in machines if m["system_id"] in query["id"]]
        if "hostname" in query:
            machines = [m for m in machines if m["hostname"] in query["hostname"]]
        if "status" in query:
            wanted = {s.lower().replace("_", " ") for s in query["status"]}
            machines = [m for m in machines if m["status_name"].lower() in wanted]
        if "pool" in query:
            machines = [m for m in machines if m["pool"]["name"] in query["pool"]]
        return machines

    def _pool_json(self, pool: dict) -> dict:
        members = [m for m in self.machines.values() if m["pool"]["id"] == pool["id"]]
        return {**pool, "machine_total_count": len(members),
                "machine_ready_count": sum(m["status_name"] == "Ready" for m in members),
                "resource_uri": f"/MAAS/api/2.0/resourcepool/{pool['id']}/"}

    def _machine(self, request: Request, system_id: str) -> tuple[int, Any, dict[str, str]]:
        machine = self.machines.get(system_id)
        if machine is None:
            return 404, "No Machine matches the given query.", {}
        method, op = request.method, request.op
        if method == "GET" and op == "power_parameters":
            if not self.admin:
                return 403, "You do not have permission to view power parameters.", {}
            return 200, self.power[system_id], {}
        if method == "GET" and op is None:
            return 200, machine, {}
        if method == "PUT" and op is None:
            errors: dict[str, list[str]] = {}
            hostname = request.fields.get("hostname")
            pool = request.fields.get("pool")
            if hostname is not None:
                holder = self.hostname_holder(hostname)
                if not _HOSTNAME.match(hostname):
                    errors["hostname"] = [f"Invalid hostname: {hostname}"]
                elif holder is not None and holder != system_id:
                    errors["hostname"] = ["Node with this Hostname already exists."]
            if pool is not None and pool not in self.pools:
                errors["pool"] = ["Select a valid choice. That choice is not one of the available choices."]
            if errors:
                return 400, errors, {}
            if hostname is not None:
                self._hostnames.pop(machine["hostname"].lower(), None)
                self._hostnames[hostname.lower()] = system_id
                machine["hostname"], machine["fqdn"] = hostname, f"{hostname}.maas"
            if pool is not None:
                self._set_pool(system_id, pool)
            self.writes.append(("PUT", system_id, dict(request.fields)))
            return 200, machine, {}
        if method == "POST" and op == "commission":
            if machine["status_name"] not in COMMISSION_FROM:
                return 400, {"__all__": [NOT_AVAILABLE]}, {}
            machine["status_name"], machine["status"] = "Commissioning", STATUS["Commissioning"]
            machine["power_state"] = "on"
            self.writes.append(("POST", system_id, {"op": "commission"}))
            return 200, machine, {}
        return 400, f"Unrecognised signature: method={method} op={op}", {}

    def _script_write(self, request: Request, name: str | None) -> tuple[int, Any, dict[str, str]]:
        content = request.files.get("script")
        new_name = request.fields.get("name") or name
        if content is None and len(request.files) == 1:
            new_name, content = next(iter(request.files.items()))
        if name is None:
            if not new_name:
                return 400, {"name": ["This field is required."]}, {}
            if new_name in self.scripts:
                return 400, {"name": ["Script with this Name already exists."]}, {}
            if content is None:
                return 400, {"script": ["This field is required."]}, {}
            self.scripts[new_name] = {"id": len(self.scripts) + 1, "name": new_name, "script": content,
                                      "history": [{"comment": request.fields.get("comment", "")}]}
            self.writes.append(("POST", "scripts/", {"name": new_name}))
            return 200, {k: v for k, v in self.scripts[new_name].items() if k != "script"}, {}
        script = self.scripts[name]
        if content is not None:
            script["script"] = content
        script["history"].append({"comment": request.fields.get("comment", "")})
        self.writes.append(("PUT", f"scripts/{name}", {}))
        return 200, {k: v for k, v in script.items() if k != "script"}, {}


_ADJ = ["able", "brave", "calm", "eager", "fair", "gentle", "happy", "jolly", "keen", "lively"]
_NOUN = ["ant", "bee", "cat", "dog", "eel", "fox", "gnu", "hen", "ibis", "jay"]


def _parse_body(content_type: str, body: bytes) -> tuple[dict[str, str], dict[str, bytes]]:
    fields: dict[str, str] = {}
    files: dict[str, bytes] = {}
    if not body:
        return fields, files
    if content_type.startswith("multipart/form-data"):
        message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
            b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body
        )
        for part in message.iter_parts():
            name = part.get_param("name", header="content-disposition")
            payload = part.get_payload(decode=True) or b""
            if part.get_param("filename", header="content-disposition") is not None:
                files[name] = payload
            else:
                fields[name] = payload.decode("utf-8")
    elif content_type.startswith("application/x-www-form-urlencoded"):
        for key, values in parse_qs(body.decode("utf-8"), keep_blank_values=True).items():
            fields[key] = values[-1]
    return fields, files


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # injected resets and client timeouts end connections abruptly


class _Handler(BaseHTTPRequestHandler):
    double: MaasDouble
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are separate writes: no 40 ms stalls
    server_version = "maas-double/1.0"

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        if isinstance(body, (dict, list)):
            data, ctype = json.dumps(body).encode(), "application/json"
        elif isinstance(body, bytes):
            data, ctype = body, "application/json"
        else:
            data, ctype = str(body).encode(), "text/plain; charset=utf-8"
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _serve(self, method: str) -> None:
        double = self.double
        split = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if split.path.startswith("/_double/"):
            with double.lock:
                stats = {"requests": double.request_count, "counts": {f"{m} {p}": n for (m, p), n in double.counts.items()}}
            self._send(200, stats)
            return
        if not split.path.startswith(API_PREFIX):
            self._send(404, "Not Found")
            return
        path = split.path[len(API_PREFIX):]
        query = parse_qs(split.query, keep_blank_values=True)
        fields, files = _parse_body(self.headers.get("Content-Type", ""), body)
        request = Request(method, path, query, fields, files)
        op = request.op
        with double.lock:
            double.log.append((method, path, op))
            double.counts[(method, _shape(path) + (f"?op={op}" if op else ""))] += 1
        fault = double._take_fault(request, path + ("?" + split.query if split.query else ""))
        if fault and fault.kind in ("503", "500", "hang", "reset"):
            return self._fault(fault)
        problem = double.check_auth(self.headers.get("Authorization"))
        if problem and not (path == "version/" and self.headers.get("Authorization") is None):
            self._send(401, problem)
            return
        if fault and fault.kind == "race-commission":
            match = re.fullmatch(r"machines/([^/]+)/", path)
            if match and match[1] in double.machines:
                double.set_status(match[1], "Commissioning")
        if fault and fault.kind == "race-rename":
            wanted = fields.get("hostname")
            if wanted and double.hostname_holder(wanted) is None:
                double.add_machine(wanted, power_type="manual", status="Ready")
        status, payload, headers = double.handle(request)
        if fault and fault.kind == "malformed":
            data = json.dumps(payload).encode() if isinstance(payload, (dict, list)) else str(payload).encode()
            self._send(200, data[: max(1, len(data) * 2 // 3)] + b"\x00{", {})
            return
        self._send(status, payload, headers)

    def _fault(self, fault: Fault) -> None:
        if fault.kind == "503":
            headers = {"Retry-After": fault.retry_after} if fault.retry_after is not None else {}
            self._send(503, "Unable to connect to any rack controller; please try again later.", headers)
        elif fault.kind == "500":
            self._send(500, "<html><head><title>Internal Server Error</title></head><body>boom</body></html>")
        elif fault.kind == "hang":
            time.sleep(fault.hang)
            self.close_connection = True
        elif fault.kind == "reset":
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.connection.close()


def _shape(path: str) -> str:
    return re.sub(r"^machines/[^/]+/", "machines/{id}/", path)


def populate(double: MaasDouble, machines: int, vm_fraction: float = 0.1, namespaces: int = 10,
             domain: str = "bmc.example.com", new: bool = True) -> list[str]:
    """A fleet: vm_fraction of it KubeVirt VMs in New (default pool), the rest IPMI servers."""
    vms = int(machines * vm_fraction)
    rng = random.Random(42)
    statuses = ["Deployed", "Ready", "Deployed", "Allocated", "Broken", "New"]
    vm_ids = []
    for i in range(machines - vms):
        double.add_machine(power_type="ipmi", power_address=f"10.{i // 65536}.{i // 256 % 256}.{i % 256}",
                           power_pass=f"ipmi-S3CRET-{i}", status=rng.choice(statuses))
    for i in range(vms):
        vm_ids.append(double.add_vm(f"vm{i}", f"ns{i % namespaces}", domain,
                                    status="New" if new else "Ready"))
    return vm_ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--machines", type=int, default=100)
    parser.add_argument("--vm-fraction", type=float, default=0.1)
    parser.add_argument("--auto-advance", action="store_true")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    double = MaasDouble(auto_advance=args.auto_advance)
    populate(double, args.machines, args.vm_fraction)
    double.start(args.port)
    print(double.url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
