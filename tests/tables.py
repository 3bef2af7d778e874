"""Reading a console.table back into rows, wrapped cells joined: what a reader of the table sees."""

from __future__ import annotations


def read_table(text: str) -> list[list[str]]:
    """The rows of a table, header first; a line starting with a space continues the row above,
    and each cell's pieces are joined without their spaces (a long word may be cut anywhere)."""
    header, *lines = text.splitlines()
    starts = [i for i, char in enumerate(header) if char != " " and (i == 0 or header[i - 1] == " ")]
    bounds = list(zip(starts, starts[1:] + [None]))
    rows: list[list[str]] = [header.split()]
    for line in lines:
        cells = ["".join(line[start:end].split()) for start, end in bounds]
        if line.startswith(" ") and len(rows) > 1:
            rows[-1] = [a + b for a, b in zip(rows[-1], cells)]
        else:
            rows.append(cells)
    return rows


def squeezed(rows) -> list[list[str]]:
    """Rows of cells as read_table gives them: each cell without its spaces."""
    return [["".join(str(cell).split()) for cell in row] for row in rows]
