"""The Kubernetes render: templates -> Kyverno policies, RBAC, seed Secret, example namespace.

The Kyverno engine itself runs in test_policies_kyverno.py; here: structure, schemas, values.
"""

from __future__ import annotations

import copy
import itertools
import string
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

import policies_fixtures as fx
from conftest import require
from kyverno_conditions import conditions_hold, load_context, substitute
from maas_kubevirt import identity, policies
from maas_kubevirt.values import ValuesError, load_values, validate
from policies_fixtures import (
    expected_ingress,
    expected_network_policy,
    expected_secret,
    expected_vmbmc,
    vm_uid,
)
from policies_schemas import (
    SchemaProblem,
    generate_patterns,
    kyverno_module_dir,
    resolve,
    validate_object,
)

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "kyverno"
SEED = "0f3c-test-seed-7a9e-not-used-anywhere"
VARIABLES = {"request.object.metadata.name": "web1", "request.object.metadata.namespace": "tenant-a",
             "request.object.metadata.uid": vm_uid("web1", "tenant-a")}


@pytest.fixture(scope="module")
def defaults() -> dict:
    return load_values(None)


@pytest.fixture(scope="module")
def module_dir():
    directory = kyverno_module_dir()
    require(directory is not None, "Go is not installed or the Kyverno module cannot be downloaded: "
            "no ClusterPolicy CRD schema to validate against")
    return directory


def values_with(defaults: dict, **sections) -> dict:
    values = copy.deepcopy(defaults)
    for dotted, value in sections.items():
        section, key = dotted.split("__")
        values[section][key] = value
    return validate(values)


def by_kind(manifests: dict[str, str]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for obj in policies.objects(manifests):
        out.setdefault(obj["kind"], []).append(obj)
    return out


def policy(manifests: dict[str, str], name: str) -> dict:
    return next(o for o in by_kind(manifests)["ClusterPolicy"] if o["metadata"]["name"] == name)


def rules(pol: dict) -> dict[str, dict]:
    return {rule["name"]: rule for rule in pol["spec"]["rules"]}


# --- the committed reference render ------------------------------------------------------------

def test_kyverno_directory_is_a_fresh_render_of_the_defaults(defaults):
    fresh = policies.render_kubernetes(defaults, None)
    committed = {p.name: p.read_text(encoding="utf-8") for p in REFERENCE.iterdir() if p.is_file()}
    assert sorted(committed) == sorted(fresh), "regenerate: .venv/bin/python -m maas_kubevirt.policies kyverno"
    for name, text in fresh.items():
        assert committed[name] == text, f"kyverno/{name} differs from a fresh render; regenerate it"


def test_kyverno_directory_holds_no_seed_secret(defaults):
    assert not (REFERENCE / policies.SEED_SECRET_FILE).exists()
    for path in REFERENCE.iterdir():
        docs = policies.parse(path.read_text(encoding="utf-8"))
        assert not any(d.get("kind") == "Secret" for d in docs), path
        assert "stringData" not in path.read_text(encoding="utf-8")
    kustomization = yaml.safe_load((REFERENCE / "kustomization.yaml").read_text())
    assert policies.SEED_SECRET_FILE not in kustomization["resources"]
    assert all((REFERENCE / name).is_file() for name in kustomization["resources"])


# --- what the render produces ------------------------------------------------------------------

def test_files_are_in_apply_order_and_kustomization_lists_them(defaults):
    manifests = policies.render_kubernetes(defaults, SEED)
    names = list(manifests)
    assert names[-1] == "kustomization.yaml"
    kustomization = yaml.safe_load(manifests["kustomization.yaml"])
    assert kustomization["resources"] == names[:-1]
    order = {name: i for i, name in enumerate(names)}
    first_policy = min(order[n] for n in names if n.startswith("policy-"))
    assert order["rbac.yaml"] < first_policy and order[policies.SEED_SECRET_FILE] < first_policy
    assert order["system-namespace.yaml"] < order[policies.SEED_SECRET_FILE]
    assert order["example-namespace.yaml"] > first_policy


def test_seed_only_in_the_seed_secret(defaults):
    manifests = policies.render_kubernetes(defaults, SEED)
    for name, text in manifests.items():
        assert (SEED in text) == (name == policies.SEED_SECRET_FILE), name
    (secret,) = policies.parse(manifests[policies.SEED_SECRET_FILE])
    assert secret["metadata"] == {"name": "maas-kubevirt-seed", "namespace": "maas-kubevirt",
                                  "labels": {"app.kubernetes.io/part-of": "maas-kubevirt"}}
    assert secret["stringData"] == {"seed": SEED}


def test_rbac_aggregates_exactly_the_needed_verbs(defaults):
    def aggregate_label(role):
        return next(k for k in role["metadata"]["labels"] if k.startswith("rbac.kyverno.io/"))

    roles = {aggregate_label(r): r for r in by_kind(policies.render_kubernetes(defaults, SEED))["ClusterRole"]}

    def grants(role):
        return {(g, res, tuple(rule.get("resourceNames", ()))): set(rule["verbs"])
                for rule in role["rules"] for g in rule["apiGroups"] for res in rule["resources"]}
    background = grants(roles["rbac.kyverno.io/aggregate-to-background-controller"])
    admission = grants(roles["rbac.kyverno.io/aggregate-to-admission-controller"])
    reports = grants(roles["rbac.kyverno.io/aggregate-to-reports-controller"])
    generate = {"get", "list", "watch", "create", "update", "delete"}
    assert background == {
        ("", "secrets", ()): generate,
        ("bmc.kubevirt.io", "virtualmachinebmcs", ()): generate,
        ("networking.k8s.io", "ingresses", ()): generate,
        ("networking.k8s.io", "networkpolicies", ()): generate,
        ("kubevirt.io", "virtualmachines", ()): {"get", "list", "watch", "update"},
        # The guest power-off rule's GET of a VM's instance as it acts (the live tier: without it
        # the apiCall's default would let a stale request halt a VM that was powered on again).
        ("kubevirt.io", "virtualmachineinstances", ()): {"get"},
    }
    # Kyverno admits a synchronised generate rule only if its admission controller may get and
    # list the generated kinds (the live tier: refused without the Secret grant).
    assert admission == {
        ("", "secrets", ()): {"get", "list"},
        ("", "pods", ()): {"get", "list"},  # the route-isolation policy's apiCall
        ("bmc.kubevirt.io", "virtualmachinebmcs", ()): {"get", "list"},
        ("networking.k8s.io", "ingresses", ()): {"get", "list"},
        ("networking.k8s.io", "networkpolicies", ()): {"get", "list"},
    }
    read = {"get", "list", "watch"}
    assert reports == {
        ("kubevirt.io", "virtualmachines", ()): read,
        ("kubevirt.io", "virtualmachineinstances", ()): read,
        ("kubevirt.io", "virtualmachineinstancereplicasets", ()): read,
        ("pool.kubevirt.io", "virtualmachinepools", ()): read,
        ("networking.k8s.io", "ingresses", ()): read,
    }
    # Every kind a rule matches or generates is covered for the controller that acts on it.
    kinds = {k.split("/")[-1] for pol in by_kind(policies.render_kubernetes(defaults, SEED))["ClusterPolicy"]
             for rule in pol["spec"]["rules"] for sel in rule["match"]["any"] for k in sel["resources"]["kinds"]}
    plural = {"VirtualMachine": "virtualmachines", "VirtualMachineInstance": "virtualmachineinstances",
              "VirtualMachineInstanceReplicaSet": "virtualmachineinstancereplicasets",
              "VirtualMachinePool": "virtualmachinepools", "Ingress": "ingresses"}
    # Namespaces and ConfigMaps (the rotations one): Kyverno's own core roles read them everywhere.
    # Services, Endpoints and EndpointSlices: the route-isolation policy only admits them
    # (background: false), so no controller reads them.
    assert kinds == set(plural) | {"Namespace", "ConfigMap", "Service", "Endpoints", "EndpointSlice"}
    assert {p for _, p, _ in reports} == set(plural.values())
    for role in roles.values():
        assert role["metadata"]["labels"][aggregate_label(role)] == "true"


def test_policies_match_opted_in_namespaces_and_claims_match_every_namespace(defaults):
    values = values_with(defaults, kubernetes__opt_in_label="example.org/bmc", kubernetes__opt_in_value="yes")
    manifests = policies.render_kubernetes(values, SEED)
    pols = by_kind(manifests)["ClusterPolicy"]
    assert sorted(p["metadata"]["name"] for p in pols) == sorted(policies.POLICY_NAMES.values())
    selector_yes = {"matchLabels": {"example.org/bmc": "yes"}}
    for pol in pols:
        for rule in pol["spec"]["rules"]:
            (selector,) = rule["match"]["any"]
            resources = selector["resources"]
            if pol["metadata"]["name"] == policies.POLICY_NAMES["claims"]:
                # Cluster-wide: no namespace selector; "only when opted in" excludes opted-in ones.
                assert "namespaceSelector" not in resources
                excluded = [e["resources"].get("namespaceSelector") for e in rule.get("exclude", {}).get("any", [])]
                assert excluded == ([selector_yes] if rule["name"].endswith("-only-when-opted-in") else [])
            elif rule["name"] in ("stamp-identity-on-opt-in", "bmc-network-policy"):
                assert resources == {"kinds": ["Namespace"], "selector": selector_yes}
            elif pol["metadata"]["name"] == policies.POLICY_NAMES["rotations"]:
                # The one rotations ConfigMap, wherever the VMs are.
                assert resources["kinds"] == ["ConfigMap"] and "namespaceSelector" not in resources
                assert resources["names"] == [identity.ROTATIONS_CONFIGMAP]
                assert resources["namespaces"] == [defaults["kubernetes"]["system_namespace"]]
            elif rule["name"] in INGRESS_CLASS_RULES:
                # Cluster-wide: a catch-all or an alias of the class serves every namespace's BMC hosts.
                assert resources == {"kinds": ["networking.k8s.io/v1/Ingress"]}
            elif pol["metadata"]["name"] == policies.POLICY_NAMES["power_off"]:
                # An opted-in VM's instance, on the update that writes its phase.
                assert resources == {"kinds": ["kubevirt.io/v1/VirtualMachineInstance"], "operations": ["UPDATE"],
                                     "namespaceSelector": selector_yes}
            elif pol["metadata"]["name"] == policies.POLICY_NAMES["route_isolation"]:
                # Cluster-wide, on writes: a detour to a BMC may start in any namespace.
                assert "namespaceSelector" not in resources and resources["operations"] == ["CREATE", "UPDATE"]
            else:
                assert resources["kinds"] == ["kubevirt.io/v1/VirtualMachine"]
                assert resources["namespaceSelector"] == selector_yes
    claims = rules(policy(manifests, policies.POLICY_NAMES["claims"]))
    for spec in policies.CLAIM_KINDS:
        for suffix in ("serial-is-its-own", "serial-only-when-opted-in", "uuid-is-its-own"):
            rule = claims[f"{spec['rule']}-{suffix}"]
            assert rule["match"]["any"][0]["resources"]["kinds"] == [spec["kind"]]
            assert all(spec["firmware"] in c["variable"]["jmesPath"] for c in rule["context"] if c["name"] != "own")
    assert claims["ingress-host-in-its-own-namespace"]["match"]["any"][0]["resources"]["kinds"] == ["networking.k8s.io/v1/Ingress"]
    (namespace,) = [o for o in by_kind(manifests)["Namespace"] if o["metadata"]["name"] == policies.EXAMPLE_NAMESPACE]
    assert namespace["metadata"]["labels"] == {"example.org/bmc": "yes", "mutatevirtualmachines.kubemacpool.io": "allocate"}


def test_generate_rules_synchronise_existing_vms_and_never_use_random(defaults):
    manifests = policies.render_kubernetes(defaults, SEED)
    bmc = rules(policy(manifests, policies.POLICY_NAMES["bmc"]))
    assert list(bmc) == ["bmc-secret", "virtual-machine-bmc", "bmc-ingress"]  # Secret before the VMBMC
    for rule in bmc.values():
        assert rule["generate"]["synchronize"] is True
        assert rule["generate"]["generateExisting"] is True
        assert rule["generate"]["orphanDownstreamOnPolicyDelete"] is True
        # The opt-in rule's update of a VM comes from the background controller.
        assert rule["skipBackgroundRequests"] is False
        assert rule["generate"]["data"]["metadata"]["ownerReferences"] == [{
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "name": "{{ request.object.metadata.name }}", "uid": "{{ request.object.metadata.uid }}"}]
    assert "generateExisting" not in policy(manifests, policies.POLICY_NAMES["bmc"])["spec"]
    assert all("random(" not in text for text in manifests.values())
    seed, rotations, generation = bmc["bmc-secret"]["context"]
    assert seed["apiCall"]["urlPath"] == "/api/v1/namespaces/maas-kubevirt/secrets/maas-kubevirt-seed"
    # A live GET without a default: a missing ConfigMap fails the rule, it never means generation 0.
    assert rotations == {"name": "rotations", "apiCall": {
        "urlPath": "/api/v1/namespaces/maas-kubevirt/configmaps/maas-kubevirt-rotations", "jmesPath": "data || `{}`"}}
    assert generation == {"name": "generation", "variable": {"jmesPath": policies.GENERATION_JMESPATH}}
    rotation_rules = rules(policy(manifests, policies.POLICY_NAMES["rotations"]))
    assert list(rotation_rules) == ["generations-are-canonical", "generations-never-decrease", *ROTATIONS_BOUNDS,
                                    *ROTATIONS_GUARDS, "annotate-rotated-vms"]
    for name in ("generations-are-canonical", "generations-never-decrease", *ROTATIONS_BOUNDS, *ROTATIONS_GUARDS):
        assert rotation_rules[name]["validate"]["failureAction"] == "Enforce"
        assert rotation_rules[name]["validate"]["allowExistingViolations"] is False
        assert rotation_rules[name]["validate"]["message"].startswith(name + ": ")
        assert "Fix: " in rotation_rules[name]["validate"]["message"]
    assert rotation_rules["generations-never-decrease"]["match"]["any"][0]["resources"]["operations"] == ["UPDATE"]
    trigger = rotation_rules["annotate-rotated-vms"]["mutate"]
    assert trigger["mutateExistingOnPolicyUpdate"] is True
    (target,) = trigger["targets"]
    assert target["kind"] == "VirtualMachine" and "namespace" not in target and "name" not in target
    assert trigger["patchStrategicMerge"] == {"metadata": {"annotations": {
        policies.GENERATION_ANNOTATION: "{{ targetGeneration }}"}}}
    identity_rules = rules(policy(manifests, policies.POLICY_NAMES["identity"]))
    assert list(identity_rules) == ["stamp-identity", "stamp-identity-on-opt-in"]
    opt_in = identity_rules["stamp-identity-on-opt-in"]["mutate"]
    assert opt_in["mutateExistingOnPolicyUpdate"] is True
    (target,) = opt_in["targets"]
    assert target["kind"] == "VirtualMachine" and target["namespace"] == "{{ request.object.metadata.name }}"
    assert "name" not in target  # every VM in the namespace
    for rule in rules(policy(manifests, policies.POLICY_NAMES["claims"])).values():
        assert rule["validate"]["failureAction"] == "Enforce"
        assert rule["validate"]["allowExistingViolations"] is False
        assert rule["validate"]["message"].startswith(rule["name"] + ": ")
        assert "Fix: " in rule["validate"]["message"]
    for rule in rules(policy(manifests, policies.POLICY_NAMES["audit"])).values():
        assert rule["validate"]["failureAction"] == "Audit"


# --- a values change applies in place, except the opt-in label and the seed Secret's name -----

_IN_PLACE = {
    "redfish__domain": "bmc.other.example.net",
    "ingress__source_ranges": ["10.20.0.0/16", "fd00:1::/64"],
    "ingress__annotations": {"example.org/team": "infra"},
    "ingress__tls_secret": "bmc-wildcard",
    "ingress__class_name": "haproxy",
    "ingress__allowlist_annotation": "haproxy.org/allow-list",
    "ingress__controller_namespace": "ingress-system",
}


def _policies_of(manifests: dict[str, str]) -> dict[str, dict]:
    return {p["metadata"]["name"]: p for p in by_kind(manifests)["ClusterPolicy"]}


@pytest.mark.parametrize("key, value", list(_IN_PLACE.items()) + [("ingress__cluster_issuer", "letsencrypt")])
def test_a_values_change_touches_only_what_kyverno_lets_change(defaults, key, value):
    changes = {key: value}
    before = _policies_of(policies.render_kubernetes(defaults, SEED))
    after = _policies_of(policies.render_kubernetes(values_with(defaults, **changes), SEED))
    assert policies.policies_to_recreate(before, after) == []
    assert before != after  # the change does reach the policies
    # ... and only generate.data of the generate rules (Kyverno's immutable rule hash).
    for name, pol in after.items():
        for rule, old_rule in zip(pol["spec"]["rules"], before[name]["spec"]["rules"]):
            if "generate" in rule:
                assert {k: v for k, v in rule.items() if k != "generate"} == {k: v for k, v in old_rule.items() if k != "generate"}
                assert {k: v for k, v in rule["generate"].items() if k != "data"} == {k: v for k, v in old_rule["generate"].items() if k != "data"}


@pytest.mark.parametrize("key, value, recreated", [
    # The opt-in label selects the namespaces of both policies' generate rules.
    ("kubernetes__opt_in_label", "example.org/bmc", ["isolation", "bmc"]),
    ("kubernetes__opt_in_value", "yes", ["isolation", "bmc"]),
    ("kubernetes__seed_secret", "other-seed", ["bmc"]),
    ("kubernetes__system_namespace", "other-system", ["bmc"]),
])
def test_a_change_in_an_immutable_part_is_detected(defaults, key, value, recreated):
    before = _policies_of(policies.render_kubernetes(defaults, SEED))
    after = _policies_of(policies.render_kubernetes(values_with(defaults, **{key: value}), SEED))
    assert policies.policies_to_recreate(before, after) == sorted(policies.POLICY_NAMES[n] for n in recreated)
    text = policies.recreate_procedure(["maas-kubevirt-vm-bmc"], [], "out/kubernetes", before)
    assert "kubectl delete clusterpolicy maas-kubevirt-vm-bmc\n  kubectl apply -k out/kubernetes" in text
    assert "orphanDownstreamOnPolicyDelete" in text and "stay in place" in text


def test_render_prints_the_delete_and_recreate_procedure(defaults, tmp_path, capsys):
    from maas_kubevirt import cli

    site = tmp_path / "site.yaml"
    site.write_text("kubernetes:\n  opt_in_label: example.org/bmc\n")
    out = tmp_path / "out"
    assert cli.main(["render", "--output", str(out)]) == 0
    first = capsys.readouterr().out
    assert "kubectl delete" not in first
    assert cli.main(["render", "--output", str(out)]) == 0
    assert "kubectl delete" not in capsys.readouterr().out
    # A policy of an earlier version, rendered without orphanDownstreamOnPolicyDelete.
    old = policy(policies.render_kubernetes(defaults, SEED), policies.POLICY_NAMES["bmc"])
    old["metadata"]["name"] = "maas-kubevirt-require-own-serial"
    for rule in old["spec"]["rules"]:
        rule["generate"].pop("orphanDownstreamOnPolicyDelete")
    (out / "kubernetes" / "policy-vm-serial.yaml").write_text(yaml.safe_dump(old))
    kustomization = out / "kubernetes" / "kustomization.yaml"
    listed = yaml.safe_load(kustomization.read_text())
    listed["resources"].append("policy-vm-serial.yaml")
    kustomization.write_text(yaml.safe_dump(listed))
    assert cli.main(["--values", str(site), "render", "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "kubectl delete clusterpolicy maas-kubevirt-vm-bmc\n" in printed
    assert "kubectl delete clusterpolicy maas-kubevirt-require-own-serial\n" in printed
    assert "deleting it deletes every generated Secret" in printed
    assert printed.index("kubectl delete") < printed.index("Next steps:")


def test_library_annotations_on_every_policy(defaults):
    for pol in by_kind(policies.render_kubernetes(defaults, SEED))["ClusterPolicy"]:
        annotations = pol["metadata"]["annotations"]
        for key in ("title", "category", "severity", "subject", "description"):
            assert annotations[f"policies.kyverno.io/{key}"]
        assert annotations["policies.kyverno.io/severity"] in ("low", "medium", "high")
        assert set(annotations["policies.kyverno.io/subject"].split(", ")) <= {
            "VirtualMachine", "VirtualMachineInstance", "VirtualMachineInstanceReplicaSet", "VirtualMachinePool",
            "Ingress", "Namespace", "NetworkPolicy", "ConfigMap", "Service", "Endpoints", "EndpointSlice"}
        assert annotations["kyverno.io/kyverno-version"] == policies.KYVERNO_MIN_VERSION


@pytest.mark.parametrize("tls", ["none", "secret", "issuer"])
def test_ingress_pattern_is_the_expected_ingress(defaults, tls):
    extra = {"example.org/team": "infra", "nginx.ingress.kubernetes.io/proxy-read-timeout": "60"}
    values = values_with(
        defaults,
        ingress__tls_secret="wildcard-bmc" if tls == "secret" else "",
        ingress__cluster_issuer="letsencrypt" if tls == "issuer" else "",
        ingress__annotations=extra,
        ingress__source_ranges=["10.1.2.0/24", "fd00::/8"],
        ingress__class_name="internal-nginx",
        ingress__allowlist_annotation="nginx.ingress.kubernetes.io/allowlist-source-range",
        redfish__domain="BMC.Lab.Example.NET",
    )
    bmc = policy(policies.render_kubernetes(values, SEED), policies.POLICY_NAMES["bmc"])
    generated = {o["kind"]: o for o in (resolve(p, VARIABLES) for p in generate_patterns(bmc))}
    assert generated["Ingress"] == expected_ingress("web1", "tenant-a", values)
    assert generated["Ingress"]["spec"]["rules"][0]["host"] == "web1.tenant-a.bmc.lab.example.net"
    assert generated["VirtualMachineBMC"] == expected_vmbmc("web1", "tenant-a")


def test_the_secret_holds_a_derived_user_and_password_and_no_fixed_value(defaults):
    """Both keys are computed by Kyverno from the seed and the serial (the engine's values: test_policies_kyverno.py)."""
    bmc = rules(policy(policies.render_kubernetes(defaults, SEED), policies.POLICY_NAMES["bmc"]))
    assert bmc["bmc-secret"]["generate"]["data"]["data"] == {
        "username": "{{ base64_encode(" + policies.USER_JMESPATH + ") }}",
        "password": "{{ base64_encode(" + policies.PASSWORD_JMESPATH + ") }}",
    }
    assert f"'{identity.BMC_USER_PREFIX}'" in policies.USER_JMESPATH
    assert "':user:'" in policies.USER_JMESPATH and "':user:'" not in policies.PASSWORD_JMESPATH


@pytest.mark.parametrize("controller_namespace", ["ingress-nginx", "ingress-system"])
def test_network_policy_pattern_is_the_expected_network_policy(defaults, controller_namespace):
    values = values_with(defaults, ingress__controller_namespace=controller_namespace)
    isolation = policy(policies.render_kubernetes(values, SEED), policies.POLICY_NAMES["isolation"])
    (generated,) = [resolve(p, {**VARIABLES, "request.object.metadata.name": "tenant-a"})
                    for p in generate_patterns(isolation)]
    assert generated == expected_network_policy("tenant-a", values)
    rule = rules(isolation)["bmc-network-policy"]
    assert rule["generate"]["synchronize"] is rule["generate"]["generateExisting"] is True
    assert rule["generate"]["orphanDownstreamOnPolicyDelete"] is True
    # Redfish only: the one port admitted is kubevirtBMC's Redfish container port, over TCP.
    (admitted,) = generated["spec"]["ingress"]
    assert admitted["ports"] == [{"protocol": "TCP", "port": policies.REDFISH_POD_PORT}]


# The isolation policy's rules on Ingresses of the BMC class, in order.
INGRESS_CLASS_RULES = ["ingress-no-catch-all", "ingress-server-alias-in-its-own-namespace", "ingress-no-nginx-snippet"]


def test_the_catch_all_rule_follows_the_values(defaults):
    isolation = rules(policy(policies.render_kubernetes(defaults, SEED), policies.POLICY_NAMES["isolation"]))
    rule = isolation["ingress-no-catch-all"]
    assert rule["validate"]["failureAction"] == "Enforce" and rule["validate"]["allowExistingViolations"] is False
    assert rule["validate"]["message"].startswith("ingress-no-catch-all: ") and "Fix: " in rule["validate"]["message"]
    assert [c["value"] for c in rule["preconditions"]["any"]] == ["maas-kubevirt-bmc", "maas-kubevirt-bmc"]
    other = rules(policy(policies.render_kubernetes(values_with(
        defaults, ingress__class_name="haproxy", ingress__allowlist_annotation="haproxy.org/allow-list"), SEED),
        policies.POLICY_NAMES["isolation"]))
    assert [c["value"] for c in other["ingress-no-catch-all"]["preconditions"]["any"]] == ["haproxy", "haproxy"]
    allowed = rules(policy(policies.render_kubernetes(values_with(defaults, ingress__allow_catch_all=True), SEED),
                           policies.POLICY_NAMES["isolation"]))
    # The annotation rules stay: an alias or a snippet is no catch-all the values asked for.
    assert list(allowed) == ["bmc-network-policy"] + INGRESS_CLASS_RULES[1:]


@pytest.mark.parametrize("class_name, domain", [("maas-kubevirt-bmc", "bmc.example.com"), ("internal-nginx", "BMC.Lab.Example.NET")])
def test_the_annotation_rules_check_the_bmc_class_and_the_domain(defaults, class_name, domain):
    values = values_with(defaults, ingress__class_name=class_name, redfish__domain=domain,
                         ingress__allowlist_annotation=policies.ALLOWLIST_ANNOTATION)
    isolation = rules(policy(policies.render_kubernetes(values, SEED), policies.POLICY_NAMES["isolation"]))
    assert list(isolation)[1:] == INGRESS_CLASS_RULES
    for name in INGRESS_CLASS_RULES:
        rule = isolation[name]
        assert rule["match"] == isolation["ingress-no-catch-all"]["match"]
        assert rule["preconditions"] == isolation["ingress-no-catch-all"]["preconditions"]
        assert [c["value"] for c in rule["preconditions"]["any"]] == [class_name, class_name]
        assert rule["validate"]["failureAction"] == "Enforce" and rule["validate"]["allowExistingViolations"] is False
        assert rule["validate"]["message"].startswith(name + ": ") and "Fix: " in rule["validate"]["message"]
    (each,) = isolation["ingress-server-alias-in-its-own-namespace"]["validate"]["foreach"]
    assert policies.SERVER_ALIAS_ANNOTATION in each["list"]
    (condition,) = each["deny"]["conditions"]["all"]
    # The domain as values.py normalises it, each dot literal in the RE2 pattern.
    assert "'[.]" + domain.lower().replace(".", "[.]") + "[[:space:]]*$'" in condition["key"]
    assert "request.object.metadata.namespace" in condition["key"]
    (snippet,) = isolation["ingress-no-nginx-snippet"]["validate"]["deny"]["conditions"]["any"]
    assert f"'{policies.NGINX_ANNOTATION_PREFIX}'" in snippet["key"] and f"'{policies.SNIPPET_SUFFIX}'" in snippet["key"]


@given(vm=st.from_regex(r"[a-z0-9]([-a-z0-9]{0,10}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,8}[a-z0-9])?){0,2}", fullmatch=True),
       namespace=st.from_regex(r"[a-z0-9]([-a-z0-9]{0,10}[a-z0-9])?", fullmatch=True),
       other=st.from_regex(r"[a-z0-9]([-a-z0-9]{0,10}[a-z0-9])?", fullmatch=True))
def test_the_alias_pattern_admits_exactly_the_namespaces_own_hosts(vm, namespace, other):
    """ALIAS_HOST_LABELS_REGEX joined as the rule joins it, read in Python: own hosts only."""
    import re

    pattern = _python_regex(policies.ALIAS_HOST_LABELS_REGEX + namespace + "[.]bmc[.]example[.]com[[:space:]]*$")
    host = identity.redfish_host(vm, namespace, "bmc.example.com")
    assert pattern.match(host) and pattern.match(f" {host}\t")
    refused = [f"*.{namespace}.bmc.example.com", f".{namespace}.bmc.example.com", f"{namespace}.bmc.example.com",
               "~^" + re.escape(host) + "$", host.upper(), f"{host}.evil.example", f"{host}, *.bmc.example.com"]
    if other != namespace:
        refused.append(identity.redfish_host(vm, other, "bmc.example.com"))
    for alias in refused:
        assert not pattern.match(alias), alias


# --- schemas ----------------------------------------------------------------------------------

def _validate_render(manifests: dict[str, str], module_dir) -> None:
    for obj in policies.objects(manifests):
        validate_object(obj, module_dir)
        if obj["kind"] == "ClusterPolicy":
            for pattern in generate_patterns(obj):
                validate_object(resolve(pattern, VARIABLES), module_dir)


def test_every_rendered_object_validates_against_its_schema(defaults, module_dir):
    _validate_render(policies.render_kubernetes(defaults, SEED), module_dir)


def test_expected_generated_objects_validate(defaults, module_dir):
    for ns in ("tenant-a", "tenant-b"):
        for obj in (expected_secret("web1", ns), expected_vmbmc("web1", ns), expected_ingress("web1", ns, defaults),
                    expected_network_policy(ns, defaults)):
            validate_object(obj, module_dir)


def test_the_validator_catches_a_broken_policy(defaults, module_dir):
    pol = policy(policies.render_kubernetes(defaults, SEED), policies.POLICY_NAMES["bmc"])
    pol["spec"]["rules"][0]["generate"]["synchronise"] = True  # misspelt field
    with pytest.raises(SchemaProblem):
        validate_object(pol, module_dir)
    pol = policy(policies.render_kubernetes(defaults, SEED), policies.POLICY_NAMES["claims"])
    pol["spec"]["rules"][0]["validate"]["failureAction"] = "Deny"
    with pytest.raises(SchemaProblem):
        validate_object(pol, module_dir)


# --- values -----------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "changes, key",
    [
        ({"ingress__tls_secret": "wild", "ingress__cluster_issuer": "le"}, "ingress.cluster_issuer"),
        ({"ingress__annotations": {"nginx.ingress.kubernetes.io/whitelist-source-range": "0.0.0.0/0"}}, "ingress.annotations"),
        ({"ingress__annotations": {"nginx.ingress.kubernetes.io/allowlist-source-range": "10.0.0.0/8"}}, "ingress.annotations"),
        ({"ingress__class_name": "haproxy", "ingress__allowlist_annotation": "example.org/allow",
          "ingress__annotations": {"example.org/allow": "0.0.0.0/0"}}, "ingress.annotations"),
        ({"ingress__allowlist_annotation": "nginx.ingress.kubernetes.io/allowlist-source-ranges"},
         "ingress.allowlist_annotation"),
        ({"redfish__domain": ("a" * 62 + ".") * 2 + "example.com"}, "redfish.domain"),
        ({"ingress__annotations": {"cert-manager.io/cluster-issuer": "other"}}, "ingress.annotations"),
        ({"ingress__annotations": {"example.org/x": "{{ request.object }}"}}, "ingress.annotations"),
        ({"ingress__annotations": {"example.org/x": "$(./../x)"}}, "ingress.annotations"),
        ({"kubernetes__opt_in_label": "mutatevirtualmachines.kubemacpool.io"}, "kubernetes.opt_in_label"),
    ],
)
def test_values_giving_invalid_objects_are_rejected_per_key(defaults, changes, key):
    values = copy.deepcopy(defaults)
    for dotted, value in changes.items():
        section, name = dotted.split("__")
        values[section][name] = value
    with pytest.raises(ValuesError) as caught:
        policies.render_kubernetes(validate(values), SEED)
    assert all(p.startswith(key) and "expected" in p and "found" in p for p in caught.value.problems)
    assert SEED not in str(caught.value)


@pytest.mark.parametrize(
    "section, key, value",
    [
        ("redfish", "domain", "not a domain"),
        ("redfish", "domain", "-bad.example.com"),
        ("kubernetes", "opt_in_label", "bad label/with/slashes"),
        ("kubernetes", "opt_in_label", "-x"),
        ("kubernetes", "opt_in_value", "a" * 64),
        ("kubernetes", "system_namespace", "Not_A_Namespace"),
        ("ingress", "source_ranges", ["10.0.0.1/8"]),
        ("ingress", "source_ranges", []),
        ("ingress", "source_ranges", ["0.0.0.0/0"]),
        ("ingress", "source_ranges", ["10.0.0.0/8", "::/0"]),
        ("ingress", "allowlist_annotation", "not a key!"),
        ("ingress", "source_ranges", ["nowhere"]),
        ("ingress", "annotations", {"bad key!": "x"}),
        ("ingress", "class_name", "Bad Class"),
    ],
)
def test_invalid_values_are_reported_per_key(defaults, section, key, value):
    values = copy.deepcopy(defaults)
    values[section][key] = value
    with pytest.raises(ValuesError) as caught:
        policies.render_kubernetes(validate(values), SEED)
    assert any(p.startswith(f"{section}.{key}") for p in caught.value.problems)


@given(st.text())
def test_quote_reads_back_as_the_same_string(text):
    assert yaml.safe_load(policies.quote(text)) == text
    assert yaml.safe_load("key: " + policies.quote(text) + "\n") == {"key": text}


# --- hypothesis over values -------------------------------------------------------------------

_label_chars = string.ascii_letters + string.digits + "-_."
_dns_chars = string.ascii_lowercase + string.digits + "-."
_anything = st.text(min_size=0, max_size=40)
_dnsish = st.text(alphabet=_dns_chars, min_size=1, max_size=70)
_keyish = st.one_of(
    st.builds(lambda p, n: f"{p}/{n}" if p else n, st.one_of(st.just(""), _dnsish), st.text(alphabet=_label_chars, min_size=1, max_size=70)),
    _anything,
)
_cidr = st.one_of(
    st.ip_addresses(v=4).map(lambda a: f"{a}/32"),
    st.ip_addresses(v=6).map(lambda a: f"{a}/128"),
    st.sampled_from(["10.0.0.0/8", "192.168.0.0/16", "fd00::/8", "10.0.0.1/8", "bad", "0.0.0.0/0", "::/0"]),
)

_changes = st.fixed_dictionaries(
    {},
    optional={
        "redfish.domain": st.one_of(_dnsish, _anything),
        "kubernetes.system_namespace": st.one_of(_dnsish, _anything),
        "kubernetes.seed_secret": st.one_of(_dnsish, _anything),
        "kubernetes.opt_in_label": _keyish,
        "kubernetes.opt_in_value": st.one_of(st.text(alphabet=_label_chars, min_size=0, max_size=70), _anything),
        "ingress.class_name": st.one_of(_dnsish, _anything),
        "ingress.tls_secret": st.one_of(st.just(""), _dnsish, _anything),
        "ingress.cluster_issuer": st.one_of(st.just(""), _dnsish, _anything),
        "ingress.source_ranges": st.lists(_cidr, max_size=4),
        "ingress.annotations": st.dictionaries(_keyish, st.one_of(_anything, st.integers()), max_size=3),
        "ingress.allowlist_annotation": st.one_of(st.just(""), _keyish),
    },
)


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(changes=_changes, seed=st.text(min_size=16, max_size=40))
def test_render_fails_cleanly_or_every_object_validates(defaults, module_dir, changes, seed):
    values = copy.deepcopy(defaults)
    for dotted, value in changes.items():
        section, key = dotted.split(".")
        values[section][key] = value
    try:
        manifests = policies.render_kubernetes(validate(values), seed)
    except ValuesError as error:
        assert error.problems and all(": expected " in p or ": unknown key" in p for p in error.problems)
        assert seed not in str(error) or seed in repr(changes)
        event("values rejected")
        return
    event("rendered")
    _validate_render(manifests, module_dir)
    # The values arrive unchanged in the objects.
    (secret,) = [o for o in policies.objects(manifests) if o["kind"] == "Secret"]
    assert secret["stringData"]["seed"] == seed
    bmc = policy(manifests, policies.POLICY_NAMES["bmc"])
    try:
        expected = expected_ingress("web1", "tenant-a", values)
    except identity.IdentityError:
        assume(False)
    ingress = next(resolve(p, VARIABLES) for p in generate_patterns(bmc) if p["kind"] == "Ingress")
    assert ingress == expected


def test_the_allowlist_is_always_rendered_with_the_configured_annotation(defaults):
    for changes, key in (({}, policies.ALLOWLIST_ANNOTATION),
                         ({"ingress__class_name": "haproxy", "ingress__allowlist_annotation": "haproxy.org/allow-list"},
                          "haproxy.org/allow-list")):
        values = values_with(defaults, ingress__source_ranges=["10.1.0.0/16", "fd00::/8"], **changes)
        bmc = policy(policies.render_kubernetes(values, SEED), policies.POLICY_NAMES["bmc"])
        ingress = next(resolve(p, VARIABLES) for p in generate_patterns(bmc) if p["kind"] == "Ingress")
        assert ingress["metadata"]["annotations"][key] == "10.1.0.0/16,fd00::/8"
        assert policies.DEPRECATED_ALLOWLIST_ANNOTATION not in ingress["metadata"]["annotations"]


# --- the claim rules, spelled in RE2 for Kyverno, agree with the identity module --------------

def _python_regex(re2: str):
    import re

    return re.compile(re2.replace("[[:space:]]", r"\s"))


@given(vm=st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,8}[a-z0-9])?){0,2}", fullmatch=True),
       namespace=st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True),
       upper=st.booleans(), pad=st.sampled_from(["", " ", "\t", "  "]))
def test_every_serial_the_script_would_read_as_a_claim_matches_the_claim_regex(vm, namespace, upper, pad):
    serial = identity.format_serial(vm, namespace)
    assert identity.parse_serial(serial) == (vm, namespace)
    shown = pad + (serial.upper() if upper else serial) + pad
    assert _python_regex(policies.SERIAL_CLAIM_REGEX).match(shown)


@given(st.text(max_size=30))
def test_a_serial_the_claim_regex_refuses_is_no_claim(text):
    if not _python_regex(policies.SERIAL_CLAIM_REGEX).match(text):
        with pytest.raises(identity.IdentityError):
            identity.parse_serial(text.strip().lower())


@given(vm=st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True),
       namespace=st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True))
def test_every_derived_uuid_has_the_derived_form(vm, namespace):
    import re

    uuid = identity.smbios_uuid(vm, namespace)
    assert re.fullmatch(policies.UUID_DERIVED_HEX_REGEX.strip("^$"), uuid.replace("-", ""))


# --- a new seed re-derives every Secret at once -------------------------------------------------

def test_a_new_seed_updates_the_bmc_policy_in_place(defaults):
    """The seed's digest sits in bmc-secret's data, so applying a render with a new seed updates
    the policy and Kyverno re-derives every <vm>-bmc Secret (its data change sync)."""
    other = "another-site-seed-of-enough-length-0001"
    before = _policies_of(policies.render_kubernetes(defaults, SEED))
    after = _policies_of(policies.render_kubernetes(defaults, other))
    assert policies.policies_to_recreate(before, after) == []
    old, new = (rules(p[policies.POLICY_NAMES["bmc"]])["bmc-secret"]["generate"]["data"]["metadata"]["annotations"]
                for p in (before, after))
    generation = {policies.GENERATION_ANNOTATION: "{{ generation }}"}
    assert old == {policies.SEED_VERSION_ANNOTATION: policies.seed_version(SEED), **generation}
    assert new == {policies.SEED_VERSION_ANNOTATION: policies.seed_version(other), **generation}
    assert old != new
    # Only the Secret carries it; the reference tree (no seed) has the generation alone.
    reference = _policies_of(policies.render_kubernetes(defaults, None))
    assert rules(reference[policies.POLICY_NAMES["bmc"]])["bmc-secret"]["generate"]["data"]["metadata"][
        "annotations"] == generation


@given(st.text(min_size=1, max_size=64), st.text(min_size=1, max_size=64))
def test_seed_versions_differ_per_seed_and_never_show_it(a, b):
    assume(a != b)
    assert policies.seed_version(a) != policies.seed_version(b)
    assert len(policies.seed_version(a)) == 16 and set(policies.seed_version(a)) <= set("0123456789abcdef")
    if len(a) >= 8:
        assert a not in policies.seed_version(a)


# --- the reconciler's own RBAC (issue 23) -------------------------------------------------------

def test_the_reconciler_may_get_create_and_update_its_lease_and_the_rotations_and_nothing_else(defaults):
    manifests = policies.render_kubernetes(defaults, SEED)
    objects = policies.parse(manifests[policies.RECONCILER_RBAC_FILE])
    assert [(o["kind"], o["metadata"]["name"], o["metadata"]["namespace"]) for o in objects] == [
        (kind, "maas-kubevirt-reconciler", "maas-kubevirt") for kind in ("ServiceAccount", "Role", "RoleBinding")]
    account, role, binding = objects
    assert account["automountServiceAccountToken"] is False
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["maas-kubevirt-reconciler"],
         "verbs": ["get", "update"]},
        # Issue 25 item 2: that one ConfigMap, get and update; no list or watch, no Secret.
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["maas-kubevirt-rotations"],
         "verbs": ["get", "update"]},
    ]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": "maas-kubevirt-reconciler"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "maas-kubevirt-reconciler",
                                    "namespace": "maas-kubevirt"}]
    # No other object of the bundle names the reconciler's account or grants it anything.
    others = [o for name, text in manifests.items() if name not in (policies.RECONCILER_RBAC_FILE,
                                                                    policies.KUSTOMIZATION_FILE)
              for o in policies.parse(text)]
    assert not [o for o in others if o["kind"] in ("Role", "RoleBinding", "ClusterRoleBinding", "ServiceAccount")]
    # The rotations policy names it in three rules: the user the label rule refuses (issue 29) and the
    # user the two bounds of issue 41 hold to one raise by one, below the ceiling.
    assert "maas-kubevirt-reconciler" not in "".join(t for n, t in manifests.items()
                                                     if n not in (policies.RECONCILER_RBAC_FILE, ROTATIONS_POLICY_FILE))
    (rotations_policy,) = policies.parse(manifests[ROTATIONS_POLICY_FILE])
    rotations_policy["spec"]["rules"] = [r for r in rotations_policy["spec"]["rules"]
                                         if r["name"] not in ("reconciler-cannot-allow-delete", *ROTATIONS_BOUNDS)]
    assert "maas-kubevirt-reconciler" not in yaml.safe_dump(rotations_policy)
    assert policies.RECONCILER_RBAC_FILE in yaml.safe_load(manifests["kustomization.yaml"])["resources"]


def test_the_reconcilers_rbac_follows_the_lease_values(defaults):
    values = values_with(defaults, reconciler__lease={**defaults["reconciler"]["lease"], "name": "site-7",
                                                      "namespace": "leases"})
    account, role, binding, rotations_role, rotations_binding = policies.parse(
        policies.render_kubernetes(values, SEED)[policies.RECONCILER_RBAC_FILE])
    assert {o["metadata"]["namespace"] for o in (account, role, binding)} == {"leases"}
    assert role["rules"][1]["resourceNames"] == ["site-7"]
    assert binding["subjects"][0]["namespace"] == "leases"
    # The rotations ConfigMap stays in the system namespace: the same one grant, there.
    assert [r["resources"] for r in role["rules"]] == [["leases"], ["leases"]]
    assert (rotations_role["kind"], rotations_binding["kind"]) == ("Role", "RoleBinding")
    assert {o["metadata"]["namespace"] for o in (rotations_role, rotations_binding)} == {"maas-kubevirt"}
    assert rotations_role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"],
                                        "resourceNames": ["maas-kubevirt-rotations"], "verbs": ["get", "update"]}]
    assert rotations_binding["roleRef"]["name"] == rotations_role["metadata"]["name"]
    assert rotations_binding["subjects"] == [{"kind": "ServiceAccount", "name": "maas-kubevirt-reconciler",
                                              "namespace": "leases"}]


# --- credential generations (issue 25 item 2) ----------------------------------------------------

def test_the_rotations_configmap_is_rendered_without_data(defaults):
    """`kubectl apply -k` must never reset the generations the reconciler wrote: the rendered
    ConfigMap has no data (nor binaryData) for apply's three-way merge to reconcile."""
    manifests = policies.render_kubernetes(defaults, SEED)
    (configmap,) = policies.parse(manifests[policies.ROTATIONS_FILE])
    assert configmap["kind"] == "ConfigMap" and set(configmap) == {"apiVersion", "kind", "metadata"}
    assert configmap["metadata"]["name"] == identity.ROTATIONS_CONFIGMAP
    assert configmap["metadata"]["namespace"] == defaults["kubernetes"]["system_namespace"]
    assert policies.ROTATIONS_FILE in yaml.safe_load(manifests["kustomization.yaml"])["resources"]


# The rules that keep the rotations ConfigMap itself (issue 29), in their order in the policy.
ROTATIONS_GUARDS = ["configmap-not-immutable", "configmap-no-owner-references", "configmap-no-finalizers",
                    "configmap-no-delete", "reconciler-cannot-allow-delete"]
ROTATIONS_POLICY_FILE = "policy-credential-rotations.yaml"
# The lease kubeconfig's bound (issue 41 item 4), in their order in the policy.
ROTATIONS_BOUNDS = ["reconciler-raises-one-generation-by-one", "reconciler-stays-below-the-ceiling"]


def test_the_lease_kubeconfig_may_raise_one_generation_by_one_below_its_ceiling(defaults):
    """Both bounds judge the reconciler's ServiceAccount alone, on every write, from the sums of the
    canonical generations before and after; the ceiling is far below the largest generation."""
    bounds = rules(policy(policies.render_kubernetes(defaults, SEED), policies.POLICY_NAMES["rotations"]))
    reconciler = "system:serviceaccount:maas-kubevirt:maas-kubevirt-reconciler"
    assert identity.RECONCILER_GENERATION_MAX * 1000 < identity.GENERATION_MAX
    for name, (after, before), limit in (
            ("reconciler-raises-one-generation-by-one", ("totalAfter", "totalBefore"), 1),
            ("reconciler-stays-below-the-ceiling", ("aboveAfter", "aboveBefore"), 0)):
        rule = bounds[name]
        assert _operations(rule) == ["CREATE", "UPDATE"], name
        assert rule["preconditions"] == {"all": [{"key": "{{ request.userInfo.username || '' }}",
                                                  "operator": "Equals", "value": reconciler}]}
        above = identity.RECONCILER_GENERATION_MAX if limit == 0 else None
        assert rule["context"] == [
            {"name": after, "variable": {"jmesPath": policies.generation_total_jmespath("request.object", above)}},
            {"name": before, "variable": {"jmesPath": policies.generation_total_jmespath("request.oldObject", above)}}]
        assert rule["validate"]["deny"]["conditions"] == {"any": [
            {"key": f"{{{{ subtract({after}, {before}) }}}}", "operator": "GreaterThan", "value": limit}]}


def _operations(rule: dict) -> list[str] | None:
    return rule["match"]["any"][0]["resources"].get("operations")


def test_the_rotations_configmap_is_kept_alive_and_only_an_administrator_arms_its_delete(defaults):
    """immutable, ownerReferences and finalizers refused on every write, a DELETE refused unless the
    ConfigMap already carries the break-glass label, which the reconciler's account may not set."""
    from test_policies_kyverno import ALLOW_DELETE_LABEL

    guards = rules(policy(policies.render_kubernetes(defaults, SEED), policies.POLICY_NAMES["rotations"]))
    for name in ("configmap-not-immutable", "configmap-no-owner-references", "configmap-no-finalizers",
                 "reconciler-cannot-allow-delete"):
        assert _operations(guards[name]) == ["CREATE", "UPDATE"], name
    assert guards["configmap-not-immutable"]["validate"]["deny"]["conditions"]["any"] == [
        {"key": "{{ request.object.immutable == `null` }}", "operator": "Equals", "value": False}]
    for name, field in (("configmap-no-owner-references", "ownerReferences"), ("configmap-no-finalizers", "finalizers")):
        assert guards[name]["validate"]["deny"]["conditions"]["any"] == [
            {"key": f"{{{{ length(request.object.metadata.{field} || `[]`) }}}}", "operator": "GreaterThan", "value": 0}]
    # The DELETE rule reads the object being deleted: no request.object on a DELETE.
    delete = guards["configmap-no-delete"]
    assert _operations(delete) == ["DELETE"] and "preconditions" not in delete
    assert delete["validate"]["deny"]["conditions"]["any"] == [{
        "key": f'{{{{ request.oldObject.metadata.labels."{ALLOW_DELETE_LABEL}" || \'\' }}}}',
        "operator": "NotEquals", "value": "true"}]
    assert "request.object." not in delete["validate"]["message"]
    assert f"label configmap {{{{ request.oldObject.metadata.name }}}} {ALLOW_DELETE_LABEL}=true" in \
        " ".join(delete["validate"]["message"].split())
    # Every other rule of the policy leaves a DELETE alone.
    for name, rule in guards.items():
        if name != "configmap-no-delete":
            assert "DELETE" not in (_operations(rule) or []) or rule["preconditions"]["all"][0]["value"] == "DELETE"
    label = guards["reconciler-cannot-allow-delete"]
    assert label["preconditions"] == {"all": [{"key": "{{ request.userInfo.username || '' }}", "operator": "Equals",
                                               "value": "system:serviceaccount:maas-kubevirt:maas-kubevirt-reconciler"}]}
    new, old = (f'{{{{ request.{o}.metadata.labels."{ALLOW_DELETE_LABEL}" || \'\' }}}}' for o in ("object", "oldObject"))
    assert label["validate"]["deny"]["conditions"] == {"all": [
        {"key": new, "operator": "NotEquals", "value": ""}, {"key": new, "operator": "NotEquals", "value": old}]}


def test_the_label_rule_follows_the_reconcilers_namespace(defaults):
    """The account is where reconciler-rbac.yaml puts it: in the Lease's namespace when that is set."""
    values = values_with(defaults, reconciler__lease={**defaults["reconciler"]["lease"], "namespace": "leases"})
    label = rules(policy(policies.render_kubernetes(values, SEED), policies.POLICY_NAMES["rotations"]))[
        "reconciler-cannot-allow-delete"]
    assert label["preconditions"]["all"][0]["value"] == "system:serviceaccount:leases:maas-kubevirt-reconciler"


def _parses_as_serial(key: str) -> bool:
    try:
        identity.parse_serial(key)
        return True
    except identity.IdentityError:
        return False


def _parses_as_generation(value: str) -> bool:
    try:
        identity.parse_generation(value)
        return True
    except identity.IdentityError:
        return False


_key_text = st.one_of(
    st.text(alphabet="abz09-.A _", max_size=20),
    st.builds(lambda vm, ns: f"{vm}.{ns}", st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,70}[a-z0-9])?", fullmatch=True),
              st.from_regex(r"[a-z0-9-]{1,66}", fullmatch=True)),
)


@settings(derandomize=True, max_examples=400)
@given(key=_key_text, value=st.one_of(st.text(alphabet="0123456789 -+x", max_size=11), st.integers(0, 2 * 10**9).map(str)))
def test_the_configmap_admits_what_the_reconciler_parses(key, value):
    """SERIAL_KEY_REGEX and GENERATION_REGEX (RE2, in the validate rule) accept exactly what
    identity.parse_serial and parse_generation accept (ConfigMap keys are at most 253 characters)."""
    import re

    if len(key) <= 253:
        assert bool(re.search(policies.SERIAL_KEY_REGEX, key)) == _parses_as_serial(key), key
    assert bool(re.search(policies.GENERATION_REGEX, value)) == _parses_as_generation(value), value


def test_the_upgrade_to_generations_prints_the_procedure(defaults):
    """A BMC policy rendered before credential generations (no `rotations` context) cannot be
    updated in place; render names it and says the upgrade changes no credential."""
    import copy as copy_

    after = _policies_of(policies.render_kubernetes(defaults, SEED))
    before = copy_.deepcopy(after)
    secret_rule = rules(before[policies.POLICY_NAMES["bmc"]])["bmc-secret"]
    secret_rule["context"] = [c for c in secret_rule["context"] if c["name"] == "seed"]
    del before[policies.POLICY_NAMES["rotations"]]
    assert policies.before_rotations(before[policies.POLICY_NAMES["bmc"]])
    assert not policies.before_rotations(after[policies.POLICY_NAMES["bmc"]])
    names = policies.policies_to_recreate(before, after)
    assert names == [policies.POLICY_NAMES["bmc"]]
    text = policies.recreate_procedure(names, [], "out/kubernetes", before)
    assert "upgrade to per-VM credential generations" in text and identity.ROTATIONS_CONFIGMAP in text
    assert "kubectl delete clusterpolicy maas-kubevirt-vm-bmc\n  kubectl apply -k out/kubernetes" in text
    assert "stay in place" in text


# --- the guest power-off rule's decision, evaluated from the render ----------------------------
#
# The rule's context and conditions run in Python (kyverno_conditions: JMESPath and Kyverno's
# operators) on an instance update and the VM it would halt, so a changed condition fails here
# and not only in the Kyverno CLI and control-plane tiers.

POWER_OFF_RULE = "halt-on-guest-power-off"
PHASES = ["Pending", "Scheduled", "Running", "Succeeded", "Failed"]
STRATEGIES = ["RerunOnFailure", "Always", "Halted", "Manual", "Once"]


@pytest.fixture(scope="module")
def power_off(defaults: dict) -> dict[str, dict]:
    """The guest power-off policy as the templates render it and as kyverno/ commits it."""
    name = policies.POLICY_NAMES["power_off"]
    committed = yaml.safe_load((REFERENCE / "policy-guest-power-off.yaml").read_text(encoding="utf-8"))
    return {"render": policy(policies.render_kubernetes(defaults, SEED), name), "committed": committed}


def halts(pol: dict, instance: dict, old_phase: str, vm: dict, current_instance: str = "") -> bool:
    """Does the rule set this VM's runStrategy to Halted on this update of the instance (its phase
    old_phase before)? current_instance: the uid the VM's instance has when the rule acts ("" gone)."""
    rule = rules(pol)[POWER_OFF_RULE]
    old = copy.deepcopy(instance)
    old["status"]["phase"] = old_phase
    data = load_context(rule.get("context"), {"request": {"operation": "UPDATE", "object": instance,
                                                          "oldObject": old}}, {})
    if not conditions_hold(rule.get("preconditions"), data):
        return False
    (target,) = rule["mutate"]["targets"]
    assert rule["mutate"]["patchStrategicMerge"] == {"spec": {"runStrategy": "Halted"}}
    assert (target["apiVersion"], target["kind"]) == ("kubevirt.io/v1", "VirtualMachine")
    if (substitute(target["namespace"], data), substitute(target["name"], data)) != \
            (vm["metadata"]["namespace"], vm["metadata"]["name"]):
        return False
    data = load_context(target.get("context"), {**data, "target": vm}, {"currentInstance": current_instance})
    return conditions_hold(target.get("preconditions"), data)


def _off(phase: str = "Succeeded", **options) -> dict:
    return fx.instance("off", "tenant-a", phase, **options)


def _off_vm(strategy: str = "RerunOnFailure") -> dict:
    return fx.run_strategy(fx.vm("off", "tenant-a"), strategy)


@pytest.mark.parametrize("source", ["render", "committed"])
@pytest.mark.parametrize("old_phase, new_phase, halted", [
    ("Running", "Succeeded", True),       # the guest powered itself off
    ("Scheduled", "Succeeded", True),
    ("Succeeded", "Succeeded", False),    # a later update of the ended instance (a label, a finalizer)
    ("Running", "Running", False),
    ("Succeeded", "Running", False),
])
def test_the_power_off_rule_halts_only_on_the_instance_s_transition_into_succeeded(power_off, source, old_phase,
                                                                                  new_phase, halted):
    """Old phase not Succeeded, new one Succeeded: only that update halts the VM; a power-on written
    after it is never undone by a later update of the same instance."""
    pol = power_off[source]
    assert halts(pol, _off(new_phase), old_phase, _off_vm()) is halted


@pytest.mark.parametrize("source", ["render", "committed"])
@pytest.mark.parametrize("requests, halted", [
    pytest.param([], True, id="none"),
    pytest.param([{"action": "Stop"}], True, id="stop"),
    pytest.param([{"action": "Start"}], False, id="start"),
    pytest.param([{"action": "Stop"}, {"action": "Start", "uid": "8f6c1c1e-0000-4000-8000-000000000002"}], False,
                 id="stop-then-start"),
])
def test_the_power_off_rule_never_halts_a_vm_with_a_pending_start(power_off, source, requests, halted):
    """A start already asked for (virtctl start, KubeVirt's start subresource) wins over the guest's
    own power-off, even on the update that ends the instance."""
    pol = power_off[source]
    vm = _off_vm()
    if requests:
        vm["status"] = {"stateChangeRequests": requests}
    assert halts(pol, _off(), "Running", vm) is halted


def test_the_power_off_rule_decides_each_suite_case_as_the_suite_expects(power_off):
    """The Kyverno CLI suite's cases (tests/kyverno/guest-power-off, old phase Running) judged here too."""
    pol = power_off["render"]
    for name, phase, options, changes, outcome in fx.POWER_OFF_CASES:
        instance = fx.instance(name, "tenant-a", phase, **options)
        vm = fx.run_strategy(fx.vm(name, "tenant-a"), changes["strategy"], changes.get("start_requested", False))
        assert halts(pol, instance, "Running", vm) is (outcome == "pass"), name


def test_the_rendered_power_off_rule_decides_as_the_stand_in_s_model(power_off):
    """Every combination of phases, strategy, pending requests, deletion, owner and current instance:
    the rendered rule agrees with kubevirt_bmc.halts_on_guest_power_off, the model the MAAS tiers
    run, and never halts for another owner or a newer instance."""
    from kubevirt_bmc import halts_on_guest_power_off

    owners = {"own": "own", "another": "0e1c2a55-0000-4000-8000-000000000001", "none": None}
    requests = [(), ("Stop",), ("Start",), ("Stop", "Start")]
    halted = 0
    for old_phase, new_phase, strategy, actions, deleting, owner, current in itertools.product(
            PHASES, PHASES, STRATEGIES, requests, (False, True), owners, ("gone", "this", "newer")):
        instance = _off(new_phase, owner_uid=owners[owner], deleting=deleting)
        uid = {"gone": "", "this": instance["metadata"]["uid"], "newer": "0e1c2a55-0000-4000-8000-000000000003"}[current]
        vm = _off_vm(strategy)
        if actions:
            vm["status"] = {"stateChangeRequests": [{"action": action} for action in actions]}
        expected = (halts_on_guest_power_off(strategy, old_phase, new_phase, start_requested="Start" in actions,
                                             deleting=deleting)
                    and owner == "own" and current != "newer")
        case = (old_phase, new_phase, strategy, actions, deleting, owner, current)
        assert halts(power_off["render"], instance, old_phase, vm, uid) is expected, case
        halted += expected
    # Any old phase but Succeeded, with no Start asked, the instance gone or still this one.
    assert halted == (len(PHASES) - 1) * 2 * 2


# Issue 41 item 5: the pod-network rule's pattern against Python's reading of the same addresses.
_octet_text = st.integers(0, 255).flatmap(lambda n: st.sampled_from([str(n), f"0{n}", f"00{n}"]))


@settings(max_examples=300, deadline=None)
@given(cidrs=st.lists(st.tuples(st.integers(0, 2 ** 32 - 1), st.integers(1, 32)), min_size=1, max_size=3),
       octets=st.lists(_octet_text, min_size=4, max_size=4), inside=st.booleans(),
       prefix=st.sampled_from(["", "::ffff:", "::FFFF:", "0:0:0:0:0:ffff:", "::"]))
def test_the_pod_network_pattern_matches_exactly_the_addresses_in_the_networks(cidrs, octets, inside, prefix):
    import ipaddress
    import re

    networks = [ipaddress.IPv4Network((address, length), strict=False) for address, length in cidrs]
    if inside:  # an address drawn inside the first network, written with the drawn leading zeros
        net = networks[0]
        value = int(net.network_address) + sum(int(o.lstrip("0") or "0") for o in octets) % net.num_addresses
        octets = [("0" if o.startswith("0") and o != "0" else "") + str(b)
                  for o, b in zip(octets, ipaddress.IPv4Address(value).packed)]
    address = ipaddress.IPv4Address(".".join(str(int(o)) for o in octets))
    pattern = policies.ipv4_networks_regex([str(n) for n in networks])
    expected = any(address in n for n in networks)
    assert bool(re.match(pattern, prefix + ".".join(octets))) is expected
    # Never a longer or shorter dotted text, nor an address with more text after it.
    assert not re.match(pattern, prefix + ".".join(octets) + ".1")
    assert not re.match(pattern, prefix + ".".join(octets[:3]))


def test_the_pod_network_rule_is_rendered_only_with_pod_cidrs():
    values = copy.deepcopy(load_values(None))
    rules = lambda v: [r["name"] for r in policies.parse(policies.render_kubernetes(validate(v), None)[  # noqa: E731
        "policy-route-isolation.yaml"])[0]["spec"]["rules"]]
    assert "endpoints-not-into-the-pod-network" not in rules(values)
    values["kubernetes"]["pod_cidrs"] = ["10.244.0.0/16"]
    assert "endpoints-not-into-the-pod-network" in rules(values)
    assert policies.ipv4_networks_regex([]) == ""


# --- issue 41: the BMC classes are the bundle's alone; Traefik's kinds; wildcards above the domain -----

def _route_isolation(values: dict) -> dict[str, dict]:
    return rules(policy(policies.render_kubernetes(values, SEED), policies.POLICY_NAMES["route_isolation"]))


def _gateway_site(defaults: dict, **more) -> dict:
    """The defaults with exposure gateway on the Gateway bmc-gateway/bmc, and gateway.* keys changed."""
    values = copy.deepcopy(defaults)
    values["exposure"] = "gateway"
    values["gateway"].update(namespace="bmc-gateway", name="bmc", **more)
    return validate(values)


def test_only_the_bmc_gateway_takes_the_bmc_gateway_class(defaults):
    isolation = _route_isolation(_gateway_site(defaults, class_name="site-bmc"))
    rule = isolation["gateway-class-only-for-the-bmc-gateway"]
    assert rule["match"]["any"][0]["resources"]["kinds"] == ["gateway.networking.k8s.io/*/Gateway"]
    assert rule["match"]["any"][0]["resources"]["operations"] == ["CREATE", "UPDATE"]
    assert "exclude" not in rule and "preconditions" not in rule      # every namespace, every requester
    assert rule["validate"]["failureAction"] == "Enforce" and rule["validate"]["allowExistingViolations"] is False
    (by_class, not_the_bmc_gateway) = rule["validate"]["deny"]["conditions"]["all"]
    assert (by_class["operator"], by_class["value"]) == ("Equals", "site-bmc")
    assert "spec.gatewayClassName" in by_class["key"]
    assert (not_the_bmc_gateway["operator"], not_the_bmc_gateway["value"]) == ("NotEquals", "bmc-gateway/bmc")
    message = rule["validate"]["message"]
    assert message.startswith("gateway-class-only-for-the-bmc-gateway: ") and "site-bmc" in message and "Fix: " in message


def test_the_bmc_gateway_has_listeners_for_bmc_hosts_only(defaults):
    values = _gateway_site(defaults)
    rule = _route_isolation(values)["bmc-gateway-listeners-in-the-bmc-domain"]
    (which,) = rule["preconditions"]["all"]
    assert (which["operator"], which["value"]) == ("Equals", "bmc-gateway/bmc")
    (each,) = rule["validate"]["foreach"]
    assert each["list"] == "request.object.spec.listeners || `[]`"
    (condition,) = each["deny"]["conditions"]["any"]
    # Hostless (''), outside, or a wildcard above the domain: none ends with .<domain>.
    assert condition == {"key": "{{ ends_with(to_lower(element.hostname || ''), '.bmc.example.com') }}",
                         "operator": "Equals", "value": False}


def test_no_route_catches_all_on_any_listener_of_the_bmc_gateway(defaults):
    """gateway.section_name no longer narrows the catch-all rule: every listener of the BMC Gateway serves BMC hosts."""
    for section in ("", "bmc-https"):
        isolation = _route_isolation(_gateway_site(defaults, section_name=section))
        rule = isolation["route-no-catch-all-on-the-bmc-gateway"]
        (condition,) = rule["validate"]["foreach"][0]["deny"]["conditions"]["all"]
        assert "sectionName" not in condition["key"] and "'bmc-gateway'" in condition["key"]
        assert "another" not in rule["validate"]["message"].lower(), rule["validate"]["message"]
        listener_sets = _route_isolation(_gateway_site(defaults, section_name=section, route_kinds=["HTTPRoute", "XListenerSet"]))
        keys = [c["key"] for c in listener_sets["listenerset-outside-the-bmc-domain"]["validate"]["foreach"][0]["deny"]["conditions"]["any"]]
        assert keys[1] == "{{ " + policies.gateway_ref_jmespath("request.object.spec.parentRef", _gateway_site(defaults), listener=False) + " }}"


def test_the_class_rules_follow_the_exposure(defaults):
    gateway_rules = _route_isolation(_gateway_site(defaults))
    ingress_rules = _route_isolation(defaults)
    assert {"gateway-class-only-for-the-bmc-gateway", "bmc-gateway-listeners-in-the-bmc-domain"} <= set(gateway_rules)
    assert "ingress-class-only-for-the-bmc-ingresses" not in gateway_rules
    assert "ingress-class-only-for-the-bmc-ingresses" in ingress_rules
    assert not {"gateway-class-only-for-the-bmc-gateway", "bmc-gateway-listeners-in-the-bmc-domain"} & set(ingress_rules)


@pytest.mark.parametrize("changes", [{}, {"ingress__class_name": "bmc-only", "kubernetes__kyverno_namespace": "policy-engine"},
                                     {"ingress__watch_without_class": True}])
def test_only_the_generated_ingresses_take_the_bmc_ingress_class(defaults, changes):
    values = values_with(defaults, **changes)
    rule = _route_isolation(values)["ingress-class-only-for-the-bmc-ingresses"]
    isolation = rules(policy(policies.render_kubernetes(values, SEED), policies.POLICY_NAMES["isolation"]))
    # The class as the other rules of the class read it: spec.ingressClassName, the older annotation, none.
    assert rule["preconditions"] == isolation["ingress-no-catch-all"]["preconditions"]
    assert len(rule["preconditions"]["any"]) == (3 if values["ingress"]["watch_without_class"] else 2)
    assert rule["match"]["any"][0]["resources"]["operations"] == ["CREATE", "UPDATE"]
    (requester,) = rule["validate"]["deny"]["conditions"]["all"]
    assert requester == {"key": "{{ request.userInfo.username || '' }}", "operator": "NotEquals",
                         "value": f"system:serviceaccount:{values['kubernetes']['kyverno_namespace']}:kyverno-background-controller"}
    assert values["ingress"]["class_name"] in rule["validate"]["message"]


@pytest.mark.parametrize("exposure_, allowlist, setting, served", [
    ("ingress", "annotation", False, False), ("ingress", "traefik", False, False), ("ingress", "annotation", True, True),
    ("gateway", "traefik", False, False), ("gateway", "traefik", True, True), ("gateway", "external", True, True),
    ("gateway", "envoy-gateway", False, False),
])
def test_the_traefik_rules_are_there_exactly_when_traefik_crds_are_served(defaults, exposure_, allowlist, setting, served):
    values = copy.deepcopy(defaults)
    values["gateway"]["traefik_crds"] = setting
    if exposure_ == "gateway":
        values.update(exposure="gateway")
        values["gateway"].update(namespace="bmc-gateway", name="bmc", allowlist=allowlist)
    else:
        values["ingress"]["allowlist"] = allowlist
    values = validate(values)
    isolation = _route_isolation(values)
    names = {"traefik-routes-name-hosts-outside-the-bmc-domain", "traefik-services-not-to-another-namespaces-bmc"}
    assert (names <= set(isolation)) is served and (not names & set(isolation)) is (not served)
    pol = policy(policies.render_kubernetes(values, SEED), policies.POLICY_NAMES["route_isolation"])
    assert ("IngressRoute" in pol["metadata"]["annotations"]["policies.kyverno.io/subject"]) is served
    if served:
        routes = isolation["traefik-routes-name-hosts-outside-the-bmc-domain"]
        assert routes["match"]["any"][0]["resources"]["kinds"] == list(policies.TRAEFIK_ROUTE_KINDS)
        services = isolation["traefik-services-not-to-another-namespaces-bmc"]
        assert services["match"]["any"][0]["resources"]["kinds"] == list(policies.TRAEFIK_SERVICE_KINDS)
        conditions = routes["validate"]["foreach"][0]["deny"]["conditions"]["any"]
        assert [c["value"] for c in conditions] == [False, True, True]
        assert f"'{values['redfish']['domain']}'" in conditions[2]["key"]


@pytest.mark.parametrize("match, names_a_host, unreadable, wildcard", [
    ("PathPrefix(`/redfish`)", False, False, False),
    ("Host(`app.example.org`) && PathPrefix(`/api`)", True, False, False),
    ("host (`app.example.org`)", True, False, False),
    ("HostSNI(`*`)", True, False, True),
    ("HostHeader(`a.example.org`, `*.example.com`)", True, False, True),
    ("Host(`a.example.org`) || PathPrefix(`/`)", True, True, False),
    ("!Host(`a.example.org`)", True, True, False),
    ("HostRegexp(`^.+$`)", False, True, False),
    ("HostSNIRegexp(`^.+$`)", False, True, False),
    ("Header(`X-Host`, `a`) && ClientIP(`10.0.0.0/8`)", False, False, False),
    ("GhostHost(`a.example.org`)", False, False, False),
])
def test_what_the_traefik_rule_reads_in_a_match(match, names_a_host, unreadable, wildcard):
    """The RE2 patterns of the Traefik rule, in Python's re (the same syntax for these)."""
    import re as re_

    def found(pattern: str) -> bool:
        return re_.search(pattern.replace("[[:space:]]", r"\s"), match) is not None

    assert found(policies.TRAEFIK_HOST_MATCHER_REGEX) is names_a_host
    assert (found(policies.TRAEFIK_HOST_REGEXP_REGEX) or "||" in match or "!" in match) is unreadable
    assert found(policies.TRAEFIK_WILDCARD_HOST_REGEX) is wildcard


def test_the_ingress_host_rule_refuses_wildcards_above_the_domain(defaults):
    """Issue 41: '*.example.com' on an Ingress catches every BMC host (nginx's wildcard matches any depth)."""
    claims = rules(policy(policies.render_kubernetes(defaults, SEED), policies.POLICY_NAMES["claims"]))
    (each,) = claims["ingress-host-in-its-own-namespace"]["validate"]["foreach"]
    in_zone, own = each["deny"]["conditions"]["all"]
    assert in_zone["key"] == "{{ " + policies.zone_claim_jmespath("element", "bmc.example.com") + " }}"
    assert "starts_with(to_lower(element), '*.')" in in_zone["key"]
