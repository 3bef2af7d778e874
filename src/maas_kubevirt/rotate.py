"""``maas-kubevirt rotate VM.NAMESPACE``: a new credential generation for one VM, by hand; and the
reconciler's rotator, both on the cluster access of ``reconciler.lease``.

Kyverno re-derives the VM's ``<vm>-bmc`` Secret from the new generation within seconds, and the
reconciler, which reads every generation each cycle, sets the new user and password in MAAS once
``ROTATION_SETTLE`` has passed. Exit codes: 0 rotated, 1 the cluster refused or did not answer,
2 usage or configuration error.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from maas_kubevirt import EXIT_FAILED, EXIT_OK, EXIT_USAGE, identity, kubeconfigs, lease, rotations
from maas_kubevirt.audit import Audit
from maas_kubevirt.console import error, note, warn
from maas_kubevirt.reconcile import ROTATE, ROTATION_SETTLE

# Refused, not merely warned: without a lease the reconciler reads no generation, so after a bump
# Kyverno derives the new password while the reconciler keeps putting the old one into MAAS, and
# MAAS can no longer power the VM. A workstation's kubeconfig reaches the ConfigMap, not the reconciler.
NEEDS_LEASE = ("the values have no reconciler.lease: the reconciler reads each VM's credential generation "
               "only through the lease's cluster access, so after this rotation it would set the old password "
               "back in MAAS while Kyverno derives the new one, and MAAS could no longer power the VM; "
               "$KUBECONFIG or --kubeconfig does not change that. Configure the lease (docs/how-to/ha.md), "
               "then rotate with the site's values file")


class Rotator:
    """The rotations ConfigMap as the reconciler uses it: ``read()`` every generation, ``bump()`` one."""

    def __init__(self, api: Any, system_namespace: str):
        self.api = api
        self.system_namespace = system_namespace
        self._reported: set[str] = set()

    def _report(self, line: str) -> None:
        if line not in self._reported:   # read every cycle: each malformed entry said once
            self._reported.add(line)
            warn(line)

    def read(self) -> dict[tuple[str, str], int]:
        return dict(rotations.read(self.api, self.system_namespace, report=self._report))

    def bump(self, vm: str, namespace: str) -> int:
        return rotations.bump(self.api, vm, namespace, system_namespace=self.system_namespace)


def core_api(kubeconfig: str) -> Any:
    """A ``CoreV1Api`` on the kubeconfig the Lease uses, read as kubectl reads it.
    Raises lease.LeaseConfigError when the kubeconfig cannot be used."""
    from kubernetes import client as k8s_client

    return k8s_client.CoreV1Api(lease.coordination_api(kubeconfig).api_client)


def rotator_from_values(values: Mapping[str, Any], kubeconfig: str | None = None) -> Rotator | None:
    """The rotator on the Lease's kubeconfig (or this one); None without reconciler.lease.
    Raises lease.LeaseConfigError when the kubeconfig cannot be used."""
    if not lease.configured(values):
        return None
    api = core_api(kubeconfig or lease.kubeconfig_path(values))
    return Rotator(api, values["kubernetes"]["system_namespace"])


def read_generations(values: Mapping[str, Any]) -> tuple[dict | None, str]:
    """Every VM's credential generation on reconciler.lease's access, for status and doctor:
    (None, why) without the lease or when the ConfigMap cannot be read."""
    if not lease.configured(values):
        return None, "no cluster access (reconciler.lease is not configured)"
    try:
        rotator = rotator_from_values(values)
        assert rotator is not None
        return rotator.read(), ""
    except (lease.LeaseConfigError, rotations.RotationsError) as failure:
        return None, str(failure)


def _kubeconfig(values: Mapping[str, Any], given: str | None) -> str | None:
    """--kubeconfig, else reconciler.lease.kubeconfig where it exists here (None: the region host),
    else what kubectl would read ($KUBECONFIG, ~/.kube/config: a workstation), said on stderr.
    Raises lease.LeaseConfigError naming both when neither is here."""
    if given:
        return given
    configured = lease.kubeconfig_path(values)
    if os.path.exists(configured):
        return None
    found = kubeconfigs.default()
    if found is None:
        raise lease.LeaseConfigError(f"reconciler.lease.kubeconfig {configured} is not on this host, and "
                                     f"{kubeconfigs.none_found()}: {kubeconfigs.fix()}")
    note(f"rotate: reconciler.lease.kubeconfig {configured} is not on this host: using {found[1]}")
    return found[0]


def main(values: dict, args: Any) -> int:
    """``rotate VM.NAMESPACE [--kubeconfig FILE]``: 0 rotated, 1 the cluster failed, 2 usage."""
    serial = args.serial
    try:
        vm, namespace = identity.parse_serial(serial)
    except identity.IdentityError as failure:
        error(f"rotate: {failure}")
        return EXIT_USAGE
    if not lease.configured(values):
        error(f"rotate: {NEEDS_LEASE}")
        return EXIT_USAGE
    try:
        rotator = rotator_from_values(values, _kubeconfig(values, getattr(args, "kubeconfig", None)))
    except lease.LeaseConfigError as failure:
        error(f"rotate: {failure}")
        return EXIT_USAGE
    assert rotator is not None
    try:
        after = rotator.bump(vm, namespace)
    except rotations.RotationsError as failure:
        error(f"rotate {serial}: {failure}")
        return EXIT_FAILED
    try:
        # So that status, doctor and a restarted reconciler know the exposure is dealt with.
        Audit(values["maas"].get("audit_log", "")).write(ROTATE, None, None, str(after - 1), str(after), "ok",
                                                          note="by hand (maas-kubevirt rotate)", identity=serial)
    except Exception as failure:  # noqa: BLE001 - the rotation stands; only its record is missing
        warn(f"rotate {serial}: rotated, but not recorded in maas.audit_log: {failure}")
    print(f"{serial}: credential generation {after - 1} -> {after}. Kyverno re-derives the Secret "
          f"{vm}-bmc in namespace {namespace} within seconds; the reconciler sets the new user and "
          f"password in MAAS {ROTATION_SETTLE:.0f} s after its next cycle sees the generation.", flush=True)
    return EXIT_OK
