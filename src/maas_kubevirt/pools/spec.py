"""A pool of the values file as the other stages read it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

# The label and annotation every pool VM carries: the label names its pool, the annotation
# (identity.pool_vm_proof) proves the reconciler made it.
POOL_LABEL = "maas-kubevirt.io/pool"
PROOF_ANNOTATION = "maas-kubevirt.io/pool-proof"
MANAGED_BY = ("app.kubernetes.io/managed-by", "maas-kubevirt")
# The label an administrator puts on a namespace to let pools create VMs there.
NAMESPACE_LABEL = ("maas-kubevirt.io/pools", "enabled")
RECREATE, KEEP = "recreate", "keep"


@dataclass(frozen=True)
class Pool:
    name: str
    namespace: str
    cores: int
    memory: str
    disk: str
    storage_class: str
    network: str
    ready: int
    max: int
    tags: tuple[str, ...] = ()
    on_release: str = RECREATE

    @property
    def maas_tags(self) -> tuple[str, ...]:
        """Every MAAS tag the pool's machines get: its name first, then its own tags."""
        return tuple(dict.fromkeys((self.name, *self.tags)))


def from_values(values: Mapping[str, Any]) -> tuple[Pool, ...]:
    """The validated values' pools, in their order."""
    return tuple(Pool(**{**pool, "tags": tuple(pool["tags"])}) for pool in values["pools"])


def by_name(pools: tuple[Pool, ...]) -> dict[str, Pool]:
    return {pool.name: pool for pool in pools}
