"""Why a server (MAAS, the API server) gave no answer, in a few words, and its URL as messages name it.

Messages say where the request went and why it failed, never what it carried: the URL loses any
``user:password@``, query and fragment, and the cause is named from the exception's type, not
from its text (which may hold headers or a proxy's URL).
"""

from __future__ import annotations

from typing import Iterable
from urllib.parse import urlsplit, urlunsplit

REFUSED = "connection refused"
CLOSED = "connection closed by the server"
TLS = "TLS error"
UNTRUSTED = "TLS error, certificate not trusted"
UNRESOLVED = "cannot resolve the {} name"
FAILED = "connection failed"

_CLOSED = {"ConnectionResetError", "RemoteDisconnected", "ConnectionAbortedError", "IncompleteRead",
           "ProtocolError", "BrokenPipeError"}
_UNTRUSTED = {"SSLCertVerificationError", "CertificateError"}


def shown_url(url: str) -> str:
    """url without credentials, query or fragment: what a message may name."""
    try:
        parts = urlsplit(str(url))
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:
        return "(an unreadable URL)"
    if ":" in host:
        host = f"[{host}]"
    return urlunsplit((parts.scheme, host + port, parts.path, "", ""))


def causes(error: BaseException | None) -> Iterable[BaseException]:
    """error and its causes, outermost first, each once: urllib3 and requests link them by
    args, raise-from, implicit context or ``.reason``, differently from one version to the next."""
    seen = set()
    while isinstance(error, BaseException) and id(error) not in seen:
        seen.add(id(error))
        yield error
        nested = error.args[0] if error.args and isinstance(error.args[0], BaseException) else None
        error = nested or error.__cause__ or error.__context__ or getattr(error, "reason", None)


def reason(error: BaseException, host: str = "host") -> str:
    """A short reason without URLs or headers (the exception text can be long); ``host`` names
    what could not be resolved ("MAAS host")."""
    chain = list(causes(error))
    for cause in chain:
        name = type(cause).__name__
        if name == "ConnectionRefusedError":
            return REFUSED
        if name in _CLOSED:
            return CLOSED
        if name in _UNTRUSTED or name == "SSLError":
            # requests' SSLError wraps urllib3's, which wraps ssl's: the verdict is the innermost.
            return UNTRUSTED if any(_untrusted(c) for c in chain) else TLS
        if name in ("NameResolutionError", "gaierror"):
            return UNRESOLVED.format(host)
    return FAILED


def _untrusted(cause: BaseException) -> bool:
    names = {kind.__name__ for kind in type(cause).__mro__}
    return bool(names & _UNTRUSTED) or "certificate verify failed" in str(cause).lower()


def api_server(host: str, error: BaseException) -> str:
    """``cannot reach the API server at HOST (why)``, with the fix for a certificate not trusted."""
    why = reason(error)
    fix = ("; the kubeconfig's certificate-authority-data must hold the CA that signed it" if why == UNTRUSTED
           else "; check the kubeconfig's server" if why in (REFUSED, FAILED) or why.startswith("cannot resolve")
           else "")
    where = f" at {shown_url(host)}" if host else ""
    return f"cannot reach the API server{where} ({why}){fix}"
