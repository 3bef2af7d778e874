"""The bundle against MAAS's own region (the real-MAAS tier; see realmaas.py for what runs and the
one stub). Machines enter as enlistment makes them: the rendered commissioning script runs with
a fake dmidecode, and exactly what it writes to BMC_CONFIG_PATH is enlisted as
maas_run_remote_scripts.py does, then the machine's own metadata signal.

Each test uses its own namespace (and so its own machines), deleted when it ends: the tests
share one region per release.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from fake_dmidecode import install_dmidecode, make_sysfs

from maas_kubevirt import identity
from maas_kubevirt.audit import Audit
from maas_kubevirt.maas import client_from_values
from maas_kubevirt.reconcile import Passwords, Reconciler, Settings
from maas_kubevirt.values import load_values

ROOT = Path(__file__).resolve().parent.parent
CLI = Path(sys.executable).parent / "maas-kubevirt"
DOMAIN = "bmc.example.com"
SCRIPT_NAME = "31-kubevirt-bmc-config"
DMI_ENV = "MAAS_KUBEVIRT_TEST_DMI_DIR"
SEED = "3c9e51a07f2d84b6e0a15c93d7f4286b1e0c5a9d37b2f8e46a1d09c5b7e3f210"
COMMISSION_EVENT = "User starting node commissioning"

_macs = itertools.count(1)


def new_mac() -> str:
    n = next(_macs) + (os.getpid() % 200) * 1000
    return "52:54:00:%02x:%02x:%02x" % ((n >> 16) & 0xFF, (n >> 8) & 0xFF, n & 0xFF)


class RecordingAudit(Audit):
    """Every audit record, as written, kept in memory (and printed, as the reconciler does)."""

    def __init__(self) -> None:
        super().__init__("")
        self.records: list[dict] = []

    def write(self, *args, **kwargs):
        record = super().write(*args, **kwargs)
        self.records.append(record)
        return record


# --- the site: values, seed, the rendered script ---------------------------------------------


@pytest.fixture(autouse=True)
def machines_of_the_test_deleted(request):
    """The machines a test made are deleted when it ends (the region keeps the others'): every
    fresh reconciler lists all machines, as does each read of every machine's power parameters,
    so each test costs the same, not more with every test before it, and none sees another's."""
    if "real_maas" not in request.fixturenames:
        yield
        return
    maas = request.getfixturevalue("real_maas")
    before = maas.machine_ids()
    yield
    maas.delete_machines(maas.machine_ids() - before)


@pytest.fixture(scope="module")
def site(real_maas, tmp_path_factory):
    """A values file for this MAAS (key in MAAS_API_KEY), its seed, and the rendered script."""
    directory = tmp_path_factory.mktemp("site")
    seed = directory / "seed"
    seed.write_text(SEED + "\n")
    seed.chmod(0o600)
    key = directory / "api-key"
    key.write_text(real_maas.api_key + "\n")
    key.chmod(0o600)
    values = directory / "values.yaml"
    values.write_text(yaml.safe_dump({
        "redfish": {"domain": DOMAIN},
        "seed": {"file": str(seed)},
        "maas": {"url": real_maas.url, "api_key_file": str(key), "interval": 60, "timeout": 60},
    }))
    output = directory / "build"
    rendered = run_cli(real_maas, values, "render", "--output", str(output))
    assert rendered.returncode == 0, rendered.stderr
    script = output / "commissioning" / SCRIPT_NAME
    assert script.exists()
    return {"values": values, "seed": SEED, "script": script, "dir": directory}


def run_cli(real_maas, values: Path, *args: str, timeout: float = 300, key_in_env: bool = False
            ) -> subprocess.CompletedProcess:
    """The CLI with these values: the key from maas.api_key_file, or from MAAS_API_KEY."""
    env = {key: value for key, value in os.environ.items() if key != "MAAS_API_KEY"}
    if key_in_env:
        env["MAAS_API_KEY"] = real_maas.api_key
    return subprocess.run([str(CLI), "--values", str(values), *args], capture_output=True, text=True,
                          env=env, timeout=timeout, check=False)


def run_script(script: Path, serial: str, root: Path, python: Path | None = None) -> dict:
    """The rendered script run as MAAS runs a commissioning script, on a KubeVirt VM whose SMBIOS
    serial is `serial`, by `python` (default this one); what it wrote to BMC_CONFIG_PATH."""
    root.mkdir(parents=True, exist_ok=True)
    bin_dir, sysfs, out = root / "bin", root / "dmi", root / "out"
    for path in (bin_dir, out):
        path.mkdir(exist_ok=True)
    if python is not None:  # the script's `#!/usr/bin/env python3`
        (bin_dir / "python3").unlink(missing_ok=True)
        (bin_dir / "python3").symlink_to(python)
    install_dmidecode(bin_dir, "KubeVirt", serial)
    make_sysfs(sysfs, "KubeVirt", serial)
    config = root / "bmc-config.yaml"
    env = {"PATH": f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}/usr/bin:/bin",
           DMI_ENV: str(sysfs), "LC_ALL": "C.UTF-8", "BMC_CONFIG_PATH": str(config),
           "RESULT_PATH": str(out / f"{SCRIPT_NAME}.yaml")}
    done = subprocess.run([str(script)], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return yaml.safe_load(config.read_text(encoding="utf-8"))


def commissioning_python(real_maas) -> Path:
    """The Python of the Ubuntu release this MAAS commissions with (3.10 on 3.5's jammy, 3.12 on
    3.6's and 3.7's noble): the one tools/build-maas made the region's virtualenv from, without
    the virtualenv's libraries (the script needs the standard library alone)."""
    lines = (real_maas.cache / "venv" / "pyvenv.cfg").read_text(encoding="utf-8").splitlines()
    config = {name.strip(): value.strip() for name, _, value in (line.partition("=") for line in lines)}
    return Path(config["home"]) / ("python" + ".".join(config["version"].split(".")[:2]))


def enlist_script_output(real_maas, site, vm: str, namespace: str, root: Path):
    """As maas_run_remote_scripts.py's bmc_config() then enlist(): power_type popped from what
    the script wrote, the rest sent as the power parameters."""
    written = run_script(site["script"], f"{vm}.{namespace}", root, commissioning_python(real_maas))
    power_type = written.pop("power_type")
    return written, real_maas.enlist(written, new_mac(), power_type=power_type)


def commissions(real_maas, system_id: str) -> int:
    """How many commissions MAAS started for a machine, from its event log."""
    return sum(1 for event in real_maas.events(system_id) if event["type"] == COMMISSION_EVENT)


def reconciler(real_maas, site, audit: Audit | None = None, **maas: object) -> Reconciler:
    values = load_values(site["values"])
    values["maas"].update(maas)
    client = client_from_values(values, lambda message: None)
    return Reconciler(client, Settings.from_values(values), audit or RecordingAudit(),
                      threading.Event(), passwords=Passwords(site["seed"]))


# --- (a) the script's own output, enlisted -----------------------------------------------------


@pytest.mark.on_master
def test_script_output_enlists_with_its_redfish_bmc(real_maas, site, tmp_path):
    written, enlisted = enlist_script_output(real_maas, site, "web1", "enlist-a", tmp_path)
    assert enlisted.status == 200, (
        f"MAAS refused what the script wrote ({written['power_address']!r}): "
        f"{enlisted.status} {enlisted.body[:200]}")
    assert enlisted.signal_status == 200
    machine = real_maas.machine(enlisted.system_id)
    assert machine["power_type"] == "redfish"
    assert machine["status_name"] == "New"  # the OK signal ends enlistment's commissioning
    stored = real_maas.power_parameters(enlisted.system_id)
    assert stored["power_address"] == f"web1.enlist-a.{DOMAIN}" == written["power_address"]
    assert stored["power_user"] == written["power_user"]
    assert stored["power_pass"] == identity.PLACEHOLDER_PASSWORD


# --- (b) MAAS's own behaviour with addresses, both ways ----------------------------------------


def test_a_bare_host_is_stored(real_maas):
    address = f"web2.enlist-b.{DOMAIN}"
    enlisted = real_maas.enlist({"power_address": address, "power_user": "maas",
                                 "power_pass": identity.PLACEHOLDER_PASSWORD, "node_id": "1"}, new_mac())
    assert enlisted.status == 200, enlisted.body
    assert real_maas.machine(enlisted.system_id)["power_type"] == "redfish"
    assert real_maas.power_parameters(enlisted.system_id)["power_address"] == address


def test_a_url_address_gets_500_and_enlistment_retries_without_power(real_maas):
    """MAAS 3.6.5's own behaviour, recorded: Redfish's IP extractor hands the whole URL to
    netaddr.IPAddress, which raises a ValueError MAAS does not catch. maas_run_remote_scripts
    then enlists again without the BMC config: the machine has no power type."""
    mac = new_mac()
    enlisted = real_maas.enlist({"power_address": f"https://web3.enlist-b.{DOMAIN}", "power_user": "maas",
                                 "power_pass": identity.PLACEHOLDER_PASSWORD, "node_id": "1"}, mac)
    assert enlisted.status == 500
    assert "IPAddress() does not support netmasks or subnet prefixes" in enlisted.body
    again = real_maas.enlist(None, mac, power_type="")
    assert again.status == 200, again.body
    assert real_maas.machine(again.system_id)["power_type"] == ""


@pytest.mark.parametrize("address", [f"k7.vms.{DOMAIN}:31234", f"\u212a7.vms.{DOMAIN}"],
                         ids=["port", "kelvin-sign"])
def test_look_alike_addresses_are_stored(real_maas, address):
    enlisted = real_maas.enlist({"power_address": address, "power_user": "maas",
                                 "power_pass": identity.PLACEHOLDER_PASSWORD, "node_id": "1"}, new_mac())
    assert enlisted.status == 200, enlisted.body
    assert real_maas.power_parameters(enlisted.system_id)["power_address"] == address


# --- (c) upload-script, (d) doctor -----------------------------------------------------------


def test_upload_script_reads_back_identical(real_maas, site):
    uploaded = run_cli(real_maas, site["values"], "upload-script", "--script", str(site["script"]))
    assert uploaded.returncode == 0, uploaded.stdout + uploaded.stderr
    stored = real_maas.api("GET", f"scripts/{SCRIPT_NAME}", {"op": "download"})
    assert stored.status_code == 200, stored.text
    assert stored.content == site["script"].read_bytes()
    tags = real_maas.api("GET", f"scripts/{SCRIPT_NAME}").json()["tags"]
    assert {"bmc-config", "enlisting"} <= set(tags)
    # A second upload, as the region host makes it (no --script: rendered from its values), is an
    # update of the same text, and still verified.
    again = run_cli(real_maas, site["values"], "upload-script")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "updated" in again.stderr
    assert real_maas.api("GET", f"scripts/{SCRIPT_NAME}", {"op": "download"}).content == site["script"].read_bytes()


@pytest.mark.on_master
def test_doctor_maas_checks_pass_on_real_maas(real_maas, site):
    """doctor's MAAS checks, against this MAAS with the script uploaded and the reconciler run
    once. The one that may fail is the look-alike check, and then it names exactly the
    machines enlisted here with a look-alike address (test_look_alike_addresses_are_stored)."""
    uploaded = run_cli(real_maas, site["values"], "upload-script", "--script", str(site["script"]))
    assert uploaded.returncode == 0, uploaded.stdout + uploaded.stderr
    reconciled = run_cli(real_maas, site["values"], "reconcile", "--once")
    assert reconciled.returncode in (0, 1), reconciled.stdout + reconciled.stderr
    done = run_cli(real_maas, site["values"], "doctor", "--json", key_in_env=True)
    checks = json.loads(done.stdout)
    checks = checks["checks"] if isinstance(checks, dict) else checks
    maas_checks = {check["check"]: check for check in checks if check["check"].startswith("maas.")}
    assert {"maas.version", "maas.admin", "maas.script", "maas.enlist_commissioning"} <= set(maas_checks), sorted(maas_checks)
    assert maas_checks["maas.script"]["status"] == "ok", maas_checks["maas.script"]
    look_alikes = set()
    for machine in real_maas.machines():
        if machine["power_type"] == "redfish":
            address = real_maas.power_parameters(machine["system_id"]).get("power_address", "")
            if ":" in address or not address.isascii():
                look_alikes.add(machine["system_id"])
    failing = {name: check for name, check in maas_checks.items() if check["status"] == "fail"}
    if look_alikes:
        assert set(failing.pop("maas.suspects", {}).get("subjects", ())) == look_alikes
    assert not failing, json.dumps(failing, indent=1)


# --- the reconciler --------------------------------------------------------------------------


@pytest.mark.on_master
def test_reconcile_once_converges_a_vm_enlisted_with_the_scripts_output(real_maas, site, tmp_path):
    real_maas.set_stub(True)
    _, enlisted = enlist_script_output(real_maas, site, "web1", "tenant-a", tmp_path)
    assert enlisted.status == 200, f"enlistment of the script's output failed: {enlisted.status} {enlisted.body[:200]}"
    done = run_cli(real_maas, site["values"], "reconcile", "--once")
    assert done.returncode == 0, done.stdout + done.stderr
    machine = real_maas.machine(enlisted.system_id)
    assert machine["hostname"] == "web1-tenant-a"
    assert machine["pool"]["name"] == "tenant-a"
    assert real_maas.power_parameters(enlisted.system_id)["power_pass"] == identity.bmc_password(SEED, "web1.tenant-a")
    assert machine["status_name"] == "Commissioning"
    assert commissions(real_maas, enlisted.system_id) == 1
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert {record["action"] for record in records if record["system_id"] == enlisted.system_id} >= {
        "set-password", "rename", "commission"}


def test_status_lists_the_vm(real_maas, site, tmp_path):
    real_maas.set_stub(True)
    enlisted = real_maas.enlist({"power_address": f"db1.tenant-s.{DOMAIN}", "power_user": "maas",
                                 "power_pass": identity.PLACEHOLDER_PASSWORD, "node_id": "1"}, new_mac())
    assert enlisted.status == 200, enlisted.body
    assert run_cli(real_maas, site["values"], "reconcile", "--once").returncode == 0
    done = run_cli(real_maas, site["values"], "status")
    assert done.returncode == 0, done.stderr
    row = [line for line in done.stdout.splitlines() if enlisted.system_id in line]
    assert len(row) == 1, done.stdout
    for text in ("db1", "tenant-s", "db1-tenant-s", "Commissioning"):
        assert text in row[0], row[0]


def test_machines_an_administrator_adds_are_left_alone(real_maas, site):
    bare = real_maas.admin_add_machine(new_mac(), hostname="rack-box-0")
    manual = real_maas.admin_add_machine(new_mac(), power_type="manual", hostname="rack-box-1")
    ipmi = real_maas.admin_add_machine(new_mac(), power_type="ipmi", hostname="rack-box-2", power_parameters={
        "power_address": "10.0.0.5", "power_user": "admin", "power_pass": "secret-ipmi", "power_driver": "LAN_2_0"})
    before = {sid: (real_maas.machine(sid), real_maas.power_parameters(sid))
              for sid in (bare["system_id"], manual["system_id"], ipmi["system_id"])}
    assert before[bare["system_id"]][0]["power_type"] == ""
    done = run_cli(real_maas, site["values"], "reconcile", "--once")
    assert done.returncode == 0, done.stdout + done.stderr
    for sid, (machine, power) in before.items():
        now = real_maas.machine(sid)
        assert (now["hostname"], now["pool"]["name"], now["status_name"]) == (
            machine["hostname"], machine["pool"]["name"], machine["status_name"])
        assert real_maas.power_parameters(sid) == power
        assert commissions(real_maas, sid) == 0
        assert sid not in done.stdout


def test_idle_cycles_cost_at_most_two_requests_and_a_late_machine_is_seen_within_one(real_maas, site):
    real_maas.set_stub(True)
    first = real_maas.enlist({"power_address": f"idle1.tenant-i.{DOMAIN}", "power_user": "maas",
                              "power_pass": identity.PLACEHOLDER_PASSWORD, "node_id": "1"}, new_mac())
    assert first.status == 200, first.body
    loop = reconciler(real_maas, site)
    for _ in range(2):
        loop.cycle()
    assert real_maas.machine(first.system_id)["hostname"] == "idle1-tenant-i"
    # Idle means nothing left to watch: a machine in Commissioning has its power parameters
    # read every cycle (a commissioning script may write the placeholder back), so every
    # machine here ends its commissioning as a machine does, with its OK signal (Ready).
    assert first.system_id in real_maas.finish_commissioning()
    for _ in range(3):  # let the events of those changes go by
        loop.cycle()
    assert real_maas.machine(first.system_id)["status_name"] == "Ready"
    sent: list[str] = []
    send = loop.client._send

    def counted(method, shown, *args, **kwargs):
        sent.append(f"{method} {shown}")
        return send(method, shown, *args, **kwargs)

    loop.client._send = counted
    costs = []
    for _ in range(3):
        before = loop.client.requests
        del sent[:]
        result = loop.cycle()
        costs.append((loop.client.requests - before, list(sent)))
        assert not [action for action in result.actions if action.changes]
    assert max(cost for cost, _ in costs) <= 2, costs

    late = real_maas.enlist({"power_address": f"late1.tenant-i.{DOMAIN}", "power_user": "maas",
                             "power_pass": identity.PLACEHOLDER_PASSWORD, "node_id": "1"}, new_mac())
    assert late.status == 200, late.body
    loop.cycle()
    machine = real_maas.machine(late.system_id)
    assert machine["hostname"] == "late1-tenant-i"
    assert machine["pool"]["name"] == "tenant-i"


def test_a_refused_commission_is_sent_once_per_backoff_step(real_maas, site):
    """With no rack (stub OFF) MAAS answers POST op=commission with 503 and no Retry-After,
    after starting commissioning and reverting the machine to New. The reconciler must send it
    once, record why and when it tries again, and wait: one interval, then twice as long."""
    real_maas.set_stub(False)
    enlisted = real_maas.enlist({"power_address": f"busy1.tenant-r.{DOMAIN}", "power_user": "maas",
                                 "power_pass": identity.PLACEHOLDER_PASSWORD, "node_id": "1"}, new_mac())
    assert enlisted.status == 200, enlisted.body
    sid = enlisted.system_id
    now = [1_000_000_000.0]
    audit = RecordingAudit()
    values = load_values(site["values"])
    client = client_from_values(values, lambda message: None)
    loop = Reconciler(client, Settings.from_values(values), audit, threading.Event(),
                      passwords=Passwords(site["seed"]), wall=lambda: now[0])
    interval = Settings.from_values(values).interval

    loop.cycle()
    assert commissions(real_maas, sid) == 1
    assert real_maas.machine(sid)["status_name"] == "New"  # MAAS reverted it
    failed = [r for r in audit.records if r["system_id"] == sid and r["action"] == "commission"]
    assert len(failed) == 1 and failed[0]["outcome"] == "failed", failed
    assert failed[0].get("retry_at"), failed[0]

    for _ in range(3):  # the status events of MAAS's own revert must not bring it back
        loop.cycle()
    assert commissions(real_maas, sid) == 1

    now[0] += interval  # first step over: one more
    loop.cycle()
    loop.cycle()
    assert commissions(real_maas, sid) == 2
    now[0] += interval  # the second step is two intervals
    loop.cycle()
    assert commissions(real_maas, sid) == 2
    now[0] += interval
    loop.cycle()
    assert commissions(real_maas, sid) == 3
    records = [r for r in audit.records if r["system_id"] == sid and r["action"] == "commission"]
    assert [r["outcome"] for r in records] == ["failed"] * 3, records
    assert all(r.get("retry_at") for r in records)


def test_a_refused_commission_is_audited_kept_across_runs_and_shown_by_status(real_maas, site, tmp_path):
    """The CLI with maas.audit_log: the refused commission's audit record names the next
    attempt's time; a second `reconcile --once` (a restart) does not send it again; `status`
    says the machine waits, and until when."""
    real_maas.set_stub(False)
    values = yaml.safe_load(site["values"].read_text())
    values["maas"]["audit_log"] = str(tmp_path / "audit.log")
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    enlisted = real_maas.enlist({"power_address": f"wait1.tenant-w.{DOMAIN}", "power_user": "maas",
                                 "power_pass": identity.PLACEHOLDER_PASSWORD, "node_id": "1"}, new_mac())
    assert enlisted.status == 200, enlisted.body
    sid = enlisted.system_id
    first = run_cli(real_maas, path, "reconcile", "--once")
    assert first.returncode == 1, first.stdout + first.stderr  # an action failed
    records = [json.loads(line) for line in (tmp_path / "audit.log").read_text().splitlines()]
    refused = [r for r in records if r["system_id"] == sid and r["action"] == "commission"]
    assert len(refused) == 1 and refused[0]["outcome"] == "failed" and refused[0].get("retry_at"), refused
    assert commissions(real_maas, sid) == 1
    second = run_cli(real_maas, path, "reconcile", "--once")
    assert second.returncode in (0, 1), second.stdout + second.stderr
    assert commissions(real_maas, sid) == 1
    shown = run_cli(real_maas, path, "status")
    assert shown.returncode == 0, shown.stderr
    row = [line for line in shown.stdout.splitlines() if sid in line]
    assert len(row) == 1, shown.stdout
    assert f"waiting until {refused[0]['retry_at']} after 1 failed attempt(s)" in row[0], row[0]
    assert "503" in row[0], row[0]  # and why: MAAS's answer


# --- where MAAS's source cannot be had -------------------------------------------------------


def test_without_maas_source_the_build_says_why_and_the_tier_skips_even_in_ci(tmp_path, monkeypatch):
    """No source and nothing cached: tools/build-maas exits 3 with one line naming the source,
    records it for the tier, and the tier skips (not fails) under CI=true, unless MAAS_SOURCE
    was set."""
    import conftest
    import realmaas

    missing = tmp_path / "no-such-maas.git"
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "MAAS_SOURCE": str(missing)}
    done = subprocess.run([str(realmaas.BUILD)], env=env, capture_output=True, text=True, timeout=300, check=False)
    if done.returncode not in (0, realmaas.NO_SOURCE):  # another prerequisite is missing first
        conftest.require(False, done.stderr.strip().splitlines()[-1])
    assert done.returncode == realmaas.NO_SOURCE, done.stderr
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith(f"build-maas: error: cannot get MAAS {realmaas.maas_version()}'s source from {missing}")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("REAL_MAAS", "")  # as make test passes it when the build failed
    monkeypatch.setattr(conftest, "IN_CI", True)
    monkeypatch.delenv("MAAS_SOURCE", raising=False)
    with pytest.raises(pytest.skip.Exception, match="cannot get MAAS"):
        realmaas.cache_dir()
    # A source named (as .ci/run names the bundle beside the clone) and not built: a failure.
    monkeypatch.setenv("MAAS_SOURCE", str(missing))
    with pytest.raises(pytest.fail.Exception, match="cannot get MAAS"):
        realmaas.cache_dir()


def test_a_directory_of_bundles_without_the_release_is_no_source(tmp_path):
    """MAAS_SOURCE may be a directory of maas-<version>.bundle files (as .ci/run passes the
    bundles beside the clone): one that lacks the release asked for is "no source" (exit 3),
    named in one line, and recorded for the tier."""
    import conftest
    import realmaas

    bundles = tmp_path / "upstream"
    bundles.mkdir()
    (bundles / "maas-9.8.7.bundle").write_bytes(b"")
    release = realmaas.maas_version()
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "MAAS_SOURCE": str(bundles)}
    done = subprocess.run([str(realmaas.BUILD), release], env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    if done.returncode not in (0, realmaas.NO_SOURCE):  # another prerequisite is missing first
        conftest.require(False, done.stderr.strip().splitlines()[-1])
    assert done.returncode == realmaas.NO_SOURCE, done.stderr
    [line] = done.stderr.strip().splitlines()[-1:]
    assert line == (f"build-maas: error: cannot get MAAS {release}'s source from {bundles} (it holds no "
                    f"maas-{release}.bundle); set MAAS_SOURCE to a copy of https://github.com/canonical/maas.git")
    failed = tmp_path / "cache" / "maas-kubevirt" / f"maas-{release}.failed"
    assert failed.read_text().startswith(f"{realmaas.NO_SOURCE}\tcannot get MAAS {release}'s source")


def test_a_release_of_a_series_with_no_recipe_is_refused_in_one_line(tmp_path):
    """Each release series has its recipe (its libraries and its Python); a release of another
    series is refused before anything is taken, naming the series that have one."""
    import realmaas

    recipes = sorted(path.name.removeprefix("requirements-").removesuffix(".txt")
                     for path in (ROOT / "tools" / "maas-region").glob("requirements-*.txt"))
    assert realmaas.maas_version().rsplit(".", 1)[0] in recipes
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "MAAS_SOURCE": str(tmp_path / "none")}
    done = subprocess.run([str(realmaas.BUILD), "1.9.0"], env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [
        "build-maas: error: no recipe for MAAS 1.9 (tools/maas-region/requirements-1.9.txt); there are recipes "
        f"for {' '.join(recipes)}"]
    for argv in (["x;y"], ["3.6.5", "3.7.3"]):
        done = subprocess.run([str(realmaas.BUILD), *argv], env=env, capture_output=True, text=True, timeout=60,
                              check=False)
        assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert not (tmp_path / "cache" / "maas-kubevirt" / "maas-x;y").exists()


def test_the_fixture_runs_every_proven_release_and_any_other_named(tmp_path, monkeypatch):
    """real_maas is parametrized over maas-proven (upstream.lock.yaml), plus a release being tried
    that REAL_MAAS names; a proven release REAL_MAAS leaves out skips (fails under CI=true) with
    the reason its build recorded."""
    import conftest
    import realmaas

    lock = (ROOT / "upstream.lock.yaml").read_text()
    proven = next(line for line in lock.splitlines() if line.startswith("maas-proven:")).split(":")[1].split()
    assert realmaas.maas_version() in proven
    built = tmp_path / "maas-kubevirt" / f"maas-{proven[-1]}"
    tried = tmp_path / "maas-kubevirt" / "maas-3.6.9"
    monkeypatch.setenv("REAL_MAAS", f"{built} {tried}")
    assert realmaas.releases() == [*proven, "3.6.9"]
    built.mkdir(parents=True)
    (built / ".built").write_text("key\n")
    assert realmaas.cache_dir(proven[-1]) == built
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("MAAS_SOURCE", raising=False)
    monkeypatch.setattr(conftest, "IN_CI", True)
    (tmp_path / "maas-kubevirt" / f"maas-{proven[0]}.failed").write_text("1\tpip install of MAAS's libraries failed\n")
    with pytest.raises(pytest.fail.Exception, match="pip install of MAAS's libraries failed"):
        realmaas.cache_dir(proven[0])
    with pytest.raises(pytest.fail.Exception, match=f"REAL_MAAS names no maas-{proven[1]} directory"):
        realmaas.cache_dir(proven[1])
    with pytest.raises(pytest.fail.Exception, match="not a built MAAS region"):
        realmaas.cache_dir("3.6.9")


# --- (b) an impostor on the PXE network never shares a VM's BMC row (issue 21) -----------------


def every_holder(real_maas, password: str) -> set[str]:
    """The machines whose stored power_pass is this one: op=power_parameters of every machine."""
    answer = real_maas.api("GET", "machines/", {"op": "power_parameters"})
    assert answer.status_code == 200, (answer.status_code, answer.text)
    return {sid for sid, params in answer.json().items() if params.get("power_pass") == password}


# What an attacker on the PXE network can know of a VM's BMC row besides its public address:
# the old fixed user, the placeholder, whatever the script writes when the attacker runs it for
# the same serial (random each run), and the derived user of a VM of the attacker's own.
IMPOSTOR_USERS = ("maas", "placeholder", "script", "another-vm")
# The CI budget (docs/development.md): on the other releases of the matrix each attack runs in one
# state, and with two of those users (MAAS's own name and another VM's); every variant runs on the
# pinned release.
PINNED_ONLY = pytest.mark.pinned_maas
ON_MASTER = pytest.mark.on_master
IN_EVERY_STATE = ["New", pytest.param("Commissioning", marks=PINNED_ONLY)]
EVERY_RELEASE_USERS = ("maas", "another-vm")


@pytest.mark.parametrize("password_set", [False, True], ids=["before-password", "after-password"])
@pytest.mark.parametrize("user", [user if user in EVERY_RELEASE_USERS else pytest.param(user, marks=PINNED_ONLY)
                                  for user in IMPOSTOR_USERS])
@ON_MASTER
def test_an_impostor_never_shares_the_vms_bmc_row(real_maas, site, tmp_path, user, password_set):
    """An anonymous enlistment with the VM's address and any user it can know, then its own
    metadata signal re-pointing its address: the VM's row and address never move, no machine but
    the VM ever holds the derived password, and the duplicate claim is reported."""
    real_maas.set_stub(True)
    namespace = f"rows-{IMPOSTOR_USERS.index(user)}{'p' if password_set else 'n'}"
    host, serial = f"web1.{namespace}.{DOMAIN}", f"web1.{namespace}"
    derived = identity.bmc_password(SEED, serial)
    written, vm = enlist_script_output(real_maas, site, "web1", namespace, tmp_path / "vm")
    assert vm.status == 200, vm.body
    assert written["power_user"].startswith(identity.ENLIST_USER_PREFIX)
    row = real_maas.bmc_row(vm.system_id)
    audit = RecordingAudit()
    loop = reconciler(real_maas, site, audit, commission="never")
    if password_set:
        loop.cycle()
        assert every_holder(real_maas, derived) == {vm.system_id}
        assert real_maas.power_parameters(vm.system_id)["power_user"] == identity.bmc_user(SEED, serial)

    impostor_user = {
        "maas": "maas",
        "placeholder": identity.PLACEHOLDER_PASSWORD,
        "script": run_script(site["script"], serial, tmp_path / "attacker")["power_user"],
        "another-vm": identity.bmc_user(SEED, f"mine.{namespace}"),
    }[user]
    impostor = real_maas.enlist({"power_address": host, "power_user": impostor_user,
                                 "power_pass": "the-attackers-own", "node_id": "1"}, new_mac(), finish=False)
    assert impostor.status == 200, impostor.body

    def vm_stands() -> None:
        assert real_maas.bmc_row(vm.system_id) == row
        assert real_maas.bmc_row(impostor.system_id) != row
        assert real_maas.power_parameters(vm.system_id)["power_address"] == host
        assert every_holder(real_maas, derived) <= {vm.system_id}

    vm_stands()
    loop.cycle()
    vm_stands()
    claims = [r for r in audit.records if r["action"] == "duplicate-claim"]
    assert claims and {vm.system_id, impostor.system_id} <= set(claims[-1]["after"].split(",")), audit.records

    # The impostor's own token moves its address: on its own row, the VM stays where it is.
    moved = real_maas.signal(impostor.system_id, "WORKING", power_type="redfish", power_parameters=json.dumps(
        {"power_address": "harvest.attacker.example", "power_user": impostor_user}))
    assert moved.status_code == 200, moved.text
    assert real_maas.power_parameters(impostor.system_id)["power_address"] == "harvest.attacker.example"
    vm_stands()
    loop.cycle()   # no longer disputed: the VM alone gets its password (back)
    vm_stands()
    assert every_holder(real_maas, derived) == {vm.system_id}
    assert real_maas.power_parameters(vm.system_id)["power_user"] == identity.bmc_user(SEED, serial)


def test_a_restarted_reconciler_takes_back_a_password_whose_address_moved_while_it_was_down(
        real_maas, site, tmp_path):
    """The identity each derived password was set for comes back from the audit log, as the
    service restores it (loop.py), so a password left beside a moved address is still reset."""
    real_maas.set_stub(True)
    serial = "web1.restart-a"
    _, vm = enlist_script_output(real_maas, site, "web1", "restart-a", tmp_path)
    assert vm.status == 200, vm.body
    log = tmp_path / "audit.log"
    first = reconciler(real_maas, site, Audit(str(log)), commission="never")
    first.cycle()
    derived = identity.bmc_password(SEED, serial)
    assert every_holder(real_maas, derived) == {vm.system_id}
    # Down; meanwhile the address is moved with no event (a PUT; a MAC enlistment or the
    # machine's own metadata token, in Commissioning or Deployed, do the same).
    moved = real_maas.api("PUT", f"machines/{vm.system_id}/",
                          {"power_parameters_power_address": "harvest.attacker.example"})
    assert moved.status_code == 200, moved.text
    assert real_maas.power_parameters(vm.system_id)["power_address"] == "harvest.attacker.example"
    assert real_maas.power_parameters(vm.system_id)["power_pass"] == derived
    audit = RecordingAudit()
    second = reconciler(real_maas, site, audit, commission="never")
    second.restore(Audit.read_file(str(log)))
    second.cycle()
    assert every_holder(real_maas, derived) == set()
    assert real_maas.power_parameters(vm.system_id)["power_pass"] == identity.PLACEHOLDER_PASSWORD
    assert [(r["action"], r["outcome"]) for r in audit.records if r["system_id"] == vm.system_id] == [
        ("reset-password", "ok")]


# --- a rack that behaves like one (issue 22 item 2) --------------------------------------------
# The rack stand-in (realmaas.py, THE ONE STUB): MAAS's own Redfish driver, run as the rack's
# power workflow runs it, against kubevirtBMC's Redfish on loopback, VMs ready start_time after On.


@pytest.fixture
def rack(real_maas):
    """set_rack(start_time) with this file's seed; the power mode before the test comes back after."""
    bmc = real_maas.bmc
    before, start_time, seed = real_maas.power_mode, bmc.start_time, bmc.seed
    yield lambda start_time: real_maas.set_rack(start_time, SEED)
    if before == "rack":
        real_maas.set_rack(start_time, seed)
    else:
        real_maas.set_stub(before == "on")


def commission_requests(proxy, system_id: str) -> list:
    """The POST op=commission requests for a machine that went through the timing proxy."""
    return [timed for timed in proxy.timed if timed.method == "POST" and f"machines/{system_id}/" in timed.path
            and ("op=commission" in timed.path or b"commission" in timed.body)]


def settle_the_others(real_maas, site) -> None:
    """The reconciler acts on every machine of the shared region: the ones earlier tests left in New
    are commissioned first with the instant hand-off, so that a start time is spent on this test's
    VM alone (enlisted after this)."""
    mode, start_time, seed = real_maas.power_mode, real_maas.bmc.start_time, real_maas.bmc.seed
    real_maas.set_stub(True)
    reconciler(real_maas, site).cycle()
    if mode == "rack":
        real_maas.set_rack(start_time, seed)
    else:
        real_maas.set_stub(mode == "on")


def reconcile_until_commissioned(loop, audit, system_id: str, cycles: int = 3) -> list[dict]:
    """Cycles until the machine's commission is audited (its PUT comes first); its records."""
    for _ in range(cycles):
        loop.cycle()
        if any(r["action"] == "commission" for r in audit.records if r["system_id"] == system_id):
            break
    return [r for r in audit.records if r["system_id"] == system_id and r["action"] == "commission"]


def test_a_commission_lasts_as_long_as_the_vm_takes_to_start(real_maas, site, tmp_path, rack):
    """As on a real region: POST op=commission returns when the rack's power-on has finished (its
    post-commit hook), and that is when the VM is ready; the BMC saw MAAS's own power-on."""
    import realmaas

    assert DOMAIN == realmaas.BMC_DOMAIN
    start_time = 5.0
    settle_the_others(real_maas, site)
    rack(start_time)
    _, enlisted = enlist_script_output(real_maas, site, "web1", "rack-a", tmp_path)
    assert enlisted.status == 200, enlisted.body
    sid, host = enlisted.system_id, f"web1.rack-a.{DOMAIN}"
    audit = RecordingAudit()
    with realmaas.TimingProxy(real_maas) as proxy:
        records = reconcile_until_commissioned(reconciler(real_maas, site, audit, url=proxy.url), audit, sid)
    assert [r["outcome"] for r in records] == ["ok"], records
    [commission] = commission_requests(proxy, sid)
    assert commission.status == 200
    print(f"commission request with a {start_time:.0f} s start: {commission.seconds:.2f} s")
    assert start_time <= commission.seconds < start_time + 15, commission.seconds
    machine = real_maas.machine(sid)
    assert machine["status_name"] == "Commissioning"
    assert machine["power_state"] == "on"  # MAAS's own handling of the workflow's result

    seen = real_maas.bmc.seen(host)
    actions = [request.action for request in seen]
    assert all(request.status < 300 for request in seen), actions
    # RedfishPowerDriver.power_on: a query (Off: no ForceOff), the ETag read, the PXE boot, On,
    # then queries until On (power() then perform_power's check and maas.power's own query).
    assert [action for action in actions if not action.startswith("GET")] == ["PATCH Boot Once Pxe", "Reset On"]
    assert actions.index("PATCH Boot Once Pxe") >= 2, actions
    after_on = seen[actions.index("Reset On"):]
    first_on = next(request for request in after_on if request.action == "GET On")
    assert first_on.at - after_on[0].at >= start_time - 0.1  # ready start_time after On
    vm = real_maas.bmc.vm(host)
    assert vm.running and vm.boot == ("Continuous", "Pxe")  # kubevirtBMC keeps no "Once"
    # No TLS server name: MAAS's WebClientContextFactory (drivers/power/utils.py) replaces the info
    # callback in which Twisted's ClientTLSOptions sends it, so the Ingress routes on Host alone.
    assert set(real_maas.bmc.server_names) == {None}


def redfish_waits_on_a_refused_request(version: str) -> tuple[float, ...]:
    """The waits, in seconds, before MAAS's Redfish driver sends again a request its BMC refused
    with 401 (src/provisioningserver/drivers/power/redfish.py, redfish_request): none from 3.6, where
    a 401 or 403 raises PowerAuthError, a PowerFatalError that nothing retries. MAAS 3.5 retries
    every failure MAX_REQUEST_RETRIES (5) times, and then PowerDriver.perform_power tries the whole
    action again after each wait of its DEFAULT_WAITING_POLICY (7 tries): about 235 s per attempt of
    the power workflow, so 3 attempts answer a commission after about 12 minutes."""
    if tuple(int(part) for part in version.split(".")[:2]) < (3, 6):
        return (0.5, 1.5, 3.5, 7.5, 15.5)
    return ()


def test_the_placeholder_password_fails_maas_own_power_on_and_the_machine_goes_back_to_new(
        real_maas, site, tmp_path, rack):
    """A VM enlisted with the script's output keeps the placeholder until the reconciler sets its
    password: MAAS's own Redfish power-on then gets 401 from the BMC at every attempt, and MAAS
    reverts the commissioning machine to New, with its own events. On 3.5, whose driver retries a
    401 for about 12 minutes before MAAS answers, longer than the tier waits: MAAS holds the machine
    in Commissioning while its driver sends the refused request again, at its backoff."""
    import time

    import requests

    import realmaas

    rack(2.0)
    _, enlisted = enlist_script_output(real_maas, site, "web1", "rack-p", tmp_path)
    assert enlisted.status == 200, enlisted.body
    sid, host = enlisted.system_id, f"web1.rack-p.{DOMAIN}"
    assert real_maas.power_parameters(sid)["power_pass"] == identity.PLACEHOLDER_PASSWORD
    waits = redfish_waits_on_a_refused_request(real_maas.version)
    if waits:
        started = time.monotonic()
        with pytest.raises(requests.ReadTimeout):
            requests.post(f"{real_maas.api_url}machines/{sid}/", data={"op": "commission"}, timeout=sum(waits) + 5,
                          headers={"Authorization": realmaas.oauth_header(real_maas.api_key)})
        seen = real_maas.bmc.seen(host)
        shown = [(request.action, request.status, round(request.at - seen[0].at, 1)) for request in seen]
        assert len(seen) > len(waits) and {(r.method, r.status) for r in seen} == {("GET", 401)}, shown
        # Sent again until the driver's last wait, its waits added up after the first (a power query
        # MAAS starts on the status change retries alike beside it, so the two interleave).
        assert seen[-1].at - seen[0].at >= sum(waits) - 0.1, shown
        assert real_maas.machine(sid)["status_name"] == "Commissioning"
        print(f"MAAS {real_maas.version}: {len(seen)} refused requests in {time.monotonic() - started:.1f} s, "
              "the commission still unanswered")
        events = real_maas.events(sid)
        assert COMMISSION_EVENT in [event["type"] for event in events]
        assert not any(identity.PLACEHOLDER_PASSWORD in json.dumps(event) for event in events)
        return
    answer = real_maas.api("POST", f"machines/{sid}/", {"op": "commission"})
    # The hook's PowerActionFail reaches MAAS's request handler, which no middleware maps: 500.
    assert answer.status_code == 500, (answer.status_code, answer.text)
    assert identity.PLACEHOLDER_PASSWORD not in answer.text
    assert real_maas.machine(sid)["status_name"] == "New"
    seen = real_maas.bmc.seen(host)
    assert len(seen) >= 3 and {(request.method, request.status) for request in seen} == {("GET", 401)}, [
        (request.action, request.status) for request in seen]  # each of the workflow's 3 attempts
    events = real_maas.events(sid)
    types = [event["type"] for event in events]
    assert COMMISSION_EVENT in types, types
    failed = [event for event in events if event["type"] == "Failed to query node's BMC"]
    assert failed, types
    # Node._start_bmc_unavailable's event, not _get_bmc_client_connection_info's "no rack" one.
    assert any("Aborting COMMISSIONING and reverting to NEW" in event["description"]
               and "Please check power credentials" in event["description"] for event in failed), failed
    assert not any("No rack controllers" in event["description"] for event in failed), failed
    assert "Node changed status" in types
    assert not any(identity.PLACEHOLDER_PASSWORD in json.dumps(event) for event in events)


def test_a_vm_slower_than_maas_timeout_is_commissioned_not_failed(real_maas, site, tmp_path, rack):
    """maas.timeout 5 s and a VM that takes 12 s to start: the commission request lasts the
    power-on, longer than maas.timeout, and is audited ok (maas.commission_timeout covers it)."""
    import inspect

    import realmaas
    from maas_kubevirt.maas import MAASClient

    if "commission_timeout" not in inspect.signature(MAASClient).parameters:
        pytest.skip("MAASClient takes no commission_timeout yet (issue 22 item 3 wires maas.commission_timeout)")
    start_time, timeout = 12.0, 5
    settle_the_others(real_maas, site)
    rack(start_time)
    _, enlisted = enlist_script_output(real_maas, site, "web1", "rack-s", tmp_path)
    assert enlisted.status == 200, enlisted.body
    sid = enlisted.system_id
    audit = RecordingAudit()
    with realmaas.TimingProxy(real_maas) as proxy:
        loop = reconciler(real_maas, site, audit, url=proxy.url, timeout=timeout, commission_timeout=60)
        records = reconcile_until_commissioned(loop, audit, sid)
    assert [r["outcome"] for r in records] == ["ok"], records
    assert not records[0].get("retry_at"), records
    [commission] = commission_requests(proxy, sid)
    print(f"commission request with a {start_time:.0f} s start and maas.timeout {timeout}: {commission.seconds:.2f} s")
    assert commission.seconds >= start_time > timeout
    assert real_maas.machine(sid)["status_name"] == "Commissioning"


# --- (c) MAC enlistment re-points the VM's own machine (issue 25) ------------------------------


def enlist_by_mac(real_maas, site, tmp_path, namespace: str, status: str):
    """VM web1 of namespace enlisted with the script's output and a MAC of its own, left in
    status (New, or Commissioning with its scripts still running): (serial, MAC, Enlisted)."""
    real_maas.set_stub(True)
    serial = f"web1.{namespace}"
    written = run_script(site["script"], serial, tmp_path / "vm")
    power_type = written.pop("power_type")
    mac = new_mac()
    vm = real_maas.enlist(written, mac, power_type=power_type, finish=status == "New")
    assert vm.status == 200, vm.body
    assert real_maas.machine(vm.system_id)["status_name"] == status
    return serial, mac, vm


# The running service's line per cycle on stderr (loop.cycle_line), which the cases count.
CYCLE_LINE = re.compile(r"^maas-kubevirt: cycle \d+: ", re.MULTILINE)
# A service that completes no cycle for this long has hung (a cycle is bounded by maas.timeout's
# 60 s per request): the bound on liveness, not on how fast a cycle is.
LIVENESS = 150.0


@contextlib.contextmanager
def running_reconciler(site, tmp_path: Path, interval: float):
    """`maas-kubevirt reconcile --interval N` as the service runs it (commission never, an audit log
    in tmp_path, its output in tmp_path/out and err), stopped on exit. Yields within(condition,
    what, cycles): (seconds, cycles) until condition() holds, failing when `cycles` cycles of the
    service complete first. The bound is in cycles, as the property is ("taken back within one
    cycle"), so that a loaded machine's slower cycles do not fail it, and a cycle that misses
    the change does, however fast; time bounds only the service's liveness."""
    import time

    values = yaml.safe_load(site["values"].read_text())
    values["maas"].update(commission="never", audit_log=str(tmp_path / "audit.log"))
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    with open(tmp_path / "out", "w") as out, open(tmp_path / "err", "w") as err:
        service = subprocess.Popen([str(CLI), "--values", str(values_file), "reconcile", "--interval", str(interval)],
                                   stdout=out, stderr=err)

        def completed() -> int:
            return len(CYCLE_LINE.findall((tmp_path / "err").read_text()))

        def diagnosis() -> str:
            """What the service did meanwhile: its output's end and its audit records' outcomes."""
            audit = tmp_path / "audit.log"
            records = Audit.read_file(str(audit)) if audit.exists() else []
            shown = [(r.get("time"), r.get("action"), r.get("system_id"), r.get("outcome"), r.get("error"))
                     for r in records[-15:]]
            ends = {name: (tmp_path / name).read_text().splitlines()[-15:] for name in ("out", "err")}
            return f"audit: {shown}\nout: {ends['out']}\nerr: {ends['err']}"

        def within(condition, what: str, cycles: int) -> tuple[float, int]:
            start = progress = time.monotonic()
            base = seen = completed()
            while True:
                done = completed()   # counted before the condition is read: those cycles had ended
                if condition():
                    return time.monotonic() - start, done - base
                assert done - base < cycles, f"{what}: not within {cycles} cycle(s)\n{diagnosis()}"
                if done > seen:
                    seen, progress = done, time.monotonic()
                assert time.monotonic() - progress < LIVENESS, (
                    f"{what}: the service completed no cycle in {LIVENESS:.0f} s\n{diagnosis()}")
                assert service.poll() is None, (service.returncode, (tmp_path / "err").read_text())
                time.sleep(0.2)

        try:
            yield within
        finally:
            service.terminate()
            service.wait(timeout=60)


@ON_MASTER
@pytest.mark.parametrize("with_password", [False, True], ids=["no-password", "own-password"])
@pytest.mark.parametrize("status", IN_EVERY_STATE)
def test_a_mac_re_point_holds_no_derived_password_after_one_cycle(real_maas, site, tmp_path, status,
                                                                  with_password):
    """An anonymous POST machines/ with the VM's MAC and a harvesting address updates the VM's own
    machine (AnonMachinesHandler.create, no event); the next cycle of a running reconciler, and a
    restarted one, leave no derived password on any machine."""
    namespace = f"mac-{status[:3].lower()}{'p' if with_password else 'n'}"
    serial, mac, vm = enlist_by_mac(real_maas, site, tmp_path, namespace, status)
    log = tmp_path / "audit.log"
    loop = reconciler(real_maas, site, Audit(str(log)), commission="never")
    loop.cycle()
    derived = identity.bmc_password(SEED, serial)
    assert every_holder(real_maas, derived) == {vm.system_id}
    # An address of its own per case: MAAS refuses (409) a row equal to another's (its unique index).
    harvest = f"{namespace}.harvest.attacker.example"
    params = {"power_address": harvest, "power_user": "maas", "node_id": "1"}
    if with_password:
        params["power_pass"] = "the-attackers-own"
    answer = real_maas.api("POST", "machines/", {
        "architecture": "amd64/generic", "mac_addresses": mac, "power_type": "redfish",
        "power_parameters": json.dumps(params)}, anonymous=True)
    assert answer.status_code == 200, answer.text
    assert answer.json()["system_id"] == vm.system_id     # the VM's own machine, re-pointed
    assert real_maas.power_parameters(vm.system_id)["power_address"] == harvest
    loop.cycle()
    assert every_holder(real_maas, derived) == set()
    # The same while the reconciler was down: a fresh process, its audit log restored.
    real_maas.api("PUT", f"machines/{vm.system_id}/", {
        "power_parameters_power_address": f"web1.{namespace}.{DOMAIN}"})
    back = reconciler(real_maas, site, Audit(str(log)), commission="never")   # an edit is no event
    back.restore(Audit.read_file(str(log)))
    back.cycle()
    assert every_holder(real_maas, derived) == {vm.system_id}
    again = real_maas.api("POST", "machines/", {
        "architecture": "amd64/generic", "mac_addresses": mac, "power_type": "redfish",
        "power_parameters": json.dumps(params)}, anonymous=True)
    assert again.status_code == 200, again.text
    fresh = reconciler(real_maas, site, RecordingAudit(), commission="never")
    fresh.restore(Audit.read_file(str(log)))
    fresh.cycle()
    assert every_holder(real_maas, derived) == set()


@pytest.mark.parametrize("status", IN_EVERY_STATE)
def test_the_running_loop_takes_a_mac_re_pointed_password_back_within_one_cycle(real_maas, site, tmp_path,
                                                                                 status):
    """`reconcile --interval 2` as the service runs it: after a MAC re-point without a password,
    MAAS holds the derived password nowhere once the next whole cycle has run."""
    namespace = f"loop-{status[:3].lower()}"
    serial, mac, vm = enlist_by_mac(real_maas, site, tmp_path, namespace, status)
    interval = 2
    derived = identity.bmc_password(SEED, serial)
    with running_reconciler(site, tmp_path, interval) as within:
        within(lambda: every_holder(real_maas, derived) == {vm.system_id}, "the derived password set", 2)
        harvest = f"{namespace}.harvest.attacker.example"
        answer = real_maas.api("POST", "machines/", {
            "architecture": "amd64/generic", "mac_addresses": mac, "power_type": "redfish",
            "power_parameters": json.dumps({"power_address": harvest, "power_user": "maas", "node_id": "1"})},
            anonymous=True)
        assert answer.status_code == 200 and answer.json()["system_id"] == vm.system_id, answer.text
        # The cycle under way may have read the machine before the re-point; the next one may not.
        took, cycles = within(lambda: every_holder(real_maas, derived) == set(), "the password taken back", 2)
    print(f"MAC re-point in {status}: derived password gone from MAAS after {took:.1f} s, {cycles} cycle(s) "
          f"completed meanwhile (interval {interval} s)")
    resets = [r for r in Audit.read_file(str(tmp_path / "audit.log")) if r["action"] == "reset-password"]
    assert [(r["system_id"], r["outcome"], r.get("leak")) for r in resets] == [(vm.system_id, "ok", True)]
    logged = (tmp_path / "out").read_text() + (tmp_path / "err").read_text()
    assert derived not in logged and identity.bmc_user(SEED, serial) not in logged
    assert f"rotate {serial}" in logged     # no cluster access here: the command is named


# --- (d) anonymous enlistment switches the power type (issue 29) --------------------------------




def derived_holders(real_maas, serial: str, seed: str = SEED, generation: int = 0) -> dict[str, set[str]]:
    """system_id -> the names of its power parameters holding the VM's derived user or password."""
    secrets = {identity.bmc_password(seed, serial, generation), identity.bmc_user(seed, serial, generation)}
    answer = real_maas.api("GET", "machines/", {"op": "power_parameters"})
    assert answer.status_code == 200, (answer.status_code, answer.text)
    return {sid: names for sid, params in answer.json().items()
            if (names := {name for name, value in params.items() if isinstance(value, str) and value in secrets})}


def switch_power_type(real_maas, how: str, namespace: str, mac: str, domain: str = DOMAIN) -> None:
    """One of the three switches of issue 29, as any PXE host can send it (no credentials)."""
    host = f"web1.{namespace}.{domain}"
    fields = {"architecture": "amd64/generic"}
    if how == "ipmi-own-address":      # BMC enlistment: the VM's public address alone, no MAC
        fields.update(power_type="ipmi", power_parameters=json.dumps({"power_address": host}))
    elif how == "ipmi-by-mac":
        fields.update(mac_addresses=mac, power_type="ipmi",
                      # An address of its own per case: BMC enlistment would find another case's machine.
                      power_parameters=json.dumps({"power_address": "10.66.%d.%d" % divmod(
                          int(identity.smbios_uuid("x", namespace)[:4], 16) % 60000, 250)}))
    else:
        hook = f"https://{namespace}.hooks.attacker.example/power"
        fields.update(mac_addresses=mac, power_type="webhook", power_parameters=json.dumps(
            {"power_on_uri": hook + "/on", "power_off_uri": hook + "/off", "power_query_uri": hook + "/query"}))
    answer = real_maas.api("POST", "machines/", fields, anonymous=True)
    assert answer.status_code == 200, answer.text


SWITCHES = ("ipmi-own-address", "ipmi-by-mac", "webhook-by-mac")


@ON_MASTER
@pytest.mark.parametrize("status", IN_EVERY_STATE)
@pytest.mark.parametrize("how", SWITCHES)
def test_a_power_type_switch_holds_no_derived_credential_after_one_cycle(real_maas, site, tmp_path, how, status):
    """MAAS's AnonMachinesHandler.create switches the VM's own machine and keeps power_user and
    power_pass (AdminMachineForm); the next cycle takes both back through the new type's names, and
    a restarted reconciler does the same from its audit log."""
    namespace = f"pt-{how[:4]}{how[-3:]}-{status[:3].lower()}"
    serial, mac, vm = enlist_by_mac(real_maas, site, tmp_path, namespace, status)
    log = tmp_path / "audit.log"
    loop = reconciler(real_maas, site, Audit(str(log)), commission="never")
    loop.cycle()
    assert derived_holders(real_maas, serial) == {vm.system_id: {"power_user", "power_pass"}}
    switch_power_type(real_maas, how, namespace, mac)
    switched = real_maas.machine(vm.system_id)
    assert switched["power_type"] == ("webhook" if how.startswith("webhook") else "ipmi")
    assert derived_holders(real_maas, serial) == {vm.system_id: {"power_user", "power_pass"}}   # MAAS kept them
    loop.cycle()
    assert derived_holders(real_maas, serial) == {}
    assert real_maas.machine(vm.system_id)["power_type"] == switched["power_type"]   # left as switched
    resets = [r for r in Audit.read_file(str(log)) if r["action"] == "reset-password"]
    assert [(r["system_id"], r["outcome"], r["leak"], r["power_type"]) for r in resets] == [
        (vm.system_id, "ok", True, switched["power_type"])]
    loop.cycle()
    assert derived_holders(real_maas, serial) == {}
    # The same while the reconciler was down: put the VM back, give it its password, switch again.
    real_maas.api("PUT", f"machines/{vm.system_id}/", {
        "power_type": "redfish", "power_parameters_power_address": f"web1.{namespace}.{DOMAIN}",
        "power_parameters_power_user": identity.ENLIST_USER_PREFIX + "f" * 32,
        "power_parameters_power_pass": identity.PLACEHOLDER_PASSWORD, "power_parameters_node_id": "1"})
    back = reconciler(real_maas, site, Audit(str(log)), commission="never")
    back.restore(Audit.read_file(str(log)))
    back.cycle()
    assert derived_holders(real_maas, serial) == {vm.system_id: {"power_user", "power_pass"}}
    switch_power_type(real_maas, how, namespace, mac)
    fresh = reconciler(real_maas, site, RecordingAudit(), commission="never")
    fresh.restore(Audit.read_file(str(log)))
    fresh.cycle()
    assert derived_holders(real_maas, serial) == {}


@pytest.mark.parametrize("status", IN_EVERY_STATE)
@pytest.mark.parametrize("how", SWITCHES)
def test_the_running_loop_takes_back_what_a_power_type_switch_kept_within_one_cycle(real_maas, site, tmp_path, how,
                                                                                    status):
    """`reconcile --interval 2` as the service runs it: the derived credentials are gone once the
    next whole cycle after the switch has run."""
    namespace = f"ptl-{how[:4]}{how[-3:]}-{status[:3].lower()}"
    serial, mac, vm = enlist_by_mac(real_maas, site, tmp_path, namespace, status)
    interval = 2
    with running_reconciler(site, tmp_path, interval) as within:
        within(lambda: derived_holders(real_maas, serial) == {vm.system_id: {"power_user", "power_pass"}},
               "the derived credentials set", 2)
        switch_power_type(real_maas, how, namespace, mac)
        # The cycle under way may have read the machine before the switch; the next one may not.
        took, cycles = within(lambda: derived_holders(real_maas, serial) == {}, "the credentials taken back", 2)
    print(f"power type switch {how}: derived credentials gone from MAAS after {took:.1f} s, {cycles} cycle(s) "
          f"completed meanwhile (interval {interval} s)")
    logged = (tmp_path / "out").read_text() + (tmp_path / "err").read_text()
    assert identity.bmc_password(SEED, serial) not in logged and identity.bmc_user(SEED, serial) not in logged
    assert f"rotate {serial}" in logged     # no cluster access here: the command is named


# --- a VM's machine on any name, in any pool, is still the VM's (issue 41 item 3) ---------------


def re_point_by_mac(real_maas, namespace: str, mac: str) -> None:
    """MAC enlistment with a harvesting address of the case's own and MAAS's usual user."""
    answer = real_maas.api("POST", "machines/", {
        "architecture": "amd64/generic", "mac_addresses": mac, "power_type": "redfish",
        "power_parameters": json.dumps({"power_address": f"{namespace}.harvest.attacker.example",
                                        "power_user": "maas", "node_id": "1"})}, anonymous=True)
    assert answer.status_code == 200, answer.text


TAKE_BACK_ATTACKS = ("re-point", "webhook-by-mac")


@pytest.mark.parametrize("how", [TAKE_BACK_ATTACKS[0], pytest.param(TAKE_BACK_ATTACKS[1], marks=PINNED_ONLY)])
@pytest.mark.parametrize("filed", ["fallback", pytest.param("skip", marks=PINNED_ONLY),
                                   pytest.param("outside-pool", marks=PINNED_ONLY)])
def test_a_reconciler_without_the_audit_log_takes_back_a_vms_credentials_on_any_name(real_maas, site, tmp_path,
                                                                                     filed, how):
    """web1's machine filed on its fallback name (web1-<ns> held by an administrator's machine), left
    unrenamed (maas.on_hostname_taken: skip), or left outside its pool (an administrator's pool named
    <ns>); the reconciler that set its credentials is gone with its audit log. Attacked while none
    runs, a fresh reconciler's first cycle takes them back; attacked after such a restart, its next."""
    namespace = f"tb-{filed[:4]}-{how[:4]}"
    skip = {"on_hostname_taken": "skip"} if filed == "skip" else {}
    if filed == "outside-pool":
        made = real_maas.api("POST", "resourcepools/", {"name": namespace, "description": "an administrator's"})
        assert made.status_code == 200, made.text
    else:
        real_maas.admin_add_machine(new_mac(), hostname=f"web1-{namespace}")
    serial, mac, vm = enlist_by_mac(real_maas, site, tmp_path, namespace, "New")
    first = reconciler(real_maas, site, RecordingAudit(), commission="never", **skip)
    first.cycle()
    machine = real_maas.machine(vm.system_id)
    expected = {"fallback": (identity.fallback_hostname("web1", namespace), namespace),
                "outside-pool": (f"web1-{namespace}", "default")}.get(filed)
    if expected:
        assert (machine["hostname"], machine["pool"]["name"]) == expected
    else:
        assert machine["hostname"] not in (f"web1-{namespace}", identity.fallback_hostname("web1", namespace))
    assert derived_holders(real_maas, serial) == {vm.system_id: {"power_user", "power_pass"}}

    def attack() -> None:
        if how == "re-point":
            re_point_by_mac(real_maas, namespace, mac)
        else:
            switch_power_type(real_maas, how, namespace, mac)
        assert vm.system_id in derived_holders(real_maas, serial)   # MAAS kept the password

    attack()   # while no reconciler runs
    audit = RecordingAudit()
    reconciler(real_maas, site, audit, commission="never", **skip).cycle()
    assert derived_holders(real_maas, serial) == {}
    assert [(r["system_id"], r["outcome"], r["leak"], r["identity"]) for r in audit.records
            if r["action"] == "reset-password"] == [(vm.system_id, "ok", True, serial)]

    # The VM enlists again (its script writes its redfish BMC back); a restart with an empty audit
    # log gives it its credentials, then the attack comes while that reconciler runs.
    put_back = real_maas.api("PUT", f"machines/{vm.system_id}/", {
        "power_type": "redfish", "power_parameters_power_address": f"web1.{namespace}.{DOMAIN}",
        "power_parameters_power_user": identity.ENLIST_USER_PREFIX + "e" * 32,
        "power_parameters_power_pass": identity.PLACEHOLDER_PASSWORD, "power_parameters_node_id": "1"})
    assert put_back.status_code == 200, put_back.text
    restarted = reconciler(real_maas, site, RecordingAudit(), commission="never", **skip)
    restarted.cycle()
    assert derived_holders(real_maas, serial) == {vm.system_id: {"power_user", "power_pass"}}
    fresh = reconciler(real_maas, site, RecordingAudit(), commission="never", **skip)
    fresh.cycle()     # knows the machine by its converged credentials alone
    attack()
    fresh.cycle()
    assert derived_holders(real_maas, serial) == {}


# --- a guest that powers itself off (enlistment's and commissioning's end) ---------------------
# The stand-in models KubeVirt behind kubevirtBMC (tests/kubevirt_bmc.py): the runStrategy, the
# instance's phase and KubeVirt v1.7.0's VM controller; the control-plane tier runs the rule itself.


# Without the rule MAAS's own power-on waits out its retries (45 s): its driver's timing, not the
# API's shape, so that case runs on the pinned release only.
@pytest.mark.parametrize("rule", [True, pytest.param(False, marks=PINNED_ONLY)],
                         ids=["with-the-rule", "without-the-rule"])
def test_maas_powers_on_a_vm_whose_guest_powered_off_only_with_the_rule(real_maas, site, tmp_path, rack, rule):
    """The tutorial starts the VM with RerunOnFailure; enlistment ends with the guest powering off.
    MAAS's own Redfish power-on to commission it (Off: no ForceOff, PXE, On) starts it when the
    guest power-off rule has set Halted. Without the rule kubevirtBMC's On changes nothing and the
    VM stays Off while MAAS waits, until Halted is set by hand: MAAS's own next try then starts it."""
    from controlplane import wait_for

    bmc = real_maas.bmc
    settle_the_others(real_maas, site)
    rack(2.0)
    namespace = "guest-off" if rule else "guest-off-norule"
    _, enlisted = enlist_script_output(real_maas, site, "web1", namespace, tmp_path)
    assert enlisted.status == 200, enlisted.body
    sid, host = enlisted.system_id, f"web1.{namespace}.{DOMAIN}"
    bmc.set_run_strategy(host, "RerunOnFailure")
    before = bmc.guest_power_off_rule
    bmc.guest_power_off_rule = rule
    try:
        bmc.guest_power_off(host)
    finally:
        bmc.guest_power_off_rule = before
    vm = bmc.vm(host)
    assert (vm.strategy, vm.instance) == ("Halted" if rule else "RerunOnFailure", None)
    audit = RecordingAudit()
    # Without the rule MAAS's power-on would try for many minutes: the commission request is let go
    # after 20 s (MAAS carries on with it), and the test watches the BMC meanwhile.
    loop = reconciler(real_maas, site, audit, **({} if rule else {"commission_timeout": 20}))
    records = reconcile_until_commissioned(loop, audit, sid)
    seen = bmc.seen(host)
    actions = [request.action for request in seen]
    assert [action for action in actions if action.startswith(("PATCH", "Reset"))][:2] == [
        "PATCH Boot Once Pxe", "Reset On"], actions
    if rule:
        assert [r["outcome"] for r in records] == ["ok"] and not records[0].get("reason"), records
        assert real_maas.machine(sid)["status_name"] == "Commissioning"
        assert vm.instance == "Running" and "GET On" in actions
        return
    assert [r["reason"] for r in records if "timeout" in r.get("reason", "")], records
    on = next(request for request in seen if request.action == "Reset On")
    after = [request for request in seen if request.at > on.at and request.method == "GET"]
    assert after and {request.action for request in after} == {"GET Off"}, actions
    assert after[-1].at - on.at >= 15  # MAAS kept waiting for On, in vain
    assert (vm.strategy, vm.instance) == ("RerunOnFailure", None)
    # What the rule would have done, by hand: MAAS's own next try of the same power-on starts it.
    bmc.set_run_strategy(host, "Halted")
    wait_for(lambda: real_maas.machine(sid)["power_state"] == "on", 180, "MAAS to see the VM on")
    assert vm.instance == "Running"
    assert real_maas.machine(sid)["status_name"] == "Commissioning"
