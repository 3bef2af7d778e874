"""Carrying out the pool plan: each create, tag and retirement audited before and after.

A create is audited (outcome ``intent``) before the VM is sent, naming it, and a retirement
before its first delete: a restart in between finds the VM by its label and proof, or finishes
the retirement (``Records``). Nothing here writes unless ``may_write`` says so (the lease).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from maas_kubevirt.audit import Audit
from maas_kubevirt.kube import KubeError
from maas_kubevirt.maas.errors import MAASError
from maas_kubevirt.pools import vm as pool_vm
from maas_kubevirt.pools.observe import vms_path
from maas_kubevirt.pools.plan import CREATE, HELD, READY, RETIRE, TAG, PoolAction, PoolMachine
from maas_kubevirt.pools.spec import Pool

USED = "pool-used"
INTENT = "intent"
WITHDRAWN = "withdrawn"   # a retirement given up: a user took the machine since the plan
TAG_COMMENT = "maas-kubevirt pool: every machine of the pool has it (maas-kubevirt.io/pool)"


class Records:
    """What the pool stage must not forget across a restart, from its audit records: the
    retirements begun and not finished, and the machines seen in a user's hands."""

    def __init__(self) -> None:
        self.retiring: set[tuple[str, str]] = set()
        self.used: set[str] = set()

    def restore(self, records: Iterable[Mapping[str, Any]]) -> None:
        for record in records:
            self.note(record)

    def note(self, record: Mapping[str, Any]) -> None:
        action, outcome = record.get("action"), record.get("outcome")
        who = (record.get("vm"), record.get("namespace"))
        if action == RETIRE and outcome == INTENT:
            self.retiring.add(who)
        elif action == RETIRE and outcome in ("ok", WITHDRAWN):
            self.retiring.discard(who)
        elif action == USED and isinstance(record.get("system_id"), str):
            self.used.add(record["system_id"])


@dataclass
class Done:
    """What one apply did: the actions that took effect, those given up (a retirement whose
    machine a user took meanwhile) and those that failed, with why."""

    done: list[PoolAction] = field(default_factory=list)
    withdrawn: list[PoolAction] = field(default_factory=list)
    failed: list[tuple[PoolAction, str]] = field(default_factory=list)


class Applier:
    def __init__(self, cluster: Any, client: Any, audit: Audit, records: Records, pools: Mapping[str, Pool],
                 seed: str, may_write: Callable[[], bool] | None = None):
        self.cluster, self.client, self.audit, self.records = cluster, client, audit, records
        self.pools, self.seed = pools, seed
        self.may_write = may_write or (lambda: True)

    def _write(self, action: PoolAction, outcome: str, reason: str = "", **extra: Any) -> None:
        record = self.audit.write(action.kind, action.system_id, action.hostname, None, action.vm, outcome, reason,
                                  pool=action.pool, namespace=action.namespace, vm=action.vm, **extra)
        self.records.note(record)

    def note_used(self, machines: Iterable[PoolMachine]) -> None:
        """Audit, once each, the pool machines a user holds: a release later means a recreate."""
        for machine in machines:
            if machine.status in HELD and machine.system_id not in self.records.used:
                record = self.audit.write(USED, machine.system_id, machine.hostname, None, machine.status, "ok",
                                          vm=machine.vm, namespace=machine.namespace)
                self.records.note(record)

    def apply(self, actions: Iterable[PoolAction], taken: set[str]) -> Done:
        """Every action in order; one that fails is audited and the others go on."""
        result = Done()
        tags: set[str] | None = None
        for action in actions:
            if not self.may_write():
                break
            try:
                if action.kind == CREATE:
                    action = self.create(action, taken)
                elif action.kind == TAG:
                    if tags is None:
                        tags = self.client.tag_names()
                    self.tag(action, tags)
                elif action.kind == RETIRE and not self.retire(action):
                    result.withdrawn.append(action)
                    continue
            except (KubeError, MAASError) as failure:
                self._write(action, "failed", str(failure))
                result.failed.append((action, str(failure)))
            else:
                result.done.append(action)
        return result

    def create(self, action: PoolAction, taken: set[str], name: str | None = None) -> PoolAction:
        pool = self.pools[action.pool]
        name = name or pool_vm.new_name(pool, taken)
        taken.add(name)
        action = PoolAction(CREATE, pool.name, pool.namespace, name)
        self._write(action, INTENT)
        self.cluster.create(vms_path(pool.namespace), pool_vm.manifest(pool, name, self.seed))
        self._write(action, "ok")
        return action

    def tag(self, action: PoolAction, known: set[str]) -> None:
        assert action.system_id is not None
        for tag in action.tags:
            if tag not in known:
                self.client.create_tag(tag, TAG_COMMENT)
                known.add(tag)
            self.client.tag_machine(tag, action.system_id)
        self._write(action, "ok", tags=list(action.tags))

    def retire(self, action: PoolAction, may_delete: Callable[[Any], bool] = lambda status: status == READY) -> bool:
        """Delete the machine (only while MAAS still says a status ``may_delete`` allows, Ready by
        default: never one a user took since the plan), then the VM, whose DataVolume the garbage
        collector deletes with it. False when MAAS's status no longer allows it."""
        self._write(action, INTENT, action.reason)
        if action.system_id is not None:
            now = [m for m in self.client.machines_by_id([action.system_id]) if isinstance(m, dict)]
            status = now[0].get("status_name") if now else None
            if now and not may_delete(status):
                self._write(action, WITHDRAWN, f"not deleted: MAAS now says {status}")
                return False
            if now:
                self.client.delete_machine(action.system_id)
        assert action.vm is not None
        self.cluster.delete(vms_path(action.namespace, action.vm))
        self._write(action, "ok")
        return True
