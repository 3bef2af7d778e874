"""The seed: accepted forms, file checks (mode, owner, symlink, size), the systemd credential."""

from __future__ import annotations

import base64
import os
import secrets

import pytest
from hypothesis import given, strategies as st

from conftest import require
from maas_kubevirt import seed
from maas_kubevirt.values import ValuesError

GOOD = "c0ffee" * 11  # 66 hex digits: 33 bytes


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


@given(st.binary(min_size=32, max_size=96), st.sampled_from(["hex", "HEX", "b64", "b64url", "b64nopad"]))
def test_every_documented_encoding_of_32_bytes_or_more_is_accepted(raw, encoding):
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
