"""One HTTP request over requests, its body capped, and why a connection failed."""

from __future__ import annotations

import http.cookiejar
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import requests
import requests.adapters

from maas_kubevirt import unreachable
from maas_kubevirt.unreachable import causes as _causes

# A response body larger than this is refused. A real MAAS machine object is tens of KB, so
# 10,000 machines make a list of several hundred MB: the default (maas.max_response_mib) is
# 1 GiB.
DEFAULT_MAX_RESPONSE = 1024 * 1024 * 1024
# Connections to MAAS kept open for reuse: one per thread sending at once. The reconciler sends
# from at most maas.concurrency threads (64 at most, values.py); requests' default pool keeps
# 10 and closes any more after each request.
CONNECTIONS = 64


# Told of every request when it ends: (method, url, status or None, TransportError.kind or None,
# seconds). The metrics register one (metrics.Metrics.maas_request), so this package needs no
# metrics library. The URL may name a system_id: an observer keeps only what it needs of it.
Observer = Callable[[str, str, "int | None", "str | None", float], None]


@dataclass
class Response:
    status: int
    headers: Mapping[str, str]
    body: bytes


class TransportError(Exception):
    """No response: ``kind`` is "connection" or "timeout"; the message names no secret.

    ``sent`` is False only when the request certainly never left (no connection was made).
    """

    def __init__(self, kind: str, message: str, sent: bool = True):
        super().__init__(message)
        self.kind = kind
        self.sent = sent


class Transport:
    """One HTTP request over a requests Session (keep-alive), TLS verified by default.

    The body is read in chunks and refused past ``max_body`` bytes (counted after decoding, so
    a compressed answer cannot grow past the cap either). Several threads may send at once.
    """

    def __init__(self, verify: bool | str = True, max_body: int = DEFAULT_MAX_RESPONSE):
        self.verify = verify
        self.max_body = max_body
        self.session = self._session()
        self.observer: Observer | None = None

    @staticmethod
    def _session() -> requests.Session:
        """One Session for every thread, not one per thread: each attempt runs in a thread of its
        own (MAASClient._send), so a session per thread would open a connection per attempt.
        urllib3's pool lends each request in flight a connection of its own until it ends, so
        N threads have N connections, reused by the next attempts, and a request left running
        (abandoned) keeps its connection without touching anyone else's."""
        session = requests.Session()
        session.trust_env = True
        adapter = requests.adapters.HTTPAdapter(pool_maxsize=CONNECTIONS)
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        # The cookie jar is the one part of a Session that threads would write while others
        # read it (RequestsCookieJar.update iterates it without its lock for every request).
        # The API needs none: MAAS authenticates each request by OAuth and sets no cookie on it
        # (Django's SessionMiddleware sets one only when a login changes the session).
        session.cookies.set_policy(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
        return session

    def send(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        files: Mapping[str, Any] | None,
        timeout: float,
    ) -> Response:
        began = time.monotonic()
        try:
            reply = self._exchange(method, url, headers, files, timeout)
        except TransportError as failure:
            self._observe(method, url, None, failure.kind, began)
            raise
        self._observe(method, url, reply.status, None, began)
        return reply

    def _observe(self, method: str, url: str, status: int | None, failure: str | None, began: float) -> None:
        if self.observer is None:
            return
        try:
            self.observer(method, url, status, failure, time.monotonic() - began)
        except Exception:  # noqa: BLE001 - counting a request must never fail it
            pass

    def _exchange(self, method: str, url: str, headers: Mapping[str, str], files: Mapping[str, Any] | None,
              timeout: float) -> Response:
        try:
            with self.session.request(
                method,
                url,
                headers=dict(headers),
                files=files or None,
                timeout=(min(timeout, 10.0), timeout),
                allow_redirects=False,
                verify=self.verify,
                stream=True,
            ) as reply:
                body = self._read(reply)
        except requests.ConnectTimeout:
            raise TransportError("timeout", "no connection in time", sent=False) from None
        except requests.Timeout:
            raise TransportError("timeout", "no answer in time") from None
        except requests.ConnectionError as error:
            raise TransportError("connection", _connection_reason(error), sent=not _never_sent(error)) from None
        except requests.RequestException as error:
            raise TransportError("connection", type(error).__name__) from None
        return Response(reply.status_code, reply.headers, body)

    def _read(self, reply: requests.Response) -> bytes:
        declared = reply.headers.get("Content-Length", "")
        if declared.isdigit() and int(declared) > self.max_body:
            raise TransportError("too-large", _too_large(self.max_body, int(declared)))
        chunks, size = [], 0
        for chunk in reply.iter_content(256 * 1024):
            size += len(chunk)
            if size > self.max_body:
                raise TransportError("too-large", _too_large(self.max_body))
            chunks.append(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        self.session.close()


def _too_large(limit: int, size: int | None = None) -> str:
    found = f"{size / 2**20:.0f} MiB" if size is not None else "more"
    return (f"response body larger than maas.max_response_mib ({limit / 2**20:g} MiB; found {found}): "
            "raise maas.max_response_mib if this MAAS really has that much to say")


def _connection_reason(error: BaseException) -> str:
    """A short reason without URLs or headers (the exception text can be long)."""
    return unreachable.reason(error, "MAAS host")


# Failures that happen before a connection exists, so before any byte of the request left:
# urllib3 raises NewConnectionError (NameResolutionError is one) and ConnectTimeoutError only
# from making the connection, and a certificate is refused during the TLS handshake.
_BEFORE_SENDING = {"ConnectionRefusedError", "gaierror", "NewConnectionError", "ConnectTimeoutError",
                   "ConnectTimeout", "SSLCertVerificationError", "CertificateError"}


def _never_sent(error: BaseException) -> bool:
    """True when the failure certainly came before the request was sent; anything else (a
    reset, a closed connection, another TLS error) may have come after MAAS read it."""
    return any(kind.__name__ in _BEFORE_SENDING for cause in _causes(error) for kind in type(cause).__mro__)
