"""Every command of every page (README.md and docs/*.md) is run, in the order the page gives.

doc_commands.commands() reads the commands of each ```sh block. RUNNERS below names, for each
page, every command it has, in order, and how it runs; test_every_command_has_a_runner fails
when a page gains, loses or reorders a command, so a new command cannot go untested. Each
page then runs in a sandbox of its own: a copy of this tree (uncommitted work included) in a
temporary directory, with `.venv/bin/maas-kubevirt` running this tree's CLI, after the README's
quick start (`make`) has run there, as every page assumes. A failure names the page, the line
and the command, with its output.

How a command runs (the `how` of its Step):

- RUN: as written, in the sandbox's shell (variables kept from one command to the next).
- MAAS: as written, against the MAAS double (tests/maas_double.py) on loopback, its URL and key
  in the values the page uses (the test writes them where the page says an operator does:
  site.yaml after `cp values.yaml site.yaml`, `api-key`, the sudoedit of the conffile).
- CLUSTER: as written, with kubectl and KUBECONFIG of the control-plane tier (tests/controlplane.py;
  skipped without it, failing under CI=true).
- SHIM: as written, in a private mount namespace (overlays on /etc and /var/log) with the shims
  of tests/docs_shims.py in front of PATH: sudo, sudoedit, apt, apt-get, systemctl, journalctl,
  maas. The shims check their arguments against the package built from this tree and fail when
  they do not match; their docstring says why each exists. Needs root (or a user namespace) and
  dpkg's tools, else skipped (failing under CI=true).
- CHECKED: cannot run inside a test (it is the test suite itself, or takes hours): the page marks
  it with `<!-- docs-test: checked-only: COMMAND (why) -->` before its block, and the test checks
  it with `make -n` (the target exists and expands) and that every value it passes exists; an
  upstream install command (it fetches from the network), with upstream.lock.yaml: the lock file
  pins the release it names.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest
import yaml

import docs_shims
import reference_pages
from conftest import require
from doc_commands import PAGES, ROOT, Command, CommandFailed, Shell, commands, copy_tree, quote
from maas_double import MaasDouble

RUN, MAAS, CLUSTER, SHIM, CHECKED = "run", "maas", "cluster", "shim", "checked"
SETTLE = 120


@dataclass
class Step:
    command: str                   # as doc_commands extracts it (comments dropped)
    how: str
    before: Callable | None = None  # (page) -> None, run before the command
    after: Callable | None = None   # (page, result) -> None: checks what the command did
    codes: tuple = (0,)
    check: str | None = None        # CHECKED: the shell command run in its place
    retry: str | None = None        # retry while stderr holds this (see the step's comment)
    timeout: float = 600


@dataclass
class Page:
    """One page's sandbox while its commands run."""
    name: str
    tmp: Path
    repo: Path = None
    shell: Shell = None
    env: dict = field(default_factory=dict)
    double: MaasDouble | None = None
    plane: object | None = None
    edits: Path = None
    notes: dict = field(default_factory=dict)

    def write_values(self, path: Path, changes: dict) -> None:
        data = yaml.safe_load(path.read_text()) or {}
        merge(data, changes)
        path.write_text(yaml.safe_dump(data))

    def queue_edit(self, path: str, changes: dict) -> None:
        edits = json.loads(self.edits.read_text()) if self.edits.exists() else []
        self.edits.write_text(json.dumps([*edits, {"path": path, "merge": changes}]))


merge = docs_shims.merge


def maas_values(page: Page, **extra) -> dict:
    """What an operator sets for a site: the test MAAS's URL, the API key file and an audit log."""
    values = {"redfish": {"domain": "bmc.example.com"},
              "maas": {"url": page.double.url, "interval": 1}}
    merge(values, extra)
    return values


# --- README.md ---------------------------------------------------------------------------------

SITE_DOMAIN = "bmc.site.example"


def site_yaml_edited(page: Page, result) -> None:
    """`cp values.yaml site.yaml  # edit ...`: the edit the comment asks for."""
    assert (page.repo / "site.yaml").read_text() == (page.repo / "values.yaml").read_text()
    page.write_values(page.repo / "site.yaml", {"redfish": {"domain": SITE_DOMAIN}})


def rendered_with_site_yaml(page: Page, result) -> None:
    text = "".join(p.read_text() for p in (page.repo / "build" / "kubernetes").glob("*.yaml"))
    assert SITE_DOMAIN in text, "make VALUES=site.yaml did not render site.yaml's domain"


def bundle_rendered(page: Page, result) -> None:
    assert (page.repo / "build" / "kubernetes" / "kustomization.yaml").is_file()
    assert (page.repo / "build" / "seed").stat().st_mode & 0o777 == 0o600


# --- docs/how-to/install.md --------------------------------------------------------------------

def kubectl(page: Page, *args, check=True, input=None):
    return page.plane.kubectl(*args, check=check, input=input)


def policies_ready(page: Page, result) -> None:
    kubectl(page, "wait", "--for=condition=Ready", "clusterpolicy", "-l", "app.kubernetes.io/part-of=maas-kubevirt",
            "--timeout=120s")


def apply_until_admitted(page: Page) -> None:
    deadline = time.monotonic() + SETTLE
    while True:
        result = kubectl(page, "apply", "-k", str(page.repo / "build" / "kubernetes"), check=False)
        if result.returncode == 0:
            return
        if "requires permissions" not in result.stderr or time.monotonic() > deadline:
            raise AssertionError(result.stderr)
        time.sleep(2)


ETC = "/etc/maas-kubevirt/values.yaml"


def install_site_edited(page: Page, result) -> None:
    """`cp values.yaml site.yaml  # set ...`: the site's domain and its MAAS."""
    assert (page.repo / "site.yaml").read_text() == (page.repo / "values.yaml").read_text()
    page.write_values(page.repo / "site.yaml", maas_values(page, redfish={"domain": SITE_DOMAIN}))


def site_script_uploaded(page: Page, result) -> None:
    """MAAS holds exactly the script rendered from site.yaml (the site's domain in it)."""
    rendered = (page.repo / "build" / "commissioning" / "31-kubevirt-bmc-config").read_text()
    assert SITE_DOMAIN in rendered
    held = page.double.scripts["31-kubevirt-bmc-config"]["script"]
    assert (held.decode() if isinstance(held, bytes) else held) == rendered


def package_values(page: Page) -> None:
    """The conffile edit the comment asks for: the seed and the audit log where the package has
    them (site.yaml's keys are already there); web1 enlisted meanwhile at the site's domain."""
    page.queue_edit(ETC, {"seed": {"file": "/etc/maas-kubevirt/seed"},
                          "maas": {"audit_log": "/var/log/maas-kubevirt/audit.log"}})
    page.notes["web1"] = page.double.add_vm("web1", "vms", SITE_DOMAIN)


def copied_for_install(page: Page, result) -> None:
    home = page.tmp / "home"
    assert (home / "seed").stat().st_mode & 0o777 == 0o600
    assert (home / "site.yaml").read_text() == (page.repo / "site.yaml").read_text()
    assert list(home.glob("maas-kubevirt_*_all.deb"))


def no_copy_left_in_the_home(page: Page) -> None:
    """Nothing scp brought to the region host stays in its home once installed."""
    left = [path.name for path in (page.tmp / "home").iterdir() if path.is_file()]
    assert not left, f"copies left in the region host's home: {left}"


def nothing_left_in_the_home(page: Page, result) -> None:
    """What was copied to the region host is installed, and no copy stays in the home."""
    no_copy_left_in_the_home(page)
    assert region_etc(page, "seed").stat().st_mode & 0o777 == 0o600


def built(page: Page, result) -> None:
    assert list((page.repo / "build" / "deb").glob("maas-kubevirt_*_all.deb"))


def installed(page: Page, result) -> None:
    assert (page.tmp / "pkgroot" / "usr" / "bin" / "maas-kubevirt").is_file()


def one_key_stored(page: Page, result) -> None:
    stored = page.shell.run("sudo cat /etc/maas-kubevirt/api-key").stdout
    assert stored.splitlines() == [page.double.api_key_text], "the key file does not hold exactly one key"


def dry_run_changed_nothing(page: Page, result) -> None:
    assert "web1" in result.stdout
    assert page.double.machines[page.notes["web1"]]["hostname"] != "web1-vms", "--dry-run changed MAAS"


def service_reconciled(page: Page, result) -> None:
    eventually(lambda: page.double.machines[page.notes["web1"]]["hostname"] == "web1-vms",
               "the service renamed web1", timeout=30)
    assert "web1" in result.stdout, "journalctl shows nothing of the service's work"


def installed_site(page: Page) -> None:
    """The state every region-host page starts from: docs/how-to/install.md run in this sandbox."""
    run_steps(page, "docs/how-to/install.md")


# --- docs/how-to/namespaces.md -----------------------------------------------------------------

def no_tenant_a(page: Page) -> None:
    kubectl(page, "delete", "namespace", "tenant-a", "--ignore-not-found", "--wait=true", "--timeout=120s")


def eventually(check, what: str, timeout: float = SETTLE):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(1)


def get(page: Page, kind: str, name: str, namespace: str | None):
    where = ["-n", namespace] if namespace else []
    result = kubectl(page, "get", kind, name, *where, "-o", "json", check=False)
    return json.loads(result.stdout) if result.returncode == 0 else None


def ours(page: Page, kind: str, namespace: str | None = None) -> list[str]:
    """The names of the objects of kind that the bundle made (its part-of label), in a namespace or cluster-wide."""
    where = ["-n", namespace] if namespace else []
    listed = json.loads(kubectl(page, "get", kind, *where, "-l", "app.kubernetes.io/part-of=maas-kubevirt", "-o",
                                "json").stdout)
    return [item["metadata"]["name"] for item in listed["items"]]


def web1_gets_its_bmc(page: Page, result) -> None:
    """examples/pxe-vm.yaml, admitted in the opted-in namespace: web1 gets its serial and its BMC objects."""
    eventually(lambda: (get(page, "virtualmachine", "web1", "tenant-a") or {}).get("spec", {}).get("template", {})
               .get("spec", {}).get("domain", {}).get("firmware", {}).get("serial") == "web1.tenant-a",
               "web1 has the serial web1.tenant-a")
    for kind, name in (("secret", "web1-bmc"), ("virtualmachinebmc", "web1"), ("ingress", "web1-bmc"),
                       ("networkpolicy", "maas-kubevirt-bmc")):
        eventually(lambda: get(page, kind, name, "tenant-a"), f"{kind} {name} in tenant-a")


def bundle_applied(page: Page) -> None:
    apply_until_admitted(page)
    policies_ready(page, None)


def bundle_for_namespaces(page: Page) -> None:
    """docs/how-to/install.md has applied the bundle; no tenant-a yet."""
    no_tenant_a(page)
    bundle_applied(page)


def tenant_a_with_web1(page: Page) -> None:
    """An opted-in namespace whose VM web1 has its BMC objects, under the bundle in build/."""
    bundle_for_namespaces(page)
    kubectl(page, "create", "namespace", "tenant-a")
    kubectl(page, "label", "namespace", "tenant-a", "maas.io/kubevirt-bmc=enabled",
            "mutatevirtualmachines.kubemacpool.io=allocate")
    kubectl(page, "-n", "tenant-a", "apply", "-f", str(page.repo / "examples" / "pxe-vm.yaml"))
    web1_gets_its_bmc(page, None)


def web1_started_once(page: Page, result) -> None:
    assert get(page, "virtualmachine", "web1", "tenant-a")["spec"]["runStrategy"] == "RerunOnFailure"


def test_no_page_has_maas_power_on_a_vm_it_does_not_know():
    """Issue 43 item 3: MAAS knows a machine only once it has enlisted; a page that says MAAS
    starts a VM for its enlistment sends the reader to wait for nothing."""
    for page in PAGES:
        text = " ".join((ROOT / page).read_text().split())
        for wrong in ("until MAAS powers it on through its BMC", "Once MAAS powers it on, the VM PXE-boots and enlists"):
            assert wrong not in text, f"{page}: {wrong!r}"


def bmc_objects_gone(page: Page, result) -> None:
    assert "deleted" in result.stdout
    for kind in ("secret", "virtualmachinebmc", "ingress", "networkpolicy"):
        assert ours(page, kind, "tenant-a") == [], f"{kind} left in tenant-a"


def serial_removed(page: Page, result) -> None:
    firmware = get(page, "virtualmachine", "web1", "tenant-a")["spec"]["template"]["spec"]["domain"].get("firmware", {})
    assert "serial" not in firmware


# --- docs/how-to/run-reconciler.md -------------------------------------------------------------

def maas_site(page: Page) -> None:
    """The site's values (README: cp values.yaml site.yaml, edited, with the seed.file the page
    tells to set) and the operator's api-key file."""
    assert "seed:\n  file: build/seed" in (page.repo / "docs/how-to/run-reconciler.md").read_text(), \
        "run-reconciler.md no longer says to set seed.file"
    shutil.copy(page.repo / "values.yaml", page.repo / "site.yaml")
    page.write_values(page.repo / "site.yaml", maas_values(page, seed={"file": "build/seed"}))
    (page.repo / "api-key").write_text(page.double.api_key_text + "\n")
    page.notes["web1"] = page.double.add_vm("web1", "vms")


def planned_not_done(page: Page, result) -> None:
    assert page.double.machines[page.notes["web1"]]["hostname"] != "web1-vms", "--dry-run changed MAAS"
    assert "web1" in result.stdout


def reconciled(page: Page, result) -> None:
    assert page.double.machines[page.notes["web1"]]["hostname"] == "web1-vms"


def a_vm_enlists_meanwhile(page: Page) -> None:
    page.notes["web2"] = page.double.add_vm("web2", "vms")


def loop_reconciled(page: Page, result) -> None:
    assert page.double.machines[page.notes["web2"]]["hostname"] == "web2-vms", "the loop did not reconcile web2"


def status_lists_them(page: Page, result) -> None:
    assert "web1-vms" in result.stdout and "web2-vms" in result.stdout


# The loop runs until stopped: here for 8 seconds, then SIGTERM, as the service is stopped.
# timeout(1) sends it and --preserve-status keeps the loop's status.
def for_a_while(command: str) -> str:
    return f"timeout --preserve-status -s TERM 8 {command}"


# --- docs/how-to/change-values.md --------------------------------------------------------------

NARROWED = "192.0.2.10/32"


def site_running_then_edited(page: Page) -> None:
    """A running site (site.yaml rendered and applied, web1 served), then the edit the page starts from."""
    shutil.copy(page.repo / "values.yaml", page.repo / "site.yaml")
    page.write_values(page.repo / "site.yaml", {"redfish": {"domain": SITE_DOMAIN}})
    page.shell.run("make VALUES=site.yaml")
    tenant_a_with_web1(page)
    page.write_values(page.repo / "site.yaml", {"ingress": {"source_ranges": [NARROWED]}})


def rendered_narrowed(page: Page, result) -> None:
    rendered = "".join(p.read_text() for p in (page.repo / "build" / "kubernetes").glob("*.yaml"))
    assert NARROWED in rendered and SITE_DOMAIN in rendered, "the render does not hold site.yaml's edit"


def ingress_updated_in_place(page: Page, result) -> None:
    """Kyverno updates web1's generated Ingress to the new ranges, without a restart or a delete."""
    uid = get(page, "ingress", "web1-bmc", "tenant-a")["metadata"]["uid"]
    ingress = eventually(lambda: (lambda found: found if found and NARROWED in json.dumps(
        found["metadata"].get("annotations", {})) else None)(get(page, "ingress", "web1-bmc", "tenant-a")),
        f"web1's Ingress admits only {NARROWED}")
    assert ingress["metadata"]["uid"] == uid


# --- docs/how-to/upgrade.md --------------------------------------------------------------------

def script_still_the_render(page: Page, result) -> None:
    site_script_uploaded(page, result)


def service_running(page: Page, result) -> None:
    state = json.loads((page.tmp / "journal" / "systemd-state.json").read_text())
    os.kill(state["pid"], 0)


def upgraded_status(page: Page, result) -> None:
    assert "web1-vms" in result.stdout, "the upgraded reconciler does not see web1"


# --- docs/how-to/upgrade-maas.md ---------------------------------------------------------------

def installed_on_a_release_that_refuses_dns(page: Page) -> None:
    installed_site(page)
    page.double.version = "3.6.3"


def doctor_row(result, name: str) -> str:
    rows = [line for line in result.stdout.splitlines() if line.split()[:1] == [name]]
    assert rows, f"doctor printed no {name} row"
    return rows[0]


def version_refused(page: Page, result) -> None:
    row = doctor_row(result, "maas.version")
    assert "fail" in row.lower() and "3.6.5" in result.stdout, row


def maas_upgraded(page: Page) -> None:
    page.double.version = "3.6.5"


def version_ok(page: Page, result) -> None:
    row = doctor_row(result, "maas.version")
    assert re.search(r"\bok\b", row.lower()) and "fail" not in row.lower(), row


# --- docs/how-to/uninstall.md ------------------------------------------------------------------

def in_namespace(page: Page, command: str) -> bool:
    return page.shell.run(command, codes=(0, 1)).returncode == 0


def service_stopped(page: Page, result) -> None:
    state = json.loads((page.tmp / "journal" / "systemd-state.json").read_text())
    assert "pid" not in state, "the service still runs"


def purged(page: Page, result) -> None:
    """What postrm purges is gone (in the page's mount namespace), and the package with it."""
    for path in ("/etc/maas-kubevirt", "/etc/systemd/system/maas-kubevirt.service.d", "/var/log/maas-kubevirt"):
        assert in_namespace(page, f"test ! -e {path}"), f"{path} is left after the purge"
    assert not (page.tmp / "pkgroot").exists()


def uninstall_cluster(page: Page) -> None:
    """The site has an opted-in namespace with a VM MAAS powers: what the page says stays."""
    tenant_a_with_web1(page)


def labelled_for_delete(page: Page, result) -> None:
    found = get(page, "configmap", "maas-kubevirt-rotations", "maas-kubevirt")
    assert found["metadata"]["labels"].get("maas-kubevirt/allow-delete") == "true"


def bundle_deleted_bmc_kept(page: Page, result) -> None:
    eventually(lambda: get(page, "namespace", "maas-kubevirt", None) is None, "the system namespace is deleted")
    assert ours(page, "clusterpolicy") == [], "a policy is left"
    for kind, name in (("secret", "web1-bmc"), ("virtualmachinebmc", "web1"), ("ingress", "web1-bmc"),
                       ("networkpolicy", "maas-kubevirt-bmc")):
        assert get(page, kind, name, "tenant-a"), f"{kind} {name} went with the bundle"


def all_bmc_objects_gone(page: Page, result) -> None:
    bmc_objects_gone(page, result)
    assert get(page, "virtualmachine", "web1", "tenant-a"), "the VM went too"


def unlabelled(page: Page, result) -> None:
    labels = get(page, "namespace", "tenant-a", None)["metadata"].get("labels", {})
    assert "maas.io/kubevirt-bmc" not in labels


# --- docs/how-to/seed-backup.md ----------------------------------------------------------------

def seed_lost(page: Page) -> None:
    """A site rendered from site.yaml and applied, then its build/seed lost."""
    shutil.copy(page.repo / "values.yaml", page.repo / "site.yaml")
    page.write_values(page.repo / "site.yaml", {"redfish": {"domain": SITE_DOMAIN}})
    page.shell.run("make VALUES=site.yaml")
    apply_until_admitted(page)
    page.notes["seed"] = (page.repo / "build" / "seed").read_text().strip()
    (page.repo / "build" / "seed").unlink()


def seed_recovered(page: Page, result) -> None:
    seed = page.repo / "build" / "seed"
    assert seed.read_text().strip() == page.notes["seed"], "the recovered seed is not the cluster's"
    assert seed.stat().st_mode & 0o777 == 0o600


def rendered_with_the_seed(page: Page, result) -> None:
    assert page.notes["seed"] in (page.repo / "build" / "kubernetes" / "seed-secret.yaml").read_text()
    rendered_with_site_yaml(page, result)


def no_difference(page: Page, result) -> None:
    assert result.stdout == "", result.stdout


# --- docs/how-to/monitor.md --------------------------------------------------------------------

def installed_site_then_metrics(page: Page) -> None:
    installed_site(page)
    page.queue_edit(ETC, {"maas": {"metrics_address": "127.0.0.1:9639"}})


def metrics_scraped(page: Page, result) -> None:
    """The service (restarted by the shim once it said READY=1) serves its cycles."""
    from prometheus_client.parser import text_string_to_metric_families

    samples = [s for family in text_string_to_metric_families(result.stdout) for s in family.samples]
    assert samples and {s.name for s in samples} == {"maas_kubevirt_cycles_total"}, result.stdout
    assert {s.labels["outcome"] for s in samples} <= {"ok", "failed", "error", "interrupted"}, result.stdout
    assert sum(s.value for s in samples) >= 1, result.stdout


def unit_is_notify(page: Page, result) -> None:
    assert result.stdout.split() == ["Type=notify", "NotifyAccess=main", "WatchdogUSec=11min"], result.stdout


# --- docs/how-to/ha.md -------------------------------------------------------------------------

def can_i_yes(page: Page, result) -> None:
    assert result.stdout.strip() == "yes"


def lease_values(page: Page) -> None:
    page.queue_edit(ETC, {"reconciler": {"lease": {"kubeconfig": "/etc/maas-kubevirt/kubeconfig"}}})


def lease_held(page: Page, result) -> None:
    """The line the page shows (`lease ...: held by ...`). A standby makes a missing Lease only
    after reconciler.lease.duration, and the shim's restart does not wait for that: the command is
    asked again until then, as an operator would."""
    deadline = time.monotonic() + 60
    while not re.match(r"lease \S+: held by \S+", result.stdout.strip()):
        assert time.monotonic() < deadline, f"the lease is still not held: {result.stdout}"
        time.sleep(2)
        result = page.shell.run(result.command)


def installed_site_with_lease(page: Page) -> None:
    run_steps(page, "docs/how-to/ha.md")   # which starts from docs/how-to/install.md


# --- docs/how-to/rotate.md ---------------------------------------------------------------------

def web1_power(page: Page, seed: str, generation: int) -> bool:
    from maas_kubevirt import identity

    power = page.double.power[page.notes["web1"]]
    return (power["power_pass"] == identity.bmc_password(seed, "web1.vms", generation)
            and power["power_user"] == identity.bmc_user(seed, "web1.vms", generation))


def rotated_by_hand(page: Page, result) -> None:
    """The generation in the cluster's ConfigMap, and the running service following it in MAAS
    (after its settle) with exactly what Kyverno derives for generation 1."""
    from maas_kubevirt import identity

    found = json.loads(kubectl(page, "-n", "maas-kubevirt", "get", "configmap", identity.ROTATIONS_CONFIGMAP,
                               "-o", "json").stdout)
    assert (found.get("data") or {}).get("web1.vms") == "1", found
    assert "credential generation 0 -> 1" in result.stdout
    seed = (page.repo / "build" / "seed").read_text().strip()
    eventually(lambda: web1_power(page, seed, 1), "the service set web1's generation-1 password", timeout=90)


def old_seed(page: Page) -> None:
    page.notes["seed"] = (page.repo / "build" / "seed").read_text().strip()


def new_seed_rendered(page: Page, result) -> None:
    """The new seed rendered with the site's values (not the defaults), the old one kept, private."""
    build = page.repo / "build"
    seed = (build / "seed").read_text().strip()
    assert seed != page.notes["seed"] and (build / "seed").stat().st_mode & 0o777 == 0o600
    assert seed in (build / "kubernetes" / "seed-secret.yaml").read_text()
    assert (build / "seed.old").read_text().strip() == page.notes["seed"]
    assert (build / "seed.old").stat().st_mode & 0o777 == 0o600
    rendered = "".join(path.read_text() for path in (build / "kubernetes").glob("*.yaml"))
    assert SITE_DOMAIN in rendered and "bmc.example.com" not in rendered, "the seed was rendered without site.yaml"


def cluster_has_the_new_seed(page: Page, result) -> None:
    import base64

    secret = get(page, "secret", "maas-kubevirt-seed", "maas-kubevirt")
    stored = base64.b64decode(secret["data"]["seed"]).decode().strip()
    assert stored == (page.repo / "build" / "seed").read_text().strip(), "the cluster still holds the old seed"


def maas_has_the_new_passwords(page: Page, result) -> None:
    seed = (page.repo / "build" / "seed").read_text().strip()
    eventually(lambda: web1_power(page, seed, 1), "the service set web1's password from the new seed", timeout=90)


# --- docs/how-to/troubleshoot.md ---------------------------------------------------------------

def a_vm_stuck_in_new(page: Page) -> None:
    """web1 enlisted with the script's placeholder, and no reconciler has run since."""
    maas_site(page)
    page.env["MAAS_API_KEY"] = page.double.api_key_text


def placeholder_shown(page: Page, result) -> None:
    rows = [line for line in result.stdout.splitlines() if "web1" in line]
    assert rows and "placeholder" in rows[0], result.stdout


def power_password_not_ok(page: Page, result) -> None:
    row = doctor_row(result, "maas.power_password")
    assert not re.search(r"\bok\b", row.lower()), row


def every_policy_ready(page: Page, result) -> None:
    """One row per ClusterPolicy of the bundle (the reference render in kyverno/), each Ready."""
    bundle = sorted(d["metadata"]["name"] for path in (ROOT / "kyverno").glob("policy-*.yaml")
                    for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == "ClusterPolicy")
    rows = [line.split() for line in result.stdout.splitlines()[1:] if line.strip()]
    assert sorted(line[0] for line in rows) == bundle, result.stdout
    header = result.stdout.splitlines()[0].split()
    assert "READY" in header and all(line[header.index("READY")] == "True" for line in rows), result.stdout


# --- docs/how-to/pxe-network.md ---------------------------------------------------------------

def tenant_a_opted_in(page: Page) -> None:
    """An opted-in namespace under the bundle in build/, as namespaces.md leaves it."""
    bundle_for_namespaces(page)
    kubectl(page, "create", "namespace", "tenant-a")
    kubectl(page, "label", "namespace", "tenant-a", "maas.io/kubevirt-bmc=enabled",
            "mutatevirtualmachines.kubemacpool.io=allocate")


def pxe_network_made(page: Page, result) -> None:
    nad = json.loads(kubectl(page, "-n", "tenant-a", "get", "network-attachment-definitions", "pxe", "-o", "json").stdout)
    assert json.loads(nad["spec"]["config"])["bridge"] == "br-pxe"


# --- docs/reference/prerequisites.md ----------------------------------------------------------

def lock_pins(key: str, version: str) -> str:
    """The check of an upstream install command: upstream.lock.yaml pins the release it installs."""
    return f"grep -qxF {quote(f'{key}: {version}')} upstream.lock.yaml"


KUBEVIRT = "https://github.com/kubevirt/kubevirt/releases/download/v1.7.0"
CDI = "https://github.com/kubevirt/containerized-data-importer/releases/download/v1.63.1"
MULTUS_IMAGE = "ghcr.io/k8snetworkplumbingwg/multus-cni:v4.3.0-thick"
# Each upstream install command of the page fetches from the network or changes this host (see its
# marker), so it is checked: against the lock file's release.
PREREQUISITE_CHECKS = [
    ("sudo kubeadm init --kubernetes-version v1.36.3", lock_pins("kubernetes", "v1.36.3")),
    (f"kubectl apply -f {KUBEVIRT}/kubevirt-operator.yaml", lock_pins("kubevirt", "v1.7.0")),
    (f"kubectl apply -f {KUBEVIRT}/kubevirt-cr.yaml", lock_pins("kubevirt", "v1.7.0")),
    (f"kubectl create -f {CDI}/cdi-operator.yaml", lock_pins("cdi", "v1.63.1")),
    (f"kubectl create -f {CDI}/cdi-cr.yaml", lock_pins("cdi", "v1.63.1")),
    ("kubectl apply -f https://github.com/cert-manager/cert-manager/releases/download/v1.19.2/cert-manager.yaml",
     lock_pins("cert-manager", "v1.19.2")),
    ("helm upgrade --install kubevirtbmc kubevirtbmc --repo https://charts.zespre.com/ --namespace kubevirtbmc-system "
     "--create-namespace --set image.tag=v0.7.0", lock_pins("kubevirtbmc", "v0.7.0")),
    ("kubectl apply -f https://raw.githubusercontent.com/k8snetworkplumbingwg/kubemacpool/v0.50.0/config/release/"
     "kubemacpool.yaml", lock_pins("kubemacpool", "v0.50.0")),
    ("kubectl apply -f https://raw.githubusercontent.com/k8snetworkplumbingwg/multus-cni/v4.3.0/deployments/"
     "multus-daemonset-thick.yml", lock_pins("multus", "v4.3.0")),
    (f"kubectl -n kube-system set image daemonset/kube-multus-ds kube-multus={MULTUS_IMAGE} "
     f"install-multus-binary={MULTUS_IMAGE}", lock_pins("multus", "v4.3.0")),
    ("kubectl create -f https://github.com/kyverno/kyverno/releases/download/v1.19.1/install.yaml",
     lock_pins("kyverno", "v1.19.1")),
    ("sudo snap install --channel=3.6/stable maas", "grep -qE '^maas-proven:.* 3[.]6[.][5-9]' upstream.lock.yaml"),
]


# --- docs/reference/doctor.md -----------------------------------------------------------------

documented_checks = reference_pages.doctor_check_names


def doctor_site(page: Page) -> None:
    maas_site(page)
    subprocess.run([str(page.repo / ".venv" / "bin" / "maas-kubevirt"), "--values", "site.yaml", "upload-script"],
                   cwd=page.repo, env={**page.env, "MAAS_API_KEY": page.double.api_key_text}, check=True,
                   capture_output=True)
    page.env["MAAS_API_KEY"] = page.double.api_key_text
    page.shell.env = page.env


def doctor_rows_are_documented(page: Page, result) -> None:
    documented = documented_checks()
    for line in result.stdout.splitlines():
        # A row wrapped to the width (piped: 120 columns) goes on in lines that start blank.
        row = line.split()[0] if line.strip() and not line.startswith(" ") else ""
        if re.fullmatch(r"(maas|cluster|network|reconciler|ingress|gateway)\.[\w/.-]+", row):
            assert any(row == name or (name.endswith("…") and row.startswith(name[:-1])) or
                       (name.endswith("/<ns>") and row.startswith(name[:-4])) for name in documented), \
                f"doctor printed the check {row}, which {reference_pages.DOCTOR_PAGE} does not list"


def kube_config_home(page: Page) -> None:
    (page.tmp / "home" / ".kube").mkdir(parents=True, exist_ok=True)
    shutil.copy(page.env["KUBECONFIG"], page.tmp / "home" / ".kube" / "config")


def doctor_json_rows_are_documented(page: Page, result) -> None:
    report = json.loads(result.stdout)
    documented = documented_checks()
    names = [c.get("name") or c.get("check") for c in report.get("checks", report.get("rows", []))]
    assert names, report
    for row in names:
        assert any(row == name or (name.endswith("…") and row.startswith(name[:-1])) or
                   (name.endswith("/<ns>") and row.startswith(name[:-4])) for name in documented), row
    assert any(n.startswith("cluster.") for n in names), "--kubeconfig gave no cluster check"


# --- docs/how-to/gateway.md --------------------------------------------------------------------

BMC_NAMESPACE = "maas-kubevirt-bmc"
GATEWAY_SITE = {"exposure": "gateway", "gateway": {"namespace": BMC_NAMESPACE, "name": "bmc"},
                "ingress": {"controller_namespace": BMC_NAMESPACE}}


def gateway_values_edited(page: Page, result) -> None:
    """`cp values.yaml site.yaml  # set exposure: gateway ...`: the edit the comment asks for."""
    page.write_values(page.repo / "site.yaml", GATEWAY_SITE)


def ingress_site_running(page: Page) -> None:
    """The page starts from a running ingress site: the default render applied, web1 served by its Ingress."""
    kubectl(page, "delete", "clusterpolicy", "-l", "app.kubernetes.io/part-of=maas-kubevirt", "--wait=true")
    tenant_a_with_web1(page)


def switch_printed(page: Page, result) -> None:
    assert "The exposure changed from ingress to gateway" in result.stdout
    for step in ("kubectl delete clusterpolicy maas-kubevirt-vm-bmc", "kubectl apply -k",
                 "kubectl delete ingress --all-namespaces -l app.kubernetes.io/part-of=maas-kubevirt"):
        assert step in result.stdout, step


def ingress_kept(page: Page, result) -> None:
    assert get(page, "ingress", "web1-bmc", "tenant-a"), "the Ingress went with the policy"


def route_beside_ingress(page: Page, result) -> None:
    policies_ready(page, result)
    route = eventually(lambda: get(page, "httproute", "web1-bmc", "tenant-a"), "HTTPRoute web1-bmc in tenant-a")
    assert route["spec"]["hostnames"] == ["web1.tenant-a.bmc.example.com"]
    eventually(lambda: get(page, "configmap", "maas-kubevirt-bmc-proxy", BMC_NAMESPACE), "the BMC proxy's allowlist")
    ingress_kept(page, result)


def bmc_gateway_admitted(page: Page, result) -> None:
    found = get(page, "gateway", "bmc", BMC_NAMESPACE)
    assert found and found["spec"]["gatewayClassName"] == "maas-kubevirt-bmc"
    assert get(page, "gatewayclass", "maas-kubevirt-bmc", None)["metadata"]["labels"]["maas-kubevirt.io/bmc-proxy"] == "true"


def route_listed(page: Page, result) -> None:
    assert "web1-bmc" in result.stdout and "tenant-a" in result.stdout


def only_the_route_left(page: Page, result) -> None:
    assert get(page, "ingress", "web1-bmc", "tenant-a") is None
    assert get(page, "httproute", "web1-bmc", "tenant-a")


# --- docs/tutorial.md --------------------------------------------------------------------------

TUTORIAL = "docs/tutorial.md"
REGION_ETC = "/etc/maas-kubevirt"


def page_yaml(page: str) -> dict:
    """The page's one ```yaml block: what it tells the reader to put in site.yaml."""
    (block,) = re.findall(r"^```yaml\n(.*?)^```$", (ROOT / page).read_text(), re.M | re.S)
    return yaml.safe_load(block)


def fresh_clone(page: Page) -> None:
    """The tutorial starts from a clone: no build/ yet (the quick start's render is undone), and a
    cluster with none of the bundle (another page's policies would refuse this render's)."""
    shutil.rmtree(page.repo / "build")
    for namespace in ("tenant-a", BMC_NAMESPACE):
        kubectl(page, "delete", "namespace", namespace, "--ignore-not-found", "--wait=true", "--timeout=120s")
    kubectl(page, "delete", "clusterpolicy", "-l", "app.kubernetes.io/part-of=maas-kubevirt", "--wait=true")


def tutorial_site_edited(page: Page, result) -> None:
    """`cp values.yaml site.yaml`, then the edit the page shows, as it shows it. Two values are the
    test's: maas.url is the test MAAS (the page's http://localhost:5240/MAAS/, the region host's own
    API, is this machine's real port), and maas.interval is 2 s, so a cycle does not wait a minute."""
    assert (page.repo / "site.yaml").read_text() == (page.repo / "values.yaml").read_text()
    edit = page_yaml(TUTORIAL)
    assert edit["maas"]["url"] == docs_shims.REGION_URL, "the page's maas.url is not the region host's own API"
    edit["maas"].update(url=page.double.url, interval=2)
    page.write_values(page.repo / "site.yaml", edit)


def tutorial_rendered(page: Page, result) -> None:
    """The first render generated the seed (private) and rendered the site's values: a gateway site,
    no example namespace."""
    build = page.repo / "build"
    assert (build / "seed").stat().st_mode & 0o777 == 0o600
    rendered = "".join(path.read_text() for path in (build / "kubernetes").glob("*.yaml"))
    domain = page_yaml(TUTORIAL)["redfish"]["domain"]
    assert domain in rendered and "HTTPRoute" in rendered, "make VALUES=site.yaml did not render site.yaml"
    assert "maas-vms" not in rendered, "kubernetes.example_namespace: false still rendered maas-vms"
    page.notes["seed"] = (build / "seed").read_text()


def seed_backed_up(page: Page, result) -> None:
    backup = page.tmp / "home" / "maas-kubevirt-backup" / "seed"
    assert backup.read_text() == page.notes["seed"] and backup.stat().st_mode & 0o777 == 0o600


def gateway_stored(page: Page, result) -> None:
    found = get(page, "gateway", "bmc", BMC_NAMESPACE)
    assert found and found["spec"]["listeners"][0]["tls"]["certificateRefs"][0]["name"] == "tenant-a-bmc-tls"
    assert found["spec"]["gatewayClassName"] == "maas-kubevirt-bmc"
    assert get(page, "secret", "tenant-a-bmc-tls", BMC_NAMESPACE)["type"] == "kubernetes.io/tls"


def proxy_service_listed(page: Page, result) -> None:
    """The BMC proxy's Service, which DNS points at: a LoadBalancer on 443 asking for the page's
    bmc_proxy.address (no load balancer here to give it)."""
    assert "maas-kubevirt-bmc-proxy" in result.stdout and "LoadBalancer" in result.stdout and "443" in result.stdout
    service = get(page, "service", "maas-kubevirt-bmc-proxy", BMC_NAMESPACE)
    assert service["spec"]["loadBalancerIP"] == page_yaml(TUTORIAL)["bmc_proxy"]["address"]
    record = re.search(r"^\*\.tenant-a\.(\S+)\.\s+\d+\s+IN\s+A\s+(\S+)$", (ROOT / TUTORIAL).read_text(), re.M)
    assert record and (record[1], record[2]) == (page_yaml(TUTORIAL)["redfish"]["domain"],
                                                 service["spec"]["loadBalancerIP"]), "the DNS record is not the proxy's"


def copied_to_the_region(page: Page, result) -> None:
    home = page.tmp / "home"
    assert (home / "seed").read_text() == page.notes["seed"] and (home / "seed").stat().st_mode & 0o777 == 0o600
    assert (home / "pools.kubeconfig").stat().st_mode & 0o777 == 0o600
    assert list(home.glob("maas-kubevirt_*_all.deb")) and (home / "site.yaml").is_file()


def region_etc(page: Page, name: str) -> Path:
    """A file the region host's commands wrote under /etc/maas-kubevirt (the overlay's upper layer)."""
    return page.tmp / "overlay" / "etc" / "upper" / "maas-kubevirt" / name


# Where the test's stand-in for the BMC proxy answers check-route on the region host (loopback,
# port 443 as MAAS's driver connects); the page's 192.0.2.10 is no address of this machine.
PROXY_STAND_IN = "127.43.0.1"


def region_seed_file(page: Page) -> None:
    """The conffile edit the comment asks for; and bmc_proxy.address is the test's stand-in proxy,
    which check-route compares DNS's answer with (the cluster keeps the page's 192.0.2.10)."""
    page.queue_edit(f"{REGION_ETC}/values.yaml", {"seed": {"file": f"{REGION_ETC}/seed"},
                                                   "maas": {"audit_log": "/var/log/maas-kubevirt/audit.log"},
                                                   "bmc_proxy": {"address": PROXY_STAND_IN}})


def seed_moved(page: Page, result) -> None:
    """The seed and the pools' kubeconfig are in /etc/maas-kubevirt, private, and nothing copied
    stays in the home."""
    for name in ("seed", "pools-kubeconfig"):
        assert region_etc(page, name).stat().st_mode & 0o777 == 0o600
    assert region_etc(page, "seed").read_text() == page.notes["seed"]
    no_copy_left_in_the_home(page)


def tutorial_script_uploaded(page: Page, result) -> None:
    stored = page.double.scripts["31-kubevirt-bmc-config"]
    assert stored["script"] == (page.repo / "build" / "commissioning" / "31-kubevirt-bmc-config").read_bytes()


def enlist_commissioning_on(page: Page, result) -> None:
    assert result.stdout.strip() == "true", result.stdout


def service_started(page: Page, result) -> None:
    """systemctl returned on READY=1 (the first cycle against MAAS done), and the service runs on;
    with ready: 0 it made no pool VM."""
    pid = json.loads((page.tmp / "journal" / "systemd-state.json").read_text())["pid"]
    os.kill(pid, 0)
    assert not tutorial_pool_vms(page), "the service made a pool VM although the pool's ready is 0"


def tutorial_pool_vms(page: Page) -> list[dict]:
    listed = kubectl(page, "-n", "tenant-a", "get", "virtualmachines", "-l", "maas-kubevirt.io/pool=web", "-o", "json")
    return json.loads(listed.stdout)["items"]


# The MAC KubeMacPool would give the composed VM (the control plane runs no KubeMacPool).
POOL_VM_MAC = "02:4b:56:00:00:01"


def the_composed_vm_boots(page: Page) -> None:
    """A thread plays the VM compose makes: once it is on the control plane, it gets its MAC as
    KubeMacPool gives it, boots and enlists with the serial Kyverno stamped (the script MAAS holds
    writes what it enlists with), and MAAS ends the commissioning the reconciler starts: Ready."""
    import threading

    def play() -> None:
        try:
            (vm,) = eventually(lambda: tutorial_pool_vms(page), "compose made the pool's VM", timeout=60)
            name = vm["metadata"]["name"]
            page.notes["composed"] = name
            kubectl(page, "-n", "tenant-a", "patch", "virtualmachine", name, "--type", "json", "-p", json.dumps(
                [{"op": "add", "path": "/spec/template/spec/domain/devices/interfaces/0/macAddress",
                  "value": POOL_VM_MAC}]))
            serial = vm["spec"]["template"]["spec"]["domain"]["firmware"]["serial"]
            assert serial == f"{name}.tenant-a", serial
            page.notes["composed_id"] = enlists(page, name, serial, mac=POOL_VM_MAC)
            commissioned(page, name, page.notes["composed_id"])
        except BaseException as failure:   # handed to the step's after hook
            page.notes["vm_failed"] = failure

    page.notes["vm_thread"] = threading.Thread(target=play, daemon=True)
    page.notes["vm_thread"].start()


def enlists(page: Page, vm: str, serial: str, mac: str) -> str:
    """The VM PXE-boots and MAAS enlists it: the script MAAS holds runs with the SMBIOS the VM has on
    the control plane (its serial and KubeVirt's manufacturer), and what it writes to
    BMC_CONFIG_PATH is what the machine enlists with, by its MAC."""
    from test_commissioning import Machine

    script = page.tmp / "enlist" / "31-kubevirt-bmc-config"
    script.parent.mkdir()
    script.write_bytes(page.double.scripts["31-kubevirt-bmc-config"]["script"])
    script.chmod(0o755)
    machine = Machine(page.tmp / "enlist").smbios(manufacturer="KubeVirt", serial=serial)
    assert machine.run(script).status == 0
    written = machine.written()
    assert written["power_type"] == "redfish" and written["node_id"] == "1"
    return page.double.enlist(vm, "tenant-a", address=written["power_address"], power_user=written["power_user"],
                              mac=mac)


def commissioned(page: Page, vm: str, sid: str) -> None:
    """The service renames, pools and commissions the machine (Commissioning with its derived
    password); commissioning then ends as MAAS ends it (Ready)."""
    from maas_kubevirt import identity

    machines = page.double.machines
    seed = page.notes["seed"].strip()
    eventually(lambda: machines[sid]["status_name"] == "Commissioning" and machines[sid]["hostname"] == f"{vm}-tenant-a"
               and machines[sid]["pool"]["name"] == "tenant-a"
               and page.double.power[sid]["power_pass"] == identity.bmc_password(seed, f"{vm}.tenant-a"),
               f"the service commissioned {vm}-tenant-a with its password", timeout=120)
    assert page.double.advance() == 1


def web_1_composed(page: Page, result) -> None:
    """compose made web-1 and returned at once; its BMC's route follows within seconds."""
    assert result.stdout.split("\t")[:3] == ["web-1", "tenant-a", "VM created"], result.stdout
    domain = page_yaml(TUTORIAL)["redfish"]["domain"]
    eventually(lambda: (get(page, "httproute", "web-1-bmc", "tenant-a") or {}).get("spec", {}).get("hostnames")
               == [f"web-1.tenant-a.{domain}"], "web-1's HTTPRoute")


def proxy_stands_in(page: Page) -> None:
    """What check-route reaches on the region host: DNS (the namespace's /etc/hosts) gives
    web-1.tenant-a.<domain> the stand-in's address, where a TLS server answers on 443 with a
    Redfish service root, as the BMC proxy does for a route to kubevirtBMC (test_traffic_tier
    proves check-route against the real proxy)."""
    from gateway_api import certificate
    from redfish_responder import RedfishResponder

    host = f"web-1.tenant-a.{page_yaml(TUTORIAL)['redfish']['domain']}"
    tls = tuple(map(str, certificate(page.tmp, "proxy-stand-in", host)))
    page.notes["responder"] = RedfishResponder({host: ("", "")}, tls=tls, address=(PROXY_STAND_IN, 443)).start()
    page.shell.run(f"printf '%s\\n' {quote(f'{PROXY_STAND_IN} {host}')} >>/etc/hosts")


def route_checked(page: Page, result) -> None:
    """Every hop ok, the address the one bmc_proxy.address names, and no SNI sent (as MAAS)."""
    rows = [line.split()[:2] for line in result.stdout.splitlines()[1:] if line.strip()]
    assert rows and all(status == "ok" for _, status in rows), result.stdout
    responder = page.notes["responder"]
    assert PROXY_STAND_IN in result.stdout and responder.server_names == [None], responder.server_names


def composed_ready(page: Page, result) -> None:
    """compose waited until MAAS had the machine Ready, and printed it; the VM has its BMC on the Gateway."""
    assert "already pool web's VM" in result.stderr, result.stderr
    page.notes["vm_thread"].join(10)
    assert "vm_failed" not in page.notes, f"the composed VM did not enlist: {page.notes['vm_failed']!r}"
    answer = json.loads(result.stdout)
    name = page.notes["composed"]
    assert answer["vm"] == name and answer["namespace"] == "tenant-a" and answer["stage"] == "Ready"
    assert answer["system_id"] == page.notes["composed_id"] and answer["hostname"] == f"{name}-tenant-a"
    assert json.loads((page.tmp / "home" / "web.json").read_text()) == answer
    for kind, bmc in (("secret", f"{name}-bmc"), ("virtualmachinebmc", name), ("httproute", f"{name}-bmc")):
        eventually(lambda: get(page, kind, bmc, "tenant-a"), f"{kind} {bmc} in tenant-a")
    domain = page_yaml(TUTORIAL)["redfish"]["domain"]
    assert get(page, "httproute", f"{name}-bmc", "tenant-a")["spec"]["hostnames"] == [f"{name}.tenant-a.{domain}"]


def status_row(result, vm: str) -> list[str]:
    (row,) = [line.split() for line in result.stdout.splitlines() if line.split()[:2] == [vm, "tenant-a"]]
    return row


def composed_deploying(page: Page, result) -> None:
    answer = json.loads(result.stdout)
    assert answer["system_id"] == page.notes["composed_id"] and answer["status_name"] == "Deploying"
    assert page.double.advance() == 1   # the installed OS signals: Deployed


def composed_deployed(page: Page, result) -> None:
    assert "Deployed" in status_row(result, page.notes["composed"]), result.stdout


def decomposed(page: Page, result) -> None:
    """The machine is gone from MAAS, the VM (and its disk with it) from the cluster."""
    assert page.notes["composed_id"] not in page.double.machines
    eventually(lambda: not tutorial_pool_vms(page), "web-1 is deleted")


def script_deleted(page: Page, result) -> None:
    assert "31-kubevirt-bmc-config" not in page.double.scripts


def key_deleted(page: Page, result) -> None:
    deleted = (page.tmp / "maas-keys-deleted").read_text().splitlines()
    assert deleted and deleted[-1] == page.double.api_key_text


def logged_out(page: Page, result) -> None:
    saved = json.loads((page.tmp / "maas-profiles.json").read_text())
    assert "admin" not in saved, saved


def tutorial_purged(page: Page, result) -> None:
    purged(page, result)
    assert not (page.tmp / "home" / "web.json").exists()


def tutorial_gateway_gone(page: Page, result) -> None:
    assert get(page, "gateway", "bmc", BMC_NAMESPACE) is None


def tutorial_secret_gone(page: Page, result) -> None:
    assert get(page, "secret", "tenant-a-bmc-tls", BMC_NAMESPACE) is None


def tutorial_bundle_deleted(page: Page, result) -> None:
    """The bundle took its policies, the system namespace and the BMC proxy's with it."""
    for namespace in ("maas-kubevirt", BMC_NAMESPACE):
        eventually(lambda: get(page, "namespace", namespace, None) is None, f"namespace {namespace} is deleted")
    assert ours(page, "clusterpolicy") == [], "a policy is left"


def tenant_a_gone(page: Page, result) -> None:
    assert get(page, "namespace", "tenant-a", None) is None


def nothing_of_the_tutorial_left(page: Page, result) -> None:
    """Of the workstation's files only the clone is left; nothing the bundle made stays in the cluster."""
    for name in ("build", "site.yaml", "pools.kubeconfig", "ca.crt"):
        assert not (page.repo / name).exists(), f"{name} is left"
    assert not (page.tmp / "home" / "maas-kubevirt-backup").exists()
    for kind in ("clusterrole", "clusterrolebinding"):
        assert ours(page, kind) == [], f"a {kind} is left: {ours(page, kind)}"


# --- the runners -------------------------------------------------------------------------------

# --- docs/how-to/pools.md ----------------------------------------------------------------------

POOL = {"name": "small", "namespace": "pool-vms", "cores": 2, "memory": "4Gi", "disk": "20Gi",
        "storage_class": "standard", "network": "pxe", "ready": 2, "max": 10}
POOLS_KUBECONFIG = "/etc/maas-kubevirt/pools-kubeconfig"


def installed_site_without_pool_vms(page: Page) -> None:
    installed_site(page)
    kubectl(page, "delete", "namespace", "pool-vms", "--ignore-not-found", "--wait=true", "--timeout=120s")


def pool_values_edited(page: Page, result) -> None:
    """The page's YAML block, added to the site's values."""
    page.write_values(page.repo / "site.yaml", {"pools": [POOL], "reconciler": {"pools": {"kubeconfig": POOLS_KUBECONFIG}}})


def pools_rendered(page: Page, result) -> None:
    text = (page.repo / "build" / "kubernetes" / "kustomization.yaml").read_text()
    assert "pools-rbac.yaml" in text and "policy-pools.yaml" in text


def can_i_no(page: Page, result) -> None:
    assert result.stdout.strip() == "no"


def pools_etc_values(page: Page) -> None:
    page.queue_edit(ETC, {"pools": [POOL], "reconciler": {"pools": {"kubeconfig": POOLS_KUBECONFIG}}})


def pool_vms(page: Page) -> list[dict]:
    listed = kubectl(page, "-n", "pool-vms", "get", "virtualmachines", "-l", "maas-kubevirt.io/pool=small", "-o", "json")
    return json.loads(listed.stdout)["items"]


def pool_filled(page: Page, result) -> None:
    """The service's reconciler, on the pools' kubeconfig, makes the pool's ready VMs: admitted by the policy."""
    eventually(lambda: len(pool_vms(page)) >= POOL["ready"], "the service made the pool's 2 ready VMs")


def composed(page: Page, result) -> None:
    vm, namespace, stage = result.stdout.split("\t")[:3]
    assert namespace == "pool-vms" and stage == "VM created" and vm.startswith("small-"), result.stdout
    page.notes["composed"] = vm


def pool_vms_listed(page: Page, result) -> None:
    assert page.notes["composed"] in result.stdout
    assert len(pool_vms(page)) == POOL["ready"] + 1
    # The control plane outlives the page, and the tiers after it judge every route of the BMC
    # class (doctor's proxy.isolation): the page's VMs and their BMC objects go with it.
    kubectl(page, "delete", "namespace", "pool-vms", "--wait=true", "--timeout=120s")


# The pools' kubeconfig, made on the workstation (docs/how-to/pools.md and docs/tutorial.md alike).
POOLS_KUBECONFIG_STEPS = [
    Step("NS=maas-kubevirt SA=maas-kubevirt-pools KC=pools.kubeconfig", CLUSTER),
    Step("SERVER=$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}')", CLUSTER),
    Step("kubectl config view --minify --raw -o jsonpath='{.clusters[0].cluster.certificate-authority-data}' "
         "| base64 -d >ca.crt", CLUSTER),
    Step('kubectl --kubeconfig $KC config set-cluster site --server "$SERVER" --certificate-authority ca.crt '
         '--embed-certs', CLUSTER),
    Step('kubectl --kubeconfig $KC config set-credentials pools --token '
         '"$(kubectl -n $NS create token $SA --duration 720h)"', CLUSTER),
    Step("kubectl --kubeconfig $KC config set-context pools --cluster site --user pools", CLUSTER),
    Step("kubectl --kubeconfig $KC config use-context pools", CLUSTER),
]
# Its systemd credential on the region host.
POOLS_CREDENTIAL_STEPS = [
    Step("sudo mkdir -p /etc/systemd/system/maas-kubevirt.service.d", SHIM),
    Step("printf '[Service]\\nLoadCredential=pools-kubeconfig:/etc/maas-kubevirt/pools-kubeconfig\\n' | "
         "sudo tee /etc/systemd/system/maas-kubevirt.service.d/pools.conf >/dev/null", SHIM),
]


RUNNERS: dict[str, list[Step]] = {
    "README.md": [
        Step("make", RUN, after=bundle_rendered),
        Step("make test", CHECKED, check="make -n test"),
        Step("cp values.yaml site.yaml", RUN, after=site_yaml_edited),
        Step("make VALUES=site.yaml", RUN, after=rendered_with_site_yaml),
    ],
    "docs/development.md": [
        Step("make mutate", CHECKED, check="make -n mutate"),
        Step('make mutate MODULES="identity values"', CHECKED,
             check='make -n mutate MODULES="identity values" | grep -F "tools/mutate identity values" >/dev/null'
                   ' && for m in identity values; do grep -q "\\"$m\\"" tools/mutate || exit 1; done'),
    ],
    "docs/how-to/change-values.md": [
        Step("make VALUES=site.yaml", RUN, before=site_running_then_edited, after=rendered_narrowed),
        Step("kubectl apply -k build/kubernetes/", CLUSTER, after=ingress_updated_in_place, retry="requires permissions"),
    ],
    "docs/how-to/gateway.md": [
        Step("cp values.yaml site.yaml", RUN, after=gateway_values_edited),
        Step("make VALUES=site.yaml", RUN, before=ingress_site_running, after=switch_printed),
        Step("kubectl delete clusterpolicy maas-kubevirt-vm-bmc", CLUSTER, after=ingress_kept),
        Step("kubectl apply -k build/kubernetes/", CLUSTER, after=route_beside_ingress, retry="requires permissions"),
        Step("kubectl apply -f examples/bmc-gateway.yaml", CLUSTER, after=bmc_gateway_admitted),
        Step("kubectl get httproute --all-namespaces -l app.kubernetes.io/part-of=maas-kubevirt", CLUSTER,
             after=route_listed),
        Step("kubectl delete ingress --all-namespaces -l app.kubernetes.io/part-of=maas-kubevirt", CLUSTER,
             after=only_the_route_left),
    ],
    "docs/how-to/ha.md": [
        Step("NS=maas-kubevirt SA=maas-kubevirt-reconciler KC=reconciler.kubeconfig", CLUSTER, before=installed_site),
        Step("SERVER=$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}')", CLUSTER),
        Step("kubectl config view --minify --raw -o jsonpath='{.clusters[0].cluster.certificate-authority-data}' "
             "| base64 -d >ca.crt", CLUSTER),
        Step('kubectl --kubeconfig $KC config set-cluster site --server "$SERVER" --certificate-authority ca.crt '
             '--embed-certs', CLUSTER),
        Step('kubectl --kubeconfig $KC config set-credentials reconciler --token '
             '"$(kubectl -n $NS create token $SA --duration 720h)"', CLUSTER),
        Step("kubectl --kubeconfig $KC config set-context reconciler --cluster site --user reconciler --namespace $NS",
             CLUSTER),
        Step("kubectl --kubeconfig $KC config use-context reconciler", CLUSTER),
        Step("kubectl --kubeconfig $KC auth can-i update leases/maas-kubevirt-reconciler", CLUSTER, after=can_i_yes),
        Step("sudo install -m 0600 reconciler.kubeconfig /etc/maas-kubevirt/kubeconfig", SHIM),
        Step("sudo mkdir -p /etc/systemd/system/maas-kubevirt.service.d", SHIM),
        Step("printf '[Service]\\nLoadCredential=kubeconfig:/etc/maas-kubevirt/kubeconfig\\n' | "
             "sudo tee /etc/systemd/system/maas-kubevirt.service.d/lease.conf >/dev/null", SHIM),
        Step("sudoedit /etc/maas-kubevirt/values.yaml", SHIM, before=lease_values),
        Step("sudo systemctl daemon-reload && sudo systemctl restart maas-kubevirt", SHIM),
        Step("sudo maas-kubevirt --values /etc/maas-kubevirt/values.yaml status | tail -n 1", SHIM, after=lease_held),
    ],
    "docs/how-to/install.md": [
        Step("cp values.yaml site.yaml", RUN, after=install_site_edited),
        Step("make VALUES=site.yaml", RUN, after=rendered_with_site_yaml),
        # A fresh cluster's Kyverno may refuse the policies for a few seconds, until the
        # aggregation controller merges the RBAC applied with them ("requires permissions"):
        # retried then, as the control-plane tier does.
        Step("kubectl apply -k build/kubernetes/", CLUSTER, after=policies_ready, retry="requires permissions"),
        Step("sudo apt-get build-dep ./", SHIM),
        Step("make deb", RUN, after=built),   # for real, with DEB_BUILD_OPTIONS=nocheck (test_deb runs those tests)
        Step("scp build/seed build/deb/maas-kubevirt_*_all.deb site.yaml maas-region:", SHIM, after=copied_for_install),
        Step("sudo apt install ~/maas-kubevirt_*_all.deb", SHIM, after=installed),
        Step("sudo install -m 0644 ~/site.yaml /etc/maas-kubevirt/values.yaml", SHIM),
        Step("sudoedit /etc/maas-kubevirt/values.yaml", SHIM, before=package_values),
        Step("sudo install -m 0600 ~/seed /etc/maas-kubevirt/seed", SHIM),
        Step("rm ~/seed ~/site.yaml ~/maas-kubevirt_*_all.deb", RUN, after=nothing_left_in_the_home),
        Step("sudo install -m 0600 /dev/null /etc/maas-kubevirt/api-key", SHIM),
        Step("sudo maas apikey --username ADMIN --generate --name maas-kubevirt | sudo tee /etc/maas-kubevirt/api-key"
             " >/dev/null", SHIM, after=one_key_stored),
        Step(f"sudo maas-kubevirt --values {ETC} reconcile --once --dry-run", SHIM, after=dry_run_changed_nothing),
        Step("sudo systemctl restart maas-kubevirt && journalctl -u maas-kubevirt", SHIM, after=service_reconciled),
        Step(f"sudo maas-kubevirt --values {ETC} upload-script", SHIM, after=site_script_uploaded),
    ],
    "docs/how-to/monitor.md": [
        Step("sudoedit /etc/maas-kubevirt/values.yaml", SHIM, before=installed_site_then_metrics),
        Step("sudo systemctl restart maas-kubevirt", SHIM),
        Step("curl -s http://127.0.0.1:9639/metrics | grep '^maas_kubevirt_cycles_total'", RUN, after=metrics_scraped),
        Step("systemctl show -p Type,NotifyAccess,WatchdogUSec maas-kubevirt", SHIM, after=unit_is_notify),
    ],
    "docs/how-to/namespaces.md": [
        Step("kubectl create namespace tenant-a", CLUSTER, before=bundle_for_namespaces),
        Step("kubectl label namespace tenant-a maas.io/kubevirt-bmc=enabled mutatevirtualmachines.kubemacpool.io=allocate",
             CLUSTER),
        Step("kubectl -n tenant-a apply -f examples/pxe-vm.yaml", CLUSTER, after=web1_gets_its_bmc),
        Step("kubectl -n tenant-a patch virtualmachine web1 --type merge -p "
             "'{\"spec\":{\"runStrategy\":\"RerunOnFailure\"}}'", CLUSTER, after=web1_started_once),
        Step("kubectl label namespace tenant-a maas.io/kubevirt-bmc-", CLUSTER),
        Step("kubectl -n tenant-a delete secret,virtualmachinebmc,ingress,networkpolicy -l app.kubernetes.io/part-of=maas-kubevirt",
             CLUSTER, after=bmc_objects_gone),
        Step("kubectl -n tenant-a patch virtualmachine web1 --type json -p "
             "'[{\"op\": \"remove\", \"path\": \"/spec/template/spec/domain/firmware/serial\"}]'", CLUSTER,
             after=serial_removed),
    ],
    "docs/how-to/pools.md": [
        Step("kubectl create namespace pool-vms", CLUSTER, before=installed_site_without_pool_vms),
        Step("kubectl label namespace pool-vms maas.io/kubevirt-bmc=enabled mutatevirtualmachines.kubemacpool.io=allocate "
             "maas-kubevirt.io/pools=enabled", CLUSTER, after=pool_values_edited),
        Step("make VALUES=site.yaml", RUN, after=pools_rendered),
        Step("kubectl apply -k build/kubernetes/", CLUSTER, after=policies_ready, retry="requires permissions"),
        *POOLS_KUBECONFIG_STEPS,
        Step("kubectl --kubeconfig $KC auth can-i create virtualmachines -n pool-vms", CLUSTER, after=can_i_yes),
        Step("kubectl --kubeconfig $KC auth can-i get secrets -n pool-vms", CLUSTER, codes=(1,), after=can_i_no),
        Step("sudo install -m 0600 pools.kubeconfig /etc/maas-kubevirt/pools-kubeconfig", SHIM),
        *POOLS_CREDENTIAL_STEPS,
        Step("sudoedit /etc/maas-kubevirt/values.yaml", SHIM, before=pools_etc_values),
        Step("sudo systemctl daemon-reload && sudo systemctl restart maas-kubevirt", SHIM, after=pool_filled),
        Step("sudo maas-kubevirt --values /etc/maas-kubevirt/values.yaml compose small", SHIM, after=composed),
        Step("kubectl -n pool-vms get virtualmachines -l maas-kubevirt.io/pool=small", CLUSTER, after=pool_vms_listed),
    ],
    "docs/how-to/rotate.md": [
        Step("sudo maas-kubevirt --values /etc/maas-kubevirt/values.yaml rotate web1.vms", SHIM,
             before=installed_site_with_lease, after=rotated_by_hand),
        Step("install -m 0600 build/seed build/seed.old", RUN, before=old_seed),
        Step("install -m 0600 /dev/null build/seed.new", RUN),
        Step("python3 -c 'import secrets; print(secrets.token_hex(32))' >build/seed.new", RUN),
        Step("mv build/seed.new build/seed", RUN),
        Step(".venv/bin/maas-kubevirt --values site.yaml render --output build", RUN, after=new_seed_rendered),
        Step("kubectl apply -k build/kubernetes/", CLUSTER, after=cluster_has_the_new_seed, retry="requires permissions"),
        Step("sudo install -m 0600 build/seed /etc/maas-kubevirt/seed", SHIM),
        Step("sudo systemctl restart maas-kubevirt", SHIM, after=maas_has_the_new_passwords),
    ],
    "docs/how-to/run-reconciler.md": [
        Step("export MAAS_API_KEY=$(cat api-key)", MAAS, before=maas_site),
        Step(".venv/bin/maas-kubevirt --values site.yaml reconcile --dry-run", MAAS, after=planned_not_done),
        Step(".venv/bin/maas-kubevirt --values site.yaml reconcile --once", MAAS, after=reconciled),
        # Stopped by SIGTERM after 8 s (for_a_while): exit 0, or 143 if the signal came before the
        # loop took it over; systemd counts both as a clean stop.
        Step(".venv/bin/maas-kubevirt --values site.yaml reconcile", MAAS, before=a_vm_enlists_meanwhile,
             after=loop_reconciled, codes=(0, 143)),
        Step(".venv/bin/maas-kubevirt --values site.yaml status", MAAS, after=status_lists_them),
    ],
    "docs/how-to/seed-backup.md": [
        Step("install -m 0600 /dev/null build/seed", RUN, before=seed_lost),
        Step("kubectl -n maas-kubevirt get secret maas-kubevirt-seed -o jsonpath='{.data.seed}' | base64 -d >build/seed",
             CLUSTER, after=seed_recovered),
        Step("make VALUES=site.yaml", RUN, after=rendered_with_the_seed),
        Step("kubectl diff -f build/kubernetes/seed-secret.yaml", CLUSTER, after=no_difference),
    ],
    "docs/how-to/troubleshoot.md": [
        Step(".venv/bin/maas-kubevirt --values site.yaml status", MAAS, before=a_vm_stuck_in_new,
             after=placeholder_shown),
        Step(".venv/bin/maas-kubevirt --values site.yaml doctor", MAAS, codes=(1,), after=power_password_not_ok),
        Step("kubectl get clusterpolicy -l app.kubernetes.io/part-of=maas-kubevirt", CLUSTER, before=bundle_applied,
             after=every_policy_ready),
    ],
    "docs/how-to/uninstall.md": [
        Step("sudo systemctl stop maas-kubevirt", SHIM, before=installed_site, after=service_stopped),
        Step("sudo apt purge maas-kubevirt", SHIM, after=purged),
        Step("kubectl -n maas-kubevirt label configmap maas-kubevirt-rotations maas-kubevirt/allow-delete=true", CLUSTER,
             before=uninstall_cluster, after=labelled_for_delete),
        Step("kubectl delete -k build/kubernetes/", CLUSTER, after=bundle_deleted_bmc_kept),
        Step("kubectl delete secret,virtualmachinebmc,ingress,networkpolicy --all-namespaces "
             "-l app.kubernetes.io/part-of=maas-kubevirt", CLUSTER, after=all_bmc_objects_gone),
        Step("kubectl label namespace --all maas.io/kubevirt-bmc-", CLUSTER, after=unlabelled),
    ],
    "docs/how-to/upgrade-maas.md": [
        # On the region host, with the key the service uses (no administrator key on a workstation).
        Step(f"sudo maas-kubevirt --values {ETC} doctor", SHIM, before=installed_on_a_release_that_refuses_dns,
             codes=(1,), after=version_refused),
        Step(f"sudo maas-kubevirt --values {ETC} doctor", SHIM, before=maas_upgraded, codes=(0, 1), after=version_ok),
    ],
    "docs/how-to/upgrade.md": [
        Step("make VALUES=site.yaml", RUN, before=installed_site, after=rendered_with_site_yaml),
        Step("kubectl apply -k build/kubernetes/", CLUSTER, after=policies_ready, retry="requires permissions"),
        Step("make deb", RUN, after=built),
        Step("scp build/deb/maas-kubevirt_*_all.deb maas-region:", SHIM),
        Step("sudo apt install ~/maas-kubevirt_*_all.deb", SHIM, after=installed),
        Step("rm ~/maas-kubevirt_*_all.deb", RUN),
        Step("sudo systemctl restart maas-kubevirt", SHIM, after=service_running),
        Step(f"sudo maas-kubevirt --values {ETC} status", SHIM, after=upgraded_status),
        Step(f"sudo maas-kubevirt --values {ETC} upload-script", SHIM, after=script_still_the_render),
    ],
    "docs/tutorial.md": [
        Step("cp values.yaml site.yaml", RUN, before=fresh_clone, after=tutorial_site_edited),
        Step("make VALUES=site.yaml", RUN, after=tutorial_rendered),
        Step("install -D -m 0600 build/seed ~/maas-kubevirt-backup/seed", RUN, after=seed_backed_up),
        Step("kubectl create namespace tenant-a", CLUSTER),
        Step("kubectl label namespace tenant-a maas.io/kubevirt-bmc=enabled mutatevirtualmachines.kubemacpool.io=allocate "
             "maas-kubevirt.io/pools=enabled", CLUSTER),
        # Retried while a fresh Kyverno refuses the policies until it sees the RBAC applied with them.
        Step("kubectl apply -k build/kubernetes/", CLUSTER, retry="requires permissions"),
        Step("kubectl wait --for=condition=Ready clusterpolicy -l app.kubernetes.io/part-of=maas-kubevirt "
             "--timeout=120s", CLUSTER),
        Step("kubectl -n tenant-a apply -f examples/pxe-nad.yaml", CLUSTER, after=pxe_network_made),
        Step('openssl req -x509 -newkey rsa:2048 -nodes -days 825 -subj "/CN=*.tenant-a.bmc.example.com" '
             '-addext "subjectAltName=DNS:*.tenant-a.bmc.example.com" -keyout build/tenant-a-bmc.key '
             '-out build/tenant-a-bmc.crt', RUN),
        Step("kubectl -n maas-kubevirt-bmc create secret tls tenant-a-bmc-tls --cert build/tenant-a-bmc.crt "
             "--key build/tenant-a-bmc.key", CLUSTER),
        Step("kubectl apply -f examples/bmc-gateway.yaml", CLUSTER, after=gateway_stored),
        Step("kubectl -n maas-kubevirt-bmc get service maas-kubevirt-bmc-proxy", CLUSTER, after=proxy_service_listed),
        *POOLS_KUBECONFIG_STEPS,
        Step("sudo apt-get build-dep ./", SHIM),
        Step("make deb", RUN, after=built),   # DEB_BUILD_OPTIONS=nocheck: test_deb runs the package's tests
        Step("scp build/seed pools.kubeconfig build/deb/maas-kubevirt_*_all.deb site.yaml maas-region:", SHIM,
             after=copied_to_the_region),
        Step("sudo apt install ~/maas-kubevirt_*_all.deb", SHIM, after=installed),
        Step("sudo install -m 0644 ~/site.yaml /etc/maas-kubevirt/values.yaml", SHIM),
        Step("sudoedit /etc/maas-kubevirt/values.yaml", SHIM, before=region_seed_file),
        Step("sudo install -m 0600 ~/seed /etc/maas-kubevirt/seed", SHIM),
        Step("sudo install -m 0600 ~/pools.kubeconfig /etc/maas-kubevirt/pools-kubeconfig", SHIM),
        Step("rm ~/seed ~/pools.kubeconfig ~/site.yaml ~/maas-kubevirt_*_all.deb", RUN, after=seed_moved),
        *POOLS_CREDENTIAL_STEPS,
        Step("sudo install -m 0600 /dev/null /etc/maas-kubevirt/api-key", SHIM),
        Step("sudo maas apikey --username ADMIN --generate --name maas-kubevirt | sudo tee /etc/maas-kubevirt/api-key"
             " >/dev/null", SHIM, after=one_key_stored),
        Step("sudo systemctl daemon-reload && sudo systemctl restart maas-kubevirt && journalctl -u maas-kubevirt", SHIM,
             after=service_started),
        Step(f"sudo maas-kubevirt --values {ETC} upload-script", SHIM, after=tutorial_script_uploaded),
        Step('maas login admin http://localhost:5240/MAAS/ "$(sudo maas apikey --username ADMIN --generate --name cli)"',
             SHIM),
        Step("maas admin maas get-config name=enlist_commissioning", SHIM, after=enlist_commissioning_on),
        # The thread plays the VM from the moment compose makes it (the_composed_vm_boots).
        Step(f"sudo maas-kubevirt --values {ETC} compose web --name web-1", SHIM, before=the_composed_vm_boots,
             after=web_1_composed),
        Step(f"maas-kubevirt --values {ETC} check-route web-1.tenant-a", SHIM, before=proxy_stands_in,
             after=route_checked),
        # compose --wait polls MAAS every 5 s.
        Step(f"sudo maas-kubevirt --values {ETC} compose web --name web-1 --wait -o json | tee ~/web.json", SHIM,
             after=composed_ready, timeout=300),
        Step("SYSTEM_ID=$(python3 -c 'import json, sys; print(json.load(sys.stdin)[\"system_id\"])' <~/web.json)", SHIM),
        Step("maas admin machine deploy $SYSTEM_ID", SHIM, after=composed_deploying),
        Step(f"sudo maas-kubevirt --values {ETC} status", SHIM, after=composed_deployed),
        Step(f"sudo maas-kubevirt --values {ETC} decompose web-1-tenant-a --force", SHIM, after=decomposed),
        Step("sudo systemctl stop maas-kubevirt", SHIM, after=service_stopped),
        Step("maas admin node-script delete 31-kubevirt-bmc-config", SHIM, after=script_deleted),
        Step('sudo maas apikey --username ADMIN --delete "$(sudo cat /etc/maas-kubevirt/api-key)"', SHIM,
             after=key_deleted),
        Step("sudo maas apikey --username ADMIN --delete \"$(maas list | awk '$1 == \"admin\" {print $3}')\"", SHIM,
             after=key_deleted),
        Step("maas logout admin", SHIM, after=logged_out),
        Step("sudo apt purge maas-kubevirt", SHIM),
        Step("rm ~/web.json", RUN, after=tutorial_purged),
        Step("kubectl delete -f examples/bmc-gateway.yaml", CLUSTER, after=tutorial_gateway_gone),
        Step("kubectl -n maas-kubevirt-bmc delete secret tenant-a-bmc-tls", CLUSTER, after=tutorial_secret_gone),
        Step("kubectl -n maas-kubevirt label configmap maas-kubevirt-rotations maas-kubevirt/allow-delete=true", CLUSTER,
             after=labelled_for_delete),
        Step("kubectl delete -k build/kubernetes/", CLUSTER, after=tutorial_bundle_deleted),
        Step("kubectl delete namespace tenant-a", CLUSTER, after=tenant_a_gone),
        Step("rm -r build site.yaml pools.kubeconfig ca.crt ~/maas-kubevirt-backup", RUN,
             after=nothing_of_the_tutorial_left),
    ],
    "docs/how-to/pxe-network.md": [
        Step("kubectl -n tenant-a apply -f examples/pxe-nad.yaml", CLUSTER, before=tenant_a_opted_in,
             after=pxe_network_made),
    ],
    "docs/reference/prerequisites.md": [
        Step(command, CHECKED, check=check) for command, check in PREREQUISITE_CHECKS
    ],
    "docs/reference/doctor.md": [
        Step(".venv/bin/maas-kubevirt --values site.yaml doctor", MAAS, before=doctor_site, codes=(0, 1),
             after=doctor_rows_are_documented),
        Step(".venv/bin/maas-kubevirt --values site.yaml doctor --kubeconfig ~/.kube/config -o json", CLUSTER,
             before=kube_config_home, codes=(0, 1), after=doctor_json_rows_are_documented),
    ],
}


# --- the tests ---------------------------------------------------------------------------------

def test_every_command_has_a_runner():
    """Each page's commands are exactly those RUNNERS lists for it, in the same order."""
    problems = []
    for page in PAGES:
        found = commands(page)
        steps = RUNNERS.get(page, [])
        for index, command in enumerate(found):
            if index >= len(steps) or steps[index].command != command.text:
                problems.append(f"{command}: no runner covers this command at this place "
                                f"(RUNNERS[{page!r}][{index}] is "
                                f"{steps[index].command if index < len(steps) else 'missing'!r})")
                break
        else:
            if len(steps) > len(found):
                problems.append(f"{page}: RUNNERS lists {steps[len(found)].command!r}, which the page no longer has")
    assert not [p for p in RUNNERS if p not in PAGES], "RUNNERS names a page that does not exist"
    assert not problems, "\n".join(problems)


def test_checked_only_commands_are_marked_in_their_page():
    """A command that is checked, not run, says so in its page: `<!-- docs-test: checked-only:
    COMMAND (why) -->` before its block; and a marker names a command the test only checks."""
    for page in PAGES:
        text = (ROOT / page).read_text()
        marked = re.findall(r"^<!-- docs-test: checked-only: (.+?) \(.*?\) -->$", text, re.M)
        checked = [s.command for s in RUNNERS.get(page, []) if s.how == CHECKED]
        assert sorted(marked) == sorted(checked), f"{page}: marked {marked}, checked {checked}"


# Each of these recipes was once in a page, and wrong (issue 32 item 4).
RENDERS_THE_DEFAULTS = {
    ("README.md", "make"): "the quick start builds the bundle from the built-in defaults, and says so",
}


def test_every_render_uses_the_sites_values():
    """A render on a page names the site's values (`--values FILE`, `make VALUES=FILE`): followed
    as written, a render without them applies the built-in defaults (bmc.example.com, the RFC 1918
    ranges) to the cluster."""
    problems = []
    for page in PAGES:
        for command in commands(page):
            text = command.text
            renders = re.search(r"maas-kubevirt\b.*\srender\b", text) or re.fullmatch(r"make(\s+(all|build))?", text)
            renders = renders or (re.match(r"make\b", text) and "VALUES=" in text)
            if not renders or (page, text) in RENDERS_THE_DEFAULTS:
                continue
            if "--values" not in text and "VALUES=" not in text:
                problems.append(f"{command}: renders without the site's values (--values FILE)")
    assert not problems, "\n".join(problems)


def commands_under_headings() -> list[tuple[str, object]]:
    """Every command of every page, with the heading of the section it is in."""
    found = []
    for page in PAGES:
        headings = {}
        heading = ""
        for number, line in enumerate((ROOT / page).read_text().splitlines(), 1):
            heading = line.lstrip("#").strip() if re.match(r"#{1,4} ", line) else heading
            headings[number] = heading
        found += [(headings[command.line], command) for command in commands(page)]
    return found


# Issue 43: install.md built the package on the region host and uploaded the script from the
# workstation with an exported key, the tutorial the other way round. The procedure is one.
PACKAGE_BUILD = re.compile(r"make deb\b")
SCRIPT_UPLOAD = "sudo maas-kubevirt --values /etc/maas-kubevirt/values.yaml upload-script"


def test_one_procedure_builds_the_package_and_uploads_the_script():
    """The package is built on the workstation (a heading says so), and the script is uploaded on
    the region host by the installed package, with the key the service uses; no page has another way."""
    problems, builds, uploads = [], 0, 0
    for heading, command in commands_under_headings():
        if PACKAGE_BUILD.search(command.text):
            builds += 1
            if "(workstation" not in heading:
                problems.append(f"{command}: the package is built on the workstation, not under {heading!r}")
        if "upload-script" in command.text or "node-scripts create" in command.text:
            uploads += 1
            if command.text != SCRIPT_UPLOAD or "region host" not in heading:
                problems.append(f"{command}: the script is uploaded on the region host with `{SCRIPT_UPLOAD}`, "
                                f"not so under {heading!r}")
    assert builds and uploads, "no page builds the package or uploads the script: this test checks nothing"
    assert not problems, "\n".join(problems)


def key_file_recipes() -> list[tuple[str, str]]:
    """Every `maas apikey` whose output goes into a file, in the pages and README.Debian."""
    found = [(str(c), c.text) for page in PAGES for c in commands(page)]
    debian = ROOT / "debian" / "README.Debian"
    found += [(f"debian/README.Debian:{n}", line.strip()) for n, line in enumerate(debian.read_text().splitlines(), 1)]
    return [(where, text) for where, text in found
            if "maas apikey" in text and "--delete" not in text and re.search(r"[|>]", text)]


def test_every_key_file_recipe_stores_one_key():
    """`maas apikey --username U` prints every key U has, one per line, and the CLI refuses a key
    file of two lines (exit 2, which the unit does not restart from): a recipe that fills a key file
    generates one key."""
    recipes = key_file_recipes()
    assert recipes, "no page stores a MAAS API key: this test checks nothing"
    assert not [f"{where}: {text}" for where, text in recipes if "--generate" not in text.split("|")[0]]


def test_no_page_says_the_bmc_is_reached_over_plain_http():
    """MAAS's Redfish driver prepends https:// to the power address: values.yaml once said that
    without TLS settings the Ingress serves plain HTTP, which MAAS cannot use."""
    said = [f"{name}:{number}: {line.strip()}" for name in (*PAGES, "values.yaml")
            for number, line in enumerate((ROOT / name).read_text().splitlines(), 1)
            if re.search(r"\bserves? (only )?plain HTTP|plain HTTP only", line)]
    assert not said, "\n".join(said)


def test_no_file_cites_a_page_the_repository_does_not_hold():
    """A user's clone holds only the repository: a comment, docstring or page citing a `NAME.md`
    (once DESIGN.md, FIELD-NOTES) must name a file in it; a cited path (`docs/design.md`, moved to
    docs/explanation/) must be that file's, from the top of the tree or from the citing file."""
    tracked = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.split()
    pages = {path for path in tracked if path.endswith(".md") and (ROOT / path).exists()}
    names = {Path(path).name for path in pages}

    def held(name: str, citing: str) -> bool:
        if "/" not in name.strip("./") or name.startswith("/"):   # /usr/share/doc/...: installed by the package
            return Path(name).name in names
        return os.path.normpath(name) in pages or os.path.normpath(os.path.join(os.path.dirname(citing), name)) in pages
    cited = []
    for path in tracked:
        if path == "tests/test_docs.py" or (
                not path.endswith((".py", ".md", ".j2", ".yaml", ".sh", ".Debian")) and not path.startswith(("tools/", "debian/"))):
            continue
        try:
            text = (ROOT / path).read_text()
        except (UnicodeDecodeError, IsADirectoryError, FileNotFoundError):
            continue
        for number, line in enumerate(text.splitlines(), 1):
            line = line.replace("\\-", "-")   # troff's escaped hyphen (debian/*.h2m)
            for name in re.findall(r"(?<![\w./-])[\w./-]*[A-Za-z0-9_-]\.md\b", line):
                if not held(name, path):
                    cited.append(f"{path}:{number}: {name}")
            if "FIELD-NOTES" in line:
                cited.append(f"{path}:{number}: FIELD-NOTES")
    assert not cited, "\n".join(cited)


def test_the_example_vm_can_pxe_boot_into_maas():
    """examples/pxe-vm.yaml (admitted on the control plane by docs/how-to/namespaces.md's run): a bridge on
    the PXE segment first in the boot order, MAAS's to power (Halted), a disk to deploy onto, and
    a name that can name a kubevirtBMC Service."""
    from maas_kubevirt import identity

    documents = {d["kind"]: d for d in yaml.safe_load_all((ROOT / "examples" / "pxe-vm.yaml").read_text()) if d}
    vm = documents["VirtualMachine"]
    spec = vm["spec"]["template"]["spec"]
    interfaces, disks = spec["domain"]["devices"]["interfaces"], spec["domain"]["devices"]["disks"]
    assert vm["spec"]["runStrategy"] == "Halted" and "running" not in vm["spec"]
    assert [i.get("bootOrder") for i in interfaces][0] == 1 and "bridge" in interfaces[0]
    assert all(d.get("bootOrder", 99) > 1 for d in disks)
    networks = {n["name"]: n for n in spec["networks"]}
    assert "multus" in networks[interfaces[0]["name"]] and "pod" not in networks[interfaces[0]["name"]]
    assert all("macAddress" not in i for i in interfaces), "KubeMacPool gives the MAC: a fixed one would be shared by copies"
    claim = next(v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"] if "persistentVolumeClaim" in v)
    assert claim == documents["PersistentVolumeClaim"]["metadata"]["name"]
    assert "namespace" not in vm["metadata"], "the namespace is the operator's choice (kubectl -n)"
    identity.redfish_host(vm["metadata"]["name"], "tenant-a", "bmc.example.com")
    assert len(vm["metadata"]["name"]) <= 55 and "." not in vm["metadata"]["name"]


def test_the_package_installs_every_page():
    """The Debian package's docs (debian/maas-kubevirt.docs) hold the README and every page."""
    listed = (ROOT / "debian" / "maas-kubevirt.docs").read_text().split()
    for page in PAGES:
        assert page in listed or page.split("/")[0] in listed, f"{page} is not installed by the package"


def test_links_between_pages_resolve():
    """Every relative link of a page names a page that exists, and an anchor it has."""
    def anchors(page: str) -> set[str]:
        heads = re.findall(r"^#+ (.*)$", (ROOT / page).read_text(), re.M)
        return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", (ROOT / page).read_text()):
            if re.match(r"\w+://", target):
                continue
            path, _, anchor = target.partition("#")
            resolved = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            assert (ROOT / resolved).exists(), f"{page}: link to {target}: no such file"
            if anchor:
                assert anchor in anchors(resolved), f"{page}: link to {target}: no such heading"


def sandbox(tmp_path: Path, name: str) -> Page:
    page = Page(name, tmp_path)
    page.repo = copy_tree(tmp_path / "repo")
    venv_bin = page.repo / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    # This tree's CLI from the copy's own src/ (so its data files are the copy's), with the tests'
    # Python and libraries; .installed newer than pyproject.toml, so make installs nothing.
    cli = venv_bin / "maas-kubevirt"
    cli.write_text(f"#!/bin/sh\nPYTHONPATH={quote(page.repo / 'src')} exec {quote(sys.executable)} -m maas_kubevirt \"$@\"\n")
    cli.chmod(0o755)
    (page.repo / ".venv" / ".installed").touch()
    os.utime(page.repo / "pyproject.toml", (time.time() - 60, time.time() - 60))
    (tmp_path / "home").mkdir()
    page.env = {k: v for k, v in os.environ.items()
                if k not in ("MAAS_API_KEY", "CREDENTIALS_DIRECTORY", "MAAS_KUBEVIRT_DATA", "KUBECONFIG",
                             "VALUES", "BUILD", "VENV", "MAKEFLAGS", "MFLAGS")}
    page.env.update(HOME=str(tmp_path / "home"), LC_ALL="C.UTF-8")
    page.shell = Shell(page.repo, page.env, tmp_path / "state.sh")
    return page


def run_page(page: Page) -> None:
    # Every page assumes the README's quick start: `make` has rendered build/ with its seed.
    page.shell.run(Command("README.md", commands("README.md")[0].line, "make"))
    run_steps(page, page.name)


def run_steps(page: Page, name: str) -> None:
    """The commands of page `name`, in order, each as its Step says, in this page's sandbox (a
    page run before another's, as the state that page starts from)."""
    steps = RUNNERS[name]
    found = commands(name)
    assert [c.text for c in found] == [s.command for s in steps], "see test_every_command_has_a_runner"
    for command, step in zip(found, steps):
        if step.before:
            step.before(page)
        page.shell.env = page.env
        text = step.check if step.how == CHECKED else None
        if step.how == MAAS and command.text.endswith(" reconcile"):
            text = for_a_while(command.text)
        deadline = time.monotonic() + SETTLE
        while True:
            try:
                result = page.shell.run(command, codes=step.codes, text=text, timeout=step.timeout)
                break
            except CommandFailed as failure:
                if not step.retry or step.retry not in str(failure) or time.monotonic() > deadline:
                    raise
                time.sleep(2)
        if step.after:
            try:
                step.after(page, result)
            except AssertionError as error:
                raise AssertionError(f"{command}: ran, but {error}\n--- stdout ---\n{result.stdout[-3000:]}"
                                     f"\n--- stderr ---\n{result.stderr[-3000:]}") from None


@pytest.fixture
def double():
    with MaasDouble() as running:
        yield running


def test_readme(tmp_path):
    run_page(sandbox(tmp_path, "README.md"))


def test_development(tmp_path):
    run_page(sandbox(tmp_path, "docs/development.md"))


def test_prerequisites_page(tmp_path):
    """Its commands are all checked-only: each names the release upstream.lock.yaml pins."""
    run_page(sandbox(tmp_path, "docs/reference/prerequisites.md"))


@pytest.mark.parametrize("name", ["run-reconciler"])
def test_maas_page(tmp_path, double, name):
    page = sandbox(tmp_path, f"docs/how-to/{name}.md")
    page.double = double
    run_page(page)


def without_tenant_a(page: Page) -> None:
    kubectl(page, "delete", "namespace", "tenant-a", "--ignore-not-found", "--wait=false", check=False)


@pytest.mark.parametrize("name", ["namespaces", "change-values", "seed-backup", "pxe-network"])
def test_cluster_page(tmp_path, control_plane, name):
    page = sandbox(tmp_path, f"docs/how-to/{name}.md")
    with_cluster(page, control_plane)
    try:
        run_page(page)
    finally:
        without_tenant_a(page)


def test_troubleshoot(tmp_path, double, control_plane):
    page = sandbox(tmp_path, "docs/how-to/troubleshoot.md")
    page.double = double
    with_cluster(page, control_plane)
    run_page(page)


def test_gateway(tmp_path, control_plane):
    page = sandbox(tmp_path, "docs/how-to/gateway.md")
    with_cluster(page, control_plane)
    try:
        run_page(page)
    finally:
        # Back to no policies: the next user of the control plane applies its own render afresh.
        without_tenant_a(page)
        kubectl(page, "delete", "namespace", BMC_NAMESPACE, "--ignore-not-found", "--wait=false", check=False)
        kubectl(page, "delete", "clusterpolicy", "-l", "app.kubernetes.io/part-of=maas-kubevirt", "--wait=true",
                check=False)


def with_cluster(page: Page, plane) -> None:
    page.plane = plane
    bin_dir = page.tmp / "cluster-bin"
    bin_dir.mkdir()
    (bin_dir / "kubectl").symlink_to(plane.bin_dir / "kubectl")
    page.env["PATH"] = f"{bin_dir}:{page.env['PATH']}"
    # An administrator's kubeconfig as most clusters hand it out: certificates embedded (the
    # tier's names files; the lease's commands read the CA from certificate-authority-data).
    flat = page.tmp / "admin.kubeconfig"
    flat.write_text(plane.kubectl("config", "view", "--raw", "--flatten").stdout)
    flat.chmod(0o600)
    page.env["KUBECONFIG"] = str(flat)


def test_reference_doctor(tmp_path, double, control_plane):
    page = sandbox(tmp_path, reference_pages.DOCTOR_PAGE)
    page.double = double
    with_cluster(page, control_plane)
    run_page(page)


def namespace_prefix(page: Page) -> list[str]:
    """A private mount namespace, held open by a sleeping process, with /etc and /var/log as
    overlays (writes land under tmp), that every command of the page enters."""
    require(shutil.which("unshare") and shutil.which("nsenter") and os.geteuid() == 0,
            "the package steps run in a private mount namespace: they need root, unshare and nsenter")
    for tool in ("dpkg-deb", "dpkg-buildpackage", "dpkg-checkbuilddeps", "dpkg-parsechangelog", "git"):
        require(shutil.which(tool) is not None, f"{tool} is not installed (apt-get install dpkg-dev git)")
    deps = subprocess.run(["dpkg-checkbuilddeps"], cwd=ROOT, capture_output=True, text=True)
    require(deps.returncode == 0, f"the package's build dependencies are missing (apt-get build-dep ./): "
            f"{deps.stderr.strip()}")
    mounts = []
    for target in ("/etc", "/var/log"):
        base = page.tmp / "overlay" / target.strip("/").replace("/", "-")
        (base / "upper").mkdir(parents=True)
        (base / "work").mkdir()
        mounts.append(f"mount -t overlay overlay -o lowerdir={target},upperdir={base}/upper,workdir={base}/work {target}")
    ready = page.tmp / "namespace-ready"
    holder = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c",
                               " && ".join(mounts) + f" && touch {quote(ready)} && exec sleep 3600"],
                              start_new_session=True)
    page.notes["holder"] = holder
    eventually(lambda: ready.exists() or holder.poll() is not None, "the mount namespace is ready", timeout=10)
    require(ready.exists(), "could not make a private mount namespace with overlays on /etc and /var/log")
    # (not nsenter --wd: that directory would stay the one outside, another mount: EXDEV on rename)
    return ["nsenter", "-t", str(holder.pid), "-m", "--", "env", f"--chdir={page.repo}"]


def region_host(tmp_path: Path, name: str, double, control_plane) -> Page:
    """A page whose commands run on a region host: in its own mount namespace, with the shims of
    tests/docs_shims.py in front of PATH and the double as the region's MAAS."""
    page = sandbox(tmp_path, name)
    page.double = double
    with_cluster(page, control_plane)
    prefix = namespace_prefix(page)
    shims = docs_shims.install(tmp_path / "shims")
    page.edits = tmp_path / "edits.json"
    page.env.update(
        DOCS_REAL_PATH=page.env["PATH"], PATH=f"{shims}:{page.env['PATH']}", DOCS_CALLS=str(tmp_path / "calls"),
        DOCS_PKGROOT=str(tmp_path / "pkgroot"), DOCS_EDITS=str(page.edits), DOCS_JOURNAL=str(tmp_path / "journal" / "log"),
        DOCS_PIDS=str(tmp_path / "pids"), DOCS_MAAS_KEY=double.api_key_text, DOCS_START_TIMEOUT="60",
        DOCS_MAAS_SOURCE=str(maas_source()), DOCS_MAAS_URL=double.url,
        DOCS_MAAS_PROFILES=str(tmp_path / "maas-profiles.json"), DOCS_REGION_HOME=str(tmp_path / "home"),
        DOCS_MAAS_DELETED=str(tmp_path / "maas-keys-deleted"),
        DEB_BUILD_OPTIONS="nocheck")
    (tmp_path / "journal").mkdir()
    page.shell = Shell(page.repo, page.env, tmp_path / "state.sh", prefix=prefix)
    return page


def run_on_region_host(page: Page) -> None:
    try:
        run_page(page)
        assert not json.loads(page.edits.read_text()), "a queued edit was not made by the page's sudoedit"
    finally:
        # The service stops as systemd stops it (SIGTERM: it releases the Lease), then anything left.
        page.shell.run("systemctl stop maas-kubevirt", codes=(0, 1))
        kubectl(page, "-n", "maas-kubevirt", "delete", "lease", "maas-kubevirt-reconciler", "--ignore-not-found",
                check=False)
        without_tenant_a(page)
        pids = (page.tmp / "pids").read_text().split() if (page.tmp / "pids").exists() else []
        for pid in pids:
            try:
                os.killpg(int(pid), signal.SIGTERM)
            except ProcessLookupError:
                pass
        holder = page.notes["holder"]
        holder.terminate()
        holder.wait(10)


def test_tutorial(tmp_path, double, control_plane):
    """docs/tutorial.md, from a clone to a deployed VM: the workstation's and the region host's
    commands in one private mount namespace (the region host is this machine, its MAAS the double),
    the cluster's on the control plane, which needs the Gateway API CRDs (TRAEFIK)."""
    require(control_plane.traefik is not None, control_plane.traefik_missing)
    page = region_host(tmp_path, TUTORIAL, double, control_plane)
    try:
        run_on_region_host(page)
    finally:
        if "responder" in page.notes:
            page.notes["responder"].stop()
        # Back to no policies and none of the tutorial's namespaces, for the next user of the control plane.
        for namespace in ("tenant-a", BMC_NAMESPACE):
            kubectl(page, "delete", "namespace", namespace, "--ignore-not-found", "--wait=false", check=False)
        kubectl(page, "delete", "clusterpolicy", "-l", "app.kubernetes.io/part-of=maas-kubevirt", "--wait=true",
                check=False)


# Issue 43: the tutorial took 37 steps; each now says where it runs, and there are at most 20.
TUTORIAL_STEP = re.compile(r"^## (\d+)\. (.+) \((workstation|cluster|region host|DNS server)\)$")
TUTORIAL_MAX_STEPS = 20


def test_the_tutorial_counts_at_most_20_steps_each_saying_where_it_runs():
    """Every section after "What you need" is a numbered step, 1 to N without a gap, N <= 20, whose
    heading names where it runs; every command of the page is in a step, and the last steps remove
    what it made."""
    text = (ROOT / TUTORIAL).read_text()
    headings = re.findall(r"^## .+$", text, re.M)
    assert headings[0] == "## What you need", headings[0]
    steps = [TUTORIAL_STEP.match(heading) for heading in headings[1:]]
    assert all(steps), [h for h, m in zip(headings[1:], steps) if not m]
    assert [int(m[1]) for m in steps] == list(range(1, len(steps) + 1))
    assert len(steps) <= TUTORIAL_MAX_STEPS, f"{len(steps)} steps"
    assert f"in {len(steps)} steps" in text, "the introduction counts the steps otherwise"
    under = {heading for heading, command in commands_under_headings() if command.page == TUTORIAL}
    assert "What you need" not in under and "Your first KubeVirt VM in MAAS" not in under
    assert [m[2] for m in steps[-3:]] == ["Remove MAAS's side", "Remove the cluster's side", "Remove the DNS record"]


def test_the_tutorial_states_no_release_of_its_own():
    """The releases are stated once, in prerequisites.md (from upstream.lock.yaml): the tutorial
    links there and names none itself."""
    text = (ROOT / TUTORIAL).read_text()
    assert "reference/prerequisites.md" in text
    named = re.findall(r"(?<![\d.])v?\d+\.\d+\.\d+(?![\d.])|\b\d+\.\d+(?:\.\d+)? or later\b", text)
    assert not named, f"{TUTORIAL} names releases: {named}"


def test_the_tutorial_tabulates_the_states_of_its_picture():
    """Issue 43 item 5: the tutorial shows the machine's states as a table of who acts and how
    long, one row per state of docs/diagrams/machine-states.dot, in its order."""
    text = (ROOT / TUTORIAL).read_text()
    assert "diagrams/machine-states.svg" in text
    rows = re.findall(r"^\| (\w+) \| ([^|]+) \| ([^|]+) \|$", text, re.M)
    states = [state for state, _, _ in rows if state != "State"]
    dot = (ROOT / "docs" / "diagrams" / "machine-states.dot").read_text()
    assert states == re.findall(r"-> (\w+) \[", dot), states
    assert all(who.strip() and how.strip() for state, who, how in rows)


def source_ranges_in_pages() -> list[tuple[str, str]]:
    """Every CIDR a page's YAML gives as ingress.source_ranges, with its page."""
    found = []
    for page in PAGES:
        for block in re.findall(r"^```yaml\n(.*?)^```$", (ROOT / page).read_text(), re.M | re.S):
            ranges = (yaml.safe_load(block) or {}).get("ingress", {}).get("source_ranges", [])
            found += [(page, cidr) for cidr in ranges]
    return found


def test_every_page_narrows_source_ranges_to_single_addresses():
    """The tutorial said /24 and dns-tls.md one /32 per rack controller: every example is one address."""
    import ipaddress

    found = source_ranges_in_pages()
    assert found, "no page sets ingress.source_ranges: this test checks nothing"
    wide = [(page, cidr) for page, cidr in found if ipaddress.ip_network(cidr).num_addresses != 1]
    assert not wide, wide


@pytest.mark.parametrize("name", ["install", "monitor", "ha", "rotate", "upgrade", "uninstall", "pools", "upgrade-maas"])
def test_region_host_page(tmp_path, double, control_plane, name):
    run_on_region_host(region_host(tmp_path, f"docs/how-to/{name}.md", double, control_plane))


def maas_source() -> Path | str:
    for found in sorted(Path.home().glob(".cache/maas-kubevirt/maas-*/maas")):
        return found
    return ""


def test_the_shims_refuse_what_does_not_exist(tmp_path):
    """A shim must be able to fail: each refuses a call that reality would refuse (fast: no namespace)."""
    shims = docs_shims.install(tmp_path / "shims")
    (tmp_path / "pkgroot").mkdir()
    env = {**os.environ, "DOCS_CALLS": str(tmp_path / "calls"), "DOCS_PKGROOT": str(tmp_path / "pkgroot"),
           "DOCS_EDITS": str(tmp_path / "edits.json"), "DOCS_JOURNAL": str(tmp_path / "journal"),
           "DOCS_PIDS": str(tmp_path / "pids"), "DOCS_MAAS_KEY": "a:b:c", "DOCS_REAL_PATH": os.environ["PATH"],
           "DOCS_MAAS_SOURCE": "", "DOCS_MAAS_PROFILES": str(tmp_path / "profiles.json")}
    (tmp_path / "profiles.json").write_text(json.dumps({"region": {"url": docs_shims.REGION_URL, "credentials": "a:b:c"}}))
    (tmp_path / "deb").mkdir()
    (tmp_path / "deb" / "maas-kubevirt_0.0.0_all.deb").write_text("")
    refused = {
        "sudo tee /etc/passwd": "neither shipped by the package nor removed by its postrm",
        "sudo -u nobody true": "no option",
        "sudo maas-kubevirt --help": "not installed",
        "sudoedit /etc/hostname": "no edit of /etc/hostname is queued",
        "apt install ./deb/maas-kubevirt_0.0.0_all.deb": "is not this tree's package",
        "apt purge maas-kubevirt": "maas-kubevirt is not installed",
        "apt remove maas-kubevirt": "and `apt purge maas-kubevirt` are covered",
        "apt-get install maas-kubevirt": "only `apt-get build-dep ./`",
        "systemctl restart maas-kubevirt": "is not installed",
        "systemctl enable --now maas-kubevirt": "only daemon-reload and restart/stop",
        "journalctl -f": "only `journalctl -u maas-kubevirt`",
        "maas login admin http://localhost:5240/MAAS/": "only `maas login PROFILE URL KEY`",
        "maas login admin http://maas.example.com:5240/MAAS/ a:b:c": "only the region host's own API",
        "maas admin machines read": "no profile 'admin'",
        "maas region machine release abc123": "only maas get-config, machines read, machine deploy, node-script "
                                              "delete are covered",
        "maas region node-script delete": "needs a NAME",
        "maas apikey --username admin --delete x:y:z": "No matching api key found",
        "maas logout nobody": "only `maas logout PROFILE` of a profile logged in",
        "maas list all": "only `maas list` is covered",
        "maas-kubevirt --help": "not installed",
        "maas region machine deploy": "needs a SYSTEM_ID",
        "maas apikey --username admin --name x": "only `maas apikey --username NAME [--generate",
        "scp -r deb region:": "only `scp FILE... HOST:`",
        "scp deb region:/tmp/": "the destination must be HOST:",
        "scp no-such-file region:": "No such file or directory",
    }
    for command, reason in refused.items():
        name, *args = command.split()
        result = subprocess.run([str(shims / name), *args], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert result.returncode != 0 and reason in result.stderr, (command, result.stderr)
    # As MAAS's apikey: every key of the user without --generate (a key file made of that holds two).
    listed = subprocess.run([str(shims / "maas"), "apikey", "--username", "admin"], env=env, capture_output=True,
                            text=True, check=True).stdout.splitlines()
    generated = subprocess.run([str(shims / "maas"), "apikey", "--username", "admin", "--generate", "--name", "mk"],
                               env=env, capture_output=True, text=True, check=True).stdout.splitlines()
    assert len(listed) == 2 and generated == ["a:b:c"], (listed, generated)
    # The service's unit installed: a restart needs its credentials' files, and drop-ins reloaded.
    unit = tmp_path / "pkgroot" / "lib" / "systemd" / "system" / "maas-kubevirt.service"
    unit.parent.mkdir(parents=True)
    unit.write_text("[Service]\nLoadCredential=api-key:" + str(tmp_path / "no-such-key") + "\nExecStart=/usr/bin/maas-kubevirt\n")
    result = subprocess.run([str(shims / "systemctl"), "restart", "maas-kubevirt"], env=env, capture_output=True, text=True)
    assert result.returncode == 1 and "does not exist: the unit would fail to start" in result.stderr, result.stderr
    assert [json.loads(line)[0] for line in (tmp_path / "calls").read_text().splitlines()][-1] == "systemctl"
