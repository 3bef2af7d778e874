"""Duplicate claims and suspect addresses: one audit record and one warning each time one changes."""

from __future__ import annotations

from typing import Any, Sequence

from maas_kubevirt.audit import NAME_LIMIT, cap
from maas_kubevirt.console import warn
from maas_kubevirt.reconcile.plan import DUPLICATE, SUSPECT, Action


def _as_audited(value: Any) -> Any:
    """A MAAS-supplied string as an audit record keeps it."""
    return cap(value, NAME_LIMIT) if isinstance(value, str) else value


class Duplicates:
    """What the Reconciler last reported: ``_duplicates`` and ``_suspects``."""

    def report_duplicates(self, actions: Sequence[Action]) -> None:
        """One audit record and one warning per duplicate claim and per suspect address, again
        only when the claim's set of machines (or the suspect's address) changes."""
        current = {(a.vm, a.namespace): a.after for a in actions if a.kind == DUPLICATE}
        # As the audit record keeps it (capped), so that a restart compares like with like.
        suspects = {a.system_id: _as_audited(a.before) for a in actions if a.kind == SUSPECT}
        for action in actions:
            if action.kind == DUPLICATE and self._duplicates.get((action.vm, action.namespace)) != action.after:
                self.audit.record(action, "refused")
                warn(action.note)
            if action.kind == SUSPECT and self._suspects.get(action.system_id) != suspects[action.system_id]:
                self.audit.record(action, "refused")
                warn(f"{action.system_id} {action.hostname}: {action.note}")
        if self.partial:  # the claims of machines not read this cycle stand as they were
            considered = {(a.vm, a.namespace) for a in actions if a.vm is not None}
            current = {**{k: v for k, v in self._duplicates.items() if k not in considered}, **current}
            seen = {a.system_id for a in actions}
            suspects = {**{k: v for k, v in self._suspects.items() if k not in seen}, **suspects}
        self._duplicates = current
        self._suspects = suspects
