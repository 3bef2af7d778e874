"""Reading the site's Lease for ``status`` and doctor: the record with a plain GET, the kubeconfig
token's expiry, and who holds it in one line, timed by the record's own duration."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Mapping

from maas_kubevirt.lease.config import LeaseConfigError, kubeconfig_path, lease_values, namespace_of
from maas_kubevirt.lease.record import API_VERSION, Record, _utc_now, parse_time, record_of


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


def describe(record: Record | None, duration: float, now: datetime | None = None) -> str:
    """Who holds the Lease and since when, in one line (``status`` and doctor); the holder is timed
    by the record's own duration (``duration``, the values', when it has none)."""
    if record is None:
        return "does not exist: no reconciler has taken part yet"
    now = now or _utc_now()
    renewed = parse_time(record.renewed)
    ago = f" ({max(0, round((now - renewed).total_seconds()))} s ago)" if renewed else ""
    if not record.holder:
        return f"not held: released at {record.renewed or '?'}"
    text = f"held by {record.holder} since {record.acquired or '?'}, renewed {record.renewed or '?'}{ago}"
    lasts = record.lasts(duration)
    if renewed is not None and (now - renewed).total_seconds() > lasts:
        text += f": not renewed for more than {lasts:g} s, so no reconciler is active"
    return text


def expired(record: Record | None, duration: float, now: datetime | None = None) -> bool:
    """Whether nobody holds the Lease now (missing, released, or not renewed for its duration), by
    the record's own renewTime: for a report, never for the election (clocks differ)."""
    if record is None or not record.holder:
        return True
    renewed = parse_time(record.renewed)
    return renewed is None or ((now or _utc_now()) - renewed).total_seconds() > record.lasts(duration)
