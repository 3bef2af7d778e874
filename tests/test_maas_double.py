"""The MAAS double (tests/maas_double.py) where the real-MAAS tier (tests/test_real_maas.py) found
it differed from MAAS 3.6.5's own region: one fast regression test per difference, each citing
the MAAS file (canonical/maas at 3.6.5) that makes MAAS behave so.

The requests here are plain HTTP with an OAuth PLAINTEXT header, not the project's client, so
that what is pinned is the double's answer (status, headers, body) as MAAS's would be read.
"""

from __future__ import annotations

import secrets
import sys
import time
from pathlib import Path

import pytest
import requests

sys.path.insert(0, str(Path(__file__).parent))

from maas_double import NETMASK_ERROR, MaasDouble  # noqa: E402

from maas_kubevirt.identity import PLACEHOLDER_PASSWORD  # noqa: E402

DOMAIN = "bmc.example.com"


@pytest.fixture
def double():
    with MaasDouble(realistic=False) as running:
        yield running


def api(double: MaasDouble, method: str, path: str, params: dict | None = None) -> requests.Response:
    """One request to api/2.0/<path> as the double's administrator (GET params and ``op`` in the
    query, other params as a form body)."""
    consumer, token, secret = double.api_key
    header = ('OAuth oauth_version="1.0", oauth_signature_method="PLAINTEXT", '
              f'oauth_consumer_key="{consumer}", oauth_token="{token}", oauth_signature="&{secret}", '
              f'oauth_nonce="{secrets.token_hex(8)}", oauth_timestamp="{int(time.time())}"')
    url = f"{double.url}api/2.0/{path}"
    if method == "GET":
        return requests.get(url, params=params, headers={"Authorization": header}, timeout=10)
    params = dict(params or {})
    op = params.pop("op", None)
    return requests.request(method, url, params={"op": op} if op else None, data=params,
                            headers={"Authorization": header}, timeout=10)


def events(double: MaasDouble, system_id: str) -> list[tuple[str, str, str]]:
    """(type, level, description) of a machine's events, oldest first."""
    return [(e["type"], e["level"], e["description"]) for e in double.events if e["node"] == system_id]


ENLISTED = [("Node changed status", "DEBUG", "From 'New' to 'Commissioning'"),
            ("New", "INFO", ""),
            ("Node changed status", "DEBUG", "From 'Commissioning' to 'New'")]

URLS = [f"https://web1.vms.{DOMAIN}", f"https://web1.vms.{DOMAIN}/redfish/v1/Systems/1",
        f"http://web1.vms.{DOMAIN}", f"web1.vms.{DOMAIN}/", "10.0.0.5/24"]
STORED = [f"web1.vms.{DOMAIN}", f"k7.vms.{DOMAIN}:31234", f"\u212a7.vms.{DOMAIN}", "10.0.0.5", "[fd00::5]"]


# --- 1. a power address holding "/" ------------------------------------------------------------
# src/maasserver/models/bmc.py BMC.extract_ip_address: the IDENTITY pattern of
# src/provisioningserver/drivers/power/redfish.py (make_ip_extractor) hands the whole value to
# netaddr.IPAddress, whose ValueError for "/" MAAS does not catch (only AddrFormatError);
# src/maasserver/middleware.py ExceptionMiddleware answers it 500, text/plain.


@pytest.mark.parametrize("address", URLS)
def test_put_of_an_address_with_a_slash_answers_500_and_changes_nothing(double, address):
    double.add_pool("vms")
    sid = double.add_vm("web1", "vms")
    before_power, before_name = dict(double.power[sid]), double.machines[sid]["hostname"]
    answer = api(double, "PUT", f"machines/{sid}/", {
        "hostname": "web1-vms", "pool": "vms", "power_parameters_power_address": address,
        "power_parameters_power_pass": "derived-secret"})
    assert answer.status_code == 500
    assert answer.text == NETMASK_ERROR
    assert answer.headers["Content-Type"].startswith("text/plain")
    assert double.power[sid] == before_power, "the password is not changed either"
    assert double.machines[sid]["hostname"] == before_name
    assert double.machines[sid]["pool"]["name"] == "default"
    assert not [w for w in double.writes if w[0] == "PUT"]


def test_a_back_door_url_keeps_its_other_parameters_writable(double):
    """MAAS cannot hold a stored address with "/" (BMC.clean would refuse every later power
    PUT on it); add_machine can make one, and the double then judges only what a PUT gives."""
    sid = double.add_machine(power_type="redfish", power_address=f"https://web8.vms.{DOMAIN}",
                             power_pass="derived-secret")
    answer = api(double, "PUT", f"machines/{sid}/", {"power_parameters_power_pass": PLACEHOLDER_PASSWORD})
    assert answer.status_code == 200, answer.text
    assert double.power[sid]["power_pass"] == PLACEHOLDER_PASSWORD


@pytest.mark.parametrize("scheme", ["https", "http"])
def test_enlisting_a_url_address_leaves_a_machine_without_power_type(double, scheme):
    """maas_run_remote_scripts.py enlist() (src/metadataserver/user_data/templates/snippets/)
    gets 500 and enlists again without the BMC configuration."""
    sid = double.enlist("web3", "vms", scheme=scheme)
    machine = double.machines[sid]
    assert machine["power_type"] == ""
    assert machine["status_name"] == "New"
    assert api(double, "GET", f"machines/{sid}/", {"op": "power_parameters"}).json() == {}
    assert events(double, sid) == ENLISTED
    # add_vm models the same; add_machine remains a back door for what a test needs.
    assert double.machines[double.add_vm("web4", "vms", scheme=scheme)]["power_type"] == ""
    back_door = double.add_machine(power_type="redfish", power_address=f"{scheme}://web5.vms.{DOMAIN}")
    assert double.power[back_door]["power_address"] == f"{scheme}://web5.vms.{DOMAIN}"


def test_commissioning_a_machine_without_power_type_answers_500_and_records_nothing(double):
    """src/maasserver/models/node.py start_commissioning raises UnknownPowerType first."""
    sid = double.enlist("web3", "vms", scheme="https")
    before = len(double.events)
    answer = api(double, "POST", f"machines/{sid}/", {"op": "commission"})
    assert answer.status_code == 500
    assert answer.text == "Unconfigured power type. Please configure the power type and try again."
    assert len(double.events) == before and double.machines[sid]["status_name"] == "New"


def test_commissioning_does_not_store_a_url_the_bmc_config_script_uploads(double):
    """The script's upload is the machine's metadata signal: the same 500 (bmc.py)."""
    sid = double.add_machine(power_type="redfish", power_address=f"web6.vms.{DOMAIN}",
                             power_pass=PLACEHOLDER_PASSWORD)
    double.bmc_config[sid] = {"power_address": f"https://web6.vms.{DOMAIN}", "power_user": "maas",
                              "power_pass": PLACEHOLDER_PASSWORD, "node_id": "1"}
    assert api(double, "POST", f"machines/{sid}/", {"op": "commission"}).status_code == 200
    assert double.power[sid]["power_address"] == f"web6.vms.{DOMAIN}"


# --- 2. a bare host (no "/"), look-alikes included, is stored ---------------------------------
# src/maasserver/models/bmc.py: IPAddress raises AddrFormatError, caught: "BMC uses FQDN".


@pytest.mark.parametrize("address", STORED, ids=["bare", "port", "kelvin-sign", "ipv4", "ipv6"])
def test_addresses_without_a_slash_are_stored(double, address):
    sid = double.enlist("web2", "vms", address=address)
    assert double.machines[sid]["power_type"] == "redfish"
    assert double.power[sid]["power_address"] == address
    other = double.add_vm("web7", "vms")
    answer = api(double, "PUT", f"machines/{other}/", {"power_parameters_power_address": address})
    assert answer.status_code == 200, answer.text
    assert double.power[other]["power_address"] == address


# --- 3. no rack controller: op=commission ----------------------------------------------------
# src/maasserver/models/node.py: start_commissioning records its events, makes the script set,
# sets Commissioning and commits; _power_control_node then finds no rack
# (_get_bmc_client_connection_info: PowerProblem, a WARNING event), _start_bmc_unavailable
# records a second WARNING and reverts the status. PowerProblem (src/maasserver/exceptions.py)
# is a MAASAPIException with api_error 503, whose make_http_response sets no Retry-After.
# src/maasserver/api/machines.py commission hands CommissionForm to it.


@pytest.mark.parametrize("skip", [False, True])
def test_commission_with_no_rack_answers_503_without_retry_after_and_reverts(double, skip):
    double.rack = False
    sid = double.enlist("busy1", "vms")
    hostname = double.machines[sid]["hostname"]
    params = {"op": "commission", **({"skip_bmc_config": "1"} if skip else {})}
    answer = api(double, "POST", f"machines/{sid}/", params)
    assert answer.status_code == 503
    assert "Retry-After" not in answer.headers
    assert answer.text == f"No rack controllers can access the BMC of node {hostname}"
    assert answer.headers["Content-Type"].startswith("text/plain")
    machine = double.machines[sid]
    assert machine["status_name"] == "New"
    assert machine["power_state"] == "unknown"
    assert double.commissions == [(sid, skip)], "MAAS started commissioning: the attempt counts"
    aborted = ("(admin) - Aborting COMMISSIONING and reverting to NEW. Unable to power control the node. "
               "Please check power credentials.")
    skipped = [("Script result", "DEBUG", "30-maas-01-bmc-config changed status from 'Pending' to 'Skipped'")]
    assert events(double, sid) == ENLISTED + [
        ("User starting node commissioning", "DEBUG", "(admin)"),
        ("Commissioning", "INFO", ""),
        *(skipped if skip else []),
        ("Node changed status", "DEBUG", "From 'New' to 'Commissioning'"),
        ("Failed to query node's BMC", "WARNING",
         f"(admin) - No rack controllers can access the BMC of node {hostname}"),
        ("Failed to query node's BMC", "WARNING", aborted),
        ("Node changed status", "DEBUG", "From 'Commissioning' to 'New'"),
    ]
    assert machine["status_message"] == f"Failed to query node's BMC - {aborted}"
    # Nothing booted, so the bmc-config script wrote nothing.
    assert double.power[sid]["power_pass"] == PLACEHOLDER_PASSWORD


def test_commission_with_no_rack_names_the_old_status_and_spares_manual_machines(double):
    double.rack = False
    ready = double.add_vm("r1", "vms", status="Ready")
    assert api(double, "POST", f"machines/{ready}/", {"op": "commission"}).status_code == 503
    assert double.machines[ready]["status_name"] == "Ready"
    assert "reverting to READY" in events(double, ready)[-2][2]
    # Node._start returns before any power call when MAAS cannot power the machine.
    manual = double.add_machine(power_type="manual")
    assert api(double, "POST", f"machines/{manual}/", {"op": "commission"}).status_code == 200
    assert double.machines[manual]["status_name"] == "Commissioning"


def test_commission_with_a_rack_is_unchanged_and_records_maas_order(double):
    assert double.rack is True
    sid = double.add_vm("ok1", "vms")
    answer = api(double, "POST", f"machines/{sid}/", {"op": "commission"})
    assert answer.status_code == 200
    assert double.machines[sid]["status_name"] == "Commissioning"
    assert [e[0] for e in events(double, sid)] == [
        "User starting node commissioning", "Commissioning", "Node changed status", "Node powered on"]


# --- 4. one PUT of hostname, pool and power parameters is all or nothing -----------------------
# src/maasserver/api/machines.py update: MachineForm (src/maasserver/forms/__init__.py) is
# validated whole before save; WithPowerTypeMixin keeps the power parameters not given.


def test_one_put_stores_all_four_and_keeps_the_others(double):
    double.add_pool("vms")
    sid = double.add_vm("web1", "vms")
    answer = api(double, "PUT", f"machines/{sid}/", {
        "hostname": "web1-vms", "pool": "vms", "power_parameters_power_address": f"web1.vms.{DOMAIN}",
        "power_parameters_power_pass": "derived-secret"})
    assert answer.status_code == 200, answer.text
    assert double.machines[sid]["hostname"] == "web1-vms"
    assert double.machines[sid]["pool"]["name"] == "vms"
    assert double.power[sid] == {"power_address": f"web1.vms.{DOMAIN}", "power_user": "maas",
                                 "power_pass": "derived-secret", "node_id": "1"}


def test_one_put_with_a_refused_hostname_changes_nothing(double):
    double.add_pool("vms")
    sid = double.add_vm("web1", "vms")
    double.add_node("taken", "device")
    before = dict(double.power[sid])
    for hostname in ("taken", "bad_name!"):
        answer = api(double, "PUT", f"machines/{sid}/", {
            "hostname": hostname, "pool": "vms", "power_parameters_power_address": f"web1.vms.{DOMAIN}",
            "power_parameters_power_pass": "derived-secret"})
        assert answer.status_code == 400
        assert answer.headers["Content-Type"].startswith("application/json")
        assert list(answer.json()) == ["hostname"]
        assert double.power[sid] == before, "the password is not changed either"
        assert double.machines[sid]["pool"]["name"] == "default"


# --- 5. the event log of machines created and enlisted ---------------------------------------
# An administrator's POST machines/ (src/maasserver/api/machines.py create, commission=false)
# creates the machine in New: no status change, no event. Enlistment (commission=True) creates
# it in Commissioning; its OK signal (src/metadataserver/api.py signal) records "New" INFO before
# the status change. The end of commissioning records "Ready" INFO before the status change.


def test_a_machine_created_in_new_records_no_event(double):
    sid = double.add_machine(power_type="manual")
    assert events(double, sid) == []
    assert api(double, "GET", "events/", {"op": "query", "level": "DEBUG"}).json()["events"] == []


def test_enlistment_records_what_maas_records(double):
    sid = double.enlist("web1", "vms")
    assert events(double, sid) == ENLISTED
    queried = api(double, "GET", "events/", {"op": "query", "level": "DEBUG", "id": sid}).json()["events"]
    assert [(e["type"], e["level"], e["description"]) for e in queried] == ENLISTED[::-1], "newest first"
    info = api(double, "GET", "events/", {"op": "query", "id": sid}).json()["events"]
    assert [e["type"] for e in info] == ["New"], "INFO, the default level"


def test_the_end_of_commissioning_records_ready_then_the_status_change(double):
    sid = double.add_vm("web1", "vms")
    api(double, "POST", f"machines/{sid}/", {"op": "commission"})
    start = len(events(double, sid))
    assert double.advance() == 1
    assert [e[:2] for e in events(double, sid)[start:start + 2]] == [
        ("Ready", "INFO"), ("Node changed status", "DEBUG")]
    assert events(double, sid)[start + 1][2] == "From 'Commissioning' to 'Ready'"
