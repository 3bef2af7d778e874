"""The identity rules: round trips, validity for each consumer, distinctness, clear rejections."""

from __future__ import annotations

import hashlib
import re
import uuid

import pytest
from hypothesis import assume, example, given, strategies as st

from maas_kubevirt import identity
from maas_kubevirt.identity import IdentityError
from branches import branch, branches_taken
from hostile_addresses import HOSTILE
from strategies import dns_labels, namespaces, readable_collisions, serials, short_vm_names, vm_names

MAAS_HOSTNAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")  # one DNS label
MAAS_POOL = re.compile(r"^\w[ \w-]*$")
DOMAIN = "bmc.example.com"
VM_253 = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 61])  # the longest DNS-1123 subdomain
DOMAIN_249 = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 57])  # HOST_MAX - len("v.n.")


def readable(vm: str, namespace: str) -> str:
    return f"{vm}-{namespace}".replace(".", "-")


@given(vm_names(), namespaces)
@example(VM_253, "vms")
@example("a", "n" * 63)
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


@branches_taken(collide=0.3)
@given(readable_collisions() | st.tuples(st.tuples(vm_names(), namespaces), st.tuples(vm_names(), namespaces)))
@example((("web-1", "vms"), ("web", "1-vms")))
@example((("db.primary", "team-a"), ("db-primary", "team-a")))
def test_primary_hostnames_collide_exactly_where_the_readable_form_does(pair):
    # <vm>-<ns> cannot tell web-1/vms from web/1-vms; the reconciler then uses the fallback.
    (vm1, ns1), (vm2, ns2) = pair
    assume((vm1, ns1) != (vm2, ns2))
    same = readable(vm1, ns1) == readable(vm2, ns2) and len(readable(vm1, ns1)) <= 63
    assert (identity.maas_hostname(vm1, ns1) == identity.maas_hostname(vm2, ns2)) == branch("collide", same)


@given(vm_names(), namespaces)
def test_hostnames_are_valid_maas_hostnames(vm, namespace):
    for name in (identity.maas_hostname(vm, namespace), identity.fallback_hostname(vm, namespace)):
        assert MAAS_HOSTNAME.match(name), name


@branches_taken(readable=0.1)
@given(vm_names(), namespaces)
@example("a" * 59, "vms")  # <vm>-<ns> of exactly 63 characters: still readable
@example("a" * 60, "vms")  # 64: hashed
@example("a.b" * 10 + "c", "n" * 31)
def test_short_names_keep_the_readable_hostname(vm, namespace):
    plain = readable(vm, namespace)
    expected = plain if branch("readable", len(plain) <= 63) else identity.fallback_hostname(vm, namespace)
    assert identity.maas_hostname(vm, namespace) == expected


@branches_taken(cut_at_dash=0.2)
@given(vm_names() | st.builds("{}{}{}".format, st.text("abc123", min_size=53, max_size=53), st.sampled_from(".-"), dns_labels(9)), namespaces)
@example("a" * 53 + "-b", "vms")  # the 54-character cut ends in '-'
@example("a" * 53 + ".b", "vms")  # a dot there reads as a dash too
def test_fallback_hostname_is_the_cut_readable_form_without_trailing_dashes_and_a_hash(vm, namespace):
    cut = readable(vm, namespace)[:54]
    branch("cut_at_dash", cut.endswith("-"))
    digest = hashlib.sha256(f"{vm}.{namespace}".encode()).hexdigest()[:8]
    assert identity.fallback_hostname(vm, namespace) == cut.rstrip("-") + "-" + digest


def test_fallback_hostname_drops_the_dash_the_cut_leaves():
    vm = "a" * 53 + "-b"
    digest = hashlib.sha256(f"{vm}.vms".encode()).hexdigest()[:8]
    assert identity.fallback_hostname(vm, "vms") == "a" * 53 + "-" + digest


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
    assert identity.parse_redfish_address(host, DOMAIN) == (vm, namespace)


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
        (VM_253 + "d.vms", "longer than 253"),
        ("wéb1.vms", "DNS-1123 subdomain"),
        ("$(reboot).vms", "DNS-1123 subdomain"),
        ("Not Specified", "no dot"),
        ("8c4f6e3e-2b1d-4c5a-9e7f-0a1b2c3d4e5f", "no dot"),
    ],
)
def test_invalid_serials_are_rejected_naming_the_rule(serial, rule):
    with pytest.raises(IdentityError, match=re.escape(rule)):
        identity.parse_serial(serial)


@branches_taken(accepted=0.2, refused=0.2)
@given(serials())
@example(VM_253 + ".vms")
@example(VM_253 + "d.vms")
@example("web1." + "n" * 63)
@example("web1." + "n" * 64)
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
    if branch("accepted", valid):
        assert identity.parse_serial(text) == (vm, namespace)
    elif branch("refused", True):
        with pytest.raises(IdentityError):
            identity.parse_serial(text)


@pytest.mark.parametrize(
    "address, expected",
    [
        ("web1.vms.bmc.example.com", ("web1", "vms")),
        ("WEB1.VMS.BMC.EXAMPLE.COM", ("web1", "vms")),  # ASCII, compared case-insensitively
        ("db.primary.vms.bmc.example.com", ("db.primary", "vms")),
        ("web1.vms.xbmc.example.com", None),
        ("vms.bmc.example.com", None),
        ("bmc.example.com", None),
        ("10.0.0.5", None),
        ("", None),
        (None, None),
        (42, None),
    ],
)
def test_parse_redfish_address_takes_the_bare_host_only(address, expected):
    assert identity.parse_redfish_address(address, DOMAIN) == expected


@pytest.mark.parametrize("address", HOSTILE)
def test_hostile_addresses_are_never_canonical(address):
    assert identity.parse_redfish_address(address, DOMAIN) is None


@pytest.mark.parametrize("address", [a for a in HOSTILE if "\u212a" not in a])
def test_hostile_addresses_that_name_web1_are_suspects_of_it(address):
    """Every look-alike that can be undone to web1.vms is a suspect naming it (the rest name nothing)."""
    assert identity.suspect_identity(address, DOMAIN) in (("web1", "vms"), None)


def test_kelvin_sign_is_a_suspect_of_the_vm_it_imitates():
    assert identity.parse_redfish_address("\u212aube.vms.bmc.example.com", DOMAIN) is None
    assert identity.suspect_identity("\u212aube.vms.bmc.example.com", DOMAIN) == ("kube", "vms")


@pytest.mark.parametrize("address, expected", [
    ("https://web1.vms.bmc.example.com", ("web1", "vms")),
    ("user@web1.vms.bmc.example.com:31234/x?y#z", ("web1", "vms")),
    ("web1.vms.bmc.example.com.", ("web1", "vms")),
    ("web1.vms.bmc.example.com.evil.io", ("web1", "vms")),
    ("web1%2evms.bmc.example.com", ("web1", "vms")),
    ("\uff57eb1.vms.bmc.example.com", ("web1", "vms")),
    ("web1.vms.bmc.example.com", None),          # canonical: not a suspect
    ("web1.vms.xbmc.example.com", None),
    ("evil.io", None),
    (None, None),
])
def test_suspect_identity_names_what_a_look_alike_imitates(address, expected):
    assert identity.suspect_identity(address, DOMAIN) == expected


@given(short_vm_names(), namespaces, st.text(max_size=8), st.text(max_size=8))
def test_only_the_bare_host_itself_is_canonical(vm, namespace, before, after):
    """Anything added around the canonical host makes it not canonical, whatever it is."""
    host = identity.redfish_host(vm, namespace, DOMAIN)
    address = before + host + after
    parsed = identity.parse_redfish_address(address, DOMAIN)
    if parsed is not None:
        assert address.lower() == identity.redfish_host(*parsed, DOMAIN)
        assert address.isascii()
    if before == after == "":
        assert parsed == (vm, namespace)
    elif parsed is None and identity.suspect_identity(address, DOMAIN) == (vm, namespace):
        assert address.lower() != host


@given(st.text(max_size=60))
def test_parse_redfish_address_accepts_only_what_it_would_write(text):
    parsed = identity.parse_redfish_address(text, DOMAIN)
    if parsed is not None:
        assert text.lower() == identity.redfish_host(*parsed, DOMAIN)
        assert identity.suspect_identity(text, DOMAIN) is None


@given(short_vm_names(), namespaces, dns_labels(20))
def test_lookalike_domains_never_match(vm, namespace, evil):
    host = identity.redfish_host(vm, namespace, DOMAIN)
    assert identity.parse_redfish_address(f"{host}.{evil}", DOMAIN) is None
    assert identity.parse_redfish_address(f"{vm}.{namespace}.{evil}{DOMAIN}", DOMAIN) is None


@pytest.mark.parametrize("domain", ["", "localhost", "bmc..example.com", "bmc.example.com/x", "-bmc.example.com", "a" * 64 + ".com"])
def test_bad_domains_are_rejected(domain):
    with pytest.raises(IdentityError, match="domain"):
        identity.validate_domain(domain)


def test_domain_length_limit_leaves_room_for_the_shortest_vm_and_namespace():
    assert len(DOMAIN_249) == 249
    assert identity.validate_domain(DOMAIN_249) == DOMAIN_249
    assert identity.validate_domain(DOMAIN_249.upper() + ".") == DOMAIN_249
    assert identity.redfish_host("v", "n", DOMAIN_249) == "v.n." + DOMAIN_249
    with pytest.raises(IdentityError, match="too long to leave room"):
        identity.validate_domain("e" + DOMAIN_249)


def test_redfish_host_of_exactly_253_characters_is_accepted():
    domain = DOMAIN_249[: 249 - 2]  # "v.n." + 247 characters = 251; add one to each of vm and namespace
    host = identity.redfish_host("vv", "nn", domain)
    assert len(host) == 253
    with pytest.raises(IdentityError, match="254 characters"):
        identity.redfish_host("vvv", "nn", domain)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: identity.validate_namespace("Vms"),
         "namespace 'Vms': not a DNS-1123 label (lower-case letters, digits and '-', starting and ending with a letter or digit)"),
        (lambda: identity.validate_namespace(5), "namespace 5: must be a non-empty string"),
        (lambda: identity.validate_vm_name("a" * 64 + ".b"),
         f"VM name {'a' * 64 + '.b'!r}: not a DNS-1123 subdomain (dot-separated labels of 1-63 lower-case letters, "
         "digits and '-', each starting and ending with a letter or digit)"),
        (lambda: identity.validate_vm_name(["web1"]), "VM name ['web1']: must be a non-empty string"),
        (lambda: identity.validate_domain(""), "domain '': must be a non-empty DNS name"),
        (lambda: identity.validate_domain(5), "domain 5: must be a non-empty DNS name"),
        (lambda: identity.validate_domain("localhost"),
         "domain 'localhost': not a DNS name of two or more labels (letters, digits and '-', 1-63 characters each)"),
        (lambda: identity.parse_serial(None), "serial None: must be a string"),
        (lambda: identity.bmc_password("", "web1.vms"), "seed: must be a non-empty string"),
        (lambda: identity.bmc_password(5, "web1.vms"), "seed: must be a non-empty string"),
        (lambda: identity.bmc_password(b"seed", "web1.vms"), "seed: must be a non-empty string"),
    ],
)
def test_each_rule_is_named_in_full(call, message):
    with pytest.raises(IdentityError) as raised:
        call()
    assert str(raised.value) == message


def test_a_label_longer_than_63_is_refused_inside_a_short_vm_name():
    with pytest.raises(IdentityError, match="not a DNS-1123 subdomain"):
        identity.parse_serial("a" * 64 + ".b.vms")


@pytest.mark.parametrize("domain", ["example.com", "EXAMPLE.com.", "a.b", "x-1.y2"])
def test_two_label_domains_are_enough(domain):
    assert identity.validate_domain(domain) == domain.lower().rstrip(".")


# Credential generations (rotation): 0 is the derivation every site had before, each later one
# is a different password and user for that VM alone.

@given(st.integers(min_value=0, max_value=identity.GENERATION_MAX))
def test_a_generation_round_trips_through_its_configmap_text(generation):
    assert identity.parse_generation(str(generation)) == generation


@given(st.text(max_size=12))
@example("01")
@example("-1")
@example("1000000000")
@example(" 1")
@example("")
def test_a_generation_text_is_a_plain_decimal_or_refused(text):
    try:
        generation = identity.parse_generation(text)
    except IdentityError as failure:
        assert "credential generation" in str(failure)
        assert not (text.isascii() and text.isdigit() and str(int(text)) == text
                    and int(text) <= identity.GENERATION_MAX)
    else:
        assert str(generation) == text


@given(vm_names(), namespaces, st.integers(min_value=1, max_value=identity.GENERATION_MAX))
def test_each_generation_derives_its_own_password_and_user(vm, namespace, generation):
    seed, serial = "s" * 64, identity.format_serial(vm, namespace)
    assert identity.bmc_password(seed, serial, 0) == identity.bmc_password(seed, serial)
    assert identity.bmc_user(seed, serial, 0) == identity.bmc_user(seed, serial)
    rotated = identity.bmc_password(seed, serial, generation)
    assert rotated == hashlib.sha256(f"{seed}:{serial}:{generation}".encode()).hexdigest()[:32]
    assert rotated != identity.bmc_password(seed, serial)
    assert identity.bmc_user(seed, serial, generation) == identity.BMC_USER_PREFIX + hashlib.sha256(
        f"{seed}:user:{serial}:{generation}".encode()).hexdigest()[:32]
    assert identity.bmc_user(seed, serial, generation) != identity.bmc_user(seed, serial, generation - 1)


@pytest.mark.parametrize("generation", [-1, True, 1.0, "1", identity.GENERATION_MAX + 1])
def test_a_generation_that_is_not_a_small_whole_number_is_refused(generation):
    with pytest.raises(IdentityError, match="credential generation"):
        identity.bmc_password("seed", "vm.ns", generation)
