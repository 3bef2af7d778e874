"""A Redfish responder on loopback that answers like kubevirtBMC behind its Ingress, per Host.

``GET /redfish/v1/Systems/1`` with the right Basic credentials for the request's Host gives
200 and a ComputerSystem; wrong or no credentials 401; an unknown Host 404 (as an Ingress
controller answers for a host it has no rule for). ``delay`` holds every answer back, to
test deadlines. With ``tls=(certfile, keyfile)`` it speaks HTTPS and records the SNI name.
``address`` is where it listens: 127.0.0.1 on a free port unless a test needs a fixed one.
"""

from __future__ import annotations

import base64
import json
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from loopback import LoopbackServer


class RedfishResponder(LoopbackServer):
    def __init__(self, accounts: dict[str, tuple[str, str]] | None = None, *, delay: float = 0.0,
                 tls: tuple[str, str] | None = None, address: tuple[str, int] = ("127.0.0.1", 0)):
        self.address = address
        self.accounts = dict(accounts or {})     # host -> (user, password)
        self.delay = delay
        self.tls = tls
        self.requests: list[dict[str, Any]] = []
        self.server_names: list[str | None] = []

    def start(self) -> "RedfishResponder":
        responder = self

        class Handler(_Handler):
            pass

        Handler.responder = responder
        server = ThreadingHTTPServer(self.address, Handler)
        if self.tls:
            self.wrap_tls(server, self.tls, self.server_names)
        self.serve(server, "redfish-responder")
        return self


class _Handler(BaseHTTPRequestHandler):
    responder: RedfishResponder
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        responder = self.responder
        host = (self.headers.get("Host") or "").rsplit(":", 1)[0]
        auth = self.headers.get("Authorization") or ""
        responder.requests.append({"host": host, "path": self.path, "user_agent": self.headers.get("User-Agent")})
        if responder.delay:
            time.sleep(responder.delay)
        account = responder.accounts.get(host)
        if account is None:
            return self._send(404, {"error": "no such host"})
        if self.path.rstrip("/") == "/redfish/v1":   # kubevirtBMC serves its service root to anyone
            return self._send(200, {"@odata.id": "/redfish/v1", "@odata.type": "#ServiceRoot.v1_16_1.ServiceRoot",
                                    "RedfishVersion": "1.16.1"})
        expected = "Basic " + base64.b64encode(f"{account[0]}:{account[1]}".encode()).decode()
        if auth != expected:
            return self._send(401, {"error": {"code": "Base.1.0.GeneralError", "message": "Unauthorized"}})
        if self.path != "/redfish/v1/Systems/1":
            return self._send(404, {"error": "not found"})
        self._send(200, {"@odata.id": "/redfish/v1/Systems/1", "Id": "1", "PowerState": "Off"})

    def _send(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            pass  # the client gave up (deadline tests)
