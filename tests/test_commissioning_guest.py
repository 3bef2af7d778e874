"""The rendered commissioning script in a real Linux guest under QEMU (SeaBIOS and OVMF).

The guest gets the SMBIOS type 1 table libvirt gives a KubeVirt VM
(`-smbios type=1,manufacturer=KubeVirt,product=None,serial=<vm>.<ns>,family=KubeVirt`),
so the script reads its identity the way it will in MAAS: dmidecode and pyudev/sysfs over
the guest kernel's DMI, not a fake. See tests/guest.py for how the guest is made (about
10 s per boot under TCG). Missing QEMU/OVMF/busybox/kernel: skip with the reason, or fail
under CI=true.
"""

from __future__ import annotations

import copy

import pytest
import yaml

import guest
from conftest import require
from maas_kubevirt import identity, render
from maas_kubevirt.paths import SCRIPT_NAME
from maas_kubevirt.values import load_values
from test_commissioning import assert_enlisted

VM, NAMESPACE = "web1", "vms"
SERIAL = identity.format_serial(VM, NAMESPACE)
DOMAIN = "bmc.guest-test.example.org"
CONFIG_NAME = "bmc-config.yaml"
RESULT_NAME = f"{SCRIPT_NAME}.yaml"
SKIPPED = yaml.safe_dump({"status": "skipped"}).encode()  # what MAAS's built-in bmc-config writes
SCRIPT_TIMEOUT = 60  # the script's own dmidecode calls are bounded at 10 s each


@pytest.fixture(scope="module")
def rendered() -> str:
    values = copy.deepcopy(load_values(None))
    values["redfish"]["domain"] = DOMAIN
    return render.render_commissioning(values)


def boot(firmware: str, smbios: str, command: list[str], files=None, env=None) -> guest.GuestResult:
    try:
        guest.check_available(firmware)
    except guest.GuestUnavailable as missing:
        require(False, f"real-guest test ({firmware}) needs {missing.tool}: {missing.reason}")
    return guest.run(command, smbios=smbios, firmware=firmware, files=files, env=env,
                     timeout=SCRIPT_TIMEOUT)


def run_script(firmware: str, smbios: str, script: str) -> guest.GuestResult:
    """The rendered script, executed by its shebang as MAAS does, with BMC_CONFIG_PATH and
    RESULT_PATH set."""
    return boot(firmware, smbios, [f"{guest.GUEST_IN}/{SCRIPT_NAME}"],
                files={SCRIPT_NAME: (script, 0o755)},
                env={"BMC_CONFIG_PATH": f"{guest.GUEST_OUT}/{CONFIG_NAME}",
                     "RESULT_PATH": f"{guest.GUEST_OUT}/{RESULT_NAME}"})


def assert_no_password_shown(result: guest.GuestResult) -> None:
    for channel in ("stdout", "stderr", "console"):
        assert identity.PLACEHOLDER_PASSWORD not in getattr(result, channel), f"power_pass shown on the guest's {channel}"


def describe(result: guest.GuestResult) -> str:
    return (f"{result.firmware}/{result.accel} rc={result.returncode} in {result.seconds:.1f} s\n"
            f"stdout: {result.stdout!r}\nstderr: {result.stderr!r}\nfiles: {sorted(result.files)}\n"
            f"console tail:\n" + "\n".join(result.console.splitlines()[-15:]))


def test_guest_sees_the_kubevirt_smbios_on_every_source():
    """The harness itself: dmidecode, sysfs and pyudev in the guest all read the -smbios values."""
    probe = (
        "import pathlib, subprocess, pyudev\n"
        "def dmi(k): return subprocess.run(['dmidecode', '-s', k], capture_output=True, text=True,"
        " check=True).stdout.strip()\n"
        "sysfs = pathlib.Path('/sys/class/dmi/id')\n"
        "dev = pyudev.Devices.from_path(pyudev.Context(), '/sys/class/dmi/id')\n"
        "for k, a in (('system-manufacturer', 'sys_vendor'), ('system-serial-number', 'product_serial'),"
        " ('system-product-name', 'product_name'), ('system-family', 'product_family')):\n"
        "    print(k, dmi(k), (sysfs / a).read_text().strip(), dev.attributes.asstring(a), sep='|')\n"
        "print('system-uuid', dmi('system-uuid').lower(), sep='|')\n"
    )
    uuid = identity.smbios_uuid(VM, NAMESPACE)
    result = boot("seabios", guest.smbios_type1(serial=SERIAL, uuid=uuid),
                  ["/usr/bin/python3", f"{guest.GUEST_IN}/probe.py"], files={"probe.py": (probe, 0o644)})
    assert result.returncode == 0, describe(result)
    assert result.stdout.splitlines() == [
        "system-manufacturer|KubeVirt|KubeVirt|KubeVirt",
        f"system-serial-number|{SERIAL}|{SERIAL}|{SERIAL}",
        "system-product-name|None|None|None",
        "system-family|KubeVirt|KubeVirt|KubeVirt",
        f"system-uuid|{uuid}",
    ], describe(result)
    assert result.files == {}


@pytest.mark.parametrize("firmware", ["seabios", "ovmf"])
def test_rendered_script_writes_redfish_power_in_a_kubevirt_guest(firmware, rendered):
    smbios = guest.smbios_type1(serial=SERIAL, uuid=identity.smbios_uuid(VM, NAMESPACE))
    result = run_script(firmware, smbios, rendered)

    assert result.returncode == 0, describe(result)
    assert result.stderr == "", describe(result)
    assert len(result.stdout.splitlines()) == 1 and SERIAL in result.stdout, describe(result)
    # Only the power settings: no temporary file left, and no Skipped result (MAAS shows Passed).
    assert list(result.files) == [CONFIG_NAME], describe(result)
    written = yaml.safe_load(result.files[CONFIG_NAME].decode("utf-8"))
    # A random enlistment user and the placeholder: the reconciler sets the real ones.
    assert_enlisted(written, SERIAL, domain=DOMAIN)
    assert_no_password_shown(result)
    for channel in ("stdout", "stderr", "console"):
        assert written["power_user"] not in getattr(result, channel), f"power_user shown on the guest's {channel}"


def test_rendered_script_leaves_a_dell_alone(rendered):
    """A real vendor's machine (even with a serial that looks like ours): no power settings,
    Skipped in RESULT_PATH, exit 0."""
    smbios = guest.smbios_type1(manufacturer="Dell Inc.", product="PowerEdge R650",
                                family="PowerEdge", serial=SERIAL)
    result = run_script("seabios", smbios, rendered)

    assert result.returncode == 0, describe(result)
    assert result.files == {RESULT_NAME: SKIPPED}, describe(result)
    assert result.stderr == "", describe(result)
    lines = result.stdout.splitlines()
    assert len(lines) == 1 and "Dell Inc." in lines[0], describe(result)
    assert_no_password_shown(result)
