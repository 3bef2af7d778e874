"""Audit records: one JSON line per change made to MAAS, on stdout and appended to maas.audit_log."""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime, timezone
from typing import Any

from maas_kubevirt.console import warn
from maas_kubevirt.values import ValuesError


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Audit:
    """One JSON line per change: to stdout and, if configured, appended to maas.audit_log."""

    def __init__(self, path: str = ""):
        self.path = path
        if path:
            try:
                self._append(b"")
            except OSError as error:
                raise ValuesError(
                    [f"maas.audit_log: expected a file the reconciler can append to, "
                     f"found {path!r}: {error.strerror or error}"]
                ) from None
        self.warned = False

    def write(self, action: str, system_id: str | None, hostname: str | None,
              before: Any, after: Any, outcome: str, reason: str = "", note: str = "",
              **extra: Any) -> dict:
        record = {
            "time": _now(),
            "system_id": system_id,
            "hostname": hostname,
            "action": action,
            "before": before,
            "after": after,
            "outcome": outcome,
        }
        if reason:
            record["reason"] = reason
        if note:
            record["note"] = note
        record.update(extra)
        line = json.dumps(record, sort_keys=False)
        print(line, file=sys.stdout, flush=True)
        if self.path:
            try:
                self._append((line + "\n").encode("utf-8"))
            except OSError as error:
                if not self.warned:
                    warn(f"cannot append to the audit log {self.path}: {error.strerror or error}")
                    self.warned = True
        return record

    def record(self, action: Any, outcome: str, reason: str = "", **extra: Any) -> dict:
        """The audit record of one attempted reconciler action (extra: e.g. a backoff's retry_at)."""
        return self.write(action.kind, action.system_id, action.hostname, action.before, action.after,
                          outcome, reason, action.note, **extra)

    @staticmethod
    def read_file(path: str, limit: int = 4 * 2**20) -> list[dict]:
        """The JSON records in the last ``limit`` bytes of an audit log, oldest first; [] when no
        file is configured ("") or it cannot be read."""
        if not path:
            return []
        try:
            with open(path, "rb") as handle:
                handle.seek(0, os.SEEK_END)
                size = handle.tell()
                handle.seek(max(0, size - limit))
                lines = handle.read().splitlines()[1 if size > limit else 0:]
        except OSError:
            return []
        records = []
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                records.append(record)
        return records

    def _append(self, data: bytes) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
