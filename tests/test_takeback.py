"""A VM's machine on any name, in any pool, is still the VM's (issue 41 item 3), on the MAAS double.

A reconciler with none of the audit records of who holds a derived credential (another region
host's, a restart without ``maas.audit_log``, a record older than ``restore`` reads) still knows
the machine by the credentials it holds, on its fallback name, left unrenamed by
``on_hostname_taken: skip``, or outside its pool, and takes them back within one cycle after a
MAC re-point or a power-type switch. The same on MAAS's own region: tests/test_real_maas.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from maas_double import MaasDouble  # noqa: E402
from test_power_type import SWITCHES, holders, switch  # noqa: E402
from test_reconcile_security import Clock, double, fast_retries  # noqa: E402,F401  (fixtures)
from test_rotation import MAC, PLACEHOLDER, password, re_point, reconciler_for, records, user  # noqa: E402

from reconcile_helpers import Args, write_values  # noqa: E402

from maas_kubevirt import identity, lease, loop  # noqa: E402
from maas_kubevirt.values import load_values  # noqa: E402

SECRETS = (password("web1", "vms"), user("web1", "vms"))
FALLBACK = identity.fallback_hostname("web1", "vms")
ATTACKS = ("re-point", *sorted(SWITCHES))


def attack(double: MaasDouble, how: str) -> None:
    if how == "re-point":
        re_point(double)
    else:
        switch(double, how)


def filed(double: MaasDouble, tmp_path: Path, status: str = "New", **settings: object) -> str:
    """web1.vms enlisted (its MAC known to the attacker) while a squatter holds web1-vms, given its
    derived credentials by a first reconciler whose audit log is then lost."""
    double.add_machine("web1-vms", power_type="ipmi", status="Deployed")
    sid = double.add_vm("web1", "vms", status=status, mac_addresses=[MAC])
    (tmp_path / "first").mkdir()
    reconciler_for(double, tmp_path / "first", None, Clock(), **settings).cycle()
    assert holders(double, *SECRETS) == {sid: {"power_pass", "power_user"}}
    return sid


def fresh(double: MaasDouble, tmp_path: Path, name: str, **settings: object):
    """A reconciler with an audit log of its own, empty: another region host's, or a restart's."""
    (tmp_path / name).mkdir()
    return reconciler_for(double, tmp_path / name, None, Clock(), **settings)


@pytest.mark.parametrize("how", ATTACKS)
def test_a_fallback_named_machine_attacked_while_no_reconciler_ran_is_taken_back(double, tmp_path, how):
    sid = filed(double, tmp_path)
    assert double.machines[sid]["hostname"] == FALLBACK
    attack(double, how)
    assert set(holders(double, *SECRETS)) == {sid}   # MAAS kept the password (and the user, but by re-point)
    restarted = fresh(double, tmp_path, "second")
    restarted.cycle()
    assert holders(double, *SECRETS) == {}
    assert double.power[sid]["power_pass"] == PLACEHOLDER
    (reset,) = records(tmp_path / "second", "reset-password")
    assert (reset["system_id"], reset["outcome"], reset["leak"], reset["identity"]) == (sid, "ok", True, "web1.vms")
    assert list(restarted.needing_rotation()) == [("web1", "vms")]


@pytest.mark.parametrize("how", ATTACKS)
def test_a_fallback_named_machine_attacked_after_a_restart_is_taken_back_within_one_cycle(double, tmp_path, how):
    sid = filed(double, tmp_path)
    restarted = fresh(double, tmp_path, "second")
    restarted.cycle()
    assert records(tmp_path / "second") == []      # nothing to do: it holds its own credentials
    attack(double, how)
    restarted.cycle()
    assert holders(double, *SECRETS) == {}
    assert [r["system_id"] for r in records(tmp_path / "second", "reset-password")] == [sid]


@pytest.mark.parametrize("how", ATTACKS)
def test_a_machine_left_unrenamed_by_skip_is_known_by_its_credentials(double, tmp_path, how):
    sid = filed(double, tmp_path, on_hostname_taken="skip")
    assert double.machines[sid]["hostname"] not in ("web1-vms", FALLBACK)
    attack(double, how)
    fresh(double, tmp_path, "second", on_hostname_taken="skip").cycle()
    assert holders(double, *SECRETS) == {}
    assert [r["identity"] for r in records(tmp_path / "second", "reset-password")] == ["web1.vms"]


@pytest.mark.parametrize("pool", ["default", "racks"])
@pytest.mark.parametrize("how", ATTACKS)
def test_a_machine_outside_its_pool_is_known_by_its_credentials(double, tmp_path, how, pool):
    """Left in default (an administrator's pool named vms, not adopted) or filed elsewhere by an operator."""
    double.add_pool("vms", "an administrator's own")
    sid = double.add_vm("web1", "vms", status="New", mac_addresses=[MAC])
    (tmp_path / "first").mkdir()
    reconciler_for(double, tmp_path / "first", None, Clock()).cycle()
    assert (double.machines[sid]["hostname"], double.machines[sid]["pool"]["name"]) == ("web1-vms", "default")
    if pool != "default":
        double.move_to_pool(sid, pool)
    attack(double, how)
    fresh(double, tmp_path, "second").cycle()
    assert holders(double, *SECRETS) == {}


def test_a_deployed_machine_whose_address_moved_is_known_by_its_credentials(double, tmp_path):
    """An edit of the address (its own metadata token, or the API) while no reconciler ran."""
    sid = filed(double, tmp_path, status="Deployed")
    double.set_power_address(sid, "harvest.attacker.example")
    fresh(double, tmp_path, "second").cycle()
    assert holders(double, *SECRETS) == {}


def test_another_sites_credentials_are_left_alone(double, tmp_path):
    """A machine of another site on the same MAAS (another seed and domain) holds a user of the
    derived form that no identity here derives: it is no business of this reconciler's."""
    other_seed = "1f" * 8 + "a3c5e7092b4d6f81" * 3
    foreign = double.add_vm("web1", "vms", domain="bmc.other.example", status="Deployed", hostname="web1-vms",
                            password=identity.bmc_password(other_seed, "web1.vms"),
                            power_user=identity.bmc_user(other_seed, "web1.vms"))
    fresh(double, tmp_path, "only").cycle()
    assert double.power[foreign]["power_pass"] == identity.bmc_password(other_seed, "web1.vms")
    assert records(tmp_path / "only") == []


@pytest.mark.parametrize("audit_log", [False, True], ids=["no-audit-log", "audit-log"])
def test_the_reconciler_warns_at_start_when_a_lease_has_no_audit_log(double, tmp_path, monkeypatch, capsys,
                                                                      audit_log):
    values = load_values(write_values(tmp_path, double, **({} if audit_log else {"audit_log": ""})))
    values["reconciler"]["lease"]["kubeconfig"] = str(tmp_path / "kubeconfig")

    def no_candidate(values, *args, **kwargs):   # the warning comes before the election
        raise lease.LeaseConfigError("stopped here by the test")

    monkeypatch.setattr(lease, "candidate_from_values", no_candidate)
    capsys.readouterr()
    loop.main(values, Args(once=True))
    err = capsys.readouterr().err
    assert ("maas.audit_log is not set" in err) != audit_log
    if not audit_log:
        assert "a standby that takes the lease over has none of the holder's records" in err
        assert "one audit log that every host's reconciler appends to (shared or replicated storage" in err


def test_a_resync_reads_every_machines_power_in_bulk_and_an_idle_cycle_stays_at_two_requests(double, tmp_path):
    """The cost of knowing credentials by their value: a resync reads every machine's power
    parameters (200 a request), whatever its type; an idle cycle reads none."""
    from maas_kubevirt.maas import POWER_PARAMETERS_CHUNK

    for i in range(950):
        double.add_machine(power_type="ipmi", power_pass=f"S3CRET{i}", status="Deployed")
    for i in range(50):
        double.add_vm(f"vm{i}", "vms", status="Deployed")
    reconciler = fresh(double, tmp_path, "cost")
    reconciler.cycle()
    reconciler.cycle()
    double.reset_counts()
    assert reconciler.cycle().actions == [] and double.request_count <= 2
    assert ("GET", "machines/?op=power_parameters") not in double.counts
    reconciler.log.request_resync("the test asks for one")
    double.reset_counts()
    reconciler.cycle()
    assert double.counts[("GET", "machines/?op=power_parameters")] == -(-1000 // POWER_PARAMETERS_CHUNK)
    assert all("S3CRET" not in str(v) for v in reconciler.known.values())
    assert len(reconciler.known) == 50     # the others' parameters are judged and dropped
    assert len(reconciler.owners) == 0     # no value needed looking up: nothing was hashed for it


def test_without_the_event_log_every_machine_is_swept_every_power_check_interval(double):
    from maas_kubevirt.audit import Audit
    from maas_kubevirt.maas import MAASClient, Signer
    from maas_kubevirt.reconcile import Passwords, Reconciler, Settings
    from reconcile_helpers import DOMAIN, SEED

    ipmi = double.add_machine(power_type="ipmi", status="Deployed")
    double.add_vm("web1", "vms", status="Deployed")
    clock = Clock()
    reconciler = Reconciler(MAASClient(double.url, Signer(*double.api_key), timeout=5),
                            Settings(domain=DOMAIN, resync_interval=None), Audit(""), passwords=Passwords(SEED),
                            clock=clock)

    def swept() -> bool:
        double.reset_counts()
        reconciler.cycle()
        return any(ipmi in url for url in double.urls if "op=power_parameters" in url)

    assert swept()
    assert not swept()
    clock.now += reconciler.settings.power_check_interval
    assert swept()
