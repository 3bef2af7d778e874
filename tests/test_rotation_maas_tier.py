"""A leaked password rotated end to end (issue 25 items 2 and 4): the control-plane tier (Kyverno's
own controllers, the bundle) beside MAAS's own region, on each release of the matrix.

A VM enlists with the script's output and gets its derived password; a PXE host that knows its MAC
re-points it (MAC enlistment, no password). One cycle of the reconciler, on the cluster access of
the rendered reconciler ServiceAccount, takes the password back and bumps the VM's generation;
Kyverno re-derives that VM's Secret alone; once the VM enlists again, MAAS holds exactly the user
and password the Secret now holds, and nothing holds the old password. All read from MAAS's API and
the API server, never from the reconciler's own account of it.
"""

from __future__ import annotations

import base64
import json

import pytest

from controlplane import _kubeconfig
from realmaas import real_maas  # noqa: F401  (fixture)
from test_controlplane import (  # noqa: F401  (fixtures: bundle, site, make_namespace)
    bundle, create, eventually, get, make_namespace, site, vm,
)
from test_real_maas import SWITCHES, RecordingAudit, derived_holders, every_holder, new_mac, run_script, switch_power_type

from maas_kubevirt import identity, policies, rotate
from maas_kubevirt.maas import client_from_values
from maas_kubevirt.paths import SCRIPT_NAME
from maas_kubevirt.reconcile import ROTATION_SETTLE, Passwords, Reconciler, Settings

pytestmark = pytest.mark.usefixtures("bundle")


class Wall:
    def __init__(self) -> None:
        self.now = 2_000_000_000.0

    def __call__(self) -> float:
        return self.now


def secret_credentials(cp, name: str, namespace: str) -> tuple[str, str, str] | None:
    found = get(cp, "secret", f"{name}-bmc", namespace)
    if not found:
        return None
    data = found["data"]
    generation = (found["metadata"].get("annotations") or {}).get(policies.GENERATION_ANNOTATION, "")
    return (base64.b64decode(data["username"]).decode(), base64.b64decode(data["password"]).decode(), generation)


def rotating_reconciler(cp, bundle, real_maas, tmp_path) -> Reconciler:
    """The reconciler on the MAAS host: the bundle's values, MAAS's region, the ServiceAccount's token."""
    system_namespace = bundle.values["kubernetes"]["system_namespace"]
    token = cp.kubectl("create", "token", policies.RECONCILER_ACCOUNT, "-n", system_namespace,
                       "--duration", "1h").stdout.strip()
    kubeconfig = _kubeconfig(tmp_path / "kubeconfig", cp.server, cp.ca, {"token": token})
    key = tmp_path / "api-key"
    key.write_text(real_maas.api_key + "\n")
    values = json.loads(json.dumps(bundle.values))
    values["maas"].update(url=real_maas.url, api_key_file=str(key), timeout=60, commission="never")
    wall = Wall()
    reconciler = Reconciler(client_from_values(values, lambda message: None), Settings.from_values(values),
                            RecordingAudit(), passwords=Passwords(bundle.seed), wall=wall)
    reconciler.rotator = rotate.Rotator(rotate.core_api(str(kubeconfig)), system_namespace)
    return reconciler


def two_vms(cp, make_namespace) -> tuple[str, tuple[str, str, str], str]:
    """A namespace with web1 and web2 and their Secrets: (namespace, web1's credentials, web2's resourceVersion)."""
    namespace = make_namespace()
    for name in ("web1", "web2"):
        create(cp, vm(name, namespace)).check_returncode()
    eventually(cp, lambda: secret_credentials(cp, "web1", namespace) is not None
               and secret_credentials(cp, "web2", namespace) is not None, "both VMs' Secrets")
    return (namespace, secret_credentials(cp, "web1", namespace),
            get(cp, "secret", "web2-bmc", namespace)["metadata"]["resourceVersion"])


def enlist_with_password(bundle, real_maas, reconciler, serial: str, tmp_path) -> tuple[str, str]:
    """web1 enlists with the script's output and one cycle gives it its derived credentials: (mac, system_id)."""
    written = run_script(bundle.output / "commissioning" / SCRIPT_NAME, serial, tmp_path / "vm")
    power_type = written.pop("power_type")
    mac = new_mac()
    enlisted = real_maas.enlist(written, mac, power_type=power_type)
    assert enlisted.status == 200, enlisted.body
    reconciler.cycle()
    return mac, enlisted.system_id


def assert_rotated_once(cp, bundle, reconciler, namespace: str, untouched: str) -> tuple[str, str, str]:
    """web1 went from generation 0 to 1, in the ConfigMap and its re-derived Secret; web2 was not touched."""
    serial = identity.format_serial("web1", namespace)
    rotations = [r for r in reconciler.audit.records if r["action"] == "rotate"]
    assert [(r["outcome"], r["before"], r["after"], r["identity"]) for r in rotations] == [("ok", "0", "1", serial)]
    # The session's cluster is shared: other tests' VMs may have generations there too.
    system_namespace = bundle.values["kubernetes"]["system_namespace"]
    generations = get(cp, "configmap", identity.ROTATIONS_CONFIGMAP, system_namespace)["data"]
    assert generations[serial] == "1" and f"web2.{namespace}" not in generations
    rotated = (identity.bmc_user(bundle.seed, serial, 1), identity.bmc_password(bundle.seed, serial, 1), "1")
    eventually(cp, lambda: secret_credentials(cp, "web1", namespace) == rotated, "web1-bmc at generation 1")
    assert get(cp, "secret", "web2-bmc", namespace)["metadata"]["resourceVersion"] == untouched
    return rotated


def test_a_mac_re_pointed_vm_is_rotated_and_maas_follows_its_new_secret(
        control_plane, bundle, make_namespace, real_maas, tmp_path):
    cp = control_plane
    real_maas.set_stub(True)
    namespace, first, untouched = two_vms(cp, make_namespace)
    serial = identity.format_serial("web1", namespace)
    reconciler = rotating_reconciler(cp, bundle, real_maas, tmp_path)
    wall = reconciler.wall
    mac, sid = enlist_with_password(bundle, real_maas, reconciler, serial, tmp_path)
    stored = real_maas.power_parameters(sid)
    assert (stored["power_user"], stored["power_pass"], "0") == first   # MAAS and the Secret agree

    answer = real_maas.api("POST", "machines/", {
        "architecture": "amd64/generic", "mac_addresses": mac, "power_type": "redfish",
        "power_parameters": json.dumps({"power_address": f"{namespace}.harvest.attacker.example",
                                        "power_user": "maas", "node_id": "1"})}, anonymous=True)
    assert answer.status_code == 200 and answer.json()["system_id"] == sid, answer.text
    reconciler.cycle()
    assert every_holder(real_maas, first[1]) == set()
    rotated = assert_rotated_once(cp, bundle, reconciler, namespace, untouched)

    # The VM enlists again with the script's output: after the settle, MAAS gets generation 1.
    rewritten = run_script(bundle.output / "commissioning" / SCRIPT_NAME, serial, tmp_path / "vm2")
    again = real_maas.api("POST", "machines/", {
        "architecture": "amd64/generic", "mac_addresses": mac, "power_type": rewritten.pop("power_type"),
        "power_parameters": json.dumps(rewritten)}, anonymous=True)
    assert again.status_code == 200, again.text
    wall.now += ROTATION_SETTLE
    for _ in range(3):
        reconciler.cycle()
    stored = real_maas.power_parameters(sid)
    assert (stored["power_address"], stored["power_user"], stored["power_pass"]) == (
        identity.redfish_host("web1", namespace, bundle.values["redfish"]["domain"]), rotated[0], rotated[1])
    assert secret_credentials(cp, "web1", namespace) == rotated
    assert every_holder(real_maas, first[1]) == set()


@pytest.mark.parametrize("how", SWITCHES)
def test_a_power_type_switch_is_taken_back_and_rotated_in_one_cycle(
        control_plane, bundle, make_namespace, real_maas, tmp_path, how):
    """Issue 29: an anonymous switch to ipmi or webhook keeps the derived user and password in MAAS;
    one cycle takes both back and bumps the VM's generation, and Kyverno re-derives its Secret."""
    cp = control_plane
    real_maas.set_stub(True)
    namespace, first, untouched = two_vms(cp, make_namespace)
    serial = identity.format_serial("web1", namespace)
    reconciler = rotating_reconciler(cp, bundle, real_maas, tmp_path)
    mac, sid = enlist_with_password(bundle, real_maas, reconciler, serial, tmp_path)
    assert derived_holders(real_maas, serial, bundle.seed) == {sid: {"power_user", "power_pass"}}
    switch_power_type(real_maas, how, namespace, mac, bundle.values["redfish"]["domain"])
    assert real_maas.machine(sid)["power_type"] != "redfish"
    assert derived_holders(real_maas, serial, bundle.seed) == {sid: {"power_user", "power_pass"}}   # MAAS kept them
    reconciler.cycle()
    assert derived_holders(real_maas, serial, bundle.seed) == {}
    rotated = assert_rotated_once(cp, bundle, reconciler, namespace, untouched)
    # Nothing in MAAS holds the new generation either: it goes only to the VM's canonical redfish row.
    assert derived_holders(real_maas, serial, bundle.seed, 1) == {}
    assert rotated != first
