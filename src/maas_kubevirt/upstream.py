"""The upstream releases the test tiers prove maas-kubevirt on (upstream.lock.yaml), for doctor."""

from __future__ import annotations

import re
from pathlib import Path

from maas_kubevirt.paths import data_dir

LOCK_NAME = "upstream.lock.yaml"
_LINE = re.compile(r"(?P<name>[a-z0-9-]+):\s*(?P<version>[^\s#]+(?:[ \t]+[^\s#]+)*)\s*(#.*)?")
# A `<name>-proven:` line lists every release the tiers prove, the pinned one among them.
PROVEN_SUFFIX = "-proven"


def proven(path: Path | None = None) -> dict[str, str]:
    """name -> release from the lock file (flat ``name: version`` lines); {} when it cannot be read."""
    try:
        text = (path or data_dir() / LOCK_NAME).read_text(encoding="utf-8")
    except OSError:
        return {}
    found = {}
    for line in text.splitlines():
        match = _LINE.fullmatch(line.strip())
        if match:
            found[match["name"]] = match["version"]
    return found


def proven_releases(name: str, lock: dict[str, str] | None = None) -> tuple[str, ...]:
    """Every release of ``name`` the tiers prove: its ``<name>-proven:`` line (space-separated),
    else the pinned ``<name>:`` alone; () when the lock names neither."""
    lock = proven() if lock is None else lock
    listed = lock.get(name + PROVEN_SUFFIX, "").split()
    if listed:
        return tuple(listed)
    return (lock[name],) if lock.get(name) else ()
