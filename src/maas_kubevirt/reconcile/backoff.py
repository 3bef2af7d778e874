"""Commissions MAAS refused: per machine, the wait before the next attempt, kept across restarts
through the audit log."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Mapping

from maas_kubevirt.reconcile.plan import COMMISSION

# A commission MAAS refused waits one interval, then twice as long each time, at most this.
MAX_BACKOFF = 3600.0


@dataclass(frozen=True)
class Wait:
    """A commission MAAS refused: how many times in a row, the next attempt's time, and why."""

    failures: int
    until: float        # time.time()
    reason: str

    def why(self) -> str:
        return f"waiting until {_wall(self.until)} after {self.failures} refused attempt(s): {self.reason}"


# How an audit record writes a wait's end (retry_at), and how a restart reads it back.
WALL_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def _wall(seconds: float) -> str:
    """A time in UTC to the second, rounded up: a wait read back from it is never shorter."""
    return datetime.fromtimestamp(math.ceil(seconds), timezone.utc).strftime(WALL_FORMAT)


class Backoff:
    """Per machine, commissions MAAS refused: the next waits one interval, then twice as long each
    time, at most MAX_BACKOFF. MAAS reverts such a machine to New and records a status event, so
    without this every cycle would commission it again."""

    def __init__(self, interval: float, maximum: float = MAX_BACKOFF, clock: Callable[[], float] = time.time):
        self.interval = float(interval)
        self.maximum = float(maximum)
        self.clock = clock
        self.waits: dict[str, Wait] = {}

    def failed(self, system_id: str, reason: str) -> Wait:
        failures = self.waits[system_id].failures + 1 if system_id in self.waits else 1
        delay = min(self.interval * 2 ** (failures - 1), self.maximum)
        self.waits[system_id] = Wait(failures, self.clock() + delay, reason)
        return self.waits[system_id]

    def clear(self, system_id: str) -> None:
        self.waits.pop(system_id, None)

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
                self.clear(system_id)
            elif isinstance(until, str) and isinstance(failures, int) and failures > 0:
                try:
                    when = datetime.strptime(until, WALL_FORMAT).replace(tzinfo=timezone.utc)
                except ValueError:
                    continue
                self.waits[system_id] = Wait(failures, when.timestamp(), str(record.get("reason", "")))


