"""The MAAS double (tests/maas_double.py) where the real-MAAS tier (tests/test_real_maas.py) found
it differed from MAAS 3.6.5's own region: one fast regression test per difference, each citing
the MAAS file (canonical/maas at 3.6.5) that makes MAAS behave so.

The requests here are plain HTTP with an OAuth PLAINTEXT header, not the project's client, so
that what is pinned is the double's answer (status, headers, body) as MAAS's would be read.
"""

from __future__ import annotations

import json
import secrets
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml

sys.path.insert(0, str(Path(__file__).parent))

from maas_double import NETMASK_ERROR, MaasDouble, MaasRefused  # noqa: E402

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
    other = double.add_vm("web7", "vms", power_user="web7-user")   # another row: see section 6
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
    sid = double.add_vm("web1", "vms", power_user="maas")
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


# --- 6. BMC rows: a chassis type's machines share one --------------------------------------------
# src/maasserver/models/bmc.py: BMC.scope_power_parameters splits by each setting's scope (redfish:
# power_address, power_user and the secret power_pass are the row's, node_id the node's);
# get_or_create_bmc keys a row by its non-secret parameters and gives the secret only to a row it
# creates. src/maasserver/models/node.py Node.set_power_config: same power type, a row matching the
# parameters as given (secret included, so never when power_pass is given) takes this machine and
# every machine of its old row; none matching, the current row is updated in place; the old row is
# deleted once no node is on it. Measured on MAAS 3.6.5's region (tests/test_real_maas.py).


def anonymous(double: MaasDouble, params: dict) -> requests.Response:
    """An anonymous POST machines/ (no Authorization header), form-encoded; a list repeats a field."""
    return requests.post(f"{double.url}api/2.0/machines/", data=params, timeout=10)


def enlisting(double: MaasDouble, address: str, user: str = "maas", password: str | None = "a-guess",
              mac: str | None = None, **extra: str) -> requests.Response:
    """What maas_run_remote_scripts.py enlist() sends, with this BMC configuration."""
    power = {"power_address": address, "power_user": user, "node_id": "1"}
    if password is not None:
        power["power_pass"] = password
    return anonymous(double, {"architecture": "amd64/generic", "mac_addresses": mac or fresh_mac(),
                              "commission": "True", "power_type": "redfish",
                              "power_parameters": json.dumps(power), **extra})


_MACS = iter(range(1, 1000))


def fresh_mac() -> str:
    return "52:54:00:ee:%02x:%02x" % divmod(next(_MACS), 256)


def signal(double: MaasDouble, system_id: str, status: str, **fields: str) -> requests.Response:
    """The machine's own signal with the token its preseed gives (as maas_run_remote_scripts.py)."""
    preseed = requests.get(f"{double.url}metadata/latest/by-id/{system_id}/", params={"op": "get_preseed"},
                           timeout=10)
    assert preseed.status_code == 200
    config = yaml.safe_load(preseed.text)["datasource"]["MAAS"]
    header = ('OAuth oauth_version="1.0", oauth_signature_method="PLAINTEXT", '
              f'oauth_consumer_key="{config["consumer_key"]}", oauth_token="{config["token_key"]}", '
              f'oauth_signature="&{config["token_secret"]}", oauth_nonce="{secrets.token_hex(8)}", '
              f'oauth_timestamp="{int(time.time())}"')
    form = {"op": (None, "signal"), "status": (None, status), **{k: (None, v) for k, v in fields.items()}}
    return requests.post(f"{double.url}metadata/2012-03-01/", files=form, headers={"Authorization": header},
                         timeout=10)


def power(double: MaasDouble, system_id: str) -> dict:
    answer = api(double, "GET", f"machines/{system_id}/", {"op": "power_parameters"})
    assert answer.status_code == 200, answer.text
    return answer.json()


VM = f"web1.vms.{DOMAIN}"
OTHER = f"web2.vms.{DOMAIN}"


def test_an_impostor_with_a_vms_address_and_user_joins_its_row_and_reads_its_password(double):
    """get_or_create_bmc: the row exists, so the impostor's own password is dropped."""
    vm = double.add_vm("web1", "vms", password="derived-secret", power_user="maas")
    answer = enlisting(double, VM, password="a-guess")
    assert answer.status_code == 200, answer.text
    impostor = answer.json()["system_id"]
    assert impostor != vm and double.bmc_id(impostor) == double.bmc_id(vm)
    assert double.bmc_machines(double.bmc_id(vm)) == sorted([vm, impostor])
    assert power(double, impostor) == {"power_address": VM, "power_user": "maas", "power_pass": "derived-secret",
                                       "node_id": "1"}
    bulk = api(double, "GET", "machines/", {"op": "power_parameters", "id": [vm, impostor]}).json()
    assert bulk[vm]["power_pass"] == bulk[impostor]["power_pass"] == "derived-secret"
    assert double.power[impostor] == power(double, impostor)


def test_with_another_user_the_impostor_gets_a_row_of_its_own(double):
    vm = double.add_vm("web1", "vms", password="derived-secret", power_user="maas")
    impostor = enlisting(double, VM, user="maas-enlist-0123", password="its-own").json()["system_id"]
    assert double.bmc_id(impostor) != double.bmc_id(vm)
    assert power(double, impostor)["power_pass"] == "its-own"
    assert power(double, vm)["power_pass"] == "derived-secret"


def test_a_signal_from_a_machine_on_a_shared_row_moves_every_machine_on_it(double):
    """store_node_power_parameters (src/metadataserver/api.py): without power_pass no row matches
    the new address, so the shared row is updated in place and keeps its password; with one, in
    place again, password included."""
    vm = double.add_vm("web1", "vms", password="derived-secret", power_user="maas")
    impostor = enlisting(double, VM).json()["system_id"]
    assert double.machines[impostor]["status_name"] == "Commissioning"   # commission=True
    row = double.bmc_id(vm)
    moved = {"power_address": "harvest.example.org", "power_user": "maas"}
    answer = signal(double, impostor, "WORKING", power_type="redfish", power_parameters=json.dumps(moved))
    assert answer.status_code == 200, answer.text
    assert power(double, vm) == {**moved, "power_pass": "derived-secret", "node_id": "1"}
    assert double.bmc_id(vm) == double.bmc_id(impostor) == row
    answer = signal(double, impostor, "WORKING", power_type="redfish",
                    power_parameters=json.dumps({**moved, "power_pass": "chosen"}))
    assert answer.status_code == 200
    assert power(double, vm)["power_pass"] == "chosen" and double.bmc_id(vm) == row


def test_a_re_point_to_a_matching_row_takes_the_old_rows_other_machines_along(double):
    """Node.set_power_config: the signal's parameters (no power_pass) equal the other VM's row, so
    the impostor and every machine of its old row are moved to it; the old row is deleted."""
    vm = double.add_vm("web1", "vms", password="derived-secret", power_user="maas")
    other = double.add_vm("web2", "vms", password="other-secret", power_user="maas")
    impostor = enlisting(double, VM).json()["system_id"]
    old, target = double.bmc_id(vm), double.bmc_id(other)
    answer = signal(double, impostor, "WORKING", power_type="redfish",
                    power_parameters=json.dumps({"power_address": OTHER, "power_user": "maas"}))
    assert answer.status_code == 200, answer.text
    assert double.bmc_machines(target) == sorted([vm, other, impostor])
    assert old not in double.bmcs and double.bmc_machines(old) == []
    assert power(double, vm) == {"power_address": OTHER, "power_user": "maas", "power_pass": "other-secret",
                                 "node_id": "1"}


def test_an_admin_put_of_user_and_password_updates_the_row_in_place(double):
    """AdminMachineForm hands set_power_config every redfish setting, power_pass included (the
    machine's when the PUT gives none): no row ever matches, the current one is updated."""
    vm = double.add_vm("web1", "vms", password="derived-secret", power_user="maas")
    impostor = enlisting(double, VM).json()["system_id"]
    row = double.bmc_id(vm)
    answer = api(double, "PUT", f"machines/{impostor}/", {"power_parameters_power_user": "derived-user",
                                                           "power_parameters_power_pass": "placeholder"})
    assert answer.status_code == 200, answer.text
    assert power(double, vm) == {"power_address": VM, "power_user": "derived-user", "power_pass": "placeholder",
                                 "node_id": "1"}
    assert double.bmc_id(vm) == double.bmc_id(impostor) == row


def test_a_put_that_would_make_two_rows_equal_answers_409_and_changes_nothing(double):
    """maasserver_bmc_power_type_parameters_idx (migration 0245) is unique; the violation is
    retried (src/maasserver/utils/views.py) and ends in 409 with Retry-After 5 (measured)."""
    vm = double.add_vm("web1", "vms", password="derived-secret", power_user="maas")
    other = double.add_vm("web2", "vms", power_user="maas")
    before = power(double, vm)
    answer = api(double, "PUT", f"machines/{vm}/", {"power_parameters_power_address": OTHER, "hostname": "moved"})
    assert answer.status_code == 409
    assert answer.headers["Retry-After"] == "5"
    assert power(double, vm) == before and double.machines[vm]["hostname"] != "moved"
    assert double.bmc_id(vm) != double.bmc_id(other)
    with pytest.raises(MaasRefused):
        double.set_power_address(vm, OTHER)


def test_a_row_is_deleted_when_its_last_node_leaves(double):
    """Node.delete and Node.set_power_config delete a row no node is on."""
    vm = double.add_vm("web1", "vms", password="derived-secret", power_user="maas")
    impostor = enlisting(double, VM).json()["system_id"]
    row = double.bmc_id(vm)
    double.delete_machine(impostor)
    assert double.bmc_machines(row) == [vm]
    answer = api(double, "PUT", f"machines/{vm}/", {"power_type": "manual"})
    assert answer.status_code == 200, answer.text
    assert row not in double.bmcs
    assert double.machines[vm]["power_type"] == "manual" and double.bmcs[double.bmc_id(vm)].power_type == "manual"
    assert power(double, vm) == {}


def test_a_machine_given_redfish_joins_a_row_and_keeps_no_password_of_its_own(double):
    """Another power type, a chassis one: get_or_create_bmc, as at enlistment."""
    vm = double.add_vm("web1", "vms", password="derived-secret", power_user="maas")
    manual = double.add_machine(power_type="manual")
    answer = api(double, "PUT", f"machines/{manual}/", {
        "power_type": "redfish", "power_parameters_power_address": VM, "power_parameters_power_user": "maas",
        "power_parameters_power_pass": "mine"})
    assert answer.status_code == 200, answer.text
    assert double.bmc_id(manual) == double.bmc_id(vm)
    assert power(double, manual)["power_pass"] == "derived-secret"


# --- 7. MAC enlistment -------------------------------------------------------------------------
# src/maasserver/api/machines.py AnonMachinesHandler.create: a machine in New or Commissioning with
# an interface holding one of the MACs (as given: stored MACs are normalised) is updated by
# _update_new_node (AdminMachineForm: architecture and power, the JSON over the machine's own, so a
# password left out is kept) and no event is recorded. A MAC of a machine in any other status is
# no match: create_machine's form refuses it (400, "already in use"). Measured on MAAS 3.6.5.


@pytest.mark.parametrize("status", ["New", "Commissioning"])
def test_mac_enlistment_updates_the_machine_holding_the_mac(double, status):
    mac = "52:54:00:ab:cd:ef"
    sid = double.add_vm("web1", "vms", status=status, password="derived-secret", mac_addresses=[mac], power_user="maas")
    before = list(double.events)
    answer = enlisting(double, f"moved.vms.{DOMAIN}", password=None, mac=mac)
    assert answer.status_code == 200, answer.text
    assert answer.json()["system_id"] == sid and len(double.machines) == 1
    assert power(double, sid) == {"power_address": f"moved.vms.{DOMAIN}", "power_user": "maas",
                                  "power_pass": "derived-secret", "node_id": "1"}
    assert double.machines[sid]["status_name"] == status
    assert double.events == before, "MAC enlistment records no event"
    answer = enlisting(double, f"moved.vms.{DOMAIN}", password="given", mac=mac.upper())
    assert answer.status_code == 400, "as given, the MAC matches no stored one; the form normalises it"
    answer = enlisting(double, f"moved.vms.{DOMAIN}", password="given", mac=mac)
    assert answer.status_code == 200 and power(double, sid)["power_pass"] == "given"


def test_mac_enlistment_with_parameters_but_no_power_type_leaves_only_the_password(double):
    """check_driver: the form's power_type is "" (the request's None), so the parameters saved are
    none; the row's secret stays (measured)."""
    sid = double.add_vm("web1", "vms", password="derived-secret", power_user="maas")
    answer = anonymous(double, {"architecture": "amd64/generic", "mac_addresses": double.macs[sid][0],
                                "power_parameters": json.dumps({"power_address": "elsewhere.example.org"})})
    assert answer.status_code == 200, answer.text
    assert power(double, sid) == {"power_pass": "derived-secret"}
    assert double.machines[sid]["power_type"] == "redfish"


@pytest.mark.parametrize("status", ["Ready", "Deployed", "Failed commissioning"])
def test_a_mac_of_a_machine_in_another_status_is_refused(double, status):
    sid = double.add_vm("web1", "vms", status=status, password="derived-secret", power_user="maas")
    mac = double.macs[sid][0]
    before = power(double, sid)
    answer = enlisting(double, f"moved.vms.{DOMAIN}", mac=mac)
    assert answer.status_code == 400
    hostname = double.machines[sid]["hostname"]
    assert answer.json() == {"mac_addresses": [f"MAC address {mac} already in use on {hostname}."],
                             "power_type": ["Can't set power type to redfish without network interfaces"]}
    assert power(double, sid) == before and len(double.machines) == 1
    two = anonymous(double, {"architecture": "amd64/generic", "mac_addresses": [mac, fresh_mac()],
                             "commission": "True"})
    assert two.json() == {"mac_addresses": [
        f"One or more MAC addresses is invalid. (MAC address {mac} already in use on {hostname}.)"]}


def test_enlistment_drops_keys_redfish_does_not_have(double):
    """get_overridden_query_dict carries only the type's settings from the JSON (measured)."""
    answer = enlisting(double, VM, power_driver="ignored")
    assert answer.status_code == 200
    extra = anonymous(double, {"architecture": "amd64/generic", "mac_addresses": fresh_mac(), "commission": "True",
                               "power_type": "redfish", "power_parameters": json.dumps({
                                   "power_address": OTHER, "power_user": "maas", "power_pass": "p",
                                   "power_driver": "LAN_2_0"})})
    assert extra.status_code == 200, extra.text
    assert power(double, extra.json()["system_id"]) == {"power_address": OTHER, "power_user": "maas",
                                                        "power_pass": "p", "node_id": ""}


def test_enlist_by_mac_twice_is_one_machine(double):
    """The double's enlist(mac=...) is the anonymous POST: a VM whose MAC persists (KubeMacPool)
    enlists again onto its own machine, which stays New."""
    first = double.enlist("web1", "vms", mac="52:54:00:12:34:56")
    assert double.machines[first]["status_name"] == "New"
    assert events(double, first) == ENLISTED
    again = double.enlist("web1", "vms", mac="52:54:00:12:34:56", address=f"web1b.vms.{DOMAIN}")
    assert again == first and len(double.machines) == 1
    assert double.power[first]["power_address"] == f"web1b.vms.{DOMAIN}"
    assert events(double, first) == ENLISTED
    url = double.enlist("web3", "vms", mac="52:54:00:12:34:57", scheme="https")
    assert double.machines[url]["power_type"] == ""


# --- deploy: Ready -> Allocated -> Deploying -> Deployed ----------------------------------------
# src/maasserver/api/machines.py MachineHandler.deploy: Ready is acquired (Node.acquire), then only a
# status from which src/maasserver/node_status.py NODE_TRANSITIONS allows Deploying (Allocated) is
# deployed (Node.start, _start_deployment); any other is NodeStateViolation, 409 as text.


def test_deploy_acquires_a_ready_machine_then_deploys_it_as_maas_records_it(double):
    sid = double.add_vm("web1", "vms", status="Ready")
    answer = api(double, "POST", f"machines/{sid}/", {"op": "deploy"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["status_name"] == "Deploying" and answer.json()["power_state"] == "on"
    assert answer.json()["owner"] == double.username and answer.json()["distro_series"] == "noble"
    assert [e[0] for e in events(double, sid)][-6:] == [
        "User acquiring node", "Node changed status", "User starting deployment", "Node changed status",
        "Deploying", "Node powered on"]
    assert double.advance() == 1
    assert double.machines[sid]["status_name"] == "Deployed"
    assert [e[0] for e in events(double, sid)][-3:] == ["Node changed status", "Image Deployed", "Deployed"]


@pytest.mark.parametrize("status", ["New", "Commissioning", "Failed commissioning", "Deploying", "Deployed",
                                    "Broken", "Testing"])
def test_deploy_is_refused_with_409_in_any_other_state(double, status):
    sid = double.add_vm("web1", "vms", status=status)
    before = len(double.events)
    answer = api(double, "POST", f"machines/{sid}/", {"op": "deploy"})
    assert answer.status_code == 409
    assert answer.text == f"Can't deploy a machine that is in the '{status}' state"
    assert double.machines[sid]["status_name"] == status and len(double.events) == before


def test_deploy_of_a_machine_another_user_holds_is_refused(double):
    sid = double.add_vm("web1", "vms", status="Ready")
    double.machines[sid]["owner"] = "someone-else"
    answer = api(double, "POST", f"machines/{sid}/", {"op": "deploy"})
    assert answer.status_code == 409 and "belonging to another user" in answer.text
    assert double.machines[sid]["status_name"] == "Ready"


def test_deploy_with_no_rack_answers_503_and_stays_allocated(double):
    double.rack = False
    sid = double.add_vm("web1", "vms", status="Ready")
    answer = api(double, "POST", f"machines/{sid}/", {"op": "deploy"})
    assert answer.status_code == 503 and "Retry-After" not in answer.headers
    assert double.machines[sid]["status_name"] == "Allocated"


def test_deploy_of_an_allocated_machine_starts_without_acquiring_it_again(double):
    sid = double.add_vm("web1", "vms", status="Allocated")
    answer = api(double, "POST", f"machines/{sid}/", {"op": "deploy", "distro_series": "ubuntu/jammy"})
    assert answer.status_code == 200 and answer.json()["status_name"] == "Deploying"
    assert answer.json()["distro_series"] == "jammy"
    assert "User acquiring node" not in [e[0] for e in events(double, sid)]


# --- the pool stage's requests ------------------------------------------------------------------
# machines/?mac_address=: ReadNodesForm (src/maasserver/node_constraint_filter_forms.py) validates
# each MAC (MAC_FIELD_VALIDATOR, src/maasserver/fields.py) and matches them as given; tags/ and
# tags/{name}/?op=update_nodes: src/maasserver/api/tags.py; DELETE machines/{id}/:
# MachineHandler.delete (src/maasserver/api/machines.py); current_installation_result_id: the
# installation script set Node._start_deployment makes (src/maasserver/models/node.py).


def test_machines_are_filtered_by_mac_as_given_and_a_malformed_mac_is_400():
    with MaasDouble() as double:   # realistic: the interfaces carry the MACs
        pxe = double.add_vm("small-bcdfg", "pools", mac_addresses=["02:AA:00:00:00:01"])
        double.add_vm("web1", "vms")
        answer = api(double, "GET", "machines/", {"mac_address": ["02:aa:00:00:00:01", "02:bb:00:00:00:02"]})
        assert answer.status_code == 200 and [m["system_id"] for m in answer.json()] == [pxe]
        assert answer.json()[0]["boot_interface"]["mac_address"] == "02:aa:00:00:00:01"
        assert api(double, "GET", "machines/", {"mac_address": "02:AA:00:00:00:01"}).json() == []
        refused = api(double, "GET", "machines/", {"mac_address": "not-a-mac"})
        assert refused.status_code == 400
        assert refused.json() == {"mac_address": ["'not-a-mac' is not a valid MAC address."]}


def test_a_tag_is_made_once_and_update_nodes_sets_the_machines_tag_names(double):
    sid = double.add_vm("small-bcdfg", "pools", status="Ready")
    assert api(double, "GET", "tags/").json() == []
    made = api(double, "POST", "tags/", {"name": "small", "comment": "pool"})
    assert made.status_code == 200 and made.json()["name"] == "small" and made.json()["definition"] == ""
    again = api(double, "POST", "tags/", {"name": "small"})
    assert again.status_code == 400 and again.json() == {"name": ["Tag with this Name already exists."]}
    assert api(double, "POST", "tags/", {"name": "no spaces"}).status_code == 400
    assert [t["name"] for t in api(double, "GET", "tags/").json()] == ["small"]
    added = api(double, "POST", "tags/small/", {"op": "update_nodes", "add": sid})
    assert added.json() == {"added": 1, "removed": 0}
    assert api(double, "GET", f"machines/{sid}/").json()["tag_names"] == ["small"]
    assert api(double, "POST", "tags/other/", {"op": "update_nodes", "add": sid}).status_code == 404
    removed = api(double, "POST", "tags/small/", {"op": "update_nodes", "remove": sid})
    assert removed.json() == {"added": 0, "removed": 1} and double.machines[sid]["tag_names"] == []


def test_tag_writes_and_deletes_are_an_administrators():
    with MaasDouble(admin=False, realistic=False) as double:
        sid = double.add_vm("small-bcdfg", "pools", status="Ready")
        double.tags["small"] = {"name": "small", "definition": "", "comment": "", "kernel_opts": ""}
        assert api(double, "POST", "tags/", {"name": "web"}).status_code == 403
        assert api(double, "POST", "tags/small/", {"op": "update_nodes", "add": sid}).status_code == 403
        assert api(double, "DELETE", f"machines/{sid}/").status_code == 403 and sid in double.machines


def test_delete_answers_204_and_the_machine_is_gone(double):
    sid = double.add_vm("small-bcdfg", "pools", status="Ready")
    answer = api(double, "DELETE", f"machines/{sid}/")
    assert answer.status_code == 204 and answer.content == b""
    assert api(double, "GET", f"machines/{sid}/").status_code == 404
    assert api(double, "DELETE", f"machines/{sid}/").status_code == 404


def test_a_deployment_sets_current_installation_result_id_and_it_stays(double):
    sid = double.add_vm("small-bcdfg", "pools", status="Ready")
    assert api(double, "GET", f"machines/{sid}/").json()["current_installation_result_id"] is None
    deployed = api(double, "POST", f"machines/{sid}/", {"op": "deploy"}).json()
    assert isinstance(deployed["current_installation_result_id"], int)
    double.advance()
    assert double.machine_json(sid)["current_installation_result_id"] == deployed["current_installation_result_id"]
