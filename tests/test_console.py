"""console.table: aligned columns, and wrapped columns that fit a width."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from maas_kubevirt import console
from tables import read_table, squeezed

HEADERS = ("CHECK", "STATUS", "FOUND", "FIX")
words = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=40)
cells = st.lists(words, max_size=12).map(" ".join)
rows = st.lists(st.tuples(st.text("abcdefghij.", min_size=1, max_size=24), st.sampled_from(["ok", "fail"]),
                          cells, cells), max_size=8)


@given(rows, st.integers(min_value=40, max_value=200))
def test_wrapped_lines_fit_and_keep_every_character(table_rows, width):
    text = console.table(HEADERS, table_rows, width, wrap=(2, 3))
    lines = text.splitlines()
    fixed = max([len("CHECK"), *(len(r[0]) for r in table_rows)]) + 2 + len("STATUS") + 2
    if fixed + 2 + 2 * console.MIN_WRAP_WIDTH <= width:
        assert all(len(line) <= width for line in lines), text
    assert read_table(text) == squeezed([HEADERS, *table_rows])
    # Each row starts a line with its first cell; its continuation lines leave that column blank.
    starts = [line for line in lines[1:] if not line.startswith(" ")]
    assert [line.split()[0] for line in starts] == [r[0] for r in table_rows]


@given(rows)
def test_without_a_width_or_with_room_nothing_wraps(table_rows):
    unwrapped = console.table(HEADERS, table_rows)
    assert len(unwrapped.splitlines()) == 1 + len(table_rows)
    widest = max(len(line) for line in unwrapped.splitlines())
    assert console.table(HEADERS, table_rows, widest, wrap=(2, 3)) == unwrapped


def test_the_narrower_wrapped_column_keeps_its_width_and_the_other_wraps():
    fix = "run `maas-kubevirt --values site.yaml render --output build && kubectl apply -k build/kubernetes`"
    text = console.table(HEADERS, [("maas.script", "fail", "missing", fix)], 60, wrap=(2, 3))
    lines = text.splitlines()
    assert lines[1].split()[:3] == ["maas.script", "fail", "missing"]
    assert all(len(line) <= 60 for line in lines) and len(lines) > 2
    assert read_table(text)[1] == squeezed([("maas.script", "fail", "missing", fix)])[0]


@pytest.mark.parametrize("columns, tty, expected", [
    ("100", False, 100), ("", False, None), ("junk", False, None), ("0", False, None),
])
def test_terminal_width_is_columns_else_the_terminal_else_none(monkeypatch, columns, tty, expected):
    monkeypatch.setenv("COLUMNS", columns)
    monkeypatch.setattr(console.os, "isatty", lambda fd: tty)
    assert console.terminal_width() == expected


def test_terminal_width_of_a_terminal(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr(console.os, "isatty", lambda fd: True)
    monkeypatch.setattr(console.shutil, "get_terminal_size", lambda: __import__("os").terminal_size((93, 40)))
    assert console.terminal_width() == 93
