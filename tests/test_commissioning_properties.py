"""Properties of the commissioning script, in-process so the CI profile's examples run fast.

1. Its copy of the identity rules equals maas_kubevirt.identity for arbitrary text, and its
   placeholder password and enlistment user prefix are identity's.
2. For any SMBIOS serial and any values it writes a file that parses (yaml.safe_load) to
   exactly the five keys with the right values (the placeholder the only password, a random
   enlistment user), or
   writes nothing and, when it exits 0, records Skipped; and when everything is in order it
   does write. Whatever it prints is one line of printable ASCII that never contains the
   password or user it writes nor a long SMBIOS string whole.
3. render_commissioning injects any text as a literal and changes nothing else.

Guarded assertions count how often their branch ran (tests/branches.py), and the test fails
when that share is too small to prove anything.
"""

from __future__ import annotations

import ast
import io
import json
import os
import stat
import tempfile
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from unittest import mock

import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from branches import branch, branches_taken
from maas_kubevirt import identity
from maas_kubevirt.render import render_commissioning, script_settings
from test_commissioning import SCRIPT, SKIPPED, VALUES, assert_enlisted, load_script

CI = os.environ.get("HYPOTHESIS_PROFILE") == "ci"
# The main property runs at least 10,000 examples under the ci profile (tests/conftest.py).
MANY = max(10_000, settings.default.max_examples) if CI else settings.default.max_examples * 3

script = load_script(SCRIPT, "kubevirt_bmc_config_properties")
# Each example writes into a fresh directory: on tmpfs when there is one, where fsync costs nothing.
SCRATCH = "/dev/shm" if os.access("/dev/shm", os.W_OK | os.X_OK) else None

# --- Strategies: arbitrary text, plus text shaped like the names so the valid side is reached ---

label = st.one_of(
    st.from_regex(r"[a-z0-9]([-a-z0-9]{0,8}[a-z0-9])?", fullmatch=True),
    st.integers(1, 66).map(lambda n: "a" * n),
    st.text(alphabet="ab09-_.AZé \n", max_size=12),
)
vm_name = st.one_of(
    st.lists(label, min_size=1, max_size=4).map(".".join),
    st.integers(60, 66).flatmap(lambda n: st.integers(3, 5).map(lambda k: ".".join(["v" * n] * k))),
)
serial = st.one_of(
    st.text(max_size=80),
    st.builds(lambda vm, ns: f"{vm}.{ns}", vm_name, label),
    st.uuids().map(str),
    st.sampled_from(["", "Not Specified", "web1.vms", "web.frontend.vms", "$(reboot).vms", "web1.vms; id"]),
)
domain = st.one_of(
    st.sampled_from(["bmc.example.com", "BMC.Example.COM.", "lab.example.org", "bmc.exampl\u212a.com", "example", ""]),
    st.lists(label, min_size=1, max_size=4).map(".".join),
    st.integers(230, 252).map(lambda n: ("d" * 60 + ".") * (n // 61) + "com"),
    st.text(max_size=40),
)


def outcome(rule, errors, *args):
    try:
        return ("ok", rule(*args))
    except errors:
        return ("rejected",)


# --- 1. The script's identity rules are the package's ---------------------------------------


# A VM name of exactly 253 characters, the most a DNS-1123 subdomain may have.
VM_253 = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 61])


@given(serial)
@example("web1.vms")
@example("a" * 63 + "." + "b" * 63)
@example("web1.vms\n")
@example(f"{VM_253}.vms")
@example(f"{VM_253}d.vms")  # 254
@example("a.vms")  # one-character labels
@example("web1.n")
def test_parse_serial_agrees(text):
    assert outcome(script.parse_serial, ValueError, text) == outcome(identity.parse_serial, identity.IdentityError, text)


@given(domain)
@example("example.com")  # two labels, the fewest
@example(".".join(["d" * 60] * 4) + "." + "d" * 5)  # 249 characters, the most
@example(".".join(["d" * 60] * 4) + "." + "d" * 6)  # 250
@example("bmc.example.com.")  # the root's dot
def test_validate_domain_agrees(text):
    assert outcome(script.validate_domain, ValueError, text) == outcome(
        identity.validate_domain, identity.IdentityError, text)


@given(vm_name, label, domain)
@example("a" * 63 + "." + "b" * 63 + "." + "c" * 63 + "." + "d" * 41, "vms", "bmc.example.com")  # 253
@example("a" * 63 + "." + "b" * 63 + "." + "c" * 63 + "." + "d" * 42, "vms", "bmc.example.com")  # 254
@example("web1", "a.b", "bmc.example.com")
def test_redfish_host_agrees(vm, namespace, text):
    assert outcome(script.redfish_host, ValueError, vm, namespace, text) == outcome(
        identity.redfish_host, identity.IdentityError, vm, namespace, text)


def test_copied_constants_agree_and_no_password_rule_is_left():
    assert script.PLACEHOLDER_PASSWORD == identity.PLACEHOLDER_PASSWORD
    # The reconciler knows a machine still on the script's random user by this prefix.
    assert script.ENLIST_USER_PREFIX == identity.ENLIST_USER_PREFIX
    assert not hasattr(script, "bmc_password")  # the password rule lives only on the MAAS host and in the cluster


# --- The file read back: exactly what config_text writes ------------------------------------

config_key = st.from_regex(r"[a-z_]+", fullmatch=True)


@given(st.dictionaries(config_key, st.text(), max_size=6))
def test_config_reads_back_as_written(config):
    with tempfile.TemporaryDirectory(dir=SCRATCH) as directory:
        path = Path(directory) / "bmc-config.yaml"
        path.write_text(script.config_text(config), encoding="utf-8")
        assert script.read_config(path) == config


@given(st.dictionaries(config_key, st.text(), min_size=1, max_size=6), st.data())
def test_anything_else_does_not_read_back(config, data):
    """A repeated key, a value that is not a string, or a line config_text never writes: ValueError."""
    lines = script.config_text(config).splitlines()
    key = data.draw(st.sampled_from(sorted(config)))
    bad = data.draw(st.sampled_from([
        f"{key}: {json.dumps(config[key])}",  # the same key twice
        f"{key}x: 1", f"{key}x: null", f'{key}x: ["a"]',  # JSON, but not a string
        f"{key}x: plain", f"{key.upper()}: \"a\"", f"{key}x:\"a\"", "",
    ]))
    lines.insert(data.draw(st.integers(0, len(lines))), bad)
    with tempfile.TemporaryDirectory(dir=SCRATCH) as directory:
        path = Path(directory) / "bmc-config.yaml"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        try:
            script.read_config(path)
        except ValueError:
            return
        raise AssertionError(f"read_config accepted {bad!r}")


# --- 2. Any serial, any values: exactly the five right keys, or nothing ----------------------

VENDOR_NAMES = ["Dell Inc.", "HPE", "QEMU", "Not Specified", "", "KubeVirt", "kubevirt"]


# How dmidecode may frame a value: the usual output, odd framing, or None for a failure
# (absent, non-zero or hung: run_command reports (None, why)).
FRAMING = st.sampled_from([b"", b"", b"", b"", b"", b"", b"# SMBIOS entry point at 0x000f5b40\n", b"  ", b"\xff\xfe\n", None])
# Strategies are built once here: building them inside the composite costs more than running the script.
# Each part of a machine is usually what a working site has and sometimes anything at all,
# so that both outcomes (written, nothing written) are common.
USUALLY = st.sampled_from([True, True, True, True, False])
GOOD_LABEL = st.one_of(
    st.from_regex(r"[a-z0-9]([-a-z0-9]{0,8}[a-z0-9])?", fullmatch=True), st.integers(1, 63).map(lambda n: "a" * n))
GOOD_SERIAL = st.builds(lambda vm, ns: f"{'.'.join(vm)}.{ns}", st.lists(GOOD_LABEL, min_size=1, max_size=4), GOOD_LABEL)
GOOD = {
    "domain": st.one_of(
        st.sampled_from(["bmc.example.com", "BMC.Example.COM.", "lab.example.org", "bmc.exampl\u212a.com"]),
        st.lists(GOOD_LABEL, min_size=2, max_size=4).map(".".join)),
    "check": st.sampled_from(["off", "advisory", "strict"]),
    "manufacturer": st.sampled_from(["KubeVirt", "Acme Cloud", "ünïcødé VMs", " KubeVirt\t"]),
    "rendered": st.just(True),
}
ANY = {
    "domain": domain,
    "check": st.text(max_size=6),
    "manufacturer": st.text(max_size=20),
    "rendered": st.one_of(st.booleans(), st.none(), st.text(max_size=3)),
}
# SMBIOS text that a message could echo: control characters, non-ASCII, and longer than it may show.
HOSTILE_TEXT = st.one_of(
    st.text(max_size=20),
    st.text(alphabet=st.characters(codec="utf-8"), min_size=65, max_size=200),
    st.builds(lambda n, c: c * n, st.integers(65, 300), st.sampled_from(["\x1b", "\u202e", "\x9b", "a", "é"])),
)
REPORTED = st.one_of(st.sampled_from(VENDOR_NAMES), HOSTILE_TEXT)
OTHER_SYSFS = st.fixed_dictionaries({"sys_vendor": HOSTILE_TEXT, "product_serial": st.one_of(serial, HOSTILE_TEXT)})


def framed(framing: bytes | None, text: str) -> bytes | None:
    return None if framing is None else framing + text.encode("utf-8") + b"\n"


@st.composite
def machines(draw):
    broken = not draw(USUALLY)  # some settings anything at all, or every one of them usable
    values = {key: draw(ANY[key] if broken and draw(st.booleans()) else GOOD[key]) for key in GOOD}
    manufacturer = values["manufacturer"] if draw(USUALLY) else draw(REPORTED)
    the_serial = draw(GOOD_SERIAL if draw(USUALLY) else st.one_of(serial, HOSTILE_TEXT))
    sysfs = draw(st.sampled_from(["absent", "same", "same", "other"]))
    return {
        "settings": values,
        "dmidecode": {
            "system-manufacturer": framed(draw(FRAMING), manufacturer),
            "system-serial-number": framed(draw(FRAMING), the_serial),
        },
        # sysfs: absent, agreeing with what was stamped, or holding something else
        "sysfs": sysfs,
        "sysfs_other": draw(OTHER_SYSFS) if sysfs == "other" else {"sys_vendor": "", "product_serial": ""},
        "stamped": {"sys_vendor": manufacturer, "product_serial": the_serial},
        "check_ok": draw(st.booleans()),
        "existing": draw(st.sampled_from([False] * 9 + [True])),
        "bmc_config_path": draw(st.sampled_from([True] * 9 + [False])),
        # No DMI directory and no dmidecode (ppc64el, s390x): only when neither source can read.
        "no_smbios": draw(st.booleans()),
    }


def run(machine: dict, directory: Path):
    """main() against the faked machine; (status, stdout, stderr, config path, result path)."""
    config = directory / "bmc-config.yaml"
    result = directory / "out" / "result.yaml"
    result.parent.mkdir()
    if machine["existing"]:
        config.write_text("power_type: ipmi\n")

    def run_command(args, timeout=None):
        output = machine["dmidecode"][args[-1]]
        return (None, "dmidecode exited with status 1") if output is None else (output, None)

    def read_sysfs(attribute):
        if machine["sysfs"] == "absent":
            return None, "no such file"
        source = machine["stamped"] if machine["sysfs"] == "same" else machine["sysfs_other"]
        return script._text(source[attribute].encode("utf-8")), None

    def redfish_check(host):
        return machine["check_ok"], "Redfish check: (faked)"

    def smbios_absent():
        return machine["no_smbios"] and machine["sysfs"] == "absent" and all(
            output is None for output in machine["dmidecode"].values())

    environ = {"RESULT_PATH": str(result)}
    if machine["bmc_config_path"]:
        environ["BMC_CONFIG_PATH"] = str(config)
    stdout, stderr = io.StringIO(), io.StringIO()
    with mock.patch.multiple(script, SETTINGS=machine["settings"], run_command=run_command,
                             read_sysfs=read_sysfs, redfish_check=redfish_check, smbios_absent=smbios_absent), \
            redirect_stdout(stdout), redirect_stderr(stderr):
        status = script.main(environ)
    return status, stdout.getvalue(), stderr.getvalue(), config, result


def seen(machine: dict, keyword: str, attribute: str) -> str | None:
    """The value the sources agree on, as the script reads it (None when none can read it)."""
    output = machine["dmidecode"][keyword]
    values = set()
    if output is not None:
        values.add(script.parse_dmidecode(output))
    if machine["sysfs"] != "absent":
        source = machine["stamped"] if machine["sysfs"] == "same" else machine["sysfs_other"]
        values.add(source[attribute].strip())
    values = {"" if value == "Not Specified" else value for value in values}
    return values.pop() if len(values) == 1 else None


def in_order(machine: dict) -> bool:
    """Everything needed to write: settings the package accepts, ours, a valid serial, a host."""
    values = machine["settings"]
    manufacturer, the_serial = seen(machine, "system-manufacturer", "sys_vendor"), None
    if manufacturer is not None and manufacturer == values["manufacturer"].strip():
        the_serial = seen(machine, "system-serial-number", "product_serial")
    try:
        vm, namespace = identity.parse_serial(the_serial)
        identity.redfish_host(vm, namespace, values["domain"])
    except identity.IdentityError:
        return False
    return (
        values["rendered"] is True and bool(values["manufacturer"].strip())
        and (values["check"] in ("off", "advisory") or (values["check"] == "strict" and machine["check_ok"]))
        and machine["bmc_config_path"] and not machine["existing"]
    )


def smbios_texts(machine: dict) -> list[str]:
    """Every SMBIOS string the faked machine shows the script, as the script reads it."""
    texts = [script.parse_dmidecode(output) for output in machine["dmidecode"].values() if output is not None]
    return texts + [text.strip() for source in (machine["stamped"], machine["sysfs_other"]) for text in source.values()]


def check_output(machine: dict, status: int, stdout: str, stderr: str) -> None:
    """One line (besides the Redfish check's report) of printable ASCII, never the password it
    writes, never a long SMBIOS string whole."""
    output = stdout + stderr
    lines = output.splitlines()
    check_line = [line for line in lines if line.startswith("Redfish check:")]
    assert len(lines) - len(check_line) == 1, lines
    assert (status == 0) == (stderr == "")
    assert all(" " <= c <= "~" for c in output.replace("\n", "")), output
    assert identity.PLACEHOLDER_PASSWORD not in output
    long_texts = [text for text in smbios_texts(machine) if len(text) > script.SHOWN_MAX]
    branch("long_smbios_text", long_texts)
    for text in long_texts:
        assert ascii(text) not in output
        try:
            identity.parse_serial(text)  # a valid serial is named whole in "wrote Redfish power for ..."
        except identity.IdentityError:
            assert text not in output


# About half of each branch's usual share (wrote 0.4, left alone 0.2, refused 0.4, long 0.4),
# so that a strategy change that starves a branch fails the test, and chance does not.
@branches_taken(wrote=0.2, left_alone=0.08, refused=0.15, long_smbios_text=0.2)
@settings(max_examples=MANY, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(machine=machines())
def test_writes_exactly_the_five_keys_or_nothing(machine):
    with tempfile.TemporaryDirectory(dir=SCRATCH) as directory:
        status, stdout, stderr, config, result = run(machine, Path(directory))
        check_output(machine, status, stdout, stderr)
        files = sorted(os.listdir(directory))
        wrote = branch("wrote", config.name in files and not machine["existing"])
        if branch("refused", status != 0):
            assert not result.exists()
        if branch("left_alone", status == 0 and not wrote):
            assert result.read_text(encoding="utf-8") == SKIPPED  # as MAAS's built-in bmc-config writes it
            assert os.listdir(result.parent) == [result.name]
        if machine["existing"]:
            assert config.read_text() == "power_type: ipmi\n"  # left alone, whatever else is wrong
            assert files == [config.name, "out"]
            return
        if not wrote:
            assert files == ["out"]
            assert not in_order(machine)
            return
        assert files == [config.name, "out"], "a temporary file was left behind"
        assert status == 0 and stderr == ""
        assert not result.exists()  # configured: MAAS shows Passed
        assert stat.S_IMODE(config.stat().st_mode) == 0o600
        written = yaml.safe_load(config.read_text(encoding="utf-8"))
    values = machine["settings"]
    assert seen(machine, "system-manufacturer", "sys_vendor") == values["manufacturer"].strip()
    the_serial = seen(machine, "system-serial-number", "product_serial")
    vm, namespace = identity.parse_serial(the_serial)
    # The script writes exactly the one address identity.py trusts, naming this VM.
    assert identity.parse_redfish_address(written["power_address"], values["domain"]) == (vm, namespace)
    # The placeholder the only password it ever writes, the user a random enlistment user.
    assert_enlisted(written, the_serial, domain=values["domain"])
    assert written["power_user"] not in stdout + stderr
    assert in_order(machine)


@branches_taken(wrote=0.15, long_smbios_text=0.2)  # as above, about half the usual share
@settings(max_examples=settings.default.max_examples * 3, suppress_health_check=[HealthCheck.too_slow])
@given(machine=machines())
def test_one_line_of_plain_text_on_every_path(machine):
    with tempfile.TemporaryDirectory(dir=SCRATCH) as directory:
        status, stdout, stderr, config, _ = run(machine, Path(directory))
        # When the password is in the file, the output must still not show it.
        branch("wrote", config.exists() and not machine["existing"])
    check_output(machine, status, stdout, stderr)


# --- 3. Rendering injects any value as a literal -------------------------------------------

ORIGINAL_LINES = SCRIPT.read_text(encoding="utf-8").split("\n")
[SETTINGS_INDEX] = [i for i, line in enumerate(ORIGINAL_LINES) if line.startswith("SETTINGS = ")]


@settings(max_examples=min(settings.default.max_examples, 300))  # each render parses the whole script
@given(st.fixed_dictionaries({key: st.text() for key in ("domain", "check", "manufacturer")}))
def test_render_injects_any_text_as_a_literal(values):
    given_values = {
        **VALUES,
        "redfish": {key: values[key] for key in ("domain", "check")},
        "smbios": {"manufacturer": values["manufacturer"]},
    }
    rendered = render_commissioning(given_values).split("\n")
    assert len(rendered) == len(ORIGINAL_LINES)
    changed = [i for i, (old, new) in enumerate(zip(ORIGINAL_LINES, rendered)) if old != new]
    assert changed == [SETTINGS_INDEX]  # the source tree's copy says rendered: False
    [statement] = ast.parse(rendered[SETTINGS_INDEX]).body  # the line is one whole statement
    assert isinstance(statement, ast.Assign) and statement.targets[0].id == "SETTINGS"
    injected = ast.literal_eval(statement.value)
    assert injected == script_settings(given_values) == {**values, "rendered": True}  # nothing else: no secret
