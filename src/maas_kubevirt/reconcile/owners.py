"""Whose derived credentials a machine holds when no audit record says: the identities its name
and every other machine's name and address could be, and an index of their derived values."""

from __future__ import annotations

import hashlib
import itertools
from typing import Any, Callable, Iterable, Mapping

from maas_kubevirt import identity

# Readings of one hostname tried at most: every split with no dot first, then dots in the VM
# name. 64 reads every name of up to six dashes fully; a longer one in its dot-free readings.
MAX_READINGS = 64


def _readings(text: str) -> Iterable[tuple[str, str]]:
    """Each (vm, namespace) whose ``<vm with dots as dashes>-<namespace>`` is text, at most
    MAX_READINGS of them, those with no dot in the VM name first."""
    dashes = [at for at, char in enumerate(text) if char == "-"]
    splits = [(text[:at], text[at + 1:], [d for d in dashes if d < at]) for at in dashes]
    count = 0
    for vm, namespace, _ in splits:
        if count >= MAX_READINGS:
            return
        count += 1
        yield vm, namespace
    for dots in range(1, len(dashes)):
        for vm, namespace, inner in splits:
            for chosen in itertools.combinations(inner, dots):
                if count >= MAX_READINGS:
                    return
                count += 1
                chars = list(vm)
                for at in chosen:
                    chars[at] = "."
                yield "".join(chars), namespace


def _whose(text: str, rule: Callable[[str, str], str], name: str) -> set[tuple[str, str]]:
    """The readings of text whose hostname by rule is name."""
    found = set()
    for vm, namespace in _readings(text):
        try:
            if rule(vm, namespace) == name:
                found.add((vm, namespace))
        except identity.IdentityError:
            pass
    return found


def named(hostname: Any) -> frozenset[tuple[str, str]]:
    """The identities whose MAAS hostname, primary or fallback, this is (any pool: an operator may
    have moved it). A fallback whose ``<vm>-<ns>`` was cut to fit names none: its hash alone is left."""
    if not isinstance(hostname, str) or not hostname.isascii():
        return frozenset()
    name = hostname.lower()
    found = _whose(name, identity.maas_hostname, name)
    base, dash, suffix = name.rpartition("-")
    if dash and len(suffix) == identity.HASH_SUFFIX and all(c in "0123456789abcdef" for c in suffix):
        found |= _whose(base, identity.fallback_hostname, name)
    return frozenset(found)


def filed_as(machine: Mapping[str, Any]) -> tuple[str, str] | None:
    """The identity a machine's name says the reconciler filed it as, when that is all but certain:
    ``<vm>-<ns>`` in the pool ``<ns>``, or a fallback name (its hash names the serial) in any pool.
    A hint that costs nothing when wrong: only a stored credential equal to that identity's counts."""
    hostname, pool = machine.get("hostname"), machine.get("pool")
    pool = pool.get("name") if isinstance(pool, Mapping) else pool
    found = sorted(who for who in named(hostname)
                   if who[1] == pool or identity.fallback_hostname(*who) == str(hostname).lower())
    return found[0] if len(found) == 1 else None


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8")).digest()


class Owners:
    """The identities a derived credential found on a machine may be (the candidates), and which of
    them a stored value is. Values are looked up by their SHA-256, never compared or kept as such."""

    def __init__(self, passwords: Any):
        self.passwords = passwords
        # hostname -> the identities it names, for the machines last listed (kept between cycles).
        self.hostnames: dict[str, frozenset[tuple[str, str]]] = {}
        # digest of a derived user or password -> its identity; identity -> (generation, digests).
        self._index: dict[bytes, tuple[str, str]] = {}
        self._indexed: dict[tuple[str, str], tuple[int, tuple[bytes, bytes]]] = {}
        self._current = False   # whether the index follows the last listing and generations

    def listed(self, machines: Iterable[Mapping[str, Any]], complete: bool) -> None:
        """Note what the names of these machines could be; complete: they are every machine."""
        seen = {m.get("hostname") for m in machines if isinstance(m.get("hostname"), str)}
        kept = {h: self.hostnames[h] for h in seen if h in self.hostnames}
        fresh = {h: named(h) for h in seen if h not in self.hostnames}
        self.hostnames = {**({} if complete else self.hostnames), **kept, **fresh}

    def stale(self) -> None:
        """Names, addresses or generations may have changed: index again before the next lookup."""
        self._current = False

    def index(self, others: Iterable[tuple[str, str]]) -> None:
        """Make the index hold exactly the candidates: every listed name's identities and others,
        each at its current generation (a derived value is hashed again only when that changes)."""
        self._current = True
        wanted = set(others)
        for names in self.hostnames.values():
            wanted |= names
        for who in set(self._indexed) - wanted:
            self._drop(who)
        for who in wanted:
            generation = self.passwords.generation(*who)
            entry = self._indexed.get(who)
            if entry is not None and entry[0] == generation:
                continue
            self._drop(who)
            try:
                digests = (_digest(self.passwords.user(*who)), _digest(self.passwords.password(*who)))
            except identity.IdentityError:
                continue
            self._indexed[who] = (generation, digests)
            for digest in digests:
                self._index[digest] = who

    def _drop(self, who: tuple[str, str]) -> None:
        entry = self._indexed.pop(who, None)
        for digest in entry[1] if entry else ():
            if self._index.get(digest) == who:
                del self._index[digest]

    def owner(self, parameters: Mapping[str, Any],
              others: Callable[[], Iterable[tuple[str, str]]] = tuple) -> tuple[str, str] | None:
        """The candidate whose derived user or password one of these parameters holds, else None.
        The index is brought up to date (``others``: the candidates besides the listed names) only
        when a value of a derived one's shape is there: most machines hold none."""
        for value in parameters.values():
            if identity.derived_shape(value):
                if not self._current:
                    self.index(others())
                who = self._index.get(_digest(value))
                if who is not None:
                    return who
        return None

    def __len__(self) -> int:
        return len(self._indexed)
