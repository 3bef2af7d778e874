"""The election itself: one :class:`Candidate` per process, renewing the Lease from a thread beside
the work, as client-go's elector (k8s.io/client-go/tools/leaderelection/leaderelection.go:
``acquire``, ``renew``, ``tryAcquireOrRenew``, ``release``). Kept from client-go:

- every write names the ``metadata.resourceVersion`` it read, so of two candidates writing at
  once one gets 409 Conflict and loses;
- a standby times the holder with its own monotonic clock, never with the timestamps in the
  record, and by the record's ``leaseDurationSeconds`` (``isLeaseValid``), not its own setting:
  it may take the lease over once it has seen no change for that long (its own ``duration``
  when the record has no positive one). Hosts configured with different durations therefore
  each wait as long as the holder promised;
- the timings and their rules (duration > renew_deadline > 1.2 x retry_period), retries with
  jitter while waiting and every retry_period while holding, a request timeout of half the
  renew deadline and at least 1 s (resourcelock/interface.go, NewFromKubeconfig), and the
  release on a clean stop (holderIdentity empty, leaseDurationSeconds 1).

Stricter than client-go, on purpose, because a holder that writes after losing would write
to MAAS twice:

- :meth:`Candidate.held` is true only while the last successful write of the Lease began less
  than renew_deadline ago (monotonic clock). A holder cut off from the API server therefore
  stops writing ``duration - renew_deadline`` seconds before any standby may take over;
- :meth:`Candidate.may_write` with a request's timeout is true only when that request, started
  now, also ends before any standby may take over: no request outlasts the lease;
- a holder that reads another holder's name stops at once;
- a missing Lease counts as held by someone unknown, seen now: a standby creates it only after
  ``duration``, while a holder that finds it deleted makes it again at its next retry;
- losing is not the end: the candidate goes on as a standby and may hold it again later.
"""

from __future__ import annotations

import random
import threading
import time
from datetime import datetime
from typing import Any, Callable

from maas_kubevirt.console import note
from maas_kubevirt.lease.record import API_VERSION, Record, _sendable, _utc_now, parse_time, record_of

JITTER_FACTOR = 1.2       # client-go's wait.JitterUntil factor in acquire
POLL = 0.1                # seconds between two looks of a waiting loop at held()


def _failure(error: BaseException) -> tuple[int | None, str]:
    """(HTTP status or None, one short line) of a failed request; never its headers or body."""
    status = getattr(error, "status", None)
    if isinstance(status, int) and status > 0:
        reason = " ".join(str(getattr(error, "reason", "") or "").split())[:80]
        hint = {401: ": the kubeconfig's token was refused (expired?); make a new one",
                403: ": forbidden; apply the bundle's Role and RoleBinding for the reconciler"}.get(status, "")
        return status, f"{status} {reason}{hint}".strip()
    return None, f"no answer from the API server ({type(error).__name__})"


_MISSING = Record("\0missing")    # what a standby saw when the Lease did not exist


class Candidate:
    """One candidate for the Lease ``namespace/name``, renewing it from a thread of its own.

    ``api`` is a ``CoordinationV1Api`` (or anything with its read/create/replace_namespaced_lease).
    ``clock`` is monotonic seconds, ``wall`` the time written into the record, ``jitter`` a
    number in [0, 1) drawn per retry while waiting: each can be fixed by a test.
    """

    def __init__(self, api: Any, namespace: str, name: str, identity: str, *, duration: float = 40,
                 renew_deadline: float = 10, retry_period: float = 2,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], datetime] = _utc_now,
                 jitter: Callable[[], float] = random.random, say: Callable[[str], None] = note):
        # The whole seconds written as leaseDurationSeconds are what every standby waits for.
        lease_seconds = int(duration)
        if not lease_seconds > renew_deadline > JITTER_FACTOR * retry_period > 0:
            raise ValueError("expected duration (whole seconds) > renew_deadline > 1.2 x retry_period > 0")
        self.api, self.namespace, self.name, self.identity = api, namespace, name, identity
        self.duration, self.renew_deadline, self.retry_period = duration, renew_deadline, retry_period
        self.lease_seconds = lease_seconds
        self.clock, self.wall, self.jitter, self.say = clock, wall, jitter, say
        # resourcelock.NewFromKubeconfig: the lock's requests time out at renewDeadline/2, >= 1 s.
        seconds = max(1.0, renew_deadline / 2)
        self.request_timeout = (seconds, seconds)
        self._lock = threading.Lock()
        self._renewed: float | None = None     # clock() when our last successful write began
        self._observed: Record | None = None   # the last record read or written (or _MISSING)
        self._observed_at = 0.0                # clock() when it was first seen as it is
        self._problem: str | None = None       # why the last attempt failed, if it did
        self._announced: tuple | None = None
        self._was_held = False
        self.terms = 0                         # holding periods begun so far
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def where(self) -> str:
        return f"{self.namespace}/{self.name}"

    # --- what the reconciler asks --------------------------------------------------------------
    def held(self) -> bool:
        """True only while the last successful write of the Lease began less than renew_deadline ago."""
        return self.may_write()

    def may_write(self, seconds: float | None = None) -> bool:
        """Whether a request that may take ``seconds`` may start now: held, and it ends before any
        standby may take over (leaseDurationSeconds after the renewal); None: held now."""
        with self._lock:
            if self._renewed is None:
                return False
            now = self.clock()
            return now - self._renewed < self.renew_deadline and (
                seconds is None or now + seconds <= self._renewed + self.lease_seconds)

    def holder(self) -> Record | None:
        """The record last read or written (None before the first read or while it is missing)."""
        with self._lock:
            return None if self._observed in (None, _MISSING) else self._observed

    def wait_held(self, stop: threading.Event, timeout: float | None = None) -> bool:
        """Wait until this candidate holds the Lease (True), or until stop or timeout (False)."""
        deadline = None if timeout is None else self.clock() + timeout
        while not stop.is_set():
            if self.held():
                return True
            if deadline is not None and self.clock() >= deadline:
                return False
            stop.wait(POLL)
        return False

    # --- one round, as client-go's tryAcquireOrRenew -------------------------------------------
    def attempt(self) -> bool:
        """Read the Lease, then acquire or renew it when this candidate may; True when it holds it."""
        began = self.clock()
        try:
            current: Record | None = record_of(self.api.read_namespaced_lease(
                self.name, self.namespace, _request_timeout=self.request_timeout))
        except Exception as error:  # noqa: BLE001 - the API client raises its own and urllib3's
            status, why = _failure(error)
            if status != 404:
                return self._failed(f"cannot read it: {why}")
            current = None
        seen = self.clock()
        with self._lock:
            ours = self._observed is not None and self._observed.holder == self.identity
            if current is None:
                if not ours:
                    # Gone, or not made yet: a holder makes it again at its next retry, so a
                    # standby waits a whole duration before it makes it itself.
                    if self._observed is not _MISSING:
                        self._observed, self._observed_at = _MISSING, seen
                    if seen < self._observed_at + self.duration:
                        self._problem = None
                        return False
                previous = None
            else:
                if self._observed is None or self._observed.spec != current.spec:
                    self._observed, self._observed_at = current, seen
                if current.holder and current.holder != self.identity:
                    if seen < self._observed_at + current.lasts(self.duration):
                        self._renewed = None    # someone else holds it: not one more write
                        self._problem = None
                        return False
                previous = current
        return self._write(previous, began)

    def _body(self, previous: Record | None, holder: str, duration: int) -> dict:
        now = _sendable(self.wall())
        same = previous is not None and previous.holder == holder and holder
        transitions = previous.transitions if previous is not None else 0
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if previous is not None:
            metadata["resourceVersion"] = previous.version
        return {"apiVersion": API_VERSION, "kind": "Lease", "metadata": metadata, "spec": {
            "holderIdentity": holder, "leaseDurationSeconds": duration,
            "acquireTime": _sendable(parse_time(previous.acquired) or self.wall()) if same else now,
            "renewTime": now,
            "leaseTransitions": transitions if same or not holder or previous is None else transitions + 1,
        }}

    def _write(self, previous: Record | None, began: float) -> bool:
        body = self._body(previous, self.identity, self.lease_seconds)
        try:
            if previous is None:
                written = self.api.create_namespaced_lease(self.namespace, body, _request_timeout=self.request_timeout)
            else:
                written = self.api.replace_namespaced_lease(self.name, self.namespace, body,
                                                            _request_timeout=self.request_timeout)
        except Exception as error:  # noqa: BLE001
            status, why = _failure(error)
            # 409: another candidate wrote first (Conflict on a replace, AlreadyExists on a create).
            return self._failed("another candidate wrote it first" if status == 409 else f"cannot write it: {why}")
        record = record_of(written)
        with self._lock:
            if self._renewed is None or self.clock() - self._renewed >= self.renew_deadline:
                self.terms += 1     # a new holding period: another may have held it in between
            self._renewed = began
            self._observed, self._observed_at = record, self.clock()
            self._problem = None
        return True

    def _failed(self, why: str) -> bool:
        with self._lock:
            self._problem = why
        return False

    def release(self) -> bool:
        """Give the Lease up after the last write (a clean stop), as client-go's release: holderIdentity
        empty and leaseDurationSeconds 1, so that a standby takes it at its next retry."""
        with self._lock:
            ours = self._observed is not None and self._observed.holder == self.identity
            self._renewed = None
        if not ours:
            return False
        try:
            current = record_of(self.api.read_namespaced_lease(self.name, self.namespace,
                                                               _request_timeout=self.request_timeout))
            if current.holder != self.identity:
                return False
            self.api.replace_namespaced_lease(self.name, self.namespace, self._body(current, "", 1),
                                              _request_timeout=self.request_timeout)
        except Exception as error:  # noqa: BLE001 - then a standby waits one duration instead
            self.say(f"lease {self.where}: not released ({_failure(error)[1]}): "
                     f"a standby takes over within {self.duration:g} s")
            return False
        self.say(f"lease {self.where}: released")
        return True

    # --- the thread beside the work -------------------------------------------------------------
    def start(self) -> "Candidate":
        self._thread = threading.Thread(target=self._run, name=f"lease-{self.name}", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._closing.is_set():
            try:
                self.attempt()
            except Exception as error:  # noqa: BLE001 - the thread must outlive any surprise
                self._failed(f"{type(error).__name__}")
            self.announce()
            # Holding: every retry_period (client-go's renew); waiting: jittered (its acquire).
            pause = self.retry_period if self.held() else self.retry_period * (1 + JITTER_FACTOR * self.jitter())
            self._closing.wait(pause)

    def close(self, release: bool = True) -> None:
        """Stop the thread; then, when asked and still the holder, release the Lease."""
        self._closing.set()
        if self._thread is not None:
            self._thread.join(self.request_timeout[0] * 2 + 1)
        if release:
            self.release()

    def announce(self) -> None:
        """One log line per change of state: holding, lost, standby (and why)."""
        held = self.held()
        with self._lock:
            observed, problem = self._observed, self._problem
        if held:
            state, line = ("holding",), f"lease {self.where}: held by this process ({self.identity}): it writes to MAAS"
        else:
            if observed is _MISSING:
                detail = f"the Lease does not exist; made after {self.duration:g} s unless a holder makes it again"
            elif observed is not None and observed.holder and observed.holder != self.identity:
                detail = f"held by {observed.holder}"
            elif observed is not None and not observed.holder:
                detail = "released; taking it"
            else:
                detail = "not renewed in time"
            if problem:
                detail = problem
            state = ("standby", detail)
            if self._was_held:
                line = (f"lease {self.where}: lost ({detail}); no further MAAS write from this process, standby")
            else:
                line = f"lease {self.where}: standby, {detail}"
        self._was_held = held
        if state != self._announced:
            self._announced = state
            self.say(line)
