"""``maas-kubevirt reconcile``: reconcile cycles until SIGTERM or SIGINT, once, or as a dry run.

With ``reconciler.lease`` the process is a candidate for the site's Lease (:mod:`lease`): it
cycles only while it holds it, asks the lease before every MAAS write whether that request ends
before a standby may take over, starts each holding period with a full resync, and releases the
Lease when it stops. A dry run takes no part.

Exit codes: 0 converged or nothing to do, 1 some actions (or the cycle) failed, 2 usage or
configuration error (bad values, unreadable API key or kubeconfig, key refused, MAAS too old);
``--dry-run --detailed-exitcode``: 3 (EXIT_PENDING) when changes are pending.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any, Callable, Mapping, Sequence

from maas_kubevirt import EXIT_FAILED, EXIT_OK, EXIT_PENDING, EXIT_USAGE, lease, seed
from maas_kubevirt.audit import Audit
from maas_kubevirt.console import TABLE, WIDE, document, error, note, output_format, table, warn
from maas_kubevirt.maas import MAASAuthError, MAASVersionError, client_from_values
from maas_kubevirt.notify import Notifier
from maas_kubevirt.pools import stage as pool_stage
from maas_kubevirt.pools.access import PoolsConfigError
from maas_kubevirt.pools.plan import RETIRE, TAG, PoolAction
from maas_kubevirt.pools.stage import PoolStage
from maas_kubevirt.rotate import rotator_from_values
from maas_kubevirt.reconcile import Action, Cycle, Passwords, Reconciler, Settings, claim_of

# Seconds a cycle may outlast maas.cycle_deadline before the watchdog should fire: the requests
# in flight end within a poll (maas/client.py POLL), then the audit records are written.
WATCHDOG_MARGIN = 60


def _pool_note(action: PoolAction) -> str:
    """What a pool action's NOTE says: its pool, and the tags it adds or why it retires."""
    if action.kind == TAG:
        return f"pool {action.pool}: tags {', '.join(action.tags)}"
    if action.kind == RETIRE:
        return f"pool {action.pool}: {action.reason}"
    return f"pool {action.pool}: one more spare (its VM is named when it is made)"


def plan_table(actions: Sequence[Action], pool_actions: Sequence[PoolAction] = ()) -> str:
    """The machines' actions, then the pools' (their pool and tags or reason in NOTE)."""
    rows = [
        (a.kind, a.system_id or "-", a.hostname or "-", a.vm or "-", a.namespace or "-",
         "-" if a.before is None else a.before, "-" if a.after is None else a.after, a.note)
        for a in actions
    ]
    rows += [(a.kind, a.system_id or "-", a.hostname or "-", a.vm or "-", a.namespace, "-", "-", _pool_note(a))
             for a in pool_actions]
    return table(("ACTION", "SYSTEM_ID", "HOSTNAME", "VM", "NAMESPACE", "BEFORE", "AFTER", "NOTE"), rows)


def plan_document(actions: Sequence[Action], pool_actions: Sequence[PoolAction], output: str) -> str:
    """The plan as JSON or YAML: each action's fields as the table shows them (labels such as derived
    or placeholder, never a password), each pool action's, and the counts of the summary line."""
    changes = [a for a in actions if a.changes]
    rows = [{"action": a.kind, "system_id": a.system_id, "hostname": a.hostname, "vm": a.vm,
             "namespace": a.namespace, "before": a.before, "after": a.after, "note": a.note,
             "changes": a.changes} for a in actions]
    pools = [{"action": a.kind, "pool": a.pool, "namespace": a.namespace, "vm": a.vm, "system_id": a.system_id,
              "hostname": a.hostname, "tags": list(a.tags), "reason": a.reason} for a in pool_actions]
    summary = {"changes": len(changes), "machines": len({a.system_id for a in changes if a.system_id}),
               "pool_actions": len(pools)}
    return document({"dry_run": True, "actions": rows, "pool_actions": pools, "summary": summary}, output)


def _print_plan(result: Cycle, args: Any) -> int:
    """The dry run's plan as -o says (wide: the table, which leaves no column out and never wraps);
    its exit status (EXIT_PENDING: see the epilog). Every pool action is a change pending; pools
    that could not be read fail the dry run."""
    if result.error:
        return EXIT_FAILED
    changes = [a for a in result.actions if a.changes]
    pool_actions = result.pool_actions
    output = output_format(args)
    if output not in (TABLE, WIDE):
        print(plan_document(result.actions, pool_actions, output), flush=True)
    else:
        if result.actions or pool_actions:
            print(plan_table(result.actions, pool_actions), flush=True)
        print(f"{len(changes)} change(s) planned for "
              f"{len({a.system_id for a in changes if a.system_id})} machine(s)"
              + (f", {len(pool_actions)} for the pools" if pool_actions else "")
              + "; dry run: nothing changed", flush=True)
    if result.pool_failed:
        return EXIT_FAILED
    pending = changes or pool_actions
    return EXIT_PENDING if pending and getattr(args, "detailed_exitcode", False) else EXIT_OK


class _Signals:
    """SIGTERM/SIGINT set the stop event; the loop stops between actions and exits cleanly."""

    def __init__(self, stop: threading.Event):
        self.stop = stop
        self.saved: dict[int, Any] = {}

    def __enter__(self) -> "_Signals":
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                self.saved[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.stop.set()

    def __exit__(self, *exc: Any) -> None:
        for signum, handler in self.saved.items():
            signal.signal(signum, handler)


class _CountedAudit(Audit):
    """The audit log, each record also counted (kind and outcome only) by the metrics: at write,
    which every record goes through (the plan's actions and the reconciler's rotations alike)."""

    def __init__(self, path: str, count: Callable[[str, str], None]):
        super().__init__(path)
        self.count = count

    def write(self, action: str, system_id: str | None, hostname: str | None, before: Any, after: Any,
              outcome: str, reason: str = "", note: str = "", **extra: Any) -> dict:
        self.count(action, outcome)
        return super().write(action, system_id, hostname, before, after, outcome, reason, note, **extra)


def cycle_outcome(result: Cycle, stopped: bool) -> str:
    """ok, failed (some action failed), error (the cycle gave up) or interrupted (a signal)."""
    if result.outcome.interrupted or (result.error and stopped):
        return "interrupted"
    if result.error:
        return "error"
    # A cycle that could derive no password (the cluster unreadable) is no success either.
    return "failed" if result.outcome.failed or result.withheld else "ok"


def machine_states(reconciler: Reconciler) -> dict[str, int]:
    """How many machines are in each state of maas_kubevirt_machines, from what the reconciler
    knows after its cycle (every redfish machine it has read; never a name, only counts)."""
    domain = reconciler.settings.domain
    waiting = set(reconciler.backoff.waiting())
    ours: set[str] = set()
    claimants: dict[tuple[str, str], set[str]] = {}
    suspects: set[str] = set()
    held: set[str] = set()
    right: set[str] = set()
    for system_id, (_, power) in reconciler.known.items():
        claimed, canonical = claim_of(power.address, domain)
        if claimed is None and power.held is None:
            continue
        ours.add(system_id)
        if power.held is not None:
            held.add(system_id)
        if claimed is not None and not canonical:
            suspects.add(system_id)
        elif claimed is not None:
            claimants.setdefault(claimed, set()).add(system_id)
            if power.converged:
                right.add(system_id)
    duplicates = {sid for group in claimants.values() if len(group) > 1 for sid in group}
    pending = reconciler.pending & ours
    return {"ours": len(ours), "pending": len(pending), "waiting": len(waiting & ours),
            "suspect": len(suspects), "duplicate": len(duplicates), "held_password": len(held),
            "converged": len(right - pending - waiting - duplicates - held)}


def status_line(number: int, outcome: str, seconds: float, result: Cycle, states: Mapping[str, int],
                interval: float) -> str:
    """systemctl status's line: counts and fixed words only, nothing MAAS wrote, no name."""
    changes = sum(1 for a in result.actions if a.changes)
    when = time.strftime("%H:%M:%S UTC", time.gmtime())
    return (f"cycle {number} at {when}: {outcome} in {seconds:.1f} s, {changes} change(s) planned, "
            f"{result.outcome.ok} done, {result.outcome.failed} failed; machines: {states.get('ours', 0)} "
            f"ours, {states.get('converged', 0)} converged, {states.get('waiting', 0)} waiting, "
            f"{states.get('suspect', 0) + states.get('duplicate', 0)} refused; next in {interval:g} s")


def cycle_line(number: int, outcome: str, seconds: float, result: Cycle, states: Mapping[str, int]) -> str:
    """The foreground's line per cycle: counts, changes and errors in fixed words, no name."""
    changes = sum(1 for a in result.actions if a.changes)
    errors = result.outcome.failed + (1 if result.error else 0) + (1 if result.withheld else 0)
    return (f"cycle {number}: {outcome} in {seconds:.1f} s; {states.get('ours', 0)} machine(s): "
            f"{states.get('converged', 0)} converged, {states.get('waiting', 0)} waiting, "
            f"{states.get('suspect', 0) + states.get('duplicate', 0)} refused; {changes} change(s): "
            f"{result.outcome.ok} done, {result.outcome.failed} failed; {errors} error(s)")


def _serve_metrics(values: dict, dry_run: bool) -> Any:
    """The metrics, served on maas.metrics_address when set (not for a dry run); None when off.
    Raises OSError when the address cannot be listened on."""
    address = values["maas"].get("metrics_address", "")
    if not address or dry_run:
        return None
    from maas_kubevirt import metrics   # only then: prometheus_client is not needed otherwise

    served = metrics.Metrics()
    host, port = served.serve(address)
    note(f"metrics at http://{f'[{host}]' if ':' in host else host}:{port}/metrics")
    return served


def _wait_held(candidate: lease.Candidate, stop: threading.Event, timeout: float | None,
               notifier: Notifier) -> bool:
    """candidate.wait_held, in slices that feed the watchdog while standing by."""
    if notifier.slice is None:
        return candidate.wait_held(stop, timeout)
    end = None if timeout is None else time.monotonic() + timeout
    while True:
        step = notifier.slice if end is None else min(notifier.slice, max(0.0, end - time.monotonic()))
        if candidate.wait_held(stop, step):
            return True
        if stop.is_set() or (end is not None and time.monotonic() >= end):
            return False
        notifier.alive()


def _pool_stage(values: dict, client: Any, audit: Audit, metrics: Any, reconciler: Reconciler,
                seed_text: str) -> PoolStage | None:
    """The pools' stage of each cycle, writing only while the reconciler may; None without pools."""
    stage = pool_stage.from_values(values, client, audit, seed_text, reconciler.settings.domain, metrics,
                                   lambda: reconciler.may_write is None or reconciler.may_write())
    if stage is not None and metrics is not None:
        metrics.pools(pool.name for pool in stage.pools)
    return stage


def main(values: dict, args: Any) -> int:
    """``reconcile [--once | --interval S] [--dry-run]``: 0 converged, 1 failures, 2 config."""
    dry_run = bool(getattr(args, "dry_run", False))
    once = bool(getattr(args, "once", False)) or dry_run
    interval = getattr(args, "interval", None) or values["maas"]["interval"]
    settings = Settings.from_values(values)
    seed_text = seed.load(values)
    passwords = Passwords(seed_text)
    stop = threading.Event()
    notifier = Notifier()
    if settings.cycle_deadline is not None:
        # Only WATCHDOG=1 between cycles proves the loop alive, so the longest legitimate cycle
        # must fit in the watchdog's timeout, and the first one in the start-up's.
        longest = settings.cycle_deadline + WATCHDOG_MARGIN
        if notifier.watchdog and notifier.watchdog < longest:
            warn(f"the unit's WatchdogSec ({notifier.watchdog:g} s) is shorter than maas.cycle_deadline "
                 f"+ {WATCHDOG_MARGIN} s: raised to {longest:g} s for this run")
            notifier.extend_watchdog(longest)
        notifier.extend_start(longest)
    try:
        metrics = _serve_metrics(values, dry_run)
    except OSError as failure:
        error(f"maas.metrics_address {values['maas']['metrics_address']}: cannot listen: "
              f"{failure.strerror or failure}")
        return EXIT_USAGE
    audit_log = "" if dry_run else values["maas"].get("audit_log", "")
    audit = Audit(audit_log) if metrics is None else _CountedAudit(audit_log, metrics.action)
    client = client_from_values(values, warn, stop)
    if metrics is not None:
        client.transport.observer = metrics.maas_request
    reconciler = Reconciler(client, settings, audit, stop, passwords=passwords)
    # What a restart would forget (commission backoffs, suspects reported), from maas.audit_log.
    reconciler.restore(Audit.read_file(values["maas"].get("audit_log", "")))
    reconciler.values_path = getattr(args, "values", None)
    if not dry_run and lease.audit_unshared(values):
        warn(f"{lease.audit_unshared(values)}: {lease.AUDIT_SHARED_FIX}")
    try:
        candidate = None if dry_run else lease.candidate_from_values(values)
        # Every VM's credential generation, and its bump after a possible leak, on the same access.
        reconciler.rotator = rotator_from_values(values)
    except lease.LeaseConfigError as failure:
        client.close()
        if metrics is not None:
            metrics.close()
        error(str(failure))
        return EXIT_USAGE
    try:
        reconciler.pool_stage = _pool_stage(values, client, audit, metrics, reconciler, seed_text)
    except PoolsConfigError as failure:
        client.close()
        if metrics is not None:
            metrics.close()
        error(str(failure))
        return EXIT_USAGE
    if candidate is not None:
        reconciler.may_write = candidate.may_write   # asked with each write's timeout
        if metrics is not None:
            metrics.leader(candidate.held)
        candidate.start()
    term = 0   # the candidate's holding period the last cycle ran in
    number = 0
    try:
        with _Signals(stop):
            while True:
                if candidate is not None:
                    # Standby: no MAAS request at all; the candidate's thread logs each change.
                    if not candidate.held():
                        notifier.ready("standby: another reconciler holds the lease, or none does yet")
                    if not candidate.held() and not _wait_held(
                            candidate, stop, _once_wait(candidate) if once else None, notifier):
                        if once and not stop.is_set():
                            holder = candidate.holder()
                            who = f"held by {holder.holder}" if holder and holder.holder else "not acquired"
                            note(f"lease {candidate.where}: {who}; standby, nothing done")
                        return EXIT_OK
                    if candidate.terms != term:
                        term = candidate.terms
                        if reconciler.log is not None:   # what another holder did meanwhile is unknown here
                            reconciler.log.request_resync("this process now holds the lease")
                began = time.monotonic()
                try:
                    result = reconciler.cycle(dry_run=dry_run)
                except (MAASAuthError, MAASVersionError) as failure:
                    error(str(failure))
                    return EXIT_USAGE
                number += 1
                seconds = time.monotonic() - began
                outcome = cycle_outcome(result, stop.is_set())
                states = machine_states(reconciler)
                if metrics is not None:
                    metrics.cycle(outcome, began, seconds, states, reconciler.resyncs)
                # READY=1 after the first complete cycle, and WATCHDOG=1 after each: fed only from
                # this thread, so a cycle stuck in a MAAS request stops feeding it.
                notifier.ready(status_line(number, outcome, seconds, result, states, interval))
                if not dry_run and not notifier.address:
                    # In the foreground, one line per cycle; the service's is its STATUS= above
                    # (systemctl status), not a journal line every interval.
                    note(cycle_line(number, outcome, seconds, result, states))
                if dry_run:
                    return _print_plan(result, args)
                if once:
                    return EXIT_FAILED if result.failed else EXIT_OK
                if candidate is not None and not candidate.held():
                    continue   # lost during the cycle: standby now, not after an interval
                if notifier.wait(stop, interval):
                    return EXIT_OK
    finally:
        notifier.stopping()
        if candidate is not None:   # no cycle runs any more: the Lease may go at once
            candidate.close(release=True)
        client.close()
        if metrics is not None:
            metrics.close()


def _once_wait(candidate: lease.Candidate) -> float:
    """How long ``--once`` waits for the Lease: enough to take over one that expired or is missing."""
    return candidate.duration + 3 * candidate.retry_period
