"""The lease from the values: whether it is configured, where it lives, the kubeconfig that reaches
it, this process's holder identity, and the :class:`Candidate` that takes part."""

from __future__ import annotations

import os
import secrets
import socket
from typing import Any, Callable, Mapping

from maas_kubevirt.console import note
from maas_kubevirt.lease.candidate import Candidate


class LeaseConfigError(Exception):
    """reconciler.lease.kubeconfig cannot be used (a configuration error: exit 2)."""


def holder_identity() -> str:
    """``<hostname>_<pid>-<8 random hex digits>``, drawn afresh for each candidate: two cloned
    containers (one hostname, PID 1 each), or a PID used again, never share a name."""
    return f"{socket.gethostname()}_{os.getpid()}-{secrets.token_hex(4)}"


def host_of(identity: str) -> str:
    """The hostname a holderIdentity names (``holder_identity``'s, or an older ``<hostname>_<pid>``)."""
    return identity.rpartition("_")[0]


def lease_values(values: Mapping[str, Any]) -> Mapping[str, Any]:
    return values["reconciler"]["lease"]


def configured(values: Mapping[str, Any]) -> bool:
    """Whether the reconcilers of this site elect a holder (reconciler.lease.kubeconfig is set)."""
    return bool(lease_values(values)["kubeconfig"])


# Why a standby needs the holder's audit records (reconciler.restore), said where it may lack them.
AUDIT_UNSHARED = (
    "reconciler.lease is configured but maas.audit_log is not set: a standby that takes the lease over "
    "has none of the holder's records (commission backoffs, suspects reported, which machines hold a "
    "derived credential, which VMs wait for a rotation), so it repeats refused commissions and warnings, "
    "and finds a derived credential left on a moved or switched machine only by its value, at its first "
    "full resync")
AUDIT_SHARED_FIX = (
    "set maas.audit_log on every region host to one audit log that every host's reconciler appends to "
    "(shared or replicated storage, docs/how-to/ha.md): a log of each host's own leaves a standby "
    "without the holder's records")


def audit_unshared(values: Mapping[str, Any]) -> str:
    """AUDIT_UNSHARED when the lease is configured and maas.audit_log is not set, else ""."""
    return AUDIT_UNSHARED if configured(values) and not values["maas"].get("audit_log") else ""


def namespace_of(values: Mapping[str, Any]) -> str:
    return lease_values(values)["namespace"] or values["kubernetes"]["system_namespace"]


def kubeconfig_path(values: Mapping[str, Any]) -> str:
    """The systemd credential ``kubeconfig`` when the service was handed one, else the values' path."""
    from maas_kubevirt.paths import credential_path

    given = credential_path("kubeconfig")
    return str(given) if given is not None else lease_values(values)["kubeconfig"]


def coordination_api(kubeconfig: str) -> Any:
    """A CoordinationV1Api on the kubeconfig's current context, read as kubectl reads it."""
    import yaml
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config

    from maas_kubevirt.kubeconfigs import files

    where = "reconciler.lease.kubeconfig"
    try:
        for path in files(kubeconfig):   # one file, or $KUBECONFIG's list (rotate on a workstation)
            with open(path, encoding="utf-8") as handle:
                yaml.safe_load(handle)
        configuration = k8s_client.Configuration()
        k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration,
                                    persist_config=False)
    except OSError as error:
        raise LeaseConfigError(f"{where}: cannot read {kubeconfig!r}: {error.strerror or error}") from None
    except (yaml.YAMLError, UnicodeDecodeError):
        raise LeaseConfigError(f"{where}: {kubeconfig!r} is not a YAML kubeconfig") from None
    except (k8s_config.ConfigException, ValueError, KeyError, TypeError) as error:
        reason = " ".join(str(error).split())[:200] or type(error).__name__
        raise LeaseConfigError(f"{where}: {kubeconfig!r} cannot be used: {reason}") from None
    # One attempt per request (urllib3 would retry 3 times): the candidate's own loop retries.
    configuration.retries = 0
    return k8s_client.CoordinationV1Api(k8s_client.ApiClient(configuration))


def candidate_from_values(values: Mapping[str, Any], api: Any | None = None,
                          say: Callable[[str], None] = note) -> Candidate | None:
    """This process's candidate for the site's Lease, or None when no lease is configured."""
    if not configured(values):
        return None
    lease = lease_values(values)
    return Candidate(api if api is not None else coordination_api(kubeconfig_path(values)),
                     namespace_of(values), lease["name"], holder_identity(), duration=lease["duration"],
                     renew_deadline=lease["renew_deadline"], retry_period=lease["retry_period"], say=say)
