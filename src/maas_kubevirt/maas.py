"""A small client for the MAAS REST API 2.0 (DESIGN.md section 4).

Three separate pieces, so tests can replace any of them:

- ``Signer`` signs a request with OAuth 1.0 PLAINTEXT (oauthlib) from the API key
  ``consumer:token:secret``; a fresh nonce and timestamp on every attempt.
- ``Transport`` sends one HTTP request with requests and returns status, headers and body.
- ``MAASClient`` builds the URLs (``<url>/api/2.0/<path>``), retries what is worth retrying
  (connection errors, timeouts, 503 honouring Retry-After; bounded) and turns every failure
  into a ``MAASError`` whose message is one line: ``METHOD path: status: MAAS's message``.

Secrets: the API key is only ever held by the Signer (its repr hides it); the power
parameters MAAS returns are reduced to ``power_address`` at once and ``power_pass`` is never
kept, logged or put into an error message (bodies of power-parameter responses are withheld).
"""

from __future__ import annotations

import email.utils
import json
import os
import random
import re
import stat
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping
from urllib.parse import urlencode

import oauthlib.oauth1
import requests

from maas_kubevirt.values import ValuesError

API_PATH = "api/2.0/"

# The oldest MAAS that runs the commissioning script's BMC_CONFIG_PATH upload (2.9.0).
MIN_MAAS_VERSION = (2, 9, 0)
# MAAS releases that reject a DNS name in a redfish power_address (LP:2150892).
DNS_NAME_REJECTED = (((3, 6, 0), (3, 6, 4)), ((3, 7, 0), (3, 7, 2)))

# Power parameters are fetched for at most this many system ids per request, which keeps
# the request line well below the 8 KiB most proxies accept.
POWER_PARAMETERS_CHUNK = 200

MAX_MESSAGE = 300


class MAASError(Exception):
    """A failed MAAS request: ``METHOD path: status: message`` on one line.

    ``status`` is the HTTP status, or None when no response arrived (``kind`` says why:
    "connection", "timeout", "malformed", "interrupted", "http").
    """

    def __init__(self, method: str, path: str, status: int | None, message: str, kind: str = "http"):
        self.method = method
        self.path = path
        self.status = status
        self.message = message
        self.kind = kind
        super().__init__(f"{method} {path}: {status if status is not None else kind}: {message}")

    @property
    def is_race(self) -> bool:
        """MAAS refused because the machine moved on (400 validation, 404 gone, 409 state)."""
        return self.status in (400, 404, 409)


class MAASAuthError(MAASError):
    """401 (bad API key) or 403 (not an administrator): retrying cannot help."""


class MAASVersionError(Exception):
    """MAAS is older than MIN_MAAS_VERSION."""


def _one_line(text: str, limit: int = MAX_MESSAGE) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def readable_message(body: bytes, content_type: str = "") -> str:
    """MAAS's error body as one readable line: ``{"hostname": ["taken"]}`` -> ``hostname: taken``."""
    text = body.decode("utf-8", "replace").strip()
    if not text:
        return "(no message)"
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        parts = []
        for key, value in data.items():
            if isinstance(value, list):
                value = " ".join(str(v) for v in value)
            parts.append(str(value) if key == "__all__" else f"{key}: {value}")
        return _one_line("; ".join(parts)) or "(no message)"
    if isinstance(data, list):
        return _one_line(" ".join(str(v) for v in data)) or "(no message)"
    if isinstance(data, str):
        return _one_line(data)
    if "html" in content_type.lower() or text.startswith("<"):
        title = re.search(r"<title>(.*?)</title>", text, re.IGNORECASE | re.DOTALL)
        text = title.group(1) if title else re.sub(r"<[^>]+>", " ", text)
    return _one_line(text) or "(no message)"


# --- API key --------------------------------------------------------------------------------


def parse_api_key(text: str, source: str) -> tuple[str, str, str]:
    """(consumer, token, secret) from ``consumer:token:secret``; the error never shows the key."""
    parts = text.strip().split(":")
    if len(parts) != 3 or not all(parts) or any(c.isspace() for c in text.strip()):
        raise ValuesError(
            [f"{source}: expected a MAAS API key of the form consumer:token:secret "
             f"(from `maas apikey` or the MAAS UI), found {len(parts)} colon-separated part(s)"]
        )
    return parts[0], parts[1], parts[2]


def load_api_key(maas_values: Mapping[str, Any], warn: Callable[[str], None]) -> tuple[str, str, str]:
    """The API key from $MAAS_API_KEY, else from maas.api_key_file (never from argv).

    Warns, without failing, when the file is readable by group or others.
    """
    env = os.environ.get("MAAS_API_KEY")
    if env:
        return parse_api_key(env, "MAAS_API_KEY")
    path = maas_values.get("api_key_file") or ""
    try:
        with open(path, encoding="utf-8") as handle:
            mode = os.fstat(handle.fileno()).st_mode
            text = handle.read()
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or type(error).__name__
        raise ValuesError(
            [f"maas.api_key_file: expected a readable file holding the MAAS API key "
             f"(consumer:token:secret), found {path!r}: {reason} (or set MAAS_API_KEY)"]
        ) from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        warn(f"{path} is readable by group or others (mode {stat.S_IMODE(mode):04o}): "
             f"run `chmod 600 {path}`; it holds an administrator's MAAS API key")
    return parse_api_key(text, "maas.api_key_file")


# --- the three pieces -----------------------------------------------------------------------


class Signer:
    """OAuth 1.0 PLAINTEXT signing (oauthlib) for one API key."""

    def __init__(self, consumer: str, token: str, secret: str):
        self._client = oauthlib.oauth1.Client(
            consumer,
            client_secret="",
            resource_owner_key=token,
            resource_owner_secret=secret,
            signature_method=oauthlib.oauth1.SIGNATURE_PLAINTEXT,
        )
        self._parts = (consumer, token, secret)

    def __repr__(self) -> str:
        return "Signer(<API key withheld>)"

    def secrets(self) -> tuple[str, ...]:
        return self._parts

    def headers(self, method: str, url: str) -> dict[str, str]:
        """The Authorization header for one attempt (fresh nonce and timestamp)."""
        _, headers, _ = self._client.sign(url, http_method=method)
        return dict(headers)


@dataclass
class Response:
    status: int
    headers: Mapping[str, str]
    body: bytes


class TransportError(Exception):
    """No response: ``kind`` is "connection" or "timeout"; the message names no secret."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class Transport:
    """One HTTP request over a requests Session (keep-alive), TLS verified by default."""

    def __init__(self, verify: bool | str = True):
        self.session = requests.Session()
        self.session.trust_env = True
        self.verify = verify

    def send(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        files: Mapping[str, Any] | None,
        timeout: float,
    ) -> Response:
        try:
            reply = self.session.request(
                method,
                url,
                headers=dict(headers),
                files=files or None,
                timeout=(min(timeout, 10.0), timeout),
                allow_redirects=False,
                verify=self.verify,
            )
            body = reply.content
        except requests.Timeout:
            raise TransportError("timeout", "no answer in time") from None
        except requests.ConnectionError as error:
            raise TransportError("connection", _connection_reason(error)) from None
        except requests.RequestException as error:
            raise TransportError("connection", type(error).__name__) from None
        return Response(reply.status_code, reply.headers, body)

    def close(self) -> None:
        self.session.close()


def _connection_reason(error: BaseException) -> str:
    """A short reason without URLs or headers (the exception text can be long)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        name = type(error).__name__
        if name in ("ConnectionRefusedError", "ConnectionResetError", "RemoteDisconnected",
                    "BrokenPipeError", "ConnectionAbortedError", "SSLError", "NameResolutionError",
                    "gaierror", "IncompleteRead", "ProtocolError"):
            if name == "ConnectionRefusedError":
                return "connection refused"
            if name in ("ConnectionResetError", "RemoteDisconnected", "ConnectionAbortedError",
                        "IncompleteRead", "ProtocolError", "BrokenPipeError"):
                return "connection closed by the server"
            if name == "SSLError":
                return "TLS error"
            return "cannot resolve the MAAS host name"
        nested = error.args[0] if error.args and isinstance(error.args[0], BaseException) else None
        error = nested or error.__cause__ or error.__context__ or getattr(error, "reason", None)
    return "connection failed"


@dataclass
class RetryPolicy:
    attempts: int = 4           # 1 try + 3 retries
    backoff: float = 1.0        # 1, 2, 4 ... seconds, with a little jitter
    max_backoff: float = 30.0
    max_retry_after: float = 120.0


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def parse_version(text: str) -> tuple[int, int, int] | None:
    """(major, minor, point) from MAAS's version string, e.g. "3.5.0~beta1-14800-g1234"."""
    match = re.match(r"\s*(\d+)\.(\d+)(?:\.(\d+))?", str(text))
    if not match:
        return None
    return int(match[1]), int(match[2]), int(match[3] or 0)


def check_version(text: str) -> list[str]:
    """Warnings for MAAS's version; raises MAASVersionError below MIN_MAAS_VERSION."""
    version = parse_version(text)
    minimum = ".".join(map(str, MIN_MAAS_VERSION))
    if version is None:
        return [f"cannot read the MAAS version {_one_line(text, 40)!r}; assuming at least {minimum}"]
    if version < MIN_MAAS_VERSION:
        raise MAASVersionError(
            f"MAAS {text} is too old: maas-kubevirt needs MAAS {minimum} or later "
            "(the commissioning script hands MAAS the power parameters through BMC_CONFIG_PATH)"
        )
    for low, high in DNS_NAME_REJECTED:
        if low <= version <= high:
            return [
                f"MAAS {text} rejects DNS names in a redfish power address (LP:2150892; affects "
                "3.6.0-3.6.4 and 3.7.0-3.7.2): enlistment of KubeVirt VMs fails; upgrade MAAS"
            ]
    return []


class MAASClient:
    """The MAAS API calls the reconciler needs. ``url`` is the region URL, e.g. http://host:5240/MAAS/."""

    def __init__(
        self,
        url: str,
        signer: Signer,
        *,
        timeout: float = 30.0,
        transport: Transport | None = None,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], bool | None] = time.sleep,
    ):
        base = url.rstrip("/") + "/"
        self.base = base if base.endswith("/" + API_PATH) else base + API_PATH
        self.signer = signer
        self.timeout = float(timeout)
        self.transport = transport or Transport()
        self.retry = retry or RetryPolicy()
        # sleep(seconds) may return True to say "stop now" (a signal arrived).
        self.sleep = sleep
        self.requests = 0

    def __repr__(self) -> str:
        return f"MAASClient({self.base!r})"

    # URL building -----------------------------------------------------------------------
    def url(self, path: str, params: Iterable[tuple[str, str]] | Mapping[str, Any] | None = None) -> str:
        query = urlencode(list(params.items()) if isinstance(params, Mapping) else list(params or []), doseq=True)
        return self.base + path.lstrip("/") + (f"?{query}" if query else "")

    # one call, with retries ---------------------------------------------------------------
    def call(
        self,
        method: str,
        path: str,
        params: Iterable[tuple[str, str]] | Mapping[str, Any] | None = None,
        fields: Mapping[str, str] | None = None,
        files: Mapping[str, tuple[str, bytes]] | None = None,
        *,
        json_reply: bool = True,
        withhold_body: bool = False,
        ok_statuses: tuple[int, ...] = (200, 201, 204),
    ) -> Any:
        url = self.url(path, params)
        shown = path if not params else f"{path}?{_op(params)}".rstrip("?")
        multipart: dict[str, Any] | None = None
        if fields or files:
            multipart = {key: (None, str(value)) for key, value in (fields or {}).items()}
            multipart.update(files or {})
        attempt = 0
        while True:
            attempt += 1
            delay: float | None = None
            try:
                self.requests += 1
                reply = self.transport.send(
                    method, url, self.signer.headers(method, url), multipart, self.timeout
                )
            except TransportError as error:
                failure = MAASError(method, shown, None, str(error), error.kind)
            else:
                if reply.status in ok_statuses:
                    if not json_reply:
                        return reply.body
                    try:
                        return json.loads(reply.body) if reply.body.strip() else None
                    except ValueError:
                        failure = MAASError(
                            method, shown, reply.status,
                            f"malformed JSON in the response ({len(reply.body)} bytes)", "malformed",
                        )
                        # A malformed body is not retried here: the next cycle asks again.
                        raise failure from None
                content_type = reply.headers.get("Content-Type", "")
                message = (
                    "response body withheld (it may hold credentials)"
                    if withhold_body else readable_message(reply.body, content_type)
                )
                message = self._scrub(message)
                if reply.status in (401, 403):
                    hint = ("the API key was refused: check maas.api_key_file" if reply.status == 401
                            else "the API key's user is not a MAAS administrator")
                    raise MAASAuthError(method, shown, reply.status, f"{message} ({hint})")
                failure = MAASError(method, shown, reply.status, message)
                if reply.status != 503:
                    raise failure
                after = _retry_after(reply.headers.get("Retry-After"))
                if after is not None:
                    delay = min(after, self.retry.max_retry_after)
            if attempt >= self.retry.attempts:
                raise failure
            if delay is None:
                delay = min(self.retry.backoff * 2 ** (attempt - 1), self.retry.max_backoff)
                delay *= 1 + random.uniform(0, 0.1)
            if self.sleep(delay):
                raise MAASError(method, shown, None, "stopped by a signal while waiting to retry",
                                "interrupted")

    def _scrub(self, text: str) -> str:
        for secret in self.signer.secrets():
            if secret and len(secret) >= 4:
                text = text.replace(secret, "<withheld>")
        return text

    # the API ------------------------------------------------------------------------------
    def version(self) -> str:
        data = self.call("GET", "version/")
        if not isinstance(data, dict) or "version" not in data:
            raise MAASError("GET", "version/", 200, "no version in the response", "malformed")
        return str(data["version"])

    def machines(self) -> list[dict]:
        data = self.call("GET", "machines/")
        if not isinstance(data, list) or not all(isinstance(m, dict) and "system_id" in m for m in data):
            raise MAASError("GET", "machines/", 200, "expected a list of machines", "malformed")
        return data

    def power_addresses(self, system_ids: Iterable[str]) -> dict[str, str | None]:
        """power_address per system_id, fetched in bulk; every other parameter is dropped at once."""
        ids = list(system_ids)
        found: dict[str, str | None] = {}
        for start in range(0, len(ids), POWER_PARAMETERS_CHUNK):
            chunk = ids[start : start + POWER_PARAMETERS_CHUNK]
            params = [("op", "power_parameters")] + [("id", sid) for sid in chunk]
            data = self.call("GET", "machines/", params, withhold_body=True)
            if not isinstance(data, dict):
                raise MAASError("GET", "machines/?op=power_parameters", 200,
                                "expected a mapping of system_id to parameters", "malformed")
            for sid, parameters in data.items():
                address = parameters.get("power_address") if isinstance(parameters, dict) else None
                found[str(sid)] = address if isinstance(address, str) else None
            del data
        return found

    def power_address(self, system_id: str) -> str | None:
        """One machine's power_address (GET machines/{id}/?op=power_parameters)."""
        data = self.call("GET", f"machines/{system_id}/", [("op", "power_parameters")], withhold_body=True)
        address = data.get("power_address") if isinstance(data, dict) else None
        return address if isinstance(address, str) else None

    def pools(self) -> list[dict]:
        data = self.call("GET", "resourcepools/")
        if not isinstance(data, list):
            raise MAASError("GET", "resourcepools/", 200, "expected a list of resource pools", "malformed")
        return data

    def create_pool(self, name: str, description: str = "") -> dict:
        return self.call("POST", "resourcepools/", fields={"name": name, "description": description})

    def update_machine(self, system_id: str, **fields: str) -> dict:
        return self.call("PUT", f"machines/{system_id}/", fields=fields)

    def commission(self, system_id: str) -> dict:
        return self.call("POST", f"machines/{system_id}/", [("op", "commission")], fields={})

    def script_exists(self, name: str) -> bool:
        try:
            self.call("GET", f"scripts/{name}")
        except MAASError as error:
            if error.status == 404:
                return False
            raise
        return True

    def create_script(self, name: str, content: bytes, comment: str = "") -> dict:
        return self.call("POST", "scripts/", fields={"name": name, "comment": comment},
                         files={"script": (name, content)})

    def update_script(self, name: str, content: bytes, comment: str = "") -> dict:
        return self.call("PUT", f"scripts/{name}", fields={"comment": comment},
                         files={"script": (name, content)})

    def close(self) -> None:
        self.transport.close()


# The retry policy of clients made from the values (tests shorten it).
RETRY = RetryPolicy()


def client_from_values(values: Mapping[str, Any], warn: Callable[[str], None],
                       stop: threading.Event | None = None) -> MAASClient:
    """A client for maas.url with the API key from $MAAS_API_KEY or maas.api_key_file.

    Waits between retries end early when ``stop`` is set.
    """
    maas = values["maas"]
    consumer, token, secret = load_api_key(maas, warn)
    stop = stop or threading.Event()
    return MAASClient(maas["url"], Signer(consumer, token, secret), timeout=maas["timeout"],
                      retry=RETRY, sleep=stop.wait)


def _op(params: Iterable[tuple[str, str]] | Mapping[str, Any]) -> str:
    """The op of a request for messages (not the whole query, which may list many ids)."""
    items = list(params.items()) if isinstance(params, Mapping) else list(params)
    ops = [f"op={value}" for key, value in items if key == "op"]
    return ops[0] if ops else ""
