"""The rendered policies run through the real Kyverno engine (the Kyverno CLI, `kyverno test`).

The CLI comes from $KYVERNO, else tools/build-kyverno builds it from the Kyverno Go module
(cached; skipped without Go, failing under CI=true).
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import os
import re
import string
import subprocess
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import require, require_tool
from maas_kubevirt import identity, policies
from maas_kubevirt.values import load_values
import policies_fixtures as fx

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def kyverno() -> str:
    path = os.environ.get("KYVERNO")
    if path:
        require(os.access(path, os.X_OK), f"KYVERNO={path} is not an executable")
        return path
    require_tool("go", "Go is not installed: cannot build the Kyverno CLI (tools/build-kyverno); set KYVERNO=/path/to/kyverno")
    result = subprocess.run([str(ROOT / "tools" / "build-kyverno")], capture_output=True, text=True, timeout=3600)
    require(result.returncode == 0, "tools/build-kyverno failed: " + result.stderr.strip()[-2000:])
    return result.stdout.strip().splitlines()[-1]


def json_stream(documents: list[dict]) -> str:
    return "".join("---\n" + json.dumps(doc, ensure_ascii=False) + "\n" for doc in documents)


def run_tests(kyverno: str, directory: Path) -> str:
    result = subprocess.run([kyverno, "test", str(directory), "--remove-color"], capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr
    summaries = re.findall(r"Test Summary: (\d+) tests? passed and (\d+) tests? failed", output)
    assert result.returncode == 0 and summaries, output
    assert all(int(failed) == 0 for _, failed in summaries), output
    assert "InvalidPolicy" not in output and "Invalid Policy" not in output, output
    return output


def test_committed_suites_are_built_from_the_identity_module():
    built = fx.suites(load_values(None))
    committed = {
        str(p.relative_to(fx.SUITES_DIR)): p.read_text(encoding="utf-8")
        for p in fx.SUITES_DIR.rglob("*") if p.is_file()
    }
    assert sorted(committed) == sorted(built), "regenerate: .venv/bin/python tests/policies_fixtures.py"
    for name, text in built.items():
        assert committed[name] == text, f"tests/kyverno/{name} is stale; regenerate it"


def test_web1_in_two_namespaces_gets_different_uuid_host_user_and_password():
    load = lambda rel: yaml.safe_load((fx.SUITES_DIR / rel).read_text())  # noqa: E731
    patched = list(yaml.safe_load_all((fx.SUITES_DIR / "identity/patched.yaml").read_text()))
    uuids = {p["metadata"]["namespace"]: p["spec"]["template"]["spec"]["domain"]["firmware"]["uuid"]
             for p in patched if p["metadata"]["name"] == "web1"}
    assert uuids == {ns: identity.smbios_uuid("web1", ns) for ns in fx.OPTED_IN}
    assert len(set(uuids.values())) == 2
    hosts = {load(f"bmc/generated-ingress-{ns}.yaml")["spec"]["rules"][0]["host"] for ns in fx.OPTED_IN}
    assert hosts == {"web1.tenant-a.bmc.example.com", "web1.tenant-b.bmc.example.com"}
    generations = {ns: identity.parse_generation(fx.BMC_ROTATIONS.get(f"web1.{ns}", "0")) for ns in fx.OPTED_IN}
    assert generations == {"tenant-a": 0, "tenant-b": 3}
    passwords = {base64.b64decode(load(f"bmc/generated-secret-{ns}.yaml")["data"]["password"]).decode() for ns in fx.OPTED_IN}
    assert passwords == {identity.bmc_password(fx.TEST_SEED, f"web1.{ns}", generations[ns]) for ns in fx.OPTED_IN}
    assert len(passwords) == 2
    users = {base64.b64decode(load(f"bmc/generated-secret-{ns}.yaml")["data"]["username"]).decode() for ns in fx.OPTED_IN}
    assert users == {identity.bmc_user(fx.TEST_SEED, f"web1.{ns}", generations[ns]) for ns in fx.OPTED_IN}
    assert len(users) == 2 and not users & passwords
    # Generation 0 is the derivation every site had before rotation existed.
    secret_a = load("bmc/generated-secret-tenant-a.yaml")
    assert secret_a["metadata"]["annotations"] == {policies.GENERATION_ANNOTATION: "0"}
    assert base64.b64decode(secret_a["data"]["password"]).decode() == hashlib.sha256(
        f"{fx.TEST_SEED}:web1.tenant-a".encode()).hexdigest()[:32]


def test_kyverno_test_suites_pass(kyverno):
    output = run_tests(kyverno, fx.SUITES_DIR)
    passed = int(re.findall(r"Test Summary: (\d+) tests? passed", output)[-1])
    expected = sum(len(r["resources"]) for p in fx.SUITES_DIR.glob("*/kyverno-test.yaml")
                   for r in yaml.safe_load(p.read_text())["results"])
    assert passed >= expected, output


def _apply(kyverno: str, tmp_path: Path, resource: dict, refused: bool = False) -> tuple[dict, list]:
    (tmp_path / "vm.yaml").write_text(yaml.safe_dump(resource))
    out = tmp_path / "out.yaml"
    result = subprocess.run(
        [kyverno, "apply", *sorted(str(p) for p in fx.REFERENCE_DIR.glob("policy-*.yaml")),
         "-r", str(tmp_path / "vm.yaml"), "-f", str(fx.SUITES_DIR / "bmc" / "values.yaml"),
         "-p", "--remove-color", "-o", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert (result.returncode != 0) == refused, result.stdout + result.stderr
    start = result.stdout.find("apiVersion:")
    report = yaml.safe_load(result.stdout[start:]) if start >= 0 else {}
    mutated = [d for d in yaml.safe_load_all(out.read_text()) if d] if out.exists() else []
    return (mutated[-1] if mutated else resource), (report or {}).get("results") or []


def test_vm_outside_opted_in_namespaces_is_untouched(kyverno, tmp_path):
    original = fx.vm("web1", fx.PLAIN, serial="anything", macs=False)
    (tmp_path / "plain").mkdir()
    after, results = _apply(kyverno, tmp_path / "plain", original)
    assert after == original
    # Only the cluster-wide claims policy looks at it, and "anything" claims no identity.
    assert results and all((r["policy"], r["result"]) == (policies.POLICY_NAMES["claims"], "pass") for r in results)
    # The same VM in an opted-in namespace is stamped and gets its BMC objects.
    opted = fx.vm("web1", "tenant-a", serial="anything")
    after, results = _apply(kyverno, tmp_path, opted)
    assert after == fx.stamped(opted)
    assert {(r["policy"], r["rule"], r["result"]) for r in results} >= {
        (policies.POLICY_NAMES["bmc"], rule, "pass") for rule in ("bmc-secret", "virtual-machine-bmc", "bmc-ingress")
    }


# --- the engine computes what the identity module computes -----------------------------------

_label = st.from_regex(r"[a-z]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True)
_subdomain = st.lists(_label, min_size=1, max_size=3).map(".".join)
_seed = st.text(alphabet=string.ascii_letters + string.digits + string.punctuation + " é€", min_size=16, max_size=48)


# A VM's generation in the rotations ConfigMap: None (no key: 0), or a value, small or up to the
# largest the ConfigMap admits ("0" explicitly too).
_generation = st.one_of(st.none(), st.just(0), st.integers(1, 20), st.integers(0, identity.GENERATION_MAX))


def _rotations(vms: list, generations: list) -> dict[str, str]:
    """The ConfigMap data for the VMs whose generation is not None."""
    return {f"{name}.{ns}": str(g) for (name, ns), g in zip(vms, generations) if g is not None}


@settings(max_examples=25 if os.environ.get("HYPOTHESIS_PROFILE") == "ci" else 4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    vms=st.lists(st.tuples(st.one_of(_label, _subdomain), _label), min_size=1, max_size=12, unique=True),
    seed=_seed, data=st.data(),
)
def test_engine_uuid_and_password_equal_the_identity_module(kyverno, tmp_path_factory, vms, seed, data):
    """Random VMs, seeds and generations through `kyverno test`: exact patched serial/UUID and
    generated Secret (identity.bmc_user/bmc_password at the VM's generation)/VMBMC/Ingress."""
    generations = data.draw(st.lists(_generation, min_size=len(vms), max_size=len(vms)))
    rotations = _rotations(vms, generations)
    values = load_values(None)
    directory = tmp_path_factory.mktemp("engine")
    suite = directory / "suite"
    suite.mkdir()
    resources = [fx.vm(name, ns) for name, ns in vms]
    bmc_ok = [(name, ns) for name, ns in vms if re.fullmatch(policies.BMC_NAME_REGEX, name)]
    generated = []
    for name, ns in bmc_ok:
        generation = int(rotations.get(f"{name}.{ns}", "0"))
        generated += [fx.expected_secret(name, ns, seed=seed, generation=generation), fx.expected_vmbmc(name, ns),
                      fx.expected_ingress(name, ns, values)]
    namespaces = sorted({ns for _, ns in vms})
    values_doc = {
        "apiVersion": "cli.kyverno.io/v1alpha1", "kind": "Values",
        "policies": [{"name": policies.POLICY_NAMES["bmc"], "rules": [{"name": "bmc-secret", "values": {
            "seed": seed, "rotations": rotations}}]}],
        "namespaceSelector": [{"name": ns, "labels": dict(fx.OPT_IN)} for ns in namespaces],
    }
    refs = [f"{ns}/{name}" for name, ns in vms]
    results = [{"policy": policies.POLICY_NAMES["identity"], "rule": "stamp-identity", "resources": refs,
                "kind": "VirtualMachine", "result": "pass", "patchedResources": "patched.yaml"}]
    for rule in ("bmc-secret", "virtual-machine-bmc", "bmc-ingress"):
        results += [{"policy": policies.POLICY_NAMES["bmc"], "rule": rule, "resources": [f"{ns}/{name}"],
                     "kind": "VirtualMachine", "result": "pass", "generatedResource": "generated.yaml"}
                    for name, ns in bmc_ok]
    test = {"apiVersion": "cli.kyverno.io/v1alpha1", "kind": "Test", "metadata": {"name": "engine"},
            "policies": [str(fx.REFERENCE_DIR / "policy-vm-identity.yaml"), str(fx.REFERENCE_DIR / "policy-vm-bmc.yaml")],
            "resources": ["resources.yaml"], "variables": "values.yaml", "results": results}
    # JSON (which is YAML): the CLI's YAML reader takes a bare n or y for a boolean.
    (suite / "resources.yaml").write_text(json_stream(resources))
    (suite / "patched.yaml").write_text(json_stream([fx.stamped(r) for r in resources]))
    (suite / "generated.yaml").write_text(json_stream(generated))
    (suite / "values.yaml").write_text(json_stream([values_doc]))
    (suite / "kyverno-test.yaml").write_text(json_stream([test]))
    output = run_tests(kyverno, suite)
    summary = re.findall(r"Test Summary: (\d+) tests? passed", output)[-1]
    assert int(summary) == len(vms) + 3 * len(bmc_ok), output
    assert seed not in output


@settings(max_examples=25 if os.environ.get("HYPOTHESIS_PROFILE") == "ci" else 4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(vms=st.lists(st.tuples(_label, _label), min_size=1, max_size=12, unique=True), seed=_seed, data=st.data())
def test_engine_user_equals_the_identity_module(kyverno, tmp_path_factory, vms, seed, data):
    """Random VMs, seeds and generations through `kyverno test`: the <vm>-bmc Secret's username
    and password are identity.bmc_user and bmc_password at the VM's generation, exactly.

    Every _label is a name kubevirtBMC serves, so every VM gets its Secret."""
    generations = data.draw(st.lists(_generation, min_size=len(vms), max_size=len(vms)))
    rotations = _rotations(vms, generations)
    suite = tmp_path_factory.mktemp("user")
    secrets = [fx.expected_secret(name, ns, seed=seed, generation=g or 0) for (name, ns), g in zip(vms, generations)]
    for secret, (name, ns), g in zip(secrets, vms, generations):
        assert base64.b64decode(secret["data"]["username"]).decode() == identity.bmc_user(seed, f"{name}.{ns}", g or 0)
        if not g:  # generation 0, given or absent: today's derivation exactly
            assert secret == fx.expected_secret(name, ns, seed=seed)
    values_doc = {
        "apiVersion": "cli.kyverno.io/v1alpha1", "kind": "Values",
        "policies": [{"name": policies.POLICY_NAMES["bmc"], "rules": [{"name": "bmc-secret", "values": {
            "seed": seed, "rotations": rotations}}]}],
        "namespaceSelector": [{"name": ns, "labels": dict(fx.OPT_IN)} for ns in sorted({ns for _, ns in vms})],
    }
    results = [{"policy": policies.POLICY_NAMES["bmc"], "rule": "bmc-secret", "resources": [f"{ns}/{name}"],
                "kind": "VirtualMachine", "result": "pass", "generatedResource": "generated.yaml"} for name, ns in vms]
    test = {"apiVersion": "cli.kyverno.io/v1alpha1", "kind": "Test", "metadata": {"name": "user"},
            "policies": [str(fx.REFERENCE_DIR / "policy-vm-bmc.yaml")],
            "resources": ["resources.yaml"], "variables": "values.yaml", "results": results}
    (suite / "resources.yaml").write_text(json_stream([fx.vm(name, ns) for name, ns in vms]))
    (suite / "generated.yaml").write_text(json_stream(secrets))
    (suite / "values.yaml").write_text(json_stream([values_doc]))
    (suite / "kyverno-test.yaml").write_text(json_stream([test]))
    output = run_tests(kyverno, suite)
    assert int(re.findall(r"Test Summary: (\d+) tests? passed", output)[-1]) == len(vms), output
    assert seed not in output


def test_a_spoofed_serial_in_an_opted_in_namespace_is_refused_not_rewritten(kyverno, tmp_path):
    """Admission as the API server runs it: the identity mutate leaves the spoof alone, the claims policy refuses it."""
    spoofed = fx.vm("web2", "tenant-a", serial="web1.tenant-b")
    after, results = _apply(kyverno, tmp_path, spoofed, refused=True)
    assert after["spec"]["template"]["spec"]["domain"]["firmware"]["serial"] == "web1.tenant-b"
    outcomes = {(r["policy"], r["rule"], r["result"]) for r in results}
    assert (policies.POLICY_NAMES["claims"], "vm-serial-is-its-own", "fail") in outcomes
    assert not any(r["result"] == "fail" for r in results if r["rule"] != "vm-serial-is-its-own")


# --- the claims policy decides what the identity module decides -------------------------------

_ascii = string.ascii_letters + string.digits + "-. \t_:/"
_claimish = st.builds(lambda vm, ns, pad, upper: pad + (f"{vm}.{ns}".upper() if upper else f"{vm}.{ns}") + pad,
                      st.one_of(_label, _subdomain), st.one_of(_label, st.sampled_from(fx.OPTED_IN + [fx.PLAIN])),
                      st.sampled_from(["", " ", "\t"]), st.booleans())
_serial = st.one_of(_claimish, st.text(alphabet=_ascii, max_size=24))
_host_label = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,10}[a-z0-9])?", fullmatch=True)
_host = st.one_of(
    st.builds(lambda vm, ns: f"{vm}.{ns}.{fx.DOMAIN}", st.one_of(_host_label, st.just("*")),
              st.sampled_from(fx.OPTED_IN + [fx.PLAIN, "other"])),
    st.builds(lambda labels: ".".join(labels + [fx.DOMAIN]), st.lists(_host_label, max_size=3)),
    st.builds(lambda labels: ".".join(labels + ["example.org"]), st.lists(_host_label, min_size=1, max_size=3)),
)


@settings(max_examples=25 if os.environ.get("HYPOTHESIS_PROFILE") == "ci" else 3, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(serials=st.lists(_serial, min_size=1, max_size=10), hosts=st.lists(st.lists(_host, min_size=1, max_size=2), min_size=1, max_size=8),
       kind=st.sampled_from([k["name"] for k in policies.CLAIM_KINDS]))
def test_engine_refuses_exactly_the_claims_the_identity_module_sees(kyverno, tmp_path_factory, serials, hosts, kind):
    """Random serials and Ingress hosts through `kyverno test` against the oracle in policies_fixtures."""
    suite = tmp_path_factory.mktemp("claims")
    objects, results = [], []
    spec = next(k for k in policies.CLAIM_KINDS if k["name"] == kind)
    for index, serial in enumerate(serials):
        ns = fx.OPTED_IN[0] if index % 2 else fx.PLAIN
        obj = fx.with_firmware(kind, f"obj{index}", ns, {"serial": serial})
        objects.append(obj)
        for suffix, outcome in fx.claim_outcomes(obj, ns in fx.OPTED_IN).items():
            results.append({"policy": policies.POLICY_NAMES["claims"], "rule": f"{spec['rule']}-{suffix}",
                            "resources": [f"{ns}/obj{index}"], "kind": kind, "result": outcome})
    for index, ingress_hosts in enumerate(hosts):
        ns = fx.OPTED_IN[index % 2]
        objects.append(fx.ingress_with_hosts(f"ing{index}", ns, ingress_hosts))
        results.append({"policy": policies.POLICY_NAMES["claims"], "rule": "ingress-host-in-its-own-namespace",
                        "resources": [f"{ns}/ing{index}"], "kind": "Ingress",
                        "result": fx.ingress_outcome(ns, ingress_hosts)})
    values_doc = {"apiVersion": "cli.kyverno.io/v1alpha1", "kind": "Values",
                  "namespaceSelector": [{"name": ns, "labels": dict(fx.OPT_IN)} for ns in fx.OPTED_IN]
                  + [{"name": fx.PLAIN, "labels": {"kubernetes.io/metadata.name": fx.PLAIN}}]}
    test = {"apiVersion": "cli.kyverno.io/v1alpha1", "kind": "Test", "metadata": {"name": "claims"},
            "policies": [str(fx.REFERENCE_DIR / "policy-identity-claims.yaml")],
            "resources": ["resources.yaml"], "variables": "values.yaml", "results": results}
    (suite / "resources.yaml").write_text(json_stream(objects))
    (suite / "values.yaml").write_text(json_stream([values_doc]))
    (suite / "kyverno-test.yaml").write_text(json_stream([test]))
    output = run_tests(kyverno, suite)
    assert int(re.findall(r"Test Summary: (\d+) tests? passed", output)[-1]) >= len(results), output


# --- the catch-all rule decides what doctor decides ---------------------------------------------

_rule_host = st.one_of(st.none(), st.sampled_from(["www.example.org", f"web1.tenant-a.{fx.DOMAIN}"]))


@settings(max_examples=25 if os.environ.get("HYPOTHESIS_PROFILE") == "ci" else 3, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(shapes=st.lists(st.tuples(st.lists(_rule_host, max_size=3), st.booleans(),
                                 st.sampled_from(["nginx", "traefik", None]), st.sampled_from(["nginx", "traefik", None])),
                       min_size=1, max_size=8))
def test_engine_refuses_exactly_the_catch_alls_doctor_sees(kyverno, tmp_path_factory, shapes):
    """Random Ingress shapes through `kyverno test`: the Enforce rule and doctor's catch_all agree."""
    from maas_kubevirt import doctor

    suite = tmp_path_factory.mktemp("catch-all")
    objects, results = [], []
    for index, (hosts, default_backend, class_name, legacy) in enumerate(shapes):
        if not hosts and not default_backend:
            default_backend = True          # an Ingress needs a rule or a default backend
        ingress = fx.catch_all_ingress(f"ing{index}", "tenant-a", class_name=class_name, legacy_class=legacy,
                                       hosts=hosts, default_backend=default_backend)
        objects.append(ingress)
        ours = "nginx" in doctor.ingress_classes(ingress)
        outcome = ("fail" if doctor.catch_all(ingress) else "pass") if ours else "skip"
        results.append({"policy": policies.POLICY_NAMES["isolation"], "rule": "ingress-no-catch-all",
                        "resources": [f"tenant-a/ing{index}"], "kind": "Ingress", "result": outcome})
    test = {"apiVersion": "cli.kyverno.io/v1alpha1", "kind": "Test", "metadata": {"name": "catch-all"},
            "policies": [str(fx.REFERENCE_DIR / "policy-bmc-isolation.yaml")],
            "resources": ["resources.yaml"], "results": results}
    (suite / "resources.yaml").write_text(json_stream(objects))
    (suite / "kyverno-test.yaml").write_text(json_stream([test]))
    output = run_tests(kyverno, suite)
    assert int(re.findall(r"Test Summary: (\d+) tests? passed", output)[-1]) >= len(results), output


def test_the_catch_all_rule_refuses_a_default_backend_by_its_own_condition(kyverno, tmp_path):
    """Issue 21 item 9: spec.defaultBackend beside rules that all have a host is refused, and by that alone.

    No in-process evaluator of Kyverno conditions exists (the jmespath library's semantics differ
    from Kyverno's), so this is the CLI on one Ingress, not the suites' whole table."""
    with_backend = fx.catch_all_ingress("default", "tenant-a", hosts=["www.example.org"], default_backend=True)
    _, results = _apply(kyverno, tmp_path, with_backend, refused=True)
    assert {(r["policy"], r["rule"]) for r in results if r["result"] == "fail"} == {
        (policies.POLICY_NAMES["isolation"], "ingress-no-catch-all")}
    # The same Ingress without it is admitted: the defaultBackend condition made the refusal.
    without = copy.deepcopy(with_backend)
    del without["spec"]["defaultBackend"]
    (tmp_path / "without").mkdir()
    _, results = _apply(kyverno, tmp_path / "without", without)
    assert (policies.POLICY_NAMES["isolation"], "ingress-no-catch-all", "pass") in {
        (r["policy"], r["rule"], r["result"]) for r in results}


def test_the_rotation_suites_expect_what_the_identity_module_decides():
    """The committed rotations suites: refused exactly when a key is no serial or a value no
    generation for identity.parse_serial/parse_generation; annotated exactly the VMs whose
    annotation differs from their generation in the ConfigMap."""
    def admitted(data) -> bool:
        try:
            for key, value in (data or {}).items():
                identity.parse_serial(key)
                identity.parse_generation(value)
            return True
        except identity.IdentityError:
            return False

    for case, data, outcome in fx.ROTATION_VALIDATION_CASES:
        assert outcome == ("pass" if admitted(data) else "fail"), case
    targets = list(yaml.safe_load_all((fx.SUITES_DIR / "rotations/targets.yaml").read_text()))
    expected = {f"{t['metadata']['namespace']}/{t['metadata']['name']}": fx.ROTATION_CASE.get(
        f"{t['metadata']['name']}.{t['metadata']['namespace']}", "0") for t in targets
        if (t["metadata"].get("annotations") or {}).get(policies.GENERATION_ANNOTATION, "0")
        != fx.ROTATION_CASE.get(f"{t['metadata']['name']}.{t['metadata']['namespace']}", "0")}
    test = yaml.safe_load((fx.SUITES_DIR / "rotations/kyverno-test.yaml").read_text())
    (annotate,) = [r for r in test["results"] if r["rule"] == "annotate-rotated-vms"]
    assert sorted(annotate["resources"]) == sorted(expected)
    patched = list(yaml.safe_load_all((fx.SUITES_DIR / "rotations/patched.yaml").read_text()))
    assert {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p["metadata"]["annotations"][
        policies.GENERATION_ANNOTATION] for p in patched} == expected
