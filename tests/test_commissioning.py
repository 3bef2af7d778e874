"""The commissioning script (commissioning/31-kubevirt-bmc-config) against a fake SMBIOS.

Most tests run the rendered script as MAAS does: an executable file with BMC_CONFIG_PATH
and RESULT_PATH set, dmidecode found on PATH (here a fake, see fake_dmidecode.py) and the
DMI attributes in a directory the tests choose. Tests that need to replace a function (the
Redfish resolver, a failing rename, pyudev) load the script in-process.
"""

from __future__ import annotations

import ast
import copy
import difflib
import errno
import http.client
import http.server
import importlib.machinery
import importlib.util
import io
import os
import re
import shlex
import shutil
import socket
import ssl
import stat
import subprocess
import sys
import threading
import time
import types
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from conftest import require_tool
from fake_dmidecode import (
    FAIL,
    FLOOD,
    HANG,
    MANUFACTURER,
    SERIAL,
    VENDOR_SERIALS,
    VENDORS,
    dmidecode_calls,
    install_dmidecode,
    make_sysfs,
)
from maas_kubevirt import identity
from maas_kubevirt.paths import SCRIPT_NAME, data_dir
from maas_kubevirt.render import _SETTINGS_LINE, render_commissioning, script_settings
from maas_kubevirt.values import load_values

# Wall-clock bounds: run after the parallel workers, with the machine to itself (tests/conftest.py).
pytestmark = pytest.mark.timing

SCRIPT = data_dir() / "commissioning" / SCRIPT_NAME
VALUES = load_values(None)
DMI_ENV = "MAAS_KUBEVIRT_TEST_DMI_DIR"
# Under `make mutate`, the mutant to run and where to report the calls (tools/mutate): the
# script runs in MAAS's bare environment otherwise, where no mutant would reach it.
MUTATION_RUN = ("MUTANT_UNDER_TEST", "MAAS_KUBEVIRT_MUTATE_HITS")

# What MAAS's built-in bmc-config writes to RESULT_PATH for a machine it leaves alone.
SKIPPED = yaml.safe_dump({"status": "skipped"})


def load_script(path: Path = SCRIPT, name: str = "kubevirt_bmc_config") -> types.ModuleType:
    """Import the script the way MAAS's own tests import theirs (no .py name)."""
    loader = importlib.machinery.SourceFileLoader(name, str(path))
    spec = importlib.util.spec_from_loader(name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def values_with(**changes: str) -> dict:
    """The default values with redfish.* / smbios.manufacturer changed."""
    values = copy.deepcopy(VALUES)
    for key, value in changes.items():
        if key == "manufacturer":
            values["smbios"]["manufacturer"] = value
        else:
            values["redfish"][key] = value
    return values


def render_to(directory: Path, values: dict | None = None) -> Path:
    """The rendered script written as `maas-kubevirt render` writes it (mode 0755)."""
    path = directory / SCRIPT_NAME
    path.write_text(render_commissioning(values or VALUES), encoding="utf-8")
    path.chmod(0o755)
    return path


@dataclass
class Run:
    status: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


class Machine:
    """A fake machine: PATH with (or without) a fake dmidecode, a fake DMI sysfs, MAAS's
    BMC_CONFIG_PATH and RESULT_PATH."""

    def __init__(self, root: Path):
        self.bin = root / "bin"
        self.bin.mkdir()
        self.sysfs = root / "dmi"
        self.maas = root / "maas"
        self.maas.mkdir()
        self.config = self.maas / "bmc-config.yaml"
        self.out = root / "out"  # MAAS gives each script its own output directory
        self.out.mkdir()
        self.result = self.out / f"{SCRIPT_NAME}.yaml"

    def smbios(self, manufacturer="KubeVirt", serial="web1.vms", *, dmidecode=True, sysfs=True,
               sysfs_vendor=None, sysfs_serial=None) -> "Machine":
        """dmidecode prints manufacturer/serial; sysfs holds the same (or the sysfs_* overrides)."""
        if dmidecode:
            install_dmidecode(self.bin, manufacturer, serial)
        if sysfs:
            make_sysfs(self.sysfs, _as_sysfs(manufacturer) if sysfs_vendor is None else sysfs_vendor,
                       _as_sysfs(serial) if sysfs_serial is None else sysfs_serial)
        return self

    @property
    def path(self) -> str:
        return f"{self.bin}{os.pathsep}{Path(sys.executable).parent}"

    def environ(self, bmc_config_path: str | None) -> dict:
        """What MAAS exports to a serial commissioning script (the two paths this script uses)."""
        environ = {"RESULT_PATH": str(self.result)}
        if bmc_config_path is not None:
            environ["BMC_CONFIG_PATH"] = bmc_config_path or str(self.config)
        return environ

    def run(self, script: Path, *, bmc_config_path: str | None = "", env: dict | None = None,
            combined: bool = False) -> Run:
        """Run the script as MAAS does; returns its status and output, checked by check_output.

        combined: stderr goes into stdout's pipe, in the order written, as in MAAS's combined log.
        """
        environ = {"PATH": self.path, DMI_ENV: str(self.sysfs), "LC_ALL": "C.UTF-8",
                   **{key: os.environ[key] for key in MUTATION_RUN if key in os.environ},
                   **self.environ(bmc_config_path), **(env or {})}
        environ = {key: value for key, value in environ.items() if value is not None}
        done = subprocess.run([str(script)], env=environ, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT if combined else subprocess.PIPE, timeout=60, check=False)
        result = Run(done.returncode, done.stdout.decode("utf-8"), (done.stderr or b"").decode("utf-8"))
        self.check_output(result)
        return result

    def run_inprocess(self, module: types.ModuleType, monkeypatch, *, bmc_config_path: str | None = "") -> Run:
        """main() of a loaded script with this machine's PATH and sysfs."""
        monkeypatch.setenv("PATH", self.path)
        monkeypatch.setattr(module, "DMI_DIR", str(self.sysfs))
        stdout, stderr = io.StringIO(), io.StringIO()
        with redirect_stdout(stdout), redirect_stderr(stderr):
            status = module.main(self.environ(bmc_config_path))
        result = Run(status, stdout.getvalue(), stderr.getvalue())
        self.check_output(result)
        return result

    @staticmethod
    def check_output(result: Run) -> None:
        """What every run must show: printable ASCII only (SMBIOS text escaped), and no power_pass."""
        assert all(" " <= c <= "~" for c in result.output.replace("\n", "")), result.output
        assert identity.PLACEHOLDER_PASSWORD not in result.output

    def skipped(self) -> bool:
        """True when RESULT_PATH says Skipped exactly as MAAS's built-in bmc-config writes it."""
        return self.result.read_text(encoding="utf-8") == SKIPPED

    def written(self) -> dict:
        assert sorted(os.listdir(self.maas)) == [self.config.name], "stray files beside BMC_CONFIG_PATH"
        assert stat.S_IMODE(self.config.stat().st_mode) == 0o600
        return yaml.safe_load(self.config.read_text(encoding="utf-8"))

    def nothing_written(self) -> None:
        assert os.listdir(self.maas) == []


def _as_sysfs(value):
    """What the kernel shows for what dmidecode prints: an empty string is empty, not "Not Specified"."""
    if value in (FAIL, HANG, FLOOD, None):
        return None
    if isinstance(value, bytes):
        return value
    return "" if value == "Not Specified" else value


# The power_user the script writes: a fresh random user at every run, so a test can only
# check its form. Spelled out here rather than built from identity.ENLIST_USER_PREFIX, so a
# change to the prefix shows up as a failing test.
ENLIST_USER = re.compile(r"maas-enlist-[0-9a-f]{32}")


def assert_enlisted(config: dict, serial: str, *, domain="bmc.example.com") -> None:
    """config is what the script writes for serial: a random enlistment user, the rest exact."""
    assert isinstance(config.get("power_user"), str) and ENLIST_USER.fullmatch(config["power_user"]), config
    vm, namespace = identity.parse_serial(serial)
    assert config == {
        "power_type": "redfish",
        # The bare host, the one form MAAS stores and the reconciler trusts.
        "power_address": identity.redfish_host(vm, namespace, domain),
        "power_user": config["power_user"],
        "power_pass": identity.PLACEHOLDER_PASSWORD,
        "node_id": "1",
    }


def one_line(text: str) -> str:
    assert text.endswith("\n") and text.count("\n") == 1, f"expected one line, got {text!r}"
    return text


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Path:
    return render_to(tmp_path_factory.mktemp("rendered"))


@pytest.fixture
def machine(tmp_path) -> Machine:
    return Machine(tmp_path)


# --- The file as it is in the repository -------------------------------------------------


def metadata(text: str) -> dict:
    lines = text.splitlines()
    start = lines.index("# --- Start MAAS 1.0 script metadata ---")
    end = lines.index("# --- End MAAS 1.0 script metadata ---")
    block = lines[start + 1:end]
    assert all(line.startswith("#") for line in block)
    return yaml.safe_load("\n".join(line[1:] for line in block))


def test_metadata_block_follows_maas_1_0():
    text = SCRIPT.read_text(encoding="utf-8")
    meta = metadata(text)
    assert meta["name"] == SCRIPT_NAME == SCRIPT.name
    assert shlex.quote(meta["name"]) == meta["name"]
    assert meta["name"] > "30-maas-01-bmc-config"
    assert [tag.strip() for tag in meta["tags"].split(",")] == ["bmc-config", "enlisting"]
    assert meta["script_type"] == "commissioning"
    assert meta["hardware_type"] == "node"
    assert meta["parallel"] == "disabled"
    assert meta["may_reboot"] is False
    assert re.fullmatch(r"\d\d:\d\d:\d\d", meta["timeout"])
    assert meta["title"].strip() and meta["description"].strip()
    assert "parameters" not in meta  # parameters reach the script as argv: nothing secret goes that way


def test_file_is_an_executable_python3_script():
    assert SCRIPT.read_text(encoding="utf-8").splitlines()[0] == "#!/usr/bin/env python3"
    assert stat.S_IMODE(SCRIPT.stat().st_mode) == 0o755


def test_repository_settings_are_the_defaults_not_rendered():
    text = SCRIPT.read_text(encoding="utf-8")
    assert len(_SETTINGS_LINE.findall(text)) == 1
    assert load_script().SETTINGS == {**script_settings(VALUES), "rendered": False}


def test_importing_runs_nothing(capsys, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    module = load_script()
    assert callable(module.main)
    assert capsys.readouterr() == ("", "")


def test_render_changes_only_the_settings_line(rendered):
    before = SCRIPT.read_text(encoding="utf-8").splitlines()
    after = rendered.read_text(encoding="utf-8").splitlines()
    changed = [line for line in difflib.ndiff(before, after) if line[:1] in "+-"]
    assert len(changed) == 2 and all(line[2:].startswith("SETTINGS = ") for line in changed)
    assert load_script(rendered, "rendered").SETTINGS == script_settings(VALUES)


@pytest.mark.parametrize("hostile", [
    "'}; import os; os.system('reboot') #",
    "\"\"\"\n__import__('os').system('reboot')\n\"\"\"",
    "line\nbreak  # replaced by maas-kubevirt render",
    "back\\slash\\",
    "\x00\x1b[2J\u2028\u2029\ufeff",
    "ünïcødé ☃ \U0001f600",
])
def test_render_injects_values_no_value_can_break_out_of(hostile, tmp_path):
    values = copy.deepcopy(VALUES)
    values["redfish"].update(domain=hostile, check=hostile)
    values["smbios"]["manufacturer"] = hostile
    path = render_to(tmp_path, values)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    original = ast.parse(SCRIPT.read_text(encoding="utf-8"))
    assert [ast.dump(n) for n in tree.body if not _is_settings(n)] == [
        ast.dump(n) for n in original.body if not _is_settings(n)]
    assert load_script(path, "hostile").SETTINGS == {
        **{key: hostile for key in ("domain", "check", "manufacturer")}, "rendered": True}


def _is_settings(node: ast.stmt) -> bool:
    return isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["SETTINGS"]


def test_unrendered_script_refuses_a_kubevirt_vm(machine):
    machine.smbios("KubeVirt", "web1.vms")
    result = machine.run(SCRIPT)
    assert result.status == os.EX_CONFIG
    assert one_line(result.stderr) == (
        f"{SCRIPT_NAME}: error: not rendered: run maas-kubevirt render and upload the rendered script\n")
    machine.nothing_written()
    assert not machine.result.exists()


def test_unrendered_script_leaves_other_machines_alone(machine):
    machine.smbios("Dell Inc.", "8XK2Q53")
    result = machine.run(SCRIPT)
    assert result.status == 0 and result.stderr == ""
    machine.nothing_written()
    assert machine.skipped()


def test_script_carries_no_password_rule():
    """MAAS serves the script to anyone: it computes no password, whatever the seed."""
    module = load_script()
    assert not any("password" in name and callable(getattr(module, name)) for name in dir(module))
    assert "hashlib" not in module.__dict__ and "sha256" not in SCRIPT.read_text(encoding="utf-8")
    assert module.PLACEHOLDER_PASSWORD == identity.PLACEHOLDER_PASSWORD


# --- KubeVirt VMs that are ours ------------------------------------------------------------


@pytest.mark.parametrize("manufacturer", ["KubeVirt Inc", "KubeVirtX", "Kube", "kubevirt", "KUBEVIRT", "KubeVirt\u200b",
                                          "xKubeVirt", "K\u0443beVirt"])
def test_only_the_exact_manufacturer_is_kubevirt(machine, rendered, manufacturer):
    """Not a prefix, a case or a look-alike of the expected manufacturer: exactly it."""
    machine.smbios(manufacturer, "web1.vms")
    result = machine.run(rendered)
    assert result.status == 0 and "not a KubeVirt VM" in result.stdout
    machine.nothing_written()


@pytest.mark.parametrize("env", [
    {"MAAS_KUBEVIRT_SEED": "5" * 64, "SEED": "x", "MAAS_API_KEY": "a:b:c"},
    {"REDFISH_DOMAIN": "evil.io", "BMC_DOMAIN": "evil.io", "DOMAIN": "evil.io", "HTTPS_PROXY": "http://evil.io"},
    {"LANG": "tr_TR.UTF-8", "LC_ALL": "tr_TR.UTF-8", "PYTHONIOENCODING": "latin-1", "TZ": "Asia/Kathmandu"},
    {"HOME": "/nonexistent", "USER": "nobody", "MAAS_URL": "http://evil.io/MAAS/", "POWER_ADDRESS": "evil.io"},
])
def test_what_is_written_does_not_depend_on_the_environment(machine, rendered, env):
    """Only BMC_CONFIG_PATH (where) and RESULT_PATH come from the environment; never what is written."""
    machine.smbios("KubeVirt", "web1.vms")
    assert machine.run(rendered, env=env).status == 0
    assert_enlisted(machine.written(), "web1.vms")


def test_kubevirt_vm_gets_redfish_power(machine, rendered):
    machine.smbios("KubeVirt", "web1.vms")
    result = machine.run(rendered)
    assert result.status == 0, result.output
    assert_enlisted(machine.written(), "web1.vms")
    assert machine.written()["power_address"] == "web1.vms.bmc.example.com"  # bare: MAAS stores no URL
    assert machine.written()["power_pass"] == identity.PLACEHOLDER_PASSWORD
    assert one_line(result.stdout) == (
        f"{SCRIPT_NAME}: wrote Redfish power for web1.vms: web1.vms.bmc.example.com (a random enlistment "
        f"user and a placeholder password, for the maas-kubevirt reconciler to replace) to {machine.config}\n")
    assert result.stderr == ""
    assert dmidecode_calls(machine.bin) == [MANUFACTURER, SERIAL]
    assert not machine.result.exists()  # configured, not skipped: MAAS shows Passed


def test_each_run_writes_a_new_user(tmp_path, rendered):
    """MAAS puts machines with the same Redfish address and user on one BMC row, password
    included: a user that repeated would let another machine claiming the address join it."""
    users = []
    for run in ("first", "second"):
        (tmp_path / run).mkdir()
        machine = Machine(tmp_path / run).smbios("KubeVirt", "web1.vms")
        assert machine.run(rendered).status == 0
        users.append(machine.written()["power_user"])
    assert users[0] != users[1]


def test_user_is_only_in_the_bmc_config(machine, rendered, tmp_path):
    """The user keeps the VM's BMC row its own until the reconciler replaces it, so the
    script shows it nowhere: MAAS users can read a script's output."""
    machine.smbios("KubeVirt", "web1.vms")
    result = machine.run(rendered)
    assert result.status == 0
    user = machine.written()["power_user"]
    assert user not in result.stdout and user not in result.stderr
    holding = [path for path in tmp_path.rglob("*") if path.is_file() and user.encode() in path.read_bytes()]
    assert holding == [machine.config]


def test_user_comes_from_the_secrets_module(machine, rendered, monkeypatch):
    """128 bits from secrets (the kernel's random source), not from random or anything a
    guest could predict."""
    machine.smbios("KubeVirt", "web1.vms")
    module = load_script(rendered, "rendered_token")
    asked = []

    def token_hex(nbytes):
        asked.append(nbytes)
        return "0123456789abcdef" * 2

    monkeypatch.setattr(module.secrets, "token_hex", token_hex)
    assert machine.run_inprocess(module, monkeypatch).status == 0
    assert asked == [16]
    assert machine.written()["power_user"] == "maas-enlist-0123456789abcdef0123456789abcdef"


def test_stale_username_setting_is_ignored(machine, rendered, monkeypatch):
    """A SETTINGS line rendered before redfish.username was retired still carries it: the
    script runs, and the user it writes is random all the same, never the old fixed one."""
    machine.smbios("KubeVirt", "web1.vms")
    module = load_script(rendered, "rendered_stale")
    stale = {**module.SETTINGS, "username": "maas"}
    assert module.check_settings(stale) == stale
    monkeypatch.setattr(module, "SETTINGS", stale)
    result = machine.run_inprocess(module, monkeypatch)
    assert result.status == 0 and result.stderr == ""
    assert_enlisted(machine.written(), "web1.vms")


def test_placeholder_can_never_be_a_derived_password():
    assert identity.PLACEHOLDER_PASSWORD and not re.fullmatch(r"[0-9a-f]{32}", identity.PLACEHOLDER_PASSWORD)


def test_file_format_is_json_quoted_yaml(machine, rendered):
    machine.smbios("KubeVirt", "web1.vms")
    assert machine.run(rendered).status == 0
    lines = machine.config.read_text(encoding="utf-8").splitlines()
    assert [line.split(":")[0] for line in lines] == ["power_type", "power_address", "power_user", "power_pass", "node_id"]
    assert all(re.fullmatch(r'[a-z_]+: "[^"\\]*"', line) for line in lines)
    assert lines[-1] == 'node_id: "1"'


def test_dotted_vm_name_splits_on_the_last_dot(machine, rendered):
    machine.smbios("KubeVirt", "web.frontend-1.team-a")
    assert machine.run(rendered).status == 0
    config = machine.written()
    assert_enlisted(config, "web.frontend-1.team-a")
    assert config["power_address"] == "web.frontend-1.team-a.bmc.example.com"


def test_site_values_reach_the_file(machine, tmp_path):
    values = values_with(domain="lab.example.org", manufacturer="Acme Cloud")
    script = render_to(tmp_path, values)
    machine.smbios("Acme Cloud", "db-0.prod")
    assert machine.run(script).status == 0
    assert_enlisted(machine.written(), "db-0.prod", domain="lab.example.org")


def test_whitespace_around_values_is_not_part_of_them(machine, rendered):
    machine.smbios(b"  KubeVirt  \n", b"web1.vms   \n", sysfs_vendor="KubeVirt", sysfs_serial="web1.vms")
    assert machine.run(rendered).status == 0
    assert_enlisted(machine.written(), "web1.vms")


def test_longest_serial_that_still_forms_a_host(machine, rendered):
    vm = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 41])  # 233 characters
    serial = f"{vm}.vms"
    assert len(f"{serial}.bmc.example.com") == 253
    machine.smbios("KubeVirt", serial)
    assert machine.run(rendered).status == 0
    assert_enlisted(machine.written(), serial)


# --- Machines that are not ours: exit 0, nothing written, one line why ------------------


NOT_OURS_SERIALS = {
    "empty": (b"\n", ""),
    "not-specified": ("Not Specified", ""),
    "bare-uuid": ("5f3b9d2c-1a4e-4b6f-8c7d-0e1f2a3b4c5d", None),
    "upper-case-uuid": ("5F3B9D2C-1A4E-4B6F-8C7D-0E1F2A3B4C5D", None),
    "no-dot": ("web1", None),
    "upper-case": ("Web1.vms", None),
    "underscore": ("web_1.vms", None),
    "trailing-dot": ("web1.vms.", None),
    "leading-dot": (".vms", None),
    "empty-label": ("web..vms", None),
    "label-over-63": ("a" * 64 + ".vms", None),
    "name-over-253": (".".join(["a" * 63] * 4) + ".vms", None),
    "namespace-over-63": ("web1." + "n" * 64, None),
    "non-ascii": ("wéb1.vms", None),
    "non-ascii-namespace": ("web1.vmś", None),
    "not-utf-8": (b"web\xff1.vms\n", None),
    "shell-semicolon": ("web1.vms; rm -rf /", None),
    "shell-substitution": ("$(reboot).vms", None),
    "shell-backticks": ("`id`.vms", None),
    "shell-pipe": ("web1.vms|sh", None),
    "shell-quotes": ("'web1'.\"vms\"", None),
    "space-inside": ("web 1.vms", None),
    "default-oem": ("To Be Filled By O.E.M.", None),
}


@pytest.mark.parametrize("serial, sysfs_serial", NOT_OURS_SERIALS.values(), ids=NOT_OURS_SERIALS.keys())
def test_kubevirt_vm_without_our_serial_is_left_alone(machine, rendered, serial, sysfs_serial):
    machine.smbios("KubeVirt", serial, sysfs_serial=sysfs_serial)
    result = machine.run(rendered)
    assert result.status == 0, result.output
    assert result.stderr == ""
    assert "nothing to do" in one_line(result.stdout)
    assert "serial" in result.stdout
    machine.nothing_written()
    assert machine.skipped()


def test_bare_uuid_says_what_it_is(machine, rendered):
    machine.smbios("KubeVirt", "5f3b9d2c-1a4e-4b6f-8c7d-0e1f2a3b4c5d")
    assert "bare UUID" in machine.run(rendered).stdout


@pytest.mark.parametrize("serial, sysfs_serial, problem", [
    (b"\n", "", "the serial number is not set (is the namespace opted in to maas-kubevirt?)"),
    ("Not Specified", "", "the serial number is not set (is the namespace opted in to maas-kubevirt?)"),
    ("5f3b9d2c-1a4e-4b6f-8c7d-0e1f2a3b4c5d", None, "the serial number '5f3b9d2c-1a4e-4b6f-8c7d-0e1f2a3b4c5d' "
     "is a bare UUID, not <vm>.<namespace> (is the namespace opted in?)"),
    ("web1", None, "the serial number 'web1' is not <vm>.<namespace> (no dot)"),
    ("Web1.vms", None, "the serial number 'Web1.vms' is not <vm>.<namespace> (the VM name is not a DNS-1123 subdomain)"),
    ("web1.vm\u015b", None, "the serial number 'web1.vm\\u015b' is not <vm>.<namespace> "
     "(the namespace is not a DNS-1123 label)"),
], ids=["empty", "not-specified", "bare-uuid", "no-dot", "bad-vm", "bad-namespace"])
def test_serial_that_is_not_ours_is_named_with_its_problem(machine, rendered, serial, sysfs_serial, problem):
    """The operator reads this line to fix the VM's serial: it says which rule the serial broke."""
    machine.smbios("KubeVirt", serial, sysfs_serial=sysfs_serial)
    result = machine.run(rendered)
    assert result.status == 0
    assert one_line(result.stdout) == f"{SCRIPT_NAME}: not a maas-kubevirt VM: {problem}: nothing to do\n"


@pytest.mark.parametrize("vendor", VENDORS, ids=lambda v: v.replace(" ", "_"))
@pytest.mark.parametrize("serial", ["recorded", "web1.vms"])
def test_real_vendors_are_left_alone(machine, rendered, vendor, serial):
    machine.smbios(VENDORS[vendor], VENDOR_SERIALS[vendor] if serial == "recorded" else serial)
    result = machine.run(rendered)
    assert result.status == 0 and result.stderr == ""
    assert one_line(result.stdout) == (
        f"{SCRIPT_NAME}: not a KubeVirt VM: system manufacturer is {ascii(vendor)}, not 'KubeVirt': nothing to do\n")
    assert dmidecode_calls(machine.bin) == [MANUFACTURER]  # the serial is not even read
    machine.nothing_written()
    assert machine.skipped()


def test_manufacturer_is_matched_exactly(machine, rendered):
    machine.smbios("kubevirt", "web1.vms")
    result = machine.run(rendered)
    assert result.status == 0 and "not a KubeVirt VM" in result.stdout
    machine.nothing_written()


def test_configured_manufacturer_with_surrounding_spaces_still_matches(machine, tmp_path):
    """A values file may quote the manufacturer with spaces around it; the SMBIOS string has none."""
    script = render_to(tmp_path, values_with(manufacturer="  KubeVirt \t"))
    machine.smbios("KubeVirt", "web1.vms")
    result = machine.run(script)
    assert result.status == 0, result.output
    assert_enlisted(machine.written(), "web1.vms")


def test_existing_bmc_config_is_left_untouched(machine, rendered):
    machine.smbios("KubeVirt", "web1.vms")
    machine.config.write_text("power_type: ipmi\npower_address: 10.0.0.9\n")
    os.utime(machine.config, (1_000_000_000, 1_000_000_000))
    result = machine.run(rendered)
    assert result.status == 0
    assert one_line(result.stdout) == (f"{SCRIPT_NAME}: BMC_CONFIG_PATH {str(machine.config)!a} already exists "
                                       "(another script configured the BMC): leaving it\n")
    assert machine.config.read_text() == "power_type: ipmi\npower_address: 10.0.0.9\n"
    assert machine.config.stat().st_mtime == 1_000_000_000
    assert dmidecode_calls(machine.bin) == []
    assert machine.skipped()


def test_dangling_symlink_at_bmc_config_path_is_left_alone(machine, rendered):
    """Something put a link there: neither follow it (creating its target) nor replace it."""
    machine.smbios("KubeVirt", "web1.vms")
    target = machine.maas / "elsewhere" / "target.yaml"
    machine.config.symlink_to(target)
    result = machine.run(rendered)
    assert result.status == 0 and "already exists" in one_line(result.stdout)
    assert machine.config.is_symlink() and os.readlink(machine.config) == str(target)
    assert not os.path.lexists(target) and sorted(os.listdir(machine.maas)) == [machine.config.name]
    assert machine.skipped()


# --- No SMBIOS at all (ppc64el, s390x): not ours -------------------------------------------


def test_machine_without_smbios_is_left_alone(machine, rendered):
    assert not machine.sysfs.exists() and shutil.which("dmidecode", path=machine.path) is None
    result = machine.run(rendered)
    assert result.status == 0, result.output
    assert one_line(result.stdout) == (
        f"{SCRIPT_NAME}: not a KubeVirt VM: no SMBIOS on this machine (no {machine.sysfs}, no dmidecode): nothing to do\n")
    assert result.stderr == ""
    machine.nothing_written()
    assert machine.skipped()


# --- RESULT_PATH: Skipped, as MAAS's built-in bmc-config reports it -------------------------


def test_skipped_result_is_what_the_builtin_bmc_config_writes(machine, rendered):
    machine.smbios("Dell Inc.", "8XK2Q53")
    assert machine.run(rendered).status == 0
    assert yaml.safe_load(machine.result.read_text(encoding="utf-8")) == {"status": "skipped"}
    assert machine.result.read_text(encoding="utf-8") == "status: skipped\n"
    assert os.listdir(machine.out) == [machine.result.name]  # no temporary file left


def test_without_result_path_nothing_is_recorded(machine, rendered):
    machine.smbios("Dell Inc.", "8XK2Q53")
    result = machine.run(rendered, env={"RESULT_PATH": None})
    assert result.status == 0 and result.stderr == ""
    assert one_line(result.stdout).endswith(": nothing to do\n")  # no note: nothing was meant to be written
    assert os.listdir(machine.out) == []


@pytest.mark.parametrize("target", ["RESULT_PATH", "BMC_CONFIG_PATH"])
def test_write_error_without_errno_text_is_named_by_its_kind(machine, rendered, monkeypatch, target):
    """Not every OSError carries the system's text (strerror): the message then names its kind."""
    machine.smbios("Dell Inc." if target == "RESULT_PATH" else "KubeVirt", "web1.vms")
    module = load_script(rendered, "rendered_bare_oserror")

    class StorageGone(OSError):
        pass

    def replace(source, destination):
        raise StorageGone("the disk went away")

    monkeypatch.setattr(module.os, "replace", replace)
    result = machine.run_inprocess(module, monkeypatch)
    path = machine.result if target == "RESULT_PATH" else machine.config
    if target == "RESULT_PATH":
        assert result.status == 0
        assert one_line(result.stdout).endswith(f"(RESULT_PATH {str(path)!a} not written: StorageGone)\n")
    else:
        assert result.status == os.EX_CANTCREAT
        assert one_line(result.stderr) == f"{SCRIPT_NAME}: error: cannot write BMC_CONFIG_PATH {str(path)!a}: StorageGone\n"


def test_unwritable_result_path_still_leaves_the_machine_alone(machine, rendered):
    machine.smbios("Dell Inc.", "8XK2Q53")
    missing = machine.out / "no-such-directory" / "result.yaml"
    result = machine.run(rendered, env={"RESULT_PATH": str(missing)})
    assert result.status == 0 and result.stderr == ""
    assert one_line(result.stdout).endswith(
        f": nothing to do (RESULT_PATH {str(missing)!a} not written: {os.strerror(errno.ENOENT)})\n")
    assert not missing.parent.exists()


# --- Ours but cannot be configured: non-zero with the reason ------------------------------


def test_bmc_config_path_unset_means_not_maas_commissioning(machine, rendered):
    machine.smbios("KubeVirt", "web1.vms")
    result = machine.run(rendered, bmc_config_path=None)
    assert result.status == os.EX_USAGE
    assert one_line(result.stderr) == (
        f"{SCRIPT_NAME}: error: BMC_CONFIG_PATH is not set: MAAS sets it for every commissioning script "
        "with parallel: disabled, so this is not a MAAS commissioning run\n")
    assert metadata(SCRIPT.read_text(encoding="utf-8"))["parallel"] == "disabled"  # which is this one
    machine.nothing_written()
    assert not machine.result.exists()


def test_bmc_config_path_unset_on_another_machine_is_fine(machine, rendered):
    machine.smbios("Dell Inc.", "8XK2Q53")
    assert machine.run(rendered, bmc_config_path=None).status == 0


@pytest.mark.parametrize("where", ["missing-directory", "file-as-directory"])
def test_bmc_config_path_not_writable(machine, rendered, where):
    machine.smbios("KubeVirt", "web1.vms")
    if where == "file-as-directory":
        (machine.maas / "plain-file").write_text("")
        target = machine.maas / "plain-file" / "bmc-config.yaml"
    else:
        target = machine.maas / "no-such-directory" / "bmc-config.yaml"
    result = machine.run(rendered, bmc_config_path=str(target))
    assert result.status == os.EX_CANTCREAT
    reason = os.strerror(errno.ENOTDIR if where == "file-as-directory" else errno.ENOENT)
    assert one_line(result.stderr) == f"{SCRIPT_NAME}: error: cannot write BMC_CONFIG_PATH {str(target)!a}: {reason}\n"
    assert not target.exists()


def test_failed_rename_leaves_no_temporary_file(machine, rendered, monkeypatch):
    machine.smbios("KubeVirt", "web1.vms")
    module = load_script(rendered, "rendered_rename")

    def refuse(source, destination):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(module.os, "replace", refuse)
    result = machine.run_inprocess(module, monkeypatch)
    assert result.status == os.EX_CANTCREAT and "Permission denied" in result.stderr
    machine.nothing_written()


def test_temporary_file_is_created_beside_the_target(machine, rendered, monkeypatch):
    """The rename is atomic only within one file system: the temporary file must be beside
    BMC_CONFIG_PATH, not in $TMPDIR (which may be the same file system by accident)."""
    machine.smbios("KubeVirt", "web1.vms")
    module = load_script(rendered, "rendered_beside")
    renames = []
    real_replace = os.replace

    def spy(source, destination):
        renames.append((Path(source), Path(destination)))
        real_replace(source, destination)

    monkeypatch.setattr(module.os, "replace", spy)
    assert machine.run_inprocess(module, monkeypatch).status == 0
    [(source, destination)] = renames
    assert destination == machine.config
    assert source.parent == machine.config.parent and source.name.startswith(f".{machine.config.name}.")
    assert_enlisted(machine.written(), "web1.vms")


def test_file_that_does_not_read_back_is_an_error(machine, rendered, monkeypatch):
    machine.smbios("KubeVirt", "web1.vms")
    module = load_script(rendered, "rendered_readback")
    monkeypatch.setattr(module, "config_text", lambda config: 'power_type: "redfish"\n')
    result = machine.run_inprocess(module, monkeypatch)
    assert result.status == os.EX_IOERR and "does not read back" in result.stderr


@pytest.mark.parametrize("error", [OSError(5, "Input/output error"), ValueError("unexpected line"),
                                   UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")])
def test_read_back_that_raises_is_not_success(machine, rendered, monkeypatch, error):
    machine.smbios("KubeVirt", "web1.vms")
    module = load_script(rendered, "rendered_readback_raises")

    def fail(path):
        raise error

    monkeypatch.setattr(module, "read_config", fail)
    result = machine.run_inprocess(module, monkeypatch)
    assert result.status == os.EX_IOERR
    assert one_line(result.stderr) == (
        f"{SCRIPT_NAME}: error: BMC_CONFIG_PATH {str(machine.config)!a} does not read back as written\n")
    assert result.stdout == "" and not machine.result.exists()


def test_longer_host_than_dns_allows_is_reported(machine, rendered):
    vm = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 50])  # a valid VM name, 242 characters
    machine.smbios("KubeVirt", f"{vm}.vms")
    result = machine.run(rendered)
    assert result.status == os.EX_CONFIG
    host = f"{vm}.vms.bmc.example.com"
    assert one_line(result.stderr) == (
        f"{SCRIPT_NAME}: error: VM {ascii(vm[:64])}... (242 characters) in namespace 'vms': no Redfish host name "
        f"under 'bmc.example.com': {len(host)} characters, more than the 253 of a DNS name\n")
    machine.nothing_written()


@pytest.mark.parametrize("dmidecode", [None, FAIL, HANG, "not-executable"])
def test_dmidecode_and_sysfs_both_unavailable(machine, rendered, monkeypatch, dmidecode):
    machine.sysfs.mkdir()  # the kernel has DMI, but the attributes cannot be read
    if dmidecode == "not-executable":
        install_dmidecode(machine.bin, "KubeVirt", "web1.vms").chmod(0o644)
    elif dmidecode is not None:
        install_dmidecode(machine.bin, dmidecode, dmidecode)
    if dmidecode == HANG:  # in-process, with a short timeout, so the test does not wait 10 s
        module = load_script(rendered, "rendered_hang")
        monkeypatch.setattr(module, "DMIDECODE_TIMEOUT", 0.5)
        result = machine.run_inprocess(module, monkeypatch)
    else:
        result = machine.run(rendered)
    assert result.status == os.EX_UNAVAILABLE
    reason = {None: "not found", FAIL: "exited with status 1", HANG: "timed out after 0.5 s",
              "not-executable": f"cannot run ({os.strerror(errno.EACCES)})"}[dmidecode]
    # Each source's own reason, so the operator knows what to fix.
    assert one_line(result.stderr) == (
        f"{SCRIPT_NAME}: error: cannot read the SMBIOS system manufacturer (dmidecode: dmidecode {reason}; "
        f"sysfs: {machine.sysfs / 'sys_vendor'}: {os.strerror(errno.ENOENT)})\n")
    machine.nothing_written()
    assert not machine.result.exists()


def test_dmidecode_failing_without_dmi_in_sysfs_is_not_taken_for_no_smbios(machine, rendered):
    """dmidecode is there (x86, arm64) but cannot read: the machine may well be ours."""
    install_dmidecode(machine.bin, FAIL, FAIL)
    result = machine.run(rendered)
    assert result.status == os.EX_UNAVAILABLE
    assert "cannot read the SMBIOS system manufacturer" in one_line(result.stderr)


def test_dmidecode_is_read_at_most_64_kib(rendered):
    module = load_script(rendered, "rendered_bounded")
    printing = [sys.executable, "-c", "import sys; sys.stdout.buffer.write(b'a' * int(sys.argv[1]))"]
    output, why = module.run_command([*printing, str(64 * 1024)])
    assert why is None and output == b"a" * 65536
    output, why = module.run_command([*printing, str(64 * 1024 + 1)])
    assert output is None and why.endswith("printed more than 65536 bytes")


def test_output_that_arrives_in_pieces_is_read_whole(rendered):
    """dmidecode may write line by line: the pieces are joined as they came."""
    module = load_script(rendered, "rendered_pieces")
    pieces = [sys.executable, "-c", "import sys, time\nfor line in (b'Kube', b'Virt\\n', b'# end\\n'):\n"
              "    sys.stdout.buffer.write(line); sys.stdout.flush(); time.sleep(0.05)"]
    assert module.run_command(pieces) == (b"KubeVirt\n# end\n", None)


def test_command_gets_no_input(rendered):
    """The command's stdin is /dev/null: one that reads input gets none at once, rather than waiting
    on the script's own stdin (here a pipe nobody writes to, as a terminal may be)."""
    module = load_script(rendered, "rendered_stdin")
    reading = [sys.executable, "-c", "import sys; print(repr(sys.stdin.read()))"]
    read_end, write_end = os.pipe()
    saved = os.dup(0)
    try:
        os.dup2(read_end, 0)
        assert module.run_command(reading, timeout=2) == (b"''\n", None)
    finally:
        os.dup2(saved, 0)
        for fd in (saved, read_end, write_end):
            os.close(fd)


def test_command_timeout_is_the_one_given(rendered):
    """A quick command is read under a short timeout; one that hangs is cut off at it, not later."""
    module = load_script(rendered, "rendered_timeout")
    assert module.run_command([sys.executable, "-c", "print('KubeVirt')"], timeout=0.8) == (b"KubeVirt\n", None)
    sleep = shutil.which("sleep")
    started = time.monotonic()
    assert module.run_command([sleep, "5"], timeout=0.3) == (None, f"{sleep} timed out after 0.3 s")
    assert time.monotonic() - started < 0.9  # well before the 10 s default and the 5 s sleep


def test_command_that_closes_its_output_but_keeps_running_is_cut_off(rendered):
    """End of output is not the end of the command: its exit is awaited only until the deadline."""
    module = load_script(rendered, "rendered_lingering")
    lingering = [sys.executable, "-c", "import os, time; os.write(1, b'KubeVirt\\n'); os.close(1); time.sleep(5)"]
    started = time.monotonic()
    assert module.run_command(lingering, timeout=0.3) == (None, f"{sys.executable} timed out after 0.3 s")
    assert time.monotonic() - started < 0.9


def test_dmidecode_that_never_stops_printing_is_cut_short(machine, rendered):
    """A flood is refused after 64 KiB, long before the 10 s timeout; sysfs then decides alone."""
    machine.smbios("KubeVirt", "web1.vms", dmidecode=False)
    install_dmidecode(machine.bin, FLOOD, FLOOD)
    started = time.monotonic()
    result = machine.run(rendered)
    assert time.monotonic() - started < 5
    assert result.status == 0, result.output
    assert_enlisted(machine.written(), "web1.vms")


def test_flood_alone_is_reported_not_waited_for(machine, rendered):
    machine.sysfs.mkdir()
    install_dmidecode(machine.bin, FLOOD, FLOOD)
    result = machine.run(rendered)
    assert result.status == os.EX_UNAVAILABLE
    assert "dmidecode printed more than 65536 bytes" in one_line(result.stderr)
@pytest.mark.parametrize("dmidecode", ["absent", FAIL, HANG])
def test_sysfs_alone_is_enough(machine, rendered, monkeypatch, dmidecode):
    machine.smbios("KubeVirt", "web1.vms", dmidecode=False)
    if dmidecode != "absent":
        install_dmidecode(machine.bin, dmidecode, dmidecode)
    if dmidecode == HANG:
        module = load_script(rendered, "rendered_hang_sysfs")
        monkeypatch.setattr(module, "DMIDECODE_TIMEOUT", 0.5)
        started = time.monotonic()
        result = machine.run_inprocess(module, monkeypatch)
        assert time.monotonic() - started < 5
    else:
        result = machine.run(rendered)
    assert result.status == 0, result.output
    assert_enlisted(machine.written(), "web1.vms")


def test_dmidecode_alone_is_enough(machine, rendered):
    machine.smbios("KubeVirt", "web1.vms", sysfs=False)
    assert machine.run(rendered).status == 0
    assert_enlisted(machine.written(), "web1.vms")


def test_sysfs_says_not_ours_without_dmidecode(machine, rendered):
    machine.smbios("Dell Inc.", "8XK2Q53", dmidecode=False)
    result = machine.run(rendered)
    assert result.status == 0 and "'Dell Inc.'" in result.stdout
    machine.nothing_written()


def test_serial_unreadable_everywhere(machine, rendered):
    install_dmidecode(machine.bin, "KubeVirt", FAIL)
    make_sysfs(machine.sysfs, "KubeVirt", None)
    result = machine.run(rendered)
    assert result.status == os.EX_UNAVAILABLE
    assert one_line(result.stderr) == (
        f"{SCRIPT_NAME}: error: cannot read the SMBIOS system serial number (dmidecode: dmidecode exited with "
        f"status 1; sysfs: {machine.sysfs / 'product_serial'}: {os.strerror(errno.ENOENT)})\n")
    machine.nothing_written()


@pytest.mark.parametrize("dmidecode_serial, sysfs_serial", [
    ("web1.vms", "web2.vms"),
    ("web1.vms", b"web1\x01vms\n"),  # dmidecode shows a control character as "."
    ("web1.vms", ""),
])
def test_sources_that_disagree_on_the_serial_are_refused(machine, rendered, dmidecode_serial, sysfs_serial):
    machine.smbios("KubeVirt", dmidecode_serial, sysfs_serial=sysfs_serial)
    result = machine.run(rendered)
    assert result.status == os.EX_DATAERR
    shown = sysfs_serial.decode().strip() if isinstance(sysfs_serial, bytes) else sysfs_serial
    assert one_line(result.stderr) == (
        f"{SCRIPT_NAME}: error: the SMBIOS system serial number sources disagree (dmidecode says "
        f"{ascii(dmidecode_serial)}, sysfs says {ascii(shown)}): refusing to configure the BMC\n")
    machine.nothing_written()


def test_sources_that_disagree_on_being_kubevirt_are_refused(machine, rendered):
    machine.smbios("KubeVirt", "web1.vms", sysfs_vendor="Dell Inc.")
    result = machine.run(rendered)
    assert result.status == os.EX_DATAERR
    assert one_line(result.stderr) == (
        f"{SCRIPT_NAME}: error: the SMBIOS system manufacturer sources disagree (dmidecode says 'KubeVirt', "
        "sysfs says 'Dell Inc.'): refusing to configure the BMC\n")
    machine.nothing_written()


def test_sources_that_disagree_on_another_vendor_are_not_ours(machine, rendered):
    machine.smbios("Dell Inc.", "8XK2Q53", sysfs_vendor="HPE")
    result = machine.run(rendered)
    assert result.status == 0
    assert one_line(result.stdout) == (
        f"{SCRIPT_NAME}: not a KubeVirt VM: the SMBIOS system manufacturer sources disagree "
        "(dmidecode says 'Dell Inc.', sysfs says 'HPE'): nothing to do\n")
    machine.nothing_written()
    assert machine.skipped()


# --- SMBIOS text in messages: escaped and short --------------------------------------------


@pytest.mark.parametrize("raw", [
    b"\x1b[2J\x1b]0;owned\x07Evil\x9b31m" + b"x" * 5000 + b"\n",
    "\u202eKubeVirt\u2028\u0000".encode("utf-8") * 300 + b"\n",
])
def test_echoed_manufacturer_is_escaped_and_shortened(machine, rendered, raw):
    machine.smbios(raw, "web1.vms", sysfs_vendor=raw)
    result = machine.run(rendered)  # run checks the output is printable ASCII
    assert result.status == 0
    line = one_line(result.stdout)
    shown_length = len(raw.decode("utf-8", "replace").strip())
    assert f"({shown_length} characters)" in line
    assert len(line) < 400


def test_echoed_serial_is_escaped_and_shortened(machine, rendered):
    serial = "\x1b[31m" + "w" * 300 + ".vms"
    machine.smbios("KubeVirt", serial.encode("utf-8") + b"\n", sysfs_serial=serial)
    result = machine.run(rendered)
    assert result.status == 0
    line = one_line(result.stdout)
    assert "'\\x1b[31mwww" in line and f"({len(serial)} characters)" in line
    assert "w" * 100 not in line


@pytest.mark.parametrize("length", [64, 65])
def test_smbios_text_is_shown_whole_up_to_64_characters(machine, rendered, length):
    vendor = "V" * length
    machine.smbios(vendor, "web1.vms")
    result = machine.run(rendered)
    shown = ascii(vendor) if length <= 64 else f"{ascii(vendor[:64])}... ({length} characters)"
    assert one_line(result.stdout) == (
        f"{SCRIPT_NAME}: not a KubeVirt VM: system manufacturer is {shown}, not 'KubeVirt': nothing to do\n")


def test_disagreeing_sources_are_escaped_and_shortened(machine, rendered):
    machine.smbios("KubeVirt", "web1.vms", sysfs_serial="\x07" + "s" * 200)
    result = machine.run(rendered)
    assert result.status == os.EX_DATAERR
    line = one_line(result.stderr)
    assert "'\\x07sss" in line and "(201 characters)" in line and "s" * 100 not in line


def test_invalid_settings_are_a_configuration_error(machine, monkeypatch):
    machine.smbios("KubeVirt", "web1.vms")
    module = load_script()
    monkeypatch.setattr(module, "SETTINGS", {**module.SETTINGS, "check": "sometimes", "domain": "x", "rendered": "yes"})
    result = machine.run_inprocess(module, monkeypatch)
    assert result.status == os.EX_CONFIG
    assert "check is not off, advisory or strict" in result.stderr and "domain" in result.stderr
    assert "rendered is not True or False" in one_line(result.stderr)
    machine.nothing_written()


SETTINGS_PROBLEMS = {
    "domain": ("bmc", "domain is not a DNS name"),
    "check": ("sometimes", "check is not off, advisory or strict"),
    "manufacturer": (" \t", "manufacturer is empty"),
    "rendered": ("yes", "rendered is not True or False"),
}


@pytest.mark.parametrize("key", SETTINGS_PROBLEMS)
def test_each_wrong_setting_is_named(machine, monkeypatch, key):
    """A hand-edited SETTINGS line: the error names the key, so the operator knows what to render again."""
    machine.smbios("KubeVirt", "web1.vms")
    module = load_script(name=f"settings_{key}")
    value, problem = SETTINGS_PROBLEMS[key]
    monkeypatch.setattr(module, "SETTINGS", {**module.SETTINGS, "rendered": True, key: value})
    result = machine.run_inprocess(module, monkeypatch)
    assert result.status == os.EX_CONFIG
    assert one_line(result.stderr) == f"{SCRIPT_NAME}: error: SETTINGS: {problem}: render the script again\n"
    machine.nothing_written()


def test_every_wrong_setting_is_named_at_once(machine, monkeypatch):
    machine.smbios("KubeVirt", "web1.vms")
    module = load_script(name="settings_all_wrong")
    monkeypatch.setattr(module, "SETTINGS", {key: value for key, (value, _) in SETTINGS_PROBLEMS.items()})
    result = machine.run_inprocess(module, monkeypatch)
    assert result.status == os.EX_CONFIG
    problems = "; ".join(problem for _, problem in SETTINGS_PROBLEMS.values())
    assert one_line(result.stderr) == f"{SCRIPT_NAME}: error: SETTINGS: {problems}: render the script again\n"


@pytest.mark.parametrize("missing", SETTINGS_PROBLEMS)
def test_missing_setting_is_named(machine, monkeypatch, missing):
    """A key the line lacks is wrong, not a crash."""
    machine.smbios("KubeVirt", "web1.vms")
    module = load_script(name=f"settings_missing_{missing}")
    settings = {key: value for key, value in module.SETTINGS.items() if key != missing}
    monkeypatch.setattr(module, "SETTINGS", settings)
    result = machine.run_inprocess(module, monkeypatch)
    assert result.status == os.EX_CONFIG
    assert one_line(result.stderr) == (
        f"{SCRIPT_NAME}: error: SETTINGS: {SETTINGS_PROBLEMS[missing][1]}: render the script again\n")


def test_settings_that_are_not_a_mapping(machine, monkeypatch):
    machine.smbios("KubeVirt", "web1.vms")
    module = load_script(name="settings_list")
    monkeypatch.setattr(module, "SETTINGS", [("domain", "bmc.example.com")])
    result = machine.run_inprocess(module, monkeypatch)
    assert result.status == os.EX_CONFIG
    assert one_line(result.stderr) == f"{SCRIPT_NAME}: error: SETTINGS is not a mapping: render the script again\n"


@pytest.mark.parametrize("check", ["off", "advisory", "strict"])
def test_every_documented_setting_is_accepted(check):
    module = load_script(name="settings_accepted")
    settings = {**module.SETTINGS, "check": check, "rendered": True}
    assert module.check_settings(settings) == settings


# --- Where DMI values come from ---------------------------------------------------------


def test_parse_dmidecode_takes_the_first_value_line():
    module = load_script()
    assert module.parse_dmidecode(b"KubeVirt\n") == "KubeVirt"
    assert module.parse_dmidecode(b"# SMBIOS entry point at 0x000f5b40\nKubeVirt\n") == "KubeVirt"
    assert module.parse_dmidecode(b"web1.vms\nweb2.vms\n") == "web1.vms"
    assert module.parse_dmidecode(b"") == ""
    assert module.parse_dmidecode(b"# No SMBIOS nor DMI entry point found, sorry.\n") == ""
    assert module.parse_dmidecode(b"w\xc3\xa9b\xff\n") == "wéb\ufffd"


# pyudev's attributes are bytes; a str is taken too
@pytest.mark.parametrize("kind", [str.encode, str], ids=["bytes", "str"])
def test_pyudev_is_used_when_it_can_read_the_dmi_device(machine, rendered, monkeypatch, kind):
    machine.smbios("KubeVirt", "web1.vms", sysfs=False)
    seen = []

    class Context:
        pass

    class Device:
        attributes = {"sys_vendor": kind("KubeVirt"), "product_serial": kind("web2.vms")}

    class Devices:
        @staticmethod
        def from_sys_path(context, path):
            assert isinstance(context, Context)  # as pyudev, which reads the context's libudev handle
            seen.append(path)
            return Device()

    module = load_script(rendered, "rendered_pyudev")
    monkeypatch.setattr(module, "pyudev", types.SimpleNamespace(Context=Context, Devices=Devices))
    result = machine.run_inprocess(module, monkeypatch)
    assert seen and seen[0] == os.path.realpath(machine.sysfs)
    assert result.status == os.EX_DATAERR and "'web2.vms'" in result.stderr  # pyudev's value was compared
    machine.nothing_written()


def test_pyudev_failing_falls_back_to_the_files(machine, rendered, monkeypatch):
    machine.smbios("KubeVirt", "web1.vms")

    def broken(*args):
        raise OSError("no libudev")

    module = load_script(rendered, "rendered_pyudev_broken")
    monkeypatch.setattr(module, "pyudev", types.SimpleNamespace(Context=broken, Devices=None))
    assert machine.run_inprocess(module, monkeypatch).status == 0
    assert_enlisted(machine.written(), "web1.vms")


def files_only(rendered: Path, name: str, machine: Machine, monkeypatch) -> types.ModuleType:
    """The rendered script, reading the machine's DMI attributes from its files (no pyudev)."""
    module = load_script(rendered, name)
    monkeypatch.setattr(module, "pyudev", None)
    monkeypatch.setattr(module, "DMI_DIR", str(machine.sysfs))
    return module


@pytest.mark.parametrize("size", [64 * 1024, 64 * 1024 + 1])
def test_dmi_attribute_is_read_at_most_64_kib(machine, rendered, monkeypatch, size):
    """The kernel's attributes are short; a file that is not is refused, not read to its end."""
    make_sysfs(machine.sysfs, b"K" * size, None)
    module = files_only(rendered, "rendered_sysfs_bounded", machine, monkeypatch)
    expected = ("K" * size, None) if size <= 64 * 1024 else (
        None, f"{machine.sysfs / 'sys_vendor'}: more than 65536 bytes")
    assert module.read_sysfs("sys_vendor") == expected


def test_endless_dmi_attribute_is_not_read_to_its_end(machine, rendered, monkeypatch):
    """Past 64 KiB the reader stops and lets go: the writer of a stream that goes on is cut off."""
    machine.sysfs.mkdir(parents=True, exist_ok=True)
    fifo = machine.sysfs / "sys_vendor"
    os.mkfifo(fifo)
    outcome = []

    def write_four_times_the_limit():
        try:
            with open(fifo, "wb") as stream:
                stream.write(b"K" * (4 * 64 * 1024))
            outcome.append("read to its end")
        except BrokenPipeError:
            outcome.append("cut off")

    writer = threading.Thread(target=write_four_times_the_limit, daemon=True)
    writer.start()
    module = files_only(rendered, "rendered_sysfs_endless", machine, monkeypatch)
    assert module.read_sysfs("sys_vendor") == (None, f"{fifo}: more than 65536 bytes")
    writer.join(timeout=30)
    assert outcome == ["cut off"]


def test_dmi_read_error_without_errno_text_is_named_by_its_kind(machine, rendered, monkeypatch):
    class SysfsGone(OSError):
        pass

    def unreadable(path, mode="r"):
        raise SysfsGone("the attribute went away")

    module = files_only(rendered, "rendered_sysfs_bare_oserror", machine, monkeypatch)
    monkeypatch.setattr(module, "open", unreadable, raising=False)
    assert module.read_sysfs("sys_vendor") == (None, f"{machine.sysfs / 'sys_vendor'}: SysfsGone")


def test_command_start_error_without_errno_text_is_named_by_its_kind(rendered, monkeypatch):
    class ExecGone(OSError):
        pass

    def refuse(*args, **kwargs):
        raise ExecGone("cannot start")

    module = load_script(rendered, "rendered_popen_bare_oserror")
    monkeypatch.setattr(module.subprocess, "Popen", refuse)
    assert module.run_command(["dmidecode", "-s", "system-serial-number"]) == (
        None, "dmidecode cannot run (ExecGone)")


def test_without_pyudev_the_files_are_read(machine, rendered, monkeypatch):
    machine.smbios("KubeVirt", "web1.vms", dmidecode=False)
    module = load_script(rendered, "rendered_no_pyudev")
    monkeypatch.setattr(module, "pyudev", None)
    assert machine.run_inprocess(module, monkeypatch).status == 0
    assert_enlisted(machine.written(), "web1.vms")


# --- Secrets --------------------------------------------------------------------------------


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt, MemoryError])
def test_unexpected_errors_show_only_their_kind(machine, rendered, monkeypatch, error):
    machine.smbios("KubeVirt", "web1.vms")
    module = load_script(rendered, "rendered_crash")

    def crash(path, config):
        raise error(f"{config['power_pass']} \x1b[2J {config}")

    monkeypatch.setattr(module, "write_config", crash)
    result = machine.run_inprocess(module, monkeypatch)  # checks: no power_pass, no escape sequence
    assert result.status == os.EX_SOFTWARE
    # The innermost line, where it was raised: what a bug report needs.
    raised = crash.__code__.co_firstlineno + 1
    assert one_line(result.stderr) == f"{SCRIPT_NAME}: error: unexpected {error.__name__} at line {raised}\n"
    assert result.stdout == ""


def test_output_checker_catches_a_password_and_raw_control_characters():
    """Every run above goes through Machine.check_output; this checks the checker."""
    with pytest.raises(AssertionError):
        Machine.check_output(Run(0, f"oops {identity.PLACEHOLDER_PASSWORD}\n", ""))
    with pytest.raises(AssertionError):
        Machine.check_output(Run(0, "system manufacturer is \x1b[2J\n", ""))
    with pytest.raises(AssertionError):
        Machine.check_output(Run(0, "", "caf\u00e9\n"))
    Machine.check_output(Run(0, "two\nlines\n", "'\\x1b'\n"))


# --- The optional Redfish check -----------------------------------------------------------


class RedfishDouble:
    """A local HTTP server standing in for kubevirtBMC behind its Ingress."""

    def __init__(self, status: int = 200, *, answer: bool = True, tls: ssl.SSLContext | None = None):
        double = self
        self.requests: list[dict] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                double.requests.append({"path": self.path, **{k.lower(): v for k, v in self.headers.items()}})
                if not answer:
                    time.sleep(10)
                    return
                body = b'{"Id": "1"}'
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def checking_script(tmp_path: Path, check: str, port: int | None = None, resolve=None):
    module = load_script(render_to(tmp_path, values_with(check=check)), f"rendered_check_{check}")
    asked = []

    def fake_resolve(host, wanted_port):
        asked.append((host, wanted_port))
        if resolve is not None:
            return resolve(host, wanted_port)
        return (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))

    module.resolve = fake_resolve
    return module, asked


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> tuple[Path, Path]:
    """A self-signed certificate and its key: what a BMC Ingress may well present."""
    openssl = require_tool("openssl", "openssl makes the self-signed certificate of the Redfish check's tests")
    directory = tmp_path_factory.mktemp("tls")
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=bmc",
                    "-keyout", str(directory / "key.pem"), "-out", str(directory / "cert.pem")],
                   check=True, capture_output=True)
    return directory / "cert.pem", directory / "key.pem"


def tls_context(certificate: tuple[Path, Path]) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*certificate)
    return context


PLAIN = None  # a double without TLS


@pytest.fixture
def bmc(certificate):
    """Redfish doubles serving HTTPS, as MAAS's driver and the check always ask (tls=PLAIN: HTTP)."""
    servers = []

    def start(*args, tls="self-signed", **kwargs):
        context = tls_context(certificate) if tls == "self-signed" else tls
        servers.append(RedfishDouble(*args, tls=context, **kwargs))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.mark.parametrize("check", ["advisory", "strict"])
def test_check_that_passes_writes(machine, tmp_path, monkeypatch, bmc, check):
    double = bmc(200)
    machine.smbios("KubeVirt", "web1.vms")
    module, asked = checking_script(tmp_path, check, port=double.port)
    result = machine.run_inprocess(module, monkeypatch)
    assert result.status == 0, result.output
    assert "answered 200" in result.stdout
    assert asked == [("web1.vms.bmc.example.com", 443)]
    assert_enlisted(machine.written(), "web1.vms")
    [request] = double.requests
    assert request["path"] == "/redfish/v1/"  # the service root, public in Redfish and kubevirtBMC
    assert request["host"] == "web1.vms.bmc.example.com"
    assert request["accept"] == "application/json"  # what a Redfish client asks for (DSP0266)
    assert "authorization" not in request  # the script has no credential to send


@pytest.mark.parametrize("check, status", [("advisory", 0), ("strict", os.EX_UNAVAILABLE)])
def test_check_refused_by_the_allowlist(machine, tmp_path, monkeypatch, bmc, check, status):
    double = bmc(403)
    machine.smbios("KubeVirt", "web1.vms")
    module, _ = checking_script(tmp_path, check, port=double.port)
    result = machine.run_inprocess(module, monkeypatch)
    assert result.status == status
    assert "answered 403 (refused: does ingress.source_ranges admit this machine?)" in result.stdout
    if check == "strict":
        assert one_line(result.stderr) == (f"{SCRIPT_NAME}: error: the Redfish check failed and check is strict: "
                                           "not writing BMC_CONFIG_PATH\n")
        machine.nothing_written()
    else:
        assert_enlisted(machine.written(), "web1.vms")


def test_check_with_nothing_listening_is_reported(machine, tmp_path, monkeypatch):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    machine.smbios("KubeVirt", "web1.vms")
    module, _ = checking_script(tmp_path, "advisory", port=free)
    result = machine.run_inprocess(module, monkeypatch)
    assert result.status == 0 and "cannot connect" in result.stdout
    assert_enlisted(machine.written(), "web1.vms")


def test_check_against_plain_http_reports_tls(machine, tmp_path, monkeypatch, bmc):
    double = bmc(200, tls=PLAIN)
    machine.smbios("KubeVirt", "web1.vms")
    module, asked = checking_script(tmp_path, "advisory", port=double.port)
    result = machine.run_inprocess(module, monkeypatch)
    assert result.status == 0 and "TLS failed" in result.stdout
    assert asked == [("web1.vms.bmc.example.com", 443)]
    assert_enlisted(machine.written(), "web1.vms")


def test_check_over_https_does_not_verify_the_certificate(machine, tmp_path, monkeypatch, bmc, certificate):
    context = tls_context(certificate)
    server_names = []
    context.sni_callback = lambda sock, name, ctx: server_names.append(name)
    double = bmc(200, tls=context)
    machine.smbios("KubeVirt", "web1.vms")
    module, _ = checking_script(tmp_path, "strict", port=double.port)
    result = machine.run_inprocess(module, monkeypatch)
    assert result.status == 0, result.output
    assert "answered 200" in result.stdout
    assert double.requests[0]["host"] == "web1.vms.bmc.example.com"
    # An Ingress controller picks the certificate (and, passing TLS through, the backend) by SNI.
    assert server_names == ["web1.vms.bmc.example.com"]


def test_check_that_hangs_in_dns_is_bounded_to_5_seconds(machine, tmp_path, monkeypatch):
    def slow_dns(host, port):
        time.sleep(30)

    machine.smbios("KubeVirt", "web1.vms")
    module, _ = checking_script(tmp_path, "advisory", resolve=slow_dns)
    assert module.CHECK_TIMEOUT <= 5
    started = time.monotonic()
    result = machine.run_inprocess(module, monkeypatch)
    elapsed = time.monotonic() - started
    assert module.CHECK_TIMEOUT - 0.5 <= elapsed < module.CHECK_TIMEOUT + 1
    assert result.status == 0 and "no answer within 5 s" in result.stdout
    assert_enlisted(machine.written(), "web1.vms")


def test_strict_check_with_a_bmc_that_never_answers(machine, tmp_path, monkeypatch, bmc):
    double = bmc(answer=False)
    machine.smbios("KubeVirt", "web1.vms")
    module, _ = checking_script(tmp_path, "strict", port=double.port)
    monkeypatch.setattr(module, "CHECK_TIMEOUT", 1.0)
    started = time.monotonic()
    result = machine.run_inprocess(module, monkeypatch)
    assert time.monotonic() - started < 3
    assert result.status == os.EX_UNAVAILABLE and "no answer within 1 s" in result.stdout
    machine.nothing_written()


def test_check_off_never_touches_the_network(machine, tmp_path, monkeypatch):
    def no_network(host, port):
        raise AssertionError("the check is off")

    machine.smbios("KubeVirt", "web1.vms")
    module, asked = checking_script(tmp_path, "off", resolve=no_network)
    assert machine.run_inprocess(module, monkeypatch).status == 0
    assert asked == []


def test_advisory_check_as_maas_runs_it(machine, tmp_path):
    """The real resolver, a name that never resolves (RFC 6761 .invalid): reported, bounded, written."""
    script = render_to(tmp_path, values_with(check="advisory", domain="bmc.invalid"))
    machine.smbios("KubeVirt", "web1.vms")
    started = time.monotonic()
    result = machine.run(script)
    assert time.monotonic() - started < 10
    assert result.status == 0, result.output
    assert result.stdout.startswith("Redfish check: https://web1.vms.bmc.invalid/redfish/v1/: ")
    assert_enlisted(machine.written(), "web1.vms", domain="bmc.invalid")


@pytest.mark.parametrize("check", ["advisory", "strict"])
def test_bmc_answering_another_status_is_reported_without_a_hint(machine, tmp_path, monkeypatch, bmc, check):
    """Only a 403 points at ingress.source_ranges; any other answer is reported as it is."""
    double = bmc(404)
    machine.smbios("KubeVirt", "web1.vms")
    module, _ = checking_script(tmp_path, check, port=double.port)
    result = machine.run_inprocess(module, monkeypatch)
    assert result.stdout.splitlines()[0] == "Redfish check: https://web1.vms.bmc.example.com/redfish/v1/ answered 404"
    assert result.status == (os.EX_UNAVAILABLE if check == "strict" else 0)


# What the network may do to the check (raised where the address is looked up, as good as anywhere in
# the request), and the reason the report gives for it.
CHECK_FAILURES = {
    "no-such-name": (lambda: socket.gaierror(socket.EAI_NONAME, "Name or service not known"),
                     "its name does not resolve"),
    "timeout": (lambda: socket.timeout("timed out"), "no answer within 5 s"),
    "tls": (lambda: ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number"), "TLS failed (SSLError)"),
    "refused": (lambda: ConnectionRefusedError(errno.ECONNREFUSED, os.strerror(errno.ECONNREFUSED)),
                f"cannot connect ({os.strerror(errno.ECONNREFUSED)})"),
    # An Ingress that closes the connection unanswered: an OSError with no errno text, named by its kind.
    "closed": (lambda: http.client.RemoteDisconnected("Remote end closed connection without response"),
               "cannot connect (RemoteDisconnected)"),
    "other": (lambda: ValueError("unexpected"), "failed (ValueError)"),
    # The check's thread ended without a result (attempt() catches Exception only).
    "no-result": (lambda: SystemExit(1), "no answer within 5 s"),
}


@pytest.mark.parametrize("check", ["advisory", "strict"])
@pytest.mark.parametrize("failure", [
    # pytest reports a thread's SystemExit, which Python itself passes over in silence.
    pytest.param(failure, marks=pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning"))
    if failure == "no-result" else failure for failure in CHECK_FAILURES])
def test_check_failures_are_reported_with_their_reason(machine, tmp_path, monkeypatch, check, failure):
    make_error, reason = CHECK_FAILURES[failure]

    def failing(host, port):
        raise make_error()

    machine.smbios("KubeVirt", "web1.vms")
    module, _ = checking_script(tmp_path, check, resolve=failing)
    result = machine.run_inprocess(module, monkeypatch)
    report = f"Redfish check: https://web1.vms.bmc.example.com/redfish/v1/: {reason}\n"
    if check == "strict":
        assert result.status == os.EX_UNAVAILABLE and result.stdout == report
        machine.nothing_written()
    else:
        assert result.status == 0 and result.stdout.startswith(report) and result.stderr == ""
        assert_enlisted(machine.written(), "web1.vms")


def wrapped(tmp_path: Path, script: Path, setup: str) -> Path:
    """An executable that loads script, runs setup (Python, the loaded script named `script`) and
    then exits with main()'s status, as the script itself does: for faults only a test can make."""
    wrapper = tmp_path / "wrapped"
    wrapper.write_text(
        f"#!{sys.executable}\n"
        "import importlib.machinery, importlib.util, socket, sys, time\n"
        f"loader = importlib.machinery.SourceFileLoader('script', {str(script)!r})\n"
        "script = importlib.util.module_from_spec(importlib.util.spec_from_loader('script', loader))\n"
        "loader.exec_module(script)\n"
        f"{setup}\n"
        "sys.exit(script.main())\n", encoding="utf-8")
    wrapper.chmod(0o755)
    return wrapper


def test_lookup_still_hanging_does_not_keep_the_script_running(machine, tmp_path):
    """MAAS waits for the script to exit: a DNS lookup the check gave up on must not hold it."""
    script = render_to(tmp_path, values_with(check="advisory"))
    wrapper = wrapped(tmp_path, script, "script.CHECK_TIMEOUT = 0.5\nscript.resolve = lambda host, port: time.sleep(20)")
    machine.smbios("KubeVirt", "web1.vms")
    started = time.monotonic()
    result = machine.run(wrapper)
    assert time.monotonic() - started < 10
    assert result.status == 0, result.output
    assert result.stdout.startswith("Redfish check: https://web1.vms.bmc.example.com/redfish/v1/: no answer within 0.5 s\n")
    assert_enlisted(machine.written(), "web1.vms")


def test_check_report_comes_before_the_refusal_it_caused(machine, tmp_path):
    """MAAS keeps a log of both streams in the order written: the report must come first, so it
    is flushed before the error is printed (stdout to a pipe is buffered until exit otherwise)."""
    script = render_to(tmp_path, values_with(check="strict", domain="bmc.invalid"))
    machine.smbios("KubeVirt", "web1.vms")
    result = machine.run(script, combined=True)
    assert result.status == os.EX_UNAVAILABLE
    report, error = result.stdout.splitlines()
    assert report.startswith("Redfish check: https://web1.vms.bmc.invalid/redfish/v1/: ")
    assert error == f"{SCRIPT_NAME}: error: the Redfish check failed and check is strict: not writing BMC_CONFIG_PATH"


def test_resolve_gives_the_first_tcp_address_with_the_port():
    module = load_script(name="resolving")
    assert module.resolve("127.0.0.1", 8443) == (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "",
                                                  ("127.0.0.1", 8443))


def test_resolve_asks_for_stream_sockets_whatever_order_the_resolver_lists(monkeypatch):
    """A resolver may list an address's datagram entry first: the check needs the TCP one."""
    module = load_script(name="resolving-order")
    real = socket.getaddrinfo

    def datagram_first(host, port, family=0, type=0, proto=0, flags=0):
        found = real(host, port, family, type, proto, flags)
        return sorted(found, key=lambda entry: entry[1] != socket.SOCK_DGRAM)

    monkeypatch.setattr(module.socket, "getaddrinfo", datagram_first)
    assert module.resolve("127.0.0.1", 8443)[1] == socket.SOCK_STREAM


def test_output_ready_exactly_at_the_deadline_is_not_read(monkeypatch):
    """The deadline is the end: at that instant even waiting output is a timeout."""
    module = load_script(name="at-the-deadline")
    read_end, write_end = os.pipe()
    os.write(write_end, b"KubeVirt\n")
    os.close(write_end)
    monkeypatch.setattr(module.time, "monotonic", lambda: 100.0)
    try:
        assert module._read_at_most(read_end, 64, 100.0) == (None, "timeout")
        assert module._read_at_most(read_end, 64, 100.5) == (b"KubeVirt\n", None)
    finally:
        os.close(read_end)
