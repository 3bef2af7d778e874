"""The API key: where it is read from, how it is parsed, and the Signer that uses it."""

from __future__ import annotations

import ipaddress
import os
import stat
from typing import Any, Callable, Mapping
from urllib.parse import urlsplit

import oauthlib.oauth1

from maas_kubevirt.paths import credential_path
from maas_kubevirt.values import ValuesError

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
