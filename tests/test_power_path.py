"""The power path's model in the kubevirtBMC stand-in (tests/kubevirt_bmc.py): kubevirtBMC's power
writes and KubeVirt v1.7.0's VM controller, for a guest that powers itself off. The real MAAS
driver runs against it in test_real_maas.py; the rule itself runs in test_controlplane.py."""

from __future__ import annotations

import pytest

from kubevirt_bmc import HALTED, RERUN, KubevirtBMC, halts_on_guest_power_off

HOST = "web1.vms.bmc.example.com"
START = 5.0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def started_then_powered_off(rule: bool) -> tuple[KubevirtBMC, Clock]:
    """The tutorial's first start (RerunOnFailure), the guest up, then its own power-off."""
    clock = Clock()
    bmc = KubevirtBMC("bmc.example.com", None, start_time=START, clock=clock)
    bmc.guest_power_off_rule = rule
    bmc.set_run_strategy(HOST, RERUN)
    clock.now += START
    assert bmc.power_state(bmc.vm(HOST)) == "On"
    bmc.guest_power_off(HOST)
    assert bmc.power_state(bmc.vm(HOST)) == "Off"
    return bmc, clock


def test_without_the_rule_on_never_starts_a_vm_whose_guest_powered_off():
    bmc, clock = started_then_powered_off(rule=False)
    vm = bmc.vm(HOST)
    assert (vm.strategy, vm.observed, vm.instance) == (RERUN, RERUN, None)
    assert bmc.reset(vm, "On") is None          # kubevirtBMC answers 204: it wrote RerunOnFailure
    clock.now += 10 * START
    assert bmc.power_state(vm) == "Off" and vm.instance is None


def test_with_the_rule_on_starts_it_start_time_later():
    bmc, clock = started_then_powered_off(rule=True)
    vm = bmc.vm(HOST)
    assert (vm.strategy, vm.observed, vm.instance) == (HALTED, HALTED, None)
    assert bmc.reset(vm, "On") is None
    assert bmc.power_state(vm) == "Off"
    clock.now += START
    assert bmc.power_state(vm) == "On" and vm.strategy == RERUN


def test_force_off_then_on_starts_a_running_vm_again():
    """MAAS's power-on of a VM that is On: ForceOff (Halted), PXE, On."""
    clock = Clock()
    bmc = KubevirtBMC("bmc.example.com", None, start_time=START, clock=clock)
    bmc.set_run_strategy(HOST, RERUN)
    vm = bmc.vm(HOST)
    bmc.reset(vm, "ForceOff")
    assert bmc.power_state(vm) == "Off" and vm.observed == HALTED
    bmc.reset(vm, "On")
    clock.now += START
    assert bmc.power_state(vm) == "On"


@pytest.mark.parametrize("strategy, old, new, extra, halts", [
    (RERUN, "Running", "Succeeded", {}, True),
    (RERUN, "Running", "Failed", {}, False),           # RerunOnFailure restarts it by design
    (RERUN, "Running", "Running", {}, False),
    (RERUN, "Succeeded", "Succeeded", {}, False),       # a later update of the ended instance
    (RERUN, "Running", "Succeeded", {"deleting": True}, False),   # KubeVirt stopping it
    (RERUN, "Running", "Succeeded", {"start_requested": True}, False),
    (RERUN, "Running", "Succeeded", {"opted_in": False}, False),
    ("Always", "Running", "Succeeded", {}, False),
    ("Manual", "Running", "Succeeded", {}, False),
    (HALTED, "Running", "Succeeded", {}, False),
])
def test_the_rule_acts_only_on_the_guest_s_own_power_off(strategy, old, new, extra, halts):
    assert halts_on_guest_power_off(strategy, old, new, **extra) is halts
