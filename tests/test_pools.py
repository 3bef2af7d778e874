"""The pools: quantities and names (hypothesis), the VM a pool makes, the pure plan, and apply
against a recording cluster and MAAS (the real tiers: test_pools_tier.py)."""

import copy
import json

import pytest
from hypothesis import given, settings, strategies as st

from maas_kubevirt import identity, quantity
from maas_kubevirt.audit import Audit
from maas_kubevirt.kube import KubeError
from maas_kubevirt.pools import observe, vm as pool_vm
from maas_kubevirt.pools.apply import INTENT, USED, WITHDRAWN, Applier, Records
from maas_kubevirt.pools.plan import (CREATE, FAILED, HELD, ON_THE_WAY, READY, RETIRE, TAG, PoolAction,
                                      PoolMachine, PoolVM, plan, plan_pool)
from maas_kubevirt.pools.spec import KEEP, POOL_LABEL, PROOF_ANNOTATION, Pool, by_name

from strategies import dns_labels

SEED = "pool-test-seed-0123456789abcdef"
SMALL = Pool("small", "maas-vms", 2, "4Gi", "20Gi", "standard", "pxe", ready=2, max=4, tags=("web",))


# --- quantities and names ----------------------------------------------------------------------

@given(st.integers(1, 10**6), st.sampled_from(sorted(quantity.SUFFIXES)))
def test_a_whole_quantity_is_its_number_times_its_suffix(number, suffix):
    assert quantity.parse(f"{number}{suffix}") == number * quantity.SUFFIXES[suffix]


@given(st.text(max_size=12))
def test_anything_else_is_refused_with_what_is_expected(text):
    try:
        value = quantity.parse(text)
    except quantity.QuantityError as failure:
        assert "Kubernetes quantity" in str(failure)
    else:
        assert value > 0 and text[0] in "123456789"


@pytest.mark.parametrize("text", ["1.5Gi", "4e9", "500m", "0", "-1Gi", "4gi", "4 Gi", "04Gi", ""])
def test_fractions_exponents_and_typos_are_refused(text):
    with pytest.raises(quantity.QuantityError):
        quantity.parse(text)


@given(dns_labels(40), st.text(identity.POOL_SUFFIX_ALPHABET, min_size=5, max_size=5))
def test_a_pool_vm_name_is_its_pool_and_a_suffix(pool, suffix):
    name = identity.pool_vm_name(pool, suffix)
    assert name == f"{pool}-{suffix}" and identity.is_pool_vm_name(pool, name)
    assert not identity.is_pool_vm_name(pool + "x", name)


@given(dns_labels(20), st.text(max_size=30))
def test_is_pool_vm_name_takes_only_one_label_after_the_pool(pool, rest):
    name = f"{pool}-{rest}"
    assert identity.is_pool_vm_name(pool, name) == (identity.is_label(rest) and identity.is_label(name))


@given(st.text(min_size=1, max_size=20), dns_labels(20), dns_labels(20), dns_labels(20))
def test_the_proof_depends_on_the_seed_and_every_name(seed, namespace, vm, pool):
    proof = identity.pool_vm_proof(seed, namespace, vm, pool)
    assert len(proof) == 32 and int(proof, 16) >= 0
    assert identity.pool_vm_proof(seed + "x", namespace, vm, pool) != proof
    assert identity.pool_vm_proof(seed, namespace, vm + "x", pool) != proof
    assert identity.pool_vm_proof(seed, namespace, vm, pool + "x") != proof


# --- the VM a pool makes -------------------------------------------------------------------------

def test_the_vm_has_exactly_a_pxe_interface_then_a_blank_disk():
    made = pool_vm.manifest(SMALL, "small-bcdfg", SEED)
    spec = made["spec"]["template"]["spec"]
    assert made["metadata"]["namespace"] == "maas-vms"
    assert made["metadata"]["labels"][POOL_LABEL] == "small"
    assert made["spec"]["runStrategy"] == "Once"
    assert spec["domain"]["devices"] == {
        "interfaces": [{"name": "pxe", "bridge": {}, "bootOrder": 1}],
        "disks": [{"name": "root", "disk": {"bus": "virtio"}, "bootOrder": 2}]}
    assert spec["networks"] == [{"name": "pxe", "multus": {"networkName": "pxe"}}]
    assert spec["volumes"] == [{"name": "root", "dataVolume": {"name": "small-bcdfg-root"}}]
    template = made["spec"]["dataVolumeTemplates"][0]["spec"]
    assert template == {"source": {"blank": {}}, "storage": {
        "storageClassName": "standard", "resources": {"requests": {"storage": "20Gi"}}}}
    assert spec["domain"]["cpu"] == {"cores": 2} and spec["domain"]["resources"]["requests"]["memory"] == "4Gi"
    assert set(spec) == {"domain", "networks", "volumes"}


def test_only_a_vm_with_the_reconcilers_proof_is_the_pools():
    pools = by_name((SMALL,))
    made = pool_vm.manifest(SMALL, "small-bcdfg", SEED)
    assert pool_vm.owned(made, pools, SEED) == SMALL
    copied = copy.deepcopy(made)
    copied["metadata"]["annotations"][PROOF_ANNOTATION] = "0" * 32
    assert pool_vm.owned(copied, pools, SEED) is None
    hand_made = copy.deepcopy(made)
    del hand_made["metadata"]["annotations"]
    assert pool_vm.owned(hand_made, pools, SEED) is None
    elsewhere = copy.deepcopy(made)
    elsewhere["metadata"]["namespace"] = "tenant"
    assert pool_vm.owned(elsewhere, pools, SEED) is None
    renamed = copy.deepcopy(made)
    renamed["metadata"]["name"] = "small-other"
    assert pool_vm.owned(renamed, pools, SEED) is None   # the proof names the VM


def test_new_names_avoid_the_taken_ones():
    taken = {pool_vm.new_name(SMALL) for _ in range(50)}
    fresh = pool_vm.new_name(SMALL, taken)
    assert fresh not in taken and identity.is_pool_vm_name("small", fresh)


# --- the plan ------------------------------------------------------------------------------------

def vms(*names, pool=SMALL, deleting=()):
    return [PoolVM(name, pool.namespace, pool.name, f"02:00:00:00:00:{i:02x}", name in deleting)
            for i, name in enumerate(names)]


def machine(vm, status, tags=("small", "web"), used=False, pool=SMALL):
    return PoolMachine(f"id{vm[-5:]}", f"{vm}-{pool.namespace}", vm, pool.namespace, status, tags, used)


def kinds(actions):
    return [a.kind for a in actions]


def test_an_empty_pool_is_filled_to_ready():
    actions, tally = plan_pool(SMALL, [], {})
    assert kinds(actions) == [CREATE, CREATE] and tally.creating == 2


def test_machines_on_their_way_count_as_spares():
    pool_vms = vms("small-aaaaa", "small-bbbbb")
    machines = {("small-aaaaa", "maas-vms"): machine("small-aaaaa", "Commissioning")}
    actions, tally = plan_pool(SMALL, pool_vms, machines)
    assert actions == [] and tally.on_the_way == 2


def test_an_allocation_is_refilled_within_max():
    pool_vms = vms("small-aaaaa", "small-bbbbb", "small-ccccc")
    machines = {("small-aaaaa", "maas-vms"): machine("small-aaaaa", "Deployed"),
                ("small-bbbbb", "maas-vms"): machine("small-bbbbb", "Allocated"),
                ("small-ccccc", "maas-vms"): machine("small-ccccc", READY)}
    actions, tally = plan_pool(SMALL, pool_vms, machines)
    assert kinds(actions) == [CREATE] and (tally.held, tally.ready, tally.total) == (2, 1, 3)


def test_max_holds_even_when_spares_are_short():
    pool_vms = vms(*(f"small-{c * 5}" for c in "abcd"))
    machines = {(vm.name, vm.namespace): machine(vm.name, "Deployed") for vm in pool_vms}
    actions, tally = plan_pool(SMALL, pool_vms, machines)
    assert actions == [] and tally.total == SMALL.max


def test_a_released_machine_is_retired_with_recreate_and_kept_with_keep():
    pool_vms = vms("small-aaaaa")
    machines = {("small-aaaaa", "maas-vms"): machine("small-aaaaa", READY, used=True)}
    actions, _ = plan_pool(SMALL, pool_vms, machines)
    assert kinds(actions) == [RETIRE, CREATE, CREATE]   # the retiring VM still counts against max
    kept = Pool(**{**SMALL.__dict__, "on_release": KEEP})
    actions, tally = plan_pool(kept, pool_vms, machines)
    assert kinds(actions) == [CREATE] and tally.ready == 1


def test_a_ready_spare_gets_the_tags_it_lacks():
    pool_vms = vms("small-aaaaa", "small-bbbbb")
    machines = {("small-aaaaa", "maas-vms"): machine("small-aaaaa", READY, tags=("other",)),
                ("small-bbbbb", "maas-vms"): machine("small-bbbbb", READY)}
    actions, _ = plan_pool(SMALL, pool_vms, machines)
    assert [(a.kind, a.vm, a.tags) for a in actions] == [(TAG, "small-aaaaa", ("small", "web"))]


def test_an_unfinished_retirement_is_finished():
    pool_vms = vms("small-aaaaa")
    actions, tally = plan_pool(SMALL, pool_vms, {}, {("small-aaaaa", "maas-vms")})
    assert kinds(actions) == [RETIRE, CREATE, CREATE] and tally.retiring == 1


def test_failed_machines_wait_for_a_person():
    pool_vms = vms("small-aaaaa")
    machines = {("small-aaaaa", "maas-vms"): machine("small-aaaaa", "Failed commissioning")}
    actions, tally = plan_pool(SMALL, pool_vms, machines)
    assert kinds(actions) == [CREATE, CREATE] and tally.failed == 1 and tally.waiting


statuses = st.sampled_from(sorted(HELD | FAILED | ON_THE_WAY | {READY}))


@settings(max_examples=300)
@given(st.lists(st.tuples(st.one_of(st.none(), statuses), st.booleans(), st.booleans()), max_size=12),
       st.integers(0, 8), st.integers(1, 12), st.sampled_from(["recreate", "keep"]))
def test_the_plan_never_passes_max_nor_retires_a_held_machine(states, ready, most, on_release):
    pool = Pool("p", "ns", 1, "1Gi", "1Gi", "sc", "pxe", ready=min(ready, most), max=most, on_release=on_release)
    pool_vms, machines = [], {}
    for index, (status, used, deleting) in enumerate(states):
        name = f"p-{index:05d}"
        pool_vms.append(PoolVM(name, "ns", "p", None, deleting))
        if status is not None:
            machines[(name, "ns")] = PoolMachine(f"s{index}", name, name, "ns", status, ("p",), used)
    actions, tallies = plan([pool], pool_vms, machines)
    creates = sum(a.kind == CREATE for a in actions)
    assert creates == 0 or len(pool_vms) + creates <= most
    for action in actions:
        if action.kind == RETIRE:
            assert machines[(action.vm, "ns")].status == READY and on_release == "recreate"
    spares = tallies[0].ready + tallies[0].on_the_way
    assert creates == max(0, min(pool.ready - spares, most - len(pool_vms)))


# --- observe -------------------------------------------------------------------------------------

class FakeMaas:
    """The MAAS calls the pool stage makes, on a dict of machines; every write recorded."""

    def __init__(self, machines=(), addresses=None):
        self.records = {m["system_id"]: m for m in machines}
        self.addresses = addresses or {}
        self.writes = []
        self.tags = set()

    def machines_by_mac(self, macs):
        return [m for m in self.records.values() if {i["mac_address"] for i in m["interface_set"]} & set(macs)]

    def machines_by_id(self, ids):
        return [self.records[i] for i in ids if i in self.records]

    def power_addresses(self, ids):
        return {i: self.addresses.get(i) for i in ids}

    def tag_names(self):
        return set(self.tags)

    def create_tag(self, name, comment):
        self.tags.add(name)
        self.writes.append(("create-tag", name))

    def tag_machine(self, name, system_id, add=True):
        self.records[system_id].setdefault("tag_names", []).append(name)
        self.writes.append(("tag", name, system_id))

    def delete_machine(self, system_id):
        self.records.pop(system_id, None)
        self.writes.append(("delete", system_id))


class FakeCluster:
    def __init__(self, refuse=False):
        self.objects = {}
        self.refuse = refuse

    def items(self, path, label_selector=None):
        return [copy.deepcopy(v) for k, v in self.objects.items() if k.startswith(path + "/")]

    def create(self, path, body):
        if self.refuse:
            raise KubeError(path, 403, "admission webhook denied the request")
        if f"{path}/{body['metadata']['name']}" in self.objects:
            raise KubeError(path, 409, "already exists")
        self.objects[f"{path}/{body['metadata']['name']}"] = copy.deepcopy(body)
        return body

    def delete(self, path):
        return self.objects.pop(path, None) is not None


def maas_machine(system_id, mac, status=READY, installed=None):
    return {"system_id": system_id, "hostname": f"h-{system_id}", "status_name": status,
            "interface_set": [{"mac_address": mac}], "tag_names": [],
            "current_installation_result_id": installed}


def with_mac(made, mac):
    made["spec"]["template"]["spec"]["domain"]["devices"]["interfaces"][0]["macAddress"] = mac
    return made


def test_a_machine_is_the_vms_only_with_its_mac_and_its_exact_address():
    cluster = FakeCluster()
    path = observe.vms_path("maas-vms")
    cluster.objects[path + "/small-bcdfg"] = with_mac(pool_vm.manifest(SMALL, "small-bcdfg", SEED), "02:AA:00:00:00:01")
    found = observe.pool_vms(cluster, (SMALL,), SEED)
    assert found == [PoolVM("small-bcdfg", "maas-vms", "small", "02:aa:00:00:00:01")]
    host = identity.redfish_host("small-bcdfg", "maas-vms", "bmc.example.com")
    maas = FakeMaas([maas_machine("real1", "02:aa:00:00:00:01", installed=7), maas_machine("fake1", "02:bb:00:00:00:01")],
                    {"real1": host, "fake1": host})
    machines = observe.pool_machines(maas, found, "bmc.example.com")
    assert list(machines) == [("small-bcdfg", "maas-vms")]
    assert machines[("small-bcdfg", "maas-vms")].system_id == "real1" and machines[("small-bcdfg", "maas-vms")].used
    maas.addresses["real1"] = "Small-bcdfg.maas-vms.bmc.example.com:443"
    assert observe.pool_machines(maas, found, "bmc.example.com") == {}


# --- apply ---------------------------------------------------------------------------------------

def applier(cluster, maas, records=None, writes=None):
    return Applier(cluster, maas, Audit(), records or Records(), by_name((SMALL,)), SEED,
                   may_write=None if writes is None else writes)


def test_a_create_is_audited_before_it_is_sent(capsys):
    cluster = FakeCluster(refuse=True)
    done = applier(cluster, FakeMaas()).apply([PoolAction(CREATE, "small", "maas-vms")], set())
    out = capsys.readouterr().out
    assert '"outcome": "intent"' in out and '"outcome": "failed"' in out and SEED not in out
    assert len(done.failed) == 1 and cluster.objects == {}


def test_a_retirement_deletes_the_machine_then_the_vm_and_a_restart_finishes_it(capsys):
    cluster = FakeCluster()
    path = observe.vms_path("maas-vms")
    cluster.objects[path + "/small-bcdfg"] = pool_vm.manifest(SMALL, "small-bcdfg", SEED)
    maas = FakeMaas([maas_machine("real1", "02:aa:00:00:00:01")])
    records = Records()
    action = PoolAction(RETIRE, "small", "maas-vms", "small-bcdfg", "real1", "h-real1")
    assert applier(cluster, maas, records).apply([action], set()).done == [action]
    assert maas.writes == [("delete", "real1")] and cluster.objects == {}
    assert records.retiring == set()
    restarted = Records()
    restarted.restore([{"action": RETIRE, "outcome": INTENT, "vm": "small-bcdfg", "namespace": "maas-vms"}])
    assert restarted.retiring == {("small-bcdfg", "maas-vms")}


def test_a_retirement_is_withdrawn_when_a_user_took_the_machine_meanwhile(capsys):
    cluster = FakeCluster()
    cluster.objects[observe.vms_path("maas-vms") + "/small-bcdfg"] = pool_vm.manifest(SMALL, "small-bcdfg", SEED)
    maas = FakeMaas([maas_machine("real1", "02:aa:00:00:00:01", status="Allocated")])
    records = Records()
    action = PoolAction(RETIRE, "small", "maas-vms", "small-bcdfg", "real1", "h-real1")
    done = applier(cluster, maas, records).apply([action], set())
    assert done.withdrawn == [action] and maas.writes == [] and len(cluster.objects) == 1
    assert records.retiring == set() and WITHDRAWN in capsys.readouterr().out


def test_tags_are_made_once_and_nothing_is_written_without_the_lease(capsys):
    maas = FakeMaas([maas_machine("real1", "m")])
    tag = PoolAction(TAG, "small", "maas-vms", "small-bcdfg", "real1", "h-real1", ("small", "web"))
    applier(FakeCluster(), maas).apply([tag], set())
    assert maas.writes == [("create-tag", "small"), ("tag", "small", "real1"), ("create-tag", "web"),
                           ("tag", "web", "real1")]
    idle = FakeMaas([maas_machine("real1", "m")])
    assert applier(FakeCluster(), idle, writes=lambda: False).apply([tag], set()).done == []
    assert idle.writes == []


def test_a_machine_in_a_users_hands_is_recorded_once(capsys):
    records = Records()
    applying = applier(FakeCluster(), FakeMaas(), records)
    held = machine("small-aaaaa", "Deployed")
    applying.note_used([held])
    applying.note_used([held])
    assert capsys.readouterr().out.count(USED) == 1 and records.used == {held.system_id}


def test_compose_json_is_one_object_on_stdout_and_its_audit_goes_to_stderr(monkeypatch, capsys, tmp_path):
    """`compose -o json` is read by scripts: its stdout is the answer alone (the tier found the
    create's audit records there before it)."""
    import argparse

    import pools_fixtures as pf
    from maas_kubevirt import compose, seed
    from maas_kubevirt.pools import access

    settings = pf.values()
    settings["maas"]["audit_log"] = str(tmp_path / "audit.log")
    cluster = FakeCluster()
    monkeypatch.setattr(access, "cluster", lambda values: cluster)
    monkeypatch.setattr(seed, "load", lambda values: SEED)
    args = argparse.Namespace(pool="small", name=None, wait=False, timeout=60, output="json")
    assert compose.main(settings, args) == 0
    out, err = capsys.readouterr()
    answer = json.loads(out)
    assert (answer["pool"], answer["stage"]) == ("small", compose.CREATED)
    assert [json.loads(line)["outcome"] for line in err.splitlines()] == ["intent", "ok"]
    assert [r["outcome"] for r in Audit.read_file(settings["maas"]["audit_log"])] == ["intent", "ok"]


def test_compose_with_the_name_of_a_vm_the_pool_made_makes_no_other(monkeypatch, capsys, tmp_path):
    """`compose POOL --name VM` run again (after a timeout, a lost session) reports on VM and makes
    nothing; a VM of that name no pool made is not the pool's, and the cluster's conflict stands."""
    import argparse

    import pools_fixtures as pf
    from maas_kubevirt import compose, seed
    from maas_kubevirt.pools import access

    settings = pf.values()
    settings["maas"]["audit_log"] = str(tmp_path / "audit.log")
    cluster = FakeCluster()
    path = observe.vms_path("maas-vms")
    cluster.objects[path + "/small-bcdfg"] = with_mac(pool_vm.manifest(SMALL, "small-bcdfg", SEED), "02:AA:00:00:00:01")
    host = identity.redfish_host("small-bcdfg", "maas-vms", settings["redfish"]["domain"])
    maas = FakeMaas([maas_machine("real1", "02:aa:00:00:00:01", status="Commissioning")], {"real1": host})
    monkeypatch.setattr(access, "cluster", lambda values: cluster)
    monkeypatch.setattr(seed, "load", lambda values: SEED)
    monkeypatch.setattr(compose, "client_from_values", lambda values, warn: maas)
    args = argparse.Namespace(pool="small", name="small-bcdfg", wait=False, timeout=60, output="json")
    assert compose.main(settings, args) == 0
    out, err = capsys.readouterr()
    answer = json.loads(out)
    assert (answer["vm"], answer["stage"], answer["system_id"]) == ("small-bcdfg", compose.COMMISSIONING, "real1")
    assert "already pool small's VM" in err and list(cluster.objects) == [path + "/small-bcdfg"]
    assert not (tmp_path / "audit.log").exists() and maas.writes == []
    # A tenant's VM with the pool's label but not its proof is not the pool's: compose tries to make
    # its own of that name, and the cluster's conflict stands.
    tenants = {"metadata": {"name": "small-tenant", "namespace": "maas-vms", "labels": {"maas-kubevirt.io/pool": "small"}},
               "spec": {}}
    cluster.objects[path + "/small-tenant"] = tenants
    args = argparse.Namespace(pool="small", name="small-tenant", wait=False, timeout=60, output="json")
    assert compose.main(settings, args) == 1
    out, err = capsys.readouterr()
    assert out == "" and "the cluster refused the VM" in err and "already pool" not in err
    assert cluster.objects[path + "/small-tenant"] is tenants
