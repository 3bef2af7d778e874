"""Reading the reference pages (docs/reference/) as the tests compare them with the code.

Each page keeps a plain Markdown shape that these functions read: tables whose first cell is a
backticked name, sections headed by a name. A page that loses that shape reads as empty, and
the tests then fail on every missing name.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference"
DOCTOR_PAGE = "docs/reference/doctor.md"
STATUSES = ("ok", "warn", "fail", "skip")


def cells(line: str) -> list[str]:
    """The cells of one Markdown table row (a `|` inside backticks is not a separator; GitHub
    needs it escaped there, `\\|`, which reads as `|`)."""
    parts, current, in_code = [], "", False
    for char in line.strip().strip("|").replace("\\|", "\0"):
        if char == "\0":
            current += "|"
            continue
        if char == "`":
            in_code = not in_code
        if char == "|" and not in_code:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    return [*parts, current.strip()]


def sections(text: str, level: str) -> dict[str, str]:
    """Heading text -> the text under it, for headings of exactly this level (`##`, `###`)."""
    found: dict[str, str] = {}
    pattern = re.compile(rf"^{level} (.+)$", re.M)
    heads = list(pattern.finditer(text))
    for head, following in zip(heads, [*heads[1:], None]):
        end = following.start() if following else len(text)
        body = text[head.end():end]
        deeper = re.search(r"^#{1,%d} " % len(level), body, re.M)
        found[head[1].strip()] = body[:deeper.start()] if deeper else body
    return found


def tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """Every table of the text: (its header's cells, its rows), each row a list of cells."""
    found, rows, in_table = [], [], False
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            if not in_table:
                in_table, rows = True, []
            rows.append(cells(line))
        elif in_table:
            in_table = False
            found.append((rows[0], rows[2:]))
    return found


def table(text: str, first: str) -> list[list[str]]:
    """The rows of the one table of the text whose header starts with this cell."""
    found = [rows for header, rows in tables(text) if header[0] == first]
    assert len(found) == 1, f"expected one table headed {first!r}, found {len(found)}"
    return found[0]


def code_spans(cell: str) -> list[str]:
    return re.findall(r"`([^`]*)`", cell)


def key_rows(text: str) -> dict[str, list[str]]:
    """First cell `name` -> the row's cells, for every table row whose first cell is one code span."""
    rows: dict[str, list[str]] = {}
    for _, rows_of_table in tables(text):
        for row in rows_of_table:
            match = re.fullmatch(r"`([^`]+)`", row[0])
            if match:
                assert match[1] not in rows, f"{match[1]} has two rows"
                rows[match[1]] = row
    return rows


def page(name: str) -> str:
    return (REFERENCE / name).read_text()


def doctor_rows() -> dict[str, dict[str, str]]:
    """docs/reference/doctor.md: check name -> {status or "fix": its text}, from `### `name`` sections
    and their `- ok: ...` bullets (a bullet runs on over its indented lines)."""
    rows: dict[str, dict[str, str]] = {}
    for head, body in sections((ROOT / DOCTOR_PAGE).read_text(), "###").items():
        match = re.fullmatch(r"`([^`]+)`", head)
        if not match:
            continue
        bullets = re.findall(r"^- (ok|warn|fail|skip|fix): (.+?)(?=^- |^\S|\Z)", body, re.M | re.S)
        rows[match[1]] = {kind: " ".join(said.split()) for kind, said in bullets}
    return rows


def doctor_check_names() -> list[str]:
    """The check names of docs/reference/doctor.md, in page order (duplicates kept, to be found)."""
    return re.findall(r"^### `([^`]+)`$", (ROOT / DOCTOR_PAGE).read_text(), re.M)
