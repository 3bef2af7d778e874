"""A fake SMBIOS for the commissioning-script tests.

`install_dmidecode` puts an executable named ``dmidecode`` in a directory meant to be the
whole of PATH: for each ``-s`` keyword it prints recorded output, exits non-zero, or hangs.
`make_sysfs` writes the two DMI attributes the script reads from /sys/class/dmi/id.
"""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

MANUFACTURER = "system-manufacturer"
SERIAL = "system-serial-number"

# Behaviours other than printing recorded output.
FAIL = "fail"  # exits 1 with a message on stderr, like dmidecode without /dev/mem access
HANG = "hang"  # sleeps far past any timeout
FLOOD = "flood"  # prints without end, as a broken or hostile firmware table might make it
BEHAVIOURS = (FAIL, HANG, FLOOD)

# `dmidecode -s` output recorded on real machines (the trailing newline is dmidecode's).
VENDORS = {
    "Dell Inc.": b"Dell Inc.\n",
    "HPE": b"HPE\n",
    "Supermicro": b"Supermicro\n",
    "LENOVO": b"LENOVO\n",
    "QEMU": b"QEMU\n",
    "innotek GmbH": b"innotek GmbH\n",
    "VMware, Inc.": b"VMware, Inc.\n",
    "Microsoft Corporation": b"Microsoft Corporation\n",
    "Amazon EC2": b"Amazon EC2\n",
}
VENDOR_SERIALS = {
    "Dell Inc.": b"8XK2Q53\n",
    "HPE": b"CZJ9340ABC\n",
    "Supermicro": b"S123456X9A12345\n",
    "LENOVO": b"PF2ABCDE\n",
    "QEMU": b"Not Specified\n",
    "innotek GmbH": b"0\n",
    "VMware, Inc.": b"VMware-42 1a 6b 3c 8d 2e 4f 5a-9b 0c 1d 2e 3f 4a 5b 6c\n",
    "Microsoft Corporation": b"0000-0002-6123-4567-8901-2345-67\n",
    "Amazon EC2": b"ec2e1916-9099-7caf-fd21-012345678901\n",
}


def _script(data: Path) -> str:
    sleep = shutil.which("sleep") or "/bin/sleep"
    cat = shutil.which("cat") or "/bin/cat"
    yes = shutil.which("yes") or "/usr/bin/yes"
    return f"""#!/bin/sh
# Fake dmidecode written by tests/fake_dmidecode.py: recorded output from {data}.
data={shlex.quote(str(data))}
if [ "$#" -ne 2 ] || [ "$1" != "-s" ]; then
    echo "fake dmidecode: unexpected arguments: $*" >&2
    exit 2
fi
echo "$2" >> "$data/calls"
if [ -e "$data/$2.hang" ]; then exec {shlex.quote(sleep)} 600; fi
if [ -e "$data/$2.flood" ]; then exec {shlex.quote(yes)} KubeVirt; fi
if [ -e "$data/$2.fail" ]; then echo "/dev/mem: Permission denied" >&2; exit 1; fi
if [ ! -e "$data/$2" ]; then echo "Invalid string keyword: $2" >&2; exit 2; fi
exec {shlex.quote(cat)} "$data/$2"
"""


def _output(value: bytes | str | None) -> bytes | str | None:
    """str values get dmidecode's trailing newline; bytes are printed exactly; behaviours pass through."""
    if isinstance(value, str) and value not in BEHAVIOURS:
        return value.encode("utf-8") + b"\n"
    return value


def install_dmidecode(bin_dir: Path, manufacturer: bytes | str | None, serial: bytes | str | None) -> Path:
    """An executable ``bin_dir/dmidecode``; each value is output (str or bytes), FAIL, HANG, FLOOD
    or None (unknown keyword)."""
    data = bin_dir / ".fake-dmidecode"
    data.mkdir(parents=True, exist_ok=True)
    for keyword, value in ((MANUFACTURER, manufacturer), (SERIAL, serial)):
        value = _output(value)
        for suffix in ("", *(f".{behaviour}" for behaviour in BEHAVIOURS)):
            (data / f"{keyword}{suffix}").unlink(missing_ok=True)
        if value in BEHAVIOURS:
            (data / f"{keyword}.{value}").touch()
        elif value is not None:
            (data / keyword).write_bytes(value)
    path = bin_dir / "dmidecode"
    path.write_text(_script(data))
    path.chmod(0o755)
    return path


def dmidecode_calls(bin_dir: Path) -> list[str]:
    """The keywords the fake was asked for, in order."""
    calls = bin_dir / ".fake-dmidecode" / "calls"
    return calls.read_text().split() if calls.exists() else []


def make_sysfs(directory: Path, sys_vendor: bytes | str | None, product_serial: bytes | str | None) -> Path:
    """A fake /sys/class/dmi/id; None leaves an attribute out. str values get sysfs's trailing newline."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, value in (("sys_vendor", sys_vendor), ("product_serial", product_serial)):
        if value is not None:
            (directory / name).write_bytes(value.encode("utf-8") + b"\n" if isinstance(value, str) else value)
    return directory
