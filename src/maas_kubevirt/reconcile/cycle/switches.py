"""Power-type switches: machines an enlistment switched off redfish, their derived credentials
taken back, until the VM enlists again."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from maas_kubevirt.audit import NAME_LIMIT, cap
from maas_kubevirt.maas import valid_system_id
from maas_kubevirt.reconcile.plan import REDFISH


@dataclass(frozen=True)
class Switched:
    """A machine that an enlistment switched to another power type, its VM's credentials taken back."""

    who: tuple[str, str]
    power_type: str

    def fix(self) -> str:
        vm, namespace = self.who
        return (f"if the switch was not an administrator's, let {vm} enlist again (it PXE-boots, MAAS knows it "
                f"by its MAC and its script writes its redfish BMC back): `virtctl restart {vm} -n {namespace}`")


class Switches:
    """The Reconciler's ``switched`` machines, as status and doctor show them."""

    def _switch(self, system_id: str, who: tuple[str, str] | None, power_type: Any) -> None:
        """A machine whose credentials were taken back from another power type (or, redfish, not);
        ``who`` None: a malformed audit record, which changes nothing of another type."""
        if not (isinstance(power_type, str) and power_type != REDFISH and valid_system_id(system_id)):
            self.switched.pop(system_id, None)
        elif who is not None:
            self.switched[system_id] = Switched(who, cap(power_type, NAME_LIMIT))

    def still_switched(self, machines: Iterable[Mapping[str, Any]]) -> dict[str, Switched]:
        """The switched machines that MAAS still shows with another power type than redfish."""
        types = {m.get("system_id"): m.get("power_type") for m in machines}
        return {sid: s for sid, s in sorted(self.switched.items()) if sid in types and types[sid] != REDFISH}
