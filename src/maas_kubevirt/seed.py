"""The site secret every BMC password derives from: its accepted forms, its file, its checks.

One loader for every command. A seed is at least 32 random bytes written as 64 or more
hexadecimal digits (what ``render`` generates: ``openssl rand -hex 32`` makes the same) or as
base64 of 32 or more bytes (``openssl rand -base64 32``). Bytes that repeat a pattern, that
count by a repeated pattern of steps, or that take fewer than 16 distinct values are not random
and are refused (:func:`weakness`). The text itself, without its final newline, is the key:
Kyverno and the reconciler hash exactly that text.

A seed file must be a regular file, not a symbolic link, owned by root or by the user reading
it, with no permission for group or others (0600 or 0400): ``render``, ``reconcile``,
``status`` and ``doctor`` all read it through :func:`read`. Under systemd the service gets it
as the credential ``seed`` (``LoadCredential=``) in ``$CREDENTIALS_DIRECTORY``, which then
takes the place of ``seed.file``. No message here ever contains the seed.
"""

from __future__ import annotations

import base64
import binascii
import errno
import os
import re
import secrets
import stat
from pathlib import Path
from typing import Any, Mapping

from maas_kubevirt.paths import credential_path
from maas_kubevirt.values import ValuesError

SEED_FILE = "seed"            # <output>/seed when render generates it
# Where a seed file usually is: the package's place for it, and what `make` (render's default
# output, relative to where it runs) generates.
INSTALLED_SEED = Path("/etc/maas-kubevirt/seed")
RENDERED_SEED = Path("build") / SEED_FILE
CREDENTIAL = "seed"           # the systemd credential's name
MIN_BYTES = 32
# What refuses a seed as not random (weakness()): bytes that repeat a pattern of up to half their
# length ("00" * 32, "5eed" * 16, a 16-byte value written twice); bytes whose successive
# differences do so (0x00 0x01 0x02 ...: the first byte and the steps decide the rest); or bytes
# taking fewer than MIN_DISTINCT values ("0" * 62 + "01"). 32 random bytes take about 30.
# The odds that 32 truly random bytes (the smallest seed accepted) are refused, per rule:
#   repeating a pattern of p <= 16 bytes means the last 32 - p >= 16 bytes equal earlier ones:
#     sum over p = 1..16 of 256**-(32 - p) < 2**-127;
#   differences (31 of them, independent and uniform) repeating p <= 15: the same sum, < 2**-127;
#   fewer than 16 distinct values: sum over k < 16 of C(256, k) * S(32, k) * k! / 256**32
#     = 3.2e-17, about 2**-54.8 (S: Stirling numbers of the second kind; tests recompute it).
# So about 2**-54.8 in all; longer seeds are refused less often (more bytes only add values and
# lengthen the repeats).
MIN_DISTINCT = 16
MAX_FILE_BYTES = 4096
ACCEPTED = (f"{2 * MIN_BYTES} or more hexadecimal digits, or base64 of {MIN_BYTES} or more bytes "
            f"(make one with `openssl rand -hex {MIN_BYTES}`)")

_HEX = re.compile(r"[0-9a-fA-F]+\Z")
_BASE64 = re.compile(r"[A-Za-z0-9+/]+={0,2}\Z|[A-Za-z0-9_-]+={0,2}\Z")


def generate() -> str:
    """A fresh seed: 32 random bytes as 64 hexadecimal digits."""
    return secrets.token_hex(MIN_BYTES)


def decoded(text: str) -> bytes:
    """The bytes the seed text encodes (hexadecimal, else base64); empty when it is neither."""
    if _HEX.match(text):
        return bytes.fromhex(text[: len(text) - len(text) % 2])
    if _BASE64.match(text):
        padded = text + "=" * (-len(text) % 4)
        try:
            return base64.b64decode(padded.replace("-", "+").replace("_", "/"), validate=True)
        except (binascii.Error, ValueError):
            return b""
    return b""


def random_bytes(text: str) -> int:
    """How many bytes the seed text encodes (0 when it is neither hex nor base64)."""
    return len(decoded(text))


def repeated_pattern(data: bytes, longest: int | None = None) -> int | None:
    """The length of the shortest pattern (at most ``longest`` bytes, by default half of data)
    that data repeats from start to end, or None; 1 means every byte is the same value."""
    longest = len(data) // 2 if longest is None else longest
    for period in range(1, min(longest, len(data) - 1) + 1):
        if data[period:] == data[:-period]:
            return period
    return None


def weakness(data: bytes) -> str | None:
    """Why these bytes are not random (see MIN_DISTINCT for the rules and their odds), or None."""
    period = repeated_pattern(data)
    if period == 1:
        return "every byte the same value"
    if period is not None:
        return f"a pattern of {period} bytes repeated"
    steps = repeated_pattern(bytes((b - a) % 256 for a, b in zip(data, data[1:])))
    if steps is not None:
        return ("bytes that count by a fixed step, as in 00 01 02 03 ..." if steps == 1
                else f"bytes that count by a pattern of {steps} steps repeated")
    distinct = len(set(data))
    if distinct < MIN_DISTINCT:
        usual = round(256 * (1 - (255 / 256) ** len(data)))
        return f"only {distinct} distinct byte values, where random bytes take about {usual}"
    return None


def check(text: str, source: str) -> str:
    """The seed in text (one line, the final newline dropped), or ValuesError without the seed."""
    seed = text[:-1] if text.endswith("\n") else text
    seed = seed[:-1] if seed.endswith("\r") else seed
    if not seed:
        raise ValuesError([f"{source}: expected {ACCEPTED}, found an empty file"])
    if random_bytes(seed) < MIN_BYTES:
        raise ValuesError([f"{source}: expected {ACCEPTED}, found {len(seed)} characters "
                           f"that are {_shape(seed)}"])
    found = weakness(decoded(seed))
    if found is not None:
        raise ValuesError([f"{source}: expected {ACCEPTED}, found {random_bytes(seed)} bytes that are "
                           f"not random: {found}"])
    return seed


def _shape(seed: str) -> str:
    if any(c.isspace() for c in seed):
        return "not one word (spaces or several lines)"
    if _HEX.match(seed) or _BASE64.match(seed):
        return f"only {random_bytes(seed)} bytes"
    return "neither hexadecimal nor base64"


def read(path: Path, source: str, *, credential: bool = False, follow_symlinks: bool = False) -> str:
    """Read and check a seed file; refuse a symbolic link, or a file others could read or replace.

    Every command reads its seed here, and never through a link: whoever can write the link's
    directory could point it at another seed. (``follow_symlinks`` is kept, False only, for
    callers that still pass it.)

    A systemd credential is 0400 with an ACL entry for the service's user, which stat shows
    as a group read bit (systemd: src/core/execute.c, write_credential, fchmod 0400 then
    fd_add_uid_acl_permission, else fchown to the user): so group read is allowed there only.
    """
    if follow_symlinks:
        raise TypeError("seed.read never follows a symbolic link")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise ValuesError([f"{source}: {path} is a symbolic link; a seed file must be a "
                               "regular file (remove the link, or point seed.file at the real file)"]
                              ) from None
        raise ValuesError([f"{source}: expected a readable seed file, found {str(path)!r}: "
                           f"{error.strerror or type(error).__name__}"]) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValuesError([f"{source}: {path} is not a regular file"])
        allowed = stat.S_IRUSR | stat.S_IWUSR | (stat.S_IRGRP if credential else 0)
        if stat.S_IMODE(info.st_mode) & ~allowed & 0o077:
            raise ValuesError([f"{source}: {path} has mode {stat.S_IMODE(info.st_mode):04o}: others can "
                               f"read or change the seed; run `chmod 600 {path}`"])
        owners = {0, os.geteuid()}
        if info.st_uid not in owners:
            raise ValuesError([f"{source}: {path} is owned by uid {info.st_uid}, not by root or by "
                               f"this user (uid {os.geteuid()}): another user could change the seed; "
                               f"run `chown root: {path}`"])
        data = os.read(fd, MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise ValuesError([f"{source}: {path} is larger than {MAX_FILE_BYTES} bytes; expected {ACCEPTED}"])
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise ValuesError([f"{source}: {path} is not ASCII text; expected {ACCEPTED}"]) from None
    return check(text, f"{source} ({path})")


def load(values: Mapping[str, Any]) -> str:
    """The seed for the reconciler: the systemd credential ``seed``, else seed.file (required)."""
    given = credential_path(CREDENTIAL)
    if given is not None:
        return read(given, f"credential {CREDENTIAL}", credential=True)
    configured = values["seed"]["file"]
    if not configured:
        raise ValuesError([
            "seed.file: expected the seed file the bundle was rendered with (every BMC password "
            f"derives from it), found an empty string; {where_to_point()}"
        ])
    return read(Path(configured), "seed.file")


def existing_seed_files() -> list[Path]:
    """The usual seed files that exist here, absolute: the installed one, then render's in ./build."""
    return [path.absolute() for path in (INSTALLED_SEED, RENDERED_SEED) if path.is_file()]


def where_to_point() -> str:
    """How to set seed.file, naming the seed files that exist rather than one that may not."""
    found = existing_seed_files()
    if len(found) == 1:
        return f"set seed.file to {found[0]} (it exists)"
    if found:
        return (f"set seed.file to {' or '.join(map(str, found))} (both exist: pick the one the "
                "cluster was rendered with)")
    return (f"no seed file at {INSTALLED_SEED} or ./{RENDERED_SEED}: install the seed render generated "
            f"(DIR/seed, e.g. `install -m 600 build/seed {INSTALLED_SEED}`) and set seed.file to it")


def for_render(values: Mapping[str, Any], output: Path | None) -> tuple[str, Path | None]:
    """(seed, file to create) for render: seed.file, else ``<output>/seed``, else a new seed.

    The new seed is returned, not written: render writes it with the rest once all is checked.
    ``<output>/seed`` must not be a symbolic link (one planted there would take the seed).
    """
    configured = values["seed"]["file"]
    if configured:
        return read(Path(configured), "seed.file"), None
    if output is None:
        raise ValuesError(
            ["seed.file: expected a seed file when rendering to stdout, found an empty string "
             "(render to a directory once and point seed.file at <directory>/seed)"]
        )
    path = output / SEED_FILE
    if path.is_symlink():
        raise ValuesError([f"seed: {path} is a symbolic link; render will neither follow nor "
                           "replace it: remove it, or set seed.file to the seed you mean"])
    if path.exists():
        return read(path, "seed"), None
    return generate(), path
