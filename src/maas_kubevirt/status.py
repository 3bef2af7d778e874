"""``maas-kubevirt status``: one row per MAAS machine whose power address is a KubeVirt BMC."""

from __future__ import annotations

from typing import Any

from maas_kubevirt import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from maas_kubevirt.console import error, table, warn
from maas_kubevirt.maas import MAASAuthError, MAASError, client_from_values
from maas_kubevirt.reconcile import Reconciler, Settings, pool_of


def main(values: dict, args: Any) -> int:
    """``status``: one row per matching machine; 1 when MAAS cannot be read, 2 when the key is refused."""
    settings = Settings.from_values(values)
    client = client_from_values(values, warn)
    try:
        reconciler = Reconciler(client, settings)
        try:
            with client.within(settings.cycle_deadline):
                _, _, matches = reconciler.observe()
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
         m.machine.get("status_name"), pool_of(m.machine)[0], m.machine.get("power_state"))
        for m in matches
    ]
    if rows:
        print(table(("VM", "NAMESPACE", "HOSTNAME", "SYSTEM_ID", "STATUS", "POOL", "POWER"), rows),
              flush=True)
    print(f"{len(rows)} MAAS machine(s) with a Redfish power address under {settings.domain}", flush=True)
    return EXIT_OK
