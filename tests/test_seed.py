"""The seed: accepted forms, file checks (mode, owner, symlink, size), the systemd credential."""

from __future__ import annotations

import base64
import os
import re
import secrets
from fractions import Fraction
from math import comb, factorial

import pytest
from hypothesis import assume, example, given, settings, strategies as st

from conftest import require
from maas_double import MaasDouble
from reconcile_helpers import write_values
from maas_kubevirt import cli, seed
from maas_kubevirt.values import ValuesError

GOOD = "9d41c07be35a8f26d1e04b7c93fa2856e0c7d3b19a4f62e85b07c1d9364ae2f0c5"  # 66 hex digits: 33 bytes


def period(data: bytes) -> int:
    """The shortest p with data[i] == data[i - p] for every i >= p, checked byte by byte."""
    return next(p for p in range(1, len(data) + 1) if all(data[i] == data[i - p] for i in range(p, len(data))))


def write(path, text, mode=0o600):
    path.write_text(text)
    path.chmod(mode)
    return path


def values(path=""):
    return {"seed": {"file": str(path)}}


def test_generated_seeds_are_64_hex_digits_and_accepted():
    made = {seed.generate() for _ in range(20)}
    assert len(made) == 20
    for text in made:
        assert len(text) == 64 and seed.random_bytes(text) == 32
        assert seed.check(text + "\n", "x") == text


ENCODINGS = ["hex", "HEX", "b64", "b64url", "b64nopad"]


def encode(raw: bytes, encoding: str) -> str:
    return {
        "hex": raw.hex(), "HEX": raw.hex().upper(),
        "b64": base64.b64encode(raw).decode(),
        "b64url": base64.urlsafe_b64encode(raw).decode(),
        "b64nopad": base64.b64encode(raw).decode().rstrip("="),
    }[encoding]


# Random bytes, as `openssl rand` makes them: drawn from a PRNG that hypothesis seeds, since its
# own binary() favours zeros and repeats. A random 32-byte seed is refused with odds of about
# 2**-54.8 (seed.MIN_DISTINCT); derandomize fixes the examples, so no run fails by chance.
@settings(derandomize=True, database=None)
@given(st.randoms(use_true_random=True), st.integers(32, 96), st.sampled_from(ENCODINGS))
def test_random_seeds_of_32_bytes_or_more_are_accepted_in_every_documented_encoding(rng, size, encoding):
    text = encode(rng.randbytes(size), encoding)
    assert seed.check(text + "\n", "seed.file") == text


@given(st.binary(min_size=1, max_size=31), st.sampled_from(["hex", "b64"]))
def test_fewer_than_32_bytes_are_refused_without_showing_the_seed(raw, encoding):
    text = raw.hex() if encoding == "hex" else base64.b64encode(raw).decode()
    with pytest.raises(ValuesError) as raised:
        seed.check(text, "seed.file")
    message = str(raised.value)
    assert message.startswith("seed.file: expected 64 or more hexadecimal digits")
    if len(text) >= 8:  # shorter ones could match words of the message by chance
        assert text not in message


def _guidance() -> str:
    """Every refusal's own words, for inputs that cannot be echoed by chance."""
    words = []
    for bad in ["", " ", "\n", "ab", "é" * 70, "0" * 63, "0" * 5000, "a b" * 30, "!" * 70]:
        try:
            seed.check(bad, "seed.file")
        except ValuesError as error:
            words.append(str(error))
    return "\n".join(words)


GUIDANCE = _guidance()


@given(st.text(min_size=1, max_size=200))
def test_any_text_is_either_a_strong_seed_or_refused_without_echo(text):
    try:
        accepted = seed.check(text, "seed.file")
    except ValuesError as error:
        stripped = text.strip()
        # hypothesis draws words from the code under test: "seed.file" is guidance, not an echo
        if len(stripped) >= 8 and stripped not in GUIDANCE:
            assert stripped not in str(error)
    else:
        assert seed.random_bytes(accepted) >= 32 and "\n" not in accepted and " " not in accepted


@pytest.mark.parametrize("text, problem", [
    ("", "an empty file"),
    ("\n", "an empty file"),
    (GOOD + " " + GOOD, "not one word"),
    (GOOD + "\n" + GOOD, "not one word"),
    ("z" * 70 + "!", "neither hexadecimal nor base64"),
    ("0123456789abcdef" * 2, "only 16 bytes"),
])
def test_malformed_seeds(text, problem):
    with pytest.raises(ValuesError, match=problem):
        seed.check(text, "seed.file")


@pytest.mark.parametrize("mode", [0o640, 0o620, 0o604, 0o602, 0o644, 0o660, 0o666, 0o700 | 0o010])
def test_group_or_world_permissions_are_refused(tmp_path, mode):
    path = write(tmp_path / "seed", GOOD, mode)
    with pytest.raises(ValuesError, match=f"has mode {mode:04o}.*chmod 600"):
        seed.read(path, "seed.file")


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_private_modes_are_accepted(tmp_path, mode):
    assert seed.read(write(tmp_path / "seed", GOOD + "\n", mode), "seed.file") == GOOD


def test_owned_by_another_user_is_refused(tmp_path):
    require(os.geteuid() == 0, "only root can give a file to another user")
    path = write(tmp_path / "seed", GOOD)
    os.chown(path, 4242, 4242)
    with pytest.raises(ValuesError, match="owned by uid 4242, not by root or by this user"):
        seed.read(path, "seed.file")


def test_not_a_regular_file_is_refused(tmp_path):
    fifo = tmp_path / "seed"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(ValuesError, match="not a regular file"):
        seed.read(fifo, "seed.file")  # and does not hang on the FIFO


def test_oversized_or_binary_files_are_refused(tmp_path):
    with pytest.raises(ValuesError, match="larger than 4096 bytes"):
        seed.read(write(tmp_path / "big", "a" * 5000), "seed.file")
    big = tmp_path / "bin"
    big.write_bytes(b"\xff" * 64)
    big.chmod(0o600)
    with pytest.raises(ValuesError, match="not ASCII text"):
        seed.read(big, "seed.file")


def test_a_symlink_is_refused_by_every_reader(tmp_path, monkeypatch):
    """render, reconcile, status and doctor all read through seed.read, which follows no link."""
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    real = write(tmp_path / "real", GOOD)
    link = tmp_path / "link"
    link.symlink_to(real)
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    for path in (link, dangling):
        message = (f"seed.file: {path} is a symbolic link; a seed file must be a regular file "
                   "(remove the link, or point seed.file at the real file)")
        for read in (lambda: seed.read(path, "seed.file"), lambda: seed.load(values(path)),
                     lambda: seed.for_render(values(path), tmp_path / "out")):
            with pytest.raises(ValuesError) as raised:
                read()
            assert str(raised.value) == message
    with pytest.raises(TypeError):
        seed.read(real, "seed.file", follow_symlinks=True)


def test_a_symlinked_credential_is_refused(tmp_path, monkeypatch):
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    (credentials / "seed").symlink_to(write(tmp_path / "real", GOOD))
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(credentials))
    with pytest.raises(ValuesError, match="^credential seed: .* is a symbolic link"):
        seed.load(values(""))


def test_reconcile_status_and_render_refuse_a_symlinked_seed_file_alike(tmp_path, capsys, monkeypatch):
    """Through the CLI: one line, the same for each, exit 2, and no request to MAAS."""
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    monkeypatch.delenv("MAAS_API_KEY", raising=False)
    with MaasDouble() as double:
        double.add_vm("web1", "vms")
        write(tmp_path / "real", GOOD + "\n")
        (tmp_path / "seed").symlink_to(tmp_path / "real")
        path = write_values(tmp_path, double)
        expected = (f"maas-kubevirt: error: seed.file: {tmp_path / 'seed'} is a symbolic link; a seed file "
                    "must be a regular file (remove the link, or point seed.file at the real file)\n")
        for command in (["reconcile", "--once"], ["reconcile", "--dry-run"], ["status"],
                        ["render", "--output", str(tmp_path / "out")]):
            assert cli.main(["--values", str(path), *command]) == 2, command
            out, err = capsys.readouterr()
            assert (out, err) == ("", expected), command
        assert double.request_count == 0 and double.writes == []
        assert not (tmp_path / "out").exists()


def test_load_needs_a_seed_file(monkeypatch):
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    with pytest.raises(ValuesError, match="seed.file: expected the seed file the bundle was rendered with"):
        seed.load(values(""))


@pytest.fixture
def nowhere(tmp_path, monkeypatch):
    """A working directory, and no installed seed: the usual seed files are what a test makes."""
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    monkeypatch.setattr(seed, "INSTALLED_SEED", tmp_path / "etc" / "seed")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_an_empty_seed_file_names_the_seed_render_generated(nowhere):
    (nowhere / "build").mkdir()
    write(nowhere / "build" / "seed", GOOD + "\n")
    with pytest.raises(ValuesError) as raised:
        seed.load(values(""))
    assert str(raised.value).endswith(f"set seed.file to {nowhere / 'build' / 'seed'} (it exists)")


def test_an_empty_seed_file_names_both_seeds_when_both_exist(nowhere):
    (nowhere / "build").mkdir()
    (nowhere / "etc").mkdir()
    write(nowhere / "build" / "seed", GOOD + "\n")
    write(nowhere / "etc" / "seed", GOOD + "\n")
    with pytest.raises(ValuesError) as raised:
        seed.load(values(""))
    assert f"set seed.file to {nowhere / 'etc' / 'seed'} or {nowhere / 'build' / 'seed'} (both exist" in str(raised.value)


def test_an_empty_seed_file_without_any_seed_suggests_no_file_as_if_it_existed(nowhere):
    with pytest.raises(ValuesError) as raised:
        seed.load(values(""))
    message = str(raised.value)
    assert f"no seed file at {nowhere / 'etc' / 'seed'} or ./build/seed: install the seed render generated" in message
    assert "set seed.file to " not in message.split("install the seed")[0]


def test_status_and_reconcile_name_the_seed_that_exists(nowhere, capsys):
    (nowhere / "build").mkdir()
    write(nowhere / "build" / "seed", GOOD + "\n")
    with MaasDouble() as double:
        path = write_values(nowhere, double)
        path.write_text(path.read_text().replace(str(nowhere / "seed"), "''"))
        for command in (["status"], ["reconcile", "--once"], ["reconcile", "--dry-run"]):
            assert cli.main(["--values", str(path), *command]) == 2, command
            err = capsys.readouterr().err
            assert f"set seed.file to {nowhere / 'build' / 'seed'} (it exists)" in err, command
            assert "/etc/maas-kubevirt/seed" not in err, command
        assert double.request_count == 0


def test_load_reads_seed_file(tmp_path, monkeypatch):
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    assert seed.load(values(write(tmp_path / "s", GOOD + "\n"))) == GOOD


def test_the_systemd_credential_takes_the_place_of_seed_file(tmp_path, monkeypatch):
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    other = secrets.token_hex(32)
    # systemd writes 0400 plus an ACL entry for the service's user: stat shows 0440.
    write(credentials / "seed", other + "\n", 0o440)
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(credentials))
    assert seed.load(values(write(tmp_path / "s", GOOD))) == other
    (credentials / "seed").chmod(0o444)
    with pytest.raises(ValuesError, match="credential seed: .* has mode 0444"):
        seed.load(values(""))
    (credentials / "seed").unlink()
    assert seed.load(values(write(tmp_path / "s", GOOD))) == GOOD


def test_for_render_generates_but_does_not_write(tmp_path):
    text, path = seed.for_render(values(""), tmp_path / "out")
    assert path == tmp_path / "out" / "seed" and seed.random_bytes(text) == 32
    assert not (tmp_path / "out").exists()
    write(tmp_path / "seed", GOOD)
    assert seed.for_render(values(""), tmp_path) == (GOOD, None)


# --- seeds that are not random (issue 18) ------------------------------------------------------


@given(st.binary(min_size=1, max_size=16), st.integers(32, 200), st.sampled_from(ENCODINGS))
@example(b"\x00", 32, "hex")          # 64 zeros
@example(b"\x5e\xed", 32, "hex")      # "5eed" * 16
@example(bytes(range(8)), 32, "b64")
@example(bytes.fromhex(GOOD)[:16], 32, "hex")   # a random 16-byte value written twice
def test_bytes_repeating_a_pattern_of_up_to_half_their_length_are_refused_with_the_reason(pattern, size, encoding):
    raw = (pattern * size)[:size]
    text = encode(raw, encoding)
    # Base64 made only of hexadecimal digits ("AAAA..." for zeros) reads as hexadecimal, first.
    raw = seed.decoded(text)
    assume(len(raw) >= seed.MIN_BYTES and period(raw) <= len(raw) // 2)
    with pytest.raises(ValuesError) as raised:
        seed.check(text + "\n", "seed.file")
    shortest = period(raw)
    reason = "every byte the same value" if shortest == 1 else f"a pattern of {shortest} bytes repeated"
    assert str(raised.value) == (f"seed.file: expected {seed.ACCEPTED}, found {len(raw)} bytes that are not random: "
                                 f"{reason}")
    assert text not in str(raised.value)


@given(st.binary(min_size=32, max_size=200))
def test_repeated_pattern_is_the_shortest_period_up_to_half_the_length(raw):
    shortest = period(raw)
    assert seed.repeated_pattern(raw) == (shortest if shortest <= len(raw) // 2 else None)


def test_a_pattern_longer_than_half_the_seed_is_no_repeat():
    raw = bytes.fromhex(GOOD)[:17] * 2   # 34 bytes: 17 repeated once, period 17 = half: refused
    assert seed.repeated_pattern(raw) == 17
    raw = raw[:33]                       # 33 bytes, period 17 > 16
    assert seed.repeated_pattern(raw) is None and seed.check(raw.hex(), "seed.file") == raw.hex()


def steps(*pattern: int, size: int = 32) -> str:
    """Hex of bytes that start at 0x42 and count by the steps, repeated."""
    data = [0x42]
    while len(data) < size:
        data.append((data[-1] + pattern[(len(data) - 1) % len(pattern)]) % 256)
    return bytes(data).hex()


@pytest.mark.parametrize("text, reason", [
    ("0" * 64, "every byte the same value"),
    ("f" * 128, "every byte the same value"),
    ("/" * 44, "every byte the same value"),                      # base64 of 33 bytes 0xff
    ("5eed" * 16, "a pattern of 2 bytes repeated"),
    ("c0ffee" * 11, "a pattern of 3 bytes repeated"),
    ("0123456789abcdef" * 4, "a pattern of 8 bytes repeated"),
    (GOOD[:32] * 2, "a pattern of 16 bytes repeated"),            # 16 random bytes, twice
    (GOOD[:34] * 4, "a pattern of 17 bytes repeated"),
    (bytes(range(32)).hex(), "bytes that count by a fixed step, as in 00 01 02 03 ..."),
    (steps(255, size=40), "bytes that count by a fixed step, as in 00 01 02 03 ..."),
    (steps(1, 7, 3), "bytes that count by a pattern of 3 steps repeated"),
    ("0" * 62 + "01", "only 2 distinct byte values, where random bytes take about 30"),
    ("00" * 18 + GOOD[:28], "only 15 distinct byte values, where random bytes take about 30"),
    (bytes(range(15)).hex() * 2 + "0e0e", "only 15 distinct byte values, where random bytes take about 30"),
])
def test_seeds_that_are_not_random_name_their_reason(text, reason):
    with pytest.raises(ValuesError, match=f"not random: {re.escape(reason)}$"):
        seed.check(text, "seed.file")


@pytest.mark.parametrize("text, reason", [
    ("0" * 62 + "01", "only 2 distinct byte values, where random bytes take about 30"),
    (GOOD[:32] * 2, "a pattern of 16 bytes repeated"),
])
def test_the_weak_seeds_of_issue_21_are_refused_with_how_to_make_a_good_one(text, reason):
    with pytest.raises(ValuesError) as raised:
        seed.check(text + "\n", "seed.file")
    assert str(raised.value) == ("seed.file: expected 64 or more hexadecimal digits, or base64 of 32 or more "
                                 "bytes (make one with `openssl rand -hex 32`), found 32 bytes that are not "
                                 f"random: {reason}")


def test_sixteen_distinct_values_are_enough():
    raw = bytes(17) + bytes.fromhex(GOOD)[:15]   # 17 zeros, then 15 distinct random bytes
    assert len(set(raw)) == 16 and seed.check(raw.hex(), "seed.file") == raw.hex()


def stirling2(n: int, k: int) -> int:
    """Ways to split n labelled items into k non-empty sets."""
    row = [1] + [0] * k
    for _ in range(n):
        row = [0] + [j * row[j] + row[j - 1] for j in range(1, k + 1)]
    return row[k]


def test_the_odds_that_a_random_32_byte_seed_is_refused_are_as_stated():
    """seed.py states them: about 2**-54.8 in all, dominated by the distinct-values rule."""
    n = seed.MIN_BYTES
    few = sum(Fraction(comb(256, k) * stirling2(n, k) * factorial(k), 256 ** n) for k in range(1, seed.MIN_DISTINCT))
    assert 3.2e-17 < few < 3.3e-17 and 2 ** -54.8 < few < 2 ** -54.7
    repeats = sum(Fraction(1, 256 ** (n - p)) for p in range(1, n // 2 + 1))
    counting = sum(Fraction(1, 256 ** (n - 1 - p)) for p in range(1, (n - 1) // 2 + 1))
    assert repeats < Fraction(1, 2 ** 127) and counting < Fraction(1, 2 ** 127)
    assert few + repeats + counting < Fraction(1, 2 ** 54)


def test_a_degenerate_seed_file_is_refused_by_every_reader(tmp_path, monkeypatch):
    """render, reconcile, status and doctor all read the seed through seed.read."""
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    path = write(tmp_path / "seed", "00" * 32 + "\n")
    for read in (lambda: seed.read(path, "seed.file"), lambda: seed.load(values(path)),
                 lambda: seed.for_render(values(path), tmp_path / "out"),
                 lambda: seed.for_render(values(""), tmp_path)):
        with pytest.raises(ValuesError, match="not random: every byte the same value"):
            read()


# --- rules pinned by their own test (issue 18 item 7) ------------------------------------------


def test_the_owner_is_judged_by_uid_not_by_group_root(tmp_path):
    require(os.geteuid() == 0, "only root can give a file to another user")
    path = write(tmp_path / "seed", GOOD)
    os.chown(path, 4243, 0)  # another user, in group root
    with pytest.raises(ValuesError, match="owned by uid 4243, not by root or by this user"):
        seed.read(path, "seed.file")
    os.chown(path, 0, 4243)  # root, in another group
    assert seed.read(path, "seed.file") == GOOD


def test_base64_of_exactly_31_bytes_is_refused_and_32_accepted():
    raw = bytes.fromhex(GOOD)
    short, enough = base64.b64encode(raw[:31]).decode(), base64.b64encode(raw[:32]).decode()
    with pytest.raises(ValuesError, match="found 44 characters that are only 31 bytes$"):
        seed.check(short, "seed.file")
    assert seed.check(enough, "seed.file") == enough
    assert seed.check(enough.rstrip("="), "seed.file") == enough.rstrip("=")


def test_doctor_points_an_empty_seed_file_at_the_seed_that_exists(nowhere):
    from maas_kubevirt.doctor.maas import seed_file_check
    check, _ = seed_file_check("")
    assert check.status == "fail"
    assert check.fix.startswith(f"set seed.file in the values, e.g. {nowhere / 'etc' / 'seed'}, then `install -m 600")
    (nowhere / "build").mkdir()
    write(nowhere / "build" / "seed", GOOD + "\n")
    check, _ = seed_file_check("")
    assert check.fix == f"set seed.file to {nowhere / 'build' / 'seed'} (it exists)"
