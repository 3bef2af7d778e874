"""The VirtualMachine a pool makes: exactly what MAAS needs of a VM, and nothing else.

- One bridge interface on the pool's Multus network, first in the boot order: MAAS PXE-boots
  it, and KubeMacPool (the namespace's label) gives it a MAC that survives power cycles.
- One blank disk of the pool's size in its storage class, second: a CDI DataVolume template,
  so deleting the VM deletes the disk (KubeVirt owns the DataVolume), and no data outlives it.
- ``runStrategy: Once``: it starts by itself, PXE-boots and enlists; enlistment ends with a
  power-off, after which it stays off until MAAS powers it through kubevirtBMC (whose power-on
  sets RerunOnFailure and power-off Halted), as any machine.
- Its pool's label and the reconciler's proof annotation; Kyverno stamps its identity and
  generates its BMC as for any VM of an opted-in namespace.

The Kyverno policy ``maas-kubevirt-pools`` (templates/policy-pools.yaml.j2: ``pool-vms-only``
and each pool's ``pool-vm-<pool>``) admits from the pools' ServiceAccount nothing but this shape,
and what the mutating webhooks add to it; a change here needs the same change there.
"""

from __future__ import annotations

import secrets

from maas_kubevirt import identity
from maas_kubevirt.pools.spec import MANAGED_BY, POOL_LABEL, PROOF_ANNOTATION, Pool

INTERFACE = "pxe"
DISK = "root"


def new_name(pool: Pool, taken: set[str] = frozenset()) -> str:
    """A fresh ``<pool>-<suffix>`` that no VM in ``taken`` has."""
    while True:
        suffix = "".join(secrets.choice(identity.POOL_SUFFIX_ALPHABET) for _ in range(identity.POOL_SUFFIX_LENGTH))
        name = identity.pool_vm_name(pool.name, suffix)
        if name not in taken:
            return name


def disk_name(vm: str) -> str:
    return f"{vm}-{DISK}"


def manifest(pool: Pool, name: str, seed: str) -> dict:
    """The VirtualMachine ``name`` of ``pool``, ready to create in the pool's namespace."""
    labels = {POOL_LABEL: pool.name, MANAGED_BY[0]: MANAGED_BY[1]}
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachine",
        "metadata": {
            "name": name,
            "namespace": pool.namespace,
            "labels": labels,
            "annotations": {PROOF_ANNOTATION: identity.pool_vm_proof(seed, pool.namespace, name, pool.name)},
        },
        "spec": {
            "runStrategy": "Once",
            "dataVolumeTemplates": [{
                "metadata": {"name": disk_name(name)},
                "spec": {
                    "source": {"blank": {}},
                    "storage": {
                        "storageClassName": pool.storage_class,
                        "resources": {"requests": {"storage": pool.disk}},
                    },
                },
            }],
            "template": {
                "metadata": {"labels": {POOL_LABEL: pool.name}},
                "spec": {
                    "domain": {
                        "cpu": {"cores": pool.cores},
                        "resources": {"requests": {"memory": pool.memory}},
                        "devices": {
                            "interfaces": [{"name": INTERFACE, "bridge": {}, "bootOrder": 1}],
                            "disks": [{"name": DISK, "disk": {"bus": "virtio"}, "bootOrder": 2}],
                        },
                    },
                    "networks": [{"name": INTERFACE, "multus": {"networkName": pool.network}}],
                    "volumes": [{"name": DISK, "dataVolume": {"name": disk_name(name)}}],
                },
            },
        },
    }


def owned(vm: dict, pools: dict[str, Pool], seed: str) -> Pool | None:
    """The pool that made ``vm`` (its label names the pool, in the pool's namespace, and its proof
    annotation is the reconciler's), or None for any other VM, hand-made ones included."""
    metadata = vm.get("metadata") or {}
    pool = pools.get((metadata.get("labels") or {}).get(POOL_LABEL, ""))
    if pool is None or metadata.get("namespace") != pool.namespace:
        return None
    name = metadata.get("name")
    if not identity.is_pool_vm_name(pool.name, name):
        return None
    proof = (metadata.get("annotations") or {}).get(PROOF_ANNOTATION, "")
    expected = identity.pool_vm_proof(seed, pool.namespace, name, pool.name)
    return pool if isinstance(proof, str) and secrets.compare_digest(proof, expected) else None
