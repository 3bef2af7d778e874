"""What the commands print for people: one-line messages on stderr, and plain tables.

Every message and cell goes through ``escape_controls``: text that came from MAAS (hostnames,
error bodies, versions) cannot carry terminal escapes or line breaks into the output.
"""

from __future__ import annotations

import sys
from typing import Any, Iterable, Sequence

from maas_kubevirt import PROG


def warn(message: str) -> None:
    print(f"{PROG}: warning: {escape_controls(message)}", file=sys.stderr, flush=True)


def error(message: str) -> None:
    """Each line of message as its own ``maas-kubevirt: error:`` line."""
    for line in str(message).splitlines() or [""]:
        print(f"{PROG}: error: {escape_controls(line)}", file=sys.stderr, flush=True)


def note(message: str) -> None:
    print(f"{PROG}: {escape_controls(message)}", file=sys.stderr, flush=True)


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
