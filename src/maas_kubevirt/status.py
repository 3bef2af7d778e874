"""``maas-kubevirt status``: one row per MAAS machine whose power address names a KubeVirt VM's
BMC (its address shown, a look-alike marked suspect), whether its password is the derived one,
why its commission waits if it does, and one line per duplicate claim; with ``pools``, one row
per warm pool (the pool stage's plan, as a dry run: nothing written); with reconciler.lease,
who holds the site's Lease and since when; each VM whose password may have leaked and the command
that rotates it. ``-o json``/``-o yaml`` print the same as one document; ``--watch`` prints it
again every ``--interval`` seconds until interrupted."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from maas_kubevirt import EXIT_FAILED, EXIT_OK, EXIT_USAGE, lease, rotate, seed
from maas_kubevirt.audit import Audit
from maas_kubevirt.console import (TABLE, WIDE, YAML, document, error, escape_controls, output_format, table,
                                   warn)
from maas_kubevirt.maas import MAASAuthError, MAASError, client_from_values
from maas_kubevirt.pools import stage as pool_stage
from maas_kubevirt.pools.access import PoolsConfigError
from maas_kubevirt.reconcile import (SKIP, Passwords, Reconciler, Settings, claims, duplicate_note, needs_pools,
                                     plan, pool_of, rotate_command)

SUSPECT_MARK = " (suspect: not the bare host)"
# How the plan's skip note of a pool it will not move a machine into reads.
POOL_REFUSED = "was not created by maas-kubevirt"
HEADERS = ("VM", "NAMESPACE", "HOSTNAME", "SYSTEM_ID", "STATUS", "POOL", "POWER", "PASSWORD", "ADDRESS", "WAITING")
NO_AUDIT_LOG = "commission backoffs are shown from maas.audit_log, which is not set"
POOL_HEADERS = ("POOL", "NAMESPACE", "READY", "ON_THE_WAY", "ALLOCATED", "FAILED", "RETIRING", "TOTAL/MAX", "WANTED")


@dataclass(frozen=True)
class Row:
    """One matching machine as status shows it. ``password`` is the judgement (right,
    placeholder, ...), never a password; the address is the only power parameter."""

    vm: str
    namespace: str
    hostname: str | None
    system_id: str
    status: str | None
    pool: str | None
    power: str | None
    password: str
    address: str
    suspect: bool
    waiting: str | None       # why its commission waits, None when it does not


@dataclass
class Report:
    """Everything status prints, as data: the table and --json are two renderings of it."""

    domain: str
    rows: list[Row] = field(default_factory=list)
    duplicates: list[dict] = field(default_factory=list)
    pool_refused: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    lease: dict | None = None
    # VMs whose password may have leaked and is not rotated yet (from maas.audit_log).
    rotations: list[dict] = field(default_factory=list)
    # Machines an enlistment switched to another power type, their VM's credentials taken back
    # (from maas.audit_log) and still of that type: MAAS has no power control of the VM.
    switched: list[dict] = field(default_factory=list)
    # One dict per warm pool (``pool_rows``); why they could not be read, None when they were or there are none.
    pools: list[dict] = field(default_factory=list)
    pools_unread: str | None = None

    @property
    def suspects(self) -> int:
        return sum(row.suspect for row in self.rows)


WATCH_INTERVAL = 5   # seconds, as kubectl get -w's habit of a glance that stays current
CLEAR = "\033[H\033[2J"   # what watch(1) does between two prints on a terminal


def main(values: dict, args: Any) -> int:
    """``status [-o FORMAT] [--watch [--interval SECONDS]]``: one row per matching machine; 1 when
    MAAS cannot be read, 2 when the key is refused."""
    if not getattr(args, "watch", False):
        return show(values, args)
    return watch(values, args, getattr(args, "interval", None) or WATCH_INTERVAL)


def watch(values: dict, args: Any, interval: float) -> int:
    """show() every interval seconds until interrupted (0); a MAAS that does not answer is said
    and asked again next time, a configuration error (2) ends it."""
    try:
        tty = os.isatty(sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        tty = False
    output = output_format(args)
    # Ctrl-C must end a watch even when the shell that started it ignores SIGINT (a background
    # job inherits SIG_IGN, and Python then installs no handler of its own).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        first = True
        while True:
            if tty and output in (TABLE, WIDE):
                print(CLEAR, end="")
            elif not first:
                # Piped: one document after another, as kubectl get -w appends.
                print("---" if output == YAML else "", flush=True)
            first = False
            if show(values, args) == EXIT_USAGE:
                return EXIT_USAGE
            time.sleep(interval)
    except KeyboardInterrupt:   # Ctrl-C is how a watch ends, as watch(1)'s
        return EXIT_OK


def show(values: dict, args: Any) -> int:
    """One observation of MAAS, printed as -o says."""
    settings = Settings.from_values(values)
    generations, unread = rotate.read_generations(values) if lease.configured(values) else ({}, "")
    seed_text = seed.load(values)
    passwords = Passwords(seed_text, generations or {})
    client = client_from_values(values, warn)
    audit_log = values["maas"].get("audit_log", "")
    try:
        reconciler = Reconciler(client, settings, passwords=passwords)
        # The running reconciler's commission backoffs, from its audit records.
        reconciler.restore(Audit.read_file(audit_log))
        try:
            with client.within(settings.cycle_deadline):
                reconciler.check_version()
                machines, power, matches = reconciler.observe()
                pools = client.pools() if needs_pools(matches) else []
                warm, warm_unread = pool_rows(values, client, settings.domain, seed_text)
        except MAASAuthError as failure:
            error(str(failure))
            return EXIT_USAGE
        except MAASError as failure:
            error(str(failure))
            return EXIT_FAILED
    finally:
        client.close()
    report = build_report(values, settings, reconciler, machines, power, matches, pools, getattr(args, "values", None))
    report.pools, report.pools_unread = warm, warm_unread
    if generations is None:
        report.notes.append(f"credential generations not read ({unread}): a rotated VM's password shows as other")
    output = output_format(args)
    # wide is the table: it leaves out no column and never wraps.
    print(render_table(report) if output in (TABLE, WIDE) else document(report_document(report), output),
          flush=True)
    return EXIT_OK


def build_report(values: dict, settings: Settings, reconciler: Reconciler, machines: list, power: dict,
                 matches: list, pools: list, values_path: str | None = None) -> Report:
    """The rows, duplicate claims, refused pools and lease of one observation."""
    waiting = reconciler.backoff.pending()
    report = Report(domain=settings.domain)
    for m in matches:
        system_id = m.machine["system_id"]
        report.rows.append(Row(
            vm=m.vm, namespace=m.namespace, hostname=m.machine.get("hostname"), system_id=system_id,
            status=m.machine.get("status_name"), pool=pool_of(m.machine)[0], power=m.machine.get("power_state"),
            password=power[system_id].password, address=power[system_id].address or "", suspect=not m.canonical,
            waiting=waiting[system_id].why() if system_id in waiting else None,
        ))
    if not values["maas"].get("audit_log", "") and any(row.status == "New" for row in report.rows):
        report.notes.append(NO_AUDIT_LOG)
    for (vm, namespace), group in sorted(claims(matches)[1].items()):
        report.duplicates.append({
            "vm": vm, "namespace": namespace, "note": duplicate_note(vm, namespace, group),
            "machines": [{"system_id": g.machine.get("system_id"), "hostname": g.machine.get("hostname")}
                         for g in group],
        })
    for action in plan(machines, power, pools, settings):
        if action.kind == SKIP and POOL_REFUSED in action.note:
            report.pool_refused.append({"system_id": action.system_id, "hostname": action.hostname,
                                        "pool": action.after, "note": action.note})
    for (vm, namespace), exposure in sorted(reconciler.needing_rotation().items()):
        report.rotations.append({
            "vm": vm, "namespace": namespace, "system_id": exposure.system_id, "generation": exposure.generation,
            "command": rotate_command(vm, namespace, values_path),
        })
    records = {m.get("system_id"): m for m in machines}
    for system_id, switched in reconciler.still_switched(machines).items():
        vm, namespace = switched.who
        report.switched.append({"vm": vm, "namespace": namespace, "system_id": system_id,
                                "hostname": records[system_id].get("hostname"), "power_type": switched.power_type,
                                "fix": switched.fix()})
    if lease.configured(values):
        report.lease = lease_state(values)
    return report


def pool_rows(values: dict, client: Any, domain: str, seed_text: str) -> tuple[list[dict], str | None]:
    """Each warm pool's counts from the pool stage's observe and plan, as a dry run on the pools'
    kubeconfig; ([], why) when they cannot be read, ([], None) without pools."""
    from maas_kubevirt.kube import KubeError

    try:
        stage = pool_stage.from_values(values, client, Audit(), seed_text, domain)
    except PoolsConfigError as failure:
        return [], str(failure)
    if stage is None:
        return [], None
    try:
        stage.run(dry_run=True)
    except (KubeError, MAASError) as failure:
        return [], f"the pools cannot be read: {failure}"
    finally:
        stage.cluster.close()
    namespaces = {pool.name: pool.namespace for pool in stage.pools}
    return [{"pool": t.pool, "namespace": namespaces[t.pool], "ready": t.ready, "on_the_way": t.on_the_way,
             "allocated": t.held, "failed": t.failed, "retiring": t.retiring, "total": t.total, "max": t.max,
             "wanted": t.wanted, "creating": t.creating, "waiting": list(t.waiting)} for t in stage.tallies], None


def pool_table(report: Report) -> list[str]:
    """The pools' table after the machines', or the line that says why there is none."""
    if report.pools_unread is not None:
        return [escape_controls(f"pools: {report.pools_unread}")]
    if not report.pools:
        return []
    return [table(POOL_HEADERS, [(p["pool"], p["namespace"], p["ready"], p["on_the_way"], p["allocated"], p["failed"],
                                  p["retiring"], f"{p['total']}/{p['max']}", p["wanted"]) for p in report.pools])]


def table_rows(report: Report) -> list[tuple]:
    """The table's cells of each row: the address as ascii() shows it (non-ASCII escaped), a
    suspect marked after it, ``-`` when not waiting."""
    return [
        (row.vm, row.namespace, row.hostname, row.system_id, row.status, row.pool, row.power, row.password,
         ascii(row.address)[1:-1] + (SUSPECT_MARK if row.suspect else ""), row.waiting or "-")
        for row in report.rows
    ]


def summary_line(report: Report) -> str:
    suspects = report.suspects
    return (f"{len(report.rows) - suspects} MAAS machine(s) with a Redfish power address under {report.domain}"
            + (f", and {suspects} suspect(s) that only imitate one" if suspects else ""))


def render_table(report: Report) -> str:
    lines = [table(HEADERS, table_rows(report))] if report.rows else []
    lines.append(summary_line(report))
    lines += pool_table(report)
    lines += report.notes
    lines += [escape_controls(f"duplicate claim: {d['note']}") for d in report.duplicates]
    lines += [escape_controls(f"{p['system_id']} {p['hostname']}: {p['note']}") for p in report.pool_refused]
    lines += [rotation_line(r) for r in report.rotations]
    lines += [escape_controls(switched_line(s)) for s in report.switched]
    if report.lease is not None:
        lines.append(escape_controls(report.lease["line"]))
    return "\n".join(lines)


def rotation_line(rotation: dict) -> str:
    return (f"possible leak: {rotation['vm']}.{rotation['namespace']}: its password (generation "
            f"{rotation['generation']}) sat beside another address on {rotation['system_id']} and was taken "
            f"back; rotate it: {rotation['command']}")


def switched_line(switched: dict) -> str:
    return (f"power type switched: {switched['vm']}.{switched['namespace']}: machine {switched['system_id']} "
            f"({switched['hostname']}) is {switched['power_type']!a} since an enlistment switched it; its derived "
            f"credentials were taken back, so MAAS cannot power the VM; {switched['fix']}")


def report_document(report: Report) -> dict:
    """The report as -o json and -o yaml print it (both escape every control character MAAS may send)."""
    suspects = report.suspects
    return {
        "domain": report.domain,
        "rows": [asdict(row) for row in report.rows],
        "duplicates": report.duplicates,
        "pool_refused": report.pool_refused,
        "notes": report.notes,
        "lease": report.lease,
        "rotations": report.rotations,
        "switched": report.switched,
        "pools": report.pools,
        "pools_unread": report.pools_unread,
        "summary": {
            "machines": len(report.rows) - suspects, "suspects": suspects,
            "waiting": sum(row.waiting is not None for row in report.rows),
            "duplicates": len(report.duplicates), "pool_refused": len(report.pool_refused),
            "rotations": len(report.rotations), "switched": len(report.switched),
        },
    }


def lease_state(values: dict) -> dict:
    """The site's Lease: namespace, name, holder, acquired, renewed, whether the holder is this
    host, the error when it cannot be read, and ``line``, the sentence the table prints."""
    from maas_kubevirt.kube import KubeError

    namespace, name = lease.namespace_of(values), values["reconciler"]["lease"]["name"]
    state: dict[str, Any] = {"namespace": namespace, "name": name, "exists": None, "holder": None,
                             "acquired": None, "renewed": None, "this_host": None, "error": None}
    where = f"lease {namespace}/{name}"
    try:
        record = lease.read_record(values)
    except (lease.LeaseConfigError, KubeError) as failure:
        state["error"] = str(failure)
        state["line"] = f"{where}: cannot be read: {failure}"
        return state
    state["exists"] = record is not None
    line = f"{where}: {lease.describe(record, values['reconciler']['lease']['duration'])}"
    if record is not None:
        state.update(holder=record.holder or None, acquired=record.acquired, renewed=record.renewed)
    if record is not None and record.holder:
        state["this_host"] = here = lease.host_of(record.holder) == socket.gethostname()
        line += " (this host)" if here else " (another host: a reconciler running here stands by)"
    state["line"] = line
    return state
