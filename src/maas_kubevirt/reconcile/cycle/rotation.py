"""Rotation of exposed credentials: a derived password found beside another address may have
leaked, and its VM gets a new generation (with cluster access) or its command is printed."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from maas_kubevirt.console import warn
from maas_kubevirt.reconcile.cycle.generations import ROTATION_SETTLE, _audited_generation


ROTATE = "rotate"


@dataclass(frozen=True)
class Exposure:
    """A VM's derived password found beside an address that is not its BMC, and taken back: it may
    have leaked, so the VM's credentials need a generation past ``generation``."""

    system_id: str
    generation: int


def rotate_command(vm: str, namespace: str, values_path: str | None = None) -> str:
    """The exact command line that rotates one VM's credentials, with these values."""
    values = f" --values {shlex.quote(values_path)}" if values_path else ""
    return f"maas-kubevirt{values} rotate {vm}.{namespace}"


class Rotation:
    """The Reconciler's ``exposures``, until a rotation moves each past its generation."""

    def _expose(self, system_id: str, serial: Any, generation: Any) -> None:
        audited = _audited_generation(serial, generation)
        if audited is not None:
            self.exposures[audited[0]] = Exposure(system_id, audited[1])

    def _rotated(self, serial: Any, generation: Any) -> None:
        """An audit record of a rotation (the reconciler's or ``rotate``'s) to ``generation``."""
        audited = _audited_generation(serial, generation)
        exposure = self.exposures.get(audited[0]) if audited is not None else None
        if exposure is not None and audited[1] > exposure.generation:
            del self.exposures[audited[0]]

    def needing_rotation(self) -> dict[tuple[str, str], Exposure]:
        """The identities whose password may have leaked and has not been rotated since."""
        return {who: e for who, e in self.exposures.items() if self.passwords.generation(*who) <= e.generation}

    def rotate_exposed(self) -> None:
        """Give each VM whose password may have leaked a new credential generation (with cluster
        access), or say once which command does it (without)."""
        for who, exposure in sorted(self.needing_rotation().items()):
            vm, namespace = who
            generation = self.passwords.generation(vm, namespace)
            if self.rotator is None:
                if (who, generation) not in self._told_rotation:
                    self._told_rotation.add((who, generation))
                    warn(f"{vm}.{namespace}: its password may have leaked (it sat beside another "
                         f"address on {exposure.system_id}); rotate it: "
                         f"{rotate_command(vm, namespace, self.values_path)} "
                         "(needs reconciler.lease, whose cluster access the reconciler reads "
                         "generations with)")
                continue
            if self.generations_unread or who in self.lowered:   # a bump needs the generation it raises
                continue
            if self.stop.is_set() or (self.may_write is not None and not self.may_write()):
                return
            serial = f"{vm}.{namespace}"
            try:
                after = self.rotator.bump(vm, namespace)
            except Exception as failure:  # noqa: BLE001 - one VM's failure stops no other
                self.audit.write(ROTATE, exposure.system_id, None, str(generation), None, "failed",
                                 f"{failure}", identity=serial)
                continue
            self.audit.write(ROTATE, exposure.system_id, None, str(generation), str(after), "ok",
                             note=f"its password may have leaked; Kyverno re-derives {vm}-bmc",
                             identity=serial)
            self.passwords.generations[who] = after
            self._use(who, after)
            self.settling[who] = self.wall() + ROTATION_SETTLE
            del self.exposures[who]   # rotated past it: after is above the generation exposed
