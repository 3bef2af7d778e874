"""Audit records: one JSON line per change made to MAAS, on stdout and appended to maas.audit_log.

Every string in a record is capped (:func:`cap`): what MAAS supplies (hostnames, addresses, error
messages) cannot grow a record past its bound, nor fill the part of the log a restart reads.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime, timezone
from typing import Any

from maas_kubevirt import PROG
from maas_kubevirt.console import cap, warn
from maas_kubevirt.values import ValuesError

__all__ = ["Audit", "cap", "NAME_LIMIT", "MESSAGE_LIMIT", "MAX_LINE"]

# A name or address: a DNS name is at most 253 characters (RFC 1035) and a MAAS hostname, one
# label, at most 63; MAAS allows pool names of up to 256. So 256 keeps every valid one whole,
# and cuts only look-alikes such as an address with a port suffix of megabytes.
NAME_LIMIT = 256
# A reason or note: a MAAS error line (cut at 300 by the client) or a note naming a few
# machines and their addresses; 2048 keeps those whole.
MESSAGE_LIMIT = 2048
# Read back, a line longer than this is skipped without counting against the part of the log
# read: only a log written before the caps holds one (a 2 MB address wrote 4.4 MB). A capped
# record is far shorter; one checkpoint of many machines' identities (~150 bytes a machine at
# most) stays under it up to ~14,000 machines.
MAX_LINE = 2 * 2**20


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Audit:
    """One JSON line per change: to stdout and, if configured, appended to maas.audit_log."""

    def __init__(self, path: str = "", stream: Any = None):
        """stream: where each record is printed (stdout by default; a command whose stdout is its
        result, such as compose, passes stderr)."""
        self.path = path
        self.stream = stream
        if path:
            try:
                self._append(b"")
            except OSError as error:
                # The package's service makes /var/log/maas-kubevirt and the file on its first start
                # (LogsDirectory=); a file root made first would be one the service cannot append to.
                hint = (f": start the service first (`systemctl start {PROG}` makes it), or create the directory"
                        if not os.path.isdir(os.path.dirname(path) or ".") else "")
                raise ValuesError(
                    [f"maas.audit_log: expected a file the reconciler can append to, "
                     f"found {path!r}: {error.strerror or error}{hint}"]
                ) from None
        self.warned = False

    def write(self, action: str, system_id: str | None, hostname: str | None,
              before: Any, after: Any, outcome: str, reason: str = "", note: str = "",
              **extra: Any) -> dict:
        """Write one record, every string in it capped: names at NAME_LIMIT, the rest at MESSAGE_LIMIT."""
        record = {
            "time": _now(),
            "system_id": _capped(system_id, NAME_LIMIT),
            "hostname": _capped(hostname, NAME_LIMIT),
            "action": _capped(action, NAME_LIMIT),
            "before": _capped(before, NAME_LIMIT),
            "after": _capped(after, NAME_LIMIT),
            "outcome": _capped(outcome, NAME_LIMIT),
        }
        if reason:
            record["reason"] = _capped(reason, MESSAGE_LIMIT)
        if note:
            record["note"] = _capped(note, MESSAGE_LIMIT)
        record.update((_capped(key, NAME_LIMIT), _capped(value, MESSAGE_LIMIT))
                      for key, value in extra.items())
        line = json.dumps(record, sort_keys=False)
        print(line, file=self.stream or sys.stdout, flush=True)
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
    def read_file(path: str, limit: int = 4 * 2**20, longest: int = MAX_LINE) -> list[dict]:
        """The JSON records in the last ``limit`` bytes of an audit log's lines, oldest first,
        lines over ``longest`` skipped and not counted; [] when no file is set ("") or readable."""
        if not path:
            return []
        try:
            with open(path, "rb") as handle:
                lines = _last_lines(handle, limit, longest)
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


def _capped(value: Any, limit: int) -> Any:
    """value with every string in it capped (dict keys at NAME_LIMIT); other values unchanged."""
    if isinstance(value, str):
        return cap(value, limit)
    if isinstance(value, dict):
        return {_capped(str(k), NAME_LIMIT): _capped(v, limit) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_capped(v, limit) for v in value]
    return value


CHUNK = 2**16


def _last_lines(handle: Any, limit: int, longest: int) -> list[bytes]:
    """The last complete lines of a file, at most ``limit`` bytes of them, oldest first.

    Read backwards: a line over ``longest`` is passed over, not kept and not counted, so it
    neither fills the window nor hides the lines before it. At most 16 * limit bytes are read.
    """
    end = handle.seek(0, os.SEEK_END)
    floor = max(0, end - 16 * limit)
    lines: list[bytes] = []
    kept = 0
    pieces: list[bytes] = []     # the line being read, newest piece first; dropped once too long
    size = 0

    def finish() -> bool:
        """Keep the line read so far; False once the window is full."""
        nonlocal kept
        if 0 < size <= longest:
            if kept + size + 1 > limit:      # with its newline
                return False
            lines.append(b"".join(reversed(pieces)))
            kept += size + 1
        return True

    position = end
    while position > floor:
        step = min(CHUNK, position - floor)
        position -= step
        handle.seek(position)
        for index, piece in enumerate(reversed(handle.read(step).split(b"\n"))):
            if index:            # a newline precedes the line read so far: it is complete
                if not finish():
                    return lines[::-1]
                pieces, size = [], 0
            size += len(piece)
            if size <= longest:
                pieces.append(piece)
            else:
                pieces = []
    if position == 0:            # the file's first line; one cut at the floor is incomplete
        finish()
    return lines[::-1]
