"""Credential rotation on the live control plane (issue 25 item 2): the bundle's policies, RBAC and
ConfigMap, Kyverno's own controllers, and rotations.py as the reconciler's ServiceAccount.

A bump of one VM's generation, written with a token of the rendered reconciler ServiceAccount
(so its Role is proven too), changes exactly that VM's <vm>-bmc Secret to identity.bmc_user and
bmc_password at the new generation, within a bounded wait; every other Secret and VM stays
byte-identical (same resourceVersion). The times measured are printed (pytest -s) and kept in
REDERIVATION_SECONDS.
"""

from __future__ import annotations

import json
import time

import pytest

from kubernetes import client as k8s_client

from controlplane import _kubeconfig
from maas_kubevirt import identity, policies, rotate, rotations
from test_policies_kyverno import ALLOW_DELETE_LABEL
from test_controlplane import (  # noqa: F401  (fixtures: bundle, site, make_namespace)
    SETTLE, b64, bundle, create, eventually, get, make_namespace, objects_match, site, vm,
)

# Bounded waits on Kyverno's background controller, which fell behind beside the parallel workers
# once (tests/test_controlplane.py): run alone, as `timing`.
pytestmark = [pytest.mark.usefixtures("bundle"), pytest.mark.timing]

ACCOUNT = policies.RECONCILER_ACCOUNT
# What the issue allows for Kyverno to re-derive after a bump ("within seconds", not hourly).
REDERIVE_BOUND = 30
# How long a change that must not happen is given to happen anyway.
QUIET = 8
REDERIVATION_SECONDS: list[float] = []


def system_namespace(bundle) -> str:
    return bundle.values["kubernetes"]["system_namespace"]


@pytest.fixture
def reconciler_api(control_plane, bundle, tmp_path_factory):
    """A CoreV1Api as the rendered reconciler ServiceAccount (a bounded token, as the README says)."""
    cp = control_plane
    token = cp.kubectl("create", "token", ACCOUNT, "-n", "maas-kubevirt", "--duration", "2h").stdout.strip()
    path = _kubeconfig(tmp_path_factory.mktemp("reconciler") / "kubeconfig", cp.server, cp.ca, {"token": token})
    return rotate.core_api(str(path))


@pytest.fixture
def admin_api(control_plane, bundle):
    return rotate.core_api(str(control_plane.kubeconfig))


def secret(cp, name: str, namespace: str) -> dict | None:
    return get(cp, "secret", f"{name}-bmc", namespace)


def derived_with(bundle, name: str, namespace: str, generation: int):
    """A check: the Secret holds the user and password of that generation, and says so."""
    serial = identity.format_serial(name, namespace)
    expected = {"username": b64(identity.bmc_user(bundle.seed, serial, generation)),
                "password": b64(identity.bmc_password(bundle.seed, serial, generation))}

    def check(cp) -> bool:
        found = secret(cp, name, namespace)
        return bool(found) and found["data"] == expected and \
            (found["metadata"].get("annotations") or {}).get(policies.GENERATION_ANNOTATION) == str(generation)

    return check


def fingerprint(obj: dict) -> str:
    """The whole stored object (resourceVersion included): equal means not written since."""
    return json.dumps(obj, sort_keys=True)


def three_vms(cp, bundle, make_namespace) -> list[tuple[str, str]]:
    """Two VMs in one opted-in namespace and one in another, each with its generation-0 Secret."""
    first, second = make_namespace(), make_namespace()
    vms = [("alpha", first), ("beta", first), ("alpha", second)]
    for name, namespace in vms:
        create(cp, vm(name, namespace)).check_returncode()
    for name, namespace in vms:
        eventually(cp, lambda: objects_match(cp, bundle.values, bundle.seed, name, namespace)
                   and derived_with(bundle, name, namespace, 0)(cp), f"{namespace}/{name}'s BMC objects at generation 0")
    return vms


def timed_rederivation(cp, bundle, name: str, namespace: str, generation: int, began: float) -> float:
    eventually(cp, lambda: derived_with(bundle, name, namespace, generation)(cp),
               f"{namespace}/{name}-bmc re-derived at generation {generation}", timeout=SETTLE)
    took = time.monotonic() - began
    REDERIVATION_SECONDS.append(took)
    print(f"\nre-derivation of {namespace}/{name}-bmc at generation {generation}: {took:.1f} s")
    return took


def test_a_bump_changes_exactly_that_vms_secret(control_plane, bundle, make_namespace, reconciler_api):
    cp = control_plane
    vms = three_vms(cp, bundle, make_namespace)
    target, others = vms[0], vms[1:]
    before = {v: fingerprint(secret(cp, *v)) for v in others}
    vms_before = {v: fingerprint(get(cp, "virtualmachine", *v)) for v in others}
    for generation in (1, 2):
        began = time.monotonic()
        assert rotations.bump(reconciler_api, *target, system_namespace=system_namespace(bundle)) == generation
        took = timed_rederivation(cp, bundle, *target, generation, began)
        assert took <= REDERIVE_BOUND, f"re-derivation took {took:.1f} s"
    # The rotated VM carries its generation (the trigger); the others were never written.
    annotations = get(cp, "virtualmachine", *target)["metadata"].get("annotations") or {}
    assert annotations.get(policies.GENERATION_ANNOTATION) == "2"
    time.sleep(QUIET)
    assert {v: fingerprint(secret(cp, *v)) for v in others} == before
    assert {v: fingerprint(get(cp, "virtualmachine", *v)) for v in others} == vms_before
    # The reconciler reads back what it wrote; the new user is a new BMC row for MAAS too.
    generations = rotations.read(reconciler_api, system_namespace(bundle))
    assert generations[target] == 2 and all(v not in generations for v in others)
    serial = identity.format_serial(*target)
    assert identity.bmc_user(bundle.seed, serial, 2) != identity.bmc_user(bundle.seed, serial, 0)
    # `kubectl apply -k` again (an upgrade, a values change) keeps every generation written.
    rotated = fingerprint(secret(cp, *target))
    cp.apply_bundle(bundle.output)
    time.sleep(QUIET)
    assert rotations.read(reconciler_api, system_namespace(bundle))[target] == 2
    assert fingerprint(secret(cp, *target)) == rotated


def test_a_tenant_annotating_its_own_vm_changes_no_derivation(control_plane, bundle, make_namespace, reconciler_api):
    cp = control_plane
    vms = three_vms(cp, bundle, make_namespace)
    (name, namespace), witness = vms[0], vms[1]
    before = secret(cp, name, namespace)
    cp.kubectl("annotate", "--overwrite", "virtualmachine", name, "-n", namespace,
               f"{policies.GENERATION_ANNOTATION}=7")
    # A bump of another VM after it: once that is re-derived, Kyverno has had the tenant's update too.
    began = time.monotonic()
    assert rotations.bump(reconciler_api, *witness, system_namespace=system_namespace(bundle)) == 1
    timed_rederivation(cp, bundle, *witness, 1, began)
    time.sleep(QUIET)
    after = secret(cp, name, namespace)
    assert after["data"] == before["data"]
    assert after["metadata"]["annotations"] == before["metadata"]["annotations"]
    assert derived_with(bundle, name, namespace, 0)(cp)


def test_a_malformed_configmap_update_is_refused(control_plane, bundle, reconciler_api):
    cp = control_plane
    where = ["-n", system_namespace(bundle)]
    before = cp.get("configmap", identity.ROTATIONS_CONFIGMAP, system_namespace(bundle)).get("data")
    for data in ({"web1": "1"}, {"Web1.tenant-a": "1"}, {"web1.tenant-a": "01"}, {"web1.tenant-a": " 1"},
                 {"web1.tenant-a": "1000000000"}, {"web1.tenant-a": "one"}):
        refused = cp.kubectl("patch", "configmap", identity.ROTATIONS_CONFIGMAP, *where, "--type=merge",
                             "-p", json.dumps({"data": data}), check=False)
        assert refused.returncode != 0 and "generations-are-canonical" in refused.stderr, (data, refused.stderr)
    # The reconciler's own update of a malformed value is refused the same way, as one line.
    configmap = reconciler_api.read_namespaced_config_map(identity.ROTATIONS_CONFIGMAP, system_namespace(bundle))
    configmap.data = {**(configmap.data or {}), "web1.tenant-a": "007"}
    with pytest.raises(Exception) as refused:
        reconciler_api.replace_namespaced_config_map(identity.ROTATIONS_CONFIGMAP, system_namespace(bundle), configmap)
    assert getattr(refused.value, "status", None) in (400, 422) and "generations-are-canonical" in str(refused.value.body)
    assert cp.get("configmap", identity.ROTATIONS_CONFIGMAP, system_namespace(bundle)).get("data") == before


def test_a_generation_never_goes_down(control_plane, bundle, make_namespace, reconciler_api):
    """Lowering a VM's generation, or removing its key, would derive rotated-away credentials again."""
    cp = control_plane
    system = system_namespace(bundle)
    key = identity.format_serial("gamma", make_namespace())
    assert rotations.bump(reconciler_api, *identity.parse_serial(key), system_namespace=system) == 1
    assert rotations.bump(reconciler_api, *identity.parse_serial(key), system_namespace=system) == 2
    for patch in ({"data": {key: "1"}}, {"data": {key: "0"}}, {"data": {key: None}}):
        refused = cp.kubectl("patch", "configmap", identity.ROTATIONS_CONFIGMAP, "-n", system, "--type=merge",
                             "-p", json.dumps(patch), check=False)
        assert refused.returncode != 0 and "generations-never-decrease" in refused.stderr, (patch, refused.stderr)
    assert rotations.read(reconciler_api, system)[identity.parse_serial(key)] == 2
    raised = cp.kubectl("patch", "configmap", identity.ROTATIONS_CONFIGMAP, "-n", system, "--type=merge",
                        "-p", json.dumps({"data": {key: "5"}}), check=False)
    assert raised.returncode == 0, raised.stderr



def test_the_lease_kubeconfig_raises_one_vm_by_one_below_its_ceiling(control_plane, bundle, make_namespace,
                                                                        reconciler_api, admin_api):
    """Issue 41 item 4: a stolen lease kubeconfig (the reconciler's token) may bump one VM by one per
    update and never past identity.RECONCILER_GENERATION_MAX, so it cannot push every VM to the
    largest generation; `rotate`'s own bump goes through, and an administrator is not bounded."""
    system = system_namespace(bundle)
    tenant = make_namespace(labelled=False)
    one, two, three = (identity.format_serial(name, tenant) for name in ("one", "two", "three"))
    for key in (one, two):
        assert rotations.bump(reconciler_api, *identity.parse_serial(key), system_namespace=system) == 1

    def data(changes: dict):
        return lambda c: setattr(c, "data", {**(c.data or {}), **changes})

    cap, largest = identity.RECONCILER_GENERATION_MAX, identity.GENERATION_MAX
    for changes in ({one: "2", two: "2"}, {one: "3"}, {three: str(largest)}, {three: "2"},
                    # every VM at once, the attack of the finding
                    {key: str(largest) for key in (one, two, three)}):
        body = refused_for_the_reconciler(reconciler_api, system, data(changes))
        assert "reconciler-raises-one-generation-by-one" in body, (changes, body)
    # Lowering one to raise another keeps the sum: generations-never-decrease refuses it.
    assert "generations-never-decrease" in refused_for_the_reconciler(reconciler_api, system, data({one: "0", two: "2"}))
    # No other verb: a patch or a create is the Role's to refuse.
    with pytest.raises(Exception) as forbidden:
        reconciler_api.patch_namespaced_config_map(identity.ROTATIONS_CONFIGMAP, system, {"data": {one: str(largest)}})
    assert getattr(forbidden.value, "status", None) == 403, forbidden.value
    assert {k: v for k, v in rotations.read(reconciler_api, system).items()
            if k[1] == tenant} == {identity.parse_serial(one): 1, identity.parse_serial(two): 1}
    # Up to the ceiling one bump at a time (an administrator put it one short), then no further.
    admin_api.patch_namespaced_config_map(identity.ROTATIONS_CONFIGMAP, system, {"data": {one: str(cap - 1)}})
    assert rotations.bump(reconciler_api, *identity.parse_serial(one), system_namespace=system) == cap
    with pytest.raises(rotations.RotationsError) as refused:
        rotations.bump(reconciler_api, *identity.parse_serial(one), system_namespace=system)
    assert "reconciler-stays-below-the-ceiling" in str(refused.value) and "--kubeconfig" in str(refused.value)
    # The administrator's own credentials rotate it on; beside it, the reconciler still bumps the others.
    assert rotations.bump(admin_api, *identity.parse_serial(one), system_namespace=system) == cap + 1
    assert rotations.bump(reconciler_api, *identity.parse_serial(two), system_namespace=system) == 2
    assert {k: v for k, v in rotations.read(admin_api, system).items()
            if k[1] == tenant} == {identity.parse_serial(one): cap + 1, identity.parse_serial(two): 2}


# Issue 29: the ConfigMap's own life. What each refusal could break is in the rotations policy.
GHOST_OWNER = {"apiVersion": "v1", "kind": "ConfigMap", "name": "gone", "uid": "00000000-0000-4000-8000-000000000029"}


def configmap_state(cp, system: str) -> dict:
    """What the refused writes would change, and the data: equal means none got through."""
    found = cp.get("configmap", identity.ROTATIONS_CONFIGMAP, system)
    metadata = found["metadata"]
    return {"data": found.get("data"), "immutable": found.get("immutable"), "labels": metadata.get("labels"),
            "ownerReferences": metadata.get("ownerReferences"), "finalizers": metadata.get("finalizers"),
            "uid": metadata["uid"]}


def refused_for_the_reconciler(api, system: str, change) -> str:
    """Replace the ConfigMap as the reconciler with one change made; return the refusal's body."""
    configmap = api.read_namespaced_config_map(identity.ROTATIONS_CONFIGMAP, system)
    change(configmap)
    with pytest.raises(Exception) as refused:
        api.replace_namespaced_config_map(identity.ROTATIONS_CONFIGMAP, system, configmap)
    assert getattr(refused.value, "status", None) in (400, 422), refused.value
    return str(refused.value.body)


def test_the_configmap_cannot_be_made_immutable_owned_or_held(control_plane, bundle, reconciler_api):
    """immutable (true or false), an ownerReference to a UID that does not exist and a finalizer are
    refused, from a cluster administrator and from the reconciler's token alike."""
    cp = control_plane
    system = system_namespace(bundle)
    before = configmap_state(cp, system)
    for patch, rule in (({"immutable": False}, "configmap-not-immutable"),
                        ({"immutable": True}, "configmap-not-immutable"),
                        ({"metadata": {"ownerReferences": [GHOST_OWNER]}}, "configmap-no-owner-references"),
                        ({"metadata": {"finalizers": ["example.org/keep"]}}, "configmap-no-finalizers")):
        refused = cp.kubectl("patch", "configmap", identity.ROTATIONS_CONFIGMAP, "-n", system, "--type=merge",
                             "-p", json.dumps(patch), check=False)
        assert refused.returncode != 0 and rule in refused.stderr and "Fix: " in refused.stderr, (patch, refused.stderr)
    owner = k8s_client.V1OwnerReference(api_version=GHOST_OWNER["apiVersion"], kind=GHOST_OWNER["kind"],
                                        name=GHOST_OWNER["name"], uid=GHOST_OWNER["uid"])
    for change, rule in ((lambda c: setattr(c, "immutable", True), "configmap-not-immutable"),
                         (lambda c: setattr(c.metadata, "owner_references", [owner]), "configmap-no-owner-references"),
                         (lambda c: setattr(c.metadata, "finalizers", ["example.org/keep"]), "configmap-no-finalizers")):
        assert rule in refused_for_the_reconciler(reconciler_api, system, change)
    assert configmap_state(cp, system) == before
    # Still a ConfigMap the reconciler can bump: nothing above reached it.
    assert rotations.bump(reconciler_api, "delta", "guards", system_namespace=system) == 1


def test_a_delete_is_refused_until_an_administrator_labels_the_configmap(control_plane, bundle, reconciler_api):
    """A delete is refused without the break-glass label; the reconciler can neither delete (its
    Role) nor set that label (the policy), can still bump a labelled ConfigMap and may take the label
    off. (The labelled delete itself: test_without_the_configmap_no_secret_changes.)"""
    cp = control_plane
    system = system_namespace(bundle)
    where = ["configmap", identity.ROTATIONS_CONFIGMAP, "-n", system]
    for label in (None, "false", "yes"):
        if label is not None:
            cp.kubectl("label", "--overwrite", *where, f"{ALLOW_DELETE_LABEL}={label}")
        refused = cp.kubectl("delete", *where, "--timeout=30s", check=False)
        assert refused.returncode != 0 and "configmap-no-delete" in refused.stderr, (label, refused.stderr)
        assert f"{ALLOW_DELETE_LABEL}=true" in refused.stderr
    cp.kubectl("label", *where, f"{ALLOW_DELETE_LABEL}-")
    uid = configmap_state(cp, system)["uid"]
    with pytest.raises(Exception) as forbidden:
        reconciler_api.delete_namespaced_config_map(identity.ROTATIONS_CONFIGMAP, system)
    assert getattr(forbidden.value, "status", None) == 403, forbidden.value

    def labelled(value: str):
        return lambda c: setattr(c.metadata, "labels", {**(c.metadata.labels or {}), ALLOW_DELETE_LABEL: value})

    assert "reconciler-cannot-allow-delete" in refused_for_the_reconciler(reconciler_api, system, labelled("true"))
    cp.kubectl("label", *where, f"{ALLOW_DELETE_LABEL}=false")
    assert "reconciler-cannot-allow-delete" in refused_for_the_reconciler(reconciler_api, system, labelled("true"))
    cp.kubectl("label", "--overwrite", *where, f"{ALLOW_DELETE_LABEL}=true")
    try:
        # An administrator armed it: the reconciler's bumps keep the label and go through.
        assert rotations.bump(reconciler_api, "echo", "guards", system_namespace=system) == 1
        assert configmap_state(cp, system)["labels"][ALLOW_DELETE_LABEL] == "true"
        # Taking the label off disarms the delete again, and the reconciler may do that.
        configmap = reconciler_api.read_namespaced_config_map(identity.ROTATIONS_CONFIGMAP, system)
        configmap.metadata.labels = {k: v for k, v in configmap.metadata.labels.items() if k != ALLOW_DELETE_LABEL}
        reconciler_api.replace_namespaced_config_map(identity.ROTATIONS_CONFIGMAP, system, configmap)
    finally:
        cp.kubectl("label", *where, f"{ALLOW_DELETE_LABEL}-", check=False)
    assert ALLOW_DELETE_LABEL not in (configmap_state(cp, system)["labels"] or {})
    assert "configmap-no-delete" in cp.kubectl("delete", *where, "--timeout=30s", check=False).stderr
    assert configmap_state(cp, system)["uid"] == uid     # never deleted and created again


def test_the_reconciler_may_get_and_update_that_configmap_and_read_no_secret(control_plane, bundle, make_namespace):
    cp = control_plane
    tenant = make_namespace()
    who = f"system:serviceaccount:maas-kubevirt:{ACCOUNT}"
    system = system_namespace(bundle)

    def can(*args: str) -> bool:
        answer = cp.kubectl("auth", "can-i", *args, "--as", who, check=False).stdout.strip()
        assert answer in ("yes", "no"), answer
        return answer == "yes"

    assert can("get", f"configmaps/{identity.ROTATIONS_CONFIGMAP}", "-n", system)
    assert can("update", f"configmaps/{identity.ROTATIONS_CONFIGMAP}", "-n", system)
    for verb, what, where in (("list", "configmaps", system), ("watch", "configmaps", system),
                              ("get", "configmaps/kube-root-ca.crt", system), ("create", "configmaps", system),
                              ("delete", f"configmaps/{identity.ROTATIONS_CONFIGMAP}", system),
                              ("patch", f"configmaps/{identity.ROTATIONS_CONFIGMAP}", system),
                              ("get", "secrets", system), ("list", "secrets", system),
                              ("get", f"secrets/{bundle.values['kubernetes']['seed_secret']}", system),
                              ("get", "secrets", tenant), ("list", "secrets", tenant), ("get", "secrets/alpha-bmc", tenant),
                              ("list", "configmaps", tenant), ("get", "configmaps", "--all-namespaces")):
        if where.startswith("--"):
            assert not can(verb, what, where), (verb, what, where)
        else:
            assert not can(verb, what, "-n", where), (verb, what, where)


def test_rotations_errors_name_the_fix(control_plane, bundle, reconciler_api, admin_api):
    # No ConfigMap where it is looked for (admin may read "default"): the fix is the bundle.
    with pytest.raises(rotations.RotationsError) as missing:
        rotations.bump(admin_api, "alpha", "tenant-a", system_namespace="default")
    assert "404" in str(missing.value) and "kubectl apply -k" in str(missing.value)
    # The reconciler's token where its Role does not reach: 403 naming the Role.
    with pytest.raises(rotations.RotationsError) as forbidden:
        rotations.read(reconciler_api, "default")
    assert "403" in str(forbidden.value) and f"Role {ACCOUNT}" in str(forbidden.value)
    for error in (missing.value, forbidden.value):
        assert "\n" not in str(error) and bundle.seed not in str(error)


def test_without_the_configmap_no_secret_changes(control_plane, bundle, make_namespace, admin_api, reconciler_api):
    """Fail closed: with the ConfigMap gone, a rotated VM's Secret is not re-derived at generation 0
    (its leaked password would come back), and a new VM gets no Secret until the ConfigMap is back."""
    cp = control_plane
    system = system_namespace(bundle)
    (name, namespace), *_ = three_vms(cp, bundle, make_namespace)
    began = time.monotonic()
    assert rotations.bump(reconciler_api, name, namespace, system_namespace=system) == 1
    timed_rederivation(cp, bundle, name, namespace, 1, began)
    saved = cp.get("configmap", identity.ROTATIONS_CONFIGMAP, system).get("data") or {}
    rotated = fingerprint(secret(cp, name, namespace))
    # The break-glass procedure of docs/how-to/uninstall.md: the label, then the delete. Foreground: the
    # garbage collector's update that removes foregroundDeletion is admitted too.
    cp.kubectl("label", "configmap", identity.ROTATIONS_CONFIGMAP, "-n", system, f"{ALLOW_DELETE_LABEL}=true")
    cp.kubectl("delete", "configmap", identity.ROTATIONS_CONFIGMAP, "-n", system, "--cascade=foreground",
               "--timeout=60s")
    assert get(cp, "configmap", identity.ROTATIONS_CONFIGMAP, system) is None
    try:
        cp.kubectl("annotate", "--overwrite", "virtualmachine", name, "-n", namespace, "example.org/touch=1")
        create(cp, vm("newcomer", namespace)).check_returncode()
        time.sleep(QUIET + 4)
        assert fingerprint(secret(cp, name, namespace)) == rotated
        assert secret(cp, "newcomer", namespace) is None
    finally:
        # Back as the operator would (the bundle), with the generations restored by hand.
        cp.apply_bundle(bundle.output)
        configmap = admin_api.read_namespaced_config_map(identity.ROTATIONS_CONFIGMAP, system)
        configmap.data = saved
        admin_api.replace_namespaced_config_map(identity.ROTATIONS_CONFIGMAP, system, configmap)
    assert ALLOW_DELETE_LABEL not in (cp.get("configmap", identity.ROTATIONS_CONFIGMAP, system)["metadata"]
                                      .get("labels") or {})
    # Kyverno gave up on the newcomer's request while the ConfigMap was missing; its next update
    # (or the hourly resync) brings its Secret. The rotated VM kept its generation throughout.
    cp.kubectl("annotate", "--overwrite", "virtualmachine", "newcomer", "-n", namespace, "example.org/touch=2")
    eventually(cp, lambda: derived_with(bundle, "newcomer", namespace, 0)(cp), "the newcomer's Secret once it is back")
    assert derived_with(bundle, name, namespace, 1)(cp)


def test_the_upgrade_procedure_render_prints_keeps_every_credential(control_plane, bundle, site, make_namespace,
                                                                    reconciler_api):
    """A site on the BMC policy from before generations (no rotations context; the password and
    user without a generation): render prints the delete-and-recreate procedure, and following it
    leaves every Secret's user and password as they were (generation 0), then rotation works."""
    import secrets as secrets_
    import shlex

    import yaml

    from test_controlplane import run_render, wait_policies_ready

    cp = control_plane
    output = site[0] / f"upgrade-{secrets_.token_hex(3)}"
    assert run_render(bundle.values, output).returncode == 0
    kubernetes = output / "kubernetes"
    # The previous version's bundle: its BMC policy, and neither the rotations policy nor the ConfigMap.
    old = yaml.safe_load((kubernetes / "policy-vm-bmc.yaml").read_text())
    rule = next(r for r in old["spec"]["rules"] if r["name"] == "bmc-secret")
    rule["context"] = [c for c in rule["context"] if c["name"] == "seed"]
    vm_, ns_ = "request.object.metadata.name", "request.object.metadata.namespace"
    rule["generate"]["data"]["data"] = {
        "username": f"{{{{ base64_encode(join('', ['maas-kubevirt-', truncate(sha256(join('', [seed, ':user:', {vm_}, '.', {ns_}])), `32`)])) }}}}",
        "password": f"{{{{ base64_encode(truncate(sha256(join('', [seed, ':', {vm_}, '.', {ns_}])), `32`)) }}}}",
    }
    rule["generate"]["data"]["metadata"]["annotations"].pop(policies.GENERATION_ANNOTATION)
    (kubernetes / "policy-vm-bmc.yaml").write_text(yaml.safe_dump(old))
    listed = yaml.safe_load((kubernetes / "kustomization.yaml").read_text())
    listed["resources"] = [r for r in listed["resources"]
                           if r not in (policies.ROTATIONS_FILE, "policy-credential-rotations.yaml")]
    (kubernetes / "kustomization.yaml").write_text(yaml.safe_dump(listed))
    for name in ("policy-credential-rotations.yaml", policies.ROTATIONS_FILE):
        (kubernetes / name).unlink()
    cp.kubectl("delete", "clusterpolicy", policies.POLICY_NAMES["bmc"], policies.POLICY_NAMES["rotations"], "--wait=true")
    cp.apply_bundle(output)
    wait_policies_ready(cp)
    namespace = make_namespace()
    for name in ("old1", "old2"):
        create(cp, vm(name, namespace)).check_returncode()
    for name in ("old1", "old2"):
        eventually(cp, lambda: objects_match(cp, bundle.values, bundle.seed, name, namespace), f"{name}'s old Secret")
    before = {name: secret(cp, name, namespace)["data"] for name in ("old1", "old2")}
    assert all(policies.GENERATION_ANNOTATION not in (secret(cp, n, namespace)["metadata"].get("annotations") or {})
               for n in before)

    # The upgrade, as render says.
    result = run_render(bundle.values, output)
    said = result.stdout + result.stderr
    assert result.returncode == 0, said
    assert "upgrade to per-VM credential generations" in said and bundle.seed not in said
    procedure = [line.strip() for line in said.splitlines() if line.strip().startswith("kubectl ")]
    # The procedure, then "Next steps:" (its apply again, which is harmless).
    assert procedure[:2] == [f"kubectl delete clusterpolicy {policies.POLICY_NAMES['bmc']}",
                             f"kubectl apply -k {kubernetes}"], said
    assert set(procedure[2:]) <= {f"kubectl apply -k {kubernetes}"}, said
    for line in procedure:
        cp.kubectl(*shlex.split(line)[1:])
    wait_policies_ready(cp)
    for name in before:
        eventually(cp, lambda: derived_with(bundle, name, namespace, 0)(cp), f"{name}'s Secret adopted at generation 0")
        assert secret(cp, name, namespace)["data"] == before[name]
    began = time.monotonic()
    assert rotations.bump(reconciler_api, "old1", namespace, system_namespace=system_namespace(bundle)) == 1
    timed_rederivation(cp, bundle, "old1", namespace, 1, began)
    assert secret(cp, "old2", namespace)["data"] == before["old2"]
