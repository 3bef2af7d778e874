"""One active reconciler per site: leader election on a ``coordination.k8s.io/v1`` Lease.

Written on the official client's ``CoordinationV1Api`` after client-go's elector
(k8s.io/client-go/tools/leaderelection/leaderelection.go: ``acquire``, ``renew``,
``tryAcquireOrRenew``, ``release``), because python3-kubernetes 22.6 (Debian 12) has no Lease
lock and its elector goes on leading after it loses the lease. Kept from client-go:

- every write names the ``metadata.resourceVersion`` it read, so of two candidates writing at
  once one gets 409 Conflict and loses;
- a standby times the holder with its own monotonic clock, never with the timestamps in the
  record: it may take the lease over once it has seen no change for ``duration`` seconds;
- the timings and their rules (duration > renew_deadline > 1.2 x retry_period), retries with
  jitter while waiting and every retry_period while holding, a request timeout of half the
  renew deadline and at least 1 s (resourcelock/interface.go, NewFromKubeconfig), and the
  release on a clean stop (holderIdentity empty, leaseDurationSeconds 1).

Stricter than client-go, on purpose, because a holder that writes after losing would write
to MAAS twice:

- :meth:`Candidate.held` is true only while the last successful write of the Lease began less
  than renew_deadline ago (monotonic clock). A holder cut off from the API server therefore
  stops writing ``duration - renew_deadline`` seconds before any standby may take over;
- a holder that reads another holder's name stops at once;
- a missing Lease counts as held by someone unknown, seen now: a standby creates it only after
  ``duration``, while a holder that finds it deleted makes it again at its next retry;
- losing is not the end: the candidate goes on as a standby and may hold it again later.
"""

from __future__ import annotations

import os
import random
import socket
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Mapping

from maas_kubevirt.console import note

API_VERSION = "coordination.k8s.io/v1"
JITTER_FACTOR = 1.2       # client-go's wait.JitterUntil factor in acquire
POLL = 0.1                # seconds between two looks of a waiting loop at held()


class LeaseConfigError(Exception):
    """reconciler.lease.kubeconfig cannot be used (a configuration error: exit 2)."""


def holder_identity() -> str:
    """This host and this process, as holderIdentity names the holder."""
    return f"{socket.gethostname()}_{os.getpid()}"


def micro_time(moment: datetime) -> str:
    """A MicroTime the API server accepts: six fractional digits, always (RFC3339Micro in
    k8s.io/apimachinery/pkg/apis/meta/v1/micro_time.go; datetime.isoformat drops them at .000000)."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _sendable(moment: datetime) -> str:
    """micro_time of moment, never at .000000: the current client re-serialises a body through
    datetime.isoformat, which drops a zero fraction, and the API server then refuses the write."""
    return micro_time(moment if moment.microsecond else moment.replace(microsecond=1))


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


def _time_text(value: Any) -> str | None:
    if isinstance(value, datetime):
        return micro_time(value if value.tzinfo else value.replace(tzinfo=timezone.utc))
    return value if isinstance(value, str) and value else None


@dataclass(frozen=True)
class Record:
    """A Lease's spec as read, and the resourceVersion a write must name."""

    holder: str
    duration: int | None = None
    acquired: str | None = None
    renewed: str | None = None
    transitions: int = 0
    version: str = ""

    @property
    def spec(self) -> tuple:
        return self.holder, self.duration, self.acquired, self.renewed, self.transitions


def record_of(lease: Any) -> Record:
    """A Lease as ``CoordinationV1Api`` returns it (a V1Lease) or as the API server's JSON."""
    if isinstance(lease, Mapping):
        metadata, spec = lease.get("metadata") or {}, lease.get("spec") or {}
        fields = (spec.get("holderIdentity"), spec.get("leaseDurationSeconds"), spec.get("acquireTime"),
                  spec.get("renewTime"), spec.get("leaseTransitions"), metadata.get("resourceVersion"))
    else:
        metadata, spec = getattr(lease, "metadata", None), getattr(lease, "spec", None)
        fields = tuple(getattr(spec, name, None) for name in (
            "holder_identity", "lease_duration_seconds", "acquire_time", "renew_time", "lease_transitions")) + (
            getattr(metadata, "resource_version", None),)
    holder, duration, acquired, renewed, transitions, version = fields
    return Record(holder if isinstance(holder, str) else "",
                  duration if isinstance(duration, int) and not isinstance(duration, bool) else None,
                  _time_text(acquired), _time_text(renewed),
                  transitions if isinstance(transitions, int) and not isinstance(transitions, bool) else 0,
                  version if isinstance(version, str) else "")


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

    def __init__(self, api: Any, namespace: str, name: str, identity: str, *, duration: float = 15,
                 renew_deadline: float = 10, retry_period: float = 2,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], datetime] = _utc_now,
                 jitter: Callable[[], float] = random.random, say: Callable[[str], None] = note):
        if not duration > renew_deadline > JITTER_FACTOR * retry_period > 0:
            raise ValueError("expected duration > renew_deadline > 1.2 x retry_period > 0")
        self.api, self.namespace, self.name, self.identity = api, namespace, name, identity
        self.duration, self.renew_deadline, self.retry_period = duration, renew_deadline, retry_period
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
        with self._lock:
            return self._renewed is not None and self.clock() - self._renewed < self.renew_deadline

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
                    if seen < self._observed_at + self.duration:
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
        body = self._body(previous, self.identity, int(self.duration))
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


# --- from the values ---------------------------------------------------------------------------


def lease_values(values: Mapping[str, Any]) -> Mapping[str, Any]:
    return values["reconciler"]["lease"]


def configured(values: Mapping[str, Any]) -> bool:
    """Whether the reconcilers of this site elect a holder (reconciler.lease.kubeconfig is set)."""
    return bool(lease_values(values)["kubeconfig"])


def namespace_of(values: Mapping[str, Any]) -> str:
    return lease_values(values)["namespace"] or values["kubernetes"]["system_namespace"]


def kubeconfig_path(values: Mapping[str, Any]) -> str:
    """The systemd credential ``kubeconfig`` when the service was handed one, else the values' path."""
    from maas_kubevirt.paths import credential_path

    given = credential_path("kubeconfig")
    return str(given) if given is not None else lease_values(values)["kubeconfig"]


def coordination_api(kubeconfig: str) -> Any:
    """A CoordinationV1Api on the kubeconfig's current context, read as kubectl reads it."""
    import yaml
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config

    where = "reconciler.lease.kubeconfig"
    try:
        with open(kubeconfig, encoding="utf-8") as handle:
            yaml.safe_load(handle)
        configuration = k8s_client.Configuration()
        k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration,
                                    persist_config=False)
    except OSError as error:
        raise LeaseConfigError(f"{where}: cannot read {kubeconfig!r}: {error.strerror or error}") from None
    except (yaml.YAMLError, UnicodeDecodeError):
        raise LeaseConfigError(f"{where}: {kubeconfig!r} is not a YAML kubeconfig") from None
    except (k8s_config.ConfigException, ValueError, KeyError, TypeError) as error:
        reason = " ".join(str(error).split())[:200] or type(error).__name__
        raise LeaseConfigError(f"{where}: {kubeconfig!r} cannot be used: {reason}") from None
    # One attempt per request (urllib3 would retry 3 times): the candidate's own loop retries.
    configuration.retries = 0
    return k8s_client.CoordinationV1Api(k8s_client.ApiClient(configuration))


def candidate_from_values(values: Mapping[str, Any], api: Any | None = None,
                          say: Callable[[str], None] = note) -> Candidate | None:
    """This process's candidate for the site's Lease, or None when no lease is configured."""
    if not configured(values):
        return None
    lease = lease_values(values)
    return Candidate(api if api is not None else coordination_api(kubeconfig_path(values)),
                     namespace_of(values), lease["name"], holder_identity(), duration=lease["duration"],
                     renew_deadline=lease["renew_deadline"], retry_period=lease["retry_period"], say=say)


# --- reading it, for status and doctor --------------------------------------------------------


def read_record(values: Mapping[str, Any]) -> Record | None:
    """The site's Lease read with a plain GET (kube.Cluster); None when it does not exist.
    Raises LeaseConfigError (the kubeconfig) or kube.KubeError (the request)."""
    from maas_kubevirt.kube import Cluster, KubeConfigError

    try:
        cluster = Cluster(kubeconfig_path(values))
    except KubeConfigError as failure:
        raise LeaseConfigError(str(failure).replace("--kubeconfig", "reconciler.lease.kubeconfig", 1)) from None
    try:
        found = cluster.get(f"/apis/{API_VERSION}/namespaces/{namespace_of(values)}/leases/"
                            f"{lease_values(values)['name']}")
    finally:
        cluster.close()
    return None if found is None else record_of(found)


def token_expiry(kubeconfig: str) -> datetime | None:
    """When the kubeconfig's bearer token ends: the ``exp`` claim of a ServiceAccount token (a JWT,
    read, not verified); None for any other credential. The token itself never leaves here."""
    import base64
    import json

    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config

    try:
        configuration = k8s_client.Configuration()
        k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration,
                                    persist_config=False)
        # "BearerToken" in current clients, "authorization" in Debian's 22.6 (as kube.Cluster reads it).
        header = (configuration.get_api_key_with_prefix("BearerToken")
                  or configuration.get_api_key_with_prefix("authorization") or "")
        parts = header.split(" ")[-1].split(".")
        if len(parts) != 3:
            return None
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
        expires = claims.get("exp") if isinstance(claims, dict) else None
        if not isinstance(expires, (int, float)) or isinstance(expires, bool):
            return None
        return datetime.fromtimestamp(expires, timezone.utc)
    except Exception:  # noqa: BLE001 - no expiry to report, never a reason to fail
        return None


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def describe(record: Record | None, duration: float, now: datetime | None = None) -> str:
    """Who holds the Lease and since when, in one line (``status`` and doctor)."""
    if record is None:
        return "does not exist: no reconciler has taken part yet"
    now = now or _utc_now()
    renewed = parse_time(record.renewed)
    ago = f" ({max(0, round((now - renewed).total_seconds()))} s ago)" if renewed else ""
    if not record.holder:
        return f"not held: released at {record.renewed or '?'}"
    text = f"held by {record.holder} since {record.acquired or '?'}, renewed {record.renewed or '?'}{ago}"
    if renewed is not None and (now - renewed).total_seconds() > duration:
        text += f": not renewed for more than {duration:g} s, so no reconciler is active"
    return text


def expired(record: Record | None, duration: float, now: datetime | None = None) -> bool:
    """Whether nobody holds the Lease now (missing, released, or not renewed for duration), by
    the record's own renewTime: for a report, never for the election (clocks differ)."""
    if record is None or not record.holder:
        return True
    renewed = parse_time(record.renewed)
    return renewed is None or ((now or _utc_now()) - renewed).total_seconds() > duration
