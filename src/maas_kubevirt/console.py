"""What the commands print for people: one-line messages on stderr, and plain tables."""

from __future__ import annotations

import sys
from typing import Any, Iterable, Sequence

from maas_kubevirt import PROG


def warn(message: str) -> None:
    print(f"{PROG}: warning: {message}", file=sys.stderr, flush=True)


def error(message: str) -> None:
    """Each line of message as its own ``maas-kubevirt: error:`` line."""
    for line in str(message).splitlines() or [""]:
        print(f"{PROG}: error: {line}", file=sys.stderr, flush=True)


def note(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    cells = [[("" if v is None else str(v)) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines)
