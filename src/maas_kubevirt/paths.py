"""Where the bundle's data lives, and how files are written."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

INSTALLED_DATA_DIR = Path("/usr/share/maas-kubevirt")
SCRIPT_NAME = "31-kubevirt-bmc-config"
# The package's site values (debian/rules), which the service reads.
INSTALLED_VALUES = Path("/etc/maas-kubevirt/values.yaml")


def data_dir() -> Path:
    """templates/, commissioning/ and values.yaml: $MAAS_KUBEVIRT_DATA, a source checkout, or the installed copy."""
    override = os.environ.get("MAAS_KUBEVIRT_DATA")
    if override:
        return Path(override)
    checkout = Path(__file__).resolve().parents[2]
    if all((checkout / part).exists() for part in ("values.yaml", "templates", "commissioning")):
        return checkout
    return INSTALLED_DATA_DIR


def credential_path(name: str) -> Path | None:
    """``$CREDENTIALS_DIRECTORY/<name>`` when systemd handed the service that credential
    (``LoadCredential=``); it then takes the place of the file the values name."""
    directory = os.environ.get("CREDENTIALS_DIRECTORY")
    if not directory:
        return None
    path = Path(directory) / name
    return path if path.exists() else None


def write_atomic(path: str | os.PathLike, text: str, mode: int = 0o644) -> Path:
    """Write text to path through a temporary file in the same directory and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            os.fchmod(handle.fileno(), mode)
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path
