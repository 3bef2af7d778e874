"""``maas-kubevirt reconcile``: reconcile cycles until SIGTERM or SIGINT, once, or as a dry run.

With ``reconciler.lease`` the process is a candidate for the site's Lease (:mod:`lease`): it
cycles only while it holds it, asks the lease before every MAAS write, starts each holding
period with a full resync, and releases the Lease when it stops. A dry run takes no part.

Exit codes: 0 converged or nothing to do, 1 some actions (or the cycle) failed, 2 usage or
configuration error (bad values, unreadable API key or kubeconfig, key refused, MAAS too old).
"""

from __future__ import annotations

import signal
import threading
from typing import Any, Sequence

from maas_kubevirt import EXIT_FAILED, EXIT_OK, EXIT_USAGE, lease, seed
from maas_kubevirt.audit import Audit
from maas_kubevirt.console import error, note, table, warn
from maas_kubevirt.maas import MAASAuthError, MAASVersionError, client_from_values
from maas_kubevirt.reconcile import Action, Passwords, Reconciler, Settings


def plan_table(actions: Sequence[Action]) -> str:
    rows = [
        (a.kind, a.system_id or "-", a.hostname or "-", a.vm or "-", a.namespace or "-",
         "-" if a.before is None else a.before, "-" if a.after is None else a.after, a.note)
        for a in actions
    ]
    return table(("ACTION", "SYSTEM_ID", "HOSTNAME", "VM", "NAMESPACE", "BEFORE", "AFTER", "NOTE"), rows)


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


def main(values: dict, args: Any) -> int:
    """``reconcile [--once | --interval S] [--dry-run]``: 0 converged, 1 failures, 2 config."""
    dry_run = bool(getattr(args, "dry_run", False))
    once = bool(getattr(args, "once", False)) or dry_run
    interval = getattr(args, "interval", None) or values["maas"]["interval"]
    settings = Settings.from_values(values)
    passwords = Passwords(seed.load(values))
    stop = threading.Event()
    audit = Audit("" if dry_run else values["maas"].get("audit_log", ""))
    client = client_from_values(values, warn, stop)
    reconciler = Reconciler(client, settings, audit, stop, passwords=passwords)
    # What a restart would forget (commission backoffs, suspects reported), from maas.audit_log.
    reconciler.restore(Audit.read_file(values["maas"].get("audit_log", "")))
    try:
        candidate = None if dry_run else lease.candidate_from_values(values)
    except lease.LeaseConfigError as failure:
        client.close()
        error(str(failure))
        return EXIT_USAGE
    if candidate is not None:
        reconciler.may_write = candidate.held   # asked before every MAAS write
        candidate.start()
    term = 0   # the candidate's holding period the last cycle ran in
    try:
        with _Signals(stop):
            while True:
                if candidate is not None:
                    # Standby: no MAAS request at all; the candidate's thread logs each change.
                    if not candidate.held() and not candidate.wait_held(
                            stop, _once_wait(candidate) if once else None):
                        if once and not stop.is_set():
                            holder = candidate.holder()
                            who = f"held by {holder.holder}" if holder and holder.holder else "not acquired"
                            note(f"lease {candidate.where}: {who}; standby, nothing done")
                        return EXIT_OK
                    if candidate.terms != term:
                        term = candidate.terms
                        if reconciler.log is not None:   # what another holder did meanwhile is unknown here
                            reconciler.log.request_resync("this process now holds the lease")
                try:
                    result = reconciler.cycle(dry_run=dry_run)
                except (MAASAuthError, MAASVersionError) as failure:
                    error(str(failure))
                    return EXIT_USAGE
                if dry_run:
                    if result.error:
                        return EXIT_FAILED
                    changes = [a for a in result.actions if a.changes]
                    if result.actions:
                        print(plan_table(result.actions), flush=True)
                    print(f"{len(changes)} change(s) planned for "
                          f"{len({a.system_id for a in changes if a.system_id})} machine(s); "
                          "dry run: nothing changed", flush=True)
                    return EXIT_OK
                if once:
                    return EXIT_FAILED if result.failed else EXIT_OK
                if candidate is not None and not candidate.held():
                    continue   # lost during the cycle: standby now, not after an interval
                if stop.wait(interval):
                    return EXIT_OK
    finally:
        if candidate is not None:   # no cycle runs any more: the Lease may go at once
            candidate.close(release=True)
        client.close()


def _once_wait(candidate: lease.Candidate) -> float:
    """How long ``--once`` waits for the Lease: enough to take over one that expired or is missing."""
    return candidate.duration + 3 * candidate.retry_period
