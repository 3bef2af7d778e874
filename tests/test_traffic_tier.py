"""Real traffic through a real proxy, for both exposures (issue 30, item 6).

On the control plane (tests/controlplane.py), Traefik (tools/build-traefik, TRAEFIK) runs out of
cluster and serves what the bundle generates; a kubevirtBMC stand-in (tests/kubevirt_bmc.py, plain
HTTP on 10080, the credentials of each VM's `<vm>-bmc` Secret) runs on a test host in a network
namespace behind each VM's `<vm>-virtbmc` Service (tests/gateway_api.py). The client that matters
is MAAS's own Redfish driver (tools/maas-region/power.py, from the region tools/build-maas built),
which sends no SNI and verifies nothing. Site: redfish.domain bmc.traffic.example,
ingress.source_ranges [127.0.0.1/32]; the outside client connects from 127.0.0.2.

Each case runs once per exposure, in one session:

- `gateway`: Gateway bmc-gateway/bmc (GatewayClass traefik), an HTTPS listener per opted-in
  namespace with hostname *.<ns>.bmc.traffic.example and that namespace's certificate (openssl,
  here), routes admitted from opted-in namespaces only; gateway.allowlist traefik, so the policy
  generates per VM a Middleware <vm>-bmc-allowlist and an HTTPRoute <vm>-bmc naming it.
- `ingress`, with ingress.allowlist traefik: an IngressClass nginx whose controller is
  k8s.io/ingress-nginx (Traefik's NGINX provider serves it), ingress.tls_secret bmc-tls in each
  namespace, and the one Middleware of ingress-allowlist.yaml attached to the entry point with the
  flag `render` prints.

The policies are cluster-wide and shared with the other control-plane tiers: each exposure's
policies are installed afresh and deleted when it is done, its namespaces deleted, and the
teardown checks that Kyverno logged no error about the bundle or these namespaces meanwhile
(test_controlplane's health check reads the same logs, whichever runs first).
"""

from __future__ import annotations

import copy
import json
import re
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from conftest import require
from controlplane import ControlPlane, _kubeconfig, wait_for
from gateway_api import (BMC_PORT, HelloRelay, TestHost, Traefik, backend, bmc_backend, bmc_gateway, bmc_proxy_traefik,
                         certificate, der_of, fingerprint, gateway_class, https, ingress_class, run_power,
                         tenant_traefik, tls_secret)
from kubevirt_bmc import KubevirtBMC
from maas_kubevirt import identity
from maas_kubevirt.bmc_proxy import FILE as BMC_PROXY_FILE
from maas_kubevirt.bmc_proxy import NAME as BMC_PROXY

ROOT = Path(__file__).resolve().parent.parent
POWER = ROOT / "tools" / "maas-region" / "power.py"
PART_OF = "app.kubernetes.io/part-of=maas-kubevirt"
DOMAIN = "bmc.traffic.example"
SOURCE_RANGES = ["127.0.0.1/32"]
OUTSIDE = "127.0.0.2"
# The BMC proxy's namespace holds the Gateway too, as docs/how-to/gateway.md sets it up.
BMC_NAMESPACE = "maas-kubevirt-bmc"
GATEWAY_NAMESPACE, GATEWAY_NAME = BMC_NAMESPACE, "bmc"
INGRESS_CONTROLLER_NAMESPACE = BMC_NAMESPACE
BMC_CLASS = "maas-kubevirt-bmc"
INGRESS_CLASS = BMC_CLASS
# The tenants' own proxy serves these classes (tests/gateway_api.py, tenant_traefik).
TENANT_GATEWAY_CLASS, TENANT_INGRESS_CLASS = "traefik", "nginx"
CATCHER_PORT = BMC_PORT + 1
EXAMPLE_GATEWAY = ROOT / "examples" / "bmc-gateway.yaml"
INGRESS_TLS = "bmc-tls"
ISOLATION_POLICY = "maas-kubevirt-route-isolation"
VM, OTHER_VM = "web1", "db1"
EXPOSURES = ("gateway", "ingress")
SETTLE = 60


# --- the site, per exposure --------------------------------------------------------------------


def site_values(exposure: str, seed_file: Path) -> dict:
    values = yaml.safe_load((ROOT / "values.yaml").read_text())
    values["redfish"]["domain"] = DOMAIN
    values["seed"]["file"] = str(seed_file)
    values["ingress"]["source_ranges"] = list(SOURCE_RANGES)
    values["exposure"] = exposure
    values["ingress"]["controller_namespace"] = BMC_NAMESPACE
    values["gateway"]["traefik_crds"] = True            # the control plane serves Traefik's CRDs (the tenants' Traefik reads them)
    if exposure == "gateway":
        values["gateway"].update(namespace=GATEWAY_NAMESPACE, name=GATEWAY_NAME, section_name="", allowlist="traefik",
                                 class_name=BMC_CLASS)
    else:
        values["ingress"].update(class_name=INGRESS_CLASS, allowlist="traefik", tls_secret=INGRESS_TLS)
    return values


def render(values: dict, output: Path) -> str:
    """`maas-kubevirt --values FILE render --output DIR`, as README.md says; its stdout."""
    values_file = output.parent / f"{output.name}.values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    done = subprocess.run([sys.executable, "-m", "maas_kubevirt", "--values", str(values_file), "render",
                           "--output", str(output)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"render failed: {done.stderr}"
    return done.stdout


def kubeconfig_for(cp: ControlPlane, path: Path, token: str) -> Path:
    """A kubeconfig of the control plane for one ServiceAccount's token."""
    return _kubeconfig(path, cp.server, cp.ca, {"token": token})


def rendered_policies(output: Path) -> set[str]:
    names = set()
    for path in (output / "kubernetes").glob("*.yaml"):
        for document in yaml.safe_load_all(path.read_text()):
            if document and document.get("kind") == "ClusterPolicy":
                names.add(document["metadata"]["name"])
    return names


def apply(cp: ControlPlane, *objects: dict) -> None:
    cp.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(o) for o in objects))


def namespace(name: str, opted_in: bool, values: dict) -> dict:
    labels = {values["kubernetes"]["opt_in_label"]: values["kubernetes"]["opt_in_value"]} if opted_in else {}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def virtual_machine(name: str, ns: str) -> dict:
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": name, "namespace": ns},
            "spec": {"runStrategy": "Halted", "template": {"spec": {
                "domain": {"devices": {"interfaces": [{"name": "default", "masquerade": {},
                                                       "macAddress": "02:00:00:00:00:01"}]},
                           "resources": {"requests": {"memory": "1Gi"}}},
                "networks": [{"name": "default", "pod": {}}]}}}}


def exists(cp: ControlPlane, kind: str, name: str, ns: str) -> bool:
    result = cp.kubectl("get", kind, name, "-n", ns, "-o", "name", check=False)
    if result.returncode != 0:
        assert "NotFound" in result.stderr, result.stderr
        return False
    return True


def kyverno_tails(cp: ControlPlane) -> str:
    return "".join(f"\n--- {name} ---\n{cp.log_tail(name, 20)}"
                   for name in ("kyverno-background-controller", "kyverno-admission-controller"))


@dataclass
class Phase:
    """One exposure, installed and serving: what the cases need."""

    exposure: str
    cp: ControlPlane
    proxy: "Proxy"
    values: dict
    output: Path
    bmc_proxy: Traefik                      # bmc-proxy.yaml's Traefik for this exposure
    tenant: str                             # VM's namespace
    other: str                              # another opted-in namespace, with OTHER_VM
    certificates: dict = field(default_factory=dict)   # namespace -> DER served for *.<ns>.<domain>
    timings: dict = field(default_factory=dict)
    attacker_user: str = ""                 # kubectl --as: may do anything in the attacker's namespace

    @property
    def attacker(self) -> str:
        """A tenant that is not opted in, with the attacks of issue 41 item 7 (tenant_attacks)."""
        return f"{self.tenant}-b"

    def host(self, vm: str = VM, ns: str | None = None) -> str:
        return identity.redfish_host(vm, ns or self.tenant, DOMAIN)

    def credentials(self, vm: str = VM, ns: str | None = None) -> tuple[str, str]:
        serial = identity.format_serial(vm, ns or self.tenant)
        return identity.bmc_user(self.proxy.seed, serial), identity.bmc_password(self.proxy.seed, serial)

    @property
    def port(self) -> int:
        """Where MAAS connects: the BMC proxy's entry point (its Service's 443 in a cluster)."""
        return self.bmc_proxy.ports["bmc"]

    def route_kind(self) -> str:
        return "httproute" if self.exposure == "gateway" else "ingress"


@dataclass
class Proxy:
    """What both exposures share: the test host, the BMC stand-in and the tenant's catcher on it, the
    tenants' own Traefik, the seed."""

    cp: ControlPlane
    work: Path
    seed: str
    seed_file: Path
    host: TestHost
    bmc: KubevirtBMC
    catcher: KubevirtBMC                               # a tenant's backend: it records every request
    tenant_traefik: Traefik
    renders: dict                                      # exposure -> (values, output, stdout)
    timings: dict = field(default_factory=dict)

    def reached(self, host: str) -> int:
        """How many requests for ``host`` the BMC has seen."""
        return len(self.bmc.seen(host))


@pytest.fixture(scope="module")
def proxy(control_plane, tmp_path_factory):
    cp = control_plane
    require(cp.traefik is not None, f"traffic tier: {cp.traefik_missing}")
    require(shutil.which("ip") is not None, "traffic tier: iproute2's ip is not installed (it makes the test host)")
    started = time.monotonic()
    work = tmp_path_factory.mktemp("traffic")
    seed = secrets.token_hex(32)
    seed_file = work / "seed"
    seed_file.write_text(seed + "\n")
    seed_file.chmod(0o600)
    renders = {}
    for exposure in EXPOSURES:
        values = site_values(exposure, seed_file)
        output = work / f"build-{exposure}"
        renders[exposure] = (values, output, render(values, output))
    host = TestHost()
    try:
        host.start()
    except Exception as error:  # noqa: BLE001 (no network namespaces here: a missing prerequisite)
        require(False, f"traffic tier: cannot make the test host's network namespace: {error}")
    bmc = catcher = traefik = None
    try:
        bmc = KubevirtBMC(DOMAIN, None, seed=seed).start(host.listen(BMC_PORT))
        catcher = KubevirtBMC(DOMAIN, None, seed=secrets.token_hex(32)).start(host.listen(CATCHER_PORT))
        traefik = tenant_traefik(cp.traefik / "traefik", cp.kubeconfig, work).start()
        apply(cp, gateway_class(TENANT_GATEWAY_CLASS), ingress_class(TENANT_INGRESS_CLASS))
        state = Proxy(cp, work, seed, seed_file, host, bmc, catcher, traefik, renders)
        state.timings["proxy up"] = time.monotonic() - started
        yield state
    finally:
        for server in (traefik, catcher, bmc):
            if server is not None:
                server.stop()
        host.stop()
        cp.kubectl("delete", "gatewayclass", TENANT_GATEWAY_CLASS, "--ignore-not-found", check=False)
        cp.kubectl("delete", "ingressclass", TENANT_INGRESS_CLASS, "--ignore-not-found", check=False)


def kyverno_marks(cp: ControlPlane) -> dict[str, int]:
    marks = {}
    for name in ("kyverno-admission-controller", "kyverno-background-controller"):
        path = cp.logs / f"{name}.log"
        marks[name] = path.stat().st_size if path.exists() else 0
    return marks


def kyverno_errors_since(cp: ControlPlane, marks: dict[str, int], words: list[str]) -> list[str]:
    """Error-level lines of Kyverno's JSON logs written since ``marks`` that name one of ``words``,
    less what test_controlplane's health check also counts as noise."""
    from test_controlplane import expected_noise

    found = []
    for name, offset in marks.items():
        with open(cp.logs / f"{name}.log", "rb") as log:
            log.seek(offset)
            for line in log.read().decode(errors="replace").splitlines():
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if (isinstance(entry, dict) and entry.get("level") == "error"
                        and any(word in line for word in words) and not expected_noise(line)):
                    found.append(f"{name}: {line}")
    return found


def kyverno_warning_events(cp: ControlPlane) -> dict[str, str]:
    """Warning events from Kyverno that test_controlplane's health check would count: uid -> text."""
    from test_controlplane import expected_noise

    events = json.loads(cp.kubectl("get", "events", "-A", "--field-selector", "type=Warning", "-o", "json").stdout)
    return {e["metadata"]["uid"]: f"{e.get('reason')} {e['involvedObject'].get('kind')}/"
                                  f"{e['involvedObject'].get('name')}: {e.get('message')}"
            for e in events["items"]
            if e.get("reason") != "PolicyViolation" and not expected_noise(e.get("message", ""))
            and "kyverno" in (e.get("source", {}).get("component", "") + e.get("reportingComponent", "")).lower()}


def delete_policies(cp: ControlPlane) -> None:
    cp.kubectl("delete", "clusterpolicy", "-l", PART_OF, "--ignore-not-found", "--wait=true")


def terminating_namespaces(cp: ControlPlane) -> list[str]:
    return [n["metadata"]["name"] for n in cp.get("namespace")["items"] if n.get("status", {}).get("phase") == "Terminating"]


def updaterequests_drained(cp: ControlPlane) -> bool:
    return not cp.get("updaterequests.kyverno.io", None, "kyverno")["items"]


def wait_served(phase: Phase, vm: str, ns: str) -> float:
    """Until the proxy routes <vm>.<ns>.<domain> to the BMC: its Redfish service root answers through
    the proxy, with no SNI, from inside the source ranges. Not the namespace certificate: Traefik
    serves a certificate by SNI, and this request sends none (as MAAS's driver)."""
    host = identity.redfish_host(vm, ns, DOMAIN)

    def served() -> bool:
        answer = https(phase.port, host, "/redfish/v1")
        return answer.status == 200 and "RedfishVersion" in answer.body

    started = time.monotonic()
    try:
        wait_for(served, SETTLE, f"the proxy to serve {host}", interval=0.5)
    except TimeoutError as error:
        raise AssertionError(f"{error}\n--- BMC proxy ---\n{phase.bmc_proxy.log_tail(30)}{kyverno_tails(phase.cp)}") from None
    return time.monotonic() - started


@pytest.fixture(scope="module", params=EXPOSURES)
def phase(request, proxy):
    exposure = request.param
    cp = proxy.cp
    started = time.monotonic()
    values, output, _ = proxy.renders[exposure]
    tenant = {"gateway": "traffic-gw", "ingress": "traffic-ing"}[exposure]
    other = f"{tenant}-other"
    marks, events_before = kyverno_marks(cp), set(kyverno_warning_events(cp))
    made = [tenant, other]
    certificates = {}
    # A fresh install of this exposure's policies: whatever another tier left may not update in place.
    # Not while another tier's namespaces are still being deleted: generateExisting would act in them.
    delete_policies(cp)
    wait_for(lambda: not terminating_namespaces(cp), 120, "other tiers' namespaces to finish terminating",
             interval=1)
    for ns in (tenant, other):
        apply(cp, namespace(ns, True, values))
        cert, key = certificate(proxy.work, f"{exposure}-{ns}", f"*.{ns}.{DOMAIN}")
        if exposure == "gateway":
            certificates[ns] = (der_of(cert), tls_secret(f"{ns}-tls", GATEWAY_NAMESPACE, cert, key))
        else:
            certificates[ns] = (der_of(cert), tls_secret(INGRESS_TLS, ns, cert, key))
    made.append(BMC_NAMESPACE)
    apply(cp, namespace(BMC_NAMESPACE, False, values), *(secret for _, secret in certificates.values()))
    bmc_proxy = None
    state = Phase(exposure, cp, proxy, values, output, None, tenant, other,
                  {ns: der for ns, (der, _) in certificates.items()})
    made.append(state.attacker)
    try:
        # The tenant's attacks, made before the policies exist: what admission would now refuse, or
        # once missed, is there all the same, and must still catch nothing of MAAS's.
        state.attacker_user = tenant_namespace(cp, state.attacker, values)
        backend(cp, "catcher", state.attacker, proxy.host.address, CATCHER_PORT, {"app": "catcher"}, "catcher")
        cert, key = certificate(proxy.work, f"{state.attacker}-grab", f"grab.{state.attacker}.apps.example.org")
        apply(cp, tls_secret("grab-tls", state.attacker, cert, key))
        for kind, attack in tenant_attacks(state, state.attacker, "grab-tls").items():
            cp.kubectl("create", "--as", state.attacker_user, "-f", "-", input=json.dumps(attack))
        cp.apply_bundle(output)
        cp.kubectl("wait", "--for=condition=Ready", "clusterpolicy", "-l", PART_OF, "--timeout=120s")
        # The BMC proxy as bmc-proxy.yaml deploys it, with its own ServiceAccount's rights.
        token = cp.kubectl("create", "token", BMC_PROXY, "-n", BMC_NAMESPACE, "--duration", "2h").stdout.strip()
        kubeconfig = kubeconfig_for(cp, proxy.work / f"bmc-proxy-{exposure}.kubeconfig", token)
        bmc_proxy = bmc_proxy_traefik(cp.traefik / "traefik", kubeconfig, proxy.work,
                                      output / "kubernetes" / BMC_PROXY_FILE, f"bmc-proxy-{exposure}").start()
        state.bmc_proxy = bmc_proxy
        if exposure == "gateway":
            apply(cp, bmc_gateway(EXAMPLE_GATEWAY, GATEWAY_NAMESPACE, GATEWAY_NAME, BMC_CLASS, state.port,
                                  {ns: f"*.{ns}.{DOMAIN}" for ns in (tenant, other)}))
        for vm, ns in ((VM, tenant), (OTHER_VM, other)):
            cp.kubectl("create", "-f", "-", input=json.dumps(virtual_machine(vm, ns)))
            bmc_backend(cp, vm, ns, proxy.host.address)
        state.timings["installed"] = time.monotonic() - started
        for vm, ns in ((VM, tenant), (OTHER_VM, other)):
            wait_served(state, vm, ns)
        state.timings["served"] = time.monotonic() - started
        yield state
    finally:
        failures = teardown(state, made)
        if bmc_proxy is not None:
            bmc_proxy.stop()
        state.timings["whole phase"] = time.monotonic() - started
        proxy.timings[exposure] = state.timings
        report_timings(request, exposure, state.timings)
    words = [*rendered_policies(output), *made]
    errors = kyverno_errors_since(cp, marks, words)
    new_events = [text for uid, text in kyverno_warning_events(cp).items() if uid not in events_before]
    assert not (failures or errors or new_events), (
        f"the {exposure} phase left a mess behind: {failures}\nKyverno errors:\n" + "\n".join(errors)
        + "\nKyverno warning events:\n" + "\n".join(new_events))


def teardown(phase: Phase, made: list[str]) -> list[str]:
    """VMs first (their generated objects go with them), then Kyverno's queue drained, then the
    policies and namespaces: nothing left for Kyverno to act on, and fail on, later."""
    cp, failures = phase.cp, []
    for ns in (phase.tenant, phase.other):
        cp.kubectl("delete", "virtualmachine", "--all", "-n", ns, "--wait=true", check=False)
    try:
        wait_for(lambda: updaterequests_drained(cp), SETTLE, "Kyverno's update requests to drain", interval=1)
    except TimeoutError as error:
        failures.append(str(error))
    delete_policies(cp)
    # The bundle's cluster-scoped objects (the BMC proxy's class and role) go with it.
    cp.kubectl("delete", "-f", str(phase.output / "kubernetes" / BMC_PROXY_FILE), "--ignore-not-found", "--wait=false",
               check=False)
    for ns in made:
        cp.kubectl("delete", "namespace", ns, "--ignore-not-found", "--wait=false", check=False)
    try:
        wait_for(lambda: all(not exists(cp, "namespace", ns, "default") for ns in made), 120,
                 "the traffic tier's namespaces to be deleted", interval=1)
    except TimeoutError as error:
        failures.append(str(error))
    return failures


def report_timings(request, exposure: str, timings: dict) -> None:
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"\ntraffic tier, {exposure}: " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()))


# --- the cases ---------------------------------------------------------------------------------


def test_the_generated_route_and_allowlist_are_what_the_proxy_serves(phase):
    """The objects the policy generated are the ones being served (the route accepted by the BMC
    proxy, its references resolved, for the gateway), and the proxy's entry point holds exactly the
    source ranges, from the rendered ConfigMap."""
    cp = phase.cp
    if phase.exposure == "gateway":
        route = cp.get("httproute", f"{VM}-bmc", phase.tenant)
        assert route["spec"]["hostnames"] == [phase.host()]
        assert "filters" not in route["spec"]["rules"][0]

        def accepted() -> dict:
            parents = cp.get("httproute", f"{VM}-bmc", phase.tenant).get("status", {}).get("parents", [])
            conditions = {c["type"]: c["status"] for p in parents for c in p.get("conditions", [])}
            return conditions if conditions.get("Accepted") == "True" and conditions.get("ResolvedRefs") == "True" else {}

        wait_for(accepted, 30, "the BMC proxy to accept the HTTPRoute with its references resolved")
    else:
        ingress = cp.get("ingress", f"{VM}-bmc", phase.tenant)
        assert ingress["spec"]["ingressClassName"] == INGRESS_CLASS
        assert ingress["spec"]["tls"] == [{"hosts": [phase.host()], "secretName": INGRESS_TLS}]
    config = cp.get("configmap", BMC_PROXY, BMC_NAMESPACE)
    dynamic = yaml.safe_load(next(iter(config["data"].values())))
    assert dynamic == {"http": {"middlewares": {"bmc-allowlist": {"ipAllowList": {"sourceRange": SOURCE_RANGES}}}}}


def test_maas_driver_powers_the_vm_on_and_reads_its_state_through_the_proxy_without_sni(phase):
    from realmaas import cache_dir

    region_python = cache_dir() / "venv" / "bin" / "python"
    host, (user, password) = phase.host(), phase.credentials()
    relay = HelloRelay(phase.port)
    try:
        # The relay would see a server name if one were sent.
        assert https(relay.port, host, "/redfish/v1", sni=host).status == 200
        assert relay.hellos == [{"tls": True, "server_name": host}]
        relay.hellos.clear()
        before = phase.proxy.reached(host)
        started = time.monotonic()
        on = run_power(region_python, POWER, "on", host, user, password, DOMAIN, relay.port)
        assert on.returncode == 0, on.stderr
        assert json.loads(on.stdout) == {"state": "on"}
        query = run_power(region_python, POWER, "query", host, user, password, DOMAIN, relay.port)
        assert query.returncode == 0, query.stderr
        assert json.loads(query.stdout) == {"state": "on"}
        phase.timings["MAAS power on + query"] = time.monotonic() - started
    finally:
        relay.stop()
    assert password not in on.stdout + on.stderr + query.stdout + query.stderr
    # Every connection MAAS's driver made was TLS, and none named a server.
    assert relay.hellos and all(hello == {"tls": True, "server_name": None} for hello in relay.hellos), relay.hellos
    actions = [seen.action for seen in phase.proxy.bmc.seen(host)[before:]]
    assert "PATCH Boot Once Pxe" in actions and "Reset On" in actions, actions
    assert actions.index("PATCH Boot Once Pxe") < actions.index("Reset On") < len(actions) - 1, actions
    assert actions[-1] == "GET On", actions
    assert phase.proxy.bmc.vm(host).running


def test_a_client_outside_the_source_ranges_is_refused_at_the_proxy(phase):
    host, credentials = phase.host(), phase.credentials()
    before = phase.proxy.reached(host)
    outside = https(phase.port, host, auth=credentials, source=OUTSIDE)
    assert outside.status == 403, (outside.status, outside.body)
    assert phase.proxy.reached(host) == before, "a request from outside the source ranges reached the BMC"
    inside = https(phase.port, host, auth=credentials)
    assert inside.status == 200, (inside.status, inside.body)
    assert phase.proxy.reached(host) == before + 1


def test_a_client_sending_sni_gets_its_namespaces_certificate(phase):
    """Traefik picks a certificate by matching the SNI against its certificates' names; without
    SNI (MAAS's driver) it serves its default one, and still routes by the Host header."""
    served = {}
    for vm, ns in ((VM, phase.tenant), (OTHER_VM, phase.other)):
        host = phase.host(vm, ns)
        answer = https(phase.port, host, "/redfish/v1", sni=host)
        assert answer.status == 200, (answer.status, answer.body)
        served[ns] = answer.certificate
    assert {ns: fingerprint(der) for ns, der in served.items()} == {
        ns: fingerprint(der) for ns, der in phase.certificates.items()}
    no_sni = https(phase.port, phase.host(), "/redfish/v1")
    assert no_sni.status == 200
    assert no_sni.certificate not in phase.certificates.values()


def test_another_namespaces_route_claiming_the_host_is_refused_at_admission(phase):
    cp, host = phase.cp, phase.host()
    if phase.exposure == "gateway":
        assert ISOLATION_POLICY in rendered_policies(phase.output)
        squat = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
                 "metadata": {"name": "squat", "namespace": phase.other},
                 "spec": {"parentRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway",
                                          "namespace": GATEWAY_NAMESPACE, "name": GATEWAY_NAME}],
                          "hostnames": [host],
                          "rules": [{"backendRefs": [{"group": "", "kind": "Service",
                                                      "name": f"{OTHER_VM}-virtbmc", "port": 80}]}]}}
    else:
        squat = {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
                 "metadata": {"name": "squat", "namespace": phase.other},
                 "spec": {"ingressClassName": INGRESS_CLASS,
                          "rules": [{"host": host, "http": {"paths": [{
                              "path": "/", "pathType": "Prefix",
                              "backend": {"service": {"name": f"{OTHER_VM}-virtbmc", "port": {"number": 80}}}}]}}]}}
    refused = cp.kubectl("create", "-f", "-", input=json.dumps(squat), check=False)
    assert refused.returncode != 0 and "denied" in refused.stderr, (refused.returncode, refused.stderr)
    assert not exists(cp, phase.route_kind(), "squat", phase.other)


def test_the_detours_around_the_route_are_refused_and_reach_no_bmc(phase):
    """Issue 30 item 3, with traffic: a tenant outside the opt-in aims an ExternalName Service, or a
    selectorless Service's EndpointSlice or Endpoints, at the VM's BMC and publishes it under a host
    outside the BMC domain (its own Ingress, which the isolation rules leave alone). The detour
    objects are refused, so that host reaches no BMC."""
    cp, bmc_host = phase.cp, phase.host()
    attacker, public = f"{phase.tenant}-attacker", f"detour.{phase.tenant}.apps.example.org"
    apply(cp, namespace(attacker, False, phase.values))
    try:
        for detour, rule in (
                ({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "detour-name", "namespace": attacker},
                  "spec": {"type": "ExternalName",
                           "externalName": f"{VM}-virtbmc.{phase.tenant}.svc.cluster.local"}},
                 "service-externalname-not-to-a-bmc"),
                ({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
                  "metadata": {"name": "detour-1", "namespace": attacker,
                               "labels": {"kubernetes.io/service-name": "detour"}},
                  "endpoints": [{"addresses": [phase.proxy.host.address]}],
                  "ports": [{"name": "redfish", "port": BMC_PORT, "protocol": "TCP"}]},
                 "endpoints-not-to-a-bmc-pod"),
                ({"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "detour", "namespace": attacker},
                  "subsets": [{"addresses": [{"ip": phase.proxy.host.address}],
                               "ports": [{"name": "redfish", "port": BMC_PORT}]}]},
                 "endpoints-not-to-a-bmc-pod")):
            refused = cp.kubectl("create", "-f", "-", input=json.dumps(detour), check=False)
            assert refused.returncode != 0 and rule in refused.stderr, (detour["kind"], refused.stderr)
        # What is admitted: the selectorless Service itself and a route to it under the tenant's own host.
        apply(cp, {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "detour", "namespace": attacker},
                   "spec": {"ports": [{"name": "redfish", "port": 80, "targetPort": BMC_PORT}]}})
        # On the tenants' own proxy: the BMC proxy serves no tenant object at all.
        route = {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
                 "metadata": {"name": "detour", "namespace": attacker},
                 "spec": {"ingressClassName": TENANT_INGRESS_CLASS, "rules": [{"host": public, "http": {"paths": [{
                     "path": "/", "pathType": "Prefix",
                     "backend": {"service": {"name": "detour", "port": {"number": 80}}}}]}}]}}
        apply(cp, route)
        before = phase.proxy.reached(bmc_host)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:   # long enough for Traefik to have loaded the route
            answer = https(phase.proxy.tenant_traefik.ports["web"], public, auth=phase.credentials())
            assert answer.status != 200, (answer.status, answer.body)
            time.sleep(0.5)
        assert phase.proxy.reached(bmc_host) == before
        assert not phase.proxy.bmc.seen(public), "a request for the detour's host reached the BMC"
    finally:
        cp.kubectl("delete", "namespace", attacker, "--wait=true", "--timeout=120s", check=False)


def tenant_namespace(cp: ControlPlane, name: str, values: dict) -> str:
    """A namespace that is not opted in, whose user may do anything in it (and nothing elsewhere): the
    tenant of the security model. Returns the user's name for kubectl --as."""
    user = f"{name}-admin"
    apply(cp, namespace(name, False, values),
          {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
           "metadata": {"name": "everything", "namespace": name},
           "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]},
          {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
           "metadata": {"name": "everything", "namespace": name},
           "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "everything"},
           "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})
    return user


def tenant_attacks(phase: Phase, ns: str, tls: str) -> dict[str, dict]:
    """The issue's attacks, each sending what it catches to the tenant's catcher: its own Gateway of
    Traefik's class with a hostless HTTPS listener and a hostless PathPrefix /redfish HTTPRoute; an
    IngressRoute matching PathPrefix(`/redfish`) at priority 100000; an Ingress for a wildcard above
    the BMC domain."""
    port = phase.proxy.tenant_traefik.ports["web"]
    to_catcher = [{"group": "", "kind": "Service", "name": "catcher", "port": 80}]
    return {
        "gateway": {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
                    "metadata": {"name": "grab", "namespace": ns},
                    "spec": {"gatewayClassName": TENANT_GATEWAY_CLASS, "listeners": [{
                        "name": "https", "protocol": "HTTPS", "port": port,
                        "tls": {"mode": "Terminate", "certificateRefs": [{"group": "", "kind": "Secret", "name": tls}]},
                        "allowedRoutes": {"namespaces": {"from": "Same"}}}]}},
        "httproute": {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
                      "metadata": {"name": "grab", "namespace": ns},
                      "spec": {"parentRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "grab"}],
                               "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/redfish"}}],
                                          "backendRefs": to_catcher}]}},
        "ingressroute": {"apiVersion": "traefik.io/v1alpha1", "kind": "IngressRoute",
                         "metadata": {"name": "grab", "namespace": ns},
                         # No entryPoints: every default entry point, whatever proxy reads it.
                         "spec": {"tls": {},
                                  "routes": [{"kind": "Rule", "match": "PathPrefix(`/redfish`)", "priority": 100000,
                                              "services": [{"name": "catcher", "port": 80}]}]}},
        "ingress": {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
                    "metadata": {"name": "grab", "namespace": ns},
                    "spec": {"ingressClassName": TENANT_INGRESS_CLASS, "rules": [{
                        "host": "*." + DOMAIN.split(".", 1)[1], "http": {"paths": [{
                            "path": "/", "pathType": "Prefix",
                            "backend": {"service": {"name": "catcher", "port": {"number": 80}}}}]}}]}},
    }


def test_a_tenants_own_gateway_ingressroute_and_wildcard_ingress_catch_nothing_of_maas(phase):
    """Issue 41 item 7. A tenant (not opted in; anything in its own namespace) has published, on the
    tenants' own proxy, everything that once outranked the BMC routes (made before the policies, so
    as if admission had missed them). They serve there: the tenant's catcher answers a BMC host's
    Redfish path through that proxy. Yet MAAS's requests, with no SNI and Basic credentials, for a
    live VM and for one with no route (deleted, or never made), go to the BMC proxy, which serves no
    tenant object: the catcher receives none of them, and the live VM's BMC receives its own."""
    from realmaas import cache_dir

    cp, tenant_port = phase.cp, phase.proxy.tenant_traefik.ports["web"]
    for attack in tenant_attacks(phase, phase.attacker, "grab-tls").values():
        kind = f"{attack['kind'].lower()}.{attack['apiVersion'].split('/')[0]}" if "." in attack["apiVersion"] \
            else attack["kind"].lower()
        assert exists(cp, kind, "grab", phase.attacker), kind
    probe = phase.host(OTHER_VM, phase.other)

    def caught() -> bool:
        https(tenant_port, probe, "/redfish/v1/Systems/1", auth=phase.credentials(OTHER_VM, phase.other))
        return bool(phase.proxy.catcher.seen(probe))

    wait_for(caught, SETTLE, "the tenants' proxy to serve the attacks", interval=0.5)
    live, gone = phase.host(), phase.host("gone")
    caught_before = sum(len(phase.proxy.catcher.seen(host)) for host in (live, gone))
    bmc_before = phase.proxy.reached(live)
    user, password = phase.credentials()
    query = run_power(cache_dir() / "venv" / "bin" / "python", POWER, "query", live, user, password, DOMAIN, phase.port)
    assert query.returncode == 0, query.stderr
    assert json.loads(query.stdout)["state"] in ("on", "off")
    assert phase.proxy.reached(live) > bmc_before, "MAAS's query for the live VM did not reach its BMC"
    ghost = https(phase.port, gone, "/redfish/v1/Systems/1", auth=phase.credentials("gone"))
    assert ghost.status == 404, (ghost.status, ghost.body)
    assert phase.proxy.reached(gone) == 0
    assert sum(len(phase.proxy.catcher.seen(host)) for host in (live, gone)) == caught_before, \
        "a request MAAS sent to the BMC proxy reached the tenant's catcher"


def test_admission_refuses_each_attack_aimed_at_the_bmc_hosts(phase):
    """The second line: made now, by the same tenant user, each attack is refused where it aims at
    the BMC hosts (the BMC class, a host-less IngressRoute, a wildcard above the domain); its own
    Gateway of its own class, with a host-less route, is admitted: it lands on the tenants' proxy,
    which MAAS never reaches (the case above)."""
    cp = phase.cp
    attacks = tenant_attacks(phase, phase.attacker, "grab-tls")

    def create(obj: dict, name: str) -> subprocess.CompletedProcess:
        obj = {**obj, "metadata": {**obj["metadata"], "name": name}}
        return cp.kubectl("create", "--as", phase.attacker_user, "-f", "-", input=json.dumps(obj), check=False)

    refused = {"ingressroute": (attacks["ingressroute"], "traefik-routes-name-hosts-outside-the-bmc-domain"),
               "wildcard ingress": (attacks["ingress"], "ingress-host-")}
    bmc_class = copy.deepcopy(attacks["gateway" if phase.exposure == "gateway" else "ingress"])
    if phase.exposure == "gateway":
        bmc_class["spec"]["gatewayClassName"] = BMC_CLASS
        refused["gateway of the BMC class"] = (bmc_class, "gateway-class-only-for-the-bmc-gateway")
    else:
        bmc_class["spec"]["ingressClassName"] = BMC_CLASS
        bmc_class["spec"]["rules"][0]["host"] = f"grab.{phase.attacker}.apps.example.org"
        refused["ingress of the BMC class"] = (bmc_class, "ingress-class-only-for-the-bmc-ingresses")
    for what, (attack, rule) in refused.items():
        result = create(attack, "again")
        assert result.returncode != 0 and rule in result.stderr, (what, result.returncode, result.stderr)
    for kind in ("gateway", "httproute"):
        result = create(attacks[kind], "again")
        assert result.returncode == 0, (kind, result.stderr)


def test_doctor_reads_the_live_exposure(phase):
    """doctor's exposure and proxy rows (docs/reference/doctor.md) against the Gateway, routes, and
    the BMC proxy's Deployment and ConfigMap: every one ok. Other tiers share the cluster, so doctor sees this phase's
    namespaces only."""
    from maas_kubevirt import doctor, kube
    from maas_kubevirt.values import load_values

    values_file = phase.output.parent / f"{phase.output.name}.values.yaml"
    values = load_values(values_file)
    ours, label = {phase.tenant, phase.other}, values["kubernetes"]["opt_in_label"]

    class ThisPhase(kube.Cluster):
        def namespaces(self, label_selector=None):
            return [ns for ns in super().namespaces(label_selector)
                    if ns["metadata"]["name"] in ours or label not in (ns["metadata"].get("labels") or {})]

    cluster = ThisPhase(str(phase.cp.kubeconfig))

    names = [*doctor.gateway.check_names(values), *doctor.bmc_proxy.check_names(values)]

    def rows() -> dict:
        found = doctor.cluster_checks(values, cluster, phase.proxy.seed, doctor._Fixes("maas-kubevirt", values),
                                      doctor.Reach())
        return {check.name: check for check in found if check.name in names}

    expected = dict.fromkeys(names, doctor.OK)

    def settled() -> dict:
        found = rows()
        return found if {name: check.status for name, check in found.items()} == expected else {}

    try:
        # The first case of a fresh phase when run alone: the proxy writes the Gateway's and the
        # routes' statuses some time after it serves them.
        found = wait_for(settled, SETTLE, "doctor's exposure and proxy rows to settle", interval=1)
    except TimeoutError:
        raise AssertionError({name: (c.status, c.found) for name, c in rows().items()}) from None
    assert ", ".join(SOURCE_RANGES) in found["proxy.allowlist"].found, found["proxy.allowlist"].found
    assert "serves only it" in found["proxy.isolation"].found, found["proxy.isolation"].found
    # The proxy's Deployment given Traefik's CRD provider (as a Helm chart's defaults would): doctor fails.
    patch = ["-n", BMC_NAMESPACE, "deployment", BMC_PROXY, "--type=json", "-p"]
    phase.cp.kubectl("patch", *patch, json.dumps([{"op": "add", "path": "/spec/template/spec/containers/0/args/-",
                                                   "value": "--providers.kubernetesCRD=true"}]))
    try:
        shared = rows()["proxy.isolation"]
        assert shared.status == doctor.FAIL and "provider kubernetescrd is on" in shared.found, shared
    finally:
        args = phase.cp.get("deployment", BMC_PROXY, BMC_NAMESPACE)["spec"]["template"]["spec"]["containers"][0]["args"]
        phase.cp.kubectl("patch", *patch, json.dumps([{"op": "remove",
                                                       "path": f"/spec/template/spec/containers/0/args/{len(args) - 1}"}]))
    assert rows()["proxy.isolation"].status == doctor.OK
    if phase.exposure == "gateway":
        # Both VMs' routes were read from their status, not "no VM yet".
        assert found["gateway.routes"].found.startswith("2 HTTPRoute(s)"), found["gateway.routes"].found


def test_a_host_with_no_route_reaches_no_bmc(phase):
    """ghost.<ns>.<domain> has no VM, so no route; the BMC stand-in would accept its derived
    credentials if the request reached it."""
    host = phase.host("ghost")
    answer = https(phase.port, host, auth=phase.credentials("ghost"))
    assert answer.status == 404, (answer.status, answer.body)
    assert phase.proxy.reached(host) == 0


def test_check_route_reports_each_hop_of_the_real_proxy(phase, tmp_path):
    """check-route (issue 43 item 1), sent as MAAS's driver sends, against this exposure's BMC proxy:
    a working route, a wrong DNS answer, the allowlist refusing, and a host with no route."""
    from maas_kubevirt import route

    host = phase.host()
    before = phase.proxy.reached(host)
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(phase.values))
    done = subprocess.run([sys.executable, "-m", "maas_kubevirt", "--values", str(values), "check-route",
                           f"{VM}.{phase.tenant}", "--address", f"127.0.0.1:{phase.port}", "-o", "json"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (done.stdout, done.stderr)
    working = json.loads(done.stdout)
    assert working["ok"] and [hop["name"] for hop in working["hops"]][-1] == "redfish", working
    assert phase.proxy.reached(host) == before + 1, "the service root did not come from the VM's BMC"
    wrong = route.check(host, expected="127.0.0.1", port=phase.port, resolve=lambda name: ["127.0.0.3"])
    assert [(hop.name, hop.status) for hop in wrong.hops][-1] == ("address", "fail")
    refused = route.check(host, connect="127.0.0.1", port=phase.port, source=OUTSIDE)
    assert (refused.hops[-1].name, refused.hops[-1].status) == ("http", "fail"), refused.hops
    assert "403" in refused.hops[-1].found and OUTSIDE in refused.hops[-1].found
    ghost = route.check(phase.host("ghost"), connect="127.0.0.1", port=phase.port)
    assert "no route" in ghost.hops[-1].found, ghost.hops
    assert phase.proxy.reached(host) == before + 1 and phase.proxy.reached(phase.host("ghost")) == 0


def test_doctors_redfish_probe_speaks_as_maas_through_the_real_proxy(phase):
    """doctor's network.redfish probe, with MAAS's credentials and TLS as MAAS's driver speaks it
    (no SNI), reaches the VM's BMC through this exposure's proxy: 200; a wrong password is 401."""
    from maas_kubevirt import doctor

    host, (user, password) = phase.host(), phase.credentials()
    before = phase.proxy.reached(host)
    found = doctor.redfish_probe(doctor.Credentials("abc123", host, user, password), lambda name: ["127.0.0.1"],
                                 30.0, phase.port)
    assert found[0] == 200 and found[2] == "", found
    refused = doctor.redfish_probe(doctor.Credentials("abc123", host, user, password + "x"),
                                   lambda name: ["127.0.0.1"], 30.0, phase.port)
    assert refused[0] == 401, refused
    assert phase.proxy.reached(host) == before + 2, "the probe did not reach the VM's BMC"


def test_after_the_vm_is_deleted_its_route_is_gone_and_its_password_reaches_nothing(phase):
    """Runs last for each exposure: it deletes the VM. Its route carries
    ownerReferences to the VM, so the garbage collector removes them (Kyverno's synchronize would
    too); the Service and the BMC on the test host stay, so only the route stands between."""
    cp, host, credentials = phase.cp, phase.host(), phase.credentials()
    assert https(phase.port, host, auth=credentials).status == 200
    started = time.monotonic()
    cp.kubectl("delete", "virtualmachine", VM, "-n", phase.tenant, "--wait=true")
    generated = [(phase.route_kind(), f"{VM}-bmc")]
    wait_for(lambda: not any(exists(cp, kind, name, phase.tenant) for kind, name in generated), SETTLE,
             f"the VM's {generated} to be deleted", interval=0.5)
    assert exists(cp, "service", f"{VM}-virtbmc", phase.tenant)
    wait_for(lambda: https(phase.port, host, auth=credentials).status == 404, 30,
             "the proxy to stop serving the deleted VM's host", interval=0.5)
    phase.timings["route gone after VM delete"] = time.monotonic() - started
    before = phase.proxy.reached(host)
    answer = https(phase.port, host, auth=credentials)
    assert answer.status == 404, (answer.status, answer.body)
    assert phase.proxy.reached(host) == before
