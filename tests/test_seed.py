"""The seed: accepted forms, file checks (mode, owner, symlink, size), the systemd credential."""

from __future__ import annotations

import base64
import os
import secrets

import pytest
from hypothesis import assume, example, given, strategies as st

from conftest import require
from maas_kubevirt import seed
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


@given(st.binary(min_size=32, max_size=96), st.sampled_from(ENCODINGS))
def test_every_documented_encoding_of_32_bytes_or_more_is_accepted(raw, encoding):
    assume(period(raw) > seed.LONGEST_PATTERN)
    text = {
        "hex": raw.hex(), "HEX": raw.hex().upper(),
        "b64": base64.b64encode(raw).decode(),
        "b64url": base64.urlsafe_b64encode(raw).decode(),
        "b64nopad": base64.b64encode(raw).decode().rstrip("="),
    }[encoding]
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


def test_symlinks_are_followed_for_seed_file_but_not_for_output_seed(tmp_path):
    real = write(tmp_path / "real", GOOD)
    link = tmp_path / "link"
    link.symlink_to(real)
    assert seed.read(link, "seed.file") == GOOD
    with pytest.raises(ValuesError, match="is a symbolic link"):
        seed.read(link, "seed", follow_symlinks=False)


def test_load_needs_a_seed_file(monkeypatch):
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    with pytest.raises(ValuesError, match="seed.file: expected the seed file the bundle was rendered with"):
        seed.load(values(""))


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


@given(st.binary(min_size=1, max_size=seed.LONGEST_PATTERN), st.integers(32, 200), st.sampled_from(ENCODINGS))
@example(b"\x00", 32, "hex")          # 64 zeros
@example(b"\x5e\xed", 32, "hex")      # "5eed" * 16
@example(bytes(range(8)), 32, "b64")
def test_bytes_repeating_a_short_pattern_are_refused_with_the_reason(pattern, size, encoding):
    raw = (pattern * size)[:size]
    text = encode(raw, encoding)
    with pytest.raises(ValuesError) as raised:
        seed.check(text + "\n", "seed.file")
    # Base64 made only of hexadecimal digits ("AAAA..." for zeros) reads as hexadecimal, first.
    raw = seed.decoded(text)
    size = len(raw)
    shortest = period(raw)
    reason = "every byte the same value" if shortest == 1 else f"a pattern of {shortest} bytes repeated"
    assert str(raised.value) == (f"seed.file: expected {seed.ACCEPTED}, found {size} bytes that are not random: "
                                 f"{reason}")
    assert text not in str(raised.value)


@given(st.binary(min_size=32, max_size=200))
def test_repeated_pattern_is_the_shortest_period_up_to_eight(raw):
    shortest = period(raw)
    assert seed.repeated_pattern(raw) == (shortest if shortest <= seed.LONGEST_PATTERN else None)


def test_a_pattern_of_nine_bytes_is_not_short():
    raw = (bytes(range(9)) * 4)[:36]
    assert seed.repeated_pattern(raw) is None and seed.check(raw.hex(), "seed.file") == raw.hex()


@pytest.mark.parametrize("text, reason", [
    ("0" * 64, "every byte the same value"),
    ("f" * 128, "every byte the same value"),
    ("/" * 44, "every byte the same value"),                      # base64 of 33 bytes 0xff
    ("5eed" * 16, "a pattern of 2 bytes repeated"),
    ("c0ffee" * 11, "a pattern of 3 bytes repeated"),
    ("0123456789abcdef" * 4, "a pattern of 8 bytes repeated"),
])
def test_degenerate_seeds_name_their_reason(text, reason):
    with pytest.raises(ValuesError, match=f"not random: {reason}$"):
        seed.check(text, "seed.file")


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
