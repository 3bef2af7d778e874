"""Audit records: every string capped (issue 21 item 7), and the restore that reads them back."""

from __future__ import annotations

import io
import json
import re
import sys
from pathlib import Path

import pytest
from hypothesis import example, given, strategies as st

sys.path.insert(0, str(Path(__file__).parent))

from maas_kubevirt import audit, console  # noqa: E402
from maas_kubevirt.audit import MESSAGE_LIMIT, NAME_LIMIT, Audit, cap  # noqa: E402
from maas_kubevirt.reconcile import COMMISSION, SUSPECT, Backoff  # noqa: E402

MARKER = re.compile(r"\.\.\.\[\+(\d+) characters cut\]\Z")
MB2 = 2 * 2**20
# An address as a PXE host can enlist it: the VM's bare host, then a port of 2 MB.
HUGE_ADDRESS = "web1.vms.bmc.example.com:" + "9" * MB2


# --- cap ----------------------------------------------------------------------------------------


@given(st.text(max_size=600) | st.integers(0, 3000).map(lambda n: "x" * n),
       st.integers(console.SHORTEST_LIMIT, 700))
@example("a" * MB2, NAME_LIMIT)
@example("a" * 1000, 64)
@example("\U0001f600" * 300, 100)
def test_cap_keeps_short_text_and_marks_how_much_it_cut(text, limit):
    capped = cap(text, limit)
    assert len(capped) <= limit
    if len(text) <= limit:
        assert capped == text
        return
    found = MARKER.search(capped)
    assert found, capped
    kept = capped[:found.start()]
    assert text.startswith(kept)                           # the prefix, unchanged
    assert int(found.group(1)) == len(text) - len(kept)    # the marker says how much was cut
    assert len(capped) >= limit - 1                        # and little room is wasted


def test_cap_refuses_a_limit_too_small_for_its_marker():
    with pytest.raises(ValueError, match="no room for the marker"):
        cap("a" * 100, console.SHORTEST_LIMIT - 1)


def test_a_cut_keeps_the_start_and_names_the_rest():
    # 172 characters kept, and the marker's 28: "...[+2097080 characters cut]"
    assert cap("a" * (MB2 + 100), 200) == "a" * 172 + f"...[+{MB2 + 100 - 172} characters cut]"


# --- the bound of a record ----------------------------------------------------------------------

# json.dumps (ASCII only) writes any character in at most 12 bytes: an astral one as two \uXXXX.
BYTES_PER_CHARACTER = 12


def record_bound(extra_keys=()) -> int:
    """The longest line Audit.write can print with these extra fields, each a string."""
    skeleton = json.dumps({"time": "2025-01-01T00:00:00.000000Z", "system_id": "", "hostname": "",
                           "action": "", "before": "", "after": "", "outcome": "", "reason": "",
                           "note": "", **{key: "" for key in extra_keys}})
    characters = 6 * NAME_LIMIT + 2 * MESSAGE_LIMIT + len(extra_keys) * MESSAGE_LIMIT
    return len(skeleton) + BYTES_PER_CHARACTER * characters


def test_the_bound_of_a_record_with_no_extras_is_under_70_kb():
    assert record_bound() < 70_000


@pytest.mark.parametrize("character", ["9", "\U0001f600", "\x00", '"', "\u202e"])
def test_a_record_with_a_2_mb_address_and_reason_stays_under_the_bound(tmp_path, capsys, character):
    huge = "web1.vms.bmc.example.com:" + character * MB2
    log = tmp_path / "audit.log"
    written = Audit(str(log)).write(SUSPECT, huge, huge, huge, huge, huge, reason=huge, note=huge,
                                    retry_at=huge, **{"x" * 300: huge})
    line = log.read_text().splitlines()[0]
    assert capsys.readouterr().out.splitlines() == [line]     # stdout gets the same capped line
    assert len(line.encode()) <= record_bound(["retry_at", cap("x" * 300, NAME_LIMIT)])
    record = json.loads(line)
    assert record == written
    for field in ("system_id", "hostname", "before", "after", "outcome"):
        assert len(record[field]) <= NAME_LIMIT and record[field].startswith("web1.vms.bmc.example.com:")
        assert MARKER.search(record[field])
    for field in ("reason", "note", "retry_at"):
        assert len(record[field]) <= MESSAGE_LIMIT and MARKER.search(record[field])


def test_valid_names_and_ordinary_messages_are_written_whole(tmp_path):
    longest_name = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 61])    # 253 characters
    reason = "POST machines/abc123/op-commission: 409: " + "x" * 300
    record = Audit().write(COMMISSION, "abc123", "h" * 63, longest_name, "Commissioning", "failed",
                           reason, "note", failures=3, identities={"abc123": "web1.vms"})
    assert (record["before"], record["hostname"], record["reason"]) == (longest_name, "h" * 63, reason)
    assert record["failures"] == 3 and record["identities"] == {"abc123": "web1.vms"}


def test_strings_inside_containers_are_capped_too():
    record = Audit().write("x", None, None, None, None, "ok", items=[HUGE_ADDRESS], by={HUGE_ADDRESS: HUGE_ADDRESS})
    assert len(record["items"][0]) <= MESSAGE_LIMIT
    [(key, value)] = record["by"].items()
    assert len(key) <= NAME_LIMIT and len(value) <= MESSAGE_LIMIT


# --- console lines ------------------------------------------------------------------------------


@pytest.mark.parametrize("say", [console.warn, console.note, console.error])
def test_a_console_line_carrying_a_huge_address_is_capped(capsys, say):
    say(f"abc123 {HUGE_ADDRESS}: suspect")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) <= console.LINE_LIMIT + 1
    assert err.startswith("maas-kubevirt: ") and "web1.vms.bmc.example.com:999" in err
    assert MARKER.search(err.rstrip("\n"))


def test_a_console_line_is_capped_after_escaping(capsys):
    """An escape lengthens the text (ESC is printed as four characters): the cut comes after it."""
    console.warn("\x1b" * 5000)
    err = capsys.readouterr().err
    assert len(err) <= console.LINE_LIMIT + 1 and err.startswith("maas-kubevirt: warning: \\x1b\\x1b")
    assert "\x1b" not in err and MARKER.search(err.rstrip("\n"))


# --- the restore: read_file --------------------------------------------------------------------


def commission_failed(log: Audit, sid: str, failures: int = 1) -> None:
    log.write(COMMISSION, sid, f"host-{sid}", "New", "Commissioning", "failed", "MAAS said no",
              retry_at="2999-01-01T00:00:00Z", failures=failures)


def test_the_restore_survives_an_old_line_of_4_4_mb(tmp_path, capsys):
    """A log written before the caps: one suspect record of 4.4 MB between backoffs."""
    path = tmp_path / "audit.log"
    log = Audit(str(path))
    for number in range(20):
        commission_failed(log, f"old{number:03d}")
    old = {"time": "2025-01-01T00:00:00.000000Z", "system_id": "evil01", "hostname": "evil",
           "action": SUSPECT, "before": "web1.vms.bmc.example.com:" + "9" * 2_200_000, "after": None,
           "outcome": "refused", "note": "suspect: " + "web1.vms.bmc.example.com:" + "9" * 2_200_000}
    with path.open("a") as handle:
        handle.write(json.dumps(old) + "\n")
    assert path.stat().st_size > 4_400_000
    commission_failed(log, "new001")
    capsys.readouterr()
    records = Audit.read_file(str(path))
    assert [r["system_id"] for r in records] == [f"old{n:03d}" for n in range(20)] + ["new001"]
    backoff = Backoff(60, clock=lambda: 0)
    backoff.restore(records)
    assert set(backoff.pending()) == {f"old{n:03d}" for n in range(20)} | {"new001"}


def test_the_window_still_ends_where_the_limit_says(tmp_path, capsys):
    """Lines within the bound fill the window as before: the oldest beyond it are not read."""
    path = tmp_path / "audit.log"
    log = Audit(str(path))
    for number in range(100):
        commission_failed(log, f"m{number:03d}")
    capsys.readouterr()
    lines = path.read_bytes().splitlines()
    limit = sum(len(line) + 1 for line in lines[-30:])
    assert [r["system_id"] for r in Audit.read_file(str(path), limit)] == [f"m{n:03d}" for n in range(70, 100)]
    assert [r["system_id"] for r in Audit.read_file(str(path), limit - 1)] == [f"m{n:03d}" for n in range(71, 100)]


def reference(data: bytes, limit: int, longest: int) -> list[bytes]:
    """What _last_lines must answer, computed forwards from every line's start."""
    floor = max(0, len(data) - 16 * limit)
    starts, lines = [0], data.split(b"\n")
    for line in lines[:-1]:
        starts.append(starts[-1] + len(line) + 1)
    kept, found = 0, []
    for start, line in reversed(list(zip(starts, lines))):
        if start < floor or (start == floor and floor > 0):
            break                        # begins before what is read: incomplete
        if not line or len(line) > longest:
            continue
        if kept + len(line) + 1 > limit:     # a line costs its newline too
            break
        found.append(line)
        kept += len(line) + 1
    return found[::-1]


@given(st.lists(st.integers(0, 40) | st.sampled_from([60, 200]), max_size=30), st.booleans(),
       st.integers(1, 120), st.integers(1, 50), st.integers(1, 9))
def test_last_lines_matches_its_reference(sizes, final_newline, limit, longest, chunk):
    """Small chunks, lines and windows: every way a line can straddle chunks and the floor."""
    data = b"\n".join(bytes([97 + i % 26]) * size for i, size in enumerate(sizes)) + (b"\n" if final_newline else b"")
    original = audit.CHUNK
    audit.CHUNK = chunk
    try:
        assert audit._last_lines(io.BytesIO(data), limit, longest) == reference(data, limit, longest)
    finally:
        audit.CHUNK = original


def test_unset_or_unreadable_logs_read_as_nothing(tmp_path):
    assert Audit.read_file("") == [] and Audit.read_file(str(tmp_path / "missing")) == []
    (tmp_path / "empty").write_bytes(b"")
    assert Audit.read_file(str(tmp_path / "empty")) == []
