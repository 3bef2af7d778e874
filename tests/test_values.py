"""The values file: defaults, overrides, and one clear problem per bad key."""

from __future__ import annotations

import copy
import ipaddress

import pytest
import yaml
from hypothesis import assume, example, given, strategies as st

from branches import branch, branches_taken

from maas_kubevirt import cli
from maas_kubevirt.values import DEFAULT_VALUES_PATH, SCALARS, SCHEMA, ValuesError, load_values, validate

DEFAULTS = yaml.safe_load(DEFAULT_VALUES_PATH.read_text())


def write(tmp_path, data) -> str:
    path = tmp_path / "values.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return str(path)


def test_defaults_cover_exactly_the_schema():
    assert {section: set(keys) for section, keys in SCHEMA.items()} == {
        section: set(keys) for section, keys in DEFAULTS.items() if section not in SCALARS
    }
    assert {key: DEFAULTS[key] for key in SCALARS} == {"exposure": "ingress", "pools": []}
    assert load_values(None)["redfish"]["domain"] == "bmc.example.com"


def test_overrides_merge_over_defaults(tmp_path):
    values = load_values(write(tmp_path, {"redfish": {"domain": "BMC.Lab.Example.org"}}))
    assert values["redfish"]["domain"] == "bmc.lab.example.org"
    assert values["redfish"] == {**DEFAULTS["redfish"], "domain": "bmc.lab.example.org"}
    assert values["maas"] == DEFAULTS["maas"]


def test_empty_file_means_defaults(tmp_path):
    assert load_values(write(tmp_path, "")) == load_values(None)


def test_bare_off_means_off(tmp_path):
    assert load_values(write(tmp_path, "redfish:\n  check: off\n"))["redfish"]["check"] == "off"


@pytest.mark.parametrize(
    "override, problem",
    [
        ({"redfish": {"domain": "not a domain"}}, "redfish.domain: expected a DNS name such as bmc.example.com, found 'not a domain'"),
        ({"redfish": {"check": "maybe"}}, "redfish.check: expected one of off, advisory, strict, found 'maybe'"),
        ({"redfish": {"colour": "blue"}}, "redfish.colour: unknown key; expected one of domain, check"),
        ({"smbios": {"manufacturer": ""}}, "smbios.manufacturer: expected a non-empty printable string, found an empty string"),
        ({"kubernetes": {"opt_in_label": "bad key/with/slashes"}}, "kubernetes.opt_in_label: expected a Kubernetes label key"),
        ({"kubernetes": {"system_namespace": "Kube_System"}}, "kubernetes.system_namespace: expected a Kubernetes namespace name"),
        ({"ingress": {"source_ranges": ["10.0.0.1/8"]}}, "ingress.source_ranges[0]: expected a CIDR such as 10.0.0.0/8, found '10.0.0.1/8'"),
        ({"ingress": {"source_ranges": "10.0.0.0/8"}}, "ingress.source_ranges: expected a list of CIDRs"),
        ({"kubernetes": {"pod_cidrs": ["10.244.0.1/16"]}},
         "kubernetes.pod_cidrs[0]: expected an IPv4 CIDR such as 10.244.0.0/16, found '10.244.0.1/16'"),
        ({"kubernetes": {"pod_cidrs": ["fd00:10:244::/56"]}},
         "kubernetes.pod_cidrs[0]: expected an IPv4 CIDR such as 10.244.0.0/16 (IPv6 pod networks are not checked yet)"),
        ({"kubernetes": {"pod_cidrs": ["0.0.0.0/0"]}}, "kubernetes.pod_cidrs[0]: expected the pod network, narrower than /0"),
        ({"kubernetes": {"pod_cidrs": "10.244.0.0/16"}}, "kubernetes.pod_cidrs: expected a list of IPv4 CIDRs"),
        ({"kubernetes": {"pod_cidrs": [16]}}, "kubernetes.pod_cidrs[0]: expected an IPv4 CIDR such as 10.244.0.0/16, found 16"),
        ({"ingress": {"annotations": {"a/b": 5}}}, "ingress.annotations['a/b']: expected a string value (quote it), found 5"),
        ({"maas": {"interval": 0}}, "maas.interval: expected a whole number of seconds from 1 to 86400, found 0"),
        ({"maas": {"timeout": "30"}}, "maas.timeout: expected a whole number of seconds from 1 to 600, found '30'"),
        ({"maas": {"url": "localhost:5240"}}, "maas.url: expected an http:// or https:// URL"),
        ({"maas": {"commission": "always"}}, "maas.commission: expected one of auto, approved, never, found 'always'"),
        ({"maas": {"api_key_file": "api-key"}}, "maas.api_key_file: expected an absolute file path"),
        ({"maas": None}, "maas: expected a mapping, found nothing"),
        ({"extra": {}}, "extra: unknown key"),
    ],
)
def test_each_bad_key_is_named_with_expected_and_found(tmp_path, override, problem):
    with pytest.raises(ValuesError) as raised:
        load_values(write(tmp_path, override))
    assert any(p.startswith(problem) for p in raised.value.problems), raised.value.problems


def test_every_problem_is_reported_at_once(tmp_path):
    with pytest.raises(ValuesError) as raised:
        load_values(write(tmp_path, {"redfish": {"domain": "a b", "check": 1}, "maas": {"interval": -1}}))
    assert len(raised.value.problems) == 3


# Retired keys, whatever value they are given: ignoring one would let an operator believe it
# still has an effect, so each is refused with the reason it went.
RETIRED_KEYS = {
    # MAAS keeps a Redfish address only as a bare host and its driver adds https:// itself.
    "scheme": "MAAS stores the Redfish address as a bare host and always reaches it over https://",
    # One user for every VM put them all on one BMC row in MAAS, password included.
    "username": ("each VM's BMC user is derived from the seed like its password, so that no other "
                 "machine can share its BMC row in MAAS"),
}


@pytest.mark.parametrize("key, value", [
    ("scheme", "https"), ("scheme", "http"), ("scheme", "ftp"), ("scheme", None),
    ("username", "maas"), ("username", "maas-kubevirt-0123"), ("username", None),
])
def test_retired_redfish_keys_are_refused_with_their_reason(tmp_path, key, value):
    with pytest.raises(ValuesError) as raised:
        load_values(write(tmp_path, {"redfish": {key: value}}))
    assert raised.value.problems == [f"redfish.{key}: no longer supported: {RETIRED_KEYS[key]}; remove the key"]


@pytest.mark.parametrize("line", ["scheme: https", "username: maas"])
def test_a_values_file_setting_a_retired_key_exits_2(tmp_path, capsys, line):
    output = tmp_path / "out"
    code = cli.main(["--values", write(tmp_path, f"redfish:\n  {line}\n"), "render", "--output", str(output)])
    assert code == 2 and not output.exists()
    key = line.split(":")[0]
    assert f"redfish.{key}: no longer supported" in capsys.readouterr().err


def test_a_bad_pod_cidr_exits_2_with_one_line(tmp_path, capsys):
    output = tmp_path / "out"
    code = cli.main(["--values", write(tmp_path, "kubernetes:\n  pod_cidrs: [10.244.0.0/33]\n"),
                     "render", "--output", str(output)])
    err = capsys.readouterr().err
    assert code == 2 and not output.exists()
    assert [line for line in err.splitlines() if "pod_cidrs" in line] == [
        "maas-kubevirt: error: kubernetes.pod_cidrs[0]: expected an IPv4 CIDR such as 10.244.0.0/16, found '10.244.0.0/33'"], err


def test_invalid_yaml_names_the_line(tmp_path):
    with pytest.raises(ValuesError, match=r"not valid YAML at line 3, column 1: expected .,. or .]."):
        load_values(write(tmp_path, "redfish:\n  domain: [unclosed\n"))


def test_missing_file_is_reported(tmp_path):
    with pytest.raises(ValuesError, match="cannot read the values file"):
        load_values(str(tmp_path / "absent.yaml"))


def test_a_list_instead_of_a_mapping(tmp_path):
    with pytest.raises(ValuesError, match="expected a mapping of sections, found a list"):
        load_values(write(tmp_path, "- a\n- b\n"))


LEAVES = [(section, key) for section, keys in SCHEMA.items() for key in keys]
ANY_YAML = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)


@branches_taken(refused=0.3, accepted=0.05)
@given(st.sampled_from(LEAVES), ANY_YAML | st.just("default"))
@example(("maas", "interval"), True)
@example(("maas", "timeout"), False)
def test_any_leaf_value_is_accepted_or_named(leaf, value):
    section, key = leaf
    default = DEFAULTS[section][key]
    value = copy.deepcopy(default) if value == "default" else value
    values = copy.deepcopy(DEFAULTS)
    values[section][key] = value
    if branch("refused", type(value) is not type(default)):
        # A value of another YAML type than the default's is never right (a bool is not seconds).
        with pytest.raises(ValuesError) as raised:
            validate(values)
        assert raised.value.problems and all(p.startswith(f"{section}.{key}") for p in raised.value.problems)
    elif branch("accepted", value == default):
        assert validate(values)[section][key] == default
    else:
        try:
            validate(values)
        except ValuesError as error:
            assert all(p.startswith(f"{section}.{key}") for p in error.problems), error.problems


def test_cli_bad_values_exit_2_and_render_nothing(tmp_path, capsys):
    output = tmp_path / "out"
    code = cli.main(["--values", write(tmp_path, {"maas": {"commission": "always"}}), "render", "--output", str(output)])
    assert code == 2
    assert not output.exists()
    assert capsys.readouterr().err == (
        "maas-kubevirt: error: maas.commission: expected one of auto, approved, never, found 'always'\n"
    )


@pytest.mark.parametrize(
    "section, key, value, accepted",
    [
        ("maas", "interval", 1, True),
        ("maas", "interval", 86400, True),
        ("maas", "interval", 0, False),
        ("maas", "interval", 86401, False),
        ("maas", "interval", True, False),
        ("maas", "interval", 60.0, False),
        ("maas", "timeout", 1, True),
        ("maas", "timeout", 600, True),
        ("maas", "timeout", 0, False),
        ("maas", "timeout", 601, False),
        ("maas", "timeout", True, False),
        ("maas", "url", "https://maas.example.com:5443/MAAS/", True),
        ("maas", "url", "ftp://maas.example.com/MAAS/", False),
        ("maas", "url", "file:///etc/passwd", False),
        ("maas", "url", "http://maas example/MAAS/", False),
        ("maas", "url", "http:///MAAS/", False),
        ("kubernetes", "opt_in_label", "a" * 63, True),
        ("kubernetes", "opt_in_label", "a" * 64, False),
        ("kubernetes", "opt_in_label", "maas.io/" + "a" * 63, True),
        ("kubernetes", "opt_in_label", "maas.io/" + "a" * 64, False),
        ("kubernetes", "opt_in_label", "maas.io/", False),
        ("kubernetes", "opt_in_value", "v" * 63, True),
        ("kubernetes", "opt_in_value", "v" * 64, False),
        ("smbios", "manufacturer", "Kube Virt", True),
        ("smbios", "manufacturer", "KubeVirt\n", False),
        ("smbios", "manufacturer", "Kube\x1b[2JVirt", False),
        ("smbios", "manufacturer", "Kube\tVirt", False),
        ("smbios", "manufacturer", "   ", False),
        ("maas", "approval_tag", "approved\x00", False),
        ("maas", "api_key_file", "/etc/maas-kubevirt/api\x00key", False),
        ("ingress", "tls_secret", None, False),
        ("ingress", "cluster_issuer", None, False),
        ("maas", "audit_log", None, False),
        ("seed", "file", None, False),
        ("ingress", "tls_secret", "", True),
        ("maas", "audit_log", "", True),
        ("maas", "audit_log", "audit.log", False),
        ("ingress", "controller_namespace", "ingress-nginx", True),
        ("ingress", "controller_namespace", "kube-system", True),
        ("ingress", "controller_namespace", "Ingress_Nginx", False),
        ("ingress", "controller_namespace", "", False),
        ("ingress", "allow_catch_all", True, True),
        ("ingress", "allow_catch_all", False, True),
        ("ingress", "allow_catch_all", "false", False),
        ("ingress", "allow_catch_all", 0, False),
        ("maas", "power_check_interval", 60, True),
        ("maas", "power_check_interval", 86400, True),
        ("maas", "power_check_interval", 59, False),
        ("maas", "power_check_interval", 86401, False),
        ("maas", "power_check_interval", True, False),
    ],
)
def test_boundaries_types_and_control_characters(section, key, value, accepted):
    values = copy.deepcopy(DEFAULTS)
    values[section][key] = value
    if accepted:
        assert validate(values)[section][key] == value
    else:
        with pytest.raises(ValuesError) as raised:
            validate(values)
        assert len(raised.value.problems) == 1 and raised.value.problems[0].startswith(f"{section}.{key}: expected ")


@pytest.mark.parametrize(
    "section, key, value, problem",
    [
        ("maas", "adopt_pools", "lab", "expected a list of MAAS resource pool names (may be empty), found 'lab'"),
        ("redfish", "check", True, "expected one of off, advisory, strict, found true"),
        ("seed", "file", 5, "expected a file path, found 5"),
        ("seed", "file", "/etc/\0seed", "expected a file path, found '/etc/\\x00seed'"),
        ("kubernetes", "system_namespace", "Kube_System",
         "expected a Kubernetes namespace name (DNS-1123 label), found 'Kube_System'"),
        ("kubernetes", "seed_secret", "-x", "expected a Kubernetes object name (DNS-1123 subdomain), found '-x'"),
        ("kubernetes", "opt_in_label", "a/b/c",
         "expected a Kubernetes label key ([prefix/]name, name 1-63 characters), found 'a/b/c'"),
        ("kubernetes", "opt_in_value", "",
         "expected a non-empty Kubernetes label value (1-63 letters, digits, '-', '_', '.'), found an empty string"),
        ("ingress", "class_name", None, "expected a Kubernetes object name (DNS-1123 subdomain), found nothing"),
        ("gateway", "class_name", "Traefik", "expected a Kubernetes object name (DNS-1123 subdomain), found 'Traefik'"),
        ("gateway", "class_name", "", "expected a Kubernetes object name (DNS-1123 subdomain), found an empty string"),
        ("gateway", "traefik_crds", "auto", "expected true or false, found 'auto'"),
        ("gateway", "traefik_crds", 1, "expected true or false, found 1"),
        ("ingress", "tls_secret", "A",
         "expected a Kubernetes object name (DNS-1123 subdomain), or an empty string, found 'A'"),
        ("ingress", "annotations", [], "expected a mapping of annotation keys to string values, found a list"),
        ("maas", "approval_tag", "", "expected a MAAS tag name (letters, digits, '_' and '-'), found an empty string"),
        ("maas", "on_hostname_taken", "x", "expected one of fallback, skip, found 'x'"),
        ("maas", "interval", 0.5, "expected a whole number of seconds from 1 to 86400, found 0.5"),
        ("maas", "audit_log", "audit.log", "expected an absolute file path, or an empty string, found 'audit.log'"),
        ("maas", "url", "x", "expected an http:// or https:// URL, found 'x'"),
    ],
)
def test_each_problem_reads_in_full(section, key, value, problem):
    values = copy.deepcopy(DEFAULTS)
    values[section][key] = value
    with pytest.raises(ValuesError) as raised:
        validate(values)
    assert raised.value.problems == [f"{section}.{key}: {problem}"]


def test_collection_problems_name_the_item():
    values = copy.deepcopy(DEFAULTS)
    values["ingress"]["source_ranges"] = ["10.0.0.0/8", 5, "10.0.0.1/8"]
    values["ingress"]["annotations"] = {"bad key": "v", "ok/key": 1}
    with pytest.raises(ValuesError) as raised:
        validate(values)
    assert raised.value.problems == [
        "ingress.source_ranges[1]: expected a CIDR such as 10.0.0.0/8, found 5",
        "ingress.source_ranges[2]: expected a CIDR such as 10.0.0.0/8, found '10.0.0.1/8'",
        "ingress.annotations['bad key']: expected an annotation key ([prefix/]name), found 'bad key'",
        "ingress.annotations['ok/key']: expected a string value (quote it), found 1",
    ]


def test_adopt_pools_name_each_bad_pool_by_its_index():
    """MAAS's own rule for a pool name (src/maasserver/models/resourcepool.py: ^\\w[ \\w-]*$)."""
    values = copy.deepcopy(DEFAULTS)
    values["maas"]["adopt_pools"] = ["lab", "", " lab", "-lab", "a/b", "lab\n", "a\tb", 5, None, "p" * 257, "ok"]
    with pytest.raises(ValuesError) as raised:
        validate(values)
    expected = "expected a MAAS resource pool name (a letter, digit or '_', then those, '-' and spaces), found"
    assert raised.value.problems == [
        f"maas.adopt_pools[1]: {expected} an empty string",
        f"maas.adopt_pools[2]: {expected} ' lab'",
        f"maas.adopt_pools[3]: {expected} '-lab'",
        f"maas.adopt_pools[4]: {expected} 'a/b'",
        f"maas.adopt_pools[5]: {expected} 'lab\\n'",
        f"maas.adopt_pools[6]: {expected} 'a\\tb'",
        f"maas.adopt_pools[7]: {expected} 5",
        f"maas.adopt_pools[8]: {expected} nothing",
        f"maas.adopt_pools[9]: {expected} {'p' * 257!r}",  # MAAS keeps at most 256 characters
    ]


def test_every_section_and_key_is_checked_after_a_problem():
    values = copy.deepcopy(DEFAULTS)
    values["redfish"] = 5
    del values["kubernetes"]["system_namespace"]
    values["kubernetes"]["opt_in_value"] = ""
    values["maas"] = None
    values["extra"] = {}
    with pytest.raises(ValuesError) as raised:
        validate(values)
    assert raised.value.problems == [
        "extra: unknown key; expected one of exposure, pools, redfish, seed, smbios, kubernetes, ingress, gateway, bmc_proxy, maas, "
        "reconciler",
        "redfish: expected a mapping, found 5",
        "kubernetes.system_namespace: expected a value, found nothing",
        "kubernetes.opt_in_value: expected a non-empty Kubernetes label value (1-63 letters, digits, '-', '_', '.'), "
        "found an empty string",
        "maas: expected a mapping, found nothing",
    ]
    assert str(raised.value) == "\n".join(raised.value.problems)


def test_not_a_mapping_names_the_source():
    with pytest.raises(ValuesError) as raised:
        validate([1])
    assert raised.value.problems == ["values: expected a mapping of sections, found a list"]
    with pytest.raises(ValuesError) as raised:
        validate("x", "site.yaml")
    assert raised.value.problems == ["site.yaml: expected a mapping of sections, found 'x'"]


def test_a_section_overridden_by_a_scalar_is_reported_as_given(tmp_path):
    with pytest.raises(ValuesError) as raised:
        load_values(write(tmp_path, "redfish: 5\n"))
    assert raised.value.problems == ["redfish: expected a mapping, found 5"]


def test_unreadable_and_undecodable_files_say_so(tmp_path):
    missing = tmp_path / "absent.yaml"
    with pytest.raises(ValuesError) as raised:
        load_values(str(missing))
    assert raised.value.problems == [f"{missing}: cannot read the values file: No such file or directory"]
    control = tmp_path / "control.yaml"
    control.write_text("redfish:\n  domain: a\x07b\n")
    with pytest.raises(ValuesError) as raised:
        load_values(str(control))
    assert raised.value.problems == [f"{control}: not valid YAML: invalid YAML"]


@pytest.mark.parametrize(
    "section, key, value, accepted",
    [
        ("kubernetes", "seed_secret", "s" * 253, True),
        ("kubernetes", "seed_secret", "s" * 254, False),
        ("kubernetes", "opt_in_label", "p" * 253 + "/name", True),
        ("kubernetes", "opt_in_label", "p" * 254 + "/name", False),
        ("maas", "approval_tag", "t", True),
        ("maas", "approval_tag", "t" * 256, True),
        ("maas", "approval_tag", "t" * 257, False),
        ("maas", "adopt_pools", [], True),  # the default: only the reconciler's own pools
        ("maas", "adopt_pools", ["lab"], True),
        ("maas", "adopt_pools", ["Lab Pool-2", "_x", "9", "a  b--"], True),
        ("maas", "adopt_pools", ["p" * 256], True),
        ("maas", "adopt_pools", "lab", False),  # one name, not a list
        ("maas", "adopt_pools", None, False),
        ("maas", "adopt_pools", {"lab": True}, False),
        ("ingress", "source_ranges", ["10.0.0.0/8", "fd00::/8"], True),
        ("ingress", "source_ranges", [], False),
    ],
)
def test_length_limits_and_accepted_forms(section, key, value, accepted):
    test_boundaries_types_and_control_characters(section, key, value, accepted)


@pytest.mark.parametrize(
    "section, key, value, accepted",
    [
        ("maas", "max_response_mib", 1, True),
        ("maas", "max_response_mib", 65536, True),
        ("maas", "max_response_mib", 0, False),
        ("maas", "max_response_mib", 65537, False),
        ("maas", "max_response_mib", True, False),
        ("maas", "max_response_mib", 2.5, False),
        ("ingress", "source_ranges", ["0.0.0.0/1", "::/1"], True),
        ("kubernetes", "pod_cidrs", [], True),
        ("kubernetes", "pod_cidrs", ["10.244.0.0/16", "10.96.0.0/12", "192.168.5.128/25", "10.1.2.3/32"], True),
        ("kubernetes", "pod_cidrs", None, False),
        ("ingress", "tls_secret", "wildcard-tls", True),
        ("ingress", "cluster_issuer", "letsencrypt", True),
        ("maas", "audit_log", "/var/log/maas-kubevirt/audit.log", True),
    ],
)
def test_more_limits_and_optional_values_given(section, key, value, accepted):
    test_boundaries_types_and_control_characters(section, key, value, accepted)


def test_source_ranges_refuse_nothing_and_everything():
    values = copy.deepcopy(DEFAULTS)
    values["ingress"]["source_ranges"] = []
    with pytest.raises(ValuesError) as raised:
        validate(values)
    assert raised.value.problems == [
        "ingress.source_ranges: expected at least one CIDR, such as the MAAS rack controllers' "
        "(an empty list would leave every BMC open), found a list"]
    values["ingress"]["source_ranges"] = ["10.0.0.0/8", "0.0.0.0/0", "::/0"]
    with pytest.raises(ValuesError) as raised:
        validate(values)
    assert raised.value.problems == [
        f"ingress.source_ranges[{i}]: expected a CIDR narrower than /0 (the rack controllers, not the whole "
        f"Internet), found {cidr!r}" for i, cidr in ((1, "0.0.0.0/0"), (2, "::/0"))]


def test_allowlist_annotation_is_an_annotation_key_or_empty():
    values = copy.deepcopy(DEFAULTS)
    for accepted in ("", "nginx.ingress.kubernetes.io/whitelist-source-range", "allowlist", "haproxy.org/allow-list"):
        values["ingress"]["allowlist_annotation"] = accepted
        assert validate(copy.deepcopy(values))["ingress"]["allowlist_annotation"] == accepted
    values["ingress"]["allowlist_annotation"] = "bad key"
    with pytest.raises(ValuesError) as raised:
        validate(values)
    assert raised.value.problems == [
        "ingress.allowlist_annotation: expected an annotation key ([prefix/]name), or an empty string, found 'bad key'"]


NGINX_NAMES = ["nginx.ingress.kubernetes.io/allowlist-source-range", "nginx.ingress.kubernetes.io/whitelist-source-range"]


@given(st.one_of(st.sampled_from(NGINX_NAMES + [""]),
                 st.sampled_from(NGINX_NAMES).map(lambda n: n.replace("-", "_")),   # typos of the right name
                 st.sampled_from(NGINX_NAMES).map(lambda n: n.replace("-source", "-Source")),
                 st.sampled_from(NGINX_NAMES).map(lambda n: n + "s"),
                 st.from_regex(r"[a-z]([a-z0-9-]{0,10}[a-z0-9])?(\.[a-z]([a-z0-9-]{0,10}[a-z0-9])?){0,2}"
                               r"/[a-z]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True)))
@example("nginx.ingress.kubernetes.io/allow-list-source-range")
@example("nginx.ingress.kubernetes.io.example.org/allowlist")
@example("haproxy.org/allow-list")
@example("allowlist-source-range")
def test_under_the_nginx_prefix_only_ingress_nginx_allowlist_names(name):
    """Under ingress.annotation_prefix ingress-nginx ignores any other annotation: a misspelt one would
    leave every BMC open. Whatever the class is called: its name no longer says which controller serves it."""
    values = copy.deepcopy(DEFAULTS)
    values["ingress"]["allowlist_annotation"] = name
    if name in NGINX_NAMES + [""] or not name.startswith("nginx.ingress.kubernetes.io/"):
        assert validate(copy.deepcopy(values))["ingress"]["allowlist_annotation"] == name
    else:
        for class_name in ("maas-kubevirt-bmc", "nginx", "haproxy"):
            values["ingress"]["class_name"] = class_name
            with pytest.raises(ValuesError) as raised:
                validate(copy.deepcopy(values))
            assert raised.value.problems == [
                f"ingress.allowlist_annotation: expected {NGINX_NAMES[0]}, {NGINX_NAMES[1]}, an empty string, or "
                "another controller's annotation (the only allowlists ingress-nginx reads under "
                f"ingress.annotation_prefix nginx.ingress.kubernetes.io), found {name!r}"]


def test_the_typo_check_follows_the_annotation_prefix():
    """A controller run with --annotations-prefix example.io reads example.io/allowlist-source-range."""
    values = copy.deepcopy(DEFAULTS)
    values["ingress"].update(annotation_prefix="example.io", allowlist_annotation="example.io/allowlist-source-range")
    assert validate(copy.deepcopy(values))["ingress"]["allowlist_annotation"] == "example.io/allowlist-source-range"
    values["ingress"]["allowlist_annotation"] = "example.io/allowlist-source-ranges"
    with pytest.raises(ValuesError) as raised:
        validate(copy.deepcopy(values))
    assert raised.value.problems[0].endswith("ingress.annotation_prefix example.io), found 'example.io/allowlist-source-ranges'")
    values["ingress"]["allowlist_annotation"] = "nginx.ingress.kubernetes.io/anything"   # now another controller's
    assert validate(values)["ingress"]["allowlist_annotation"] == "nginx.ingress.kubernetes.io/anything"


def test_the_bmc_classes_are_classes_of_their_own_by_default():
    assert DEFAULTS["ingress"]["class_name"] == DEFAULTS["gateway"]["class_name"] == "maas-kubevirt-bmc"


def _ranges_problems(ranges: list[str]) -> list[str]:
    values = copy.deepcopy(DEFAULTS)
    values["ingress"]["source_ranges"] = ranges
    try:
        validate(values)
    except ValuesError as error:
        return error.problems
    return []


def _split(network: ipaddress.IPv4Network | ipaddress.IPv6Network, data, depth: int) -> list[str]:
    """A random partition of network into CIDRs: each piece kept whole or cut into its two halves."""
    if depth == 0 or network.prefixlen == network.max_prefixlen or not data.draw(st.booleans()):
        return [str(network)]
    low, high = network.subnets(prefixlen_diff=1)
    return _split(low, data, depth - 1) + _split(high, data, depth - 1)


@given(st.data(), st.sampled_from([4, 6]), st.integers(min_value=1, max_value=6))
def test_ranges_that_add_up_to_a_whole_family_are_refused_like_slash_0(data, version, depth):
    everything = ipaddress.ip_network("0.0.0.0/0" if version == 4 else "::/0")
    low, high = everything.subnets(prefixlen_diff=1)       # never /0 itself: that has its own rule
    pieces = _split(low, data, depth - 1) + _split(high, data, depth - 1)
    order = data.draw(st.permutations(pieces))
    other = data.draw(st.lists(st.sampled_from(["10.0.0.0/8", "192.168.0.0/16"] if version == 6 else ["fd00::/8"]),
                               max_size=2))                # ranges of the other family change nothing
    problems = _ranges_problems(list(order) + other)
    assert problems == [f"ingress.source_ranges: expected CIDRs that together leave out part of IPv{version} (the "
                        f"rack controllers, not the whole Internet), found {', '.join(order)}, which add up to "
                        f"{everything}"]
    # Without any one piece, some addresses are left out: accepted.
    missing = data.draw(st.integers(min_value=0, max_value=len(order) - 1))
    assert _ranges_problems([p for i, p in enumerate(order) if i != missing] + other) == [] or len(order) == 1


def _networks(version: int):
    """CIDRs of one family, short prefixes often, so that lists of them cover it now and then."""
    longest = 32 if version == 4 else 128
    prefix = st.one_of(st.integers(min_value=1, max_value=3), st.integers(min_value=1, max_value=longest))
    return st.builds(lambda address, length: ipaddress.ip_network(f"{address}/{length}", strict=False),
                     st.ip_addresses(v=version), prefix)


def _covers_family(networks: list) -> bool:
    """Whether CIDRs of one family cover all of it. Two CIDRs are nested or disjoint, so the
    union's size is the sum over those not inside another (counted once)."""
    outermost = {n for n in networks if not any(m != n and n.subnet_of(m) for m in networks)}
    return bool(networks) and sum(n.num_addresses for n in outermost) == 2 ** networks[0].max_prefixlen


@given(st.lists(_networks(4), max_size=5), st.lists(_networks(6), max_size=5))
def test_a_range_list_is_refused_exactly_when_a_family_is_covered(v4, v6):
    assume(v4 or v6)
    problems = _ranges_problems([str(n) for n in v4 + v6])
    expected = [f"IPv{version}" for version, family in ((4, v4), (6, v6)) if _covers_family(family)]
    assert [p.split("part of ")[1].split(" ")[0] for p in problems] == expected
    assert all(p.startswith("ingress.source_ranges: expected ") for p in problems)


def test_whole_family_union_is_named_once_beside_a_slash_0():
    assert _ranges_problems(["0.0.0.0/0", "0.0.0.0/1", "128.0.0.0/1"]) == [
        "ingress.source_ranges[0]: expected a CIDR narrower than /0 (the rack controllers, not the whole Internet), "
        "found '0.0.0.0/0'"]
    assert _ranges_problems(["::/1", "8000::/1", "10.0.0.0/8"]) == [
        "ingress.source_ranges: expected CIDRs that together leave out part of IPv6 (the rack controllers, not the "
        "whole Internet), found ::/1, 8000::/1, which add up to ::/0"]
    assert _ranges_problems(["0.0.0.0/1", "128.0.0.0/2", "192.0.0.0/2", "::/1"]) != []
    assert _ranges_problems(["0.0.0.0/1", "128.0.0.0/2", "::/1", "8000::/2"]) == []


def test_controller_namespace_and_allow_catch_all_defaults():
    assert DEFAULTS["ingress"]["controller_namespace"] == "ingress-nginx"
    assert DEFAULTS["ingress"]["allow_catch_all"] is False


# --- reconciler.lease (issue 23) -----------------------------------------------------------------


def test_the_lease_is_off_by_default_with_timings_that_leave_a_maas_request_room():
    values = load_values(None)
    assert values["reconciler"]["lease"] == {
        "kubeconfig": "", "namespace": "", "name": "maas-kubevirt-reconciler",
        "duration": 40, "renew_deadline": 10, "retry_period": 2}
    assert values["reconciler"]["lease"]["duration"] - values["reconciler"]["lease"]["renew_deadline"] == (
        values["maas"]["timeout"])


def test_a_lease_given_in_part_keeps_the_other_defaults(tmp_path):
    values = load_values(write(tmp_path, {"reconciler": {"lease": {"kubeconfig": "/etc/maas-kubevirt/kubeconfig"}}}))
    assert values["reconciler"]["lease"] == {**DEFAULTS["reconciler"]["lease"],
                                             "kubeconfig": "/etc/maas-kubevirt/kubeconfig"}


@pytest.mark.parametrize("lease, problem", [
    ({"kubeconfig": "relative/kubeconfig"}, "reconciler.lease.kubeconfig: expected an absolute file path, or an "
                                            "empty string, found 'relative/kubeconfig'"),
    ({"namespace": "Not_A_Namespace"}, "reconciler.lease.namespace: expected a Kubernetes namespace name "
                                       "(DNS-1123 label), or an empty string, found 'Not_A_Namespace'"),
    ({"name": ""}, "reconciler.lease.name: expected a Kubernetes object name (DNS-1123 subdomain), found an empty string"),
    ({"duration": 10}, "reconciler.lease.duration: expected more seconds than renew_deadline (10), found 10"),
    ({"renew_deadline": 2}, "reconciler.lease.renew_deadline: expected more than 1.2 x retry_period (2), found 2"),
    ({"retry_period": True}, "reconciler.lease.retry_period: expected a whole number of seconds from 1 to 3600, "
                             "found true"),
    ({"holder": "me"}, "reconciler.lease.holder: unknown key; expected one of kubeconfig, namespace, name, "
                       "duration, renew_deadline, retry_period"),
])
def test_each_bad_lease_key_is_named(tmp_path, lease, problem):
    with pytest.raises(ValuesError) as raised:
        load_values(write(tmp_path, {"reconciler": {"lease": lease}}))
    assert raised.value.problems == [problem]


def test_a_lease_that_is_not_a_mapping_is_named(tmp_path):
    with pytest.raises(ValuesError) as raised:
        load_values(write(tmp_path, {"reconciler": {"lease": "on"}}))
    assert raised.value.problems == ["reconciler.lease: expected a mapping of kubeconfig, namespace, name, duration, "
                                     "renew_deadline, retry_period, found 'on'"]


LEASED = {"kubeconfig": "/etc/maas-kubevirt/kubeconfig"}


@pytest.mark.parametrize("renew_deadline, retry_period", [(2, 2), (1, 1), (6, 5), (12, 10), (18, 15), (5, 9)])
def test_a_renew_deadline_of_at_most_1_2_retry_periods_is_refused_at_load_in_one_line(
        tmp_path, capsys, renew_deadline, retry_period):
    """Refused by the values, the key and its bound named, before anything starts (6 is exactly
    1.2 x 5: at most, so refused); the Candidate would refuse it only once the service runs."""
    lease = {**LEASED, "duration": renew_deadline + 30, "renew_deadline": renew_deadline, "retry_period": retry_period}
    path = write(tmp_path, {"reconciler": {"lease": lease}})
    with pytest.raises(ValuesError) as raised:
        load_values(path)
    assert raised.value.problems == [f"reconciler.lease.renew_deadline: expected more than 1.2 x retry_period "
                                     f"({retry_period}), found {renew_deadline}"]
    assert cli.main(["--values", path, "reconcile", "--once"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "reconciler.lease.renew_deadline" in err and "retry_period" in err


@given(st.integers(1, 40), st.integers(1, 40), st.integers(1, 40), st.booleans())
@example(37, 7, 5, True)    # 7 > 6 = 1.2 x 5: the least renew deadline a retry period of 5 allows
@example(36, 6, 5, True)
def test_the_lease_timings_the_values_accept_are_exactly_those_a_candidate_starts_with(
        duration, renew_deadline, retry_period, with_kubeconfig):
    """So that no timing passes the values only to stop the service at its start (with a request
    of 1 s, the room a kubeconfig asks for is what the candidate asks anyway)."""
    from maas_kubevirt.lease import Candidate

    values = copy.deepcopy(DEFAULTS)
    values["maas"]["timeout"] = 1
    values["reconciler"]["lease"].update(duration=duration, renew_deadline=renew_deadline, retry_period=retry_period,
                                         kubeconfig=LEASED["kubeconfig"] if with_kubeconfig else "")
    try:
        validate(values)
        accepted = True
    except ValuesError:
        accepted = False
    try:
        Candidate(None, "maas-kubevirt", "maas-kubevirt-reconciler", "a_1-0", duration=duration,
                  renew_deadline=renew_deadline, retry_period=retry_period)
        starts = True
    except ValueError:
        starts = False
    assert accepted == starts


def test_a_lease_that_leaves_a_maas_request_no_room_is_refused_in_one_line(tmp_path):
    """A holder starts a MAAS request only when it ends (maas.timeout) before a standby may take
    over, duration after its renewal: with less room than that it would never write at all."""
    with pytest.raises(ValuesError) as raised:
        load_values(write(tmp_path, {"reconciler": {"lease": {**LEASED, "duration": 15}}}))
    assert raised.value.problems == [
        "reconciler.lease.duration: expected at least reconciler.lease.renew_deadline + maas.timeout (10 + 30 = 40 "
        "seconds, so that every MAAS request a holder starts ends before a standby may take over), found 15"]
    fits = {"maas": {"timeout": 15}, "reconciler": {"lease": {**LEASED, "duration": 25}}}
    assert load_values(write(tmp_path, fits))["reconciler"]["lease"]["duration"] == 25
    fits["maas"]["timeout"] = 16
    with pytest.raises(ValuesError, match=r"^reconciler\.lease\.duration: expected at least .* \(10 \+ 16 = 26 "):
        load_values(write(tmp_path, fits))
    # No kubeconfig, no holder: the timings only keep their own order.
    assert load_values(write(tmp_path, {"reconciler": {"lease": {"duration": 15}}}))["reconciler"]["lease"]["duration"] == 15


@pytest.mark.parametrize("address", ["::1:9639", "fe80::1:9639", "2001:db8::5:9639", "::ffff:127.0.0.1:9639",
                                     "::1", "[::1]", "[::1]9639", "::1]:9639", "[::1:9639", "[127.0.0.1]:9639",
                                     "[::1]:65536"])
def test_an_ipv6_metrics_address_without_brackets_is_refused(address):
    values = copy.deepcopy(DEFAULTS)
    values["maas"]["metrics_address"] = address
    with pytest.raises(ValuesError) as raised:
        validate(values)
    assert raised.value.problems == [
        f'maas.metrics_address: expected "" (off) or host:port to listen on, e.g. 127.0.0.1:9639, an IPv6 host in '
        f'brackets: [::1]:9639, found {address!r}']


@pytest.mark.parametrize("address", ["[::1]:9639", "[2001:db8::5]:0", "[::ffff:127.0.0.1]:9639", "127.0.0.1:9639",
                                     "localhost:9639"])
def test_a_metrics_address_with_its_ipv6_host_in_brackets_is_accepted(address):
    values = copy.deepcopy(DEFAULTS)
    values["maas"]["metrics_address"] = address
    assert validate(values)["maas"]["metrics_address"] == address



def test_exposure_gateway_needs_the_gateway_named(tmp_path):
    with pytest.raises(ValuesError) as failure:
        load_values(write(tmp_path, {"exposure": "gateway", "gateway": {"namespace": "gw"}}))
    assert failure.value.problems == [
        "gateway.name: expected the name of the site's Gateway the BMC routes attach to (exposure is gateway), "
        "found an empty string"]
    named = load_values(write(tmp_path, {"exposure": "gateway", "gateway": {"namespace": "gw", "name": "bmc"}}))
    assert named["gateway"] == {"namespace": "gw", "name": "bmc", "section_name": "", "class_name": "maas-kubevirt-bmc",
                                "allowlist": "traefik", "route_kinds": [], "traefik_crds": False}


@pytest.mark.parametrize("values, problem", [
    ({"exposure": "route"}, "exposure: expected one of ingress, gateway, found 'route'"),
    ({"exposure": None}, "exposure: expected one of ingress, gateway, found nothing"),
    ({"gateway": {"allowlist": "nginx"}}, "gateway.allowlist: expected one of traefik, envoy-gateway, external, "
                                          "found 'nginx'"),
    ({"gateway": {"section_name": "Web Secure"}}, "gateway.section_name: expected a listener name (a DNS-1123 "
                                                  "subdomain), or an empty string, found 'Web Secure'"),
    ({"ingress": {"annotation_prefix": ""}}, "ingress.annotation_prefix: expected an annotation prefix (a DNS "
                                             "subdomain such as nginx.ingress.kubernetes.io), found an empty string"),
    ({"ingress": {"watch_without_class": "yes"}}, "ingress.watch_without_class: expected true or false, found 'yes'"),
])
def test_the_exposure_keys_refuse_bad_values_in_one_line(tmp_path, values, problem):
    with pytest.raises(ValuesError) as failure:
        load_values(write(tmp_path, values))
    assert failure.value.problems == [problem]


def test_ingress_allowlist_names_who_enforces_the_source_ranges(tmp_path):
    assert load_values(None)["ingress"]["allowlist"] == "annotation"
    assert load_values(write(tmp_path, {"ingress": {"allowlist": "traefik"}}))["ingress"]["allowlist"] == "traefik"
    with pytest.raises(ValuesError) as failure:
        load_values(write(tmp_path, {"ingress": {"allowlist": "nginx"}}))
    assert failure.value.problems == ["ingress.allowlist: expected one of annotation, traefik, found 'nginx'"]


@pytest.mark.parametrize("key, value, found", [
    ("tls_secret", "bmc-tls", "'bmc-tls'"),
    ("cluster_issuer", "letsencrypt", "'letsencrypt'"),
    ("annotations", {"a/b": "c"}, "a dict"),
    ("allowlist", "traefik", "'traefik'"),
])
def test_ingress_only_keys_are_refused_with_exposure_gateway(tmp_path, key, value, found):
    with pytest.raises(ValuesError) as failure:
        load_values(write(tmp_path, {"exposure": "gateway", "gateway": {"namespace": "gw", "name": "bmc"},
                                     "ingress": {key: value}}))
    [problem] = failure.value.problems
    assert problem.startswith(f"ingress.{key}: expected ") and problem.endswith(f"found {found}")
    assert "with exposure gateway" in problem


@pytest.mark.parametrize("values, problem", [
    ({"gateway": {"route_kinds": "HTTPRoute"}}, "gateway.route_kinds: expected a list of Gateway API kinds (may be "
                                                "empty), found 'HTTPRoute'"),
    ({"gateway": {"route_kinds": ["HTTPRoute", "Ingress"]}}, "gateway.route_kinds[1]: expected one of HTTPRoute, "
     "GRPCRoute, TLSRoute, TCPRoute, UDPRoute, XListenerSet, ListenerSet, found 'Ingress'"),
    ({"exposure": "gateway", "gateway": {"namespace": "gw", "name": "bmc", "route_kinds": ["GRPCRoute"]}},
     "gateway.route_kinds: expected HTTPRoute among them (exposure is gateway: the BMC routes are HTTPRoutes), "
     "found GRPCRoute"),
    ({"kubernetes": {"kyverno_namespace": "Kyverno"}}, "kubernetes.kyverno_namespace: expected a Kubernetes namespace "
                                                       "name (DNS-1123 label), found 'Kyverno'"),
])
def test_the_route_isolation_keys_refuse_bad_values_in_one_line(tmp_path, values, problem):
    with pytest.raises(ValuesError) as failure:
        load_values(write(tmp_path, values))
    assert failure.value.problems == [problem]


# --- duplicate keys ---------------------------------------------------------------------------


def test_two_sections_of_one_name_are_refused_with_the_line_of_each(tmp_path):
    path = write(tmp_path, "redfish:\n  domain: a.example.org\nmaas:\n  timeout: 5\nredfish:\n  check: strict\n")
    with pytest.raises(ValuesError) as refused:
        load_values(path)
    assert refused.value.problems == [
        f"{path}: key 'redfish' appears twice, at line 1 and line 5: keep one (YAML would take the last and "
        "drop the first without a word)"]


def test_a_repeated_key_inside_a_section_and_in_a_flow_mapping_are_each_named(tmp_path):
    path = write(tmp_path, "maas:\n  timeout: 5\n  interval: 9\n  timeout: 6\nseed: {file: '', file: ''}\n")
    with pytest.raises(ValuesError) as refused:
        load_values(path)
    text = str(refused.value)
    assert "key 'timeout' appears twice, at line 2 and line 4" in text
    assert "key 'file' appears twice, at line 5, columns 8 and 18" in text


def test_keys_brought_by_a_merge_may_be_overridden(tmp_path):
    path = write(tmp_path, "x-common: &common {domain: a.example.org, check: strict}\n"
                           "redfish:\n  <<: *common\n  domain: b.example.org\n")
    with pytest.raises(ValuesError) as refused:   # x-common is no section; the merge itself is fine
        load_values(path)
    assert refused.value.problems == ["x-common: unknown key; expected one of " + ", ".join([*SCALARS, *SCHEMA])]


_KEYS = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8).map(lambda k: f"k_{k}")


@given(st.lists(_KEYS, min_size=1, max_size=8, unique=True), st.data())
def test_any_repeated_key_is_refused_with_both_lines(tmp_path_factory, keys, data):
    """A mapping of unique keys loads as written; the same with one key repeated anywhere later is
    refused, naming that key, its first line and the repeat's."""
    from maas_kubevirt.values import _read

    path = tmp_path_factory.mktemp("dup") / "values.yaml"
    lines = [f"{key}: {index}" for index, key in enumerate(keys)]
    path.write_text("\n".join(lines) + "\n")
    assert _read(path) == {key: index for index, key in enumerate(keys)}
    first = data.draw(st.integers(0, len(keys) - 1))
    where = data.draw(st.integers(first + 1, len(keys)))
    lines.insert(where, f"{keys[first]}: again")
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValuesError) as refused:
        _read(path)
    assert refused.value.problems == [
        f"{path}: key {keys[first]!r} appears twice, at line {first + 1} and line {where + 1}: keep one "
        "(YAML would take the last and drop the first without a word)"]


def test_the_built_in_values_have_no_duplicate_key():
    from maas_kubevirt.values import _read

    assert _read(DEFAULT_VALUES_PATH) == DEFAULTS


def test_traefik_crds_say_what_the_cluster_serves_whatever_the_render(tmp_path):
    """The BMC proxy reads no Traefik CRD, so no allowlist implies them: the key alone says."""
    from maas_kubevirt.values import traefik_crds_served

    assert traefik_crds_served(load_values(None)) is False
    assert traefik_crds_served(load_values(write(tmp_path, {"ingress": {"allowlist": "traefik"}}))) is False
    gateway = {"exposure": "gateway", "gateway": {"namespace": "gw", "name": "bmc"}}
    assert traefik_crds_served(load_values(write(tmp_path, gateway))) is False
    gateway["gateway"]["traefik_crds"] = True
    assert traefik_crds_served(load_values(write(tmp_path, gateway))) is True

