"""What the commands print for people: one-line messages on stderr, and plain tables.

Every message and cell goes through ``escape_controls``: text that came from MAAS (hostnames,
error bodies, versions) cannot carry terminal escapes or line breaks into the output. Every
message line is cut to ``LINE_LIMIT`` characters (:func:`cap`), so one huge hostname or address
cannot write megabytes into the journal.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import textwrap
from typing import Any, Iterable, Sequence

import yaml

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


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], width: int | None = None,
          wrap: Sequence[int] = ()) -> str:
    """Rows in aligned columns; with a width, the columns in wrap share what the others leave and
    their cells wrap onto more lines, so that lines fit (unless even MIN_WRAP_WIDTH does not)."""
    cells = [[("" if v is None else escape_controls(v)) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row)]
    if width is not None and wrap:
        widths = _fitted(widths, [len(h) for h in headers], width, wrap)
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    for row in cells:
        parts = [_wrapped(c, w) if i in wrap else [c] for i, (c, w) in enumerate(zip(row, widths))]
        for depth in range(max(len(p) for p in parts)):
            line = [(p[depth] if depth < len(p) else "").ljust(w) for p, w in zip(parts, widths)]
            lines.append("  ".join(line).rstrip())
    return "\n".join(lines)


# A wrapped column is never narrower than this (nor than its header): below it a cell would be a
# column of fragments, harder to read than a line the terminal wraps itself.
MIN_WRAP_WIDTH = 16


def _fitted(natural: list[int], headers: list[int], width: int, wrap: Sequence[int]) -> list[int]:
    """Column widths within width: the wrapped columns share the room left, the narrower ones
    keeping their natural width and the rest splitting what remains evenly."""
    fixed = sum(w for i, w in enumerate(natural) if i not in wrap) + 2 * (len(natural) - 1)
    room = width - fixed
    if sum(natural[i] for i in wrap) <= room:
        return natural
    fitted = list(natural)
    left = sorted(wrap, key=lambda i: natural[i])
    while left:
        share = room // len(left)
        column = left.pop(0)
        fitted[column] = max(min(natural[column], share), MIN_WRAP_WIDTH, headers[column])
        room -= fitted[column]
    return fitted


def _wrapped(text: str, width: int) -> list[str]:
    """text in lines of at most width characters, broken at spaces where it can be."""
    if len(text) <= width:
        return [text]
    return textwrap.wrap(text, width, break_long_words=True, break_on_hyphens=False) or [""]


# -o FORMAT of status, doctor and reconcile --dry-run, as kubectl's: the table is the default.
TABLE, JSON, YAML, WIDE = "table", "json", "yaml", "wide"
OUTPUT_FORMATS = (JSON, YAML, WIDE)


def output_format(args: Any) -> str:
    """-o's format; the deprecated --json (a bool where a caller builds args itself) is -o json."""
    return getattr(args, "output", None) or (JSON if getattr(args, "json", False) else TABLE)


def document(data: Any, output: str) -> str:
    """data as YAML for -o yaml, else as JSON; both escape every control character it holds."""
    if output == YAML:
        return yaml.safe_dump(data, sort_keys=False, default_flow_style=False).rstrip("\n")
    return json.dumps(data, indent=2)


def terminal_width(piped: int | None = None) -> int | None:
    """The width to fit a table to: COLUMNS, else stdout's terminal; when stdout is not a
    terminal, piped (None: no limit, as ps does, so that `status | grep` finds a whole row)."""
    try:
        columns = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        columns = 0
    if columns > 0:
        return columns
    try:
        if not os.isatty(sys.stdout.fileno()):
            return piped
    except (OSError, ValueError, AttributeError):
        return piped
    return shutil.get_terminal_size().columns


def escape_controls(text: str) -> str:
    """Every character Python does not call printable (controls, format characters such as bidi
    overrides, line and paragraph separators, unassigned code points, spaces other than " ") as
    ``\\xNN``/``\\uNNNN``: text from MAAS cannot move the cursor, recolour a terminal, break a
    line or reorder what follows."""
    return "".join(
        char if char.isprintable() else char.encode("unicode_escape").decode("ascii")
        for char in str(text)
    )
