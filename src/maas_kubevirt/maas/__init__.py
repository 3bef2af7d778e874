"""A small client for the MAAS REST API 2.0 (docs/explanation/design.md, "MAAS contracts"), one module
per stage:

- ``signing``: the API key ``consumer:token:secret`` (from $MAAS_API_KEY, the systemd
  credential or maas.api_key_file) and the ``Signer`` that signs each attempt with OAuth 1.0
  PLAINTEXT (oauthlib), a fresh nonce and timestamp every time.
- ``transport``: ``Transport`` sends one HTTP request with requests and returns status,
  headers and body, the body capped (``maas.max_response_mib``).
- ``client``: ``MAASClient`` builds the URLs (``<url>/api/2.0/<path>``), runs each attempt in
  a worker thread so that a ``stop`` event (SIGTERM) or the cycle's ``deadline`` ends it within
  a fraction of a second, retries what is worth retrying and turns every failure into a
  ``MAASError``.
- ``endpoints``: one method per API call (each path segment quoted, a system_id checked first).
- ``errors``: ``MAASError`` and its kinds; its message is one line, ``METHOD path: status:
  MAAS's message``, control characters escaped and every secret withheld.
- ``versions``: which MAAS releases work; ``json_depth``: JSON too deep to be MAAS's.

Retries: a read (GET) is retried after a connection error, a timeout or a 503; any request
after a failure that came before it was sent (connection refused, no DNS answer, connect
timeout), and after a 503 or 409 carrying Retry-After, MAAS's word that it did nothing and
wants the request again. A request that changes MAAS (POST, PUT, DELETE) is otherwise sent
once: a failure after it may have reached MAAS (reset, read timeout) surfaces at once with
``in_flight``, and a 503 without Retry-After is final (MAAS 3.6.5 answers a commission that
failed to power on that way, after it started commissioning).

Secrets: the API key is only ever held by the Signer (its repr hides it); the power
parameters MAAS returns are reduced at once by the caller's function (to the address, and to
whether the password is right) and ``power_pass`` is never kept, logged or put into an error
message (bodies of power-parameter responses are withheld; a password sent is scrubbed).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Mapping

from maas_kubevirt.maas.client import (API_PATH, KEY_CHECKS, POLL, READS, MAASClient, RetryPolicy, _json, _op,
                                       _retry_after)
from maas_kubevirt.maas.endpoints import (MAX_QUERY, POWER_PARAMETERS_CHUNK, Endpoints, _chunks,
                                          power_address_of, segment, valid_system_id)
from maas_kubevirt.maas.errors import (MAX_MESSAGE, WITHHELD, MAASAuthError, MAASError, MAASForbidden,
                                       MAASTooLarge, MAASVersionError, _one_line, readable_message, withhold)
from maas_kubevirt.maas.json_depth import MAX_JSON_DEPTH, json_nested_deeper
from maas_kubevirt.maas.signing import (API_KEY_CREDENTIAL, ENV_KEY, KEY_FILE, Signer, cleartext_warning,
                                        load_api_key, load_api_key_with_source, parse_api_key)
from maas_kubevirt.maas.transport import (DEFAULT_MAX_RESPONSE, Response, Transport, TransportError,
                                          _causes, _connection_reason, _never_sent, _too_large)
from maas_kubevirt.maas.versions import (DNS_NAME_REJECTED, MIN_MAAS_VERSION, check_version, nearest_proven, parse_version,
                                        release_key)

# The retry policy of clients made from the values (tests shorten it). It lives here, where
# client_from_values reads it, so that a test setting ``maas.RETRY`` reaches every client made.
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
                      commission_timeout=maas["commission_timeout"], retry=RETRY, stop=stop,
                      max_body=maas["max_response_mib"] * 2**20)


__all__ = [
    "API_KEY_CREDENTIAL", "API_PATH", "DEFAULT_MAX_RESPONSE", "DNS_NAME_REJECTED", "ENV_KEY", "KEY_CHECKS",
    "KEY_FILE", "MAASAuthError", "MAASClient", "MAASError", "MAASForbidden", "MAASTooLarge", "MAASVersionError",
    "MAX_JSON_DEPTH", "MAX_MESSAGE", "MAX_QUERY", "MIN_MAAS_VERSION", "POLL", "POWER_PARAMETERS_CHUNK", "READS",
    "RETRY", "Endpoints", "Response", "RetryPolicy", "Signer", "Transport", "TransportError", "WITHHELD",
    "check_version", "cleartext_warning", "client_from_values", "json_nested_deeper", "load_api_key",
    "load_api_key_with_source", "nearest_proven", "parse_api_key", "parse_version", "release_key", "power_address_of", "readable_message",
    "segment", "valid_system_id", "withhold",
    # not public, but tests and tools name them here
    "_causes", "_chunks", "_connection_reason", "_json", "_never_sent", "_one_line", "_op", "_retry_after",
    "_too_large",
]
