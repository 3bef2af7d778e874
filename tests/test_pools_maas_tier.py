"""Warm pools end to end (issue 42 item 8): the control-plane tier (Kyverno's own controllers, the
bundle rendered with pools) beside MAAS's own region, on the pinned release and on MAAS 3.8 on.

The reconciler is built as loop.py builds it: MAAS's region, the values' audit log, and the pool
stage on a token of the ServiceAccount maas-kubevirt-pools. No KubeVirt, KubeMacPool or CDI runs:
``VMStandIn`` does for each VM a pool made what the VM would (its MAC set as KubeMacPool's webhook
sets it, the rendered commissioning script run for the serial Kyverno stamped, the enlistment),
and ``finish_commissioning`` stands for the commissioning scripts. MAAS's power actions go to the
rack stand-in (realmaas.py), so a release completes as on a site: MAAS powers the VM off through
its Redfish driver, and the power state it reads back ends the release. Every case asserts from
MAAS's API and the API server, never from the reconciler's own account.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from controlplane import KubectlError, _kubeconfig
from realmaas import BMC_DOMAIN
from test_controlplane import apply, default_values, delete_policies, install, new_seed_file, render_bundle
from test_real_maas import CLI, run_script

from maas_kubevirt import identity, loop, policies
from maas_kubevirt.audit import Audit
from maas_kubevirt.kube import Cluster, KubeError
from maas_kubevirt.maas import client_from_values
from maas_kubevirt.paths import SCRIPT_NAME
from maas_kubevirt.pools.spec import NAMESPACE_LABEL, POOL_LABEL
from maas_kubevirt.reconcile import Passwords, Reconciler, Settings
from maas_kubevirt.values import load_values

pytestmark = pytest.mark.pool_releases

NAMESPACE = "pools-tier"
SMALL_TAGS = ("small", "warm")
POOLS = [
    {"name": "small", "namespace": NAMESPACE, "cores": 1, "memory": "1Gi", "disk": "1Gi",
     "storage_class": "standard", "network": "pxe", "ready": 2, "max": 3, "tags": ["warm"]},
    # Made only by compose (ready 0); a release leaves it a spare.
    {"name": "steady", "namespace": NAMESPACE, "cores": 1, "memory": "1Gi", "disk": "1Gi",
     "storage_class": "standard", "network": "pxe", "ready": 0, "max": 1, "on_release": "keep"},
]
INTERFACE_MAC = "/spec/template/spec/domain/devices/interfaces/0/macAddress"
# KubeMacPool hands out locally administered unicast MACs (its default range starts 02:...); the
# other tiers' machines use 52:54:00:..., so none of theirs is ever one of these.
_macs = itertools.count(1)


def kubemacpool_mac(prefix: str = "02:6b:6d") -> str:
    n = next(_macs) + (os.getpid() % 200) * 1000
    return prefix + ":%02x:%02x:%02x" % ((n >> 16) & 0xFF, (n >> 8) & 0xFF, n & 0xFF)


def other_mac() -> str:
    """A MAC of a machine that is no VM's (a PXE host, an administrator's machine)."""
    return kubemacpool_mac("52:54:01")


@dataclass
class PoolSite:
    """The module's bundle with pools, applied: its values file, seed, script and pools token."""

    values: dict          # the values as the reconciler loads them (without a per-test audit log)
    seed: str
    script: Path
    pools_kubeconfig: Path
    directory: Path

    def values_file(self, audit_log: Path) -> Path:
        """The values with this test's audit log, as a file for the CLI."""
        values = copy.deepcopy(self.values)
        values["maas"]["audit_log"] = str(audit_log)
        path = audit_log.parent / "values.yaml"
        path.write_text(yaml.safe_dump(values))
        return path


@pytest.fixture(scope="module")
def pool_site(control_plane, real_maas, tmp_path_factory):
    """The bundle rendered with the pools (the pool namespace first: its RoleBinding needs it),
    applied; a token of maas-kubevirt-pools; MAAS's power actions to the rack stand-in."""
    cp = control_plane
    directory = tmp_path_factory.mktemp("pools-site")
    seed_file, seed = new_seed_file(directory)
    values = default_values()
    values["redfish"]["domain"] = BMC_DOMAIN   # the rack stand-in resolves this domain alone
    values["seed"]["file"] = str(seed_file)
    values["pools"] = copy.deepcopy(POOLS)
    values["maas"]["commission"] = "approved"  # pool machines are approved by their pool alone
    kubernetes = values["kubernetes"]
    apply(cp, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": {
        kubernetes["opt_in_label"]: kubernetes["opt_in_value"], NAMESPACE_LABEL[0]: NAMESPACE_LABEL[1],
        policies.KUBEMACPOOL_LABEL: "allocate"}}})
    bundle = render_bundle(directory, values, seed, name="build")
    try:
        install(cp, bundle)
    except KubectlError:   # another module's policies this render cannot update in place
        delete_policies(cp)
        install(cp, bundle)
    token = cp.kubectl("create", "token", policies.POOLS_ACCOUNT, "-n", kubernetes["system_namespace"],
                       "--duration", "2h").stdout.strip()
    kubeconfig = _kubeconfig(directory / "pools-kubeconfig", cp.server, cp.ca, {"token": token})
    key = directory / "api-key"
    key.write_text(real_maas.api_key + "\n")
    key.chmod(0o600)
    values["maas"].update(url=real_maas.url, api_key_file=str(key), timeout=60)
    values["reconciler"]["pools"] = {"kubeconfig": str(kubeconfig)}
    source = directory / "values.yaml"
    source.write_text(yaml.safe_dump(values))
    mode, start_time, bmc_seed = real_maas.power_mode, real_maas.bmc.start_time, real_maas.bmc.seed
    real_maas.set_rack(0, seed)
    try:
        yield PoolSite(load_values(str(source)), seed, bundle.output / "commissioning" / SCRIPT_NAME,
                       kubeconfig, directory)
    finally:
        if mode == "rack":
            real_maas.set_rack(start_time, bmc_seed)
        else:
            real_maas.set_stub(mode == "on")
        cp.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
        # The other modules' bundles have no pools: what only this render made goes with it.
        cp.kubectl("delete", "clusterpolicy", policies.POOLS_POLICY, "--ignore-not-found", check=False)
        cp.kubectl("delete", "clusterrole", policies.POOLS_ACCOUNT, "--ignore-not-found", check=False)
        cp.kubectl("delete", "serviceaccount", policies.POOLS_ACCOUNT, "-n", kubernetes["system_namespace"],
                   "--ignore-not-found", check=False)


@pytest.fixture
def world(control_plane, real_maas, pool_site, tmp_path):
    """Each case from an empty pool namespace; the machines it made deleted when it ends."""
    control_plane.kubectl("delete", "vm", "--all", "-n", NAMESPACE, "--wait=true")
    before = real_maas.machine_ids()
    yield World(control_plane, real_maas, pool_site, tmp_path)
    real_maas.delete_machines(real_maas.machine_ids() - before)


class VMStandIn:
    """Each pool VM as it would run: KubeMacPool's MAC on its interface, then its PXE boot, the
    rendered script for the serial Kyverno stamped, and its enlistment (which ends in New)."""

    def __init__(self, cp, maas, script: Path, root: Path):
        self.cp, self.maas, self.script, self.root = cp, maas, script, root
        self.machines: dict[str, str] = {}   # VM -> its machine's system_id
        self.macs: dict[str, str] = {}

    def boot(self) -> list[str]:
        """Every pool VM not yet booted (runStrategy Once: it starts by itself): the names booted."""
        booted = []
        for item in self.cp.get("vm", namespace=NAMESPACE)["items"]:
            metadata = item["metadata"]
            name = metadata["name"]
            if (POOL_LABEL not in (metadata.get("labels") or {}) or item["spec"].get("runStrategy") != "Once"
                    or metadata.get("deletionTimestamp") or name in self.machines):
                continue
            mac = self.set_mac(name)
            serial = self.cp.get("vm", name, NAMESPACE)["spec"]["template"]["spec"]["domain"]["firmware"]["serial"]
            written = run_script(self.script, serial, self.root / name)
            enlisted = self.maas.enlist(written, mac, power_type=written.pop("power_type"))
            assert enlisted.status == 200, enlisted.body
            self.machines[name] = enlisted.system_id
            booted.append(name)
        return booted

    def set_mac(self, name: str) -> str:
        """As KubeMacPool's webhook at the VM's creation; the pools' account may not (no update)."""
        mac = self.macs[name] = kubemacpool_mac()
        self.cp.kubectl("patch", "vm", name, "-n", NAMESPACE, "--type=json", "-p", json.dumps(
            [{"op": "add", "path": INTERFACE_MAC, "value": mac}]))
        return mac


class World:
    """One case's reconciler processes, stand-in and readings of the API server and MAAS."""

    def __init__(self, cp, maas, site: PoolSite, tmp_path: Path):
        self.cp, self.maas, self.site, self.tmp_path = cp, maas, site, tmp_path
        self.audit_log = tmp_path / "audit.log"
        self.values = copy.deepcopy(site.values)
        self.values["maas"]["audit_log"] = str(self.audit_log)
        self.values_file = site.values_file(self.audit_log)
        self.stand_in = VMStandIn(cp, maas, site.script, tmp_path / "vms")

    def reconciler(self) -> Reconciler:
        """A fresh process's reconciler, as loop.main builds it (no lease: no rotator)."""
        values = self.values
        client = client_from_values(values, lambda message: None)
        audit = Audit(values["maas"]["audit_log"])
        reconciler = Reconciler(client, Settings.from_values(values), audit, passwords=Passwords(self.site.seed))
        reconciler.restore(Audit.read_file(values["maas"]["audit_log"]))
        reconciler.pool_stage = loop._pool_stage(values, client, audit, None, reconciler, self.site.seed)
        return reconciler

    def cli(self, *args: str, wait: bool = True) -> subprocess.CompletedProcess | subprocess.Popen:
        """The installed command with this case's values file, as its own process."""
        command = [str(CLI), "--values", str(self.values_file), *args]
        if not wait:
            return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        return subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)

    def records(self) -> list[dict]:
        return Audit.read_file(str(self.audit_log))

    # --- the API server -------------------------------------------------------------------------

    def vms(self, pool: str | None = None) -> list[str]:
        """The VMs in the pool namespace (of one pool's label), by name."""
        selector = f"{POOL_LABEL}={pool}" if pool else POOL_LABEL
        found = self.cp.get("vm", namespace=NAMESPACE) if pool is None else json.loads(self.cp.kubectl(
            "get", "vm", "-n", NAMESPACE, "-l", selector, "-o", "json").stdout)
        return sorted(item["metadata"]["name"] for item in found["items"])

    def serial(self, vm: str) -> str:
        return self.cp.get("vm", vm, NAMESPACE)["spec"]["template"]["spec"]["domain"]["firmware"]["serial"]

    # --- MAAS -----------------------------------------------------------------------------------

    def machine(self, vm: str) -> dict:
        return self.maas.machine(self.stand_in.machines[vm])

    def status(self, vm: str) -> str:
        return self.machine(vm)["status_name"]

    def exists(self, system_id: str) -> bool:
        return system_id in self.maas.machine_ids()

    def allocate(self, tags: str) -> dict:
        """As Juju asks MAAS for a machine (src/maasserver/api/machines.py, MachinesHandler.allocate)."""
        answer = self.maas.api("POST", "machines/?op=allocate", {"tags": tags})
        assert answer.status_code == 200, answer.text
        return answer.json()

    def release(self, system_id: str) -> None:
        answer = self.maas.api("POST", f"machines/{system_id}/?op=release")
        assert answer.status_code == 200, answer.text

    def foreign_ready_machine(self, tag: str) -> str:
        """A machine an administrator added (manual power, so MAAS never powers it), commissioned to
        Ready and tagged ``tag`` by hand: its system_id."""
        added = self.maas.api("POST", "machines/", {"architecture": "amd64/generic", "mac_addresses":
                                                    other_mac(),
                                                    "power_type": "manual", "commission": "true"})
        assert added.status_code == 200, added.text
        sid = added.json()["system_id"]
        self.maas.fetch_machine_key(sid)
        assert sid in self.maas.finish_commissioning(scripts_passed=True)
        made = self.maas.api("POST", "tags/", {"name": tag, "comment": "by hand"})
        assert made.status_code in (200, 400), made.text   # 400: an earlier case made it
        tagged = self.maas.api("POST", f"tags/{tag}/?op=update_nodes", {"add": sid})
        assert tagged.status_code == 200, tagged.text
        return sid

    # --- the steps ----------------------------------------------------------------------------

    def to_ready(self, reconciler: Reconciler) -> list[str]:
        """From VMs just created to Ready machines with their tags: the stand-in boots them; a cycle
        sees them (their pool approves them); the next sets their password and commissions them;
        their commissioning finishes; a cycle tags them. The VMs booted."""
        booted = self.stand_in.boot()
        reconciler.cycle()
        reconciler.cycle()
        assert {self.status(vm) for vm in booted} <= {"Commissioning"}, [self.machine(vm) for vm in booted]
        self.maas.finish_commissioning(scripts_passed=True)
        reconciler.cycle()
        return booted

    def assert_ready_and_own_password(self, vm: str, tags: tuple[str, ...]) -> None:
        machine = self.machine(vm)
        assert machine["status_name"] == "Ready", machine
        assert set(tags) <= set(machine["tag_names"]), machine["tag_names"]
        serial = self.serial(vm)
        assert serial == identity.format_serial(vm, NAMESPACE)
        power = self.maas.power_parameters(machine["system_id"])
        assert (power["power_address"], power["power_user"], power["power_pass"]) == (
            identity.redfish_host(vm, NAMESPACE, BMC_DOMAIN), identity.bmc_user(self.site.seed, serial),
            identity.bmc_password(self.site.seed, serial))


# --- 1, 2: refill to ready, and after an allocation --------------------------------------------


def test_a_pool_is_filled_to_ready_and_refilled_after_an_allocation(world):
    reconciler = world.reconciler()
    reconciler.cycle()
    first = world.vms("small")
    assert len(first) == 2 and world.vms("steady") == []
    assert world.to_ready(reconciler) == first
    for vm in first:
        world.assert_ready_and_own_password(vm, SMALL_TAGS)
    passwords = {world.maas.power_parameters(world.stand_in.machines[vm])["power_pass"] for vm in first}
    assert len(passwords) == 2
    reconciler.cycle()
    assert world.vms("small") == first   # full: nothing more

    taken = world.allocate("small")
    assert taken["system_id"] in {world.stand_in.machines[vm] for vm in first}
    reconciler.cycle()
    third = sorted(set(world.vms("small")) - set(first))
    assert len(third) == 1
    world.to_ready(reconciler)
    world.assert_ready_and_own_password(third[0], SMALL_TAGS)
    assert world.maas.machine(taken["system_id"])["status_name"] == "Allocated"
    reconciler.cycle()
    assert len(world.vms("small")) == 3


# --- 4, 3: max held; a release retired and recreated, or kept ----------------------------------


def test_max_holds_and_a_released_machine_is_retired_then_made_again(world):
    reconciler = world.reconciler()
    reconciler.cycle()
    world.to_ready(reconciler)
    taken = [world.allocate("small")["system_id"] for _ in range(2)]
    reconciler.cycle()           # one more within max 3
    world.to_ready(reconciler)
    taken.append(world.allocate("small")["system_id"])
    assert len(set(taken)) == 3
    before = world.vms("small")
    for _ in range(2):
        reconciler.cycle()
    assert world.vms("small") == before   # every machine in a user's hands: no VM beyond max

    # Released: MAAS's rack powers the VM off through Redfish and the state read back ends the
    # release (Node._release, then update_power_state, src/maasserver/models/node.py).
    released = taken[0]
    vm = next(name for name, sid in world.stand_in.machines.items() if sid == released)
    world.release(released)
    assert world.maas.machine(released)["status_name"] == "Ready"
    reconciler.cycle()
    assert not world.exists(released)
    assert vm not in world.vms("small")
    reconciler.cycle()           # the retired VM no longer counts: one made again
    remade = sorted(set(world.vms("small")) - set(before))
    assert len(remade) == 1 and len(world.vms("small")) == 3
    retired = [r for r in world.records() if r["action"] == "retire-vm" and r["vm"] == vm]
    assert [r["outcome"] for r in retired] == ["intent", "ok"]


def test_a_released_machine_of_a_keep_pool_stays_a_spare(world):
    reconciler = world.reconciler()
    done = world.cli("compose", "steady", "-o", "json")
    assert done.returncode == 0, done.stderr
    made = json.loads(done.stdout)
    assert (made["stage"], made["pool"]) == ("VM created", "steady")
    vm = made["vm"]
    assert world.vms("steady") == [vm]
    world.to_ready(reconciler)
    world.assert_ready_and_own_password(vm, ("steady",))
    sid = world.stand_in.machines[vm]
    assert world.allocate("steady")["system_id"] == sid
    reconciler.cycle()           # the allocation seen
    world.release(sid)
    assert world.maas.machine(sid)["status_name"] == "Ready"
    for _ in range(2):
        reconciler.cycle()
    assert world.vms("steady") == [vm]
    world.assert_ready_and_own_password(vm, ("steady",))


# --- 5: a restart mid-create and mid-retirement ------------------------------------------------


class Died(BaseException):
    """The process ended here (a crash, a kill): nothing of it runs after."""


class DiesAfter:
    """An object whose method ``name`` does its work, then the process dies."""

    def __init__(self, real, name: str):
        self.real, self.name = real, name

    def __getattr__(self, attribute):
        method = getattr(self.real, attribute)
        if attribute != self.name:
            return method

        def then_die(*args, **kwargs):
            method(*args, **kwargs)
            raise Died(attribute)
        return then_die


def test_a_restart_makes_no_duplicate_and_finishes_a_retirement(world):
    first = world.reconciler()
    first.pool_stage.applier.cluster = DiesAfter(first.pool_stage.applier.cluster, "create")
    with pytest.raises(Died):
        first.cycle()
    made = world.vms("small")
    assert len(made) == 1
    assert [(r["action"], r["outcome"], r["vm"]) for r in world.records()] == [("create-vm", "intent", made[0])]

    second = world.reconciler()
    second.cycle()               # counts the VM that exists: one more, not two
    assert len(world.vms("small")) == 2 and made[0] in world.vms("small")
    world.to_ready(second)
    second.cycle()
    assert len(world.vms("small")) == 2

    sid = world.allocate("small")["system_id"]
    vm = next(name for name, system_id in world.stand_in.machines.items() if system_id == sid)
    second.cycle()               # the allocation seen (audited: pool-used), and one more made
    world.release(sid)
    assert world.maas.machine(sid)["status_name"] == "Ready"
    third = world.reconciler()
    third.pool_stage.applier.client = DiesAfter(third.pool_stage.applier.client, "delete_machine")
    with pytest.raises(Died):
        third.cycle()            # the machine deleted, the VM not yet
    assert not world.exists(sid) and vm in world.vms("small")
    assert [r["outcome"] for r in world.records() if r["action"] == "retire-vm"] == ["intent"]

    fourth = world.reconciler()
    fourth.cycle()               # restored from the audit log: the retirement finished, the VM deleted
    assert vm not in world.vms("small") and not world.exists(sid)
    assert [r["outcome"] for r in world.records() if r["action"] == "retire-vm" and r["vm"] == vm] == [
        "intent", "intent", "ok"]
    fourth.cycle()               # ready 2: a Ready spare and the one on its way, nothing more
    assert len(world.vms("small")) == 2
    assert len([r for r in world.records() if r["action"] == "create-vm" and r["outcome"] == "ok"]) == 2


# --- 6: a hand-made VM and a foreign machine ---------------------------------------------------


def test_a_hand_made_vm_and_a_foreign_machine_are_never_counted_nor_deleted(world):
    database = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                "metadata": {"name": "database", "namespace": NAMESPACE, "labels": {POOL_LABEL: "small"}},
                "spec": {"runStrategy": "Halted", "template": {"spec": {"domain": {
                    "devices": {}, "resources": {"requests": {"memory": "1Gi"}}}}}}}
    apply(world.cp, database)
    sid = world.foreign_ready_machine("small")

    reconciler = world.reconciler()
    reconciler.cycle()
    made = [vm for vm in world.vms("small") if vm != "database"]
    assert len(made) == 2        # neither the hand-made VM nor the foreign Ready machine counts
    world.to_ready(reconciler)
    # Taken and given back by a user: a pool's machine would be retired now; this one is no pool's.
    assert world.maas.api("POST", "machines/?op=allocate", {"system_id": sid}).status_code == 200
    reconciler.cycle()
    world.release(sid)
    assert world.maas.machine(sid)["status_name"] == "Ready"
    for _ in range(2):
        reconciler.cycle()
    assert "database" in world.vms("small") and world.exists(sid)
    assert "small" in world.maas.machine(sid)["tag_names"]
    assert sorted(set(world.vms("small")) - {"database"}) == made

    pools_cluster = Cluster(str(world.site.pools_kubeconfig))
    with pytest.raises(KubeError) as refused:
        pools_cluster.delete(f"/apis/kubevirt.io/v1/namespaces/{NAMESPACE}/virtualmachines/database")
    assert "pool-vms-only-on-delete" in str(refused.value)
    assert "database" in world.vms("small")


# --- 7: a PXE host claiming a pool VM's identity ----------------------------------------------


def test_a_pxe_host_claiming_a_pool_vms_identity_gets_nothing(world):
    reconciler = world.reconciler()
    reconciler.cycle()
    vms = world.vms("small")
    world.stand_in.boot()
    target = vms[0]
    # Its own MAC, the script's output for the pool VM's serial: the same address.
    written = run_script(world.site.script, world.serial(target), world.tmp_path / "impostor")
    impostor = world.maas.enlist(written, other_mac(), power_type=written.pop("power_type"))
    assert impostor.status == 200, impostor.body
    for _ in range(2):
        reconciler.cycle()
    world.maas.finish_commissioning(scripts_passed=True)
    for _ in range(2):
        reconciler.cycle()
    claimed = world.machine(target)
    assert not set(SMALL_TAGS) & set(claimed["tag_names"]), claimed   # disputed: not tagged
    assert not set(SMALL_TAGS) & set(world.maas.machine(impostor.system_id)["tag_names"])
    world.assert_ready_and_own_password(vms[1], SMALL_TAGS)
    assert len(world.vms("small")) == 2   # the impostor counts for nothing


# --- 8: compose --wait, and decompose's refusals -----------------------------------------------


def test_compose_waits_for_ready_and_decompose_refuses_what_it_must(world):
    reconciler = world.reconciler()
    composing = world.cli("compose", "small", "--wait", "-o", "json", "--timeout", "600", wait=False)
    try:
        # compose makes its VM before it waits: then the site does the rest, as it would.
        deadline = time.monotonic() + 120
        while not world.vms("small"):
            assert composing.poll() is None and time.monotonic() < deadline, composing.communicate()
            time.sleep(0.2)
        reconciler.cycle()       # one more spare: ready 2, one VM on its way
        world.to_ready(reconciler)
        out, err = composing.communicate(timeout=300)
    finally:
        if composing.poll() is None:
            composing.kill()
            composing.wait()
    assert composing.returncode == 0, err
    result = json.loads(out)     # one JSON object: the audit records go to stderr
    vm = result["vm"]
    sid = world.stand_in.machines[vm]
    assert (result["stage"], result["system_id"], result["hostname"]) == (
        "Ready", sid, world.maas.machine(sid)["hostname"])
    assert result["bmc"] == identity.redfish_host(vm, NAMESPACE, BMC_DOMAIN)
    world.assert_ready_and_own_password(vm, SMALL_TAGS)

    # In a user's hands: refused without --force, both kept.
    taken = world.maas.api("POST", "machines/?op=allocate", {"system_id": sid})
    assert taken.status_code == 200, taken.text
    refused = world.cli("decompose", result["hostname"])
    assert refused.returncode == 1 and "a user holds it" in refused.stderr, refused.stderr
    assert world.exists(sid) and vm in world.vms("small")
    forced = world.cli("decompose", sid, "--force")
    assert forced.returncode == 0, forced.stderr
    assert not world.exists(sid) and vm not in world.vms("small")

    # No pool made it: refused, --force or not.
    foreign = world.foreign_ready_machine("small")
    for args in ((), ("--force",)):
        refused = world.cli("decompose", foreign, *args)
        assert refused.returncode == 1 and "no pool made it" in refused.stderr, refused.stderr
    assert world.exists(foreign)

