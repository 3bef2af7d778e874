"""The lifecycle the test servers share: one HTTP server on 127.0.0.1, served from a thread."""

from __future__ import annotations

import ssl
import threading
from http.server import ThreadingHTTPServer
from typing import Any


class LoopbackServer:
    """Subclasses build their server in ``start()`` and hand it to ``serve()``."""

    server: ThreadingHTTPServer | None = None

    def start(self) -> Any:
        raise NotImplementedError

    def serve(self, server: ThreadingHTTPServer, name: str) -> threading.Thread:
        server.daemon_threads = True
        self.server = server
        thread = threading.Thread(target=server.serve_forever, args=(0.05,), name=name, daemon=True)
        thread.start()
        return thread

    @staticmethod
    def wrap_tls(server: ThreadingHTTPServer, tls: tuple[str, str], server_names: list) -> None:
        """Serve HTTPS with the (certificate, key) files, appending each client's SNI (or None) to server_names."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*tls)
        context.sni_callback = lambda sock, name, ctx: server_names.append(name)
        server.socket = context.wrap_socket(server.socket, server_side=True)

    def stop(self) -> None:
        if self.server:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self.server is not None, "the server is not started"
        return self.server.server_address[1]
