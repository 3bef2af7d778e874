"""One active reconciler per site: leader election on a ``coordination.k8s.io/v1`` Lease.

Written on the official client's ``CoordinationV1Api`` after client-go's elector, because
python3-kubernetes 22.6 (Debian 12) has no Lease lock and its elector goes on leading after it
loses the lease. One module per stage:

- :mod:`.record`: a Lease as read, and its times as the API server writes them;
- :mod:`.candidate`: the election (:class:`Candidate`: acquire, renew, release, ``held`` and
  ``may_write``, the question asked before every write);
- :mod:`.config`: the lease from the values, the kubeconfig, this process's holder identity;
- :mod:`.report`: the Lease read for ``status`` and doctor.
"""

from maas_kubevirt.lease.candidate import JITTER_FACTOR, POLL, Candidate
from maas_kubevirt.lease.config import (
    AUDIT_SHARED_FIX, LeaseConfigError, audit_unshared, candidate_from_values, configured, coordination_api, holder_identity, host_of,
    kubeconfig_path, lease_values, namespace_of,
)
from maas_kubevirt.lease.record import API_VERSION, Record, _sendable, _utc_now, micro_time, parse_time, record_of
from maas_kubevirt.lease.report import describe, expired, read_record, token_expiry

__all__ = [
    "API_VERSION", "AUDIT_SHARED_FIX", "JITTER_FACTOR", "POLL", "Candidate", "LeaseConfigError", "Record", "_sendable", "_utc_now",
    "audit_unshared", "candidate_from_values", "configured", "coordination_api", "describe", "expired", "holder_identity",
    "host_of", "kubeconfig_path", "lease_values", "micro_time", "namespace_of", "parse_time", "read_record",
    "record_of", "token_expiry",
]
