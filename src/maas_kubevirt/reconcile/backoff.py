"""Commissions that failed (MAAS refused them, or took them and put the machine back in New):
per machine, the wait before the next attempt, kept across restarts through the audit log."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Mapping

from maas_kubevirt.reconcile.plan import COMMISSION, COMMISSIONING, is_new

# A commission MAAS refused waits one interval, then twice as long each time, at most this.
MAX_BACKOFF = 3600.0

# Why a commission MAAS took counts as failed: MAAS 3.5 answers it only after its power-on gave
# up (many minutes when the BMC refuses the password), then reverts the machine to New.
REVERTED = ("MAAS reverted the machine to New after the commission: its power-on most likely failed "
            "(check the BMC credentials; doctor: network.redfish)")


@dataclass(frozen=True)
class Wait:
    """A commission MAAS refused: how many times in a row, the next attempt's time, and why."""

    failures: int
    until: float        # time.time()
    reason: str

    def why(self) -> str:
        return f"waiting until {_wall(self.until)} after {self.failures} failed attempt(s): {self.reason}"

    def audited(self) -> dict[str, Any]:
        """The audit record's fields that a restart reads the wait back from (``Backoff.restore``)."""
        return {"retry_at": _wall(self.until), "failures": self.failures}


# How an audit record writes a wait's end (retry_at), and how a restart reads it back.
WALL_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def _wall(seconds: float) -> str:
    """A time in UTC to the second, rounded up: a wait read back from it is never shorter."""
    return datetime.fromtimestamp(math.ceil(seconds), timezone.utc).strftime(WALL_FORMAT)


class Backoff:
    """Per machine, failed commissions: the next waits one interval, then twice as long each
    time, at most MAX_BACKOFF. MAAS reverts such a machine to New and records a status event, so
    without this every cycle would commission it again. A commission MAAS took counts as failed
    when the machine comes back to New without passing Commissioning (``seen``); only a status
    past it ends the backoff."""

    def __init__(self, interval: float, maximum: float = MAX_BACKOFF, clock: Callable[[], float] = time.time):
        self.interval = float(interval)
        self.maximum = float(maximum)
        self.clock = clock
        self.waits: dict[str, Wait] = {}
        # system_id -> the failures before a commission MAAS took, until the machine passes
        # Commissioning (cleared) or comes back to New (one more failure).
        self.taken: dict[str, int] = {}

    def failures(self, system_id: str) -> int:
        """The failed commissions in a row of a machine so far."""
        wait = self.waits.get(system_id)
        return wait.failures if wait is not None else self.taken.get(system_id, 0)

    def failed(self, system_id: str, reason: str) -> Wait:
        failures = self.failures(system_id) + 1
        delay = min(self.interval * 2 ** (failures - 1), self.maximum)
        self.taken.pop(system_id, None)
        self.waits[system_id] = Wait(failures, self.clock() + delay, reason)
        return self.waits[system_id]

    def commissioned(self, system_id: str) -> None:
        """A commission MAAS took: no wait now, the failures so far kept until it is seen through."""
        self.taken[system_id] = self.failures(system_id)
        self.waits.pop(system_id, None)

    def seen(self, machine: Mapping[str, Any]) -> Wait | None:
        """Follow a machine as MAAS shows it now: the wait it starts when it came back to New after a
        commission MAAS took (else None). Past Commissioning, its backoff ends."""
        system_id = machine["system_id"]
        if is_new(machine):
            return self.failed(system_id, REVERTED) if system_id in self.taken else None
        if machine.get("status_name") == COMMISSIONING:
            if system_id in self.waits:   # commissioned meanwhile (by hand, or a commission in doubt)
                self.commissioned(system_id)
        else:
            self.clear(system_id)
        return None

    def clear(self, system_id: str) -> None:
        self.waits.pop(system_id, None)
        self.taken.pop(system_id, None)

    def pending(self) -> dict[str, Wait]:
        """The waits not over yet."""
        now = self.clock()
        return {sid: wait for sid, wait in self.waits.items() if wait.until > now}

    def waiting(self) -> dict[str, str]:
        """system_id -> why its commission waits, as the plan's note, for the waits not over yet."""
        return {sid: f"commission: {wait.why()}" for sid, wait in self.pending().items()}

    def due(self) -> set[str]:
        """The machines whose wait is over: nothing MAAS records says so, so they are read again."""
        now = self.clock()
        return {sid for sid, wait in self.waits.items() if wait.until <= now}

    def restore(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Take the waits back from earlier audit records (oldest first), so a restart keeps them."""
        for record in records:
            system_id = record.get("system_id")
            if record.get("action") != COMMISSION or not isinstance(system_id, str):
                continue
            until, failures = record.get("retry_at"), record.get("failures")
            if record.get("outcome") == "ok":
                self.commissioned(system_id)   # seen through, or back in New, by the first cycle
            elif isinstance(until, str) and isinstance(failures, int) and failures > 0:
                try:
                    when = datetime.strptime(until, WALL_FORMAT).replace(tzinfo=timezone.utc)
                except ValueError:
                    continue
                self.taken.pop(system_id, None)
                self.waits[system_id] = Wait(failures, when.timestamp(), str(record.get("reason", "")))


