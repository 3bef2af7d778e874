"""The pure parts of tools/bench-pools (`make bench`): the objects a pool VM costs its namespace, the
goal's arithmetic, the seconds requests overlap, and its in-memory cluster. Nothing here is timed."""

import importlib.machinery
import importlib.util
from pathlib import Path

import pytest

import pools_fixtures
from maas_kubevirt import identity
from maas_kubevirt.pools import observe, vm as pool_vm
from maas_kubevirt.pools.spec import POOL_LABEL

_loader = importlib.machinery.SourceFileLoader("bench_pools", str(Path(__file__).resolve().parents[1] / "tools" / "bench-pools"))
bench = importlib.util.module_from_spec(importlib.util.spec_from_loader(_loader.name, _loader))
_loader.exec_module(bench)


def test_a_pool_vm_costs_ten_objects_and_kubevirtbmc_four_of_them():
    made = bench.objects_per_vm(pools_fixtures.values(), pools_fixtures.SEED)
    assert sorted(kind for kind, _ in made) == sorted([
        "VirtualMachine", "DataVolume", "PersistentVolumeClaim",            # the VM and its disk
        "Secret", "VirtualMachineBMC", "Ingress",                           # the bundle's generate rules
        "ServiceAccount", "RoleBinding", "Pod", "Service"])                 # kubevirtBMC, per BMC
    assert [who for kind, who in made if kind == "Secret"] == ["Kyverno, maas-kubevirt-vm-bmc rule bmc-secret"]
    assert bench.BMC_AGENT_MEMORY_REQUEST == 0


def test_the_namespaces_network_policy_is_not_counted_per_vm():
    made = bench.objects_per_vm(pools_fixtures.values(), pools_fixtures.SEED)
    assert "NetworkPolicy" not in {kind for kind, _ in made}   # generated once per namespace


@pytest.mark.parametrize("concurrency, power_on, writes, rate", [
    (2, 5.0, 1.0, 0.8 * 2 / 6.0), (8, 20.0, 1.6, 0.8 * 8 / 21.6), (1, 1.0, 0.0, 0.8)])
def test_the_goal_is_four_fifths_of_the_lanes_rate(concurrency, power_on, writes, rate):
    assert bench.goal_rate(concurrency, power_on, writes) == pytest.approx(rate)


def test_a_thousand_vms_at_c8_fill_in_under_an_hour_at_the_goals_floor():
    rate = bench.goal_rate(8, 20.0, 1.6)
    assert bench.fill_seconds(1000, rate, 0.0) / 60 == pytest.approx(56.25)
    assert bench.fill_seconds(1000, rate / bench.GOAL_SHARE, 0.0) / 60 == pytest.approx(45.0)   # every lane busy
    assert bench.fill_seconds(10, 1.0, 40.0) == 50.0


@pytest.mark.parametrize("intervals, seconds", [
    ([], 0.0), ([(0, 2), (1, 3), (5, 6)], 4.0), ([(0, 10), (2, 3)], 10.0), ([(4, 5), (0, 1)], 2.0)])
def test_concurrent_requests_count_once(intervals, seconds):
    assert bench.busy_seconds(intervals) == seconds


def test_the_cluster_stamps_the_serial_and_a_mac_and_boots_each_vm_once():
    booted = []
    cluster = bench.BenchCluster(booted.append)
    pool = pools_fixtures.pool_of(pools_fixtures.values(), "small")
    for name in ("small-bcdfg", "small-hjklm"):
        cluster.create(observe.vms_path(pool.namespace), pool_vm.manifest(pool, name, pools_fixtures.SEED))
    listed = cluster.items(observe.vms_path(pool.namespace), label_selector=POOL_LABEL)
    assert [vm["metadata"]["name"] for vm in booted] == ["small-bcdfg", "small-hjklm"]
    assert [vm["spec"]["template"]["spec"]["domain"]["firmware"]["serial"] for vm in listed] == [
        identity.format_serial("small-bcdfg", pool.namespace), identity.format_serial("small-hjklm", pool.namespace)]
    macs = {observe.mac_of(vm) for vm in listed}
    assert len(macs) == 2 and None not in macs
    assert [vm.name for vm in observe.pool_vms(cluster, (pool,), pools_fixtures.SEED)] == ["small-bcdfg", "small-hjklm"]
    assert cluster.items(observe.vms_path(pool.namespace), label_selector="other") == []
