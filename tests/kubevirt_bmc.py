"""kubevirtBMC's Redfish service as MAAS reaches it through the BMC Ingress: HTTPS on 127.0.0.1,
one VM per Host ``<vm>.<ns>.<domain>``, each with its own power state, started in the test process.
With ``tls=None`` and a listening socket given to ``start`` it is kubevirtBMC itself, behind a real
proxy: plain HTTP on its own port (10080), as the traffic tier runs it on a test host
(tests/gateway_api.py); the proxy passes the VM's Host on.

Every behaviour cites kubevirtBMC v0.7.0 (github.com/starbops/kubevirtbmc, tag v0.7.0, whose pkg/
files are unchanged up to its default branch); its pkg/redfish/api_service.go is read from the
2024-11 and the later kubevirtbmc/kubevirtbmc versions, which agree on the status codes used
here (Reset 204/400/500, PATCH 204 once implemented). ``start_time`` is how long a VM
takes from ``On`` to ready, the one thing a cluster decides (the VMI's scheduling, image pull and
boot); a VM that was never powered on is Off.

Behind kubevirtBMC, KubeVirt is modelled, not run: the VM's runStrategy (the only thing kubevirtBMC
writes for power), its instance's phase, and what KubeVirt v1.7.0's VM controller does with them
(``VM.settle``). ``guest_power_off(host)`` is a guest that shuts itself down, as MAAS's enlistment
and commissioning end: its instance turns Succeeded, the runStrategy is kept. Whether the cluster
then runs the bundle's guest power-off rule is ``guest_power_off_rule`` (default True, as the
bundle installs it); ``halts_on_guest_power_off`` is that rule's decision, the one the
control-plane tier checks against the real Kyverno.
"""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from loopback import LoopbackServer

from maas_kubevirt import identity

SYSTEM = "/redfish/v1/Systems/1"
# The ResetType values the generated server accepts (ResourceResetType.IsValid, from the Redfish
# schema in pkg/generated/redfish/api/openapi.yaml): anything else is 400.
RESET_TYPES = ("On", "ForceOff", "GracefulShutdown", "GracefulRestart", "ForceRestart", "Nmi", "ForceOn",
               "PushPowerButton", "PowerCycle", "Suspend", "Pause", "Resume", "FullPowerCycle")


RERUN, HALTED = "RerunOnFailure", "Halted"


def halts_on_guest_power_off(strategy: str, old_phase: str, new_phase: str, *, start_requested: bool = False,
                             deleting: bool = False, opted_in: bool = True) -> bool:
    """The guest power-off rule (templates/policy-guest-power-off.yaml.j2): does this update of a VM's
    instance set the VM's runStrategy to Halted?"""
    return (opted_in and new_phase == "Succeeded" and old_phase != "Succeeded" and not deleting
            and strategy == RERUN and not start_requested)


@dataclass
class VM:
    """One VirtualMachine as kubevirtBMC sees it, and KubeVirt's part in it: its runStrategy, the
    strategy KubeVirt last acted on, its instance's phase, readiness and boot device."""

    host: str
    strategy: str = HALTED                # spec.runStrategy
    observed: str = ""                    # status.runStrategy (set once the VM has had an instance)
    instance: str | None = None           # its VMI's phase; None: no VMI
    ready_at: float | None = None         # when vm.status.ready becomes true
    boot: tuple[str, str] = ("Disabled", "Hdd")  # NewComputerSystem's Boot (computersystem_resource.go)

    @property
    def running(self) -> bool:
        """spec.runStrategy asks for an instance (kubevirtBMC's On was the last power write)."""
        return self.strategy != HALTED

    def ready(self, now: float) -> bool:
        return self.instance == "Running" and self.ready_at is not None and now >= self.ready_at

    def settle(self, now: float, start_time: float) -> None:
        """KubeVirt v1.7.0's VM controller on this VM (syncRunStrategy and updateStatus in
        pkg/virt-controller/watch/vm/vm.go), for the two strategies kubevirtBMC writes."""
        if self.strategy == HALTED or self.instance == "Succeeded":
            # Halted: no instance. RerunOnFailure: an instance that ended Succeeded is deleted and
            # not replaced ("If a VMI enters the Succeeded phase, it should not be restarted").
            self.instance, self.ready_at = None, None
        elif self.instance is None and self.observed != self.strategy:
            # RerunOnFailure with no instance starts one only when coming from another strategy.
            self.instance, self.ready_at = "Running", now + start_time
        if self.observed or self.instance is not None:
            self.observed = self.strategy


@dataclass
class Seen:
    """One request as the BMC saw it (never its credentials)."""

    host: str
    method: str
    path: str
    status: int
    body: dict | None = None
    power_state: str | None = None       # what a GET of the system answered
    at: float = field(default_factory=time.monotonic)

    @property
    def action(self) -> str:
        """GET (with the PowerState answered), PATCH Boot <Enabled> <Target>, or Reset <ResetType>."""
        if self.method == "PATCH":
            boot = (self.body or {}).get("Boot") or {}
            return f"PATCH Boot {boot.get('BootSourceOverrideEnabled')} {boot.get('BootSourceOverrideTarget')}"
        if self.method == "POST" and self.path.endswith("/Actions/ComputerSystem.Reset"):
            return f"Reset {(self.body or {}).get('ResetType')}"
        return f"{self.method} {self.power_state or self.status}"


class KubevirtBMC(LoopbackServer):
    """The Redfish side of kubevirtBMC for every VM under ``domain``; ``seed`` gives each VM's Secret."""

    def __init__(self, domain: str, tls: tuple[str, str] | None, *, seed: str | None = None, start_time: float = 0.0,
                 clock: Callable[[], float] = time.monotonic):
        self.domain = domain
        self.tls = tls
        self.seed = seed
        self.start_time = start_time
        self.clock = clock
        self.vms: dict[str, VM] = {}
        self.guest_power_off_rule = True
        self.requests: list[Seen] = []
        self.server_names: list[str | None] = []
        self.lock = threading.Lock()

    def start(self, listening: socket.socket | None = None) -> "KubevirtBMC":
        """Serve on a new socket of 127.0.0.1, or on ``listening`` (bound and listening already)."""
        bmc = self

        class Handler(_Handler):
            pass

        Handler.bmc = bmc
        if listening is None:
            server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        else:
            server = ThreadingHTTPServer(listening.getsockname(), Handler, bind_and_activate=False)
            server.socket.close()
            server.socket = listening
        if self.tls:
            self.wrap_tls(server, self.tls, self.server_names)
        self.serve(server, "kubevirt-bmc")
        return self

    # --- what the tests read ----------------------------------------------------------------

    def seen(self, host: str) -> list[Seen]:
        with self.lock:
            return [seen for seen in self.requests if seen.host == host]

    def vm(self, host: str) -> VM:
        with self.lock:
            return self.vms.setdefault(host, VM(host))

    # --- kubevirtBMC ------------------------------------------------------------------------

    def credentials(self, host: str) -> tuple[str, str] | None:
        """The VM's ``<vm>-bmc`` Secret (username, password) as the bundle's Kyverno rule writes it,
        for a host ``<vm>.<ns>.<domain>``; None for any other host: the Ingress has no rule for it."""
        parsed = identity.parse_redfish_address(host, self.domain)
        if parsed is None or not self.seed:
            return None
        serial = identity.format_serial(*parsed)
        return identity.bmc_user(self.seed, serial), identity.bmc_password(self.seed, serial)

    def power_state(self, vm: VM) -> str:
        # VirtualMachineResourceManager.GetComputerSystem: PowerState On iff vm.status.ready, read
        # at each GET (pkg/resourcemanager/virtualmachine_resourcemanager.go).
        return "On" if vm.ready(self.clock()) else "Off"

    def set_run_strategy(self, host: str, strategy: str) -> None:
        """A person's `kubectl patch` of the VM's runStrategy (the tutorial's first start); KubeVirt acts."""
        with self.lock:
            vm = self.vms.setdefault(host, VM(host))
            vm.strategy = strategy
            vm.settle(self.clock(), self.start_time)

    def guest_power_off(self, host: str) -> None:
        """The guest shuts itself down (cloud-init's power_state poweroff): virt-handler writes its
        instance's phase Succeeded; the runStrategy stays. Then the rule, if the cluster runs it."""
        with self.lock:
            vm = self.vms.setdefault(host, VM(host))
            if vm.instance is None:
                raise ValueError(f"{host} has no running guest to power off")
            old_phase, vm.instance, vm.ready_at = vm.instance, "Succeeded", None
            if self.guest_power_off_rule and halts_on_guest_power_off(vm.strategy, old_phase, "Succeeded"):
                vm.strategy = HALTED
            vm.settle(self.clock(), self.start_time)

    def reset(self, vm: VM, reset_type: str) -> str | None:
        """handler.ComputerSystemReset (pkg/redfish/handler.go): the error text, or None."""
        if reset_type == "On":
            # PowerOn: runStrategy RerunOnFailure, whatever it was; KubeVirt acts on it (settle).
            vm.strategy = RERUN
        elif reset_type in ("ForceOff", "GracefulShutdown"):
            # PowerOff: runStrategy Halted, a graceful stop (its grace period taken as 0 here).
            vm.strategy = HALTED
        elif reset_type in ("GracefulRestart", "ForceRestart"):
            # PowerCycle: the VMI is deleted. KubeVirt brings no new one up for RerunOnFailure (settle).
            if vm.instance is None:
                return f'virtualmachineinstances.kubevirt.io "{vm.host.split(".")[0]}" not found'
            vm.instance, vm.ready_at = None, None
        else:
            return f"unsupported reset type: {reset_type}"
        vm.settle(self.clock(), self.start_time)
        return None

    def patch_boot(self, vm: VM, boot: dict) -> None:
        # handler.PatchComputerSystem: unless Disabled, Pxe or Hdd becomes the boot device, and
        # SetBootDevice makes it lasting (interfaces[0] or disks[0] bootOrder 1) and shows it as
        # Continuous (SetBootOverride): "Once" is not kept. Other targets are ignored.
        if boot.get("BootSourceOverrideEnabled") != "Disabled" and boot.get("BootSourceOverrideTarget") in ("Pxe", "Hdd"):
            vm.boot = ("Continuous", boot["BootSourceOverrideTarget"])

    def computer_system(self, vm: VM) -> dict:
        # NewComputerSystem (pkg/resourcemanager/computersystem_resource.go), the fields MAAS and
        # a reader use; no @odata.etag, so MAAS's PATCH carries no If-Match.
        namespace_name = "/".join(reversed(vm.host.split(".")[:2]))
        enabled, target = vm.boot
        return {
            "@odata.context": "/redfish/v1/$metadata#ComputerSystem.ComputerSystem",
            "@odata.id": SYSTEM, "@odata.type": "#ComputerSystem.v1_22_0.ComputerSystem",
            "Id": "1", "Name": namespace_name, "Description": "Computer System",
            "Manufacturer": "KubeVirt", "Model": "KubeVirt", "SystemType": "Virtual",
            "PowerState": self.power_state(vm),
            "Boot": {"BootSourceOverrideEnabled": enabled, "BootSourceOverrideMode": "Legacy",
                     "BootSourceOverrideTarget": target},
            "Actions": {"#ComputerSystem.Reset": {"target": SYSTEM + "/Actions/ComputerSystem.Reset",
                                                  "title": "Reset"}},
            "Links": {"ManagedBy": [{"@odata.id": "/redfish/v1/Managers/BMC"}]},
        }


SYSTEMS_COLLECTION = {
    # handler.GetComputerSystemCollection: the one system, 1.
    "@odata.context": "/redfish/v1/$metadata#ComputerSystemCollection.ComputerSystemCollection",
    "@odata.id": "/redfish/v1/Systems", "@odata.type": "#ComputerSystemCollection.ComputerSystemCollection",
    "Name": "Computer System Collection", "Members": [{"@odata.id": SYSTEM}],
}
SERVICE_ROOT = {"@odata.id": "/redfish/v1", "@odata.type": "#ServiceRoot.v1_16_1.ServiceRoot",
                "RedfishVersion": "1.16.1", "Systems": {"@odata.id": "/redfish/v1/Systems"}}


class _Handler(BaseHTTPRequestHandler):
    bmc: KubevirtBMC
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._serve("GET")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_POST(self) -> None:
        self._serve("POST")

    def _serve(self, method: str) -> None:
        bmc = self.bmc
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        host = (self.headers.get("Host") or "").rsplit(":", 1)[0].lower()
        path = self.path.split("?", 1)[0]
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        seen = Seen(host, method, path, 0, body if isinstance(body, dict) else None, at=bmc.clock())
        with bmc.lock:
            status, answer, headers = self._answer(bmc, seen, host, method, path, raw, body)
            seen.status = status
            bmc.requests.append(seen)
        self._send(status, answer, headers)

    def _answer(self, bmc: KubevirtBMC, seen: Seen, host: str, method: str, path: str, raw: bytes,
                body: Any) -> tuple[int, Any, dict]:
        account = bmc.credentials(host)
        if account is None:
            return 404, "default backend - 404", {}  # an Ingress with no rule for this host
        if method == "GET" and path.rstrip("/") == "/redfish/v1":
            return 200, SERVICE_ROOT, {}  # NewRouter: the service root is outside the auth middleware
        # session.AuthMiddleware (pkg/session/token.go): Basic credentials equal to the Secret's
        # (BMC_USERNAME, BMC_PASSWORD: cmd/virtbmc/main.go), or 401; no session tokens exist here.
        expected = "Basic " + base64.b64encode(f"{account[0]}:{account[1]}".encode()).decode()
        if self.headers.get("Authorization") != expected:
            return 401, "Unauthorized\n", {"WWW-Authenticate": 'Basic realm="Redfish"'}
        vm = bmc.vms.setdefault(host, VM(host))
        parts = path.rstrip("/").split("/")
        # The router's /redfish/v1/Systems/{ComputerSystemId}: the handlers ignore the id.
        if parts[:4] != ["", "redfish", "v1", "Systems"]:
            return 404, "404 page not found\n", {}
        if len(parts) == 4:
            return (200, SYSTEMS_COLLECTION, {}) if method == "GET" else (405, "", {})
        if len(parts) == 5:
            if method == "GET":
                system = bmc.computer_system(vm)
                seen.power_state = system["PowerState"]
                return 200, system, {}
            if method == "PATCH":
                if not isinstance(body, dict):
                    return 400, {"error": {"message": "the body is not JSON"}}, {}
                bmc.patch_boot(vm, body.get("Boot") or {})
                return 204, None, {}  # RedfishV1SystemsComputerSystemIdPatch (pkg/redfish/api_service.go)
            return 405, "", {}
        if parts[5:] == ["Actions", "ComputerSystem.Reset"] and method == "POST":
            # RedfishV1SystemsComputerSystemIdActionsComputerSystemResetPost: 400 for a value the
            # schema lacks, 500 with the handler's error, else 204.
            reset_type = body.get("ResetType") if isinstance(body, dict) else None
            if reset_type not in RESET_TYPES:
                return 400, _error("Base.1.2.PropertyValueNotInList",
                                   f"The value {reset_type} for the property ResetType is not in the list of "
                                   "acceptable values."), {}
            failed = bmc.reset(vm, reset_type)
            if failed:
                return 500, _error("Base.1.2.GeneralError", failed), {}
            return 204, None, {}
        return 404, "404 page not found\n", {}

    def _send(self, status: int, answer: Any, headers: dict) -> None:
        if isinstance(answer, (dict, list)):
            data, kind = json.dumps(answer).encode() + b"\n", "application/json; charset=UTF-8"
        else:
            data, kind = (answer or "").encode(), "text/plain; charset=utf-8"
        try:
            self.send_response(status)
            self.send_header("Content-Type", kind if status != 204 else "application/json; charset=UTF-8")
            for name, value in headers.items():
                self.send_header(name, value)
            if status != 204:
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if status != 204:
                self.wfile.write(data)
        except OSError:
            pass  # the client went away


def _error(message_id: str, message: str) -> dict:
    return {"error": {"@Message.ExtendedInfo": [{"MessageId": message_id, "Message": message}]}}
