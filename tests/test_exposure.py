"""The exposure as a choice of renderer: an Ingress per VM, or an HTTPRoute and its allowlist object."""

from __future__ import annotations

import copy

import pytest
import yaml

from maas_kubevirt import cli, exposure, policies
from maas_kubevirt.values import load_values

DEFAULTS = load_values(None)
SEED = "ab" * 32


def site(allowlist: str = "traefik", section: str = "", **ingress) -> dict:
    values = copy.deepcopy(DEFAULTS)
    values["exposure"] = "gateway"
    values["gateway"].update(namespace="bmc-gateway", name="bmc", section_name=section, allowlist=allowlist)
    values["ingress"].update(ingress)
    return values


def bmc_policy(values: dict) -> dict:
    return yaml.safe_load(policies.render_kubernetes(values, None)["policy-vm-bmc.yaml"])


def rule(policy: dict, name: str) -> dict:
    [found] = [r for r in policy["spec"]["rules"] if r["name"] == name]
    return found


@pytest.mark.parametrize("allowlist, rules", [
    ("traefik", ["bmc-secret", "virtual-machine-bmc", "bmc-httproute"]),
    ("envoy-gateway", ["bmc-secret", "virtual-machine-bmc", "bmc-envoy-allowlist", "bmc-httproute"]),
    ("external", ["bmc-secret", "virtual-machine-bmc", "bmc-httproute"]),
])
def test_the_gateway_exposure_generates_a_route_and_its_allowlist_instead_of_the_ingress(allowlist, rules):
    policy = bmc_policy(site(allowlist))
    assert [r["name"] for r in policy["spec"]["rules"]] == rules
    generated = [(r["generate"]["apiVersion"], r["generate"]["kind"], r["generate"]["name"].split("}}")[-1])
                 for r in policy["spec"]["rules"][2:]]
    assert generated == exposure.route_objects(site(allowlist))
    for generating in policy["spec"]["rules"]:
        generate = generating["generate"]
        assert (generate["generateExisting"], generate["synchronize"], generate["orphanDownstreamOnPolicyDelete"]) \
            == (True, True, True)
        assert generating["match"] == rule(policy, "bmc-secret")["match"]  # the namespace opt-in
        assert generate["data"]["metadata"]["ownerReferences"][0]["kind"] == "VirtualMachine"  # cleanup with the VM


def test_the_httproute_names_the_host_the_gateway_and_the_vms_bmc_service():
    route = rule(bmc_policy(site(section="bmc-https")), "bmc-httproute")["generate"]
    assert route["name"] == "{{ request.object.metadata.name }}-bmc"
    spec = route["data"]["spec"]
    assert spec["hostnames"] == ["{{ request.object.metadata.name }}.{{ request.object.metadata.namespace }}"
                                 ".bmc.example.com"]
    assert spec["parentRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "Gateway",
                                   "namespace": "bmc-gateway", "name": "bmc", "sectionName": "bmc-https"}]
    [only] = spec["rules"]
    assert only["backendRefs"] == [{"group": "", "kind": "Service",
                                    "name": "{{ request.object.metadata.name }}-virtbmc", "port": 80}]
    # The BMC proxy's entry point holds the allowlist: no filter, so no Traefik CRD on the proxy.
    assert "filters" not in only
    assert "sectionName" not in rule(bmc_policy(site()), "bmc-httproute")["generate"]["data"]["spec"]["parentRefs"][0]


def test_the_envoy_gateway_allowlist_carries_exactly_the_source_ranges():
    ranges = ["192.0.2.0/24", "2001:db8::/32"]
    policy = bmc_policy(site("envoy-gateway", source_ranges=ranges))
    spec = policy["spec"]["rules"][2]["generate"]["data"]["spec"]
    assert spec["targetRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute",
                                   "name": "{{ request.object.metadata.name }}-bmc"}]
    assert spec["authorization"]["defaultAction"] == "Deny"
    assert [r["principal"]["clientCIDRs"] for r in spec["authorization"]["rules"]] == [ranges]


@pytest.mark.parametrize("values, granted", [
    (DEFAULTS, {("networking.k8s.io", "ingresses")}),
    (site("traefik"), {("gateway.networking.k8s.io", "httproutes")}),
    (site("envoy-gateway"), {("gateway.networking.k8s.io", "httproutes"), ("gateway.envoyproxy.io", "securitypolicies")}),
    (site("external"), {("gateway.networking.k8s.io", "httproutes")}),
])
def test_kyverno_may_generate_exactly_the_kinds_of_the_exposure(values, granted):
    roles = {doc["metadata"]["name"]: doc for doc in policies.parse(policies.render_kubernetes(values, None)["rbac.yaml"])}
    for role in ("maas-kubevirt:kyverno:background-controller", "maas-kubevirt:kyverno:admission-controller"):
        kinds = {(group, resource) for r in roles[role]["rules"] for group in r["apiGroups"] for resource in r["resources"]}
        route_kinds = {(g, r) for g, r in kinds if r in {"ingresses", "httproutes", "middlewares", "securitypolicies"}}
        assert route_kinds == granted, role


def test_switching_the_exposure_prints_a_sequence_that_keeps_every_bmc_reachable(tmp_path, capsys):
    values_file = tmp_path / "values.yaml"
    out = tmp_path / "out"
    assert cli.main(["render", "--output", str(out)]) == 0
    capsys.readouterr()
    values_file.write_text(yaml.safe_dump({"exposure": "gateway", "gateway": {"namespace": "bmc-gateway", "name": "bmc"}}))
    assert cli.main(["--values", str(values_file), "render", "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    steps = [line.strip() for line in printed.splitlines() if line.strip()[:2] in {f"{n}." for n in range(1, 7)}]
    assert [step[:2] for step in steps] == ["1.", "2.", "3.", "4.", "5.", "6."]
    assert "kubectl delete clusterpolicy maas-kubevirt-vm-bmc" in steps[1]
    assert steps[5].endswith("kubectl delete ingress --all-namespaces -l app.kubernetes.io/part-of=maas-kubevirt")
    assert "from ingress to gateway" in printed and "Delete, then apply" not in printed
    assert cli.main(["--values", str(values_file), "render", "--output", str(out)]) == 0
    assert "exposure changed" not in capsys.readouterr().out
    # Back to ingress, by the site's values: the defaults over a site's render are refused (test_render).
    values_file.write_text(yaml.safe_dump({"exposure": "ingress"}))
    assert cli.main(["--values", str(values_file), "render", "--output", str(out)]) == 0
    assert "kubectl delete httproute --all-namespaces" in capsys.readouterr().out


def test_the_allowlist_mechanism_is_named_for_every_exposure():
    said = {exposure.allowlist_mechanism(v) for v in (DEFAULTS, site("traefik"), site("envoy-gateway"), site("external"))}
    assert len(said) == 4 and all("10.0.0.0/8" in s for s in said)
    assert "external" in exposure.allowlist_mechanism(site("external"))
