"""What the commands print for people: one-line messages on stderr, and plain tables.

Every message and cell goes through ``escape_controls``: text that came from MAAS (hostnames,
error bodies, versions) cannot carry terminal escapes or line breaks into the output. Every
message line is cut to ``LINE_LIMIT`` characters (:func:`cap`), so one huge hostname or address
cannot write megabytes into the journal.
"""

from __future__ import annotations

import sys
from typing import Any, Iterable, Sequence

from maas_kubevirt import PROG

# A message names at most a machine (system_id, hostname, address: each a DNS name of at most
# 253 characters, capped at 256 in audit records) and a note or reason (capped at 2048 there):
# 4096 keeps every such line whole and cuts only what MAAS sent oversized.
LINE_LIMIT = 4096
SHORTEST_LIMIT = 64           # room for the marker of any length Python can hold


def cap(text: str, limit: int) -> str:
    """text when at most limit characters long, else its start and ``...[+N characters cut]``
    in at most limit characters (N counts what was cut)."""
    if limit < SHORTEST_LIMIT:
        raise ValueError(f"cap: limit {limit} leaves no room for the marker")
    if len(text) <= limit:
        return text
    kept = limit
    while True:  # the marker's length depends on how much it says was cut: at most 3 rounds
        marker = f"...[+{len(text) - kept} characters cut]"
        if kept + len(marker) <= limit:
            return text[:kept] + marker
        kept = limit - len(marker)


def warn(message: str) -> None:
    print(_line(f"{PROG}: warning: ", message), file=sys.stderr, flush=True)


def error(message: str) -> None:
    """Each line of message as its own ``maas-kubevirt: error:`` line."""
    for line in str(message).splitlines() or [""]:
        print(_line(f"{PROG}: error: ", line), file=sys.stderr, flush=True)


def note(message: str) -> None:
    print(_line(f"{PROG}: ", message), file=sys.stderr, flush=True)


def _line(prefix: str, message: str) -> str:
    return cap(prefix + escape_controls(message), LINE_LIMIT)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    cells = [[("" if v is None else escape_controls(v)) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines)


def escape_controls(text: str) -> str:
    """Every character Python does not call printable (controls, format characters such as bidi
    overrides, line and paragraph separators, unassigned code points, spaces other than " ") as
    ``\\xNN``/``\\uNNNN``: text from MAAS cannot move the cursor, recolour a terminal, break a
    line or reorder what follows."""
    return "".join(
        char if char.isprintable() else char.encode("unicode_escape").decode("ascii")
        for char in str(text)
    )
