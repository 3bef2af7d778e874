"""Properties (hypothesis) of what issue 10 added: API key parsing, escaping MAAS text, the
cleartext check, script metadata as MAAS reads it, record checks, and the plan's taken names."""

from __future__ import annotations

import ipaddress

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from maas_kubevirt import identity, upload
from maas_kubevirt.console import escape_controls
from maas_kubevirt.maas import _chunks, _one_line, cleartext_warning, parse_api_key
from maas_kubevirt.reconcile import RENAME, SKIP, Settings, names_to_check, matching, plan
from maas_kubevirt.values import ValuesError

DOMAIN = "bmc.example.com"
KEY_PART = st.text(st.characters(categories=("L", "N"), include_characters="-_."), min_size=1, max_size=40)


# --- API keys --------------------------------------------------------------------------------


@given(KEY_PART, KEY_PART, KEY_PART, st.sampled_from(["", "\n", "  \n\n", "\r\n"]))
def test_one_key_round_trips(consumer, token, secret, trailer):
    assert parse_api_key(f"{consumer}:{token}:{secret}{trailer}", "MAAS_API_KEY") == (consumer, token, secret)


# MAAS makes token secrets of 32 letters and digits (piston3's SECRET_SIZE), so a secret
# cannot be a chance substring of the message's own guidance, as a short one can ("maas-k").
SECRET = st.text(st.sampled_from("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"),
                 min_size=32, max_size=32)


@given(st.lists(st.tuples(KEY_PART, KEY_PART, SECRET), min_size=2, max_size=5))
def test_several_keys_are_refused_without_showing_any(keys):
    text = "\n".join(":".join(key) for key in keys)
    with pytest.raises(ValuesError) as caught:
        parse_api_key(text, "maas.api_key_file", " in /etc/maas-kubevirt/api-key")
    message = str(caught.value)
    assert f"found {len(keys)} lines" in message
    for _, _, secret in keys:
        assert secret not in message


@given(st.text(max_size=80))
def test_any_text_is_a_key_or_a_one_line_error_naming_the_source(text):
    try:
        parts = parse_api_key(text, "MAAS_API_KEY", " in the environment variable")
    except ValuesError as error:
        message = str(error)
        assert message.startswith("MAAS_API_KEY: expected") and "\n" not in message
    else:
        assert ":".join(parts) == text.strip()


@given(st.text(max_size=60), SECRET, st.text(max_size=20))
def test_a_malformed_key_never_shows_its_secret(prefix, secret, suffix):
    """Whatever surrounds a real-looking secret, an error about the key does not repeat it."""
    try:
        parse_api_key(prefix + secret + suffix, "MAAS_API_KEY", " in the environment variable")
    except ValuesError as error:
        assert secret not in str(error)


# --- escaping --------------------------------------------------------------------------------


@given(st.text())
def test_escaped_text_has_no_control_characters(text):
    escaped = escape_controls(text)
    assert escaped.isprintable()
    assert "\x1b" not in escaped and "\n" not in escaped and "\u202e" not in escaped


@given(st.text().filter(str.isprintable))
def test_printable_text_is_unchanged(text):
    assert escape_controls(text) == text


# --- cleartext -------------------------------------------------------------------------------


@given(st.ip_addresses(), st.sampled_from(["http", "https"]), st.integers(1, 65535))
def test_cleartext_warns_for_http_off_loopback_only(address, scheme, port):
    host = f"[{address}]" if address.version == 6 else str(address)
    warning = cleartext_warning(f"{scheme}://{host}:{port}/MAAS/")
    assert bool(warning) == (scheme == "http" and not ipaddress.ip_address(address).is_loopback)


# --- script metadata as MAAS reads it --------------------------------------------------------

METADATA = st.fixed_dictionaries({
    "name": st.from_regex(r"[a-z0-9][a-z0-9-]{0,30}", fullmatch=True),
    "title": st.text(st.characters(categories=("L", "N", "Zs")), min_size=1, max_size=30).map(str.strip)
    .filter(bool),
    "tags": st.lists(st.from_regex(r"[a-z][a-z0-9-]{0,15}", fullmatch=True), min_size=1, max_size=4),
    "timeout": st.sampled_from(["00:05:00", "00:10:00", "01:00:00"]),
})


@given(METADATA, st.sampled_from(["#", "# ", "  #  "]), st.booleans())
def test_metadata_round_trips(metadata, prefix, blank_line):
    block = yaml.safe_dump(metadata, default_flow_style=False, sort_keys=False).splitlines()
    lines = ["#!/usr/bin/env python3", "# --- Start MAAS 1.0 script metadata ---"]
    lines += [prefix + line for line in block]
    if blank_line:
        lines.insert(3, "")
    lines += ["# --- End MAAS 1.0 script metadata ---", "print('hi')"]
    text = "\n".join(lines) + "\n"
    assert upload.script_metadata(text) == metadata
    assert upload.script_name(text) == metadata["name"]
    assert upload.script_tags(upload.script_metadata(text)) == metadata["tags"]


@given(st.text(max_size=200))
def test_any_text_is_metadata_or_a_values_error(text):
    try:
        upload.script_metadata(text)
    except ValuesError as error:
        assert str(error).startswith("script: ")
    else:
        assert text.startswith("#!/")


# --- the plan with names held by other nodes -------------------------------------------------

VMS = ["web1", "web2", "db.primary", "x"]


def vm_machine(index: int, vm: str, hostname: str) -> tuple[dict, str]:
    sid = f"m{index:04d}"
    return ({"system_id": sid, "hostname": hostname, "power_type": "redfish", "status_name": "Ready",
             "status": 4, "pool": {"name": "vms", "id": 3}, "tag_names": []},
            f"{vm}.vms.{DOMAIN}")


@given(st.lists(st.sampled_from(VMS), min_size=1, max_size=4, unique=True),
       st.sets(st.sampled_from([identity.maas_hostname(vm, "vms") for vm in VMS]
                               + [identity.fallback_hostname(vm, "vms") for vm in VMS])),
       st.sampled_from(["fallback", "skip"]))
def test_no_rename_targets_a_name_another_node_holds(vms, taken_names, mode):
    machines, power = [], {}
    for index, vm in enumerate(vms):
        machine, address = vm_machine(index, vm, f"random-{index}")
        machines.append(machine)
        power[machine["system_id"]] = address
    settings = Settings(domain=DOMAIN, on_hostname_taken=mode)
    wanted = names_to_check(matching(machines, power, DOMAIN))
    taken = {name: "device1" for name in taken_names if name in wanted}
    actions = plan(machines, power, [], settings, taken)
    renames = {a.system_id: a.after for a in actions if a.kind == RENAME}
    assert not set(renames.values()) & set(taken)
    assert len(set(renames.values())) == len(renames)
    for vm, machine in zip(vms, machines):
        primary, fallback = identity.maas_hostname(vm, "vms"), identity.fallback_hostname(vm, "vms")
        sid = machine["system_id"]
        if primary not in taken:
            assert renames.get(sid) == primary
        elif mode == "fallback" and fallback not in taken:
            assert renames.get(sid) == fallback
        else:
            assert sid not in renames
            assert any(a.kind == SKIP and a.system_id == sid and "rename" in a.note for a in actions)
    # Without the taken names the plan would have walked into a held primary: the input matters.
    if any(identity.maas_hostname(vm, "vms") in taken for vm in vms):
        assert plan(machines, power, [], settings) != actions


# --- splitting a query -----------------------------------------------------------------------


@given(st.lists(st.text("ab", min_size=1, max_size=6)), st.integers(1, 12))
def test_chunks_are_greedy_and_within_budget(items, budget):
    """In order, none empty, each within budget unless one item alone passes it, and each as
    full as it can be: the next chunk's first item would not have fitted."""
    chunks = _chunks(items, len, budget)
    assert [item for chunk in chunks for item in chunk] == items
    for index, chunk in enumerate(chunks):
        assert chunk and (sum(map(len, chunk)) <= budget or len(chunk) == 1)
        if index + 1 < len(chunks):
            assert sum(map(len, chunk)) + len(chunks[index + 1][0]) > budget


@given(st.text(max_size=400), st.integers(3, 320))
def test_one_line_is_the_text_or_its_start_and_an_ellipsis(text, limit):
    line = _one_line(text, limit)
    flat = escape_controls(" ".join(text.split()))
    assert len(line) <= limit
    if len(flat) <= limit:
        assert line == flat
    else:
        assert len(line) == limit and line.endswith("...") and flat.startswith(line[:-3])


# --- issue 18: system ids in URLs, deep JSON, secrets in echoed bodies --------------------------

import json  # noqa: E402
import re  # noqa: E402
from urllib.parse import unquote  # noqa: E402

import urllib3.util  # noqa: E402

from maas_kubevirt import maas  # noqa: E402

MAAS_ID = st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyz0123456789"), min_size=1, max_size=41)
BASE = "http://maas:5240/MAAS/api/2.0/"


class NoRequests:
    def __init__(self):
        self.sent = []

    def send(self, method, url, headers, files, timeout):
        self.sent.append(url)
        return maas.Response(200, {"Content-Type": "application/json"}, b"{}")

    def close(self):
        pass


def client_with(transport):
    return maas.MAASClient("http://maas:5240/MAAS/", maas.Signer("a", "b", "c"), transport=transport,
                           retry=maas.RetryPolicy(attempts=1))


@given(MAAS_ID)
def test_an_id_as_maas_makes_them_is_one_segment_sent_as_it_is(system_id):
    assert maas.valid_system_id(system_id) and maas.segment(system_id) == system_id
    transport = NoRequests()
    client_with(transport).commission(system_id)
    assert transport.sent == [f"{BASE}machines/{system_id}/?op=commission"]


@given(st.one_of(st.text(max_size=60), MAAS_ID.map(lambda s: s + "/.."), MAAS_ID.map(lambda s: "../" + s)))
def test_any_other_id_sends_nothing_and_names_itself_escaped(system_id):
    transport = NoRequests()
    valid = maas.valid_system_id(system_id)
    assert valid == (re.fullmatch(r"[a-z0-9]{1,41}", system_id) is not None)
    try:
        client_with(transport).update_machine(system_id, hostname="x")
    except maas.MAASError as error:
        assert not valid and error.kind == "malformed" and transport.sent == []
        assert str(error).isprintable() and "\n" not in str(error)
    else:
        assert valid and transport.sent == [f"{BASE}machines/{system_id}/"]


@given(st.text(min_size=1, max_size=40))
def test_a_segment_stays_one_segment_whatever_the_http_client_resolves(text):
    quoted = maas.segment(text)
    assert unquote(quoted) == text
    parsed = urllib3.util.parse_url(f"{BASE}scripts/{quoted}")  # resolves dot segments, as sent
    assert parsed.path == f"/MAAS/api/2.0/scripts/{quoted}"
    assert parsed.query is None and parsed.fragment is None


JSON_TEXT = st.text(st.sampled_from('[]{}"\\/ab\u00e9\u2028\x00\n'), max_size=8)
JSON_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers() | JSON_TEXT,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(JSON_TEXT, children, max_size=3),
    max_leaves=30,
)


def depth(value) -> int:
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    return 0


@given(JSON_VALUE, st.integers(0, 12), st.booleans(), st.sampled_from([None, 1]),
       st.sampled_from(["utf-8", "utf-16", "utf-32-le"]))
def test_nesting_depth_is_measured_as_json_nests_ignoring_strings(value, limit, ascii_only, indent, encoding):
    body = json.dumps(value, ensure_ascii=ascii_only, indent=indent).encode(encoding)
    assert maas.json_nested_deeper(body, limit) == (depth(value) > limit)


@given(st.integers(1, 3000), st.sampled_from(["[]", "{}"]))
def test_any_nesting_past_the_bound_is_malformed_never_a_crash(levels, brackets):
    opening, closing = brackets
    text = (opening + ('"k": ' if opening == "{" else "")) * levels + "0" + closing * levels
    transport = NoRequests()
    transport.send = lambda *a: maas.Response(200, {"Content-Type": "application/json"}, text.encode())
    client = client_with(transport)
    if levels <= maas.MAX_JSON_DEPTH:
        assert client.call("GET", "machines/") is not None
    else:
        with pytest.raises(maas.MAASError) as caught:
            client.call("GET", "machines/")
        assert caught.value.kind == "malformed"


HEX_SECRET = st.text(st.sampled_from("0123456789abcdef"), min_size=8, max_size=40)
# Text around the secret without hexadecimal digits, so the secret cannot also arise from it.
AROUND = st.text(st.characters(codec="utf-8", exclude_characters="0123456789abcdefABCDEF"), max_size=400)


@given(HEX_SECRET, AROUND, AROUND, st.sampled_from(["json", "text", "html"]))
def test_a_secret_echoed_anywhere_in_an_error_body_is_withheld(secret, before, after, shape):
    if shape == "json":
        body, ctype = json.dumps({"power_parameters_power_pass": [before + secret + after]}).encode(), "application/json"
    elif shape == "html":
        body, ctype = f"<html><title>{before}{secret}{after}</title></html>".encode(), "text/html"
    else:
        body, ctype = (before + secret + after).encode(), "text/plain"
    line = maas.readable_message(body, ctype, (secret,))
    for start in range(len(secret) - 7):  # not even 8 characters of it, wherever the line is cut
        assert secret[start:start + 8] not in line
