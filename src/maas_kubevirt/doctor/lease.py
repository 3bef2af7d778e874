"""doctor's ``reconciler.lease``: who holds the site's Lease (its holderIdentity,
``<hostname>_<pid>-<random>``, one per process start: lease.holder_identity) and when it was
last renewed, timed by the record's own duration; a warning when MAAS lists several region
controllers and no lease is configured, because then the reconciler on every region host acts."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from maas_kubevirt import lease
from maas_kubevirt.doctor import FAIL, OK, WARN, Check, _clean, _some
from maas_kubevirt.maas import MAASError

if TYPE_CHECKING:
    from maas_kubevirt.maas import MAASClient

NAME = "reconciler.lease"
HA_PAGE = "docs/how-to/ha.md"
# A token that ends within this is worth renewing now.
TOKEN_WARNING = timedelta(days=7)


def region_names(regions: Sequence[Any]) -> list[str]:
    return [_clean(r.get("hostname") or r.get("system_id") or "?") if isinstance(r, Mapping) else "?"
            for r in regions]


def lease_check(values: Mapping[str, Any], regions: Sequence[Any] | None, regions_problem: str = "",
                record: lease.Record | None = None, problem: str = "", status: int | None = None,
                token_expires: datetime | None = None, now: datetime | None = None) -> Check:
    """The row, from what was read: MAAS's region controllers (or why not) and, with a lease
    configured, its record (or why not, with the HTTP status) and the token's expiry."""
    now = now or datetime.now(timezone.utc)
    settings = values["reconciler"]["lease"]
    where = f"{lease.namespace_of(values)}/{settings['name']}"
    names = region_names(regions or [])
    listed = (f"MAAS lists {len(names)} region controller(s) ({_some(names)})" if regions is not None
              else f"the region controllers could not be listed ({_clean(regions_problem)})")
    if not lease.configured(values):
        if regions is not None and len(names) > 1:
            return Check(NAME, WARN, f"not configured, and {listed}: the reconciler of every region host "
                         "acts, so each VM is written, commissioned and powered on once per host",
                         f"set reconciler.lease.kubeconfig on every region host ({HA_PAGE}), or run the "
                         "service on one of them only (`systemctl disable --now maas-kubevirt` on the others)",
                         tuple(names))
        return Check(NAME, OK if regions is not None else WARN, f"not configured: {listed}",
                     "" if regions is not None else f"with more than one region host, set reconciler.lease ({HA_PAGE})")
    if problem:
        fix = {401: f"the kubeconfig's token was refused: make a new one ({HA_PAGE})",
               403: "apply the bundle's reconciler Role and RoleBinding: `kubectl apply -k build/kubernetes`"
               }.get(status or 0, f"check reconciler.lease.kubeconfig and that the API server answers ({HA_PAGE})")
        return Check(NAME, FAIL, f"the Lease {where} cannot be read: {_clean(problem)}", fix)
    token = ""
    if token_expires is not None:
        left = token_expires - now
        token = f"; the kubeconfig's token expires {token_expires.strftime('%Y-%m-%dT%H:%M:%SZ')}"
        if left <= timedelta(0):
            return Check(NAME, FAIL, f"the kubeconfig's token expired {token_expires.strftime('%Y-%m-%dT%H:%M:%SZ')}: "
                         "no reconciler can renew the Lease", f"make a new token ({HA_PAGE})")
    found = f"the Lease {where} {lease.describe(record, settings['duration'], now)}{token}; {listed}"
    if lease.expired(record, settings["duration"], now):
        return Check(NAME, WARN, found, "start the service on the region hosts and read its log: "
                     "`systemctl restart maas-kubevirt && journalctl -u maas-kubevirt`")
    if token_expires is not None and token_expires - now < TOKEN_WARNING:
        return Check(NAME, WARN, found, f"renew the token before it expires ({HA_PAGE})")
    if lease.audit_unshared(values):
        return Check(NAME, WARN, f"{found}; {lease.audit_unshared(values)}", lease.AUDIT_SHARED_FIX)
    return Check(NAME, OK, found)


def lease_checks(values: Mapping[str, Any], client: MAASClient | None) -> Check:
    """Read what lease_check needs: MAAS's region controllers (not without a client), the Lease
    and the token's expiry."""
    from maas_kubevirt.kube import KubeError

    regions: list[Any] | None = None
    regions_problem = "no MAAS API key"
    if client is not None:
        try:
            regions, regions_problem = client.region_controllers(), ""
        except MAASError as failure:
            regions_problem = str(failure)
    if not lease.configured(values):
        return lease_check(values, regions, regions_problem)
    try:
        record = lease.read_record(values)
    except lease.LeaseConfigError as failure:
        return lease_check(values, regions, regions_problem, problem=str(failure))
    except KubeError as failure:
        return lease_check(values, regions, regions_problem, problem=str(failure), status=failure.status)
    return lease_check(values, regions, regions_problem, record,
                       token_expires=lease.token_expiry(lease.kubeconfig_path(values)))
