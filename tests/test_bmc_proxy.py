"""The BMC proxy render writes (bmc-proxy.yaml) and what doctor reads of a live one."""

from __future__ import annotations

import copy

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from maas_kubevirt import bmc_proxy, cli, doctor, policies
from maas_kubevirt.doctor import bmc_proxy as checks
from maas_kubevirt.values import load_values

DEFAULTS = load_values(None)
RANGES = ["192.0.2.10/32", "2001:db8::10/128"]


def site(exposure: str) -> dict:
    values = copy.deepcopy(DEFAULTS)
    values["exposure"] = exposure
    values["ingress"].update(controller_namespace="maas-kubevirt-bmc", source_ranges=list(RANGES))
    if exposure == "gateway":
        values["gateway"].update(namespace="maas-kubevirt-bmc", name="bmc", allowlist="traefik")
    else:
        values["ingress"].update(allowlist="traefik", class_name="maas-kubevirt-bmc")
    return values


def proxy_objects(values: dict) -> dict[str, dict]:
    return {doc["kind"]: doc for doc in policies.parse(policies.render_kubernetes(values, None)[bmc_proxy.FILE])}


def args_of(deployment: dict) -> list[str]:
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return container["args"]


@pytest.mark.parametrize("exposure", ["gateway", "ingress"])
def test_the_proxy_serves_one_class_through_one_provider_with_the_allowlist_on_its_entry_point(exposure):
    values = site(exposure)
    objects = proxy_objects(values)
    args = args_of(objects["Deployment"])
    assert bmc_proxy.enabled_providers([a.lower() for a in args]) == {
        "file", "kubernetesgateway" if exposure == "gateway" else "kubernetesingressnginx"}
    assert "--entryPoints.bmc.http.middlewares=bmc-allowlist@file" in args
    assert bmc_proxy.provider_problems(args, values) == []
    dynamic = yaml.safe_load(objects["ConfigMap"]["data"][bmc_proxy.DYNAMIC_FILE])
    assert dynamic == {"http": {"middlewares": {"bmc-allowlist": {"ipAllowList": {"sourceRange": RANGES}}}}}
    assert objects["Service"]["spec"]["externalTrafficPolicy"] == "Local"   # the allowlist reads the client's address
    assert objects["Service"]["spec"]["ports"] == [{"name": "https", "port": 443, "targetPort": "bmc", "protocol": "TCP"}]
    if exposure == "gateway":
        assert objects["GatewayClass"]["metadata"]["name"] == values["gateway"]["class_name"]
        assert objects["GatewayClass"]["metadata"]["labels"][bmc_proxy.LABEL] == bmc_proxy.LABEL_VALUE
        assert len(objects["GatewayClass"]["spec"]["description"].encode()) <= 64   # Gateway API's CRD limit
        assert f"--providers.kubernetesGateway.labelSelector={bmc_proxy.LABEL}={bmc_proxy.LABEL_VALUE}" in args
    else:
        assert objects["IngressClass"]["spec"]["controller"] == bmc_proxy.INGRESS_CONTROLLER
        assert f"--providers.kubernetesIngressNGINX.controllerClass={bmc_proxy.INGRESS_CONTROLLER}" in args
    security = objects["Deployment"]["spec"]["template"]["spec"]["containers"][0]["securityContext"]
    assert security == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}


def test_the_proxy_is_rendered_only_where_traefik_enforces_the_allowlist():
    assert bmc_proxy.FILE not in policies.render_kubernetes(DEFAULTS, None)
    envoy = site("gateway")
    envoy["gateway"]["allowlist"] = "envoy-gateway"
    assert bmc_proxy.FILE not in policies.render_kubernetes(envoy, None)
    assert bmc_proxy.FILE in policies.render_kubernetes(site("gateway"), None)


def test_render_says_where_the_dns_records_point(tmp_path, capsys):
    (tmp_path / "values.yaml").write_text(yaml.safe_dump(site("gateway")))
    assert cli.main(["--values", str(tmp_path / "values.yaml"), "render", "--output", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "point the DNS records *.<ns>.bmc.example.com at the address of Service maas-kubevirt-bmc/maas-kubevirt-bmc-proxy" in printed
    assert "kubectl -n maas-kubevirt-bmc get service maas-kubevirt-bmc-proxy" in printed


@pytest.mark.parametrize("extra, problem", [
    (["--providers.kubernetesCRD=true"], "provider kubernetescrd is on"),
    (["--providers.kubernetesCRD.namespaces=tenant-b"], "provider kubernetescrd is on"),
    (["--providers.kubernetesingress"], "provider kubernetesingress is on"),
    (["--providers.knative=true"], "provider knative is on"),
    (["--providers.kubernetesGateway.experimentalChannel=true"], "experimental channel"),
])
def test_a_provider_that_reaches_tenant_objects_is_a_problem(extra, problem):
    values = site("gateway")
    args = args_of(proxy_objects(values)["Deployment"]) + extra
    assert any(problem in found for found in bmc_proxy.provider_problems(args, values))


def test_a_gateway_provider_without_the_label_selector_or_an_nginx_provider_for_another_controller():
    gateway = site("gateway")
    args = [a for a in args_of(proxy_objects(gateway)["Deployment"]) if "labelSelector" not in a]
    assert any("no labelSelector" in p for p in bmc_proxy.provider_problems(args, gateway))
    ingress = site("ingress")
    args = [a.replace(bmc_proxy.INGRESS_CONTROLLER, "k8s.io/ingress-nginx") for a in args_of(proxy_objects(ingress)["Deployment"])]
    assert any("controllerClass" in p for p in bmc_proxy.provider_problems(args, ingress))


# A provider's options, each spelt as Traefik's CLI takes it (any case, with or without a value).
PROVIDER = st.sampled_from(["kubernetesCRD", "kubernetesingress", "KNATIVE", "file", "kubernetesGateway", "docker"])
OPTION = st.sampled_from(["", ".namespaces=a,b", ".labelselector=x=y", "=true", "=false", ".endpoint=https://x"])


@given(st.lists(st.tuples(PROVIDER, OPTION), max_size=6))
def test_a_provider_is_on_when_any_option_of_it_is_given_and_it_is_not_turned_off(options):
    args = [f"--providers.{provider}{option}" for provider, option in options]
    lowered = [a.lower() for a in args]
    expected = {p.lower() for p, _ in options} - {p.lower() for p, o in options if o == "=false"}
    assert bmc_proxy.enabled_providers(lowered) == expected


# --- doctor ----------------------------------------------------------------------------------------


def gateway_object(name: str, namespace: str, class_name: str, hostnames=("*.vms.bmc.example.com",)) -> dict:
    return {"metadata": {"name": name, "namespace": namespace},
            "spec": {"gatewayClassName": class_name,
                     "listeners": [{"name": f"l{i}", "hostname": h} for i, h in enumerate(hostnames)]}}


def ingress_object(name: str, namespace: str, class_name: str | None, legacy: str | None = None) -> dict:
    metadata = {"name": name, "namespace": namespace}
    if legacy:
        metadata["annotations"] = {"kubernetes.io/ingress.class": legacy}
    return {"metadata": metadata, "spec": {"ingressClassName": class_name} if class_name else {}}


def test_doctor_passes_a_proxy_of_its_own():
    values = site("gateway")
    objects = proxy_objects(values)
    bmc = gateway_object("bmc", "maas-kubevirt-bmc", "maas-kubevirt-bmc")
    check = checks.isolation_check(values, [bmc, gateway_object("web", "shop", "traefik")], None, [],
                                   [objects["Deployment"]])
    assert check.status == doctor.OK, check.found
    allow = checks.allowlist_check(values, objects["ConfigMap"], [objects["Deployment"]], "APPLY")
    assert allow.status == doctor.OK and ", ".join(RANGES) in allow.found


def test_doctor_fails_a_shared_gateway_class():
    values = site("gateway")
    deployment = proxy_objects(values)["Deployment"]
    bmc = gateway_object("bmc", "maas-kubevirt-bmc", "maas-kubevirt-bmc")
    tenant = gateway_object("grab", "tenant-b", "maas-kubevirt-bmc", hostnames=(None,))
    check = checks.isolation_check(values, [bmc, tenant], None, [], [deployment])
    assert check.status == doctor.FAIL and check.subjects == ("Gateway tenant-b/grab uses class maas-kubevirt-bmc",)
    hostless = gateway_object("bmc", "maas-kubevirt-bmc", "maas-kubevirt-bmc", hostnames=("*.vms.bmc.example.com", ""))
    check = checks.isolation_check(values, [hostless], None, [], [deployment])
    assert check.subjects == ("listener l1 of Gateway maas-kubevirt-bmc/bmc has no hostname",)


def test_doctor_fails_a_shared_ingress_class_but_not_the_generated_ingresses():
    values = site("ingress")
    deployment = proxy_objects(values)["Deployment"]
    ours = ingress_object("web1-bmc", "vms", "maas-kubevirt-bmc")
    squat = ingress_object("web1-bmc", "tenant-b", "maas-kubevirt-bmc")
    legacy = ingress_object("grab", "tenant-b", None, legacy="maas-kubevirt-bmc")
    theirs = ingress_object("shop", "tenant-b", "nginx")
    check = checks.isolation_check(values, None, [ours, squat, legacy, theirs], [("vms", "web1")], [deployment])
    assert check.status == doctor.FAIL
    assert check.subjects == ("Ingress tenant-b/web1-bmc uses class maas-kubevirt-bmc",
                              "Ingress tenant-b/grab uses class maas-kubevirt-bmc")


def test_doctor_fails_a_proxy_that_reaches_tenant_objects_or_is_missing():
    values = site("gateway")
    deployment = copy.deepcopy(proxy_objects(values)["Deployment"])
    deployment["spec"]["template"]["spec"]["containers"][0]["args"].append("--providers.kubernetesCRD=true")
    check = checks.isolation_check(values, [], None, [], [deployment])
    assert check.status == doctor.FAIL and "provider kubernetescrd is on" in check.found
    missing = checks.isolation_check(values, [], None, [], [])
    assert missing.status == doctor.FAIL and "no Deployment maas-kubevirt-bmc-proxy" in missing.found
    unknown = checks.isolation_check(values, None, None, [], [])
    assert unknown.status == doctor.WARN


@pytest.mark.parametrize("change, problem", [
    (lambda objects: objects.pop("ConfigMap"), "no ConfigMap"),
    (lambda objects: objects["ConfigMap"]["data"].update({bmc_proxy.DYNAMIC_FILE: "http: {}"}), "no ipAllowList"),
    (lambda objects: objects["ConfigMap"]["data"].update({bmc_proxy.DYNAMIC_FILE: yaml.safe_dump(
        {"http": {"middlewares": {"bmc-allowlist": {"ipAllowList": {"sourceRange": ["0.0.0.0/0"]}}}}})}), "admits 0.0.0.0/0"),
    (lambda objects: objects["ConfigMap"]["data"].update({bmc_proxy.DYNAMIC_FILE: yaml.safe_dump(
        {"http": {"middlewares": {"bmc-allowlist": {"ipAllowList": {"sourceRange": RANGES, "ipStrategy": {"depth": 1}}}}}})}),
     "X-Forwarded-For"),
    (lambda objects: objects["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"].remove(
        "--entryPoints.bmc.http.middlewares=bmc-allowlist@file"), "does not attach it"),
])
def test_doctor_fails_an_allowlist_that_is_missing_changed_or_unattached(change, problem):
    values = site("ingress")
    objects = copy.deepcopy(proxy_objects(values))
    change(objects)
    check = checks.allowlist_check(values, objects.get("ConfigMap"), [objects["Deployment"]], "APPLY")
    assert check.status == doctor.FAIL and problem in check.found and check.fix == "APPLY"


def test_the_example_gateway_listens_where_the_proxy_does_and_the_pages_agree():
    """Issue 43 item 3: a Gateway listener is on the proxy's entry point port (Traefik attaches a
    listener to the entry point of its port), while MAAS connects to the Service's 443. Every page
    that gives a listener's port gives that one."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    gateway = yaml.safe_load((root / "examples" / "bmc-gateway.yaml").read_text())
    assert {listener["port"] for listener in gateway["spec"]["listeners"]} == {bmc_proxy.PORT}
    for page in [root / "README.md", *sorted((root / "docs").rglob("*.md"))]:
        for said in re.findall(r"listeners?[^.\n]{0,80}?\bport (\d+)", page.read_text()):
            assert int(said) == bmc_proxy.PORT, f"{page.name} gives a listener port {said}, not {bmc_proxy.PORT}"
