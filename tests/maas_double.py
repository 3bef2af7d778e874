"""A MAAS region API double: a real HTTP server on 127.0.0.1 (ephemeral port, in a thread).

It follows docs/explanation/design.md ("MAAS contracts") and, where it names a MAAS file, that file
(canonical/maas at 3.6.5, the release in upstream.lock.yaml). Where the real-MAAS tier (tests/test_real_maas.py)
checked a behaviour against MAAS 3.6.5's own region, the double does what that region did, and
tests/test_maas_double.py holds a fast regression test for each such point. It serves the REST
API 2.0 paths under /MAAS/api/2.0/, OAuth 1.0 PLAINTEXT checked on every request but version/
(401 on a bad signature, a replayed nonce or a wrong token), the machine status machine
(commission only from New, Failed commissioning, Ready, Broken; otherwise 400 ``{"__all__":
[...]}``), hostnames unique over all nodes, devices and controllers included (400 ``{"hostname":
[...]}``; nodes/ lists them all), resource pools (duplicate name 400), bulk and per-machine
power parameters, admin-only writes (403 with MAAS's message for a user who is not an
administrator), scripts parsed as MAAS's ScriptForm parses them (POST scripts/, GET/PUT
scripts/{name}, op=download) and version/.

Power parameters are set as MAAS's machine form sets them: ``PUT machines/{id}/`` with
``power_parameters_<name>=...`` fields (and ``power_type``); a name the power type does not have is
refused (400 ``{"power_parameters": ["Unknown parameter(s): x."]}``, src/maasserver/config_forms.py,
DictCharField.clean_unknown_params), names left out keep their values
(src/maasserver/forms/__init__.py, WithPowerTypeMixin._get_power_parameters) and a required one
left empty is refused. ``op=commission`` records ``skip_bmc_config`` (read like Django's
BooleanField, as src/maasserver/forms/ephemeral.py CommissionForm does); without it, a KubeVirt
VM's bmc-config script runs again and writes the placeholder password back.

Power is kept as MAAS keeps it (src/maasserver/models/bmc.py, node.py): on BMC rows. A row holds
the BMC-scoped parameters (its JSON never a secret, the secret apart) and the machine its
node-scoped ones (redfish: node_id). Redfish is a chassis type: machines whose address and user
are the same share one row, and its password (get_or_create_bmc). Every write goes through one
``set_power_config`` (Node.set_power_config): the admin PUT, anonymous enlistment and MAC
enlistment (``POST machines/`` without authentication, AnonMachinesHandler.create: a machine in
New or Commissioning holding one of the MACs is updated, with no event) and the machines' own
metadata ``signal`` (``/MAAS/metadata/<version>/ op=signal`` with the token of ``op=get_preseed``;
store_node_power_parameters). A form's parameters always carry power_pass, so the current row is
updated in place and every machine on it follows; a signal's without it can move a machine, and
every machine of its row, to another row; a row equal to another is refused as MAAS's unique
index refuses it (409); a row no machine is on is deleted. ``double.power[sid]`` reads a machine's
parameters as ``op=power_parameters`` does; writing one is a back door to where MAAS keeps it.
``bmc_id``/``bmc_machines`` show the rows to tests (MAAS's API does not).

Addresses as MAAS 3.6.5 stores them: a power address the power type's IP extractor hands whole
to netaddr (Redfish and IPMI use the IDENTITY pattern) and that holds a "/" (any URL,
``https://host`` included) makes ``BMC.extract_ip_address`` raise a ValueError it does not catch
(src/maasserver/models/bmc.py; src/provisioningserver/drivers/power/redfish.py): ``PUT
machines/{id}/`` answers 500 with netaddr's message as text and changes nothing, and enlistment
(``enlist``/``add_vm``) ends with a machine of power type "" and no power parameters, as
maas_run_remote_scripts.py's ``enlist()`` retries without the BMC configuration. A bare host, a
port or a look-alike letter is no IP address and is stored ("BMC uses FQDN").

``rack = False`` is a region with no rack controller: ``op=commission`` starts commissioning,
fails to power on and reverts, and answers 503 with no Retry-After (src/maasserver/models/node.py,
start_commissioning, _get_bmc_client_connection_info and _start_bmc_unavailable; PowerProblem in
src/maasserver/exceptions.py). A machine with no power type cannot be commissioned (500).

Machine objects weigh what they weigh in MAAS: every field of ``DISPLAYED_MACHINE_FIELDS``
(src/maasserver/api/machines.py) with interfaces, VLANs, subnets, block devices, partitions
and NUMA nodes (``maas_objects.py``), each machine's JSON cached until it changes.

The event log (GET events/?op=query, src/maasserver/api/events.py) records what MAAS records: a
"Node changed status" event (DEBUG) for every status transition, enlistment included (then "New"
INFO when its commissioning ends), the commissioning request events ("User starting node
commissioning", "Commissioning", "Script result" when the BMC configuration is skipped), "Ready"
INFO when commissioning ends, "Failed to query node's BMC" WARNINGs when no rack can power the
machine, and an audited "Node" event for UI node actions; API edits of hostname, pool or power
parameters and an administrator's machine created in New record nothing, as in MAAS. ``after``,
``before``, ``limit`` (default 100, at most 1,000), ``level`` (default INFO; AUDIT alone or
everything at or above the level, AUDIT excluded) and the node filters behave as MAAS's handler
does; events of deleted machines are detached and no longer returned; ``prune_events`` drops the
oldest.

It counts requests and injects faults into the next matching requests: "503" (Retry-After:
10, as MAAS sends), "409" (Retry-After: 5: MAAS ran out of database retries), "500", "hang"
(past the client's timeout, then the connection is dropped), "reset" (TCP RST), "malformed" (a
truncated JSON body), "race-commission" (someone else commissions the machine first),
"race-rename" (someone else takes the hostname first), "reply" (a given status and body) and
"echo" (a 400 whose body repeats every field of the request, as a careless proxy or a future
MAAS might: a client must not pass it on unscrubbed).
``extra_records`` are appended, as they are, to every machines/ list.

Run as a program (`python tests/maas_double.py --machines 1000`) it serves until killed and
prints its URL; GET /_double/stats (not counted, no auth) returns the request counts and
the bytes received and sent, and GET /_double/advance finishes every commissioning.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import email.parser
import email.policy
import itertools
import json
import random
import re
import shlex
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

from maas_objects import _mac as interface_mac  # tests/ is on sys.path whenever this module is
from maas_objects import machine_fields, machine_heavy_fields
from loopback import LoopbackServer

import yaml

from maas_kubevirt.identity import ENLIST_USER_PREFIX, PLACEHOLDER_PASSWORD
from maas_kubevirt.reconcile import pool_description

API_PREFIX = "/MAAS/api/2.0/"
DEFAULT_KEY = ("dblConsumerKey1", "dblTokenKey0001", "dblTokenSecretXyZ9876543210")

STATUS = {
    "New": 0, "Commissioning": 1, "Failed commissioning": 2, "Missing": 3, "Ready": 4,
    "Reserved": 5, "Deployed": 6, "Retired": 7, "Broken": 8, "Deploying": 9, "Allocated": 10,
    "Failed deployment": 11, "Releasing": 12, "Failed releasing": 13, "Disk erasing": 14,
    "Failed disk erasing": 15, "Rescue mode": 16, "Entering rescue mode": 17,
    "Failed to enter rescue mode": 18, "Exiting rescue mode": 19, "Failed to exit rescue mode": 20,
    "Testing": 21, "Failed testing": 22,
}
# Event levels (src/maasserver/models/eventtype.py; AUDIT is 0, src/maascommon/events.py).
LEVELS = {"AUDIT": 0, "DEBUG": 10, "INFO": 20, "WARNING": 30, "ERROR": 40, "CRITICAL": 50}
# Event types the double records: name -> (description, level), from src/maascommon/events.py.
EVENT_TYPES = {
    "NODE_CHANGED_STATUS": ("Node changed status", "DEBUG"),
    "REQUEST_NODE_START_COMMISSIONING": ("User starting node commissioning", "DEBUG"),
    "COMMISSIONING": ("Commissioning", "INFO"),
    "NODE_POWERED_ON": ("Node powered on", "DEBUG"),
    "NODE_POWERED_OFF": ("Node powered off", "DEBUG"),
    "NODE_PXE_REQUEST": ("PXE Request", "DEBUG"),
    "NODE_HTTP_REQUEST": ("HTTP Request", "DEBUG"),
    "NODE": ("Node", "AUDIT"),
    "NEW": ("New", "INFO"),
    "READY": ("Ready", "INFO"),
    "FAILED_COMMISSIONING": ("Failed commissioning", "INFO"),
    "NODE_POWER_QUERY_FAILED": ("Failed to query node's BMC", "WARNING"),
    "SCRIPT_RESULT_CHANGED_STATUS": ("Script result", "DEBUG"),
    "REQUEST_NODE_ACQUIRE": ("User acquiring node", "DEBUG"),
    "REQUEST_NODE_START_DEPLOYMENT": ("User starting deployment", "DEBUG"),
    "DEPLOYING": ("Deploying", "INFO"),
    "DEPLOYED": ("Deployed", "INFO"),
    "IMAGE_DEPLOYED": ("Image Deployed", "INFO"),
}
MAX_EVENT_LOG_COUNT = 1000
DEFAULT_EVENT_LOG_LIMIT = 100
COMMISSION_FROM = ("New", "Failed commissioning", "Ready", "Broken")
# op=deploy (MachineHandler.deploy, src/maasserver/api/machines.py): a Ready machine is acquired
# first (Node.acquire: Allocated), then only a status NODE_TRANSITIONS lets become Deploying
# (src/maasserver/node_status.py: Allocated alone) is deployed; any other is NodeStateViolation,
# 409 with this text (src/maasserver/exceptions.py).
DEPLOY_FROM = ("Allocated",)
CANNOT_DEPLOY = "Can't deploy a machine that is in the '{status}' state"
# The release default_distro_series names when a deploy gives none (src/maasserver/models/config.py).
DEFAULT_DISTRO_SERIES = "noble"
# Each power type's settings as its driver declares them (make_setting_field in
# src/provisioningserver/drivers/__init__.py; the drivers in src/provisioningserver/drivers/power/
# redfish.py, ipmi.py and manual.py): name -> (label, required, scope, secret, default). A setting is
# BMC-scoped unless it says "node"; a secret one is kept apart from the row's JSON (SecretManager).
# MAAS offers every registered driver; the double describes these three.
POWER_SETTINGS: dict[str, dict[str, tuple[str, bool, str, bool, Any]]] = {
    "redfish": {
        "power_address": ("Redfish address", True, "bmc", False, None),
        "power_user": ("Redfish user", True, "bmc", False, None),
        "power_pass": ("Redfish password", True, "bmc", True, None),
        "node_id": ("Node ID", False, "node", False, None),
    },
    "ipmi": {
        "power_driver": ("Power driver", True, "bmc", False, "LAN_2_0"),
        "power_boot_type": ("Power boot type", False, "bmc", False, "auto"),
        "power_address": ("IP address", True, "bmc", False, None),
        "power_user": ("Power user", False, "bmc", False, None),
        "power_pass": ("Power password", False, "bmc", True, None),
        "k_g": ("K_g BMC key", False, "bmc", True, None),
        "cipher_suite_id": ("Cipher Suite ID", False, "bmc", False, "3"),
        "privilege_level": ("Privilege Level", False, "bmc", False, "OPERATOR"),
        "workaround_flags": ("Workaround Flags", False, "bmc", False, ["opensesspriv"]),
        "mac_address": ("Power MAC", False, "node", False, None),
        "power_off_mode": ("Power off mode", False, "bmc", False, "hard"),
    },
    # src/provisioningserver/drivers/power/webhook.py: every setting BMC-scoped.
    "webhook": {
        "power_on_uri": ("URI to power on the node", True, "bmc", False, None),
        "power_off_uri": ("URI to power off the node", True, "bmc", False, None),
        "power_query_uri": ("URI to query the nodes power status", True, "bmc", False, None),
        "power_on_regex": ("Regex to confirm the node is on", True, "bmc", False, r"status.*\:.*running"),
        "power_off_regex": ("Regex to confirm the node is off", True, "bmc", False, r"status.*\:.*stopped"),
        "power_user": ("Power user", False, "bmc", False, None),
        "power_pass": ("Power password", False, "bmc", True, None),
        "power_token": ("Power token, will be used in place of power_user and power_pass", False, "bmc", True,
                        None),
        "power_verify_ssl": ("Verify SSL connections with system CA certificates", True, "bmc", False, "n"),
    },
    # src/provisioningserver/drivers/pod/virsh.py and lxd.py: the VM hosts' drivers, also machines' types.
    "virsh": {
        "power_address": ("Address", True, "bmc", False, None),
        "power_pass": ("Password (optional)", False, "bmc", True, None),
        "power_id": ("Virsh VM ID", True, "node", False, None),
    },
    "lxd": {
        "power_address": ("LXD address", True, "bmc", False, None),
        "instance_name": ("Instance name", True, "node", False, None),
        "project": ("LXD project", True, "bmc", False, "default"),
        "password": ("LXD password (optional)", False, "bmc", True, None),
        "certificate": ("LXD certificate (optional)", False, "bmc", True, None),
        "key": ("LXD private key (optional)", False, "bmc", True, None),
    },
    "manual": {},
}
# The drivers' `chassis` attribute: the machines of a chassis share one BMC row (get_or_create_bmc).
CHASSIS = {"redfish": True, "ipmi": False, "webhook": False, "virsh": True, "lxd": True, "manual": False}
POWER_FIELDS: dict[str, dict[str, tuple[str, bool]]] = {
    power_type: {name: (setting[0], setting[1]) for name, setting in settings.items()}
    for power_type, settings in POWER_SETTINGS.items()}
SKIP_CHECK = "power_parameters_skip_check"
# src/provisioningserver/drivers/__init__.py: IP_EXTRACTOR_PATTERNS.IDENTITY, the pattern of
# make_ip_extractor("power_address") that redfish.py and ipmi.py use.
IP_EXTRACTORS = {"redfish": ("power_address", r"^(?P<address>.+?)$"),
                 "ipmi": ("power_address", r"^(?P<address>.+?)$"),
                 # webhook.py: make_ip_extractor("power_query_uri", IP_EXTRACTOR_PATTERNS.URL), whose
                 # address is the URL's host alone (no "/" can reach netaddr).
                 "webhook": ("power_query_uri", r"^(?:[^:/]+://)?(?:[^@/]*@)?(?P<address>[^/:]*)")}
# netaddr's ValueError for an address with "/", which BMC.extract_ip_address
# (src/maasserver/models/bmc.py) does not catch; src/maasserver/middleware.py
# ExceptionMiddleware answers any other exception 500 with its text as text/plain.
NETMASK_ERROR = "IPAddress() does not support netmasks or subnet prefixes! See documentation for details."
# src/maasserver/models/node.py: start_commissioning refuses a machine with no power type; the
# exception is no MAASAPIException, so ExceptionMiddleware answers 500.
UNKNOWN_POWER_TYPE = "Unconfigured power type. Please configure the power type and try again."
# src/maasserver/models/node.py: _get_bmc_client_connection_info raises PowerProblem (503,
# src/maasserver/exceptions.py; MAASAPIException.make_http_response sets no Retry-After) and
# _start_bmc_unavailable reverts the machine.
NO_RACK = "No rack controllers can access the BMC of node {hostname}"
ABORTED = ("(admin) - Aborting {status} and reverting to {old}. Unable to power control the node. "
           "Please check power credentials.")
# The builtin commissioning script tagged bmc-config, whose result CommissionForm's
# skip_bmc_config stores as skipped (src/maasserver/models/node.py, start_commissioning).
BUILTIN_BMC_CONFIG = "30-maas-01-bmc-config"
NOT_AVAILABLE = "Commission is not available because of the current state of the node."
# src/maasserver/api/support.py: METHOD_RESERVED_ADMIN, raised by @admin_method (3.5: scripts
# create/update and the bulk machines/?op=power_parameters of src/maasserver/api/nodes.py).
# Per-node checks (get_node_or_404 in src/maasserver/models/node.py) and model forms raise a
# bare PermissionDenied(), which src/maasserver/middleware.py turns into an empty 403 body.
RESERVED_ADMIN = "This method is reserved for admin users."
# src/maasserver/middleware.py: RETRY_AFTER_SERVICE_UNAVAILABLE; src/maasserver/utils/views.py:
# RETRY_AFTER_CONFLICT with the body of src/maasserver/templates/409.html.
RETRY_AFTER = {"503": "10", "409": "5"}
CONFLICT_PAGE = ("<!DOCTYPE html><html><head><title>Error: Conflict Error</title></head><body>"
                 "<h2>Conflict error. Try your request again, as it will most likely succeed.</h2>"
                 "</body></html>")
MAAS_DEFAULT = "maas-default"
# src/maasserver/forms/script.py, ScriptForm._read_script: the metadata delimiters.
_SCRIPT_DELIMITER = re.compile(r"\s*#\s*-+\s*(Start|End) MAAS (?P<version>\d+\.\d+) script metadata\s+-+",
                               re.I)
# ScriptForm fields that embedded metadata fills in (Meta.fields).
_SCRIPT_FIELDS = ("name", "title", "description", "tags", "script_type", "hardware_type", "parallel",
                  "packages", "timeout", "destructive", "for_hardware", "may_reboot", "recommission",
                  "apply_configured_networking")
# src/metadataserver/enum.py: SIGNAL_STATUS.
SIGNAL_STATUSES = ("OK", "FAILED", "WORKING", "COMMISSIONING", "TESTING", "TIMEDOUT", "INSTALLING",
                   "APPLYING_NETCONF", "RELEASING")
# src/metadataserver/api.py VersionIndexHandler.signal: the statuses a machine may signal in; those
# without a _process_* method answer OK and change nothing. Of the ones with a method the double
# models New and, through _process_commissioning, Commissioning and Deployed; the others (Testing,
# Deploying, Disk erasing, Entering rescue mode, Rescue mode, Releasing) answer OK and change
# nothing here.
SIGNALABLE = ("Broken", "Commissioning", "Failed commissioning", "Deploying", "Failed deployment", "Ready",
              "Disk erasing", "Releasing", "Entering rescue mode", "Rescue mode",
              "Failed to enter rescue mode", "Testing", "Failed testing", "New", "Deployed")
# _process_commissioning's targets, and src/maasserver/node_status.py NODE_TRANSITIONS from the two
# statuses it serves here (Node.update_status refuses any other: NodeStateViolation, 409).
SIGNAL_TARGETS = {"OK": "Ready", "FAILED": "Failed commissioning", "TESTING": "Testing"}
TRANSITIONS = {"Commissioning": ("Failed commissioning", "Ready", "Retired", "Missing", "New", "Broken", "Testing"),
               "Deployed": ("Allocated", "Missing", "Broken", "Ready", "Disk erasing", "Releasing",
                            "Entering rescue mode", "Testing")}
# AnonMachinesHandler.create looks for a machine to update only among these.
ENLISTABLE = ("New", "Commissioning")
# The three input forms of src/maascommon/fields.py MAC_FIELD_RE (the double takes them whole).
_MAC = re.compile(r"([0-9a-f]{1,2}:){5}[0-9a-f]{1,2}|([0-9a-f]{1,2}-){5}[0-9a-f]{1,2}|([0-9a-f]{3,4}\.){2}[0-9a-f]{3,4}",
                  re.IGNORECASE)
# formencode's StringBool, which get_optional_param applies to "commission".
_TRUE, _FALSE = ("true", "t", "yes", "y", "on", "1"), ("false", "f", "no", "n", "off", "0")
_HOSTNAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z", re.IGNORECASE)
_POOL = re.compile(r"^\w[ \w-]*\Z")
_TAG = re.compile(r"[a-zA-Z0-9_-]+")   # Tag._tag_name_regex (src/maasserver/models/tag.py)


def address_refused(power_type: str, params: dict[str, Any]) -> bool:
    """True when MAAS 3.6.5 cannot store these power parameters: BMC.extract_ip_address
    (src/maasserver/models/bmc.py) matches the power type's IP extractor and hands the address
    to netaddr.IPAddress, which raises ValueError (not the AddrFormatError MAAS catches) for any
    "/". A host name, a port or a look-alike letter is an AddrFormatError: stored as an FQDN."""
    extractor = IP_EXTRACTORS.get(power_type)
    value = params.get(extractor[0]) if extractor else None
    if not value:
        return False
    match = re.match(extractor[1], value)
    if match is None:
        return False
    address = match["address"]
    if address.startswith("[") and address.endswith("]"):
        address = address[1:-1]
    return "/" in address


def scope_power_parameters(power_type: str, params: dict[str, Any]) -> tuple[bool, dict, dict]:
    """BMC.scope_power_parameters (src/maasserver/models/bmc.py): (chassis, the BMC-scoped
    parameters, the node's). A type without settings keeps every parameter on the node."""
    settings = POWER_SETTINGS.get(power_type) if power_type else None
    if not settings:
        return False, {}, dict(params or {})
    bmc: dict[str, Any] = {}
    node: dict[str, Any] = {}
    for name, value in params.items():
        setting = settings.get(name)
        (bmc if setting is not None and setting[2] == "bmc" else node)[name] = value
    return CHASSIS[power_type], bmc, node


def sanitise_power_parameters(power_type: str, params: dict[str, Any]) -> tuple[dict, dict]:
    """sanitise_power_parameters (src/provisioningserver/drivers/power/registry.py): (the
    parameters but the driver's secret ones, the secret ones)."""
    settings = POWER_SETTINGS.get(power_type, {})
    kept = {name: value for name, value in params.items() if not (name in settings and settings[name][3])}
    secrets = {name: value for name, value in params.items() if name not in kept}
    return kept, secrets


def normalise_mac(mac: str) -> str:
    """src/maascommon/fields.py normalise_macaddress: lower case, colons, two digits a byte."""
    tokens = re.split(r"[-:.]", mac.lower())
    if len(tokens) == 3:
        return ":".join(token.zfill(4)[i:i + 2] for token in tokens for i in (0, 2))
    return ":".join(token.zfill(2) for token in tokens)


class MaasRefused(Exception):
    """What MAAS answers instead of doing it: raised by the double's model, answered by its handlers
    (and raised to a test that asks a helper for what MAAS would refuse)."""

    def __init__(self, status: int, body: Any, headers: dict[str, str] | None = None):
        super().__init__(f"{status}: {body!r}")
        self.status, self.body, self.headers = status, body, headers or {}


@dataclass
class BMCRow:
    """One maasserver_bmc row: its power type, its JSON power_parameters (never a secret) and the
    secret MAAS keeps for it apart (SecretManager's "power-parameters", src/maasserver/secrets.py)."""

    id: int
    power_type: str
    parameters: dict
    secrets: dict = field(default_factory=dict)


def _status_constant(name: str) -> str:
    """A status as MAAS's map_enum_reverse(NODE_STATUS) names it: "Failed commissioning" ->
    "FAILED_COMMISSIONING"."""
    return name.upper().replace(" ", "_")


@dataclass
class Fault:
    kind: str
    method: str | None = None
    path: str | None = None          # regex searched in the path (after /MAAS/api/2.0/) + "?" + query
    count: int = 1
    retry_after: str | None = MAAS_DEFAULT   # MAAS's own value for the kind (RETRY_AFTER)
    hang: float = 3.0
    status: int = 400                         # "reply": this status and body instead of the answer
    body: Any = None


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    fields: dict[str, str] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)
    lists: dict[str, list[str]] = field(default_factory=dict)   # every value of a repeated field
    anonymous: bool = False                                     # sent without an Authorization header

    def getlist(self, name: str) -> list[str]:
        """Every value of a form field, as QueryDict.getlist gives them."""
        return self.lists.get(name) or ([self.fields[name]] if name in self.fields else [])

    @property
    def op(self) -> str | None:
        return (self.query.get("op") or [None])[0]


class _Machine(dict):
    """A machine's light fields; its JSON (with the heavy fields spliced in) is cached until one
    of them is set again."""

    def __init__(self, fields: dict, heavy: str):
        super().__init__(fields)
        self.heavy = heavy
        self.json: bytes | None = None

    def __setitem__(self, key: str, value: Any) -> None:
        self.json = None
        super().__setitem__(key, value)

    def encoded(self) -> bytes:
        if self.json is None:
            light = json.dumps(self, separators=(", ", ": "))
            self.json = (light[:-1] + ", " + self.heavy + "}").encode() if self.heavy else light.encode()
        return self.json


class _NodePower(MutableMapping):
    """One machine's power parameters as MAAS reads them (Node.get_power_parameters, src/maasserver/
    models/node.py: its BMC row's, the row's secret, then its own). A write is a back door that goes
    where MAAS keeps the parameter: a BMC-scoped one is the row's, so every machine on it sees it."""

    def __init__(self, double: "MaasDouble", system_id: str):
        self.double, self.system_id = double, system_id

    def _read(self) -> dict:
        return self.double.power_parameters(self.system_id)

    def __getitem__(self, name: str) -> Any:
        return self._read()[name]

    def __iter__(self):
        return iter(self._read())

    def __len__(self) -> int:
        return len(self._read())

    def __setitem__(self, name: str, value: Any) -> None:
        self.double._write_power(self.system_id, name, value)

    def __delitem__(self, name: str) -> None:
        if name not in self._read():
            raise KeyError(name)
        self.double._write_power(self.system_id, name, None, delete=True)

    def __repr__(self) -> str:
        return repr(self._read())

    def __copy__(self) -> dict:
        return self._read()

    def __deepcopy__(self, memo: dict) -> dict:
        return copy.deepcopy(self._read(), memo)


class _PowerView(Mapping):
    """system_id -> _NodePower for every machine. Assigning a whole dict is a back door MAAS has no
    counterpart for: the machine alone gets a new row (of its power type) holding exactly that."""

    def __init__(self, double: "MaasDouble"):
        self.double = double

    def __getitem__(self, system_id: str) -> _NodePower:
        if system_id not in self.double.machines:
            raise KeyError(system_id)
        return _NodePower(self.double, system_id)

    def __iter__(self):
        return iter(list(self.double.machines))

    def __len__(self) -> int:
        return len(self.double.machines)

    def __setitem__(self, system_id: str, params: dict) -> None:
        self.double._replace_power(system_id, dict(params))


class MaasDouble(LoopbackServer):
    def __init__(self, api_key: tuple[str, str, str] = DEFAULT_KEY, version: str = "3.6.5",
                 admin: bool = True, auto_advance: bool = False, seed: int = 0,
                 realistic: bool = True):
        self.api_key = api_key
        self.version = version
        self.admin = admin
        self.auto_advance = auto_advance
        # False: a region with no rack controller (commissioning cannot power a machine on).
        self.rack = True
        self.realistic = realistic   # False: light machine objects (property tests, for speed)
        self.lock = threading.RLock()
        self.machines: dict[str, _Machine] = {}
        # Devices and controllers: nodes that machines/ does not list but whose hostnames count.
        self.other_nodes: dict[str, dict] = {}
        self.events: list[dict] = []           # oldest first; "node" None once detached
        self._event_ids = itertools.count(1)
        self._numbers = itertools.count(0)
        self.bytes_in = 0
        self.bytes_out = 0
        self._hostnames: dict[str, str] = {}   # lower-cased hostname -> system_id (an index)
        # Power as MAAS keeps it (src/maasserver/models/bmc.py, node.py): BMC rows, each machine's
        # row (maasserver_node.bmc_id), and each machine's own node-scoped parameters.
        self.bmcs: dict[int, BMCRow] = {}
        self._bmc_ids = itertools.count(1)
        self._bmc_of: dict[str, int] = {}             # system_id -> row id; absent: no BMC
        self._bmc_nodes: dict[int, set[str]] = {}     # row id -> its machines (BMC.node_set)
        self._bmc_index: dict[tuple[str, str], set[int]] = {}   # (power_type, JSON) -> row ids
        self.instance_power: dict[str, dict] = {}     # Node.instance_power_parameters
        self.power = _PowerView(self)                  # what op=power_parameters reads, per machine
        self.macs: dict[str, list[str]] = {}          # each machine's interfaces' MACs, normalised
        self.enlisting: set[str] = set()              # NodeMetadata "enlisting" (commission=True)
        self.tokens: dict[str, tuple[str, str, str]] = {}   # each machine's OAuth token (NodeKey)
        self.architectures = ["amd64/generic"]        # usable: a synced boot resource's
        self.pools: dict[str, dict] = {"default": {"id": 0, "name": "default",
                                                   "description": "Default pool"}}
        self.scripts: dict[str, dict] = {}
        # Tags by name (src/maasserver/models/tag.py: name, definition, comment, kernel_opts); a
        # machine's tag_names follow tags/{name}/?op=update_nodes.
        self.tags: dict[str, dict] = {}
        self._script_sets = itertools.count(10**6)   # installation script set ids, past the others
        # doctor: the key's user and MAAS's settings (enlist_commissioning defaults to true:
        # src/maasservicelayer/models/configurations.py, EnlistCommissioningConfig).
        self.username = "admin"
        self.settings: dict[str, Any] = {"enlist_commissioning": True}
        self.faults: list[Fault] = []
        # Raw records appended to every machines/ list: what a broken or newer MAAS might send.
        self.extra_records: list[Any] = []
        self.log: list[tuple[str, str, str | None]] = []
        self.urls: list[str] = []                      # each request's path and query, as sent
        self.counts: Counter = Counter()
        self.nonces: set[str] = set()
        self.writes: list[tuple[str, str, dict]] = []   # (method, system_id or path, fields)
        self.commissions: list[tuple[str, bool]] = []   # (system_id, skip_bmc_config)
        # What each KubeVirt VM's bmc-config script writes when commissioning runs it.
        self.bmc_config: dict[str, dict[str, str]] = {}
        self._ids = itertools.count(1)
        self._pool_ids = itertools.count(1)
        self._random = random.Random(seed)
        self.server: ThreadingHTTPServer | None = None
        self.thread: threading.Thread | None = None

    # --- lifecycle -------------------------------------------------------------------------
    def start(self, port: int = 0) -> "MaasDouble":
        double = self

        class Handler(_Handler):
            pass

        Handler.double = double
        self.thread = self.serve(_QuietServer(("127.0.0.1", port), Handler), "maas-double")
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/MAAS/"

    @property
    def api_key_text(self) -> str:
        return ":".join(self.api_key)

    # --- inventory -------------------------------------------------------------------------
    def new_system_id(self) -> str:
        return "%06x" % (0xA00000 + next(self._ids))

    def add_pool(self, name: str, description: str = "") -> dict:
        with self.lock:
            pool = {"id": next(self._pool_ids), "name": name, "description": description}
            self.pools[name] = pool
            return pool

    def add_machine(self, hostname: str | None = None, *, power_type: str = "ipmi",
                    power_address: str | None = None, power_pass: str | None = None,
                    status: str = "New", pool: str = "default", tag_names: list[str] | None = None,
                    power_user: str = "maas", system_id: str | None = None,
                    mac_addresses: list[str] | None = None) -> str:
        """A machine as MAAS holds it, its power on a BMC row as a new machine's would be (see
        _attach_power); its MACs are its physical interfaces' unless given."""
        with self.lock:
            system_id = system_id or self.new_system_id()
            if hostname is None:
                hostname = f"{self._random.choice(_ADJ)}-{self._random.choice(_NOUN)}-{system_id}"
            if pool not in self.pools:
                # A pool a test files a machine in without making it first stands for one the
                # reconciler made in an earlier cycle, so it carries that description.
                self.add_pool(pool, "" if pool == "default" else pool_description(pool))
            number = next(self._numbers)
            virtual = power_type == "redfish"
            self.macs[system_id] = [normalise_mac(mac) for mac in mac_addresses] if mac_addresses else \
                [interface_mac(number, port) for port in range(1 if virtual else 2)]
            self.machines[system_id] = _Machine({
                "system_id": system_id,
                "hostname": hostname,
                "fqdn": f"{hostname}.maas",
                "domain": {"id": 0, "name": "maas"},
                "status": STATUS[status],
                "status_name": status,
                "status_message": "",
                "power_type": power_type,
                "power_state": "off",
                "pool": None,  # filled by _pool_ref
                "zone": {"id": 1, "name": "default"},
                "tag_names": list(tag_names or []),
                "architecture": "amd64/generic",
                "cpu_count": 2,
                "memory": 4096,
                "osystem": "",
                "distro_series": "",
                "hardware_uuid": None,
                "resource_uri": f"/MAAS/api/2.0/machines/{system_id}/",
                **machine_fields(number, virtual),
            }, machine_heavy_fields(system_id, number, virtual, self.macs[system_id]) if self.realistic else "")
            self._set_pool(system_id, pool)
            self._hostnames[hostname.lower()] = system_id
            params: dict[str, str] = {}
            if power_type == "redfish":
                params = {"power_address": power_address or "", "power_user": power_user,
                          "power_pass": power_pass or "", "node_id": "1"}
            elif power_type == "ipmi":
                params = {"power_address": power_address or "10.9.0.1", "power_user": "ADMIN",
                          "power_pass": power_pass or "", "power_driver": "LAN_2_0",
                          "power_boot_type": "auto", "cipher_suite_id": "3",
                          "privilege_level": "ADMIN", "k_g": "", "mac_address": "",
                          "workaround_flags": ["opensesspriv"], "power_off_mode": "hard"}
            elif power_type == "virsh":
                params = {"power_address": power_address or "qemu+ssh://10.9.0.2/system",
                          "power_pass": power_pass or "", "power_id": hostname}
            elif power_type == "lxd":
                params = {"power_address": power_address or "10.9.0.3:8443", "instance_name": hostname,
                          "project": "default", "password": power_pass or "", "certificate": "", "key": ""}
            elif power_address is not None:
                params = {"power_address": power_address, "power_pass": power_pass or ""}
            self._attach_power(system_id, power_type, params)
            if status != "New":
                # MAAS's status signal compares with the value at load: creating a machine in
                # another status than the default New records the transition.
                self.record(system_id, "NODE_CHANGED_STATUS", f"From 'New' to '{status}'")
            self.machines[system_id].encoded()   # now, so a first listing answers at once
            return system_id

    def add_node(self, hostname: str, node_type: str = "device", system_id: str | None = None) -> str:
        """A device or controller: not a machine, but its hostname is taken for every node
        (src/maasserver/models/node.py: Node.hostname is unique across node types)."""
        types = {"device": 1, "rack_controller": 2, "region_controller": 3, "region_and_rack_controller": 4}
        with self.lock:
            system_id = system_id or self.new_system_id()
            self.other_nodes[system_id] = {
                "system_id": system_id, "hostname": hostname, "fqdn": f"{hostname}.maas",
                "node_type": types[node_type], "node_type_name": node_type.replace("_", " ").title(),
                "resource_uri": f"/MAAS/api/2.0/nodes/{system_id}/",
            }
            self._hostnames[hostname.lower()] = system_id
            return system_id

    def add_vm(self, vm: str, namespace: str, domain: str = "bmc.example.com", *,
               scheme: str | None = None, password: str | None = None,
               address: str | None = None, **kw: Any) -> str:
        """A KubeVirt VM as MAAS holds it once enlisted with the address its script wrote (by
        default the bare host; ``scheme`` makes it a URL, ``address`` gives it whole). An
        address MAAS refuses (``address_refused``: any "/") leaves what enlistment's retry
        without the BMC configuration makes: power type "" and no power parameters. Use
        ``add_machine`` for a machine MAAS could not hold. Its power_user is by default a fresh
        enlistment user, as the script writes one (``power_user=`` gives one: two VMs with the
        same address and power_user share one row and its password, the first's, as MAAS keeps
        them)."""
        if address is None:
            address = f"{scheme}://{vm}.{namespace}.{domain}/redfish/v1/Systems/1" if scheme else \
                f"{vm}.{namespace}.{domain}"
        kw.setdefault("power_user", ENLIST_USER_PREFIX + "%032x" % self._random.getrandbits(128))
        bmc = {"power_address": address, "power_user": kw["power_user"],
               "power_pass": PLACEHOLDER_PASSWORD, "node_id": "1"}
        if address_refused("redfish", bmc):
            system_id = self.add_machine(kw.pop("hostname", None), power_type="", **kw)
        else:
            system_id = self.add_machine(kw.pop("hostname", None), power_type="redfish", power_address=address,
                                         power_pass=password or PLACEHOLDER_PASSWORD, **kw)
        self.bmc_config[system_id] = bmc
        return system_id

    def _set_pool(self, system_id: str, name: str) -> None:
        pool = self.pools[name]
        self.machines[system_id]["pool"] = {
            "id": pool["id"], "name": pool["name"], "description": pool["description"],
            "resource_uri": f"/MAAS/api/2.0/resourcepool/{pool['id']}/",
        }

    def set_status(self, system_id: str, status: str) -> None:
        """A status transition, recorded as MAAS's signal does ("Node changed status", DEBUG)."""
        with self.lock:
            machine = self.machines[system_id]
            before = machine["status_name"]
            machine["status_name"] = status
            machine["status"] = STATUS[status]
            if before != status:
                self.record(system_id, "NODE_CHANGED_STATUS", f"From '{before}' to '{status}'")

    def abort_commissioning(self, system_id: str, old: str = "New") -> None:
        """MAAS's handling of a commission whose power-on failed (_start_bmc_unavailable,
        src/maasserver/models/node.py): back to the status before it. MAAS 3.5 does it once its
        power workflow gives up, long after a caller's timeout when the BMC refuses the password."""
        with self.lock:
            machine = self.machines[system_id]
            aborted = ABORTED.format(status="COMMISSIONING", old=_status_constant(old))
            self.record(system_id, "NODE_POWER_QUERY_FAILED", aborted)
            self.set_status(system_id, old)
            machine["power_state"] = "unknown"
            machine["status_message"] = f"Failed to query node's BMC - {aborted}"

    def advance(self) -> int:
        """Commissioning machines finish: Ready, recorded as the metadata signal does ("Ready"
        INFO, then the status change: src/metadataserver/api.py), then powered off; one still
        enlisting goes back to New ("New" INFO). Deploying machines finish too: Deployed, as
        Node.end_deployment records it (src/maasserver/models/node.py: the status change, "Image
        Deployed", "Deployed"), and stay on. Returns how many moved."""
        with self.lock:
            moved = 0
            for system_id, machine in self.machines.items():
                if machine["status_name"] == "Deploying":
                    self.set_status(system_id, "Deployed")
                    self.record(system_id, "IMAGE_DEPLOYED",
                                f"deployed {machine['osystem']}/{machine['distro_series']}/{machine['architecture']}")
                    self.record(system_id, "DEPLOYED")
                    moved += 1
                if machine["status_name"] == "Commissioning":
                    target = "New" if system_id in self.enlisting else "Ready"
                    self.enlisting.discard(system_id)
                    self.record(system_id, "NEW" if target == "New" else "READY")
                    self.set_status(system_id, target)
                    machine["power_state"] = "off"
                    self.record(system_id, "NODE_POWERED_OFF")
                    moved += 1
            return moved

    # --- power: BMC rows as MAAS keeps them ----------------------------------------------------
    # src/maasserver/models/bmc.py and node.py: a machine's power type is its BMC row's; the row
    # holds the BMC-scoped parameters (its JSON never a secret, the secret apart) and the machine
    # its node-scoped ones. A chassis type's machines with the same non-secret BMC parameters share
    # one row, password included.

    def power_parameters(self, system_id: str) -> dict:
        """What op=power_parameters answers: Node.get_power_parameters, the row's parameters and
        secret overlaid with the machine's own."""
        with self.lock:
            row = self.bmcs.get(self._bmc_of.get(system_id, -1))
            merged = {**row.parameters, **row.secrets} if row is not None else {}
            return {**merged, **self.instance_power.get(system_id, {})}

    def bmc_id(self, system_id: str) -> int | None:
        """Inspection only: the machine's BMC row (maasserver_node.bmc_id), which MAAS's API does
        not show; None for a machine without one."""
        with self.lock:
            return self._bmc_of.get(system_id)

    def bmc_machines(self, row_id: int) -> list[str]:
        """Inspection only: the machines on a BMC row (BMC.node_set), sorted; [] once deleted."""
        with self.lock:
            return sorted(self._bmc_nodes.get(row_id, ()))

    def set_power_config(self, system_id: str, power_type: str, params: dict[str, Any]) -> None:
        """Node.set_power_config (src/maasserver/models/node.py) with the parameters its caller
        merged. Raises MaasRefused, having changed nothing, where MAAS's request would fail."""
        with self.lock:
            chassis, bmc_params, node_params = scope_power_parameters(power_type, params or {})
            old = self._bmc_of.get(system_id)
            current = self.bmcs[old].power_type if old is not None else ""
            if power_type == current:
                if old is None:
                    # Node.bmc is None and this branch uses it: AttributeError, which
                    # ExceptionMiddleware (src/maasserver/middleware.py) answers 500 with its text.
                    missing = "node_set" if self._rows_matching(power_type, bmc_params) else "set_power_parameters"
                    raise MaasRefused(500, f"'NoneType' object has no attribute '{missing}'")
                if power_type == "manual":
                    self._set_bmc_parameters(old, bmc_params)
                else:
                    # BMC.objects.filter(power_type=..., power_parameters=bmc_params): bmc_params
                    # is not sanitised here, while no row's JSON holds a secret (create_bmc,
                    # get_or_create_bmc and BMC.set_power_parameters all sanitise, and migration
                    # 0290_migrate_node_power_parameters moved the older ones out); PostgreSQL's
                    # jsonb equality is exact. So parameters that carry power_pass (every form's:
                    # the field is in each cleaned DictCharField) never find a row, and the
                    # current row is updated in place; only parameters without it (a metadata
                    # signal's, store_node_power_parameters) can find another one.
                    found = self._rows_matching(power_type, bmc_params)
                    existing = found[0] if found else None   # .first(): the lowest id
                    if existing is not None and existing != old:
                        for other in sorted(self._bmc_nodes[old] - {system_id}):
                            self._point(other, existing)
                        self._point(system_id, existing)
                    elif existing is None:
                        self._set_bmc_parameters(old, bmc_params)
            elif chassis:
                self._point(system_id, self._get_or_create_bmc(power_type, bmc_params))
            else:
                self._point(system_id, self._create_bmc(power_type, bmc_params))
            # Node.set_instance_power_parameters: the node's own are replaced (none of the types
            # the double describes has a node-scoped secret).
            self.instance_power[system_id] = dict(node_params)
            if old is not None and self._bmc_of.get(system_id) != old:
                self._drop_bmc_if_unused(old)

    @staticmethod
    def _row_key(power_type: str, parameters: dict) -> tuple[str, str]:
        return power_type, json.dumps(parameters, sort_keys=True, separators=(",", ":"))

    def _rows_matching(self, power_type: str, parameters: dict) -> list[int]:
        """The rows whose power type and JSON equal these, lowest id first."""
        return sorted(self._bmc_index.get(self._row_key(power_type, parameters), ()))

    def _index_bmc(self, row: BMCRow, add: bool) -> None:
        ids = self._bmc_index.setdefault(self._row_key(row.power_type, row.parameters), set())
        (ids.add if add else ids.discard)(row.id)

    def _new_bmc(self, power_type: str, parameters: dict, secrets: dict) -> int:
        row = BMCRow(next(self._bmc_ids), power_type, dict(parameters), dict(secrets))
        self.bmcs[row.id] = row
        self._bmc_nodes[row.id] = set()
        self._index_bmc(row, True)
        return row.id

    def _check_unique(self, power_type: str, parameters: dict, row_id: int | None = None) -> None:
        """maasserver_bmc_power_type_parameters_idx (src/maasserver/migrations/maasserver/
        0245_bmc_power_parameters_index_hash.py): unique (power_type, md5(power_parameters)) but for
        manual. A unique violation is a retryable failure (is_retryable_failure in src/maasserver/
        utils/orm.py): WebApplicationHandler.get_response (src/maasserver/utils/views.py) runs the
        request again, 10 times over about 20 s, then answers 409 with Retry-After. The double
        answers that 409 at once."""
        if power_type != "manual" and any(other != row_id for other in self._rows_matching(power_type, parameters)):
            raise MaasRefused(409, CONFLICT_PAGE.encode(), {"Content-Type": "text/html; charset=utf-8",
                                                           "Retry-After": RETRY_AFTER["409"]})

    def _create_bmc(self, power_type: str, bmc_params: dict, unique: bool = True) -> int:
        """create_bmc (src/maasserver/models/bmc.py): a new row, secrets apart."""
        parameters, secrets = sanitise_power_parameters(power_type, bmc_params)
        if unique:
            self._check_unique(power_type, parameters)
        return self._new_bmc(power_type, parameters, secrets)

    def _get_or_create_bmc(self, power_type: str, bmc_params: dict) -> int:
        """get_or_create_bmc (src/maasserver/models/bmc.py): the row with these non-secret
        parameters, or a new one. Only a new row gets the secrets: a machine that joins a row
        holds the row's password, and the one it gave is dropped."""
        parameters, secrets = sanitise_power_parameters(power_type, bmc_params)
        found = self._rows_matching(power_type, parameters)
        if len(found) > 1:   # only a back door can make two (QuerySet.get's MultipleObjectsReturned)
            raise MaasRefused(500, f"get() returned more than one BMC -- it returned {len(found)}!")
        return found[0] if found else self._new_bmc(power_type, parameters, secrets)

    def _set_bmc_parameters(self, row_id: int, bmc_params: dict) -> None:
        """BMC.set_power_parameters, then save: the JSON is replaced, the secret only when the
        parameters hold one (otherwise the row keeps its password)."""
        row = self.bmcs[row_id]
        parameters, secrets = sanitise_power_parameters(row.power_type, bmc_params)
        if parameters != row.parameters:
            self._check_unique(row.power_type, parameters, row_id)
        self._index_bmc(row, False)
        row.parameters = dict(parameters)
        self._index_bmc(row, True)
        if secrets:
            row.secrets = dict(secrets)   # SecretManager.set_composite_secret replaces it whole

    def _point(self, system_id: str, row_id: int | None) -> None:
        """The machine's BMC becomes this row; its power type is the row's (Node.power_type)."""
        old = self._bmc_of.pop(system_id, None)
        if old is not None:
            self._bmc_nodes[old].discard(system_id)
        if row_id is not None:
            self._bmc_of[system_id] = row_id
            self._bmc_nodes[row_id].add(system_id)
        power_type = self.bmcs[row_id].power_type if row_id is not None else ""
        machine = self.machines[system_id]
        if machine["power_type"] != power_type:
            machine["power_type"] = power_type

    def _drop_bmc_if_unused(self, row_id: int) -> None:
        """Deleted once no node is on it (Node.set_power_config, Node.delete)."""
        if row_id in self.bmcs and not self._bmc_nodes[row_id]:
            self._index_bmc(self.bmcs.pop(row_id), False)
            del self._bmc_nodes[row_id]

    def _attach_power(self, system_id: str, power_type: str, params: dict) -> None:
        """A new machine's power, as set_power_config gives it to a machine without a BMC; but a
        second identical row of a type that is no chassis is let through (MAAS's unique index
        would answer 409), so that tests can add many IPMI machines with the same defaults."""
        chassis, bmc_params, node_params = scope_power_parameters(power_type, params)
        if power_type:
            row_id = self._get_or_create_bmc(power_type, bmc_params) if chassis else \
                self._create_bmc(power_type, bmc_params, unique=False)
            self._point(system_id, row_id)
        self.instance_power[system_id] = dict(node_params)

    def _write_power(self, system_id: str, name: str, value: Any, delete: bool = False) -> None:
        """A back door: one parameter written where MAAS keeps it (the row's for a BMC-scoped one,
        so every machine on the row sees it), with no check."""
        with self.lock:
            row = self.bmcs.get(self._bmc_of.get(system_id, -1))
            _, bmc, _ = scope_power_parameters(row.power_type if row else "", {name: value})
            if row is None or not bmc:
                target = self.instance_power.setdefault(system_id, {})
            elif sanitise_power_parameters(row.power_type, bmc)[1]:
                target = row.secrets
            else:
                self._index_bmc(row, False)
                if delete:
                    row.parameters.pop(name, None)
                else:
                    row.parameters[name] = value
                self._index_bmc(row, True)
                return
            if delete:
                target.pop(name, None)
            else:
                target[name] = value

    def _replace_power(self, system_id: str, params: dict) -> None:
        """A back door (``double.power[sid] = {...}``): the machine alone gets a new row of its power
        type holding exactly these BMC-scoped parameters, and these as its own."""
        with self.lock:
            old = self._bmc_of.get(system_id)
            power_type = self.bmcs[old].power_type if old is not None else ""
            _, bmc_params, node_params = scope_power_parameters(power_type, params)
            if old is not None:
                self._point(system_id, self._create_bmc(power_type, bmc_params, unique=False))
                self._drop_bmc_if_unused(old)
            self.instance_power[system_id] = dict(node_params)

    def _form_power_parameters(self, power_type: str, current: dict, given: dict) -> tuple[dict, list[str]]:
        """The power parameters a machine form hands to set_power_config, and its errors: every
        setting of the type, from the request, else the machine's, else the driver's default
        (WithPowerTypeMixin._get_power_parameters and set_up_power_fields in src/maasserver/forms/
        __init__.py, get_overridden_query_dict in src/maasserver/api/utils.py, DictCharField in
        src/maasserver/config_forms.py); a required one left empty is refused."""
        settings = POWER_SETTINGS.get(power_type, {})
        if settings and not any(given.get(n) is not None or current.get(n) is not None for n in settings):
            # DictCharField.clean_global_empty: nothing at all for a type with a required field.
            required = any(setting[1] for setting in settings.values())
            return {}, ["This field is required."] if required else []
        merged: dict[str, Any] = {}
        errors = []
        for name, (label, required, _scope, _secret, default) in settings.items():
            value = given[name] if given.get(name) is not None else current.get(name)
            if value is None:
                value = default if default is not None else ""
            if required and value in ("", []):
                errors.append(f"{label}: This field is required.")
            merged[name] = value
        return merged, errors

    # --- the machines' own requests: anonymous enlistment and the metadata API ---------------------

    def anonymous_enlist(self, fields: dict[str, Any]) -> tuple[int, Any]:
        """An anonymous POST machines/ with these form fields (a list for a repeated one, such as
        mac_addresses), as the HTTP path answers it: (status, body)."""
        lists = {k: list(v) for k, v in fields.items() if isinstance(v, (list, tuple))}
        single = {k: (v[-1] if v else "") if isinstance(v, (list, tuple)) else str(v) for k, v in fields.items()}
        status, body, _ = self._anonymous_create(Request("POST", "machines/", {}, single, {}, lists, True))
        return status, json.loads(body) if isinstance(body, bytes) else body

    def _anonymous_create(self, request: Request) -> tuple[int, Any, dict[str, str]]:
        """AnonMachinesHandler.create (src/maasserver/api/machines.py): BMC enlistment (IPMI only),
        then MAC enlistment, updates a machine in New or Commissioning; otherwise create_machine
        makes one (MachineWithPowerAndMACAddressesForm). What the update changes is
        _update_new_node's: architecture and power, nothing else, and no event."""
        with self.lock:
            fields = request.fields
            architecture = fields.get("architecture")
            power_type = fields.get("power_type")
            power_parameters = fields.get("power_parameters")
            macs = request.getlist("mac_addresses")
            commission = fields.get("commission")
            if commission is not None and commission.lower() not in _TRUE + _FALSE + ("",):
                # get_optional_param(..., validator=StringBool): MAASAPIValidationError, text.
                return 400, "Invalid commission: Value should be 'true' or 'false'", {}
            commission = commission is not None and commission.lower() in _TRUE
            try:
                system_id = None
                if power_type == "ipmi" and power_parameters:
                    # BMC enlistment: a machine whose row's JSON has this power_address.
                    address = json.loads(power_parameters).get("power_address", "")
                    system_id = next((sid for sid, m in self.machines.items() if m["status_name"] in ENLISTABLE
                                      and self.bmcs.get(self._bmc_of.get(sid, -1)) is not None
                                      and self.bmcs[self._bmc_of[sid]].parameters.get("power_address", None) == address),
                                     None)
                if system_id is None and macs and all(_MAC.fullmatch(mac) for mac in macs):
                    # MAC enlistment: Interface.objects.filter(mac_address__in=the MACs as given),
                    # against MACs stored normalised, among machines in New or Commissioning.
                    system_id = next((sid for sid, m in self.machines.items() if m["status_name"] in ENLISTABLE
                                      and set(macs) & set(self.macs.get(sid, ()))), None)
                if system_id is not None:
                    self._update_new_node(system_id, architecture, power_type, power_parameters)
                else:
                    system_id = self._create_machine(request, commission)
            except (ValueError, AttributeError) as problem:   # ExceptionMiddleware: 500, its text
                return 500, str(problem), {}
            except MaasRefused as refused:
                return refused.status, refused.body, refused.headers
            return 200, self._anon_json(system_id), {}

    def _anon_json(self, system_id: str) -> dict:
        """A machine as AnonMachineHandler emits it (DISPLAYED_ANON_MACHINE_FIELDS)."""
        machine = self.machines[system_id]
        names = ("system_id", "hostname", "domain", "fqdn", "architecture", "status", "power_type",
                 "power_state", "zone", "status_action", "status_message", "status_name", "node_type")
        return {**{name: machine[name] for name in names}, "resource_uri": f"/MAAS/api/2.0/machines/{system_id}/"}

    def _architecture_errors(self, architecture: str | None) -> dict[str, list[str]]:
        """MachineForm.set_up_architecture_field with requires_arch: required, one of the usable."""
        if not architecture:
            return {"architecture": ["This field is required."]}
        if architecture not in self.architectures:
            choices = ", ".join(f"'{arch}'" for arch in self.architectures)
            return {"architecture": [f"'{architecture}' is not a valid architecture.  It should be one of: {choices}."]}
        return {}

    @staticmethod
    def _fix_architecture(architecture: str | None, subarchitecture: str | None) -> str | None:
        """fix_architecture (src/maasserver/api/machines.py): "amd64" is "amd64/generic"."""
        if architecture and "/" in architecture:
            if subarchitecture:
                raise MaasRefused(400, "Subarchitecture cannot be specified twice.")
            return architecture
        if architecture:
            return f"{architecture}/{subarchitecture or 'generic'}"
        return architecture

    def _json_power_parameters(self, text: str | None) -> dict:
        """WithPowerTypeMixin._get_power_parameters: the JSON power_parameters, refused (400, text)
        when it does not parse."""
        if text is None or text.strip() == "":
            return {}
        try:
            parameters = json.loads(text)
        except json.JSONDecodeError:
            raise MaasRefused(400, "Failed to parse JSON power_parameters") from None
        return parameters if isinstance(parameters, dict) else {}

    def _update_new_node(self, system_id: str, architecture: str | None, power_type: str | None,
                         power_parameters: str | None) -> None:
        """AnonMachinesHandler._update_new_node: without power, MachineForm sets the architecture;
        with, AdminMachineForm sets it and the power through set_power_config, the JSON's values
        over the machine's (a password left out is kept). A power_parameters without power_type
        leaves the form's power_type "" (the request's None), so check_driver empties the
        parameters and the machine's type is saved with none. Unknown keys are dropped
        (get_overridden_query_dict carries only the type's settings). Raises MaasRefused."""
        architecture = self._fix_architecture(architecture, None)
        errors = self._architecture_errors(architecture)
        machine = self.machines[system_id]
        if not power_type and not power_parameters:
            if errors:
                raise MaasRefused(400, errors)
            machine["architecture"] = architecture
            return
        given = self._json_power_parameters(power_parameters)
        current_type = machine["power_type"]
        form_type = power_type if power_type in POWER_SETTINGS else current_type
        if power_type is not None and power_type != "" and power_type not in POWER_SETTINGS:
            errors["power_type"] = [f"Select a valid choice. {power_type} is not one of the available choices."]
        merged, problems = self._form_power_parameters(form_type, self.power_parameters(system_id), given)
        if problems:
            errors["power_parameters"] = problems
        if errors:
            raise MaasRefused(400, errors)
        if power_type is None or power_type not in POWER_SETTINGS:
            merged = {}   # check_driver: the cleaned power_type is ""
        new_type = current_type if power_type is None else power_type   # set_values
        if new_type and address_refused(new_type, merged):
            raise MaasRefused(500, NETMASK_ERROR)
        if new_type != current_type or new_type:
            self.set_power_config(system_id, new_type, merged)
        machine["architecture"] = architecture

    def _create_machine(self, request: Request, commission: bool) -> str:
        """create_machine (src/maasserver/api/machines.py) with MachineWithPowerAndMACAddressesForm
        (src/maasserver/forms/__init__.py): the architecture, the MACs (required unless IPMI; one
        another node has is refused), the power type and its parameters validated whole; then the
        machine, in Commissioning when ``commission`` (with NodeMetadata "enlisting"), its power
        through set_power_config. Raises MaasRefused."""
        fields = request.fields
        architecture = self._fix_architecture(fields.get("architecture"), fields.get("subarchitecture"))
        given = self._json_power_parameters(fields.get("power_parameters"))
        power_type = fields.get("power_type")
        errors = self._architecture_errors(architecture)
        hostname = fields.get("hostname")
        if hostname:
            if not _HOSTNAME.match(hostname):
                errors["hostname"] = [f"Invalid hostname: {hostname}"]
            elif self.hostname_holder(hostname) is not None:
                errors["hostname"] = ["Node with this Hostname already exists."]
        macs = [mac for mac in request.getlist("mac_addresses") if mac]
        mac_errors = [f"'{mac}' is not a valid MAC address." for mac in macs if not _MAC.fullmatch(mac)]
        if not mac_errors:
            # WithMACAddressesMixin.clean_mac_addresses: a MAC another node's interface has.
            macs = [normalise_mac(mac) for mac in macs]
            holders = {mac: sid for sid, held in self.macs.items() for mac in held}
            mac_errors = [f"MAC address {mac} already in use on {self.machines[holders[mac]]['hostname']}."
                          for mac in macs if mac in holders]
        if not macs and power_type != "ipmi":   # requires_macs_and_architecture
            mac_errors = ["This field is required."]
        if mac_errors:
            errors["mac_addresses"] = mac_errors if len(macs) <= 1 else [
                "One or more MAC addresses is invalid. (" + " \u2014 ".join(mac_errors[:10]) +
                (f" and {len(mac_errors) - 10} more error{'s' if len(mac_errors) > 11 else ''}"
                 if len(mac_errors) > 10 else "") + ")"]
        typed = power_type in POWER_SETTINGS
        if power_type not in (None, "") and not typed:
            errors["power_type"] = [f"Select a valid choice. {power_type} is not one of the available choices."]
        elif typed and power_type != "ipmi" and (mac_errors or not macs):
            # MachineForm.clean: a new machine has no interface but the MACs that validated.
            errors["power_type"] = [f"Can't set power type to {power_type} without network interfaces"]
        merged: dict = {}
        if typed:
            merged, problems = self._form_power_parameters(power_type, {}, given)
            if problems:
                errors["power_parameters"] = problems
        if errors:
            raise MaasRefused(400, errors)
        if typed and address_refused(power_type, merged):
            raise MaasRefused(500, NETMASK_ERROR)   # BMC.clean; the request's transaction rolls back
        if typed and not CHASSIS[power_type]:
            self._check_unique(power_type, sanitise_power_parameters(power_type, scope_power_parameters(
                power_type, merged)[1])[0])        # create_bmc's row, before anything is kept
        system_id = self.add_machine(hostname or None, power_type="", status="Commissioning" if commission else "New",
                                     mac_addresses=macs or None)
        if not macs:
            self.macs[system_id] = []
        self.machines[system_id]["architecture"] = architecture
        if commission:
            self.enlisting.add(system_id)
        if typed:
            self.set_power_config(system_id, power_type, merged)
        return system_id

    def machine_key(self, system_id: str) -> str:
        """The machine's OAuth token, "consumer:token:secret", as its preseed gives it (NodeKey;
        MAAS makes it anew when commissioning starts, the double keeps one)."""
        with self.lock:
            if system_id not in self.tokens:
                self.tokens[system_id] = tuple("".join(self._random.choice("abcdefghjkmnpqrstuvwxyz23456789")
                                                       for _ in range(size)) for size in (18, 18, 32))
            return ":".join(self.tokens[system_id])

    def signal(self, system_id: str, status: str = "OK", *, power_type: str | None = None,
               power_parameters: dict | str | None = None, error: str = "") -> tuple[int, Any]:
        """The machine's own metadata signal (VersionIndexHandler.signal, src/metadataserver/api.py):
        (status, body). In New only COMMISSIONING counts (_process_new); in Commissioning and
        Deployed (_process_commissioning) power_type and power_parameters are stored
        (store_node_power_parameters), then OK makes it Ready (New while enlisting), FAILED Failed
        commissioning, TESTING Testing, each with its event and a status change MAAS allows."""
        with self.lock:
            if status not in SIGNAL_STATUSES:
                return 400, f"Unknown status: '{status}'"
            machine = self.machines[system_id]
            current = machine["status_name"]
            if current not in SIGNALABLE:
                return 409, f"Machine status isn't valid (status is {current})"
            target = None
            if current == "New":
                target = "Commissioning" if status == "COMMISSIONING" else None
            elif current in ("Commissioning", "Deployed"):
                target = SIGNAL_TARGETS.get(status)
                enlisting = system_id in self.enlisting and target in ("Ready", "Failed commissioning")
                if enlisting and target == "Ready":
                    target = "New"
                if target not in (None, current) and target not in TRANSITIONS[current]:
                    # Node.update_status: NodeStateViolation, and the transaction (the power stored
                    # first included) rolls back.
                    return 409, f"Invalid transition: {current} -> {target}."
                try:
                    self._store_node_power_parameters(system_id, power_type, power_parameters)
                except MaasRefused as refused:
                    return refused.status, refused.body
                if enlisting:
                    self.enlisting.discard(system_id)
            else:
                return 200, "OK"   # signalable; its _process_* is not modelled (see SIGNALABLE)
            event = {"Ready": "READY", "Failed commissioning": "FAILED_COMMISSIONING", "New": "NEW"}.get(target)
            if event:
                self.record(system_id, event)
            if target in (None, current):
                return 200, "OK"
            self.set_status(system_id, target)
            machine["error_description"] = error
            return 200, "OK"

    def _store_node_power_parameters(self, system_id: str, power_type: str | None,
                                     power_parameters: dict | str | None) -> None:
        """store_node_power_parameters (src/metadataserver/api.py): a redfish machine stays redfish;
        the JSON parameters (none: the machine's) over the machine's own node-scoped ones for
        redfish, cut to node_id, power_address, power_pass and power_user, go to set_power_config
        as they are: not merged with the row's, so a signal without power_pass keeps the row's
        password or finds another row. Raises MaasRefused."""
        if power_type is None:
            return
        if self.machines[system_id]["power_type"] == "redfish":
            power_type = "redfish"
        if power_type not in POWER_SETTINGS and power_type != "":
            raise MaasRefused(400, f"Bad power_type '{power_type}'")
        if isinstance(power_parameters, str) and power_parameters:
            try:
                params = json.loads(power_parameters)
            except ValueError:
                raise MaasRefused(400, "Failed to parse JSON power_parameters") from None
        else:
            params = dict(power_parameters) if power_parameters else self.power_parameters(system_id)
        if not isinstance(params, dict):   # {**..., **params} raises TypeError: 500
            raise MaasRefused(500, f"'{type(params).__name__}' object is not a mapping")
        if power_type == "redfish":
            params = {**self.instance_power.get(system_id, {}), **params}
            params = {k: params[k] for k in ("node_id", "power_address", "power_pass", "power_user") if k in params}
        if address_refused(power_type, params):
            raise MaasRefused(500, NETMASK_ERROR)   # BMC.clean, as for the PUT
        self.set_power_config(system_id, power_type, params)

    def _metadata(self, method: str, path: str, query: dict[str, list[str]], fields: dict[str, str],
                  authorization: str | None) -> tuple[int, Any, dict[str, str]]:
        """/MAAS/metadata/ (src/metadataserver/urls.py): a machine's preseed by id (anonymous
        op=get_preseed, AnonMetaDataHandler) and its signal (op=signal, its own OAuth token)."""
        op = (query.get("op") or [fields.get("op")])[0]
        match = re.fullmatch(r"/*latest/by-id/([^/]+)/", path)
        if match and method == "GET" and op == "get_preseed":
            if match[1] not in self.machines:
                return 404, "No Node matches the given query.", {}
            consumer, token, secret = self.machine_key(match[1]).split(":")
            preseed = {"datasource": {"MAAS": {"metadata_url": "http://127.0.0.1/MAAS/metadata/",
                                               "consumer_key": consumer, "token_key": token,
                                               "token_secret": secret}}}
            return 200, yaml.safe_dump(preseed), {}
        if re.fullmatch(r"/*[^/]+/", path) and method == "POST" and op == "signal":
            system_id, problem = self._node_for(authorization)
            if system_id is None:
                return 401, problem, {}
            if "status" not in fields:
                return 400, "No provided status!", {}
            status, body = self.signal(system_id, fields["status"], power_type=fields.get("power_type"),
                                       power_parameters=fields.get("power_parameters"), error=fields.get("error", ""))
            return status, body, {}
        return 404, "Not Found", {}

    def _node_for(self, header: str | None) -> tuple[str | None, str]:
        """(the machine whose token signs this PLAINTEXT header, or None and why not)."""
        if not header or not header.startswith("OAuth "):
            return None, "Authorization header missing"
        params = {}
        for part in header[6:].split(","):
            key, _, value = part.strip().partition("=")
            params[key] = unquote(value.strip('"'))
        with self.lock:
            owner = next((sid for sid, (consumer, token, _) in self.tokens.items()
                          if consumer == params.get("oauth_consumer_key") and token == params.get("oauth_token")), None)
            if owner is None or params.get("oauth_signature") != f"&{self.tokens[owner][2]}":
                return None, "Invalid consumer or access token"
            nonce = params.get("oauth_nonce")
            if not nonce or nonce in self.nonces:
                return None, "Nonce already used"
            self.nonces.add(nonce)
        return owner, ""

    # --- changes behind the reconciler's back ------------------------------------------------
    def enlist(self, vm: str, namespace: str, domain: str = "bmc.example.com", *, mac: str | None = None,
               **kw: Any) -> str:
        """A KubeVirt VM PXE-boots and enlists as maas_run_remote_scripts.py's enlist() does it
        (src/metadataserver/user_data/templates/snippets/maas_run_remote_scripts.py): an
        anonymous POST machines/ with commission=True and its BMC configuration creates it in
        Commissioning ("Node changed status" New -> Commissioning), then its OK signal ends
        enlistment's commissioning ("New" INFO, then "Node changed status" Commissioning -> New:
        src/metadataserver/api.py), as the real-MAAS tier recorded.
        An address MAAS refuses (any "/", URLs included) gets 500 and the script enlists again
        without the BMC configuration: the machine ends with power type "" and no power
        parameters (see ``add_vm``).
        With ``mac`` (and then only scheme, address, password and power_user) it is that anonymous
        POST itself, so a machine in New or Commissioning holding the MAC is updated instead
        (AnonMachinesHandler.create, "MAC enlistment"), and a redfish row with the same address
        and user is joined; without, the VM gets a MAC of its own."""
        with self.lock:
            if mac is not None:
                return self._enlist_by_mac(vm, namespace, domain, mac, **kw)
            system_id = self.add_vm(vm, namespace, domain, status="Commissioning", **kw)
            self.enlisting.add(system_id)
            self.signal(system_id, "OK")
            return system_id

    def _enlist_by_mac(self, vm: str, namespace: str, domain: str, mac: str, *, scheme: str | None = None,
                       password: str | None = None, address: str | None = None,
                       power_user: str = "maas") -> str:
        """enlist(mac=...): the anonymous POST itself (anonymous_enlist), again without the BMC
        configuration on a 500, then the OK signal."""
        if address is None:
            address = f"{scheme}://{vm}.{namespace}.{domain}/redfish/v1/Systems/1" if scheme else \
                f"{vm}.{namespace}.{domain}"
        bmc = {"power_address": address, "power_user": power_user,
               "power_pass": password or PLACEHOLDER_PASSWORD, "node_id": "1"}
        fields: dict[str, Any] = {"architecture": "amd64/generic", "mac_addresses": [mac], "commission": "True"}
        status, body = self.anonymous_enlist({**fields, "power_type": "redfish",
                                              "power_parameters": json.dumps(bmc)})
        if status == 500:
            status, body = self.anonymous_enlist(fields)
        if status != 200:
            raise MaasRefused(status, body)
        system_id = body["system_id"]
        self.bmc_config[system_id] = {**bmc, "power_pass": PLACEHOLDER_PASSWORD}
        self.signal(system_id, "OK")
        return system_id

    def rename(self, system_id: str, hostname: str) -> None:
        """An operator renames a machine (API or UI edit: MAAS records no event)."""
        with self.lock:
            machine = self.machines[system_id]
            self._hostnames.pop(machine["hostname"].lower(), None)
            self._hostnames[hostname.lower()] = system_id
            machine["hostname"], machine["fqdn"] = hostname, f"{hostname}.maas"

    def move_to_pool(self, system_id: str, pool: str, *, via: str = "api") -> None:
        """An operator moves a machine: by the API (no event) or the UI's set-pool node action
        (an audited "Node" event, src/maasserver/node_action.py)."""
        with self.lock:
            if pool not in self.pools:
                self.add_pool(pool)
            self._set_pool(system_id, pool)
            if via == "ui":
                self.record(system_id, "NODE", f"Set the resource pool to '{pool}'.",
                            username="admin")

    def set_power_type(self, system_id: str, power_type: str, given: dict[str, Any]) -> None:
        """An administrator's PUT machines/{id}/ with power_type and these parameters (no event): the
        form fills the rest from the machine's current parameters, as for anonymous enlistment."""
        with self.lock:
            merged, problems = self._form_power_parameters(power_type, self.power_parameters(system_id), given)
            if problems:
                raise MaasRefused(400, {"power_parameters": problems})
            self.set_power_config(system_id, power_type, merged)

    def set_power_address(self, system_id: str, address: str) -> None:
        """An operator edits the power address (PUT machines/{id}/ power_parameters_power_address:
        MAAS records no event): the form's parameters through set_power_config, so the machine's
        row is updated in place and every machine on it follows; raises MaasRefused (409) where the
        row would equal another. An address MAAS would refuse (any "/") is stored all the same, a
        back door for tests of what MAAS cannot hold; so is one of a type without settings."""
        with self.lock:
            power_type = self.machines[system_id]["power_type"]
            if not POWER_SETTINGS.get(power_type):
                self.power[system_id]["power_address"] = address
                return
            merged, _ = self._form_power_parameters(power_type, self.power_parameters(system_id),
                                                    {"power_address": address})
            self.set_power_config(system_id, power_type, merged)

    def delete_machine(self, system_id: str, *, via: str = "api") -> None:
        """An operator deletes a machine; its events are detached (node NULL), as MAAS does."""
        with self.lock:
            if via == "ui":
                self.record(system_id, "NODE", "Deleted the machine.", username="admin")
            # Node.delete deletes the machine's BMC row when no other node is on it.
            row_id = self._bmc_of.pop(system_id, None)
            if row_id is not None:
                self._bmc_nodes[row_id].discard(system_id)
                self._drop_bmc_if_unused(row_id)
            machine = self.machines.pop(system_id)
            self.instance_power.pop(system_id, None)
            self.macs.pop(system_id, None)
            self.enlisting.discard(system_id)
            self.tokens.pop(system_id, None)
            self.bmc_config.pop(system_id, None)
            if self._hostnames.get(machine["hostname"].lower()) == system_id:
                del self._hostnames[machine["hostname"].lower()]
            for event in self.events:
                if event["node"] == system_id:
                    event["node"] = None

    def prune_events(self, keep: int) -> int:
        """Delete all but the newest ``keep`` events (an operator trimming the table)."""
        with self.lock:
            dropped = max(0, len(self.events) - keep)
            del self.events[:dropped]
            return dropped

    # --- the event log -----------------------------------------------------------------------
    def record(self, system_id: str | None, type_name: str, description: str = "",
               username: str = "") -> dict:
        """Record one event of a type from EVENT_TYPES for a machine."""
        with self.lock:
            type_description, level = EVENT_TYPES[type_name]
            machine = self.machines.get(system_id) if system_id else None
            event = {
                "id": next(self._event_ids), "node": system_id if machine else None,
                "hostname": machine["hostname"] if machine else "", "level": level,
                "created": time.strftime("%a, %d %b. %Y %H:%M:%S", time.gmtime()),
                "type": type_description, "description": description,
                "username": username or "unknown",
            }
            self.events.append(event)
            return event

    def newest_event_id(self) -> int:
        with self.lock:
            return self.events[-1]["id"] if self.events else 0

    def _query_events(self, query: dict[str, list[str]]) -> tuple[int, Any]:
        """GET events/?op=query as src/maasserver/api/events.py answers it."""
        def number(name: str) -> int | None:
            value = (query.get(name) or [None])[0]
            if value is None:
                return None
            if not re.fullmatch(r"-?\d+", value):
                raise ValueError(f"{name}: Please enter an integer value")
            return int(value)

        try:
            after, before = number("after"), number("before")
            limit = number("limit")
        except ValueError as problem:
            return 400, {"__all__": [str(problem)]}
        limit = DEFAULT_EVENT_LOG_LIMIT if limit is None else limit
        if limit > MAX_EVENT_LOG_COUNT:
            return 400, (f"Requested number of events {limit} is greater than limit: "
                         f"{MAX_EVENT_LOG_COUNT}")
        limit = max(1, limit)
        level = (query.get("level") or ["INFO"])[0]
        if level not in LEVELS:
            return 400, f"Unrecognised log level: {level}"
        if after is not None and before is not None:
            return 400, "There is undetermined behaviour when both `after` and `before` are specified."
        nodes = set(self.machines)
        if "id" in query:
            nodes &= set(query["id"])
        if "hostname" in query:
            nodes = {sid for sid in nodes if self.machines[sid]["hostname"] in query["hostname"]}
        if level == "AUDIT":
            wanted = [e for e in self.events if e["level"] == "AUDIT" and e["node"] in nodes]
        else:
            floor = LEVELS[level]
            wanted = [e for e in self.events if e["node"] in nodes and LEVELS[e["level"]] >= floor
                      and e["level"] != "AUDIT"]
        if after is None and before is None:
            chosen = wanted[::-1][:limit]
        elif after is None:
            chosen = [e for e in wanted if e["id"] < before][::-1][:limit]
        else:
            chosen = [e for e in wanted if e["id"] > after][:limit][::-1]
        base = "/MAAS/api/2.0/events/"
        keep = {k: v for k, v in query.items() if k not in ("before", "after")}
        newer = dict(keep, after=[str(chosen[0]["id"])] if chosen else
                     ([str(before - 1)] if before is not None else []))
        older = dict(keep, before=[str(chosen[-1]["id"])] if chosen else
                     ([str(after + 1)] if after is not None else []))
        return 200, {
            "count": len(chosen), "events": chosen,
            "next_uri": f"{base}?{urlencode(newer, doseq=True)}",
            "prev_uri": f"{base}?{urlencode(older, doseq=True)}" if chosen or after is not None else None,
        }

    def hostname_holder(self, hostname: str) -> str | None:
        """The node (machine, device or controller) holding hostname."""
        system_id = self._hostnames.get(hostname.lower())
        node = (self.machines.get(system_id) or self.other_nodes.get(system_id)) if system_id else None
        if node is not None and node["hostname"].lower() == hostname.lower():
            return system_id
        return None

    def passwords(self) -> list[str]:
        """Every stored power password but the public placeholder."""
        return [p["power_pass"] for p in self.power.values()
                if p.get("power_pass") and p["power_pass"] != PLACEHOLDER_PASSWORD]

    # --- faults and counts -----------------------------------------------------------------
    def inject(self, kind: str, *, method: str | None = None, path: str | None = None,
               count: int = 1, retry_after: str | None = MAAS_DEFAULT, hang: float = 3.0,
               status: int = 400, body: Any = None) -> None:
        with self.lock:
            self.faults.append(Fault(kind, method, path, count, retry_after, hang, status, body))

    def clear_faults(self) -> None:
        with self.lock:
            self.faults.clear()

    def reset_counts(self) -> None:
        with self.lock:
            self.log.clear()
            self.urls.clear()
            self.counts.clear()
            self.bytes_in = self.bytes_out = 0

    @property
    def request_count(self) -> int:
        return sum(self.counts.values())

    def _take_fault(self, request: Request, target: str) -> Fault | None:
        with self.lock:
            for fault in self.faults:
                if fault.method and fault.method != request.method:
                    continue
                if fault.path and not re.search(fault.path, target):
                    continue
                if fault.kind == "race-commission" and request.op != "commission":
                    continue
                if fault.kind == "race-rename" and not (request.method == "PUT" and "hostname" in request.fields):
                    continue
                fault.count -= 1
                if fault.count <= 0:
                    self.faults.remove(fault)
                return fault
        return None

    # --- auth ------------------------------------------------------------------------------
    def check_auth(self, header: str | None) -> str | None:
        """None when the PLAINTEXT signature is right, else why not."""
        if not header or not header.startswith("OAuth "):
            return "Authorization header missing"
        params = {}
        for part in header[6:].split(","):
            key, _, value = part.strip().partition("=")
            params[key] = unquote(value.strip('"'))
        consumer, token, secret = self.api_key
        if params.get("oauth_signature_method") != "PLAINTEXT":
            return "expected oauth_signature_method PLAINTEXT"
        if params.get("oauth_consumer_key") != consumer or params.get("oauth_token") != token:
            return "Invalid consumer or access token"
        if params.get("oauth_signature") != f"&{secret}":
            return "Invalid signature"
        nonce, timestamp = params.get("oauth_nonce"), params.get("oauth_timestamp", "")
        if not nonce or not timestamp.isdigit() or abs(int(timestamp) - time.time()) > 300:
            return "Missing or stale nonce or timestamp"
        with self.lock:
            if nonce in self.nonces:
                return "Nonce already used"
            self.nonces.add(nonce)
        return None

    # --- the API ---------------------------------------------------------------------------
    def handle(self, request: Request) -> tuple[int, Any, dict[str, str]]:
        """(status, body: JSON-able or bytes/str, headers)."""
        path, method, op = request.path, request.method, request.op
        with self.lock:
            if path == "version/" and method == "GET":
                return 200, {"capabilities": ["networks-management", "static-ipaddresses"],
                             "version": self.version, "subversion": ""}, {}
            if path == "nodes/" and method == "GET" and op is None:
                # src/maasserver/api/nodes.py: every node type, hostname filter exact (hostname__in).
                nodes = [{**m, "node_type": 0, "node_type_name": "Machine"} for m in self.machines.values()]
                nodes += list(self.other_nodes.values())
                if "hostname" in request.query:
                    nodes = [n for n in nodes if n["hostname"] in request.query["hostname"]]
                return 200, nodes, {}
            if path == "machines/":
                if method == "GET" and op == "power_parameters":
                    if not self.admin:  # @admin_method (src/maasserver/api/nodes.py)
                        return 403, RESERVED_ADMIN, {}
                    ids = request.query.get("id")
                    chosen = ids if ids is not None else list(self.machines)
                    return 200, {sid: self.power_parameters(sid) for sid in chosen if sid in self.machines}, {}
                if method == "GET" and op is None:
                    if self.auto_advance:
                        self.advance()
                    # MAC_FIELD_VALIDATOR (src/maasserver/fields.py) on each mac_address given;
                    # the form's errors are a 400 (MAASAPIValidationError).
                    bad = [mac for mac in request.query.get("mac_address", []) if not _MAC.fullmatch(mac)]
                    if bad:
                        return 400, {"mac_address": [f"'{mac}' is not a valid MAC address." for mac in bad]}, {}
                    return 200, self._encode(self._list_machines(request.query), self.extra_records), {}
                if method == "POST" and op is None and request.anonymous:
                    return self._anonymous_create(request)
                return 400, f"Unrecognised signature: method={method} op={op}", {}
            match = re.fullmatch(r"machines/([^/]+)/", path)
            if match:
                return self._machine(request, match[1])
            if path == "tags/" or re.fullmatch(r"tags/([^/]+)/", path):
                return self._tags(request, path[len("tags/"):-1] or None)
            if path == "events/":
                if method == "GET" and op == "query":
                    status, body = self._query_events(request.query)
                    return status, body, {}
                return 400, f"Unrecognised signature: method={method} op={op}", {}
            if path == "resourcepools/":
                if method == "GET":
                    return 200, [self._pool_json(p) for p in self.pools.values()], {}
                if method == "POST":
                    if not self.admin:  # ResourcePoolForm permission: bare PermissionDenied()
                        return 403, "", {}
                    name = request.fields.get("name", "")
                    if not name or not _POOL.match(name):
                        return 400, {"name": ["This field is required." if not name else
                                              "Enter a valid value."]}, {}
                    if name in self.pools:
                        return 400, {"name": ["Resource pool with this Name already exists."]}, {}
                    pool = self.add_pool(name, request.fields.get("description", ""))
                    self.writes.append(("POST", "resourcepools/", dict(request.fields)))
                    return 200, self._pool_json(pool), {}
            if path == "regioncontrollers/" and method == "GET" and op is None:
                # src/maasserver/api/regioncontrollers.py: RegionControllersHandler lists the
                # nodes of type region controller, or region and rack controller (add_node).
                return 200, [n for n in self.other_nodes.values() if n["node_type"] in (3, 4)], {}
            if path == "rackcontrollers/" and method == "GET" and op is None:
                # src/maasserver/api/rackcontrollers.py: RackControllersHandler lists the nodes
                # of type rack controller, or region and rack controller.
                return 200, [n for n in self.other_nodes.values() if n["node_type"] in (2, 4)], {}
            if path == "users/" and method == "GET" and op == "whoami":
                # src/maasserver/api/users.py: UsersHandler.whoami returns request.user, emitted
                # with UserHandler.fields (username, email, is_local, is_superuser).
                return 200, {"username": self.username, "email": f"{self.username}@example.com",
                             "is_local": True, "is_superuser": self.admin}, {}
            if path == "maas/" and method == "GET" and op == "get_config":
                # src/maasserver/api/maas.py: get_config answers the value as JSON; a missing
                # name is 400 (get_mandatory_param), an unknown one 400 from
                # src/maasserver/forms/settings.py validate_config_name.
                name = (request.query.get("name") or [""])[0]
                if not name:
                    return 400, "No provided name!", {}
                if name not in self.settings:
                    return 400, {name: [f"{name} is not a valid config setting."]}, {}
                return 200, json.dumps(self.settings[name]).encode(), {}
            if path == "scripts/" and method == "POST":
                if not self.admin:  # @admin_method (src/maasserver/api/scripts.py, 3.5)
                    return 403, RESERVED_ADMIN, {}
                return self._script_write(request, None)
            match = re.fullmatch(r"scripts/([^/]+)", path)
            if match:
                name = match[1]
                if name not in self.scripts:
                    return 404, "No Script matches the given query.", {}
                if method == "GET" and op == "download":
                    return 200, self.scripts[name]["script"], {"Content-Type": "application/binary"}
                if method == "GET" and op is None:
                    return 200, self._script_json(self.scripts[name]), {}
                if method == "PUT" and op is None:
                    if not self.admin:  # @admin_method (src/maasserver/api/scripts.py, 3.5)
                        return 403, RESERVED_ADMIN, {}
                    return self._script_write(request, name)
                if method == "DELETE" and op is None:
                    # NodeScriptHandler.delete (src/maasserver/api/scripts.py): admins only, 204.
                    if not self.admin:
                        return 403, RESERVED_ADMIN, {}
                    del self.scripts[name]
                    self.writes.append(("DELETE", f"scripts/{name}", {}))
                    return 204, b"", {}
            return 404, "Unknown API endpoint", {}

    @staticmethod
    def _encode(machines: list[_Machine], extra: Any = ()) -> bytes:
        """A JSON list of machines from their cached JSON (and extra records, as they are)."""
        parts = [machine.encoded() for machine in machines] + [json.dumps(r).encode() for r in extra]
        return b"[" + b", ".join(parts) + b"]"

    def machine_json(self, system_id: str) -> dict:
        """One machine as the API sends it (every field, heavy ones included)."""
        with self.lock:
            return json.loads(self.machines[system_id].encoded())

    def _list_machines(self, query: dict[str, list[str]]) -> list[_Machine]:
        if "id" in query:
            machines = [self.machines[sid] for sid in dict.fromkeys(query["id"]) if sid in self.machines]
            machines.sort(key=lambda m: m["system_id"])
        else:
            machines = list(self.machines.values())
        if "hostname" in query:
            machines = [m for m in machines if m["hostname"] in query["hostname"]]
        if "mac_address" in query:
            # ReadNodesForm (src/maasserver/node_constraint_filter_forms.py): the MACs are only
            # validated, then matched as given (current_config__interface__mac_address__in)
            # against the stored lower-case, colon form; so an upper-case MAC matches nothing.
            wanted = set(query["mac_address"])
            machines = [m for m in machines if wanted & set(self.macs.get(m["system_id"], ()))]
        if "status" in query:
            wanted = {s.lower().replace("_", " ") for s in query["status"]}
            machines = [m for m in machines if m["status_name"].lower() in wanted]
        if "pool" in query:
            machines = [m for m in machines if m["pool"]["name"] in query["pool"]]
        return machines

    def _pool_json(self, pool: dict) -> dict:
        members = [m for m in self.machines.values() if m["pool"]["id"] == pool["id"]]
        return {**pool, "machine_total_count": len(members),
                "machine_ready_count": sum(m["status_name"] == "Ready" for m in members),
                "resource_uri": f"/MAAS/api/2.0/resourcepool/{pool['id']}/"}

    def _tags(self, request: Request, name: str | None) -> tuple[int, Any, dict[str, str]]:
        """tags/ and tags/{name}/ as src/maasserver/api/tags.py answers them: GET tags/ lists
        every tag (TagHandler.fields), POST tags/ makes one through TagForm, POST
        tags/{name}/?op=update_nodes adds or removes machines; both writes are a superuser's
        (a bare PermissionDenied: an empty 403)."""
        method, op = request.method, request.op
        if name is None and method == "GET" and op is None:
            return 200, [self._tag_json(tag) for tag in self.tags.values()], {}
        if name is None and method == "POST" and op is None:
            if not self.admin:
                return 403, "", {}
            given = request.fields.get("name", "")
            # Tag.name: required, ^[a-zA-Z0-9_-]+$, at most 256 characters, unique (model validation).
            if not given:
                return 400, {"name": ["This field is required."]}, {}
            if not _TAG.fullmatch(given) or len(given) > 256:
                return 400, {"name": ["Enter a valid value."]}, {}
            if given in self.tags:
                return 400, {"name": ["Tag with this Name already exists."]}, {}
            self.tags[given] = {"name": given, "definition": request.fields.get("definition", ""),
                                "comment": request.fields.get("comment", ""),
                                "kernel_opts": request.fields.get("kernel_opts", "")}
            self.writes.append(("POST", "tags/", dict(request.fields)))
            return 200, self._tag_json(self.tags[given]), {}
        if name is not None and method == "GET" and op is None:
            if name not in self.tags:
                return 404, "No Tag matches the given query.", {}
            return 200, self._tag_json(self.tags[name]), {}
        if name is not None and method == "POST" and op == "update_nodes":
            if not self.admin:
                return 403, "", {}
            if name not in self.tags:
                return 404, "No Tag matches the given query.", {}
            # _get_nodes_for: the nodes with these system ids, those that exist; a node already
            # tagged counts as added again (tag.node_set.add is a no-op for it).
            add = [sid for sid in dict.fromkeys(request.getlist("add")) if sid in self.machines]
            remove = [sid for sid in dict.fromkeys(request.getlist("remove")) if sid in self.machines]
            for sid in add:
                if name not in self.machines[sid]["tag_names"]:
                    self.machines[sid]["tag_names"] = [*self.machines[sid]["tag_names"], name]
            for sid in remove:
                self.machines[sid]["tag_names"] = [t for t in self.machines[sid]["tag_names"] if t != name]
            self.writes.append(("POST", f"tags/{name}/", {"op": "update_nodes", **dict(request.fields)}))
            return 200, {"added": len(add), "removed": len(remove)}, {}
        return 400, f"Unrecognised signature: method={method} op={op}", {}

    @staticmethod
    def _tag_json(tag: dict) -> dict:
        return {**tag, "resource_uri": f"/MAAS/api/2.0/tags/{tag['name']}/"}

    def _machine(self, request: Request, system_id: str) -> tuple[int, Any, dict[str, str]]:
        machine = self.machines.get(system_id)
        if machine is None:
            return 404, "No Machine matches the given query.", {}
        method, op = request.method, request.op
        # get_node_or_404 with NodePermission.admin / admin_read (src/maasserver/api/machines.py
        # update and commission, src/maasserver/api/nodes.py power_parameters): an empty 403.
        admin_only = (method == "GET" and op == "power_parameters") or \
            (method == "PUT" and op is None) or (method == "POST" and op == "commission")
        if admin_only and not self.admin:
            return 403, "", {}
        if method == "GET" and op == "power_parameters":
            return 200, self.power_parameters(system_id), {}
        if method == "GET" and op is None:
            return 200, machine.encoded(), {}
        if method == "DELETE" and op is None:
            # MachineHandler.delete (src/maasserver/api/machines.py): get_node_or_404 with
            # NodePermission.admin (an empty 403 otherwise), Node.delete, then rc.DELETED (204).
            if not self.admin:
                return 403, "", {}
            self.delete_machine(system_id)
            self.writes.append(("DELETE", system_id, {}))
            return 204, b"", {}
        if method == "PUT" and op is None:
            errors: dict[str, list[str]] = {}
            hostname = request.fields.get("hostname")
            pool = request.fields.get("pool")
            if hostname is not None:
                holder = self.hostname_holder(hostname)
                if not _HOSTNAME.match(hostname):
                    errors["hostname"] = [f"Invalid hostname: {hostname}"]
                elif holder is not None and holder != system_id:
                    errors["hostname"] = ["Node with this Hostname already exists."]
            if pool is not None and pool not in self.pools:
                errors["pool"] = ["Select a valid choice. That choice is not one of the available choices."]
            power_type, power, problems = self._power_update(system_id, request.fields)
            errors.update(problems)
            if errors:
                return 400, errors, {}
            given = {key[len("power_parameters_"):]: value for key, value in request.fields.items()
                     if key.startswith("power_parameters_")}
            if power is not None and address_refused(power_type, given):
                # Raised while saving the BMC (BMC.clean, src/maasserver/models/bmc.py); the
                # request's transaction rolls back: nothing of this PUT is kept. MAAS judges the
                # merged parameters, but a stored address with "/" exists only through the
                # add_machine back door (MAAS cannot hold one), so judging the address the
                # request gives is the same on every state MAAS can reach, and leaves such a
                # back-door machine's other parameters writable for the tests that make one.
                return 500, NETMASK_ERROR, {}
            if power is not None:
                # WithPowerTypeMixin.set_values: one set_power_config with the form's parameters
                # (MAAS calls it for a PUT without power fields too, with the machine's own: a
                # no-op the double skips).
                try:
                    self.set_power_config(system_id, power_type, power)
                except MaasRefused as refused:
                    return refused.status, refused.body, refused.headers
            if hostname is not None:
                self._hostnames.pop(machine["hostname"].lower(), None)
                self._hostnames[hostname.lower()] = system_id
                machine["hostname"], machine["fqdn"] = hostname, f"{hostname}.maas"
            if pool is not None:
                self._set_pool(system_id, pool)
            self.writes.append(("PUT", system_id, {key: "(withheld)" if key.endswith("power_pass") else value
                                                   for key, value in request.fields.items()}))
            return 200, machine.encoded(), {}
        if method == "POST" and op == "deploy":
            return self._deploy(system_id, request.fields)
        if method == "POST" and op == "commission":
            if machine["status_name"] not in COMMISSION_FROM:
                return 400, {"__all__": [NOT_AVAILABLE]}, {}
            if machine["power_type"] == "":
                return 500, UNKNOWN_POWER_TYPE, {}   # before any event (start_commissioning)
            value = request.fields.get("skip_bmc_config", "")
            skip_bmc_config = bool(value) and value.lower() not in ("false", "0")
            # In the order Node.start_commissioning records them (src/maasserver/models/node.py):
            # the request, "Commissioning", the skipped bmc-config result, the status change.
            old = machine["status_name"]
            self.record(system_id, "REQUEST_NODE_START_COMMISSIONING", "(admin)", username="admin")
            self.record(system_id, "COMMISSIONING")
            if skip_bmc_config:
                self.record(system_id, "SCRIPT_RESULT_CHANGED_STATUS",
                            f"{BUILTIN_BMC_CONFIG} changed status from 'Pending' to 'Skipped'")
            self.set_status(system_id, "Commissioning")
            self.commissions.append((system_id, skip_bmc_config))
            self.writes.append(("POST", system_id, {"op": "commission", "skip_bmc_config": skip_bmc_config}))
            if not self.rack and machine["power_type"] != "manual":
                # No rack can reach the BMC: after the commit, Node._power_control_node fails
                # (_get_bmc_client_connection_info), _start_bmc_unavailable reverts the status,
                # and PowerProblem answers 503 with no Retry-After. A manual machine cannot be
                # powered by MAAS at all, so _start returns before any power call.
                self.record(system_id, "NODE_POWER_QUERY_FAILED",
                            "(admin) - " + NO_RACK.format(hostname=machine["hostname"]), username="admin")
                self.abort_commissioning(system_id, old)
                return 503, NO_RACK.format(hostname=machine["hostname"]), {}
            machine["power_state"] = "on"
            self.record(system_id, "NODE_POWERED_ON")
            bmc = self.bmc_config.get(system_id)
            if not skip_bmc_config and bmc is not None:
                # The script's upload is the machine's metadata signal (WORKING, with power_type
                # and power_parameters: maas_run_remote_scripts.py bmc_config); what MAAS refuses
                # there (an address with "/": 500) is not stored, and the double goes on.
                try:
                    self._store_node_power_parameters(system_id, "redfish", bmc)
                except MaasRefused:
                    pass
            return 200, machine.encoded(), {}
        return 400, f"Unrecognised signature: method={method} op={op}", {}

    def _deploy(self, system_id: str, fields: dict[str, str]) -> tuple[int, Any, dict[str, str]]:
        """POST machines/{id}/?op=deploy as MachineHandler.deploy (src/maasserver/api/machines.py):
        Ready is acquired (Node.acquire: "User acquiring node", Allocated), then Allocated becomes
        Deploying through Node.start ("User starting deployment", _start_deployment's status change
        and "Deploying") and MAAS powers it on; any other status is 409 (DEPLOY_FROM). The deploy
        ends when the installed OS signals (``advance``: Deployed)."""
        machine = self.machines[system_id]
        if machine["status_name"] == "Ready":
            if machine.get("owner") not in (None, self.username):
                return 409, "Can't allocate a machine belonging to another user.", {}
            self.record(system_id, "REQUEST_NODE_ACQUIRE", "(admin)", username="admin")
            self.set_status(system_id, "Allocated")
            machine["owner"] = self.username
        if machine["status_name"] not in DEPLOY_FROM:
            return 409, CANNOT_DEPLOY.format(status=machine["status_name"]), {}
        series = fields.get("distro_series") or DEFAULT_DISTRO_SERIES
        machine["osystem"], machine["distro_series"] = "ubuntu", series.split("/")[-1]
        self.record(system_id, "REQUEST_NODE_START_DEPLOYMENT", "(admin)", username="admin")
        self.set_status(system_id, "Deploying")
        # _start_deployment makes the installation's script set (not for an ephemeral deploy);
        # the API shows it as current_installation_result_id (src/maasserver/models/node.py,
        # src/maasserver/api/nodes.py) until the machine is marked fixed or deleted.
        if not machine.get("ephemeral_deploy"):
            machine["current_installation_result_id"] = next(self._script_sets)
        self.record(system_id, "DEPLOYING")
        self.writes.append(("POST", system_id, {"op": "deploy", **fields}))
        if not self.rack:
            # As a commission with no rack (see there): the power-on fails after the commit and
            # _start_bmc_unavailable reverts the status; PowerProblem answers 503.
            aborted = ABORTED.format(status="DEPLOYING", old="ALLOCATED")
            self.record(system_id, "NODE_POWER_QUERY_FAILED", aborted)
            self.set_status(system_id, "Allocated")
            machine["power_state"] = "unknown"
            return 503, NO_RACK.format(hostname=machine["hostname"]), {}
        machine["power_state"] = "on"
        self.record(system_id, "NODE_POWERED_ON")
        return 200, machine.encoded(), {}

    def _power_update(self, system_id: str, fields: dict[str, str]) -> tuple[str, dict | None, dict[str, list[str]]]:
        """(the power type, the parameters AdminMachineForm hands to set_power_config or None when
        the PUT changes no power, the field errors) for PUT machines/{id}/ (src/maasserver/forms/
        __init__.py, WithPowerTypeMixin): power_type among the drivers, power_parameters_<name>
        merged with the machine's (see _form_power_parameters)."""
        current_type = self.machines[system_id]["power_type"]
        power_type = fields.get("power_type", current_type)
        given = {key[len("power_parameters_"):]: value for key, value in fields.items()
                 if key.startswith("power_parameters_") and key != SKIP_CHECK}
        if power_type != "" and power_type not in POWER_SETTINGS:
            return current_type, None, {"power_type": [
                f"Select a valid choice. {power_type} is not one of the available choices."]}
        changed = power_type != current_type
        if not given and not changed:
            return power_type, None, {}
        if changed and power_type not in ("", "ipmi") and not self.macs.get(system_id):
            # MachineForm.clean: a machine without interfaces keeps its power type.
            return current_type, None, {"power_type": [
                f"Can't set power type to {power_type} without network interfaces"]}
        current = self.power_parameters(system_id)
        settings = POWER_SETTINGS.get(power_type, {})
        if fields.get(SKIP_CHECK) == "true":
            # DictCharField with skip_check: every power_parameters_ field, unchecked, over the
            # machine's values of the type's settings.
            merged = {**{k: v for k, v in current.items() if k in settings}, **given}
        else:
            unknown = sorted(set(given) - set(settings))
            if unknown:
                return power_type, None, {"power_parameters": [f"Unknown parameter(s): {', '.join(unknown)}."]}
            merged, problems = self._form_power_parameters(power_type, current, given)
            if problems:
                return power_type, None, {"power_parameters": problems}
        if power_type == "":
            # check_driver empties the parameters of no power type; set_values saves only a change.
            return power_type, ({} if changed else None), {}
        return power_type, merged, {}

    def _script_write(self, request: Request, name: str | None) -> tuple[int, Any, dict[str, str]]:
        """POST scripts/ (name None) or PUT scripts/{name}, as src/maasserver/api/scripts.py hands
        the upload to ScriptForm (src/maasserver/forms/script.py)."""
        data = dict(request.fields)
        content = request.files.get("script")
        if content is None and len(request.files) == 1:
            data["name"], content = next(iter(request.files.items()))
        instance = self.scripts.get(name) if name is not None else None
        errors: dict[str, list[str]] = {}
        if "comment" in data and content is None:
            errors["comment"] = ['"comment" may only be used when specifying a "script" as well.']
        comment = data.pop("comment", "")
        if content is not None:
            self._read_script(content.decode("utf-8", "replace"), data, instance is None, errors)
        if instance is None:
            for key in ("name", "script"):
                if not (content if key == "script" else data.get(key)):
                    errors.setdefault(key, ["This field is required."])
        new_name = data.get("name")
        if new_name is not None and not errors:
            if new_name.isdigit():
                errors["name"] = ["Cannot be a number."]
            elif shlex.quote(new_name) != new_name:
                errors["name"] = [f"Name '{new_name}' contains disallowed characters, e.g. space or quotes."]
            elif new_name != name and new_name in self.scripts:
                errors["name"] = ["Script with this Name already exists."]
        tags = data.get("tags")
        if tags is not None and not errors:
            tags = [t.strip() for t in str(tags).split(",") if t.strip()]  # SimpleArrayField
        if errors:
            return 400, errors, {}
        script = instance or {"id": len(self.scripts) + 1, "tags": [], "timeout": "0:00:00",
                              "history": [], "default": False}
        for key in ("name", "title", "description", "script_type", "hardware_type", "parallel"):
            if key in data:
                script[key] = data[key]
        script.setdefault("title", "")
        script.setdefault("description", "")
        if tags is not None:
            script["tags"] = tags
        if "timeout" in data:
            script["timeout"] = _duration(data["timeout"])
        # Script.save adds the hardware type's label as a tag (src/maasserver/models/script.py).
        if "node" not in script["tags"]:
            script["tags"] = script["tags"] + ["node"]
        if content is not None:
            script["script"] = content
            script["history"].insert(0, {"id": len(script["history"]) + 1, "comment": comment})
        if instance is not None and script["name"] != name:
            del self.scripts[name]
        self.scripts[script["name"]] = script
        self.writes.append(("POST", "scripts/", {"name": script["name"]}) if instance is None
                           else ("PUT", f"scripts/{name}", {k: v for k, v in data.items()
                                                            if k in ("tags", "timeout")}))
        return 200, self._script_json(script), {}

    @staticmethod
    def _script_json(script: dict) -> dict:
        return {k: v for k, v in script.items() if k != "script"}

    @staticmethod
    def _read_script(text: str, data: dict[str, Any], creating: bool, errors: dict[str, list[str]]) -> None:
        """ScriptForm._read_script and _clean_script: a shebang on line 1; the metadata block's
        values fill the fields not given; tags and timeout only when the script is created; a
        given field that differs from the embedded value is refused."""
        lines = text.splitlines()
        if lines and not lines[0].startswith("#!/"):
            errors.setdefault("script", []).append("Must start with shebang.")
        found, block = None, ""
        for line in lines[1:]:
            mark = _SCRIPT_DELIMITER.search(line)
            if mark is not None:
                if found is None and mark["version"] == "1.0":
                    found = mark["version"]
                    continue
                if found == mark["version"]:
                    break
            elif found is not None and line.strip() != "":
                if "#" not in line:
                    errors.setdefault("script", []).append('Missing "#" on YAML line.')
                    return
                block += line.split("#", 1)[1] + "\n"
        try:
            parsed = yaml.safe_load(block)
        except yaml.YAMLError as error:
            errors.setdefault("script", []).append(f"Invalid YAML: {error}")
            return
        if not isinstance(parsed, dict):
            return
        parsed.pop("results", None)
        parsed.pop("parameters", None)
        for key in ("tags", "timeout"):
            value = parsed.pop(key, None)
            if value is None or not creating or key in data:
                continue  # PUT keeps the stored tags and timeout unless the form gives them
            if key == "tags" and isinstance(value, list):
                if not all(isinstance(t, str) for t in value):
                    errors.setdefault("tags", []).append(
                        "Embedded tags must be a string of comma seperated values, or a list of strings.")
                    continue
                value = ",".join(value)
            data[key] = str(value)
        for key in ("packages", "for_hardware"):
            value = parsed.pop(key, None)
            if value is not None and key not in data:
                data[key] = json.dumps(value)
        for key, value in parsed.items():
            if key not in _SCRIPT_FIELDS:
                continue  # unknown keys are ignored
            if key not in data:
                data[key] = value
            elif value != data[key]:
                errors.setdefault(key, []).append("May not override values defined in embedded YAML.")


def _duration(text: Any) -> str:
    """A Django DurationField value ("00:05:00", "300") as MAAS shows it ("0:05:00")."""
    parts = [int(p) for p in str(text).split(":")]
    seconds = 0
    for part in parts:
        seconds = seconds * 60 + part
    return str(datetime.timedelta(seconds=seconds))


_ADJ = ["able", "brave", "calm", "eager", "fair", "gentle", "happy", "jolly", "keen", "lively"]
_NOUN = ["ant", "bee", "cat", "dog", "eel", "fox", "gnu", "hen", "ibis", "jay"]


def _parse_body(content_type: str, body: bytes) -> tuple[dict[str, str], dict[str, bytes], dict[str, list[str]]]:
    """(each field's last value, the files, every field's values)."""
    fields: dict[str, str] = {}
    files: dict[str, bytes] = {}
    lists: dict[str, list[str]] = {}
    if not body:
        return fields, files, lists
    if content_type.startswith("multipart/form-data"):
        message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
            b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body
        )
        for part in message.iter_parts():
            name = part.get_param("name", header="content-disposition")
            payload = part.get_payload(decode=True) or b""
            if part.get_param("filename", header="content-disposition") is not None:
                files[name] = payload
            else:
                fields[name] = payload.decode("utf-8")
                lists.setdefault(name, []).append(fields[name])
    elif content_type.startswith("application/x-www-form-urlencoded"):
        for key, values in parse_qs(body.decode("utf-8"), keep_blank_values=True).items():
            fields[key] = values[-1]
            lists[key] = values
    return fields, files, lists


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # injected resets and client timeouts end connections abruptly


class _Handler(BaseHTTPRequestHandler):
    double: MaasDouble
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are separate writes: no 40 ms stalls
    server_version = "maas-double/1.0"

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        if isinstance(body, (dict, list)):
            data, ctype = json.dumps(body).encode(), "application/json"
        elif isinstance(body, bytes):
            data, ctype = body, "application/json"
        else:
            data, ctype = str(body).encode(), "text/plain; charset=utf-8"
        headers = {"Content-Type": ctype, **(headers or {})}
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        for key, value in headers.items():
            self.send_header(key, value)
        sent = sum(len(line) for line in getattr(self, "_headers_buffer", [])) + 2 + len(data)
        with self.double.lock:
            self.double.bytes_out += sent
        self.end_headers()
        self.wfile.write(data)

    def _serve(self, method: str) -> None:
        double = self.double
        split = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if split.path == "/_double/advance":   # the bench: commissioning finishes now
            data = json.dumps({"moved": double.advance()}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        if split.path.startswith("/_double/"):
            with double.lock:
                stats = {"requests": double.request_count, "bytes_in": double.bytes_in,
                         "bytes_out": double.bytes_out,
                         "counts": {f"{m} {p}": n for (m, p), n in double.counts.items()}}
            data = json.dumps(stats).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        with double.lock:
            double.bytes_in += len(self.raw_requestline) + len(bytes(self.headers)) + len(body)
        if split.path.startswith("/MAAS/metadata/"):
            # The machines' own traffic (src/metadataserver/urls.py), not a client's: not counted.
            fields, files, _ = _parse_body(self.headers.get("Content-Type", ""), body)
            status, payload, headers = double._metadata(
                method, split.path[len("/MAAS/metadata/"):], parse_qs(split.query, keep_blank_values=True),
                fields, self.headers.get("Authorization"))
            self._send(status, payload, {"Content-Type": "text/plain", **headers} if isinstance(payload, str) else headers)
            return
        if not split.path.startswith(API_PREFIX):
            self._send(404, "Not Found")
            return
        path = split.path[len(API_PREFIX):]
        query = parse_qs(split.query, keep_blank_values=True)
        fields, files, lists = _parse_body(self.headers.get("Content-Type", ""), body)
        request = Request(method, path, query, fields, files, lists, self.headers.get("Authorization") is None)
        op = request.op
        with double.lock:
            double.log.append((method, path, op))
            double.urls.append(self.path)
            double.counts[(method, _shape(path) + (f"?op={op}" if op else ""))] += 1
        fault = double._take_fault(request, path + ("?" + split.query if split.query else ""))
        if fault and fault.kind == "reply":
            self._send(fault.status, fault.body)
            return
        if fault and fault.kind in ("503", "409", "500", "hang", "reset"):
            return self._fault(fault)
        # version/ is an OperationsResource without authentication (src/maasserver/urls_api.py,
        # "Allow anon."): whatever the Authorization header says, it answers.
        # machines/ has an anonymous handler (AnonMachinesHandler) for a request without one.
        anonymous = request.anonymous and method == "POST" and path == "machines/" and request.op is None
        problem = None if path == "version/" or anonymous else double.check_auth(self.headers.get("Authorization"))
        if problem:
            self._send(401, problem)
            return
        if fault and fault.kind == "echo":
            self._send(400, {"__all__": [f"{key}={value}" for key, value in fields.items()]})
            return
        if fault and fault.kind == "race-commission":
            match = re.fullmatch(r"machines/([^/]+)/", path)
            if match and match[1] in double.machines:
                double.set_status(match[1], "Commissioning")
        if fault and fault.kind == "race-rename":
            wanted = fields.get("hostname")
            if wanted and double.hostname_holder(wanted) is None:
                double.add_machine(wanted, power_type="manual", status="Ready")
        status, payload, headers = double.handle(request)
        if fault and fault.kind == "malformed":
            data = json.dumps(payload).encode() if isinstance(payload, (dict, list)) else str(payload).encode()
            self._send(200, data[: max(1, len(data) * 2 // 3)] + b"\x00{", {})
            return
        self._send(status, payload, headers)

    def _fault(self, fault: Fault) -> None:
        retry_after = RETRY_AFTER.get(fault.kind) if fault.retry_after == MAAS_DEFAULT else fault.retry_after
        headers = {"Retry-After": retry_after} if retry_after is not None else {}
        if fault.kind == "503":
            self._send(503, "Unable to connect to any rack controller; please try again later.", headers)
        elif fault.kind == "409":
            self._send(409, CONFLICT_PAGE.encode(), {"Content-Type": "text/html; charset=utf-8", **headers})
        elif fault.kind == "500":
            self._send(500, "<html><head><title>Internal Server Error</title></head><body>boom</body></html>")
        elif fault.kind == "hang":
            time.sleep(fault.hang)
            self.close_connection = True
        elif fault.kind == "reset":
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.connection.close()


def _shape(path: str) -> str:
    return re.sub(r"^machines/[^/]+/", "machines/{id}/", path)


def populate(double: MaasDouble, machines: int, vm_fraction: float = 0.1, namespaces: int = 10,
             domain: str = "bmc.example.com", new: bool = True) -> list[str]:
    """A fleet: vm_fraction of it KubeVirt VMs in New (default pool), the rest IPMI servers."""
    vms = int(machines * vm_fraction)
    rng = random.Random(42)
    statuses = ["Deployed", "Ready", "Deployed", "Allocated", "Broken", "New"]
    vm_ids = []
    for i in range(machines - vms):
        double.add_machine(power_type="ipmi", power_address=f"10.{i // 65536}.{i // 256 % 256}.{i % 256}",
                           power_pass=f"ipmi-S3CRET-{i}", status=rng.choice(statuses))
    for i in range(vms):
        vm_ids.append(double.add_vm(f"vm{i}", f"ns{i % namespaces}", domain,
                                    status="New" if new else "Ready"))
    return vm_ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--machines", type=int, default=100)
    parser.add_argument("--vm-fraction", type=float, default=0.1)
    parser.add_argument("--auto-advance", action="store_true")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    double = MaasDouble(auto_advance=args.auto_advance)
    populate(double, args.machines, args.vm_fraction)
    double.start(args.port)
    print(double.url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
