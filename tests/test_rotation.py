"""Rotating a password that may have leaked (issue 25 item 2), the reconciler's half, on the MAAS
double with an in-memory stand-in for the rotations ConfigMap (the cluster half has its own tier)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from maas_double import MaasDouble  # noqa: E402
from reconcile_helpers import SEED  # noqa: E402
from test_reconcile_security import Clock, double, fast_retries  # noqa: E402,F401  (fixtures)

from maas_kubevirt import identity  # noqa: E402
from maas_kubevirt.audit import Audit  # noqa: E402
from maas_kubevirt.maas import MAASClient, Signer  # noqa: E402
from maas_kubevirt.reconcile import ROTATION_SETTLE, Passwords, Reconciler, Settings  # noqa: E402

DOMAIN = "bmc.example.com"
MAC = "52:54:00:12:34:56"
PLACEHOLDER = identity.PLACEHOLDER_PASSWORD


def password(vm: str, namespace: str, generation: int = 0) -> str:
    return identity.bmc_password(SEED, f"{vm}.{namespace}", generation)


def user(vm: str, namespace: str, generation: int = 0) -> str:
    return identity.bmc_user(SEED, f"{vm}.{namespace}", generation)


class Rotations:
    """The rotations ConfigMap as rotations.py reads and bumps it; ``fail`` makes either raise."""

    def __init__(self) -> None:
        self.generations: dict[tuple[str, str], int] = {}
        self.bumps: list[tuple[str, str]] = []
        self.fail: str = ""

    def read(self) -> dict[tuple[str, str], int]:
        if self.fail:
            raise RuntimeError(self.fail)
        return dict(self.generations)

    def bump(self, vm: str, namespace: str) -> int:
        if self.fail:
            raise RuntimeError(self.fail)
        self.bumps.append((vm, namespace))
        self.generations[(vm, namespace)] = self.generations.get((vm, namespace), 0) + 1
        return self.generations[(vm, namespace)]


def reconciler_for(double: MaasDouble, tmp_path: Path, rotations: Rotations | None, wall: Clock,
                   **settings: object) -> Reconciler:
    client = MAASClient(double.url, Signer(*double.api_key), timeout=5)
    reconciler = Reconciler(client, Settings(domain=DOMAIN, commission="never", **settings),
                            Audit(str(tmp_path / "audit.log")), passwords=Passwords(SEED), clock=Clock(), wall=wall)
    reconciler.rotator = rotations
    return reconciler


def records(tmp_path: Path, action: str | None = None) -> list[dict]:
    found = Audit.read_file(str(tmp_path / "audit.log"))
    return [r for r in found if action is None or r["action"] == action]


def re_point(double: MaasDouble, address: str = "mac.harvest.attacker.example") -> None:
    """MAC enlistment, as any PXE host that knows the VM's MAC can send it (no password)."""
    params = {"power_address": address, "power_user": "maas", "node_id": "1"}
    code, _ = double.anonymous_enlist({"architecture": "amd64/generic", "mac_addresses": [MAC],
                                       "power_type": "redfish", "power_parameters": json.dumps(params)})
    assert code == 200


def re_enlist(double: MaasDouble, sid: str, vm: str = "web1", namespace: str = "vms") -> None:
    """The real VM enlists again: the script writes the canonical address, a random user and the placeholder."""
    double.set_power_address(sid, identity.redfish_host(vm, namespace, DOMAIN))
    double.power[sid]["power_user"] = identity.ENLIST_USER_PREFIX + "0" * 32
    double.power[sid]["power_pass"] = PLACEHOLDER


def test_a_password_taken_back_from_a_re_pointed_machine_is_rotated_and_the_new_one_follows(double, tmp_path):
    rotations, wall = Rotations(), Clock()
    sid = double.add_vm("web1", "vms", status="New", mac_addresses=[MAC])
    other = double.add_vm("web2", "vms", status="New")
    reconciler = reconciler_for(double, tmp_path, rotations, wall)
    reconciler.cycle()
    assert double.power[sid]["power_pass"] == password("web1", "vms")
    re_point(double)
    reconciler.cycle()
    # Taken back, then rotated in the same cycle: generation 1 for this VM only.
    assert double.power[sid]["power_pass"] == PLACEHOLDER
    assert rotations.bumps == [("web1", "vms")]
    (reset,) = records(tmp_path, "reset-password")
    assert reset["leak"] is True and reset["generation"] == 0 and reset["identity"] == "web1.vms"
    (rotate,) = records(tmp_path, "rotate")
    assert (rotate["outcome"], rotate["before"], rotate["after"], rotate["identity"]) == ("ok", "0", "1", "web1.vms")
    assert reconciler.needing_rotation() == {}
    # The VM comes back (the real one enlists again): its new password waits for Kyverno, then follows.
    re_enlist(double, sid)
    result = reconciler.cycle()
    assert double.power[sid]["power_pass"] == PLACEHOLDER
    assert any("once Kyverno has re-derived web1-bmc" in a.note for a in result.actions)
    wall.now += ROTATION_SETTLE
    reconciler.cycle()
    reconciler.cycle()
    assert double.power[sid]["power_pass"] == password("web1", "vms", 1)
    assert double.power[sid]["power_user"] == user("web1", "vms", 1)
    assert double.power[other]["power_pass"] == password("web2", "vms")   # untouched
    assert rotations.bumps == [("web1", "vms")]


def test_a_generation_bumped_by_hand_is_followed_on_that_vm_only(double, tmp_path):
    rotations, wall = Rotations(), Clock()
    web1 = double.add_vm("web1", "vms", status="Deployed")
    web2 = double.add_vm("web2", "vms", status="Deployed")
    reconciler = reconciler_for(double, tmp_path, rotations, wall)
    reconciler.cycle()
    writes = len(double.writes)
    rotations.generations[("web1", "vms")] = 3    # `maas-kubevirt rotate web1.vms`, three times
    reconciler.cycle()
    assert double.power[web1]["power_pass"] == password("web1", "vms")   # Kyverno first
    wall.now += ROTATION_SETTLE
    reconciler.cycle()
    assert double.power[web1]["power_pass"] == password("web1", "vms", 3)
    assert double.power[web1]["power_user"] == user("web1", "vms", 3)
    assert double.power[web2]["power_pass"] == password("web2", "vms")
    assert [w[1] for w in double.writes[writes:]] == [web1]
    assert rotations.bumps == []


def test_without_cluster_access_the_reconciler_says_which_command_rotates(double, tmp_path, capsys):
    sid = double.add_vm("web1", "vms", status="New", mac_addresses=[MAC])
    reconciler = reconciler_for(double, tmp_path, None, Clock())
    reconciler.values_path = "/etc/maas-kubevirt/values.yaml"
    reconciler.cycle()
    re_point(double)
    reconciler.cycle()
    reconciler.cycle()
    assert double.power[sid]["power_pass"] == PLACEHOLDER
    assert list(reconciler.needing_rotation()) == [("web1", "vms")]
    told = [line for line in capsys.readouterr().err.splitlines() if "may have leaked" in line]
    assert len(told) == 1 and "maas-kubevirt --values /etc/maas-kubevirt/values.yaml rotate web1.vms" in told[0]
    assert records(tmp_path, "rotate") == []


def test_a_restart_remembers_what_still_needs_rotating(double, tmp_path):
    sid = double.add_vm("web1", "vms", status="New", mac_addresses=[MAC])
    first = reconciler_for(double, tmp_path, None, Clock())
    first.cycle()
    re_point(double)
    first.cycle()
    second = reconciler_for(double, tmp_path, None, Clock())
    second.restore(records(tmp_path))
    assert second.needing_rotation() == {("web1", "vms"): first.needing_rotation()[("web1", "vms")]}
    # `rotate` by hand appends its record: from then on nothing needs rotating, also after a restart.
    Audit(str(tmp_path / "audit.log")).write("rotate", None, None, "0", "1", "ok", identity="web1.vms")
    third = reconciler_for(double, tmp_path, None, Clock())
    third.restore(records(tmp_path))
    assert third.needing_rotation() == {} and sid


def test_a_configmap_generation_below_the_audited_one_never_wins(double, tmp_path):
    """The ConfigMap edited from 3 down to 1 while the reconciler was down: the restarted one still
    knows generation 3's password (and takes it back from a re-pointed machine) and never sets 1's."""
    rotations = Rotations()
    rotations.generations[("web1", "vms")] = 3
    sid = double.add_vm("web1", "vms", status="New", mac_addresses=[MAC])
    reconciler_for(double, tmp_path, rotations, Clock()).cycle()
    assert double.power[sid]["power_pass"] == password("web1", "vms", 3)
    rotations.generations[("web1", "vms")] = 1
    re_point(double)
    restarted = reconciler_for(double, tmp_path, rotations, Clock())
    restarted.restore(records(tmp_path))
    restarted.cycle()
    assert restarted.passwords.generation("web1", "vms") == 3 and restarted.lowered == {("web1", "vms"): 1}
    assert double.power[sid]["power_pass"] == PLACEHOLDER          # generation 3's, recognised and taken back
    re_enlist(double, sid)
    restarted.cycle()
    assert double.power[sid]["power_pass"] == PLACEHOLDER          # 1 is below 3: not derived
    secrets = {password("web1", "vms", 1), user("web1", "vms", 1)}
    assert not [w for w in double.writes if secrets & {v for v in w[2].values() if isinstance(v, str)}]


def test_a_duplicate_claim_is_no_leak(double, tmp_path):
    """Every claimant's address is the VM's own BMC: the password is taken back, nothing rotated."""
    rotations = Rotations()
    sid = double.add_vm("web1", "vms", status="Deployed")
    reconciler = reconciler_for(double, tmp_path, rotations, Clock())
    reconciler.cycle()
    double.add_machine("impostor", power_type="redfish", power_address=identity.redfish_host("web1", "vms", DOMAIN),
                       power_pass=PLACEHOLDER)
    reconciler.resync("test: see the impostor")
    reconciler.cycle()
    assert double.power[sid]["power_pass"] == PLACEHOLDER
    assert rotations.bumps == [] and reconciler.needing_rotation() == {}


def test_unreadable_generations_derive_no_password(double, tmp_path):
    """Resets never wait for the cluster (tests/test_power_type.py); a new password does."""
    rotations = Rotations()
    rotations.fail = "GET configmaps/maas-kubevirt-rotations: no answer"
    sid = double.add_vm("web1", "vms", status="New")
    reconciler = reconciler_for(double, tmp_path, rotations, Clock())
    result = reconciler.cycle()
    assert "cannot be read from the cluster" in result.withheld and result.failed and not result.error
    assert double.power[sid]["power_pass"] == PLACEHOLDER
    assert not [w for w in double.writes if w[0] == "PUT" and "power_parameters_power_pass" in w[2]]


def test_a_failed_bump_is_audited_and_tried_again_next_cycle(double, tmp_path):
    rotations = Rotations()
    sid = double.add_vm("web1", "vms", status="New", mac_addresses=[MAC])
    reconciler = reconciler_for(double, tmp_path, rotations, Clock())
    reconciler.cycle()
    re_point(double)
    real_bump = rotations.bump

    def refused(vm: str, namespace: str) -> int:
        raise RuntimeError("PUT configmaps/maas-kubevirt-rotations: 403: forbidden")

    rotations.bump = refused
    reconciler.cycle()
    assert double.power[sid]["power_pass"] == PLACEHOLDER
    (failed,) = records(tmp_path, "rotate")
    assert failed["outcome"] == "failed" and "403" in failed["reason"]
    rotations.bump = real_bump
    reconciler.cycle()
    assert [r["outcome"] for r in records(tmp_path, "rotate")] == ["failed", "ok"]
    assert rotations.generations == {("web1", "vms"): 1}


def test_status_names_each_vm_to_rotate_and_the_exact_command(double, tmp_path, capsys):
    from reconcile_helpers import write_values

    from maas_kubevirt import cli

    values = write_values(tmp_path, double, commission="never")
    sid = double.add_vm("web1", "vms", status="New", mac_addresses=[MAC])
    reconciler = reconciler_for(double, tmp_path, None, Clock())
    reconciler.cycle()
    re_point(double)
    reconciler.cycle()
    capsys.readouterr()
    assert cli.main(["--values", str(values), "status"]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("possible leak")]
    assert line == (f"possible leak: web1.vms: its password (generation 0) sat beside another address on {sid} "
                    f"and was taken back; rotate it: maas-kubevirt --values {values} rotate web1.vms")
    assert cli.main(["--values", str(values), "status", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["rotations"] == [{"vm": "web1", "namespace": "vms", "system_id": sid, "generation": 0,
                                      "command": f"maas-kubevirt --values {values} rotate web1.vms"}]
    assert document["summary"]["rotations"] == 1


@pytest.mark.parametrize("given", [[], ["--kubeconfig", "admin.conf"], ["KUBECONFIG"]])
def test_rotate_by_hand_without_a_lease_is_refused_with_why_even_with_a_kubeconfig(given, tmp_path, monkeypatch,
                                                                                  capsys):
    """Without reconciler.lease the reconciler reads no generation: a bump would have Kyverno
    derive the new password while the reconciler sets the old one back. $KUBECONFIG or
    --kubeconfig reaches the ConfigMap, not the reconciler, so they do not make it safe."""
    from maas_kubevirt import cli, rotate

    kubeconfig = tmp_path / "admin.conf"
    kubeconfig.write_text("{}")
    if given == ["KUBECONFIG"]:
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        given = []
    monkeypatch.chdir(tmp_path)
    assert cli.main(["rotate", "web1.vms", *given]) == 2
    err = capsys.readouterr().err
    assert err == f"maas-kubevirt: error: rotate: {rotate.NEEDS_LEASE}\n"
    assert "the values have no reconciler.lease" in err and "set the old password back" in err
    assert "$KUBECONFIG or --kubeconfig does not change that" in err
