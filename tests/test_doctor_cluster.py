"""doctor's cluster checks on the real control plane tier, each failure made real.

The bundle is rendered and applied the README's way; one opted-in namespace (with the
KubeMacPool label) holds a VM with a MAC, whose Secret, VirtualMachineBMC and Ingress
Kyverno generates. Then, one at a time and put back afterwards: a policy deleted, the
background controller's ClusterRole removed, the KubeMacPool label taken off, a VM without a
MAC, a wrong seed. Other test modules share the control plane, so the checks about one
namespace look at this module's namespace only.
"""

from __future__ import annotations

import base64
import json
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))

from controlplane import KubectlError  # noqa: E402
from maas_double import MaasDouble  # noqa: E402

from maas_kubevirt import cli, doctor, kube, policies  # noqa: E402
from maas_kubevirt.values import load_values  # noqa: E402

DOMAIN = "bmc.doctor.example"
NAMESPACE = "doctor-vms"
SETTLE = 90
GLOBAL_ROWS = ("cluster.crds", "cluster.kyverno", "cluster.policies", "cluster.seed_secret")


class Site:
    def __init__(self, directory: Path, plane):
        self.plane = plane
        self.seed = secrets.token_hex(32)
        self.seed_file = directory / "seed"
        self.seed_file.write_text(self.seed + "\n")
        self.seed_file.chmod(0o600)
        self.values_file = directory / "values.yaml"
        self.values_file.write_text(yaml.safe_dump({
            "redfish": {"domain": DOMAIN}, "seed": {"file": str(self.seed_file)},
            "ingress": {"source_ranges": ["10.40.0.0/16"]},
        }))
        self.values = load_values(self.values_file)
        self.output = directory / "build"
        rendered = subprocess.run(
            [sys.executable, "-m", "maas_kubevirt", "--values", str(self.values_file), "render",
             "--output", str(self.output)], capture_output=True, text=True, timeout=120)
        assert rendered.returncode == 0, rendered.stderr
        self.install()

    def install(self) -> None:
        """kubectl apply -k, as README says; again until Kyverno admits the policies (the RBAC
        applied with them takes effect once the aggregation controller has merged it)."""
        deadline = time.monotonic() + SETTLE
        while True:
            try:
                self.plane.apply_bundle(self.output)
                break
            except KubectlError as failure:
                if "requires permissions" not in failure.stderr or time.monotonic() > deadline:
                    raise
                time.sleep(2)
        self.plane.kubectl("wait", "--for=condition=Ready", "clusterpolicy", "-l",
                           "app.kubernetes.io/part-of=maas-kubevirt", "--timeout=120s")

    def apply(self, obj: dict) -> None:
        self.plane.kubectl("apply", "-f", "-", input=json.dumps(obj))

    def checks(self, seed: str | None = None) -> dict[str, doctor.Check]:
        cluster = kube.Cluster(str(self.plane.kubeconfig))
        try:
            found = doctor.cluster_checks(self.values, cluster, self.seed if seed is None else seed,
                                          doctor._Fixes("maas-kubevirt", self.values), doctor.Reach())
        finally:
            cluster.close()
        return {c.name: c for c in found}

    def settle(self, condition, what: str) -> dict[str, doctor.Check]:
        """Poll the checks until condition(checks) holds (controllers act asynchronously)."""
        deadline = time.monotonic() + SETTLE
        while True:
            checks = self.checks()
            if condition(checks):
                return checks
            if time.monotonic() > deadline:
                shown = {n: (c.status, c.found) for n, c in checks.items() if c.status != "ok"}
                pytest.fail(f"{what}: not within {SETTLE} s; not ok: {shown}")
            time.sleep(1)


def vm(name: str, mac: str | None) -> dict:
    interface = {"name": "pxe", "bridge": {}, **({"macAddress": mac} if mac else {})}
    return {
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"runStrategy": "Halted", "template": {"spec": {
            "domain": {"devices": {"interfaces": [interface]}, "resources": {"requests": {"memory": "1Gi"}}},
            "networks": [{"name": "pxe", "multus": {"networkName": "pxe"}}],
        }}},
    }


def healthy(checks: dict[str, doctor.Check]) -> bool:
    """Everything ok that concerns the whole cluster or this module's namespace."""
    rows = [*GLOBAL_ROWS, f"cluster.vms/{NAMESPACE}"]
    rows += [name for name in checks if name.startswith("cluster.kyverno_rbac/")]
    return all(checks.get(name) and checks[name].status == "ok" for name in rows) and \
        NAMESPACE not in checks["cluster.kubemacpool"].subjects and \
        not any(s.startswith(f"{NAMESPACE}/") for s in checks["cluster.ingress_allowlist"].subjects)


@pytest.fixture(scope="module")
def site(control_plane, tmp_path_factory):
    site = Site(tmp_path_factory.mktemp("doctor-cluster"), control_plane)
    labels = {site.values["kubernetes"]["opt_in_label"]: site.values["kubernetes"]["opt_in_value"],
              policies.KUBEMACPOOL_LABEL: "allocate"}
    site.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": labels}})
    site.apply(vm("web1", "02:00:00:00:d0:01"))
    site.settle(healthy, "the bundle applied and web1's BMC objects generated")
    yield site
    control_plane.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


@pytest.fixture
def restored(site):
    """Put the bundle back after a test that broke it, and wait until doctor agrees."""
    yield site
    site.install()
    site.settle(healthy, "the site healthy again")


def test_a_healthy_site(site):
    checks = site.checks()
    assert checks["cluster.crds"].status == "ok"
    assert checks["cluster.kyverno"].status == "ok"       # no Deployments here: read from the CRD schema
    assert checks["cluster.seed_secret"].status == "ok"
    assert checks[f"cluster.vms/{NAMESPACE}"].status == "ok"
    assert "1 VM(s)" in checks[f"cluster.vms/{NAMESPACE}"].found
    roles = [o["metadata"]["name"] for o in policies.objects(policies.render_kubernetes(site.values, None))
             if o["kind"] == "ClusterRole"]
    assert {n for n in checks if n.startswith("cluster.kyverno_rbac/")} == {
        f"cluster.kyverno_rbac/{name.rsplit(':', 1)[-1]}" for name in roles}
    assert "cluster.kyverno_rbac/background-controller" in checks
    assert checks["ingress.allowlist"].status == "ok" and "allowlist-source-range" in checks["ingress.allowlist"].found


def test_the_exposure_readers_on_the_real_api_server(site):
    """An API group that is not served answers 404: the Gateway is None and every list empty. Once
    the Gateway API CRDs are installed on this tier, a Gateway no controller programs is read
    back and reported not Programmed."""
    cluster = kube.Cluster(str(site.plane.kubeconfig))
    try:
        if cluster.crd("securitypolicies.gateway.envoyproxy.io") is None:
            assert cluster.securitypolicies(NAMESPACE) == []
        if cluster.crd(doctor.gateway.GATEWAY_CRD) is None:
            assert cluster.gateway(NAMESPACE, "bmc") is None and cluster.httproutes(NAMESPACE) == []
            pytest.skip("the Gateway API CRDs are not installed on this control plane")
        site.apply({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
                    "metadata": {"name": "doctor-bmc", "namespace": NAMESPACE},
                    "spec": {"gatewayClassName": "doctor-no-controller", "listeners": [
                        {"name": "bmc", "protocol": "HTTPS", "port": 443, "hostname": f"*.{DOMAIN}",
                         "tls": {"certificateRefs": [{"name": "doctor-bmc-tls"}]}}]}})
        try:
            found = cluster.gateway(NAMESPACE, "doctor-bmc")
            assert found is not None and found["spec"]["listeners"][0]["hostname"] == f"*.{DOMAIN}"
            check = doctor.programmed_check(found, True, f"{NAMESPACE}/doctor-bmc", "", [NAMESPACE], DOMAIN)
            assert check.status == "fail" and "is not Programmed" in check.found
            assert cluster.httproutes(NAMESPACE) == []
        finally:
            site.plane.kubectl("delete", "gateway", "doctor-bmc", "-n", NAMESPACE, "--wait=true", check=False)
    finally:
        cluster.close()


def test_the_bmcs_closed_to_the_cluster(restored):
    """The NetworkPolicy generated for the namespace; no CNI on this tier; a catch-all reported."""
    checks = restored.settle(lambda c: NAMESPACE not in c["cluster.network_policies"].subjects,
                             "the NetworkPolicy generated")
    assert checks["cluster.cni"].status == "warn" and "heuristic" in checks["cluster.cni"].found
    # Other tests on this control plane may leave a catch-all behind in a namespace being deleted.
    assert not any(s.startswith(f"{NAMESPACE}/") for s in checks["cluster.catch_all"].subjects)
    restored.plane.kubectl("delete", "networkpolicy", "maas-kubevirt-bmc", "-n", NAMESPACE, "--wait=true")
    # Kyverno puts it back within seconds; doctor sees it either missing or back, never changed.
    check = restored.checks()["cluster.network_policies"]
    assert check.status == "ok" or (check.status == "fail" and NAMESPACE in check.subjects)
    restored.settle(lambda c: NAMESPACE not in c["cluster.network_policies"].subjects, "the NetworkPolicy restored")


def test_a_policy_deleted(restored):
    name = next(o["metadata"]["name"] for o in policies.objects(policies.render_kubernetes(restored.values, None))
                if o["kind"] == "ClusterPolicy" and "audit" in o["metadata"]["name"])
    restored.plane.kubectl("delete", "clusterpolicy", name, "--wait=true")
    check = restored.settle(lambda c: c["cluster.policies"].status == "fail", "the policy reported missing")["cluster.policies"]
    assert f"missing: {name}" in check.found
    assert "kubectl apply -k build/kubernetes" in check.fix


def test_the_cluster_role_removed(restored):
    name = "maas-kubevirt:kyverno:background-controller"
    restored.plane.kubectl("delete", "clusterrole", name, "--wait=true")
    row = "cluster.kyverno_rbac/background-controller"
    check = restored.settle(lambda c: c[row].status == "fail", "the ClusterRole reported missing")[row]
    assert f"ClusterRole {name} is missing" in check.found
    # The aggregation controller took the rules out of Kyverno's role too.
    role = restored.plane.get("clusterrole", "kyverno:background-controller")
    assert doctor.missing_rules(
        next(o for o in policies.objects(policies.render_kubernetes(restored.values, None))
             if o["kind"] == "ClusterRole" and o["metadata"]["name"] == name)["rules"],
        role.get("rules") or [])


def test_a_namespace_without_the_kubemacpool_label(restored):
    restored.plane.kubectl("label", "namespace", NAMESPACE, f"{policies.KUBEMACPOOL_LABEL}-")
    check = restored.checks()["cluster.kubemacpool"]
    assert check.status == "fail" and NAMESPACE in check.subjects
    assert f"`kubectl label namespace {NAMESPACE} {policies.KUBEMACPOOL_LABEL}=allocate`" in check.fix
    restored.plane.kubectl("label", "namespace", NAMESPACE, f"{policies.KUBEMACPOOL_LABEL}=allocate")


def test_a_vm_without_a_mac(restored):
    restored.apply(vm("nomac", None))
    try:
        check = restored.settle(lambda c: "nomac" in c[f"cluster.vms/{NAMESPACE}"].subjects,
                                "the VM without a MAC reported")[f"cluster.vms/{NAMESPACE}"]
        assert check.status == "fail" and "nomac: no MAC on interface pxe" in check.found
        assert check.subjects == ("nomac",)
    finally:
        restored.plane.kubectl("delete", "virtualmachine", "nomac", "-n", NAMESPACE, "--wait=true")


def test_a_wrong_seed(restored):
    ns, name = restored.values["kubernetes"]["system_namespace"], restored.values["kubernetes"]["seed_secret"]
    other = base64.b64encode(secrets.token_hex(32).encode()).decode()
    restored.plane.kubectl("patch", "secret", name, "-n", ns, "--type=merge", "-p", json.dumps({"data": {"seed": other}}))
    check = restored.checks()["cluster.seed_secret"]
    assert check.status == "fail" and "another seed" in check.found
    assert restored.seed not in json.dumps(check.as_dict())
    # kubectl apply would not put it back (stringData is unchanged since the last apply).
    right = base64.b64encode(restored.seed.encode()).decode()
    restored.plane.kubectl("patch", "secret", name, "-n", ns, "--type=merge", "-p", json.dumps({"data": {"seed": right}}))
    assert restored.checks()["cluster.seed_secret"].status == "ok"
    # And the other way round: the cluster's seed is right, the MAAS host's is not.
    assert restored.checks(seed="not-the-seed-" + "0" * 32)["cluster.seed_secret"].status == "fail"


def test_the_command_with_a_kubeconfig(site, tmp_path, capsys):
    """README: `maas-kubevirt --values site.yaml doctor --kubeconfig ~/.kube/config --json`."""
    with MaasDouble() as double:
        key = tmp_path / "api-key"
        key.write_text(double.api_key_text + "\n")
        key.chmod(0o600)
        values = yaml.safe_load(site.values_file.read_text())
        values["maas"] = {"url": double.url, "api_key_file": str(key), "timeout": 2}
        values_file = tmp_path / "values.yaml"
        values_file.write_text(yaml.safe_dump(values))
        code = cli.main(["--values", str(values_file), "doctor", "--kubeconfig", str(site.plane.kubeconfig), "--json"])
    out, err = capsys.readouterr()
    report = json.loads(out)
    rows = {c["check"]: c["status"] for c in report["checks"]}
    assert rows["cluster.seed_secret"] == rows["cluster.crds"] == rows[f"cluster.vms/{NAMESPACE}"] == "ok"
    assert "cluster" not in rows                      # not skipped
    assert rows["maas.script"] == "fail"              # the double has no script: exit 1
    assert code == 1
    assert site.seed not in out + err
