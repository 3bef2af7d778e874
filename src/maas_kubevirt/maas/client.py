"""MAASClient: the URL, one interruptible attempt, the retries and the cycle's deadline."""

from __future__ import annotations

import email.utils
import json
import random
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping
from urllib.parse import urlencode

from maas_kubevirt.maas.endpoints import Endpoints
from maas_kubevirt.maas.errors import (MAASAuthError, MAASError, MAASForbidden, MAASTooLarge,
                                       not_maas_message, readable_message, unreachable_message)
from maas_kubevirt.maas.json_depth import MAX_JSON_DEPTH, json_nested_deeper
from maas_kubevirt.maas.signing import Signer
from maas_kubevirt.unreachable import shown_url
from maas_kubevirt.maas.transport import (DEFAULT_MAX_RESPONSE, Response, Transport, TransportError,
                                          _too_large)

API_PATH = "api/2.0/"
# How often a request in flight looks at the stop event and the deadline.
POLL = 0.1


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


# Requests that only read; any other method may change MAAS and is not repeated blindly.
READS = ("GET", "HEAD")
# Where a 403 means the key itself is refused: MAAS answers version/ to anyone and whoami to
# any user (src/maasserver/api/users.py, UsersHandler.whoami), so a 403 there is not about
# one object. Elsewhere a 403 is about that request (admin_method, RBAC on a pool).
KEY_CHECKS = ("version/", "users/?op=whoami")


class MAASClient(Endpoints):
    """The MAAS API calls the reconciler needs. ``url`` is the region URL, e.g. http://host:5240/MAAS/.

    Several threads may call it at once; ``stop`` and ``deadline`` end every thread's requests.
    """

    def __init__(
        self,
        url: str,
        signer: Signer,
        *,
        timeout: float = 30.0,
        commission_timeout: float = 300.0,
        transport: Transport | None = None,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], bool | None] | None = None,
        stop: threading.Event | None = None,
        max_body: int = DEFAULT_MAX_RESPONSE,
    ):
        base = url.rstrip("/") + "/"
        self.shown = shown_url(base)        # maas.url as messages name it: no credentials
        self.base = base if base.endswith("/" + API_PATH) else base + API_PATH
        self.signer = signer
        self.timeout = float(timeout)
        # An attempt of commission() waits this long instead (see Endpoints.commission).
        self.commission_timeout = float(commission_timeout)
        self.max_body = max_body
        self.transport = transport or Transport(max_body=max_body)
        self.retry = retry or RetryPolicy()
        # Set by a signal handler: a request in flight and a wait between retries end at once.
        self.stop = stop or threading.Event()
        # sleep(seconds) may return True to say "stop now" (a signal arrived).
        self.sleep = sleep or self.stop.wait
        # time.monotonic() by which the current cycle's requests must be done (None: no limit).
        # Like stop, read by every thread's requests: within() is for the cycle's thread.
        self.deadline: float | None = None
        # Attempts sent, by every thread.
        self.requests = 0
        self._counting = threading.Lock()

    def __repr__(self) -> str:
        return f"MAASClient({self.shown!r})"

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
    def _send(self, method: str, shown: str, url: str, multipart: dict[str, Any] | None,
              timeout: float) -> Response:
        """One attempt in a worker thread, so that the stop event and the deadline end it even
        while a DNS lookup, a connect or a read blocks. An abandoned attempt finishes (or
        times out) on its own, on its own connection; its result is dropped."""
        remaining = self._remaining(method, shown, timeout)
        outcome: dict[str, Any] = {}
        done = threading.Event()
        headers = self.signer.headers(method, url)
        transport = self.transport

        def attempt() -> None:
            try:
                outcome["reply"] = transport.send(method, url, headers, multipart, min(timeout, remaining))
            except BaseException as error:  # noqa: BLE001 - handed to the caller's thread
                outcome["error"] = error
            finally:
                done.set()

        worker = threading.Thread(target=attempt, name="maas-request", daemon=True)
        worker.start()
        while not done.wait(POLL):
            if self.stop.is_set():
                raise MAASError(method, shown, None, "stopped by a signal during the request",
                                "interrupted", in_flight=True)
            if self.deadline is not None and time.monotonic() >= self.deadline:
                raise MAASError(method, shown, None, "the cycle's deadline (maas.cycle_deadline) "
                                "passed during the request", "deadline", in_flight=True)
        if "error" in outcome:
            raise outcome["error"]
        reply = outcome["reply"]
        if len(reply.body) > self.max_body:
            raise TransportError("too-large", _too_large(self.max_body, len(reply.body)))
        return reply

    def _remaining(self, method: str, shown: str, timeout: float) -> float:
        if self.deadline is None:
            return timeout
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
        timeout: float | None = None,
    ) -> Any:
        """One request, with the retries the package describes; ``timeout`` bounds each attempt
        (default: the client's)."""
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
                with self._counting:
                    self.requests += 1
                reply = self._send(method, shown, url, multipart, self.timeout if timeout is None else timeout)
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
                failure = MAASError(method, shown, None, unreachable_message(str(error), self.shown), error.kind)
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
                if _everywhere(path) and (reply.status == 404 or 300 <= reply.status < 400):
                    message = not_maas_message(message, self.shown)
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

    def close(self) -> None:
        self.transport.close()


def _everywhere(path: str) -> bool:
    """Whether every MAAS answers path: a collection (version/, machines/, scripts/), not one
    object in it, whose 404 means only that the object is gone."""
    return "/" not in path.strip("/")


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


def _op(params: Iterable[tuple[str, str]] | Mapping[str, Any]) -> str:
    """The op of a request for messages (not the whole query, which may list many ids)."""
    items = list(params.items()) if isinstance(params, Mapping) else list(params)
    ops = [f"op={value}" for key, value in items if key == "op"]
    return ops[0] if ops else ""
