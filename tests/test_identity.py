"""The identity rules: round trips, validity for each consumer, distinctness, clear rejections."""

from __future__ import annotations

import hashlib
import re
import uuid

import pytest
from hypothesis import assume, given, strategies as st

from maas_kubevirt import identity
from maas_kubevirt.identity import IdentityError
from strategies import dns_labels, namespaces, short_vm_names, vm_names

MAAS_HOSTNAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")  # one DNS label
MAAS_POOL = re.compile(r"^\w[ \w-]*$")
DOMAIN = "bmc.example.com"


@given(vm_names(), namespaces)
def test_serial_round_trips(vm, namespace):
    assert identity.parse_serial(identity.format_serial(vm, namespace)) == (vm, namespace)


@given(vm_names(), namespaces, vm_names(), namespaces)
def test_distinct_vms_get_distinct_serials_uuids_and_fallback_hostnames(vm1, ns1, vm2, ns2):
    assume((vm1, ns1) != (vm2, ns2))
    assert identity.format_serial(vm1, ns1) != identity.format_serial(vm2, ns2)
    assert identity.smbios_uuid(vm1, ns1) != identity.smbios_uuid(vm2, ns2)
    assert identity.fallback_hostname(vm1, ns1) != identity.fallback_hostname(vm2, ns2)


@given(short_vm_names(), namespaces, short_vm_names(), namespaces)
def test_distinct_vms_get_distinct_hosts(vm1, ns1, vm2, ns2):
    assume((vm1, ns1) != (vm2, ns2))
    assert identity.redfish_host(vm1, ns1, DOMAIN) != identity.redfish_host(vm2, ns2, DOMAIN)


@given(vm_names(), namespaces, vm_names(), namespaces)
def test_primary_hostnames_collide_only_where_the_readable_form_does(vm1, ns1, vm2, ns2):
    # <vm>-<ns> cannot tell web-1/vms from web/1-vms; the reconciler then uses the fallback.
    assume((vm1, ns1) != (vm2, ns2))
    if identity.maas_hostname(vm1, ns1) == identity.maas_hostname(vm2, ns2):
        assert f"{vm1}-{ns1}".replace(".", "-") == f"{vm2}-{ns2}".replace(".", "-")


@given(vm_names(), namespaces)
def test_hostnames_are_valid_maas_hostnames(vm, namespace):
    for name in (identity.maas_hostname(vm, namespace), identity.fallback_hostname(vm, namespace)):
        assert MAAS_HOSTNAME.match(name), name


@given(vm_names(), namespaces)
def test_short_names_keep_the_readable_hostname(vm, namespace):
    plain = f"{vm}-{namespace}".replace(".", "-")
    expected = plain if len(plain) <= 63 else identity.fallback_hostname(vm, namespace)
    assert identity.maas_hostname(vm, namespace) == expected


def test_the_readable_hostname_examples():
    assert identity.maas_hostname("web1", "vms") == "web1-vms"
    assert identity.maas_hostname("db.primary", "team-a") == "db-primary-team-a"
    long_vm = "x" * 60
    name = identity.maas_hostname(long_vm, "vms")
    assert len(name) <= 63 and name.startswith("x" * 40) and name == identity.fallback_hostname(long_vm, "vms")


@given(vm_names(), namespaces)
def test_uuid_is_rfc_syntax_and_matches_its_jmespath_definition(vm, namespace):
    value = identity.smbios_uuid(vm, namespace)
    parsed = uuid.UUID(value)
    assert str(parsed) == value
    assert parsed.version == 8 and parsed.variant == uuid.RFC_4122
    digest = hashlib.sha256(f"{namespace}/{vm}".encode()).hexdigest()
    # The same regex Kyverno's regex_replace_all applies, with Go's ${n} written as \g<n>.
    jmespath_form = re.sub(
        r"^(.{8})(.{4}).(.{3}).(.{3})(.{12}).*$", r"\g<1>-\g<2>-8\g<3>-8\g<4>-\g<5>", digest
    )
    assert value == jmespath_form


def test_web1_in_two_namespaces_differs():
    assert identity.smbios_uuid("web1", "a") != identity.smbios_uuid("web1", "b")


@given(short_vm_names(), namespaces)
def test_redfish_host_is_a_valid_dns_name(vm, namespace):
    host = identity.redfish_host(vm, namespace, DOMAIN)
    assert len(host) <= 253
    assert all(1 <= len(label) <= 63 for label in host.split("."))
    assert identity.parse_redfish_address(f"https://{host}", DOMAIN) == (vm, namespace)


def test_redfish_host_too_long_is_reported_not_mangled():
    vm = ".".join(["a" * 60] * 4)
    with pytest.raises(IdentityError, match="longer than the 253"):
        identity.redfish_host(vm, "vms", DOMAIN)


@given(namespaces)
def test_pool_is_the_namespace_and_valid_for_maas(namespace):
    assert identity.pool_name(namespace) == namespace
    assert MAAS_POOL.match(namespace)


@given(st.text(min_size=1, max_size=64), vm_names(), namespaces)
def test_password_is_32_hex_digits_of_the_keyed_hash(seed, vm, namespace):
    serial = identity.format_serial(vm, namespace)
    password = identity.bmc_password(seed, serial)
    assert password == hashlib.sha256(f"{seed}:{serial}".encode()).hexdigest()[:32]
    assert re.fullmatch(r"[0-9a-f]{32}", password)


def test_password_differs_by_serial_and_seed():
    assert identity.bmc_password("s" * 32, "web1.a") != identity.bmc_password("s" * 32, "web1.b")
    assert identity.bmc_password("s" * 32, "web1.a") != identity.bmc_password("t" * 32, "web1.a")


@pytest.mark.parametrize(
    "serial, rule",
    [
        ("web1", "no dot"),
        ("", "no dot"),
        ("web1.", "namespace '': must be a non-empty"),
        (".vms", "VM name '': must be a non-empty"),
        ("Web1.vms", "DNS-1123 subdomain"),
        ("web1.Vms", "DNS-1123 label"),
        ("web_1.vms", "DNS-1123 subdomain"),
        ("web1.-vms", "DNS-1123 label"),
        ("web1..vms", "DNS-1123 subdomain"),
        ("web1.vms\n", "DNS-1123 label"),
        ("web1." + "v" * 64, "longer than 63"),
        ("w" * 254 + ".vms", "longer than 253"),
        ("wéb1.vms", "DNS-1123 subdomain"),
        ("$(reboot).vms", "DNS-1123 subdomain"),
        ("Not Specified", "no dot"),
        ("8c4f6e3e-2b1d-4c5a-9e7f-0a1b2c3d4e5f", "no dot"),
    ],
)
def test_invalid_serials_are_rejected_naming_the_rule(serial, rule):
    with pytest.raises(IdentityError, match=re.escape(rule)):
        identity.parse_serial(serial)


@given(st.text(max_size=80))
def test_parse_serial_accepts_exactly_the_kubernetes_names(text):
    vm, dot, namespace = text.rpartition(".")
    label = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
    valid = (
        bool(dot)
        and re.fullmatch(label, namespace) is not None
        and len(namespace) <= 63
        and re.fullmatch(rf"{label}(\.{label})*", vm) is not None
        and len(vm) <= 253
        and all(len(part) <= 63 for part in vm.split("."))
    )
    try:
        assert identity.parse_serial(text) == (vm, namespace) and valid
    except IdentityError:
        assert not valid


@pytest.mark.parametrize(
    "address, expected",
    [
        ("https://web1.vms.bmc.example.com", ("web1", "vms")),
        ("http://web1.vms.bmc.example.com", ("web1", "vms")),
        ("web1.vms.bmc.example.com", ("web1", "vms")),
        ("HTTPS://WEB1.VMS.BMC.EXAMPLE.COM/", ("web1", "vms")),
        ("https://db.primary.vms.bmc.example.com:443/redfish/v1/Systems/1", ("db.primary", "vms")),
        ("https://web1.vms.bmc.example.com.evil.io", None),
        ("https://web1.vms.xbmc.example.com", None),
        ("https://vms.bmc.example.com", None),
        ("https://bmc.example.com", None),
        ("https://10.0.0.5", None),
        ("ftp://web1.vms.bmc.example.com", None),
        ("https://user@web1.vms.bmc.example.com", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_redfish_address_is_anchored_and_label_aligned(address, expected):
    assert identity.parse_redfish_address(address, DOMAIN) == expected


@given(short_vm_names(), namespaces, dns_labels(20))
def test_lookalike_domains_never_match(vm, namespace, evil):
    host = identity.redfish_host(vm, namespace, DOMAIN)
    assert identity.parse_redfish_address(f"https://{host}.{evil}", DOMAIN) is None
    assert identity.parse_redfish_address(f"https://{vm}.{namespace}.{evil}{DOMAIN}", DOMAIN) is None


@pytest.mark.parametrize("domain", ["", "localhost", "bmc..example.com", "bmc.example.com/x", "-bmc.example.com", "a" * 64 + ".com"])
def test_bad_domains_are_rejected(domain):
    with pytest.raises(IdentityError, match="domain"):
        identity.validate_domain(domain)
