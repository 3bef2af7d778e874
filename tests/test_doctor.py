"""doctor's MAAS and network checks against the MAAS double and a local Redfish responder.

A healthy site first (every MAAS and network check ok), then each failure injected into it.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))

from conftest import require, require_tool  # noqa: E402
from maas_double import MaasDouble  # noqa: E402
from tables import read_table, squeezed  # noqa: E402
from redfish_responder import RedfishResponder  # noqa: E402

from maas_kubevirt import cli, doctor, identity  # noqa: E402
from maas_kubevirt.maas import MAASClient, RetryPolicy, Signer  # noqa: E402
from maas_kubevirt.paths import SCRIPT_NAME  # noqa: E402
from maas_kubevirt.render import render_commissioning  # noqa: E402
from maas_kubevirt.values import load_values  # noqa: E402

# Wall-clock bounds: run after the parallel workers, with the machine to itself (tests/conftest.py).
pytestmark = pytest.mark.timing

DOMAIN = "bmc.example.com"
SEED = hashlib.sha256(b"test_doctor seed").hexdigest()   # 32 bytes of hex, with no pattern the seed rules refuse
VMS = [("web1", "vms"), ("web2", "vms"), ("db1", "tenant")]
RACKS = ["10.0.0.5/32", "10.0.0.6/32", "fd00::5/128"]


class Site:
    """A MAAS double, a seed file, values and a Redfish responder that agree with each other."""

    def __init__(self, tmp_path: Path, double: MaasDouble, responder: RedfishResponder):
        self.tmp_path, self.double, self.responder = tmp_path, double, responder
        self.redfish_port = responder.port          # kept: a test stops the responder
        self.key = double.api_key
        self.url = double.url
        self.seed_file = tmp_path / "seed"
        self.seed_file.write_text(SEED + "\n")
        self.seed_file.chmod(0o600)
        key = tmp_path / "api-key"
        key.write_text(double.api_key_text + "\n")
        key.chmod(0o600)
        self.values_file = tmp_path / "values.yaml"
        self.values_file.write_text(yaml.safe_dump({
            "redfish": {"domain": DOMAIN},
            "seed": {"file": str(self.seed_file)},
            # The rack controllers only: the allowlist a healthy site keeps (ingress.source_ranges).
            "ingress": {"source_ranges": RACKS},
            "maas": {"url": double.url, "api_key_file": str(key), "timeout": 2,
                     "audit_log": str(tmp_path / "audit.log")},
        }))
        self.values = load_values(self.values_file)
        self.script = render_commissioning(self.values).encode()
        self.client().create_script(SCRIPT_NAME, self.script)   # as upload-script creates it
        assert set(double.scripts[SCRIPT_NAME]["tags"]) >= {"bmc-config", "enlisting"}
        self.ids = {}
        for vm, namespace in VMS:
            self.ids[(vm, namespace)] = self.add_vm(vm, namespace)

    def host(self, vm: str, namespace: str) -> str:
        return identity.redfish_host(vm, namespace, DOMAIN)

    def add_vm(self, vm: str, namespace: str, password: str | None = None, **kw: object) -> str:
        right = identity.bmc_password(SEED, identity.format_serial(vm, namespace))
        self.responder.accounts[self.host(vm, namespace)] = ("maas", right)
        # The one address MAAS stores for a Redfish BMC: the bare host (its driver adds https://).
        return self.double.add_machine(
            power_type="redfish", power_address=self.host(vm, namespace), power_pass=password or right, **kw)

    def resolve(self, host: str) -> list[str]:
        if host.endswith("." + DOMAIN):
            return ["127.0.0.1"]
        raise OSError(-2, "Name or service not known")

    def client(self) -> MAASClient:
        return MAASClient(self.url, Signer(*self.key), timeout=2,
                          retry=RetryPolicy(attempts=1))

    def run(self, **options: object) -> dict[str, doctor.Check]:
        settings = dict(resolve=self.resolve, redfish_deadline=2.0, redfish_https_port=self.redfish_port)
        settings.update(options)
        checks = doctor.run(self.values, self.client(), None, doctor.Options(**settings))
        names = [c.name for c in checks]
        assert len(names) == len(set(names)), names
        return {c.name: c for c in checks}

    def secrets(self) -> list[str]:
        return [SEED, self.double.api_key_text, *self.double.api_key, *self.double.passwords()]


def self_signed(directory: Path) -> tuple[str, str]:
    """A certificate and key for the responder: MAAS's driver speaks https and checks no certificate."""
    openssl = require_tool("openssl", "openssl makes the self-signed certificate of the HTTPS responder")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "1", "-subj", "/CN=bmc", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return str(cert), str(key)


@pytest.fixture
def site(tmp_path: Path):
    with MaasDouble() as double, RedfishResponder(tls=self_signed(tmp_path)) as responder:
        yield Site(tmp_path, double, responder)


def statuses(checks: dict[str, doctor.Check]) -> dict[str, str]:
    return {name: check.status for name, check in checks.items()}


def test_a_healthy_site_passes_every_maas_and_network_check(site):
    checks = site.run()
    assert statuses(checks) == {
        "maas.version": "ok", "maas.admin": "ok", "maas.script": "ok", "maas.enlist_commissioning": "ok",
        "maas.claims": "ok", "maas.suspects": "ok", "maas.pools": "ok", "maas.power_password": "ok",
        "maas.commission": "ok",
        "maas.rotations": "ok", "maas.generations": "skip", "maas.power_types": "ok",
        "maas.seed_file": "ok", "reconciler.lease": "ok", "cluster": "skip", "ingress.source_ranges": "ok",
        "network.dns": "ok", "network.route": "ok", "network.redfish": "ok",
    }
    assert checks["ingress.source_ranges"].found == (
        "10.0.0.5/32, 10.0.0.6/32, fd00::5/128: 3 address(es) may reach the BMCs; MAAS lists no rack controller")
    assert "3 machine(s)" in checks["maas.power_password"].found
    # One VM per namespace is probed, with the Host header of its BMC: its service root without
    # credentials (network.route), then its system with MAAS's (network.redfish).
    assert sorted((r["host"], r["path"]) for r in site.responder.requests) == sorted(
        (site.host(vm, namespace), path) for vm, namespace in (("db1", "tenant"), ("web1", "vms"))
        for path in ("/redfish/v1/", "/redfish/v1/Systems/1"))


@pytest.mark.parametrize("version, status", [
    # ok on the releases the tiers prove (upstream.lock.yaml's maas-proven: 3.5.13 3.6.5 3.7.3),
    # a warning on any other that works.
    ("2.8.3", "fail"), ("2.9.0", "warn"), ("3.5.4", "warn"), ("3.5.13", "ok"), ("3.6.0", "fail"), ("3.6.4", "fail"),
    ("3.6.5", "ok"), ("3.7.0~beta2-16000-g1", "fail"), ("3.7.2", "fail"), ("3.7.3", "ok"), ("3.8.0", "warn"),
])
def test_maas_version(site, version, status):
    site.double.version = version
    check = site.run()["maas.version"]
    assert check.status == status
    if status == "fail":
        assert "upgrade to 3.6.5 or 3.7.3" in check.fix


def test_a_key_of_a_user_who_is_not_an_administrator(site):
    site.double.admin = False
    checks = site.run()
    assert checks["maas.admin"].status == "fail"
    assert "not an administrator" in checks["maas.admin"].found
    assert "maas apikey" in checks["maas.admin"].fix
    assert checks["maas.claims"].status == checks["maas.power_password"].status == "skip"


def test_a_refused_key(site):
    site.key = ("other", "keyxx", "secretxx")
    checks = site.run()
    assert checks["maas.admin"].status == "fail"
    assert "refused" in checks["maas.admin"].found
    assert checks["maas.script"].status == "skip"


def test_maas_not_answering(site):
    site.double.stop()
    checks = site.run()
    assert checks["maas.version"].status == "fail"
    assert all(checks[name].status == "skip" for name in doctor.MAAS_CHECKS[1:])
    # The allowlist is judged without MAAS, and MAAS is not asked for its rack controllers.
    assert checks["ingress.source_ranges"].status == "ok" and "rack controller" not in checks["ingress.source_ranges"].found


def test_the_script_missing(site):
    site.double.scripts.clear()
    check = site.run()["maas.script"]
    assert check.status == "fail" and "has no script" in check.found
    assert "upload-script` (it renders the script from these values)" in check.fix


@pytest.mark.parametrize("tags, missing", [(["node"], "bmc-config, enlisting"), (["bmc-config"], "enlisting"),
                                           (["enlisting"], "bmc-config")])
def test_the_script_without_its_tags(site, tags, missing):
    site.double.scripts[SCRIPT_NAME]["tags"] = tags
    check = site.run()["maas.script"]
    assert check.status == "fail" and f"not tagged {missing}" in check.found


def test_the_script_out_of_date(site):
    site.double.scripts[SCRIPT_NAME]["script"] = site.script.replace(b"bmc.example.com", b"bmc.example.org")
    check = site.run()["maas.script"]
    assert check.status == "fail" and "rendered from other values (domain differ" in check.found
    site.double.scripts[SCRIPT_NAME]["script"] = site.script.replace(b"def ", b"def  ", 1)
    check = site.run()["maas.script"]
    assert check.status == "fail" and "its code differs" in check.found


def test_enlist_commissioning_off(site):
    site.double.settings["enlist_commissioning"] = False
    check = site.run()["maas.enlist_commissioning"]
    assert check.status == "warn"
    assert check.fix == "`maas $PROFILE maas set-config name=enlist_commissioning value=true`"


def test_the_seed_file_readable_by_others(site):
    site.seed_file.chmod(0o644)
    checks = site.run()
    check = checks["maas.seed_file"]
    assert check.status == "fail" and "mode 0644" in check.found
    assert check.fix.startswith(f"`install -m 600 -o root SEEDFILE {site.seed_file}`")
    assert checks["maas.power_password"].status == "skip"


def test_the_seed_file_owned_by_someone_else(site):
    require(os.geteuid() == 0, "giving the seed file to another user needs root")
    os.chown(site.seed_file, 65534, 65534)
    check = site.run()["maas.seed_file"]
    assert check.status == "fail" and "owned by uid 65534" in check.found


def test_a_weak_seed(site):
    site.seed_file.write_text("short-and-guessable\n")
    check = site.run()["maas.seed_file"]
    assert check.status == "fail" and "short-and-guessable" not in check.found


def test_the_seed_file_missing_or_a_symlink(site):
    target = site.tmp_path / "elsewhere"
    site.seed_file.rename(target)
    checks = site.run()
    assert checks["maas.seed_file"].status == "fail"
    assert checks["maas.power_password"].status == "skip"
    site.seed_file.symlink_to(target)
    check = site.run()["maas.seed_file"]
    assert check.status == "fail" and "symbolic link" in check.found


def test_no_seed_file_configured(site):
    site.values["seed"]["file"] = ""
    checks = site.run()
    assert checks["maas.seed_file"].status == "fail" and "seed.file is empty" in checks["maas.seed_file"].found
    assert checks["maas.power_password"].status == "skip"
    assert checks["maas.script"].status == "ok"      # the script is compared with the render, not the seed


def test_a_vm_claimed_twice(site):
    impostor = site.add_vm("web2", "vms")
    checks = site.run()
    claims = checks["maas.claims"]
    assert claims.status == "fail"
    assert "web2.vms" in claims.found and impostor in claims.found and site.ids[("web2", "vms")] in claims.found
    assert set(claims.subjects) == {impostor, site.ids[("web2", "vms")]}
    # Duplicates get no password check (they get no password at all).
    assert "2 machine(s)" in checks["maas.power_password"].found


def test_a_vm_kept_out_of_a_pool_maas_kubevirt_did_not_make(site):
    site.double.add_pool("gpu-prod", "GPU servers for production")
    rogue = site.add_vm("x", "gpu-prod")
    check = site.run()["maas.pools"]
    assert check.status == "warn" and rogue in check.found and "x.gpu-prod" in check.found
    assert check.subjects == (rogue,) and "maas.adopt_pools" in check.fix
    site.values["maas"]["adopt_pools"] = ["gpu-prod"]
    assert site.run()["maas.pools"].status == "ok"


def test_a_wrong_power_password_is_reported_but_never_printed(site, capsys):
    wrong = "not-the-derived-S3CRET"
    victim = site.add_vm("web9", "vms", password=wrong)
    check = site.run()["maas.power_password"]
    assert check.status == "fail" and check.subjects == (victim,)
    assert "reconcile --once" in check.fix
    text = json.dumps(check.as_dict()) + "".join(capsys.readouterr())
    assert wrong not in text


def test_machines_that_are_not_vms_are_not_checked(site):
    site.double.add_machine("phys1", power_type="ipmi", power_address="10.0.0.1", power_pass="ipmi-S3CRET")
    site.double.add_machine("evil1", power_type="redfish", power_pass="evil-S3CRET",
                            power_address=f"https://web1.vms.{DOMAIN}.evil.io")
    checks = site.run()
    assert checks["maas.claims"].status == "ok"
    assert checks["maas.power_password"].status == "ok"


# --- network ---------------------------------------------------------------------------------


def test_a_name_that_does_not_resolve(site):
    def resolve(host: str) -> list[str]:
        if host.endswith(".tenant." + DOMAIN):
            raise OSError(-2, "Name or service not known")
        return ["127.0.0.1"]

    checks = site.run(resolve=resolve)
    assert checks["network.dns"].status == "fail"
    assert site.host("db1", "tenant") in checks["network.dns"].found
    assert f"*.tenant.{DOMAIN} for" in checks["network.dns"].fix   # the namespace that does not resolve
    assert checks["network.redfish"].status == "fail"


def test_redfish_refuses_the_credentials_maas_holds(site):
    site.responder.accounts[site.host("web1", "vms")] = ("maas", "another-password")
    check = site.run()["network.redfish"]
    assert check.status == "fail" and "HTTP 401" in check.found
    assert check.subjects == (site.ids[("web1", "vms")] + " " + site.host("web1", "vms"),)


def test_redfish_too_slow(site):
    site.responder.delay = 1.0
    check = site.run(redfish_deadline=0.3)["network.redfish"]
    assert check.status == "fail" and "no answer within 0.3 s" in check.found


def test_redfish_nobody_listening(site):
    port = site.responder.port
    site.responder.stop()
    check = site.run()["network.redfish"]
    assert check.status == "fail" and f":{port}" not in check.found


def test_redfish_over_https_sends_no_sni_as_maas(tmp_path):
    """MAAS's driver names no server in its TLS handshake: doctor's probe neither, so a proxy that
    needs SNI fails here as it fails MAAS (check-route speaks the same TLS)."""
    host = identity.redfish_host("web1", "vms", DOMAIN)
    with RedfishResponder({host: ("maas", "pw")}, tls=self_signed(tmp_path)) as responder:
        credentials = doctor.Credentials("abc123", host, "maas", "pw")
        status, _, problem = doctor.redfish_probe(credentials, lambda h: ["127.0.0.1"], 3.0, responder.port)
        assert (status, problem) == (200, "")
        assert responder.server_names == [None]
        assert responder.requests[-1]["host"] == host      # the bare host, as MAAS's driver sends it


def test_redfish_url_follows_maas():
    assert doctor.redfish_url("web1.vms.bmc.example.com", "1") == "https://web1.vms.bmc.example.com/redfish/v1/Systems/1"
    assert doctor.redfish_url("http://h.n.d:8080", "") == "http://h.n.d:8080/redfish/v1/Systems/1"
    assert doctor.redfish_url("https://h.n.d/", "2") == "https://h.n.d/redfish/v1/Systems/2"


def test_credentials_hide_the_password():
    assert "S3CRET" not in repr(doctor.Credentials("a", "https://h", "maas", "S3CRET"))


# --- the command -----------------------------------------------------------------------------


def table_statuses(out: str) -> dict[str, str]:
    """CHECK -> STATUS of each row (a wrapped row's further lines start blank)."""
    return {line.split()[0]: line.split()[1] for line in out.splitlines()[1:-1] if not line.startswith(" ")}


def test_doctor_command_table_and_json(site, monkeypatch, capsys):
    monkeypatch.setattr(doctor, "system_resolve", site.resolve)
    monkeypatch.setattr(doctor, "HTTPS_PORT", site.redfish_port)
    code = cli.main(["--values", str(site.values_file), "doctor"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    table = out
    header = out.splitlines()[0].split()
    assert header == ["CHECK", "STATUS", "FOUND", "FIX"]
    assert table_statuses(out)["cluster"] == "skip"
    assert out.rstrip().endswith("17 ok, 0 warn, 0 fail, 2 skip")
    code = cli.main(["--values", str(site.values_file), "doctor", "--json"])
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert code == 0
    assert report["summary"] == {"ok": 17, "warn": 0, "fail": 0, "skip": 2}
    assert all(set(c) == {"check", "status", "found", "fix", "subjects"} for c in report["checks"])
    assert report["checks"][0]["check"] == "maas.version"
    assert {c["check"]: c["status"] for c in report["checks"]} == table_statuses(table)
    for secret in site.secrets():
        assert secret not in out + err


def _timeless_probe(monkeypatch) -> None:
    """The Redfish probe as it is, less the round-trip time it reports: 0.1 s in one run, 0.2 s in the next."""
    probe = doctor.network.redfish_probe

    def timeless(*args, **kwargs):
        status, _, problem = probe(*args, **kwargs)
        return status, 0.0, problem

    monkeypatch.setattr(doctor.network, "redfish_probe", timeless)


@pytest.mark.parametrize("columns", [80, 132])
def test_doctor_table_fits_the_terminal_and_json_does_not_change(site, monkeypatch, capsys, columns):
    _timeless_probe(monkeypatch)
    monkeypatch.setattr(doctor, "system_resolve", site.resolve)
    monkeypatch.setattr(doctor, "HTTPS_PORT", site.redfish_port)
    monkeypatch.delenv("COLUMNS", raising=False)
    assert cli.main(["--values", str(site.values_file), "doctor", "-o", "wide"]) == 0
    whole = capsys.readouterr().out
    assert cli.main(["--values", str(site.values_file), "doctor", "--json"]) == 0
    json_out = capsys.readouterr().out
    assert max(len(line) for line in whole.splitlines()) > columns   # wide: one line a row
    monkeypatch.setenv("COLUMNS", str(columns))
    assert cli.main(["--values", str(site.values_file), "doctor"]) == 0
    fitted = capsys.readouterr().out
    assert all(len(line) <= columns for line in fitted.splitlines()), fitted
    assert len(fitted.splitlines()) > len(whole.splitlines())
    assert fitted.splitlines()[-1] == whole.splitlines()[-1]          # the summary
    table_part = "\n".join(fitted.splitlines()[:-1])
    checks = json.loads(json_out)["checks"]
    assert read_table(table_part)[1:] == squeezed((c["check"], c["status"], c["found"], c["fix"] or "-")
                                                  for c in checks)
    assert cli.main(["--values", str(site.values_file), "doctor", "--json"]) == 0
    assert capsys.readouterr().out == json_out


def test_piped_the_table_fits_120_columns_and_wide_json_and_yaml_say_the_same(site, monkeypatch, capsys):
    """Not a terminal and no COLUMNS (a mail, a CI log): 120 columns, not rows of ~300; -o wide
    keeps a row on one line for grep; -o yaml is -o json's document, --json its old name."""
    _timeless_probe(monkeypatch)
    monkeypatch.setattr(doctor, "system_resolve", site.resolve)
    monkeypatch.setattr(doctor, "HTTPS_PORT", site.redfish_port)
    outputs = {}
    for output in (["-o", "wide"], [], ["-o", "json"], ["--output", "yaml"], ["--json"]):
        assert cli.main(["--values", str(site.values_file), "doctor", *output]) == 0
        outputs[" ".join(output)] = capsys.readouterr().out
    piped, wide = outputs[""], outputs["-o wide"]
    assert max(len(line) for line in piped.splitlines()) <= doctor.PIPED_WIDTH < max(map(len, wide.splitlines()))
    assert len(wide.splitlines()) == len(json.loads(outputs["-o json"])["checks"]) + 2   # the header, the summary
    assert yaml.safe_load(outputs["--output yaml"]) == json.loads(outputs["-o json"])
    assert outputs["--json"] == outputs["-o json"]


def test_a_kubeconfig_variable_naming_no_file_is_said_so(site, monkeypatch, capsys, tmp_path):
    """KUBECONFIG=/nonexistent is not "no $KUBECONFIG": the row names the files and what to do."""
    monkeypatch.setattr(doctor, "system_resolve", site.resolve)
    monkeypatch.setattr(doctor, "HTTPS_PORT", site.redfish_port)
    monkeypatch.setenv("KUBECONFIG", f"/nonexistent:{tmp_path / 'gone'}")
    assert cli.main(["--values", str(site.values_file), "doctor", "-o", "json"]) == 0
    (row,) = [c for c in json.loads(capsys.readouterr().out)["checks"] if c["check"] == "cluster"]
    assert row["status"] == "skip"
    assert row["found"].startswith(f"no --kubeconfig given, and $KUBECONFIG names files that do not exist "
                                   f"(/nonexistent, {tmp_path / 'gone'})")
    assert "no $KUBECONFIG" not in row["found"]
    assert row["fix"].startswith("point $KUBECONFIG at an existing kubeconfig")


def test_wide_source_ranges_warn_and_doctor_still_exits_0(site, monkeypatch, capsys):
    """The shipped example's private ranges admit millions of hosts: a warning, not a failure."""
    monkeypatch.setattr(doctor, "system_resolve", site.resolve)
    monkeypatch.setattr(doctor, "HTTPS_PORT", site.redfish_port)
    values = yaml.safe_load(site.values_file.read_text())
    del values["ingress"]
    site.values_file.write_text(yaml.safe_dump(values))
    assert cli.main(["--values", str(site.values_file), "doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    (row,) = [c for c in report["checks"] if c["check"] == "ingress.source_ranges"]
    assert row["status"] == "warn" and row["subjects"] == ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"]
    assert "17,891,328 addresses may reach the BMCs" in row["found"] and "rack-controllers read" in row["fix"]
    assert report["summary"] == {"ok": 16, "warn": 1, "fail": 0, "skip": 2}


def test_doctor_command_exits_1_on_a_failure_and_prints_no_secret(site, monkeypatch, capsys):
    monkeypatch.setattr(doctor, "system_resolve", site.resolve)
    monkeypatch.setattr(doctor, "HTTPS_PORT", site.redfish_port)
    site.add_vm("web3", "vms", password="wrong-S3CRET-pass")
    site.responder.accounts[site.host("web1", "vms")] = ("maas", "other-S3CRET")
    code = cli.main(["--values", str(site.values_file), "doctor"])
    out, err = capsys.readouterr()
    assert code == 1
    rows = table_statuses(out)
    assert rows["network.redfish"] == rows["maas.power_password"] == "fail"
    for secret in site.secrets() + ["other-S3CRET"]:
        assert secret not in out + err


def test_without_a_maas_key_every_other_row_runs(site, monkeypatch, capsys, tmp_path):
    """On a rack controller or a workstation: no key at all. Each MAAS row is skipped with why, and
    the seed, the allowlist's width and the route (no credentials needed) still run."""
    monkeypatch.delenv("MAAS_API_KEY", raising=False)
    monkeypatch.setattr(doctor, "system_resolve", site.resolve)
    monkeypatch.setattr(doctor, "HTTPS_PORT", site.redfish_port)
    asked = dict(site.double.counts)
    values = yaml.safe_load(site.values_file.read_text())
    values["maas"]["api_key_file"] = str(tmp_path / "no-such-key")
    keyless = tmp_path / "keyless.yaml"
    keyless.write_text(yaml.safe_dump(values))
    code = cli.main(["--values", str(keyless), "doctor", "--json"])
    out, err = capsys.readouterr()
    rows = {c["check"]: c for c in json.loads(out)["checks"]}
    assert code == 0, out + err
    for name in doctor.MAAS_CHECKS:
        assert rows[name]["status"] == "skip" and "no MAAS API key" in rows[name]["found"], rows[name]
    assert rows["maas.seed_file"]["status"] == "ok" and rows["ingress.source_ranges"]["status"] == "ok"
    assert dict(site.double.counts) == asked, "MAAS was asked without a key"


def test_doctor_usage_errors_exit_2(site, capsys, tmp_path):
    assert cli.main(["--values", str(site.values_file), "doctor", "--kubeconfig", str(tmp_path / "none")]) == 2
    assert "--kubeconfig" in capsys.readouterr().err
    (tmp_path / "bad").write_text("{not yaml")
    assert cli.main(["--values", str(site.values_file), "doctor", "--kubeconfig", str(tmp_path / "bad")]) == 2
    os.environ.pop("MAAS_API_KEY", None)
    (tmp_path / "api-key").write_text("one:two\n")
    assert cli.main(["--values", str(site.values_file), "doctor"]) == 2
    err = capsys.readouterr().err
    assert "consumer:token:secret" in err


def _unreachable_kubeconfig(path: Path) -> Path:
    import socket

    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}]}))
    return path


@pytest.mark.parametrize("where", ["KUBECONFIG", "~/.kube/config"])
def test_doctor_reads_the_kubeconfig_kubectl_would(site, monkeypatch, capsys, tmp_path, where):
    from maas_kubevirt import kubeconfigs

    monkeypatch.setattr(doctor, "system_resolve", site.resolve)
    monkeypatch.setattr(doctor, "HTTPS_PORT", site.redfish_port)
    assert cli.main(["--values", str(site.values_file), "doctor", "--json"]) == 0
    assert {c["check"]: c["status"] for c in json.loads(capsys.readouterr().out)["checks"]}["cluster"] == "skip"
    config = _unreachable_kubeconfig(tmp_path / "kube-config")
    if where == "KUBECONFIG":
        monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'missing'}:{config}")
    else:
        monkeypatch.setattr(kubeconfigs, "HOME_CONFIG", str(config))
    assert cli.main(["--values", str(site.values_file), "doctor", "--json"]) == 1
    rows = {c["check"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert "cluster" not in rows
    assert rows["cluster.api"]["status"] == "fail" and "cannot reach the API server at http://127.0.0.1:" in \
        rows["cluster.api"]["found"]


def test_doctor_names_the_kubeconfig_variable_it_could_not_read(site, monkeypatch, capsys, tmp_path):
    (tmp_path / "bad").write_text("{not yaml")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "bad"))
    assert cli.main(["--values", str(site.values_file), "doctor"]) == 2
    assert f"$KUBECONFIG: {str(tmp_path / 'bad')!r} is not a YAML kubeconfig" in capsys.readouterr().err


def test_a_look_alike_power_address_is_named_as_a_suspect(site):
    """A port after the BMC host: MAAS would send the password there, so no password; doctor says so."""
    suspect = site.double.add_machine(power_type="redfish", power_pass="x", power_address=f"web1.vms.{DOMAIN}:31234")
    check = site.run()["maas.suspects"]
    assert check.status == "fail" and check.subjects == (suspect,)
    assert f"web1.vms.{DOMAIN}:31234" in check.found and f"imitates web1.vms.{DOMAIN}" in check.found
    assert "power_parameters_power_address=<vm>.<namespace>.<domain>" in check.fix


def test_a_commission_maas_refused_is_explained(site):
    """The reconciler's backoff, read from its audit log: the usual cause is a rack that cannot reach the BMC."""
    web1 = site.ids[("web1", "vms")]
    record = {"time": "2026-12-01T00:00:00.000000Z", "system_id": web1, "hostname": "x", "action": "commission",
              "before": "New", "after": "Commissioning", "outcome": "failed",
              "reason": f"POST machines/{web1}/?op=commission: 503: Unable to connect to any rack controller",
              "retry_at": "2999-01-01T00:00:00Z", "failures": 3}
    (site.tmp_path / "audit.log").write_text(json.dumps(record) + "\n")
    check = site.run()["maas.commission"]
    assert check.status == "warn" and check.subjects == (web1,)
    assert f"{web1} (web1.vms.{DOMAIN}): waiting until 2999-01-01T00:00:00Z after 3 failed attempt(s)" in check.found
    assert "ingress.source_ranges" in check.fix and "network.dns" in check.fix
    # Once the machine has left New, nothing waits.
    site.double.set_status(web1, "Commissioning")
    assert site.run()["maas.commission"].status == "ok"


def test_a_password_taken_back_from_beside_another_address_waits_to_be_rotated(site):
    """The reconciler's audit log (issue 25): each VM still to rotate, and the exact command."""
    web1 = site.ids[("web1", "vms")]
    reset = {"time": "2026-12-01T00:00:00.000000Z", "system_id": web1, "hostname": "web1-vms",
             "action": "reset-password", "before": "derived", "after": "placeholder", "outcome": "ok",
             "identity": "web1.vms", "leak": True, "generation": 0}
    (site.tmp_path / "audit.log").write_text(json.dumps(reset) + "\n")
    check = site.run()["maas.rotations"]
    assert check.status == "warn" and check.subjects == ("web1.vms",)
    assert f"web1.vms (taken back from {web1} at generation 0)" in check.found
    assert check.fix.startswith("configure reconciler.lease")
    assert check.fix.endswith("maas-kubevirt rotate web1.vms`")
    # `rotate` by hand writes its record: nothing waits any more.
    rotated = dict(reset, action="rotate", system_id=None, before="0", after="1", leak=None)
    with open(site.tmp_path / "audit.log", "a") as log:
        log.write(json.dumps(rotated) + "\n")
    assert site.run()["maas.rotations"].status == "ok"


def test_a_machine_left_on_another_power_type_is_named_with_the_fix(site):
    """An enlistment switched web1's machine to ipmi and the reconciler took its credentials back (issue 29)."""
    web1 = site.ids[("web1", "vms")]
    reset = {"time": "2026-12-01T00:00:00.000000Z", "system_id": web1, "hostname": "web1-vms",
             "action": "reset-password", "before": "derived", "after": "placeholder", "outcome": "ok",
             "identity": "web1.vms", "leak": True, "generation": 0, "power_type": "ipmi"}
    (site.tmp_path / "audit.log").write_text(json.dumps(reset) + "\n")
    assert site.run()["maas.power_types"].status == "ok"      # MAAS shows it redfish: nothing is left
    site.double.set_power_type(web1, "ipmi", {"power_address": "10.66.66.66"})
    check = site.run()["maas.power_types"]
    assert check.status == "warn" and check.subjects == (web1,)
    assert f"web1.vms on {web1} (ipmi)" in check.found and "`virtctl restart web1 -n vms`" in check.fix


def test_a_generation_below_one_the_reconciler_used_fails_with_the_command_that_puts_it_back(site):
    web1 = site.ids[("web1", "vms")]
    rotated = {"time": "2026-12-01T00:00:00.000000Z", "system_id": web1, "hostname": None, "action": "rotate",
               "before": "2", "after": "3", "outcome": "ok", "identity": "web1.vms"}
    (site.tmp_path / "audit.log").write_text(json.dumps(rotated) + "\n")
    from maas_kubevirt.doctor.maas import generations_check
    check = generations_check({("web1", "vms"): 3}, {}, "", str(site.tmp_path / "audit.log"), "maas-kubevirt")
    assert check.status == "fail" and check.subjects == ("web1.vms",)
    assert "web1.vms (the cluster says 0, 3 was used)" in check.found
    assert """kubectl -n maas-kubevirt patch configmap maas-kubevirt-rotations --type merge -p '{"data":{"web1.vms":"3"}}'""" in check.fix
    assert generations_check({("web1", "vms"): 3}, {("web1", "vms"): 3}, "", "log", "ns").status == "ok"
    unreadable = generations_check({}, None, "read ConfigMap x: no answer from the API server", "log", "ns")
    assert unreadable.status == "fail" and "derives no password" in unreadable.found
    assert generations_check({}, None, "no cluster access (reconciler.lease is not configured)", "", "ns").status == "skip"


# --- reconciler.lease (issue 23) -----------------------------------------------------------------


def test_several_region_controllers_and_no_lease_is_a_warning_naming_them(site):
    assert site.run()["reconciler.lease"].found.startswith("not configured: MAAS lists 0 region controller(s)")
    site.double.add_node("region-1", "region_and_rack_controller")
    assert site.run()["reconciler.lease"].status == "ok"
    site.double.add_node("region-2", "region_controller")
    site.double.add_node("rack-9", "rack_controller")
    check = site.run()["reconciler.lease"]
    assert check.status == "warn"
    assert "MAAS lists 2 region controller(s) (region-1, region-2)" in check.found
    assert "the reconciler of every region host acts" in check.found
    assert "reconciler.lease.kubeconfig" in check.fix and check.subjects == ("region-1", "region-2")


def test_the_allowlist_row_counts_the_rack_controllers_maas_lists(site):
    """Rack controllers, and region controllers that are racks too: each needs its address (or two)."""
    site.double.add_node("region-1", "region_and_rack_controller")
    site.double.add_node("rack-1", "rack_controller")
    site.double.add_node("region-2", "region_controller")   # not a rack: it never reaches a BMC
    site.double.add_node("printer", "device")
    check = site.run()["ingress.source_ranges"]
    assert check.status == "ok"
    assert check.found.endswith("; MAAS lists 2 rack controller(s): 2 address(es) allowed per rack controller")


def lease_kubeconfig(tmp_path: Path, port: int) -> Path:
    path = tmp_path / "lease.kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
    return path


def test_the_lease_row_says_who_holds_it_and_when_it_was_renewed(site, tmp_path):
    from test_lease import NAME, LeaseServer, LeaseStore

    from maas_kubevirt import lease

    store = LeaseStore()
    site.double.add_node("region-1", "region_controller")
    site.double.add_node("region-2", "region_controller")
    with LeaseServer(store) as server:
        site.values["reconciler"]["lease"]["kubeconfig"] = str(lease_kubeconfig(tmp_path, server.http.server_address[1]))
        check = site.run()["reconciler.lease"]
        assert check.status == "warn" and "does not exist: no reconciler has taken part yet" in check.found
        store.put_outside(NAME, "region-2_77", acquireTime="2026-12-01T10:00:00.000001Z",
                          renewTime=lease.micro_time(lease._utc_now()))
        check = site.run()["reconciler.lease"]
        assert check.status == "ok", check
        assert "held by region-2_77 since 2026-12-01T10:00:00.000001Z, renewed" in check.found
        assert "MAAS lists 2 region controller(s)" in check.found
        store.put_outside(NAME, "region-2_77", renewTime="2026-12-01T10:00:00.000001Z")
        check = site.run()["reconciler.lease"]
        assert check.status == "warn" and "so no reconciler is active" in check.found
        assert "journalctl -u maas-kubevirt" in check.fix
        store.put_outside(NAME, "", renewTime=lease.micro_time(lease._utc_now()))
        assert site.run()["reconciler.lease"].status == "warn"
    check = site.run()["reconciler.lease"]        # nobody answers now
    assert check.status == "fail" and "cannot be read" in check.found
    site.values["reconciler"]["lease"]["kubeconfig"] = str(tmp_path / "missing")
    check = site.run()["reconciler.lease"]
    assert check.status == "fail" and "reconciler.lease.kubeconfig: cannot read" in check.found


@pytest.mark.parametrize("status, fix", [(401, "make a new one"), (403, "Role and RoleBinding")])
def test_a_refused_lease_read_names_the_fix(site, status, fix):
    from maas_kubevirt.doctor.lease import lease_check

    site.values["reconciler"]["lease"]["kubeconfig"] = "/etc/maas-kubevirt/kubeconfig"
    check = lease_check(site.values, [], problem=f"GET /apis/...: {status}: refused", status=status)
    assert check.status == "fail" and fix in check.fix


def test_a_token_near_its_end_is_a_warning_and_an_ended_one_a_failure(site):
    from datetime import datetime, timedelta, timezone

    from maas_kubevirt.doctor.lease import lease_check
    from maas_kubevirt.lease import Record, micro_time

    now = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
    site.values["reconciler"]["lease"]["kubeconfig"] = "/etc/maas-kubevirt/kubeconfig"
    held = Record("region-1_5", 15, micro_time(now - timedelta(hours=1)), micro_time(now - timedelta(seconds=1)))
    for left, expected in ((timedelta(days=30), "ok"), (timedelta(days=2), "warn"), (timedelta(seconds=-1), "fail")):
        check = lease_check(site.values, [{"hostname": "region-1"}], record=held, token_expires=now + left, now=now)
        assert check.status == expected, (left, check)
    assert "the kubeconfig's token expires" in lease_check(
        site.values, [], record=held, token_expires=now + timedelta(days=30), now=now).found


def test_a_lease_without_an_audit_log_is_a_warning_that_says_it_must_be_shared(site):
    """A standby that takes the lease over restores nothing without the holder's records (issue 41)."""
    from datetime import datetime, timedelta, timezone

    from maas_kubevirt.doctor.lease import lease_check
    from maas_kubevirt.lease import Record, micro_time

    now = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
    site.values["reconciler"]["lease"]["kubeconfig"] = "/etc/maas-kubevirt/kubeconfig"
    held = Record("region-1_5", 15, micro_time(now - timedelta(hours=1)), micro_time(now - timedelta(seconds=1)))
    assert lease_check(site.values, [{"hostname": "region-1"}], record=held, now=now).status == "ok"
    site.values["maas"]["audit_log"] = ""
    check = lease_check(site.values, [{"hostname": "region-1"}], record=held, now=now)
    assert check.status == "warn" and "maas.audit_log is not set" in check.found
    assert "every host's reconciler appends to" in check.fix and "shared or replicated" in check.fix
    site.values["reconciler"]["lease"]["kubeconfig"] = ""        # one host, no lease: nothing to share
    assert lease_check(site.values, [{"hostname": "region-1"}]).status == "ok"
