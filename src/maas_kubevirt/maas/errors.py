"""What a failed request raises, and MAAS's error bodies as one readable line with no secret."""

from __future__ import annotations

import html
import json
import re
from typing import Iterable
from urllib.parse import quote, quote_plus

from maas_kubevirt import unreachable
from maas_kubevirt.console import escape_controls
from maas_kubevirt.maas.json_depth import MAX_JSON_DEPTH, json_nested_deeper

MAX_MESSAGE = 300


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


EXAMPLE_URL = "http://HOST:5240/MAAS/"
_FIXES = {
    unreachable.REFUSED: (f"nothing listens there: check maas.url's host and port (e.g. {EXAMPLE_URL}) and "
                         "that MAAS's region runs"),
    unreachable.UNTRUSTED: "set REQUESTS_CA_BUNDLE to the file of the CA that signed MAAS's certificate",
    unreachable.TLS: ("is maas.url https:// on MAAS's plain-HTTP port? MAAS serves HTTPS on port 5443 after "
                      "`maas config-tls enable`; a private CA goes in REQUESTS_CA_BUNDLE"),
    unreachable.UNRESOLVED.format("MAAS host"): "check the host name in maas.url and this host's DNS",
    unreachable.FAILED: "check maas.url's host and port, and the network to it",
    "no connection in time": "check maas.url's host and port, and the network to it",
}


def unreachable_message(reason: str, url: str) -> str:
    """A connection failure's reason, the URL it was for (no credentials) and the fix, on one line."""
    fix = _FIXES.get(reason)
    return f"{reason} at {url}" + (f": {fix}" if fix else "")


def not_maas_message(message: str, url: str) -> str:
    """A 404 (or redirect) where every MAAS answers: maas.url is not the region's API URL."""
    fix = ("maas.url must end in /MAAS/" if not url.rstrip("/").endswith("/MAAS")
           else "maas.url must be the region's URL")
    return f"{message}: no MAAS API at {url}: {fix} (e.g. {EXAMPLE_URL})"
