"""The MAAS API calls the reconciler, doctor and upload-script make, on top of MAASClient.call."""

from __future__ import annotations

import re
from typing import Any, Callable, Iterable, Mapping, TypeVar
from urllib.parse import quote

from maas_kubevirt.maas.errors import MAASAuthError, MAASError, _one_line

T = TypeVar("T")

# Power parameters are fetched for at most this many system ids per request, which keeps
# the request line well below the 8 KiB most proxies accept.
POWER_PARAMETERS_CHUNK = 200
# A query string longer than this is split over several requests (proxies accept 8 KiB lines).
MAX_QUERY = 6000

# MAAS makes a system_id of lower-case letters and digits, at most 41 characters
# (src/maasserver/models/node.py: generate_node_system_id, from znums; Node.system_id
# max_length=41). Anything else in a machine record is not MAAS's: it never goes into a URL.
_SYSTEM_ID = re.compile(r"[a-z0-9]{1,41}")


def valid_system_id(value: object) -> bool:
    """True when value is a system_id as MAAS makes them (1-41 lower-case letters and digits)."""
    return isinstance(value, str) and _SYSTEM_ID.fullmatch(value) is not None


def segment(text: str) -> str:
    """One URL path segment with every reserved character quoted, so it stays one segment.

    "." and ".." are quoted too: HTTP clients resolve them as dot segments (urllib3's
    parse_url does), which would move the request to another resource.
    """
    quoted = quote(text, safe="")
    return quoted.replace(".", "%2E") if quoted in (".", "..") else quoted



class Endpoints:
    """One method per MAAS API call; MAASClient (client.py) adds ``call``, which sends it."""

    call: Callable[..., Any]  # MAASClient.call
    commission_timeout: float

    def _machine(self, method: str, system_id: str, op: str = "") -> str:
        """The path ``machines/{id}/``; a system_id MAAS would not make is refused, nothing sent."""
        if not valid_system_id(system_id):
            raise MAASError(method, "machines/" + (f"?op={op}" if op else ""), None,
                            f"refused system_id {_one_line(repr(system_id), 80)}: MAAS makes them of "
                            "lower-case letters and digits (at most 41); no request sent", "malformed")
        return f"machines/{segment(system_id)}/"

    def version(self) -> str:
        data = self.call("GET", "version/")
        if not isinstance(data, dict) or "version" not in data:
            raise MAASError("GET", "version/", 200, "no version in the response", "malformed")
        return str(data["version"])

    def machines(self) -> list[Any]:
        """Every machine, as MAAS sent it: a list is checked, each record is the caller's to check
        (one malformed record must not hide the others)."""
        data = self.call("GET", "machines/")
        if not isinstance(data, list):
            raise MAASError("GET", "machines/", 200, "expected a list of machines", "malformed")
        return data

    def taken_hostnames(self, hostnames: Iterable[str]) -> dict[str, str]:
        """hostname -> system_id of the node holding it, for those of ``hostnames`` held.

        Hostnames are unique over every node, machines, devices and controllers alike
        (src/maasserver/models/node.py: Node.hostname is unique), but machines/ lists machines
        only; nodes/ lists them all and filters by exact hostname
        (src/maasserver/api/nodes.py: filtered_nodes_list_from_request, hostname__in).
        One request, split only when the query would pass MAX_QUERY characters.
        """
        wanted = sorted(set(hostnames))
        taken: dict[str, str] = {}
        for chunk in _chunks(wanted, lambda name: len(name) + len("&hostname=")):
            data = self.call("GET", "nodes/", [("hostname", name) for name in chunk])
            if not isinstance(data, list):
                raise MAASError("GET", "nodes/", 200, "expected a list of nodes", "malformed")
            for node in data:
                if isinstance(node, dict) and isinstance(node.get("hostname"), str) \
                        and node["hostname"] in chunk:
                    taken[node["hostname"]] = str(node.get("system_id"))
        return taken

    def power_parameters(self, system_ids: Iterable[str], reduce: Callable[..., T],
                         hints: Mapping[str, Any] | None = None) -> dict[str, T]:
        """reduce(parameters) per system_id, fetched in bulk (``GET machines/?op=power_parameters&id=...``);
        with hints, reduce(parameters, hints.get(system_id)).

        Each machine's parameters (power_pass among them) go to reduce as soon as they are
        parsed and are dropped after: only what reduce returns is kept.
        """
        ids = list(system_ids)
        found: dict[str, T] = {}
        for start in range(0, len(ids), POWER_PARAMETERS_CHUNK):
            chunk = ids[start : start + POWER_PARAMETERS_CHUNK]
            params = [("op", "power_parameters")] + [("id", sid) for sid in chunk]
            data = self.call("GET", "machines/", params, withhold_body=True)
            if not isinstance(data, dict):
                raise MAASError("GET", "machines/?op=power_parameters", 200,
                                "expected a mapping of system_id to parameters", "malformed")
            for sid, parameters in data.items():
                parameters = parameters if isinstance(parameters, dict) else {}
                found[str(sid)] = (reduce(parameters) if hints is None
                                   else reduce(parameters, hints.get(str(sid))))
            del data
        return found

    def power_addresses(self, system_ids: Iterable[str]) -> dict[str, str | None]:
        """power_address per system_id, fetched in bulk; every other parameter is dropped at once."""
        return self.power_parameters(system_ids, power_address_of)

    def _machines_where(self, name: str, values: Iterable[str]) -> list[Any]:
        """``GET machines/?<name>=...`` for every value, split only when the query would pass
        MAX_QUERY characters. Records as machines()."""
        found: list[Any] = []
        for chunk in _chunks(sorted(set(values)), lambda value: len(value) + len(name) + 2):
            data = self.call("GET", "machines/", [(name, value) for value in chunk])
            if not isinstance(data, list):
                raise MAASError("GET", f"machines/?{name}=...", 200, "expected a list of machines", "malformed")
            found.extend(data)
        return found

    def machines_by_id(self, system_ids: Iterable[str]) -> list[Any]:
        """The machines with these system ids (``GET machines/?id=...``); an id with no machine is absent."""
        return self._machines_where("id", system_ids)

    def machines_by_mac(self, macs: Iterable[str]) -> list[Any]:
        """The machines with an interface of one of these MACs (``GET machines/?mac_address=...``,
        filtered_nodes_list_from_request in src/maasserver/api/nodes.py)."""
        return self._machines_where("mac_address", macs)

    def delete_machine(self, system_id: str) -> None:
        """``DELETE machines/{id}/``; a machine already gone (404) is no error."""
        self.call("DELETE", self._machine("DELETE", system_id), json_reply=False, ok_statuses=(200, 204, 404))

    def tag_names(self) -> set[str]:
        data = self.call("GET", "tags/")
        if not isinstance(data, list):
            raise MAASError("GET", "tags/", 200, "expected a list of tags", "malformed")
        return {tag["name"] for tag in data if isinstance(tag, dict) and isinstance(tag.get("name"), str)}

    def create_tag(self, name: str, comment: str) -> None:
        """A manual tag (no definition: MAAS evaluates none, src/maasserver/models/tag.py)."""
        self.call("POST", "tags/", fields={"name": name, "comment": comment})

    def tag_machine(self, name: str, system_id: str, add: bool = True) -> None:
        """Tag (or untag) one machine: ``POST tags/{name}/?op=update_nodes`` (src/maasserver/api/tags.py)."""
        if not valid_system_id(system_id):
            raise MAASError("POST", f"tags/{name}/?op=update_nodes", None, "refused a system_id MAAS would not make; "
                            "no request sent", "malformed")
        self.call("POST", f"tags/{segment(name)}/", [("op", "update_nodes")],
                  fields={"add" if add else "remove": system_id})

    def events(self, level: str, after: int | None = None, limit: int = 1000) -> Any:
        """One page of the event log (``GET events/?op=query``, src/maasserver/api/events.py);
        after None: the newest events. The event list, for ``maas_kubevirt.events`` to check."""
        params = [("op", "query"), ("level", level), ("limit", str(limit))]
        if after is not None:
            params.append(("after", str(after)))
        data = self.call("GET", "events/", params)
        if not isinstance(data, dict) or not isinstance(data.get("events"), list):
            raise MAASError("GET", "events/?op=query", 200, "expected an object with a list of events",
                            "malformed")
        return data["events"]

    def power_address(self, system_id: str) -> str | None:
        """One machine's power_address (GET machines/{id}/?op=power_parameters)."""
        data = self.call("GET", self._machine("GET", system_id, "power_parameters"), [("op", "power_parameters")],
                         withhold_body=True)
        address = data.get("power_address") if isinstance(data, dict) else None
        return address if isinstance(address, str) else None

    def pools(self) -> list[dict]:
        data = self.call("GET", "resourcepools/")
        if not isinstance(data, list):
            raise MAASError("GET", "resourcepools/", 200, "expected a list of resource pools", "malformed")
        return data

    def create_pool(self, name: str, description: str = "") -> dict:
        return self.call("POST", "resourcepools/", fields={"name": name, "description": description})

    def update_machine(self, system_id: str, *, hide: tuple[str, ...] = (), **fields: str) -> dict:
        """One ``PUT machines/{id}/`` with every field given; no value in ``hide`` (nor any
        ``*power_pass`` or ``*power_user`` field: the derived user names the VM's BMC row, so it
        is kept as close as the password) reaches a message.

        MAAS merges the machine's current power parameters into the form for every key the
        request leaves out (src/maasserver/forms/__init__.py, WithPowerTypeMixin
        ._get_power_parameters; a field left unset takes its initial value in
        src/maasserver/config_forms.py, DictCharField.clean_sub_fields), and the form is all
        or nothing: one refused field (a taken hostname) changes none.
        """
        passwords = tuple(value for key, value in fields.items() if key.endswith(("power_pass", "power_user")))
        return self.call("PUT", self._machine("PUT", system_id), fields=fields, hide=(*hide, *passwords))

    def commission(self, system_id: str, skip_bmc_config: bool = True) -> dict:
        """Commission; skip_bmc_config=1 keeps scripts tagged bmc-config (ours among them) from
        writing the power parameters again (src/maasserver/forms/ephemeral.py, CommissionForm).

        MAAS answers only once the rack has powered the machine on: get_response runs the view
        inside ``post_commit_hooks`` (src/maasserver/utils/views.py), whose exit waits for each
        hook, the power action among them (DeferredHooks.fire, src/maasserver/utils/
        asynchronous.py). So each attempt waits ``commission_timeout``, not ``timeout``.
        """
        fields = {"skip_bmc_config": "1"} if skip_bmc_config else {}
        return self.call("POST", self._machine("POST", system_id, "commission"), [("op", "commission")],
                         fields=fields, timeout=self.commission_timeout)

    def script(self, name: str) -> dict | None:
        """The script's metadata (tags, timeout, history ...), or None when MAAS has none by that name."""
        try:
            data = self.call("GET", f"scripts/{segment(name)}")
        except MAASError as error:
            if error.status == 404:
                return None
            raise
        if not isinstance(data, dict):
            raise MAASError("GET", f"scripts/{name}", 200, "expected a script object", "malformed")
        return data

    def script_exists(self, name: str) -> bool:
        return self.script(name) is not None

    def whoami(self) -> dict:
        """The key's user: username, email, is_local, is_superuser.

        MAAS: src/maasserver/api/users.py, ``UsersHandler.whoami`` returns ``request.user``,
        emitted with ``UserHandler.fields``.
        """
        data = self.call("GET", "users/", [("op", "whoami")])
        if not isinstance(data, dict) or not isinstance(data.get("is_superuser"), bool):
            raise MAASError("GET", "users/?op=whoami", 200, "expected a user with is_superuser", "malformed")
        return data

    def require_administrator(self) -> dict:
        """whoami, or MAASAuthError when the key's user is not a MAAS administrator: the power
        parameters and every change the reconciler makes are for administrators only."""
        user = self.whoami()
        if user["is_superuser"] is not True:
            name = _one_line(repr(user.get("username")), 80)
            raise MAASAuthError("GET", "users/?op=whoami", None, f"the API key's user {name} is not a MAAS "
                                "administrator: use an administrator's key (`maas apikey --username ADMIN`)",
                                "not-admin")
        return user

    def _controllers(self, path: str, kind: str) -> list[Any]:
        data = self.call("GET", path)
        if not isinstance(data, list):
            raise MAASError("GET", path, 200, f"expected a list of {kind} controllers", "malformed")
        return data

    def region_controllers(self) -> list[Any]:
        """Every region controller MAAS knows (src/maasserver/api/regioncontrollers.py,
        RegionControllersHandler: the nodes of type region, or region and rack)."""
        return self._controllers("regioncontrollers/", "region")

    def rack_controllers(self) -> list[Any]:
        """Every rack controller MAAS knows (src/maasserver/api/rackcontrollers.py,
        RackControllersHandler: the nodes of type rack, or region and rack)."""
        return self._controllers("rackcontrollers/", "rack")

    def config(self, name: str) -> Any:
        """One MAAS configuration value (src/maasserver/api/maas.py, ``get_config``: the value as JSON)."""
        return self.call("GET", "maas/", [("op", "get_config"), ("name", name)])

    def script_text(self, name: str) -> bytes:
        """The stored text of the script's current revision (GET scripts/{name}?op=download)."""
        return self.call("GET", f"scripts/{segment(name)}", [("op", "download")], json_reply=False)

    def create_script(self, name: str, content: bytes, comment: str = "",
                      **fields: str) -> dict:
        return self.call("POST", "scripts/", fields={"name": name, "comment": comment, **fields},
                         files={"script": (name, content)})

    def update_script(self, name: str, content: bytes, comment: str = "", **fields: str) -> dict:
        """PUT scripts/{name}. MAAS applies the tags and timeout embedded in a script only when it
        creates it (src/maasserver/forms/script.py, ScriptForm._clean_script): pass them here."""
        return self.call("PUT", f"scripts/{segment(name)}", fields={"comment": comment, **fields},
                         files={"script": (name, content)})


def power_address_of(parameters: Mapping[str, Any]) -> str | None:
    address = parameters.get("power_address")
    return address if isinstance(address, str) else None


def _chunks(items: list[str], cost: Callable[[str], int], budget: int = MAX_QUERY) -> list[list[str]]:
    """items split so that each chunk's total cost stays within budget (at least one item each)."""
    chunks: list[list[str]] = []
    current: list[str] = []
    spent = 0
    for item in items:
        if current and spent + cost(item) > budget:
            chunks.append(current)
            current, spent = [], 0
        current.append(item)
        spent += cost(item)
    if current:
        chunks.append(current)
    return chunks
