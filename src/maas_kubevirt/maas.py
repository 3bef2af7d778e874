"""A small client for the MAAS REST API 2.0 (DESIGN.md section 4).

Three separate pieces, so tests can replace any of them:

- ``Signer`` signs a request with OAuth 1.0 PLAINTEXT (oauthlib) from the API key
  ``consumer:token:secret``; a fresh nonce and timestamp on every attempt.
- ``Transport`` sends one HTTP request with requests and returns status, headers and body.
- ``MAASClient`` builds the URLs (``<url>/api/2.0/<path>``, each path segment quoted, a
  system_id checked first), retries what is worth retrying and turns every failure into a
  ``MAASError`` whose message is one line: ``METHOD path: status: MAAS's message``, control
  characters escaped.

Retries: a read (GET) is retried after a connection error, a timeout or a 503; any request
after a failure that came before it was sent (connection refused, no DNS answer, connect
timeout), and after a 503 or 409 carrying Retry-After, MAAS's word that it did nothing and
wants the request again. A request that changes MAAS (POST, PUT, DELETE) is otherwise sent
once: a failure after it may have reached MAAS (reset, read timeout) surfaces at once with
``in_flight``, and a 503 without Retry-After is final (MAAS 3.6.5 answers a commission that
failed to power on that way, after it started commissioning).

Limits: each response body is capped (``maas.max_response_mib``); a ``deadline`` bounds a whole
cycle of requests; each request runs in a worker thread so a ``stop`` event (SIGTERM) ends it
within a fraction of a second, even while MAAS has not answered yet.

Secrets: the API key is only ever held by the Signer (its repr hides it); the power
parameters MAAS returns are reduced at once by the caller's function (to the address, and to
whether the password is right) and ``power_pass`` is never kept, logged or put into an error
message (bodies of power-parameter responses are withheld; a password sent is scrubbed).
"""

from __future__ import annotations

import email.utils
import html
import ipaddress
import json
import os
import random
import re
import stat
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, TypeVar
from urllib.parse import quote, quote_plus, urlencode, urlsplit

import oauthlib.oauth1
import requests

from maas_kubevirt.console import escape_controls
from maas_kubevirt.paths import credential_path
from maas_kubevirt.values import ValuesError

API_PATH = "api/2.0/"
T = TypeVar("T")

# The oldest MAAS that runs the commissioning script's BMC_CONFIG_PATH upload (2.9.0).
MIN_MAAS_VERSION = (2, 9, 0)
# MAAS releases that reject a DNS name in a redfish power_address (LP:2150892).
DNS_NAME_REJECTED = (((3, 6, 0), (3, 6, 4)), ((3, 7, 0), (3, 7, 2)))

# Power parameters are fetched for at most this many system ids per request, which keeps
# the request line well below the 8 KiB most proxies accept.
POWER_PARAMETERS_CHUNK = 200

MAX_MESSAGE = 300

# A response body larger than this is refused. A real MAAS machine object is tens of KB, so
# 10,000 machines make a list of several hundred MB: the default (maas.max_response_mib) is
# 1 GiB.
DEFAULT_MAX_RESPONSE = 1024 * 1024 * 1024
# How often a request in flight looks at the stop event and the deadline.
POLL = 0.1
# A query string longer than this is split over several requests (proxies accept 8 KiB lines).
MAX_QUERY = 6000


class MAASError(Exception):
    """A failed MAAS request: ``METHOD path: status: message`` on one line.

    ``status`` is the HTTP status, or None when no response arrived (``kind`` says why:
    "connection", "timeout", "malformed", "interrupted", "http").
    """

    def __init__(self, method: str, path: str, status: int | None, message: str, kind: str = "http",
                 in_flight: bool = False):
        self.status = status
        self.message = message
        self.kind = kind
        # The request was sent and no answer came (abandoned, reset, timed out): MAAS may have
        # carried it out, so the caller reads the machine back instead of assuming either way.
        self.in_flight = in_flight
        super().__init__(f"{method} {path}: {status if status is not None else kind}: {message}")

    @property
    def is_race(self) -> bool:
        """MAAS refused because the machine moved on (400 validation, 404 gone, 409 state)."""
        return self.status in (400, 404, 409)


class MAASTooLarge(MAASError):
    """A response body over the cap: asking again gets the same; raise maas.max_response_mib."""


class MAASAuthError(MAASError):
    """The API key cannot be used: 401, or 403 on version/ or users/?op=whoami. Stops the service."""


class MAASForbidden(MAASError):
    """403 on one request (not an administrator, or MAAS RBAC on one pool): that request fails."""


class MAASVersionError(Exception):
    """MAAS is older than MIN_MAAS_VERSION."""


def _one_line(text: str, limit: int = MAX_MESSAGE) -> str:
    """Whitespace runs as one space, other control characters escaped, at most ``limit`` long."""
    text = escape_controls(" ".join(str(text).split()))
    return text if len(text) <= limit else text[: limit - 3] + "..."


WITHHELD = "<withheld>"


def withhold(text: str, secrets: Iterable[str]) -> str:
    """text with each secret of 4 or more characters replaced, as sent and as a body may echo
    it (HTML-, JSON- or URL-escaped); shorter ones would blank common words."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            for form in {secret, html.escape(secret), json.dumps(secret)[1:-1],
                         json.dumps(secret, ensure_ascii=False)[1:-1], quote_plus(secret),
                         quote(secret, safe="")}:
                text = text.replace(form, WITHHELD)
    return text


def readable_message(body: bytes, content_type: str = "", hide: Iterable[str] = ()) -> str:
    """MAAS's error body as one readable line: ``{"hostname": ["taken"]}`` -> ``hostname: taken``.

    The secrets in ``hide`` are withheld before the line is cut, so no part of one survives.
    """
    hide = tuple(hide)
    text = body.decode("utf-8", "replace").strip()
    if not text:
        return "(no message)"
    try:
        data = json.loads(text)
        if json_nested_deeper(body, MAX_JSON_DEPTH):
            data = None  # shown as text: joining its values would recurse as deep
    except (ValueError, RecursionError):
        data = None

    def line(found: str) -> str:
        return _one_line(withhold(found, hide)) or "(no message)"

    if isinstance(data, dict):
        parts = []
        for key, value in data.items():
            if isinstance(value, list):
                value = " ".join(str(v) for v in value)
            parts.append(str(value) if key == "__all__" else f"{key}: {value}")
        return line("; ".join(parts))
    if isinstance(data, list):
        return line(" ".join(str(v) for v in data))
    if isinstance(data, str):
        return _one_line(withhold(data, hide))
    if "html" in content_type.lower() or text.startswith("<"):
        text = withhold(text, hide)
        title = re.search(r"<title>(.*?)</title>", text, re.IGNORECASE | re.DOTALL)
        text = title.group(1) if title else re.sub(r"<[^>]+>", " ", text)
    return line(text)


# MAAS's objects nest a few levels (a machine's interfaces' links' subnets' VLANs ...). Deeper
# JSON is not MAAS's: refused before anything walks it (json itself recurses, and fails with
# RecursionError, at about a thousand).
MAX_JSON_DEPTH = 64
_ESCAPED_BACKSLASH = b"\\\\"
_ESCAPED_QUOTE = b'\\"'
_NOT_STRUCTURE = bytes(byte for byte in range(256) if byte not in b'"[]{}')
_STRING = re.compile(rb'"[^"]*"')
_INNERMOST = re.compile(rb"\[\]|\{\}")


def json_nested_deeper(body: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when the JSON text ``body`` nests arrays and objects more than ``limit`` deep
    (brackets inside strings do not count; text that does not balance counts as deeper).

    Built from passes of C code (replace, translate, regex) over the text, never a loop per
    character: a machine list can be hundreds of MB. Each pass of ``_INNERMOST`` removes the
    innermost level, so what is left after ``limit`` passes lies deeper.
    """
    encoding = json.detect_encoding(body)
    if encoding not in ("utf-8", "utf-8-sig"):
        body = body.decode(encoding, "surrogatepass").encode("utf-8", "surrogatepass")
    # In JSON a backslash escapes exactly the next character, left to right: dropping the
    # escaped backslashes first, then the escaped quotes, leaves only the quotes of strings.
    structure = body.replace(_ESCAPED_BACKSLASH, b"").replace(_ESCAPED_QUOTE, b"")
    structure = structure.translate(None, _NOT_STRUCTURE)
    # Quotes now alternate open, close. Dropping two adjacent ones drops an empty string or
    # joins two strings into one, so it keeps that order; it leaves only the few strings that
    # hold brackets for the (slower) regex.
    structure = _STRING.sub(b"", structure.replace(b'""', b""))
    for _ in range(limit):
        if not structure:
            return False
        structure = _INNERMOST.sub(b"", structure)
    return bool(structure)


# --- API key --------------------------------------------------------------------------------


ENV_KEY = "MAAS_API_KEY"
KEY_FILE = "maas.api_key_file"


def parse_api_key(text: str, source: str, where: str = "") -> tuple[str, str, str]:
    """(consumer, token, secret) from ``consumer:token:secret``; the error never shows the key.

    ``source`` names where the text came from (``MAAS_API_KEY`` or ``maas.api_key_file``):
    the error names it, so the operator fixes the right one; ``where`` says more (" in PATH").
    """
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise ValuesError([f"{source}: expected a MAAS API key of the form consumer:token:secret{where} "
                           "(from `maas apikey --username USER`), found nothing"])
    if len(lines) > 1:
        # `maas apikey --username USER` prints every key of that user, one per line
        # (src/maasserver/management/commands/apikey.py, _print_token per token).
        raise ValuesError([
            f"{source}: expected one MAAS API key{where}, found {len(lines)} lines: keep only the key "
            "maas-kubevirt should use (`maas apikey --username USER --with-names` names each "
            "key; `maas apikey --username USER --generate --name maas-kubevirt` makes a "
            "dedicated one)"
        ])
    line = lines[0]
    parts = line.split(":")
    if len(parts) != 3 or not all(parts) or any(c.isspace() for c in line):
        hint = (" (text after the key: remove the key's name that `--with-names` prints)"
                if len(line.split()) == 2 and len(line.split()[0].split(":")) == 3 else "")
        raise ValuesError(
            [f"{source}: expected a MAAS API key of the form consumer:token:secret{where} "
             f"(from `maas apikey --username USER`), found {len(parts)} colon-separated "
             f"part(s){hint}"]
        )
    return parts[0], parts[1], parts[2]


API_KEY_CREDENTIAL = "api-key"


def load_api_key(maas_values: Mapping[str, Any], warn: Callable[[str], None]) -> tuple[str, str, str]:
    """The API key from $MAAS_API_KEY, else the systemd credential ``api-key``, else
    maas.api_key_file (never from argv).

    Warns, without failing, when the file is readable by group or others (not for the
    credential: systemd makes it 0400 with an ACL for the service's user, shown as 0440).
    """
    return load_api_key_with_source(maas_values, warn)[0]


def load_api_key_with_source(
    maas_values: Mapping[str, Any], warn: Callable[[str], None]
) -> tuple[tuple[str, str, str], str]:
    """(the key, where it came from: ``MAAS_API_KEY``, ``credential api-key (PATH)`` or
    ``maas.api_key_file (PATH)``)."""
    env = os.environ.get(ENV_KEY)
    if env:
        return parse_api_key(env, ENV_KEY, " in the environment variable"), ENV_KEY
    credential = credential_path(API_KEY_CREDENTIAL)
    if credential is not None:
        source = f"credential {API_KEY_CREDENTIAL}"
        try:
            text = credential.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            reason = getattr(error, "strerror", None) or type(error).__name__
            raise ValuesError([f"{source}: expected a readable MAAS API key in {credential}: {reason}"]) from None
        return parse_api_key(text, source, f" in {credential}"), f"{source} ({credential})"
    path = maas_values.get("api_key_file") or ""
    try:
        with open(path, encoding="utf-8") as handle:
            mode = os.fstat(handle.fileno()).st_mode
            text = handle.read()
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or type(error).__name__
        raise ValuesError(
            [f"{KEY_FILE}: expected a readable file holding the MAAS API key "
             f"(consumer:token:secret), found {path!r}: {reason} (or set {ENV_KEY})"]
        ) from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        warn(f"{path} is readable by group or others (mode {stat.S_IMODE(mode):04o}): "
             f"run `chmod 600 {path}`; it holds an administrator's MAAS API key")
    return parse_api_key(text, KEY_FILE, f" in {path}"), f"{KEY_FILE} ({path})"


def cleartext_warning(url: str) -> str | None:
    """A warning when maas.url is http:// to a host other than this one, else None.

    OAuth 1.0 PLAINTEXT puts the token secret itself in every request's Authorization header
    (the signature is ``&<secret>``), so without TLS anyone on the path can read and reuse it.
    """
    parts = urlsplit(url)
    if parts.scheme != "http":
        return None
    host = (parts.hostname or "").rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return None
    try:
        if ipaddress.ip_address(host).is_loopback:
            return None
    except ValueError:
        pass
    return (f"maas.url is http:// on {host}: OAuth PLAINTEXT sends the API key's token secret "
            "in clear with every request; use https:// (MAAS serves TLS on port 5443 after "
            "`maas config-tls enable`) or run maas-kubevirt on the region host with "
            "http://localhost:5240/MAAS/")


# --- the three pieces -----------------------------------------------------------------------


class Signer:
    """OAuth 1.0 PLAINTEXT signing (oauthlib) for one API key."""

    def __init__(self, consumer: str, token: str, secret: str, source: str = "the MAAS API key"):
        # Where the key came from, for "refused: check ..." (MAAS_API_KEY or the key file).
        self.source = source
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
    a compressed answer cannot grow past the cap either).
    """

    def __init__(self, verify: bool | str = True, max_body: int = DEFAULT_MAX_RESPONSE):
        self.verify = verify
        self.max_body = max_body
        self.session = self._session()

    @staticmethod
    def _session() -> requests.Session:
        session = requests.Session()
        session.trust_env = True
        return session

    def send(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        files: Mapping[str, Any] | None,
        timeout: float,
    ) -> Response:
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

    def abandon(self) -> None:
        """Leave a request still in flight to its worker thread; later requests get a new session."""
        self.session = self._session()

    def close(self) -> None:
        self.session.close()


def _too_large(limit: int, size: int | None = None) -> str:
    found = f"{size / 2**20:.0f} MiB" if size is not None else "more"
    return (f"response body larger than maas.max_response_mib ({limit / 2**20:g} MiB; found {found}): "
            "raise maas.max_response_mib if this MAAS really has that much to say")


def _causes(error: BaseException | None) -> Iterable[BaseException]:
    """error and its causes, outermost first, each once: urllib3 and requests link them by
    args, raise-from, implicit context or ``.reason``, differently from one version to the next."""
    seen = set()
    while isinstance(error, BaseException) and id(error) not in seen:
        seen.add(id(error))
        yield error
        nested = error.args[0] if error.args and isinstance(error.args[0], BaseException) else None
        error = nested or error.__cause__ or error.__context__ or getattr(error, "reason", None)


def _connection_reason(error: BaseException) -> str:
    """A short reason without URLs or headers (the exception text can be long)."""
    for cause in _causes(error):
        name = type(cause).__name__
        if name == "ConnectionRefusedError":
            return "connection refused"
        if name in ("ConnectionResetError", "RemoteDisconnected", "ConnectionAbortedError",
                    "IncompleteRead", "ProtocolError", "BrokenPipeError"):
            return "connection closed by the server"
        if name == "SSLError":
            return "TLS error"
        if name in ("NameResolutionError", "gaierror"):
            return "cannot resolve the MAAS host name"
    return "connection failed"


# Failures that happen before a connection exists, so before any byte of the request left:
# urllib3 raises NewConnectionError (NameResolutionError is one) and ConnectTimeoutError only
# from making the connection, and a certificate is refused during the TLS handshake.
_BEFORE_SENDING = {"ConnectionRefusedError", "gaierror", "NewConnectionError", "ConnectTimeoutError",
                   "ConnectTimeout", "SSLCertVerificationError", "CertificateError"}


def _never_sent(error: BaseException) -> bool:
    """True when the failure certainly came before the request was sent; anything else (a
    reset, a closed connection, another TLS error) may have come after MAAS read it."""
    return any(kind.__name__ in _BEFORE_SENDING for cause in _causes(error) for kind in type(cause).__mro__)


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


# MAAS makes a system_id of lower-case letters and digits, at most 41 characters
# (src/maasserver/models/node.py: generate_node_system_id, from znums; Node.system_id
# max_length=41). Anything else in a machine record is not MAAS's: it never goes into a URL.
_SYSTEM_ID = re.compile(r"[a-z0-9]{1,41}")


def valid_system_id(value: object) -> bool:
    """True when value is a system_id as MAAS makes them (1-41 lower-case letters and digits)."""
    return isinstance(value, str) and _SYSTEM_ID.fullmatch(value) is not None


def segment(text: str) -> str:
    """One URL path segment with every reserved character quoted, so it stays one segment.

    "." and ".." are quoted too: HTTP clients resolve them as dot segments (urllib3's
    parse_url does), which would move the request to another resource.
    """
    quoted = quote(text, safe="")
    return quoted.replace(".", "%2E") if quoted in (".", "..") else quoted


# Requests that only read; any other method may change MAAS and is not repeated blindly.
READS = ("GET", "HEAD")
# Where a 403 means the key itself is refused: MAAS answers version/ to anyone and whoami to
# any user (src/maasserver/api/users.py, UsersHandler.whoami), so a 403 there is not about
# one object. Elsewhere a 403 is about that request (admin_method, RBAC on a pool).
KEY_CHECKS = ("version/", "users/?op=whoami")


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
        sleep: Callable[[float], bool | None] | None = None,
        stop: threading.Event | None = None,
        max_body: int = DEFAULT_MAX_RESPONSE,
    ):
        base = url.rstrip("/") + "/"
        self.base = base if base.endswith("/" + API_PATH) else base + API_PATH
        self.signer = signer
        self.timeout = float(timeout)
        self.max_body = max_body
        self.transport = transport or Transport(max_body=max_body)
        self.retry = retry or RetryPolicy()
        # Set by a signal handler: a request in flight and a wait between retries end at once.
        self.stop = stop or threading.Event()
        # sleep(seconds) may return True to say "stop now" (a signal arrived).
        self.sleep = sleep or self.stop.wait
        # time.monotonic() by which the current cycle's requests must be done (None: no limit).
        self.deadline: float | None = None
        self.requests = 0

    def __repr__(self) -> str:
        return f"MAASClient({self.base!r})"

    @contextmanager
    def within(self, seconds: float | None):
        """Requests made inside end with kind "deadline" once ``seconds`` have passed."""
        saved = self.deadline
        self.deadline = None if seconds is None else time.monotonic() + seconds
        try:
            yield self
        finally:
            self.deadline = saved

    # URL building -----------------------------------------------------------------------
    def url(self, path: str, params: Iterable[tuple[str, str]] | Mapping[str, Any] | None = None) -> str:
        query = urlencode(list(params.items()) if isinstance(params, Mapping) else list(params or []), doseq=True)
        return self.base + path.lstrip("/") + (f"?{query}" if query else "")

    # one attempt, interruptible -------------------------------------------------------------
    def _send(self, method: str, shown: str, url: str, multipart: dict[str, Any] | None) -> Response:
        """One attempt in a worker thread, so that the stop event and the deadline end it even
        while a DNS lookup, a connect or a read blocks. An abandoned attempt finishes (or
        times out) on its own; its result is dropped."""
        remaining = self._remaining(method, shown)
        outcome: dict[str, Any] = {}
        done = threading.Event()
        headers = self.signer.headers(method, url)
        transport = self.transport

        def attempt() -> None:
            try:
                outcome["reply"] = transport.send(method, url, headers, multipart,
                                                  min(self.timeout, remaining))
            except BaseException as error:  # noqa: BLE001 - handed to the caller's thread
                outcome["error"] = error
            finally:
                done.set()

        worker = threading.Thread(target=attempt, name="maas-request", daemon=True)
        worker.start()
        while not done.wait(POLL):
            if self.stop.is_set():
                self._abandon()
                raise MAASError(method, shown, None, "stopped by a signal during the request",
                                "interrupted", in_flight=True)
            if self.deadline is not None and time.monotonic() >= self.deadline:
                self._abandon()
                raise MAASError(method, shown, None, "the cycle's deadline (maas.cycle_deadline) "
                                "passed during the request", "deadline", in_flight=True)
        if "error" in outcome:
            raise outcome["error"]
        reply = outcome["reply"]
        if len(reply.body) > self.max_body:
            raise TransportError("too-large", _too_large(self.max_body, len(reply.body)))
        return reply

    def _abandon(self) -> None:
        abandon = getattr(self.transport, "abandon", None)  # test transports may not have it
        if abandon is not None:
            abandon()

    def _remaining(self, method: str, shown: str) -> float:
        if self.deadline is None:
            return self.timeout
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise MAASError(method, shown, None, "the cycle's deadline (maas.cycle_deadline) passed",
                            "deadline")
        return remaining

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
        hide: tuple[str, ...] = (),
    ) -> Any:
        url = self.url(path, params)
        shown = path if not params else f"{path}?{_op(params)}".rstrip("?")
        multipart: dict[str, Any] | None = None
        if fields or files:
            multipart = {key: (None, str(value)) for key, value in (fields or {}).items()}
            multipart.update(files or {})
        reads = method.upper() in READS
        attempt = 0
        while True:
            attempt += 1
            delay: float | None = None
            try:
                self.requests += 1
                reply = self._send(method, shown, url, multipart)
            except TransportError as error:
                if error.kind == "too-large":
                    # The answer was not read: a change may have been made.
                    raise MAASTooLarge(method, shown, None, str(error), error.kind,
                                       in_flight=not reads) from None
                if not reads and error.sent:
                    # MAAS may have read it and carried it out: sending it again could repeat
                    # the change (a second commission, a second pool).
                    raise MAASError(method, shown, None, f"{error} after the request was sent: MAAS "
                                    "may have carried it out; not sent again", error.kind,
                                    in_flight=True) from None
                failure = MAASError(method, shown, None, str(error), error.kind)
            else:
                if reply.status in ok_statuses:
                    if not json_reply:
                        return reply.body
                    # A malformed body is not retried here: the next cycle asks again.
                    return _json(method, shown, reply)
                content_type = reply.headers.get("Content-Type", "")
                message = (
                    "response body withheld (it may hold credentials)"
                    if withhold_body else readable_message(reply.body, content_type, self._secrets(hide))
                )
                if reply.status == 401 or (reply.status == 403 and shown in KEY_CHECKS):
                    hint = (f"the API key was refused: check {self.signer.source}" if reply.status == 401
                            else "the API key's user is not a MAAS administrator")
                    raise MAASAuthError(method, shown, reply.status, f"{message} ({hint})")
                if reply.status == 403:
                    raise MAASForbidden(method, shown, 403, f"{message} (the API key's user lacks permission "
                                        "for this request: a MAAS administrator's key has it)")
                failure = MAASError(method, shown, reply.status, message)
                after = _retry_after(reply.headers.get("Retry-After"))
                # MAAS adds Retry-After only when it did nothing and wants the request again.
                # Views run in a savepoint that an exception rolls back (src/maasserver/utils/
                # views.py, WebApplicationHandler.make_view_atomic; ATOMIC_REQUESTS is forced on in
                # src/maasserver/djangosettings/__init__.py). Then:
                # - 503 with Retry-After 10: no rack controller to talk to, or an external
                #   process failed (src/maasserver/middleware.py, APIRPCErrorsMiddleware and
                #   ExceptionMiddleware);
                # - 409 with Retry-After 5: the region ran out of retries on a serialisation
                #   conflict (src/maasserver/utils/views.py, HttpResponseConflict, MAAS 3.4+).
                # A 503 without it (src/maasserver/exceptions.py: PowerProblem and the like) may
                # come after MAAS acted: a read is asked again, a change is not. A 409 without
                # it is a state conflict: the caller decides (a race).
                asked_again = after is not None and reply.status in (503, 409)
                if not (asked_again or (reply.status == 503 and reads)):
                    raise failure
                if after is not None:
                    delay = min(after, self.retry.max_retry_after)
            if attempt >= self.retry.attempts:
                raise failure
            if delay is None:
                delay = min(self.retry.backoff * 2 ** (attempt - 1), self.retry.max_backoff)
                delay *= 1 + random.uniform(0, 0.1)
            if self.deadline is not None and time.monotonic() + delay >= self.deadline:
                raise MAASError(method, shown, failure.status,
                                f"{failure.message}; not retried: the cycle's deadline "
                                "(maas.cycle_deadline) comes first", "deadline")
            if self.sleep(delay):
                raise MAASError(method, shown, None, "stopped by a signal while waiting to retry",
                                "interrupted")

    def _secrets(self, hide: tuple[str, ...] = ()) -> tuple[str, ...]:
        """The API key's parts and the caller's secrets: none reaches a message."""
        return (*self.signer.secrets(), *hide)

    def _machine(self, method: str, system_id: str, op: str = "") -> str:
        """The path ``machines/{id}/``; a system_id MAAS would not make is refused, nothing sent."""
        if not valid_system_id(system_id):
            raise MAASError(method, "machines/" + (f"?op={op}" if op else ""), None,
                            f"refused system_id {_one_line(repr(system_id), 80)}: MAAS makes them of "
                            "lower-case letters and digits (at most 41); no request sent", "malformed")
        return f"machines/{segment(system_id)}/"

    # the API ------------------------------------------------------------------------------
    def version(self) -> str:
        data = self.call("GET", "version/")
        if not isinstance(data, dict) or "version" not in data:
            raise MAASError("GET", "version/", 200, "no version in the response", "malformed")
        return str(data["version"])

    def machines(self) -> list[Any]:
        """Every machine, as MAAS sent it: a list is checked, each record is the caller's to check
        (one malformed record must not hide the others)."""
        data = self.call("GET", "machines/")
        if not isinstance(data, list):
            raise MAASError("GET", "machines/", 200, "expected a list of machines", "malformed")
        return data

    def taken_hostnames(self, hostnames: Iterable[str]) -> dict[str, str]:
        """hostname -> system_id of the node holding it, for those of ``hostnames`` held.

        Hostnames are unique over every node, machines, devices and controllers alike
        (src/maasserver/models/node.py: Node.hostname is unique), but machines/ lists machines
        only; nodes/ lists them all and filters by exact hostname
        (src/maasserver/api/nodes.py: filtered_nodes_list_from_request, hostname__in).
        One request, split only when the query would pass MAX_QUERY characters.
        """
        wanted = sorted(set(hostnames))
        taken: dict[str, str] = {}
        for chunk in _chunks(wanted, lambda name: len(name) + len("&hostname=")):
            data = self.call("GET", "nodes/", [("hostname", name) for name in chunk])
            if not isinstance(data, list):
                raise MAASError("GET", "nodes/", 200, "expected a list of nodes", "malformed")
            for node in data:
                if isinstance(node, dict) and isinstance(node.get("hostname"), str) \
                        and node["hostname"] in chunk:
                    taken[node["hostname"]] = str(node.get("system_id"))
        return taken

    def power_parameters(self, system_ids: Iterable[str], reduce: Callable[..., T],
                         hints: Mapping[str, Any] | None = None) -> dict[str, T]:
        """reduce(parameters) per system_id, fetched in bulk (``GET machines/?op=power_parameters&id=...``);
        with hints, reduce(parameters, hints.get(system_id)).

        Each machine's parameters (power_pass among them) go to reduce as soon as they are
        parsed and are dropped after: only what reduce returns is kept.
        """
        ids = list(system_ids)
        found: dict[str, T] = {}
        for start in range(0, len(ids), POWER_PARAMETERS_CHUNK):
            chunk = ids[start : start + POWER_PARAMETERS_CHUNK]
            params = [("op", "power_parameters")] + [("id", sid) for sid in chunk]
            data = self.call("GET", "machines/", params, withhold_body=True)
            if not isinstance(data, dict):
                raise MAASError("GET", "machines/?op=power_parameters", 200,
                                "expected a mapping of system_id to parameters", "malformed")
            for sid, parameters in data.items():
                parameters = parameters if isinstance(parameters, dict) else {}
                found[str(sid)] = (reduce(parameters) if hints is None
                                   else reduce(parameters, hints.get(str(sid))))
            del data
        return found

    def power_addresses(self, system_ids: Iterable[str]) -> dict[str, str | None]:
        """power_address per system_id, fetched in bulk; every other parameter is dropped at once."""
        return self.power_parameters(system_ids, power_address_of)

    def machines_by_id(self, system_ids: Iterable[str]) -> list[Any]:
        """The machines with these system ids (``GET machines/?id=...``, split only when the query
        would pass MAX_QUERY characters); an id with no machine is absent. Records as machines()."""
        found: list[Any] = []
        for chunk in _chunks(sorted(set(system_ids)), lambda sid: len(sid) + len("&id=")):
            data = self.call("GET", "machines/", [("id", sid) for sid in chunk])
            if not isinstance(data, list):
                raise MAASError("GET", "machines/?id=...", 200, "expected a list of machines", "malformed")
            found.extend(data)
        return found

    def events(self, level: str, after: int | None = None, limit: int = 1000) -> Any:
        """One page of the event log (``GET events/?op=query``, src/maasserver/api/events.py);
        after None: the newest events. The event list, for ``maas_kubevirt.events`` to check."""
        params = [("op", "query"), ("level", level), ("limit", str(limit))]
        if after is not None:
            params.append(("after", str(after)))
        data = self.call("GET", "events/", params)
        if not isinstance(data, dict) or not isinstance(data.get("events"), list):
            raise MAASError("GET", "events/?op=query", 200, "expected an object with a list of events",
                            "malformed")
        return data["events"]

    def power_address(self, system_id: str) -> str | None:
        """One machine's power_address (GET machines/{id}/?op=power_parameters)."""
        data = self.call("GET", self._machine("GET", system_id, "power_parameters"), [("op", "power_parameters")],
                         withhold_body=True)
        address = data.get("power_address") if isinstance(data, dict) else None
        return address if isinstance(address, str) else None

    def pools(self) -> list[dict]:
        data = self.call("GET", "resourcepools/")
        if not isinstance(data, list):
            raise MAASError("GET", "resourcepools/", 200, "expected a list of resource pools", "malformed")
        return data

    def create_pool(self, name: str, description: str = "") -> dict:
        return self.call("POST", "resourcepools/", fields={"name": name, "description": description})

    def update_machine(self, system_id: str, *, hide: tuple[str, ...] = (), **fields: str) -> dict:
        """One ``PUT machines/{id}/`` with every field given; no value in ``hide`` (nor any
        ``*power_pass`` or ``*power_user`` field: the derived user names the VM's BMC row, so it
        is kept as close as the password) reaches a message.

        MAAS merges the machine's current power parameters into the form for every key the
        request leaves out (src/maasserver/forms/__init__.py, WithPowerTypeMixin
        ._get_power_parameters; a field left unset takes its initial value in
        src/maasserver/config_forms.py, DictCharField.clean_sub_fields), and the form is all
        or nothing: one refused field (a taken hostname) changes none.
        """
        passwords = tuple(value for key, value in fields.items() if key.endswith(("power_pass", "power_user")))
        return self.call("PUT", self._machine("PUT", system_id), fields=fields, hide=(*hide, *passwords))

    def commission(self, system_id: str, skip_bmc_config: bool = True) -> dict:
        """Commission; skip_bmc_config=1 keeps scripts tagged bmc-config (ours among them) from
        writing the power parameters again (src/maasserver/forms/ephemeral.py, CommissionForm)."""
        fields = {"skip_bmc_config": "1"} if skip_bmc_config else {}
        return self.call("POST", self._machine("POST", system_id, "commission"), [("op", "commission")],
                         fields=fields)

    def script(self, name: str) -> dict | None:
        """The script's metadata (tags, timeout, history ...), or None when MAAS has none by that name."""
        try:
            data = self.call("GET", f"scripts/{segment(name)}")
        except MAASError as error:
            if error.status == 404:
                return None
            raise
        if not isinstance(data, dict):
            raise MAASError("GET", f"scripts/{name}", 200, "expected a script object", "malformed")
        return data

    def script_exists(self, name: str) -> bool:
        return self.script(name) is not None

    def whoami(self) -> dict:
        """The key's user: username, email, is_local, is_superuser.

        MAAS: src/maasserver/api/users.py, ``UsersHandler.whoami`` returns ``request.user``,
        emitted with ``UserHandler.fields``.
        """
        data = self.call("GET", "users/", [("op", "whoami")])
        if not isinstance(data, dict) or not isinstance(data.get("is_superuser"), bool):
            raise MAASError("GET", "users/?op=whoami", 200, "expected a user with is_superuser", "malformed")
        return data

    def require_administrator(self) -> dict:
        """whoami, or MAASAuthError when the key's user is not a MAAS administrator: the power
        parameters and every change the reconciler makes are for administrators only."""
        user = self.whoami()
        if user["is_superuser"] is not True:
            name = _one_line(repr(user.get("username")), 80)
            raise MAASAuthError("GET", "users/?op=whoami", None, f"the API key's user {name} is not a MAAS "
                                "administrator: use an administrator's key (`maas apikey --username ADMIN`)",
                                "not-admin")
        return user

    def config(self, name: str) -> Any:
        """One MAAS configuration value (src/maasserver/api/maas.py, ``get_config``: the value as JSON)."""
        return self.call("GET", "maas/", [("op", "get_config"), ("name", name)])

    def script_text(self, name: str) -> bytes:
        """The stored text of the script's current revision (GET scripts/{name}?op=download)."""
        return self.call("GET", f"scripts/{segment(name)}", [("op", "download")], json_reply=False)

    def create_script(self, name: str, content: bytes, comment: str = "",
                      **fields: str) -> dict:
        return self.call("POST", "scripts/", fields={"name": name, "comment": comment, **fields},
                         files={"script": (name, content)})

    def update_script(self, name: str, content: bytes, comment: str = "", **fields: str) -> dict:
        """PUT scripts/{name}. MAAS applies the tags and timeout embedded in a script only when it
        creates it (src/maasserver/forms/script.py, ScriptForm._clean_script): pass them here."""
        return self.call("PUT", f"scripts/{segment(name)}", fields={"comment": comment, **fields},
                         files={"script": (name, content)})

    def close(self) -> None:
        self.transport.close()


# The retry policy of clients made from the values (tests shorten it).
RETRY = RetryPolicy()


def client_from_values(values: Mapping[str, Any], warn: Callable[[str], None],
                       stop: threading.Event | None = None) -> MAASClient:
    """A client for maas.url with the API key from $MAAS_API_KEY or maas.api_key_file.

    A request in flight, or a wait between retries, ends at once when ``stop`` is set.
    """
    maas = values["maas"]
    (consumer, token, secret), source = load_api_key_with_source(maas, warn)
    plaintext = cleartext_warning(maas["url"])
    if plaintext:
        warn(plaintext)
    return MAASClient(maas["url"], Signer(consumer, token, secret, source), timeout=maas["timeout"],
                      retry=RETRY, stop=stop, max_body=maas["max_response_mib"] * 2**20)


def _json(method: str, shown: str, reply: Response) -> Any:
    """The reply's JSON (None for an empty body); malformed or too deep is kind "malformed"."""
    if not reply.body.strip():
        return None
    try:
        data = json.loads(reply.body)
    except RecursionError:
        too_deep = True
    except ValueError:
        raise MAASError(method, shown, reply.status,
                        f"malformed JSON in the response ({len(reply.body)} bytes)", "malformed") from None
    else:
        too_deep = json_nested_deeper(reply.body)
    if too_deep:
        raise MAASError(method, shown, reply.status, f"JSON nested deeper than {MAX_JSON_DEPTH} levels "
                        f"in the response ({len(reply.body)} bytes)", "malformed")
    return data


def power_address_of(parameters: Mapping[str, Any]) -> str | None:
    address = parameters.get("power_address")
    return address if isinstance(address, str) else None


def _op(params: Iterable[tuple[str, str]] | Mapping[str, Any]) -> str:
    """The op of a request for messages (not the whole query, which may list many ids)."""
    items = list(params.items()) if isinstance(params, Mapping) else list(params)
    ops = [f"op={value}" for key, value in items if key == "op"]
    return ops[0] if ops else ""


def _chunks(items: list[str], cost: Callable[[str], int], budget: int = MAX_QUERY) -> list[list[str]]:
    """items split so that each chunk's total cost stays within budget (at least one item each)."""
    chunks: list[list[str]] = []
    current: list[str] = []
    spent = 0
    for item in items:
        if current and spent + cost(item) > budget:
            chunks.append(current)
            current, spent = [], 0
        current.append(item)
        spent += cost(item)
    if current:
        chunks.append(current)
    return chunks
