"""A Lease as read (its spec and resourceVersion) and its times as the API server writes them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Mapping

API_VERSION = "coordination.k8s.io/v1"


def micro_time(moment: datetime) -> str:
    """A MicroTime the API server accepts: six fractional digits, always (RFC3339Micro in
    k8s.io/apimachinery/pkg/apis/meta/v1/micro_time.go; datetime.isoformat drops them at .000000)."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _sendable(moment: datetime) -> str:
    """micro_time of moment, never at .000000: the current client re-serialises a body through
    datetime.isoformat, which drops a zero fraction, and the API server then refuses the write."""
    return micro_time(moment if moment.microsecond else moment.replace(microsecond=1))


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


def _time_text(value: Any) -> str | None:
    if isinstance(value, datetime):
        return micro_time(value if value.tzinfo else value.replace(tzinfo=timezone.utc))
    return value if isinstance(value, str) and value else None


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def _whole(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class Record:
    """A Lease's spec as read, and the resourceVersion a write must name."""

    holder: str
    duration: int | None = None
    acquired: str | None = None
    renewed: str | None = None
    transitions: int = 0
    version: str = ""

    @property
    def spec(self) -> tuple:
        return self.holder, self.duration, self.acquired, self.renewed, self.transitions

    def lasts(self, fallback: float) -> float:
        """How long its holder holds it from a renewal: its leaseDurationSeconds, as every candidate
        times it (client-go's isLeaseValid), or ``fallback`` when that is missing or not positive."""
        return self.duration if self.duration is not None and self.duration > 0 else fallback


def record_of(lease: Any) -> Record:
    """A Lease as ``CoordinationV1Api`` returns it (a V1Lease) or as the API server's JSON."""
    if isinstance(lease, Mapping):
        metadata, spec = lease.get("metadata") or {}, lease.get("spec") or {}
        fields = (spec.get("holderIdentity"), spec.get("leaseDurationSeconds"), spec.get("acquireTime"),
                  spec.get("renewTime"), spec.get("leaseTransitions"), metadata.get("resourceVersion"))
    else:
        metadata, spec = getattr(lease, "metadata", None), getattr(lease, "spec", None)
        fields = tuple(getattr(spec, name, None) for name in (
            "holder_identity", "lease_duration_seconds", "acquire_time", "renew_time", "lease_transitions")) + (
            getattr(metadata, "resource_version", None),)
    holder, duration, acquired, renewed, transitions, version = fields
    return Record(holder if isinstance(holder, str) else "", _whole(duration),
                  _time_text(acquired), _time_text(renewed), _whole(transitions) or 0,
                  version if isinstance(version, str) else "")
