"""Whose derived credentials a machine holds without an audit record (reconcile/owners.py): the
identities a hostname names, property-based, and the index of candidates' derived values."""

from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import assume, example, given, strategies as st

sys.path.insert(0, str(Path(__file__).parent))

from reconcile_helpers import SEED  # noqa: E402
from strategies import dns_labels, namespaces, vm_names  # noqa: E402

from maas_kubevirt import identity  # noqa: E402
from maas_kubevirt.reconcile import Passwords  # noqa: E402
from maas_kubevirt.reconcile.owners import MAX_READINGS, Owners, _readings, filed_as, named  # noqa: E402


def dashes(vm: str, namespace: str) -> int:
    return f"{vm}-{namespace}".count("-") + vm.count(".")


def readable(vm: str, namespace: str) -> bool:
    """Whether ``<vm>-<ns>`` is read whole by a fallback name (not cut) and fully by _readings."""
    plain = f"{vm.replace('.', '-')}-{namespace}"
    return len(plain) <= identity.LABEL_MAX - identity.HASH_SUFFIX - 1 and 2 ** dashes(vm, namespace) <= MAX_READINGS


@given(vm_names(3), namespaces)
@example("web1", "vms")
@example("web.prod", "my-ns")
def test_a_primary_name_names_its_identity(vm, namespace):
    hostname = identity.maas_hostname(vm, namespace)
    assume(hostname != identity.fallback_hostname(vm, namespace) or readable(vm, namespace))
    assume(2 ** dashes(vm, namespace) <= MAX_READINGS)
    assert (vm, namespace) in named(hostname)
    assert (vm, namespace) in named(hostname.upper())    # MAAS compares names case-insensitively


@given(vm_names(3), namespaces)
@example("web1", "vms")
def test_a_fallback_name_names_its_identity_when_it_was_not_cut(vm, namespace):
    assume(readable(vm, namespace))
    assert (vm, namespace) in named(identity.fallback_hostname(vm, namespace))


@given(st.one_of(st.text(max_size=70), dns_labels(), st.builds(identity.fallback_hostname, vm_names(2), namespaces)))
@example("web1-vms-9bbd588f")
@example("a-b-c-d-e-f-g-h-i-j-k")
def test_every_identity_named_has_that_name(hostname):
    """Sound whatever the text: each identity returned has it as its primary or fallback name."""
    for who in named(hostname):
        assert hostname.lower() in (identity.maas_hostname(*who), identity.fallback_hostname(*who))


@given(dns_labels())
def test_readings_are_bounded(text):
    assert len(list(_readings(text))) <= MAX_READINGS


def test_filed_as_takes_the_pool_for_a_primary_name_and_any_pool_for_a_fallback():
    fallback = identity.fallback_hostname("web1", "vms")
    assert filed_as({"hostname": "web1-vms", "pool": {"name": "vms"}}) == ("web1", "vms")
    assert filed_as({"hostname": "web1-vms", "pool": {"name": "default"}}) is None
    assert filed_as({"hostname": fallback, "pool": {"name": "default"}}) == ("web1", "vms")
    assert filed_as({"hostname": fallback, "pool": {"name": "racks"}}) == ("web1", "vms")
    assert filed_as({"hostname": "web1-vms-00000000", "pool": {"name": "default"}}) is None
    assert filed_as({"hostname": None, "pool": None}) is None


def test_the_index_finds_a_candidates_user_or_password_and_follows_its_generation():
    passwords = Passwords(SEED)
    owners = Owners(passwords)
    owners.listed([{"hostname": identity.fallback_hostname("web1", "vms")}, {"hostname": "lucky-cat"}], True)
    owners.index([("db", "team-b")])
    for who in (("web1", "vms"), ("db", "team-b")):
        assert owners.owner({"power_user": passwords.user(*who), "power_pass": "x"}) == who
        assert owners.owner({"power_user": "maas", "power_pass": passwords.password(*who)}) == who
        assert owners.owner({"power_pass": passwords.password(*who) + " "}) is None
    assert owners.owner({"power_user": identity.bmc_user("0" * 64, "web1.vms")}) is None    # another seed's
    # A rotation: the old generation's values are no candidate's any more, the new one's are.
    old = passwords.password("web1", "vms")
    passwords.generations[("web1", "vms")] = 1
    owners.index([])
    assert owners.owner({"power_pass": old}) is None
    assert owners.owner({"power_pass": passwords.password("web1", "vms")}) == ("web1", "vms")
    # db.team-b no longer a candidate: dropped from the index.
    assert owners.owner({"power_pass": passwords.password("db", "team-b")}) is None
    # A complete listing forgets the names no machine has any more.
    owners.listed([{"hostname": "lucky-cat"}], True)
    owners.index([])
    assert owners.owner({"power_pass": passwords.password("web1", "vms")}) is None


def test_the_index_keeps_no_derived_value():
    passwords = Passwords(SEED)
    owners = Owners(passwords)
    owners.listed([{"hostname": "web1-vms"}], True)
    owners.index([])
    kept = repr(vars(owners)) + repr(owners._index) + repr(owners._indexed)
    assert passwords.user("web1", "vms") not in kept and passwords.password("web1", "vms") not in kept
    assert SEED not in kept
