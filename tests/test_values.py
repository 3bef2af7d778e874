"""The values file: defaults, overrides, and one clear problem per bad key."""

from __future__ import annotations

import copy

import pytest
import yaml
from hypothesis import example, given, strategies as st

from branches import branch, branches_taken

from maas_kubevirt import cli
from maas_kubevirt.values import DEFAULT_VALUES_PATH, SCHEMA, ValuesError, load_values, validate

DEFAULTS = yaml.safe_load(DEFAULT_VALUES_PATH.read_text())


def write(tmp_path, data) -> str:
    path = tmp_path / "values.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return str(path)


def test_defaults_cover_exactly_the_schema():
    assert {section: set(keys) for section, keys in SCHEMA.items()} == {
        section: set(keys) for section, keys in DEFAULTS.items()
    }
    assert load_values(None)["redfish"]["domain"] == "bmc.example.com"


def test_overrides_merge_over_defaults(tmp_path):
    values = load_values(write(tmp_path, {"redfish": {"domain": "BMC.Lab.Example.org"}}))
    assert values["redfish"]["domain"] == "bmc.lab.example.org"
    assert values["redfish"]["scheme"] == "https"
    assert values["maas"] == DEFAULTS["maas"]


def test_empty_file_means_defaults(tmp_path):
    assert load_values(write(tmp_path, "")) == load_values(None)


def test_bare_off_means_off(tmp_path):
    assert load_values(write(tmp_path, "redfish:\n  check: off\n"))["redfish"]["check"] == "off"


@pytest.mark.parametrize(
    "override, problem",
    [
        ({"redfish": {"domain": "not a domain"}}, "redfish.domain: expected a DNS name such as bmc.example.com, found 'not a domain'"),
        ({"redfish": {"scheme": "ftp"}}, "redfish.scheme: expected one of https, http, found 'ftp'"),
        ({"redfish": {"check": "maybe"}}, "redfish.check: expected one of off, advisory, strict, found 'maybe'"),
        ({"redfish": {"colour": "blue"}}, "redfish.colour: unknown key; expected one of domain, scheme, username, check"),
        ({"smbios": {"manufacturer": ""}}, "smbios.manufacturer: expected a non-empty printable string, found an empty string"),
        ({"kubernetes": {"opt_in_label": "bad key/with/slashes"}}, "kubernetes.opt_in_label: expected a Kubernetes label key"),
        ({"kubernetes": {"system_namespace": "Kube_System"}}, "kubernetes.system_namespace: expected a Kubernetes namespace name"),
        ({"ingress": {"source_ranges": ["10.0.0.1/8"]}}, "ingress.source_ranges[0]: expected a CIDR such as 10.0.0.0/8, found '10.0.0.1/8'"),
        ({"ingress": {"source_ranges": "10.0.0.0/8"}}, "ingress.source_ranges: expected a list of CIDRs"),
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
        load_values(write(tmp_path, {"redfish": {"scheme": "ftp", "check": 1}, "maas": {"interval": -1}}))
    assert len(raised.value.problems) == 3


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
        ("redfish", "username", "maas\n", False),
        ("maas", "approval_tag", "approved\x00", False),
        ("maas", "api_key_file", "/etc/maas-kubevirt/api\x00key", False),
        ("ingress", "tls_secret", None, False),
        ("ingress", "cluster_issuer", None, False),
        ("maas", "audit_log", None, False),
        ("seed", "file", None, False),
        ("ingress", "tls_secret", "", True),
        ("maas", "audit_log", "", True),
        ("maas", "audit_log", "audit.log", False),
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
