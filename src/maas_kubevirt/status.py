"""``maas-kubevirt status``: one row per MAAS machine whose power address names a KubeVirt VM's
BMC (its address shown, a look-alike marked suspect), whether its password is the derived one,
why its commission waits if it does, and one line per duplicate claim; with reconciler.lease,
who holds the site's Lease and since when."""

from __future__ import annotations

import socket
from typing import Any

from maas_kubevirt import EXIT_FAILED, EXIT_OK, EXIT_USAGE, lease, seed
from maas_kubevirt.audit import Audit
from maas_kubevirt.console import error, escape_controls, table, warn
from maas_kubevirt.maas import MAASAuthError, MAASError, client_from_values
from maas_kubevirt.reconcile import (SKIP, Passwords, Reconciler, Settings, claims, duplicate_note, needs_pools,
                                     plan, pool_of)

SUSPECT_MARK = " (suspect: not the bare host)"
# How the plan's skip note of a pool it will not move a machine into reads.
POOL_REFUSED = "was not created by maas-kubevirt"


def main(values: dict, args: Any) -> int:
    """``status``: one row per matching machine; 1 when MAAS cannot be read, 2 when the key is refused."""
    settings = Settings.from_values(values)
    passwords = Passwords(seed.load(values))
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
        except MAASAuthError as failure:
            error(str(failure))
            return EXIT_USAGE
        except MAASError as failure:
            error(str(failure))
            return EXIT_FAILED
    finally:
        client.close()
    waiting = reconciler.backoff.pending()
    rows = []
    for m in matches:
        system_id = m.machine["system_id"]
        address = power[system_id].address or ""
        rows.append((
            m.vm, m.namespace, m.machine.get("hostname"), system_id, m.machine.get("status_name"),
            pool_of(m.machine)[0], m.machine.get("power_state"), power[system_id].password,
            ascii(address)[1:-1] + ("" if m.canonical else SUSPECT_MARK),
            waiting[system_id].why() if system_id in waiting else "-",
        ))
    if rows:
        print(table(("VM", "NAMESPACE", "HOSTNAME", "SYSTEM_ID", "STATUS", "POOL", "POWER", "PASSWORD",
                     "ADDRESS", "WAITING"), rows), flush=True)
    suspects = sum(not m.canonical for m in matches)
    print(f"{len(rows) - suspects} MAAS machine(s) with a Redfish power address under {settings.domain}"
          + (f", and {suspects} suspect(s) that only imitate one" if suspects else ""), flush=True)
    if not audit_log and any(m.machine.get("status_name") == "New" for m in matches):
        print("commission backoffs are shown from maas.audit_log, which is not set", flush=True)
    for (vm, namespace), group in sorted(claims(matches)[1].items()):
        print(escape_controls(f"duplicate claim: {duplicate_note(vm, namespace, group)}"), flush=True)
    for action in plan(machines, power, pools, settings):
        if action.kind == SKIP and POOL_REFUSED in action.note:
            print(escape_controls(f"{action.system_id} {action.hostname}: {action.note}"), flush=True)
    if lease.configured(values):
        print(escape_controls(lease_line(values)), flush=True)
    return EXIT_OK


def lease_line(values: dict) -> str:
    """``lease NS/NAME: held by HOST_PID since T, renewed T2 (N s ago)``, or why it cannot be read."""
    from maas_kubevirt.kube import KubeError

    where = f"lease {lease.namespace_of(values)}/{values['reconciler']['lease']['name']}"
    try:
        record = lease.read_record(values)
    except (lease.LeaseConfigError, KubeError) as failure:
        return f"{where}: cannot be read: {failure}"
    line = f"{where}: {lease.describe(record, values['reconciler']['lease']['duration'])}"
    if record is not None and record.holder:
        # holderIdentity is <hostname>_<pid> (lease.holder_identity).
        here = record.holder.rpartition("_")[0] == socket.gethostname()
        line += " (this host)" if here else " (another host: a reconciler running here stands by)"
    return line
