"""Prometheus metrics of ``reconcile``: a private registry, the scrape endpoint, and what is counted.

Names follow Prometheus' naming rules (https://prometheus.io/docs/practices/naming/): one prefix,
base units (seconds), ``_total`` on counters. Labels take values from small fixed sets only: never
a system_id, hostname, address, VM or namespace, and nothing MAAS wrote (its messages are free
text); no secret ever reaches this module.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from socketserver import ThreadingMixIn
from typing import Any, Callable, Iterable, Mapping
from urllib.parse import urlsplit
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app

PREFIX = "maas_kubevirt_"

# The MAAS API path (after /api/2.0/) -> its endpoint family: a fixed set, so that a system_id,
# a script name or a query never becomes a label value.
FAMILIES = (
    (re.compile(r"machines/\Z"), "machines"),
    (re.compile(r"machines/[^/]+/"), "machine"),
    (re.compile(r"version/\Z"), "version"),
    (re.compile(r"users/"), "users"),
    (re.compile(r"nodes/\Z"), "nodes"),
    (re.compile(r"events/\Z"), "events"),
    (re.compile(r"resourcepools/"), "pools"),
    (re.compile(r"scripts/"), "scripts"),
    (re.compile(r"regioncontrollers/"), "regioncontrollers"),
    (re.compile(r"maas/\Z"), "config"),
)
METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE")
# What the transport reports when there was no HTTP status (TransportError.kind).
FAILURES = ("connection", "timeout", "too-large")
# Action kinds and outcomes as the reconciler writes them in audit records (reconcile/plan.py,
# reconcile/apply.py); anything else is counted as "other" rather than trusted as a label.
KINDS = ("create-pool", "set-password", "reset-password", "rename", "move-pool", "commission",
         "skip", "duplicate-claim", "suspect-address", "rotate")
OUTCOMES = ("ok", "failed", "skipped", "unknown", "refused")
# The machine states of maas_kubevirt_machines.
STATES = ("ours", "converged", "pending", "waiting", "suspect", "duplicate", "held_password")
CYCLE_OUTCOMES = ("ok", "failed", "error", "interrupted")
# Per pool (the values' pool names, a set the administrator fixes): its machines by state after
# the last cycle, and what the pool stage did (pools/plan.py, pools/apply.py).
POOL_STATES = ("ready", "on_the_way", "held", "failed", "retiring", "total", "max", "wanted")
POOL_KINDS = ("create-vm", "tag-machine", "retire-vm")
POOL_OUTCOMES = ("ok", "failed", "withdrawn")
# From an idle event-driven cycle (two small requests) to a full resync of 10,000 machines and
# the default maas.cycle_deadline (600 s).
CYCLE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200)
# One MAAS request: milliseconds for the event log, up to maas.commission_timeout (300 s).
REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


def family(url: str) -> str:
    """The endpoint family of a MAAS API URL ("other" for any path not listed in FAMILIES)."""
    path = urlsplit(url).path
    _, found, tail = path.partition("/api/2.0/")
    if found:
        for pattern, name in FAMILIES:
            if pattern.match(tail):
                return name
    return "other"


def code_of(status: int | None, failure: str | None) -> str:
    """The ``code`` label: the HTTP status, or why there was none."""
    if status is not None:
        return str(status) if 100 <= status <= 599 else "other"
    return failure if failure in FAILURES else "other"


def _one_of(value: Any, allowed: Iterable[str]) -> str:
    return value if isinstance(value, str) and value in allowed else "other"


class Metrics:
    """Every metric of one reconcile process, in a registry of its own (not the global one, so
    that no library's or test's metric joins it and two instances never clash)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.registry = CollectorRegistry(auto_describe=True)
        self.clock = clock
        r = self.registry
        self.cycles = Counter(PREFIX + "cycles", "Reconcile cycles, by outcome: ok, failed (some "
                              "action failed), error (the cycle gave up, e.g. MAAS unreachable), "
                              "interrupted (stopped by a signal).", ["outcome"], registry=r)
        self.cycle_seconds = Histogram(PREFIX + "cycle_duration_seconds", "How long each reconcile "
                                       "cycle took.", buckets=CYCLE_BUCKETS, registry=r)
        self.requests = Counter(PREFIX + "maas_requests", "MAAS API requests (each attempt), by "
                                "method, endpoint family and HTTP status code (or connection, "
                                "timeout, too-large when there was none).",
                                ["method", "endpoint", "code"], registry=r)
        self.request_seconds = Histogram(PREFIX + "maas_request_duration_seconds", "How long each "
                                         "MAAS API request took, answered or not.",
                                         ["method", "endpoint"], buckets=REQUEST_BUCKETS, registry=r)
        self.actions = Counter(PREFIX + "actions", "Reconciler actions as audited, by kind and "
                               "outcome.", ["kind", "outcome"], registry=r)
        self.machines = Gauge(PREFIX + "machines", "Machines by state after the last cycle: ours "
                              "(an address naming a VM, or a derived password held), converged, "
                              "pending (changes planned), waiting (a commission backing off), "
                              "suspect (a look-alike address), duplicate (claiming an identity "
                              "another machine claims too), held_password (a derived password "
                              "its address no longer names, to be reset).", ["state"], registry=r)
        self.last_success = Gauge(PREFIX + "last_success_timestamp_seconds", "Unix time of the end "
                                  "of the last cycle in which nothing failed.", registry=r)
        self.last_cycle = Gauge(PREFIX + "last_cycle_timestamp_seconds", "Unix time of the end "
                                "of the last cycle, whatever its outcome.", registry=r)
        self.lag = Gauge(PREFIX + "event_log_lag_seconds", "Seconds since the reconciler last read "
                         "MAAS's event log (or listed every machine) to its end: how old its view "
                         "of MAAS is.", registry=r)
        self.lag.set_function(self._lag)
        self._observed: float | None = None
        self.resyncs = Gauge(PREFIX + "full_resyncs", "Full resyncs (every machine listed) since "
                             "the process started.", registry=r)
        for state in STATES:
            self.machines.labels(state).set(0)
        for outcome in CYCLE_OUTCOMES:
            self.cycles.labels(outcome)
        self.server: WSGIServer | None = None
        self.pool_names: tuple[str, ...] = ()

    # --- what the transport reports --------------------------------------------------------
    def maas_request(self, method: str, url: str, status: int | None, failure: str | None,
                     seconds: float) -> None:
        """One MAAS request (the transport's observer): the URL only gives its family."""
        method, endpoint = _one_of(method.upper(), METHODS), family(url)
        self.requests.labels(method, endpoint, code_of(status, failure)).inc()
        self.request_seconds.labels(method, endpoint).observe(max(0.0, seconds))

    # --- what the loop reports -------------------------------------------------------------
    def action(self, kind: str, outcome: str) -> None:
        self.actions.labels(_one_of(kind, KINDS), _one_of(outcome, OUTCOMES)).inc()

    def cycle(self, outcome: str, began: float, seconds: float, states: Mapping[str, int],
              resyncs: int) -> None:
        """One cycle ended: ``began`` is its start (self.clock), ``states`` machine counts."""
        outcome = _one_of(outcome, CYCLE_OUTCOMES)
        self.cycles.labels(outcome).inc()
        self.cycle_seconds.observe(max(0.0, seconds))
        self.last_cycle.set_to_current_time()
        if outcome == "ok":
            self.last_success.set_to_current_time()
        if outcome in ("ok", "failed"):   # the plan was made: MAAS was read to the end of its log
            self._observed = began
            for state in STATES:
                self.machines.labels(state).set(states.get(state, 0))
        self.resyncs.set(resyncs)

    def _lag(self) -> float:
        return float("nan") if self._observed is None else max(0.0, self.clock() - self._observed)

    def leader(self, held: Callable[[], bool]) -> None:
        """With reconciler.lease: 1 while this process holds the Lease, read at each scrape."""
        gauge = Gauge(PREFIX + "lease_leader", "1 while this process holds the reconciler Lease "
                      "(reconciler.lease), else 0.", registry=self.registry)
        gauge.set_function(lambda: 1.0 if held() else 0.0)

    def pools(self, names: Iterable[str]) -> None:
        """The pools of the values file: their series exist from the start, at zero."""
        self.pool_names = tuple(names)
        r = self.registry
        self.pool_machines = Gauge(PREFIX + "pool_machines", "Each pool's machines after the last cycle, by "
                                   "state: ready, on_the_way (VM made, enlisting, New, Commissioning), held (a "
                                   "user's), failed, retiring (released, being recreated), total (VMs), and "
                                   "the pool's max and wanted (ready) from the values.", ["pool", "state"],
                                   registry=r)
        self.pool_actions = Counter(PREFIX + "pool_actions", "What the pool stage did, by pool, kind "
                                    "(create-vm, tag-machine, retire-vm) and outcome.", ["pool", "kind", "outcome"],
                                    registry=r)
        for name in self.pool_names:
            for state in POOL_STATES:
                self.pool_machines.labels(name, state).set(0)

    def pool_tallies(self, tallies: Iterable[Any]) -> None:
        for tally in tallies:
            if tally.pool in self.pool_names:
                for state in POOL_STATES:
                    self.pool_machines.labels(tally.pool, state).set(getattr(tally, state))

    def pool_action(self, pool: str, kind: str, outcome: str) -> None:
        if pool in self.pool_names:
            self.pool_actions.labels(pool, _one_of(kind, POOL_KINDS), _one_of(outcome, POOL_OUTCOMES)).inc()

    # --- the scrape endpoint ---------------------------------------------------------------
    def serve(self, address: str) -> tuple[str, int]:
        """Listen on ``host:port`` (maas.metrics_address) from a daemon thread; the bound address.

        Raises OSError when it cannot listen (the port taken, the address not local)."""
        host, port = split_address(address)
        server_class = _Server6 if ":" in host else _Server
        self.server = make_server(host, port, make_wsgi_app(self.registry), server_class=server_class,
                                  handler_class=_Quiet)
        threading.Thread(target=self.server.serve_forever, args=(0.5,), name="metrics",
                         daemon=True).start()
        return host, self.server.server_address[1]

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` -> (host, port); ValueError when it is neither."""
    match = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\d{1,5})|([^\s:\[\]]+):(\d{1,5})", address)
    if not match:
        raise ValueError(address)
    host, port = (match[1], match[2]) if match[1] is not None else (match[3], match[4])
    if int(port) > 65535:
        raise ValueError(address)
    return host, int(port)


class _Server(ThreadingMixIn, WSGIServer):
    """One thread per scrape, so that a slow scraper holds no other; none outlives the process."""
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Quiet(WSGIRequestHandler):
    """No line per scrape on stderr (the journal)."""

    def log_message(self, format: str, *args: Any) -> None:
        pass
