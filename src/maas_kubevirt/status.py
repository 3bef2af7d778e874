"""``maas-kubevirt status``: one row per MAAS machine whose power address is a KubeVirt BMC,
whether its password is the derived one, and one line per duplicate claim."""

from __future__ import annotations

from typing import Any

from maas_kubevirt import EXIT_FAILED, EXIT_OK, EXIT_USAGE, seed
from maas_kubevirt.console import error, escape_controls, table, warn
from maas_kubevirt.maas import MAASAuthError, MAASError, client_from_values
from maas_kubevirt.reconcile import Passwords, Reconciler, Settings, claims, duplicate_note, pool_of


def main(values: dict, args: Any) -> int:
    """``status``: one row per matching machine; 1 when MAAS cannot be read, 2 when the key is refused."""
    settings = Settings.from_values(values)
    passwords = Passwords(seed.load(values))
    client = client_from_values(values, warn)
    try:
        reconciler = Reconciler(client, settings, passwords=passwords)
        try:
            with client.within(settings.cycle_deadline):
                _, power, matches = reconciler.observe()
        except MAASAuthError as failure:
            error(str(failure))
            return EXIT_USAGE
        except MAASError as failure:
            error(str(failure))
            return EXIT_FAILED
    finally:
        client.close()
    rows = [
        (m.vm, m.namespace, m.machine.get("hostname"), m.machine.get("system_id"),
         m.machine.get("status_name"), pool_of(m.machine)[0], m.machine.get("power_state"),
         power[m.machine["system_id"]].password)
        for m in matches
    ]
    if rows:
        print(table(("VM", "NAMESPACE", "HOSTNAME", "SYSTEM_ID", "STATUS", "POOL", "POWER", "PASSWORD"),
                    rows), flush=True)
    print(f"{len(rows)} MAAS machine(s) with a Redfish power address under {settings.domain}", flush=True)
    for (vm, namespace), group in sorted(claims(matches)[1].items()):
        print(escape_controls(f"duplicate claim: {duplicate_note(vm, namespace, group)}"), flush=True)
    return EXIT_OK
